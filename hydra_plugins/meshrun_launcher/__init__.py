"""The sweeper and launcher of ``python -m launcher -m ...`` (meshrun_launcher.py)."""
