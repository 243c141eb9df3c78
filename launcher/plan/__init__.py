"""The planner: parallel layout, memory per rank, job-kind checks, the stop-
signal lead and the QOS fit; make.py runs check -> plan -> price -> stop
lead."""
