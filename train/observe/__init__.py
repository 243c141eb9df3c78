"""What a rank reports and how the supervisor sees it: metrics, tracking, run log, heartbeats, lifeline, the preflight all-reduce."""
