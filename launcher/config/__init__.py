"""The contract, at the bottom: the config schema and its composition,
validation, the run spec and plan data the trainer reads, run identity and
the on-disk data formats. Imports nothing else of meshrun."""
