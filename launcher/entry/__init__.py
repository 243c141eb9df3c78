"""How a composed run enters meshrun (dry run, local launch, Slurm submission), shared by every front end."""
