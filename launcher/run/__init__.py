"""A run on disk and on this machine: run dir, its lock and undo, prepare
(every check before anything is written) and the local launch."""
