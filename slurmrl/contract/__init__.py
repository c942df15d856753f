"""Stdlib-only contract leaf: every value that crosses a process boundary, defined once."""
