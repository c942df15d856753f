"""Logs are plain text (issue 27 item 8): terminal colour codes a component writes (vllm-router
colours every line and ignores NO_COLOR) are dropped by the step's guard before they reach the log
file, and by every reader that shows a log or a note (`slurmrl logs`, FAILED) for logs written before."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from slurmrl.app.logs import Tail
from slurmrl.rundir.notes import read_note
from slurmrl.rundir.plain import PlainBytes, plain

ROUTER_LINE = ("\x1b[2m2026-11-25 16:53:00\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2mvllm_router_rs::server\x1b[0m"
               "\x1b[2m:\x1b[0m Starting router on 127.0.0.1:39123")
SEQUENCES = ["\x1b[0m", "\x1b[32m", "\x1b[1;31m", "\x1b[38;5;196m", "\x1b[2K", "\x1b[?25l", "\x1b]0;title\x07",
             "\x1b]8;;http://x\x1b\\", "\x1bM"]


def test_the_routers_line_is_plain():
    assert plain(ROUTER_LINE) == "2026-11-25 16:53:00  INFO vllm_router_rs::server: Starting router on 127.0.0.1:39123"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(SEQUENCES), st.text(alphabet="ab \n:[m0;", max_size=6)), max_size=30),
       st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=40))
def test_a_stream_cut_anywhere_comes_out_plain(pieces, cuts):
    data = "".join(pieces).encode()
    stream, out, i = PlainBytes(), b"", 0
    for n in cuts * (len(data) // max(sum(cuts), 1) + 1):
        out += stream.feed(data[i:i + n])
        i += n
    out += stream.feed(data[i:]) + stream.flush()
    assert out == plain(data.decode()).encode()
    assert b"\x1b[" not in out or b"\x1b[" in plain(data.decode()).encode()


def test_a_lone_escape_is_kept_in_the_end():
    stream = PlainBytes()
    assert stream.feed(b"a\x1b") == b"a"
    assert stream.flush() == b"\x1b"


def guarded(tmp_path, script: str, to_file: bool) -> str:
    cmd = [sys.executable, "-m", "slurmrl.runtime.steps.guard", "--", sys.executable, "-c", script]
    if not to_file:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    log = tmp_path / "step.log"
    with log.open("w") as f:
        assert subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=60).returncode == 3
    return log.read_text()


COLOURED = (f"import sys; print({ROUTER_LINE!r}, flush=True); print('\\x1b[31merr\\x1b[0m', file=sys.stderr, "
            "flush=True); sys.stdout.write('\\x1b[1mlast'); sys.exit(3)")


def test_the_guard_writes_a_step_log_file_without_colour_codes(tmp_path):
    text = guarded(tmp_path, COLOURED, to_file=True)
    assert "\x1b" not in text
    assert text == plain(ROUTER_LINE) + "\nerr\nlast", text


def test_on_a_pipe_or_a_terminal_the_guard_passes_output_as_it_is(tmp_path):
    assert guarded(tmp_path, COLOURED, to_file=False).startswith(ROUTER_LINE)


def test_readers_show_old_logs_and_notes_plain(tmp_path, capsys):
    log = tmp_path / "router.0.log"
    log.write_text(ROUTER_LINE + "\n")
    Tail().pump([log], final=True)
    assert capsys.readouterr().out == f"router.0.log: {plain(ROUTER_LINE)}\n"
    note = tmp_path / "FAILED"
    note.write_text("\x1b[31mrouter exited with code 1\x1b[0m\n")
    assert read_note(note) == "router exited with code 1"
