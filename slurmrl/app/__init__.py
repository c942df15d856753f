"""The use cases: one module per user verb, composing the layers below (imported only by cli.py)."""
