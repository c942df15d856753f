"""Strict JSON out: what every ``--json`` writer prints (``slurmrl status --json``, a sweep's status,
``slurmrl plan --json``). RFC 8259 has no NaN or infinity, and jq and most parsers refuse the bare
``NaN``/``Infinity`` that Python's json module writes by default; here a number that is not finite is
written as a string, ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (the spelling JavaScript and Python
print), so nothing is lost and every parser reads the output. Everything else is written as it is;
anything that still is not JSON is an error here (``allow_nan=False``), not bad output."""

from __future__ import annotations

import json
import math

NON_FINITE = {"NaN", "Infinity", "-Infinity"}


def _spelled(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def strict(value):
    """``value`` with every non-finite float (nested in dicts, lists and tuples) as its string."""
    if isinstance(value, float):
        return value if math.isfinite(value) else _spelled(value)
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def dumps(value, **kw) -> str:
    """``json.dumps`` of ``value`` as strict JSON (see the module's note)."""
    return json.dumps(strict(value), allow_nan=False, **kw)
