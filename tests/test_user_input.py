"""What the user hands slurmrl (issue 43's regressions): a recipe given through a pipe the user opened on
purpose (``slurmrl plan <(sed ... r.toml)``, ``/dev/stdin``) is read once, bounded, like the file; the
FIFO rule is for files read back from a run dir. And an ``output_dir`` (or ``--run-dir``, or a sweep's
folder) under a regular file is refused naming the field, before anything is made."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmrl import cli
from slurmrl.errors import UserError
from slurmrl.recipe.load import MAX_RECIPE_BYTES, load_recipe

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "rl-debug.toml"
SOME = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


def feed(fifo: Path, data: bytes, chunk: int) -> threading.Thread:
    """A writer at the other end of ``fifo``, in pieces of ``chunk`` bytes (as `sed` writes its output)."""
    def write() -> None:
        with open(fifo, "wb", buffering=0) as f, contextlib.suppress(BrokenPipeError):  # the reader had enough
            for i in range(0, len(data), chunk):
                f.write(data[i:i + chunk])

    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


@SOME
@given(chunk=st.integers(1, 9000), name=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True))
def test_a_recipe_through_a_pipe_is_the_recipe(tmp_path_factory, chunk, name):
    tmp = tmp_path_factory.mktemp("pipe")
    text = RECIPE.read_text().replace('name = "rl-debug"', f'name = "{name}"')
    (tmp / "r.toml").write_text(text)
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    writer = feed(fifo, text.encode(), chunk)
    piped = load_recipe(fifo, ["orchestrator.temperature=0.5"])
    writer.join(10)
    assert piped == load_recipe(tmp / "r.toml", ["orchestrator.temperature=0.5"]) and piped.name == name


@pytest.mark.parametrize("extra", [0, 1, 5 << 20])
def test_a_pipe_is_read_at_most_to_the_cap(tmp_path, extra):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = feed(fifo, b"#" * (MAX_RECIPE_BYTES + extra), 1 << 16)
    with pytest.raises(UserError) as e:
        load_recipe(fifo)
    assert e.value.field == str(fifo) and ("larger than" in e.value.message if extra else "empty" in e.value.message)
    writer.join(10)
    assert not writer.is_alive()


def test_process_substitution_as_a_user_types_it(tmp_path):
    """bash's ``<(...)``: plan, then render into a run dir whose recipe.toml is the piped recipe."""
    cmd = (f"{sys.executable} -m slurmrl render <(sed s/rl-debug/rl-piped/ {RECIPE}) --run-dir {tmp_path / 'run'} && "
           f"{sys.executable} -m slurmrl plan <(cat {tmp_path / 'run' / 'recipe.toml'}) --run-dir {tmp_path / 'run'}")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert 'name = "rl-piped"' in (tmp_path / "run" / "recipe.toml").read_text()


@pytest.mark.parametrize("kind", ["folder", "socket", "device"])
def test_what_is_not_a_file_nor_a_pipe_is_still_one_line(tmp_path, kind):
    path = tmp_path / "r"
    if kind == "folder":
        path.mkdir()
    elif kind == "device":
        path = Path("/dev/null")
    else:
        import socket
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    rc, out, err = run(["plan", str(path)])
    assert rc == 2 and out == "" and len(err.splitlines()) == 1 and str(path) in err


# ---- an output folder under a regular file --------------------------------------------------------------
@SOME
@given(depth=st.integers(0, 3), verb=st.sampled_from(["plan", "render", "sweep", "run-dir"]))
def test_an_output_dir_under_a_file_is_refused_naming_the_field(tmp_path_factory, depth, verb):
    tmp = tmp_path_factory.mktemp("under")
    blocker = tmp / "a-file"
    blocker.write_text("x\n")
    below = blocker.joinpath(*(f"d{i}" for i in range(depth)))
    argv = {"plan": ["plan", str(RECIPE), "--set", f"output_dir='{below}'"],
            "render": ["render", str(RECIPE), "--set", f"output_dir='{below}'"],
            "sweep": ["sweep", str(RECIPE), "--grid", "orchestrator.temperature=0.7,1.0", "--render-only",
                      "--set", f"output_dir='{below}'"],
            "run-dir": ["render", str(RECIPE), "--run-dir", str(below / "run")]}[verb]
    before = sorted(tmp.rglob("*"))
    rc, out, err = run(argv)
    field = "output_dir"  # --run-dir too, as every other refusal of the run dir's path says
    assert rc == 2 and out == "", (rc, out, err)
    assert err.startswith(f"slurmrl: error: {field}: {below}") and err.count("\n") == 1, err
    assert err.endswith(f"cannot be made: {blocker} is a file, where slurmrl writes a folder; move it away\n"), err
    assert sorted(tmp.rglob("*")) == before and blocker.read_text() == "x\n"
