"""Multi-turn session replay: the sessions file, the replay argv and the checks on what it recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmrl.runtime.bench import aiperf

ROOT = Path(__file__).resolve().parents[2]


AIPERF_PY = ROOT / ".venv-aiperf" / "bin" / "python"


def aiperf_python() -> str:
    if not AIPERF_PY.exists():
        pytest.fail(f"{AIPERF_PY} is missing: run scripts/install.sh", pytrace=False)
    return str(AIPERF_PY)


def write_sessions(path: Path, sessions: int, turns: int, delay_ms: int, words: str = "tell me about the weather ") -> Path:
    """A multi_turn trace: ``sessions`` x ``turns``, each later turn ``delay_ms`` after the answer before it."""
    path.write_text("".join(json.dumps({"session_id": f"s{s}", "turns": [
        {"text": f"s{s} q{t}: " + words * (1 + s), "output_length": 4,
         **({"delay": delay_ms} if t else {})} for t in range(turns)]}) + "\n" for s in range(sessions)))
    return path


def replay_argv(out: Path, url: str, tokenizer: str, trace: Path, goodput: str) -> list[str]:
    return ["--out", str(out), "--aiperf", aiperf_python(), "--timeout", "300", "--",
            "--url", url, "--model", "tiny", "--tokenizer", tokenizer, "--endpoint-type", "chat",
            "--streaming", "--input-file", str(trace), "--custom-dataset-type", "multi_turn",
            "--use-server-token-count", "--workers-max", "2", "--extra-inputs", "ignore_eos:true",
            "--goodput", goodput]


def check_replay(run_dir: Path, sessions: int, turns: int, delay_ms: int) -> dict:
    """The summary (the trace's figures, every request good, what status/plot/report show) and aiperf's
    records: within a session each turn went out ``delay_ms`` after the previous answer arrived, with a
    prompt the server counted longer than the previous prompt plus its answer (the history came along);
    the sessions ran at the same time. Returns the summary's point."""
    from slurmrl import charts
    from slurmrl.rundir.benchmark import read_summary

    summary = read_summary(run_dir)
    assert summary is not None and summary.status == "done", summary
    assert summary.num_prompts == sessions * turns and summary.sessions == sessions
    assert summary.mode == "sessions" and summary.tool == "aiperf"
    (p,) = summary.points
    assert p["file"] == "trace.json" and p["completed"] == sessions * turns and p["failed"] == 0, p
    assert p["request_goodput"] == pytest.approx(p["request_throughput"]) and p["good_share"] == pytest.approx(1.0)
    assert p["ttft_p50_ms"] > 0 and p["e2el_p50_ms"] >= p["ttft_p50_ms"], p
    assert all(p[f"{m}_p99_ms"] >= p[f"{m}_p50_ms"] >= 0 for m in ("tpot", "itl")), p  # the mocker may send in one go
    assert p["duration_s"] >= (turns - 1) * delay_ms / 1000, p  # each session waited between its turns
    header, row = charts.benchmark_rows(summary)  # what status, plot and the report show
    assert header[-2:] == ["good req/s", "failed"] and row[1:3] == ["trace", "trace"], row
    assert row[-1] == f"0/{sessions * turns}", row
    folder = run_dir / "benchmark" / aiperf.ARTIFACTS / "trace"
    by_session: dict[str, list[dict]] = {}
    for line in (folder / aiperf.RECORDS).read_text().splitlines():
        r = json.loads(line)
        by_session.setdefault(r["metadata"]["conversation_id"], []).append(r)
    assert sorted(by_session) == [f"s{s}" for s in range(sessions)]
    for sid, rs in by_session.items():
        rs.sort(key=lambda r: r["metadata"]["turn_index"])
        assert [r["metadata"]["turn_index"] for r in rs] == list(range(turns)), sid
        for prev, nxt in zip(rs, rs[1:]):
            gap_ms = (nxt["metadata"]["request_start_ns"] - prev["metadata"]["request_end_ns"]) / 1e6
            assert gap_ms >= delay_ms - 5, (sid, gap_ms)  # sent only after the answer, plus the delay
            grown = nxt["metrics"]["usage_prompt_tokens"]["value"]
            had = prev["metrics"]["usage_prompt_tokens"]["value"] + prev["metrics"]["output_sequence_length"]["value"]
            assert grown > had, (sid, grown, had)  # the history (prompt and answer) came along
    firsts = [rs[0]["metadata"]["request_start_ns"] for rs in by_session.values()]
    lasts = [rs[-1]["metadata"]["request_end_ns"] for rs in by_session.values()]
    assert max(firsts) < min(lasts)  # the sessions ran at the same time
    return p
