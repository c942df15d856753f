"""A small, fast TOML writer for the files we generate (component configs, the resolved recipe).

tomlkit round-trips comments but is slow for a 1024-node plan; the runtime reads these
files with the standard library's ``tomllib``. ``None`` values are left out (TOML has no null).
"""

from __future__ import annotations

import json
import re

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else _value(k)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")  # TOML forbids a raw DEL
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _is_table_array(v) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(x, dict) for x in v)


def dumps(data: dict, _prefix: str = "") -> str:
    out: list[str] = []
    tables = []
    for k, v in data.items():
        if v is None:
            continue
        if isinstance(v, dict) or _is_table_array(v):
            tables.append((k, v))
        else:
            out.append(f"{_key(k)} = {_value(v)}")
    for k, v in tables:
        name = f"{_prefix}{_key(k)}"
        if isinstance(v, dict):
            out.append(f"\n[{name}]")
            out.append(dumps(v, name + ".").rstrip("\n"))
        else:
            for item in v:
                out.append(f"\n[[{name}]]")
                out.append(dumps(item, name + ".").rstrip("\n"))
    return "\n".join(line for line in out if line != "") + "\n"
