"""Planned stops leave no tracebacks: after the guard has passed on a stop (TERM or INT from the
supervisor, which the script's teardown, `slurmrl cancel`, the time limit or the warning signal
sent), torchrun's agent answers each TERM it gets (Slurm signals every process of the step, the guard
forwards one more) with ``SignalException`` and dies printing a chain of tracebacks of it. Those say
nothing went wrong: the workers were told to checkpoint and stop. ``StopTracebacks`` holds back every
traceback the command prints once a stop was asked and drops a chain whose exceptions are all
SignalException, writing one line in its place; any other traceback is written as it was. The
guard then exits with the signal's code (128+N) rather than torchrun's 1: a stop, not a failure.

Standard library only (it runs in the step's guard)."""

from __future__ import annotations

import re
import threading

HEADER = b"Traceback (most recent call last):"
CHAINED = (b"During handling of the above exception, another exception occurred:",
           b"The above exception was the direct cause of the following exception:")
SIGNAL = re.compile(rb"^(?:[\w.]+\.)?SignalException: Process \d+ got signal: (\d+)\s*$")
MAX_HELD = 4 << 20  # a traceback longer than this is written as it is


class StopTracebacks:
    """A byte-stream filter (``feed`` chunks, then ``flush``); passes everything through until ``stop``
    is set."""

    def __init__(self, stop: threading.Event, name: str = "command") -> None:
        self.stop = stop
        self.name = name
        self.partial = b""
        self.block: list[bytes] = []  # lines of the traceback chain being held
        self.after_exception = False  # the block's last line was an exception line
        self.dropped: int | None = None  # the signal of a SignalException chain left out

    def feed(self, chunk: bytes) -> bytes:
        if not self.stop.is_set() and not self.block and not self.partial:
            return chunk
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        out = b"".join(self.line(ln + b"\n") for ln in lines)
        if not self.block and not self.partial.startswith(HEADER[:len(self.partial)]):
            out, self.partial = out + self.partial, b""  # not the start of a traceback: no need to wait
        return out

    def flush(self) -> bytes:
        out = self.line(self.partial) if self.partial else b""
        self.partial = b""
        return out + self.end_block()

    def line(self, raw: bytes) -> bytes:
        text = raw.rstrip(b"\r\n")
        if not self.block:
            if self.stop.is_set() and text == HEADER:
                self.block, self.after_exception = [raw], False
                return b""
            return raw
        if self.after_exception and text not in (b"", *CHAINED, HEADER):
            return self.end_block() + self.line(raw)  # the chain ended before this line
        self.block.append(raw)
        if sum(map(len, self.block)) > MAX_HELD:
            return self.end_block(keep=True)
        self.after_exception = bool(text) and not text[:1].isspace() and text not in (*CHAINED, HEADER)
        return b""

    def end_block(self, keep: bool = False) -> bytes:
        block, self.block, self.after_exception = self.block, [], False
        if not block:
            return b""
        exceptions = [ln.rstrip(b"\r\n") for ln in block
                      if ln.strip() and not ln[:1].isspace() and ln.rstrip(b"\r\n") not in (*CHAINED, HEADER)]
        matches = [SIGNAL.match(e) for e in exceptions]
        found = [m for m in matches if m is not None]
        if keep or not found or len(found) < len(matches):
            return b"".join(block)
        signals = ", ".join(sorted({m[1].decode() for m in found}))
        self.dropped = int(found[-1][1])
        return (f"slurmrl: {self.name} stopped on signal {signals} as asked (a planned stop); its "
                f"{len(found)} SignalException traceback(s) left out\n").encode()
