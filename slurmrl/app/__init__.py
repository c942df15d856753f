"""One module per user verb; only cli.py imports these (lazily, one module per verb)."""
