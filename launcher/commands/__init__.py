"""Every ``meshrun X`` command: one module each with ``main(argv)``; ``python -m launcher.X`` are their aliases (also ``calibrate`` and ``perf_validation``, run with ``python -m`` only)."""
