"""In-process recovery (launcher.in_process_recovery): survivors keep their
processes, a replacement takes the failed rank's place, training state comes
from peers' host memory (docs/self-healing.md, "In-process recovery")."""
