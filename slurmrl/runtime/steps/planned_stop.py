"""Planned stops leave no tracebacks: after the guard has passed on a stop (TERM or INT from the
supervisor, which the script's teardown, `slurmrl cancel`, the time limit or the warning signal
sent), torchrun's agent answers each TERM it gets (Slurm signals every process of the step, the guard
forwards one more) with ``SignalException`` and dies printing a chain of tracebacks of it. Those say
nothing went wrong: the workers were told to checkpoint and stop. ``StopTracebacks`` holds back every
traceback the command prints once a stop was asked and drops a chain whose exceptions are all
SignalException, writing one line in its place; any other traceback is written as it was. The
guard then exits with the signal's code (128+N) rather than torchrun's 1: a stop, not a failure.
When the signal lands inside one of torchrun's log calls, logging prints the SignalException as a
"--- Logging error ---" block (the traceback, "Call stack:", its frames, "Message:", "Arguments:"):
after a stop such a block is left out whole (a reentrant write to stderr, the signal's other face, too).

Standard library only (it runs in the step's guard)."""

from __future__ import annotations

import re
import threading

HEADER = b"Traceback (most recent call last):"
CHAINED = (b"During handling of the above exception, another exception occurred:",
           b"The above exception was the direct cause of the following exception:")
SIGNAL = re.compile(rb"^(?:[\w.]+\.)?SignalException: Process \d+ got signal: (\d+)\s*$")
LOGGING_ERROR = b"--- Logging error ---"
LOGGING_TAIL = (b"Message: ", b"Arguments: ", b"Unable to print the message", b"Use the traceback above")
LOGGING_END = (b"Arguments: ", b"Use the traceback above")  # the block's last line
REENTRANT = re.compile(rb"^RuntimeError: reentrant call inside ")
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
        self.logging: list[bytes] | None = None  # a "--- Logging error ---" block being held
        self.logging_dropped = 0  # such blocks left out

    def feed(self, chunk: bytes) -> bytes:
        if not self.stop.is_set() and not self.block and not self.partial and self.logging is None:
            return chunk
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        out = b"".join(self.line(ln + b"\n") for ln in lines)
        if not self.block and self.logging is None and not any(
                self.partial.startswith(h[:len(self.partial)]) for h in (HEADER, LOGGING_ERROR)):
            out, self.partial = out + self.partial, b""  # not the start of a traceback: no need to wait
        return out

    def flush(self) -> bytes:
        out = self.line(self.partial) if self.partial else b""
        self.partial = b""
        return out + self.end_block() + self.end_logging(keep=True)

    def line(self, raw: bytes) -> bytes:
        text = raw.rstrip(b"\r\n")
        if self.logging is not None:
            return self.logging_line(raw, text)
        if not self.block and self.stop.is_set() and text == LOGGING_ERROR:
            self.logging = [raw]
            return b""
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

    def logging_line(self, raw: bytes, text: bytes) -> bytes:
        """A line of a held "--- Logging error ---" block: it ends with "Arguments: ..." (then left out
        when its exceptions are the stop's); a line that is not of such a block writes it as it was."""
        assert self.logging is not None
        block = self.logging
        in_stack = any(ln.startswith(b"Call stack:") for ln in block)
        fits = (not text or text[:1].isspace() or text.startswith(LOGGING_TAIL) or text == b"Call stack:"
                or (not in_stack and not text.startswith(b"slurmrl: ")))
        if not fits or sum(map(len, block)) > MAX_HELD:
            return self.end_logging(keep=True) + self.line(raw)
        block.append(raw)
        if text.startswith(LOGGING_END):
            return self.end_logging()
        return b""

    def end_logging(self, keep: bool = False) -> bytes:
        block, self.logging = self.logging or [], None
        stack = next((i for i, ln in enumerate(block) if ln.startswith(b"Call stack:")), len(block))
        exceptions = [ln.rstrip(b"\r\n") for ln in block[1:stack]
                      if ln.strip() and not ln[:1].isspace() and ln.rstrip(b"\r\n") not in (*CHAINED, HEADER)]
        signals = [m for m in map(SIGNAL.match, exceptions) if m is not None]
        if keep or not exceptions or any(SIGNAL.match(e) is None and REENTRANT.match(e) is None for e in exceptions):
            return b"".join(block)
        self.logging_dropped += 1
        if signals:
            self.dropped = int(signals[-1][1])
        return b""
