"""job=script's task wrapper: a team's program under meshrun (environment, workdir, stack hook, scontrol shim)."""
