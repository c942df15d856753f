"""A TOML file that does not parse, said in slurmrl's own words with the line and column.

Every TOML file a user hands slurmrl (a recipe, a ``--set`` value, clusters.toml) is read with the
standard library's ``tomllib``: its verdict and position do not move with a third-party release
(tomlkit 0.15 changed both its wording and its line numbers under our tests). ``tomllib`` states the
position as ``(at line N, column M)``; this module keeps that position and rewrites the message
into a sentence that names the key or table when the text shows it. A message it does not know
is kept as ``tomllib`` wrote it, never dropped. A stdlib-only leaf."""

from __future__ import annotations

import re
import tomllib

_WHERE = re.compile(r"\s*\((at line (\d+), column (\d+)|at end of document)\)\s*$")
_KEY = re.compile(r"""^\s*(?:\[+\s*)?((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)""")


def _key_on(text: str, line: int) -> str | None:
    """The dotted key (or table name) that starts line ``line`` (1-based) of ``text``, as written."""
    lines = text.splitlines()
    if not 1 <= line <= len(lines):
        return None
    m = _KEY.match(lines[line - 1])
    return re.sub(r"\s*\.\s*", ".", m.group(1)) if m else None


def _sentence(message: str, key: str | None) -> str:
    """tomllib's message (its position taken off) in our words."""
    if message == "Cannot overwrite a value":
        what = f'key "{key}"' if key else "a key"
        return f"{what} is given twice (or a value and a table share a name)"
    m = re.fullmatch(r"Cannot declare \((.*)\) twice", message)
    if m:
        name = ".".join(p.strip().strip("'\"") for p in m.group(1).split(",") if p.strip())
        return f"table [{name}] is declared twice"
    m = re.fullmatch(r"Duplicate inline table key '(.*)'", message)
    if m:
        return f'key "{m.group(1)}" is given twice in one inline table'
    known = {
        "Invalid value": "a value is missing or is not a TOML value (strings need quotes)",
        "Invalid statement": "this line is not `key = value` or a [table] header",
        "Expected newline or end of document after a statement": "more text follows a value on its line",
        "Unclosed array": "an array ([...]) is not closed",
        "Unclosed inline table": "an inline table ({...}) is not closed",
        "Unterminated string": "a string is not closed",
    }
    return known.get(message, message)


def describe(error: tomllib.TOMLDecodeError | RecursionError, text: str) -> str:
    """One line: what is wrong, then ``(at line N, column M)`` where tomllib gave a position."""
    if isinstance(error, RecursionError):
        return "a value is nested too deeply (arrays or tables inside each other hundreds of levels)"
    raw = str(error)
    m = _WHERE.search(raw)
    message = raw[: m.start()] if m else raw
    line = int(m.group(2)) if m and m.group(2) else 0
    where = f" ({m.group(1)})" if m else ""
    return _sentence(message.strip(), _key_on(text, line)) + where


def loads(text: str) -> dict:
    """``tomllib.loads``, with a ValueError in our words (see ``describe``) for text that does not parse."""
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as e:
        raise ValueError(describe(e, text)) from None
