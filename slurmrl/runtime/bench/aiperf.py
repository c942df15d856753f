"""A multi-turn session replay through aiperf (``aiperf profile --custom-dataset-type multi_turn``),
one run per point, from the Python of aiperf's own venv (``--aiperf PYTHON``: aiperf pins psutil,
pyzmq, rich, pillow and pandas below vLLM's, so it cannot share .venv).

aiperf sends each session's turns in order, each with the conversation so far (the earlier turns and
the answers the server gave), the next one ``delay`` ms after the previous answer arrived; sessions run
concurrently, at most the point's concurrency at once (no cap: every session at once). Its summary
(``profile_export_aiperf.json``) becomes the same summary line as a vLLM point (throughput, TTFT,
TPOT, ITL and end-to-end latency median and p99, goodput under the ``--goodput`` targets); its
per-request records (``profile_export.jsonl``: session, turn, prompt tokens as the server counted
them) stay under DIR/aiperf/<point>/.

The job's secret reaches aiperf as its ``--api-key`` inside that process (the shim below reads it from
its standard input and appends it to ``sys.argv``): never on a command line, nor in an environment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from slurmrl.rundir.paths import RunDir

# `python -c SHIM profile ARGS...`: aiperf's own CLI, with the secret (if any) from the first line of stdin
SHIM = ("import sys; from aiperf.cli import app; key = sys.stdin.readline().strip(); sys.stdin.close(); "
        "sys.argv = ['aiperf', *sys.argv[1:], *(['--api-key', key] if key else [])]; sys.exit(app())")
ARTIFACTS = "aiperf"  # DIR/aiperf/<point>/: aiperf's own exports
SUMMARY = "profile_export_aiperf.json"
RECORDS = "profile_export.jsonl"
# summary key -> (aiperf metric tag, statistic): aiperf's inter_token_latency is a request's mean time
# between output tokens after the first (vLLM's TPOT); inter_chunk_latency is each gap (vLLM's ITL)
LATENCIES = {"ttft": "time_to_first_token", "tpot": "inter_token_latency", "itl": "inter_chunk_latency",
             "e2el": "request_latency"}
LEFT_OUT = ("telemetry_data",)  # not written into the point file


class Failed(Exception):
    pass


def sessions(path: str) -> tuple[int, int]:
    """(sessions, turns) of a multi_turn JSONL trace: lines that share a ``session_id`` are one session
    (aiperf groups them), a line without one is a session of its own."""
    ids: set[str] = set()
    count = turns = 0
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    new = row.get("turns")
                    if not isinstance(new, list) or not new:
                        raise ValueError("no \"turns\" list")
                except (ValueError, AttributeError) as e:
                    raise Failed(f"{path} line {n} is not a multi-turn session: {e}") from None
                turns += len(new)
                sid = row.get("session_id")
                if sid is None or str(sid) not in ids:
                    count += 1
                if sid is not None:
                    ids.add(str(sid))
    except OSError as e:
        raise Failed(f"cannot read the trace {path}: {e.strerror or e}") from None
    if not count:
        raise Failed(f"the trace {path} has no session")
    return count, turns


def artifacts(out: Path, c: int | None) -> Path:
    return out / ARTIFACTS / RunDir.benchmark_point_name(c, None, None).removesuffix(".json")


def point_argv(c: int | None, n_sessions: int, out: Path) -> list[str]:
    """aiperf's arguments for one point: sessions in flight (no cap: all of them), every session once."""
    return ["--concurrency", str(c or n_sessions), "--conversation-num", str(n_sessions),
            "--output-artifact-dir", str(artifacts(out, c)), "--ui-type", "none"]


def runner(python: str, key: str | None):
    """A function argv -> aiperf's summary dict for one point (argv: aiperf profile's, with the point's)."""

    def run(argv: list[str]) -> dict:
        folder = Path(argv[argv.index("--output-artifact-dir") + 1])
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "aiperf.out", "wb") as log:
            proc = subprocess.Popen([python, "-c", SHIM, "profile", *argv], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.PIPE, start_new_session=True)
            try:
                assert proc.stdin is not None
                try:
                    proc.stdin.write(f"{key or ''}\n".encode())
                    proc.stdin.close()
                except BrokenPipeError:  # it is gone already: its exit status tells
                    pass
                rc = proc.wait()
            except BaseException:  # the timeout or the job stopping: aiperf's services go with it
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        if rc != 0:
            raise Failed(f"aiperf profile exited {rc}: {last_lines(folder / 'aiperf.out')}")
        try:
            return json.loads((folder / SUMMARY).read_text())
        except (OSError, ValueError) as e:
            raise Failed(f"aiperf wrote no readable {SUMMARY} in {folder}: {e}") from None

    return run


def last_lines(path: Path, n: int = 6) -> str:
    """aiperf's last words (its error box without the box), for the summary's error."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "no output"
    words = [w for w in (ln.strip(" │╭╮╰╯─") for ln in lines) if w]
    return " ".join(words[-n:])[-400:] or "no output"


def _stat(result: dict, tag: str, stat: str) -> float | None:
    value = result.get(tag)
    got = value.get(stat) if isinstance(value, dict) else None
    return got if isinstance(got, (int, float)) and not isinstance(got, bool) else None


def _errors(result: dict) -> list[str]:
    out = []
    for e in result.get("error_summary") or []:
        details = e.get("error_details") if isinstance(e, dict) else None
        if isinstance(details, dict):
            out.append(" ".join(str(details[k]) for k in ("code", "type", "message") if details.get(k) is not None))
    return sorted(set(out))[:3]


def point_summary(c: int | None, result: dict) -> dict:
    """One summary line from aiperf's summary of one point, in the keys of a vLLM point."""
    completed = int(_stat(result, "request_count", "avg") or 0)
    failed = int(_stat(result, "error_request_count", "avg") or 0)
    out: dict[str, Any] = {
        "concurrency": c, "input_len": None, "output_len": None, "num_prompts": completed + failed,
        "completed": completed, "failed": failed,
        "duration_s": _stat(result, "benchmark_duration", "avg"),
        "request_throughput": _stat(result, "request_throughput", "avg"),
        "output_throughput": _stat(result, "output_token_throughput", "avg"),
        "total_token_throughput": _stat(result, "total_token_throughput", "avg"),
    }
    for name, tag in LATENCIES.items():
        out[f"{name}_p50_ms"] = _stat(result, tag, "p50")
        out[f"{name}_p99_ms"] = _stat(result, tag, "p99")
    goodput = _stat(result, "goodput", "avg")
    if goodput is not None:  # only with --goodput targets
        throughput = out["request_throughput"]
        out["request_goodput"] = goodput
        out["good_share"] = goodput / throughput if throughput else None
    out["errors"] = _errors(result)
    out["file"] = RunDir.benchmark_point_name(c, None, None)
    return out


def point_file(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in LEFT_OUT}
