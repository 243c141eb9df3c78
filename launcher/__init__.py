"""meshrun launcher: compose, plan, validate, render and submit runs.

Importing this package must not import torch (the launcher's own path stays
fast); torch lives in ``train``.
"""
