"""Logs are plain text: terminal colour and cursor codes (ANSI escape sequences) that a component
writes (vllm-router's tracing output colours every line, whatever NO_COLOR says) are dropped here,
the one place: by the step's guard before they reach the log file, and by every reader that shows
a log or a note (`slurmrl logs`, FAILED/STOPPED, status), for logs written before."""

from __future__ import annotations

import re

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), and the two-byte ESC sequences (not '[' or ']')
_ANSI = r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\^_]"
ANSI = re.compile(_ANSI)
ANSI_BYTES = re.compile(_ANSI.encode())
# the start of a sequence cut off by the end of a chunk: ESC, ESC [ params, ESC ] text (ESC)
PREFIX = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?)?\Z")
MAX_SEQUENCE = 256  # a longer run after ESC is not a sequence: written as it is


def plain(text: str) -> str:
    """``text`` without ANSI escape sequences."""
    return ANSI.sub("", text) if "\x1b" in text else text


class PlainBytes:
    """Strips ANSI escape sequences from a byte stream fed in chunks: a sequence split between two
    chunks is held back until the next one completes it (at most ``MAX_SEQUENCE`` bytes)."""

    def __init__(self) -> None:
        self.held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.held + chunk
        self.held = b""
        cut = PREFIX.search(data, max(len(data) - MAX_SEQUENCE, 0))
        if cut:  # perhaps the start of a sequence: wait for the rest
            data, self.held = data[:cut.start()], data[cut.start():]
        return ANSI_BYTES.sub(b"", data)

    def flush(self) -> bytes:
        data, self.held = self.held, b""
        return ANSI_BYTES.sub(b"", data)
