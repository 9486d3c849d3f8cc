"""Subcommands of the `posttrain` console script (one module each)."""
