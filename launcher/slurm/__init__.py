"""Slurm: the rendered batch script, submission through submitit, cluster
queries, Pyxis/Enroot containers and images, team QOS administration."""
