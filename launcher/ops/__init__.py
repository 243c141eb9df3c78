"""Operating runs and clusters: preflight, status, the plan report and plots."""
