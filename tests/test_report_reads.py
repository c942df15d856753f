"""`slurmrl report` checked by what a user reads (issue 36 item 3), in a real headless browser (Debian's
chromium): a copy of the page with a script of this test added lays it out, measures every word of
every chart (the charts are SVG whose words are text) and reads the numbers under each panel; then:

- each panel's numbers are the run dir's files, read here on their own (the orchestrator's and
  trainer's step records, metrics/eval.jsonl, the servers' scrapes, the benchmark's summary), and
  the chart names every series it draws;
- no two words of a chart overlap and none runs past the chart's frame (the phases of a run, with
  phases seconds apart, included);
- only panels with data are on the page, and one line says what was not collected;
- latency points are windows' means, with gaps where no request finished (idle scrapes added to the
  recording: minutes with nothing served);
- a tall step or a KL spike is cut with its value written, not flattening the rest.

Three run dirs: an RL job with eval (tests/support/fixtures/report-rl, a real run, plus eval rows and a
failed attempt's FAILED note written here), a P/D inference job with a benchmark (its rendered run
dir and a benchmark summary written here), and the same RL job with a 657 s step and a KL of 17.
"""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from slurmrl import cli
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.scrape import read_scrapes

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "support" / "fixtures" / "report-rl"
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,3000"]
TTFT = "vllm:time_to_first_token_seconds"
EVALS = [{"step": 0, "reward_mean": 0.03, "pass@1": 0.02, "pass@4": 0.07, "prompts": 16, "samples_per_prompt": 4},
         {"step": 4, "reward_mean": 0.06, "pass@1": 0.05, "pass@4": 0.15, "prompts": 16, "samples_per_prompt": 4},
         {"step": 8, "reward_mean": 0.09, "pass@1": 0.08, "pass@4": 0.22, "prompts": 16, "samples_per_prompt": 4}]

AUDIT = r"""
(function () {
  const out = {panels: {}, notCollected: null, failed: []};
  const nc = document.getElementById("not-collected");
  out.notCollected = nc ? nc.textContent : null;
  for (const p of document.querySelectorAll("p.failed")) out.failed.push(p.textContent);
  for (const sec of document.querySelectorAll("section[id^=panel-]")) {
    const svg = sec.querySelector("svg");
    const p = {texts: [], overlaps: [], outside: [], numbers: [], svgs: sec.querySelectorAll("svg").length, yaxes: []};
    for (const g of sec.querySelectorAll("g[id*='-axes_']")) {  // each chart's y axis: its ticks and label
      const axis = Array.from(g.children).filter(c => (c.id || "").includes("matplotlib.axis_"))[1];
      if (axis) p.yaxes.push(Array.from(axis.querySelectorAll("text")).map(t => t.textContent.trim()));
    }
    if (svg) {
      const frame = svg.getBoundingClientRect();
      const boxes = [];
      for (const t of svg.querySelectorAll("text")) {
        const r = t.getBoundingClientRect(), s = t.textContent.trim();
        if (!s || r.width === 0) continue;
        boxes.push([s, r]);
        p.texts.push(s);
        if (r.left < frame.left - 0.5 || r.right > frame.right + 0.5 || r.top < frame.top - 0.5 || r.bottom > frame.bottom + 0.5)
          p.outside.push(s);
      }
      for (let i = 0; i < boxes.length; i++)
        for (let j = i + 1; j < boxes.length; j++) {
          const a = boxes[i][1], b = boxes[j][1];
          if (Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1 && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1)
            p.overlaps.push([boxes[i][0], boxes[j][0]]);
        }
    }
    for (const tr of sec.querySelectorAll("table.numbers tr"))
      if (tr.querySelector("td")) p.numbers.push(Array.from(tr.children).map(x => x.textContent));
    out.panels[sec.id.slice(6)] = p;
  }
  const pre = document.createElement("pre");
  pre.id = "audit";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
"""
# two words on top of each other: the audit must see it (else it proves nothing)
OVERPRINT = ('<section id="panel-selfcheck"><svg width="200" height="50"><text x="10" y="30">overprinted</text>'
             '<text x="14" y="32">words</text><text x="190" y="30">past the frame</text></svg></section>')


def read_page(tmp_path: Path, run_dir: Path) -> dict:
    """Report ``run_dir``, open a copy of its page with the audit script in chromium, return what it read."""
    assert cli.main(["report", str(run_dir)]) == 0
    page = RunDir(run_dir).report_page()
    text = page.read_text()
    assert "<script" not in text and 'src="http' not in text  # the page itself: self-contained, no script
    (page.parent / "audit.js").write_text(AUDIT)
    copy = page.parent / "audited.html"
    copy.write_text(text.replace("</body>", OVERPRINT + '<script src="audit.js"></script></body>'))
    profile = tmp_path / f"chromium-{len(list(tmp_path.glob('chromium-*')))}"
    r = subprocess.run([*CHROMIUM, f"--user-data-dir={profile}", "--dump-dom", copy.as_uri()], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'<pre id="audit">(.*?)</pre>', r.stdout, re.S)
    assert m, r.stdout[-2000:]
    found = json.loads(html.unescape(m.group(1)))
    check = found["panels"].pop("selfcheck")
    assert check["overlaps"] == [["overprinted", "words"]] and check["outside"] == ["past the frame"]
    return found


def legible(found: dict) -> None:
    for key, p in found["panels"].items():
        assert p["svgs"] == 1 and p["texts"], key  # a drawn chart, its words text
        assert p["overlaps"] == [], (key, p["overlaps"])
        assert p["outside"] == [], (key, p["outside"])
        assert p["numbers"], key  # every panel on the page has data under it


def numbers(found: dict, key: str, chart: str | None = None) -> dict[str, tuple[list[float], list[float]]]:
    """A panel's numbers (of one of its charts): series -> (xs, ys), "-" as NaN."""
    def floats(cell: str) -> list[float]:
        return [math.nan if w == "-" else float(w) for w in cell.split()]

    return {row[1]: (floats(row[2]), floats(row[3])) for row in found["panels"][key]["numbers"]
            if chart is None or row[0] == chart}


def same(drawn: tuple[list[float], list[float]], want: tuple[list[float], list[float]]) -> bool:
    return close(drawn[0], want[0]) and close(drawn[1], want[1])


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-9)
                                    for x, y in zip(a, b))


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def field(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    got = [(float(r["step"]), float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]
    return [s for s, _ in got], [v for _, v in got]


def add_idle_minutes_and_a_burst(scrape: Path) -> tuple[float, float]:
    """Append two idle minutes of scrapes (nothing served), then one with 3 requests of 0.25 s TTFT:
    (the idle windows' first end, the burst's time)."""
    keys = {k: i for line in jsonl(scrape) for i, k in (line.get("k") or {}).items()}
    s = read_scrapes(scrape)
    ids, last = {}, {}
    for suffix in ("_sum", "_count"):
        key = next(k for k in keys if k.startswith(TTFT + suffix))
        ids[suffix], last[suffix] = keys[key], s.values[key][-1]
    t = s.times[-1]
    with scrape.open("a") as f:
        for n in range(1, 13):
            f.write(json.dumps({"t": t + 10 * n, "v": {}}) + "\n")
        f.write(json.dumps({"t": t + 130, "v": {ids["_sum"]: last["_sum"] + 0.75, ids["_count"]: last["_count"] + 3}})
                + "\n")
    return t + 10, t + 130


@pytest.fixture
def rl_run(tmp_path) -> Path:
    d = tmp_path / "rl-run"
    shutil.copytree(FIXTURE, d)
    (d / "metrics" / "eval.jsonl").write_text("".join(json.dumps({**e, "split": "heldout"}) + "\n" for e in EVALS))
    RunDir(d).failed_file(1).write_text("trainer: worker rank 0 (pid 4242) killed by SIGKILL\n")
    return d


def test_an_rl_job_with_eval_reads_right(rl_run, tmp_path):
    idle_from, burst = add_idle_minutes_and_a_burst(RunDir(rl_run).scrape_file(0, "inference.0"))
    found = read_page(tmp_path, rl_run)
    legible(found)
    assert set(found["panels"]) == {"phases", "throughput", "latency", "queue-kv", "step-split", "curves", "weight-sync"}
    said = found["notCollected"]
    assert said.startswith("Not collected:") and said.count("GPUs (") == 1 and said.count("benchmark (") == 1, said
    assert found["failed"] == ["attempt 1 FAILED: trainer: worker rank 0 (pid 4242) killed by SIGKILL"]
    orch, trainer = jsonl(rl_run / "metrics" / "orchestrator.jsonl"), jsonl(rl_run / "metrics" / "trainer.jsonl")
    curves = numbers(found, "curves")
    assert same(curves["training reward"], field(orch, "reward_mean"))
    for name, key in (("eval reward (mean)", "reward_mean"), ("eval pass@1", "pass@1"), ("eval pass@4", "pass@4")):
        assert same(curves[name], field(EVALS, key)), name
        assert name in found["panels"]["curves"]["texts"], name  # the legend names it
    assert same(curves["kl_inference"], field(trainer, "kl_inference"))
    split = numbers(found, "step-split")
    assert same(split["generate"], field(orch, "generate_s"))
    assert same(split["train"], field(trainer, "step_time_s"))
    # latency: windows' means, computed here from the scrapes, with gaps where no request finished
    s = read_scrapes(RunDir(rl_run).scrape_file(0, "inference.0"))
    col = {suf: s.values[next(k for k in s.values if k.startswith(TTFT + suf))] for suf in ("_sum", "_count")}
    t0 = min(float(t) for a in (0, 1) for t, _ in RunDir(rl_run).read_phases(a))
    want = [((col["_sum"][i] - col["_sum"][i - 1]) / dc) if (dc := col["_count"][i] - col["_count"][i - 1]) > 0
            else math.nan for i in range(1, len(s.times))]
    xs, ys = numbers(found, "latency", "TTFT (s): window mean")["inference.0"]
    assert close(xs, [t - t0 for t in s.times[1:]]) and close(ys, want)
    idle = [y for x, y in zip(xs, ys) if idle_from - t0 <= x < burst - t0]
    assert len(idle) == 12 and all(math.isnan(y) for y in idle)  # gaps, not a line across the idle minutes
    assert math.isclose(ys[-1], 0.25)  # the burst's 3 requests: their mean
    assert "Each point is a window's mean" in html.unescape(RunDir(rl_run).report_page().read_text())


def test_a_tall_step_and_a_kl_spike_are_cut_with_their_value_written(rl_run, tmp_path):
    for name, key, value in (("orchestrator", "generate_s", 657.0), ("trainer", "kl_inference", 17.0)):
        path = rl_run / "metrics" / f"{name}.jsonl"
        rows = jsonl(path)
        rows[1][key] = value
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = read_page(tmp_path, rl_run)
    legible(found)
    for key, label, shown in (("step-split", "orchestrator, s per step", "657"), ("curves", "KL", "17")):
        texts = found["panels"][key]["texts"]
        assert shown in texts and "past the top: its value written" in texts, (key, texts)
        axis = next(a for a in found["panels"][key]["yaxes"] if label in a)
        ticks = [float(t.replace("\u2212", "-")) for t in axis if re.fullmatch(r"\u2212?\d+(\.\d+)?", t)]
        assert ticks and max(ticks) < float(shown) / 4, (key, axis)  # the axis is cut: the usual range keeps its room
    assert numbers(found, "step-split")["generate"][1][1] == 657.0  # the table has the true value


def test_a_pd_job_with_a_benchmark_shows_only_what_it_has(tmp_path):
    run_dir = tmp_path / "pd"
    assert cli.main(["render", str(ROOT / "recipes" / "inference-pd.toml"), "--run-dir", str(run_dir)]) == 0
    paths = RunDir(run_dir)
    paths.add_phase(0, "allocation: job 7 attempt 0")
    for what in ("prefill ready", "decode ready", "router ready", "all components ready"):
        paths.add_phase(0, what)  # seconds apart at most: the labels must not overprint
    points = [{"concurrency": c, "input_len": 256, "output_len": 64, "completed": 32, "failed": 0, "num_prompts": 32,
               "output_throughput": 40.0 * c, "request_throughput": 0.6 * c, "total_token_throughput": 200.0 * c,
               "ttft_p50_ms": 30.0 + c, "ttft_p99_ms": 60.0 + c, "tpot_p50_ms": 5.0 + c / 4, "tpot_p99_ms": 9.0,
               "itl_p50_ms": 5.0, "itl_p99_ms": 9.0, "e2el_p50_ms": 400.0, "e2el_p99_ms": 800.0} for c in (1, 4, 16)]
    paths.benchmark_summary().parent.mkdir(parents=True, exist_ok=True)
    paths.benchmark_summary().write_text(json.dumps({"status": "done", "points": points, "planned_points": 3,
                                                     "target": "http://n1:8000", "error": None}))
    found = read_page(tmp_path, run_dir)
    legible(found)
    assert set(found["panels"]) == {"phases", "benchmark"}
    said = found["notCollected"]
    for missing in ("vLLM servers' metrics", "GPUs", "RL step records"):
        assert said.count(missing) == 1, said
    bench = numbers(found, "benchmark", "output tokens/s")["in 256 / out 64"]
    assert close(bench[0], [1.0, 4.0, 16.0]) and close(bench[1], [40.0, 160.0, 640.0])  # output tokens/s
    phases = [t for t in found["panels"]["phases"]["texts"] if t.startswith("attempt 0: ")]
    assert len(phases) == 5 and "attempt 0: all components ready" in phases
