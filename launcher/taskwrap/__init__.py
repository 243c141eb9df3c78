"""job=script's task wrapper: a team's program under meshrun. wrapper.py composes one task (its
program's process and stop: child.py; progress and heartbeats: progress.py; a hang's stacks:
stacks.py; what it leaves: report.py; which task reports the program's rank 0: workers.py), with
its environment (taskenv.py), workdir (workcopy.py),
stack hook and scontrol shim."""
