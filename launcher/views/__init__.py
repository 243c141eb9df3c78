"""Desk-side views of runs: status, logs, cancel, fleet (text and page), goodput, forecasts, plan reports, diffs."""
