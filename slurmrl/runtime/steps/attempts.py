"""Why earlier attempts ended, recorded as events; the nodes the run keeps out, kept out.

    python3 -m slurmrl.runtime.steps.attempts start [MAX_REQUEUES]   (the batch shell, as an attempt starts)
    python3 -m slurmrl.runtime.steps.attempts record                 (the batch shell, as a failed job ends)

Both turn the job script's notes (logs/attempt-N/END and NODE_FAULTS, slurmrl.contract.attempt_end)
into ``attempt_ended`` and ``excluded`` events, once per attempt. ``start`` also records an earlier
attempt that left no note (its batch node was lost: Slurm's state for it, from sacct, says why), and
exits 4 when the job was requeued (the warning signal, node faults) more than MAX_REQUEUES times (the node check,
slurmrl.runtime.steps.node_start, turns away a node the run excluded). Reads RUN_DIR, SLURM_JOB_ID, SLURMRL_ATTEMPT and SLURMRL_NODES_G<n> from the environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from slurmrl.contract import attempt_end, events, job_env
from slurmrl.contract.attempt_end import EndNote
from slurmrl.rundir.notes import read_note
from slurmrl.rundir.paths import RunDir

SACCT_CLASS = {"NODE_FAIL": "node", "BOOT_FAIL": "node", "PREEMPTED": "preemption", "TIMEOUT": "time_limit",
               "CANCELLED": "cancel", "FAILED": "application", "OUT_OF_MEMORY": "application",
               "REQUEUED": "preemption"}
BAD_STATES = "down,drain,fail,no_respond"
SLURM_TIMEOUT_S = 30


def slurm(argv: list[str]) -> str:
    """A Slurm client command's output; '' when it fails (the caller records what it can)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def bad_nodes(nodes: list[str]) -> dict[str, str]:
    """Those of ``nodes`` Slurm holds down, drained, failing or not responding: node -> Slurm's reason."""
    if not nodes:
        return {}
    out = slurm(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-t", BAD_STATES, "-o", "%N %E"])
    found: dict[str, str] = {}
    for line in out.splitlines():
        node, _, reason = line.strip().partition(" ")
        if node:
            found.setdefault(node, f"Slurm: {reason.strip() or 'down'}")
    return found


def sacct_attempts(job_id: str) -> list[tuple[str, list[str]]]:
    """(state, nodes) per attempt of the job, oldest first (sacct -D lists every requeued run)."""
    rows = []
    for line in slurm(["sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", "State,NodeList"]).splitlines():
        state, _, nodelist = line.partition("|")
        names = slurm(["scontrol", "show", "hostnames", nodelist]).split() if nodelist[:1].isalnum() else []
        rows.append((state.split(" ")[0], names))
    return rows


def unnoted(job_id: str, attempt: int, later: int) -> tuple[EndNote, dict[str, str]]:
    """An earlier attempt without an END note: what Slurm says about it (it was requeued: ``later`` runs)."""
    rows = sacct_attempts(job_id)
    state, nodes = rows[attempt] if attempt < len(rows) else ("", [])
    faults = bad_nodes(nodes) if state in ("NODE_FAIL", "BOOT_FAIL") else {}
    cls = SACCT_CLASS.get(state, "node" if faults else "cancel")
    why = f"its batch shell wrote no end (Slurm: {state or 'no record'}); attempt {later} recorded it"
    return EndNote(time.time(), cls, True, why), faults


def record(run_dir: Path, job_id: str, attempt: int, current_done: bool) -> list[events.Event]:
    """Events for every attempt up to ``attempt`` that has none yet (the current one only when
    ``current_done``); returns those appended."""
    paths = RunDir(run_dir)
    have = events.read(paths.events)
    done, excluded = attempt_end.ends(have), attempt_end.excluded(have)
    new: list[events.Event] = []
    for a in range(attempt + (1 if current_done else 0)):
        if (job_id, a) in done or not paths.log_dir(a).is_dir():
            continue
        note = attempt_end.read_end(paths.end_note(a))
        faults = attempt_end.read_faults(paths.node_faults(a))
        if note is None and a < attempt:
            note, more = unnoted(job_id, a, attempt)
            faults = {**more, **faults}
        if note is None:
            continue
        new.append(attempt_end.ended_event(a, job_id, note, faults))
        for node, reason in faults.items():
            if node not in excluded:
                excluded[node] = attempt_end.excluded_event(a, job_id, node, reason, note.time)
                new.append(excluded[node])
    for e in new:
        events.append(paths.events, e)
    return new


def excluded_nodes(run_dir: Path) -> dict[str, str]:
    """Every node the run keeps out, with why: its ``excluded`` events, and the NODE_FAULTS notes of
    attempts not recorded yet (a requeued job's next start records them)."""
    paths = RunDir(run_dir)
    out = {node: e.cause for node, e in attempt_end.excluded(events.read(paths.events)).items()}
    for a in paths.attempts():
        for node, reason in attempt_end.read_faults(paths.node_faults(a)).items():
            out.setdefault(node, reason)
    return out


def requeues_used(run_dir: Path, attempt: int) -> int:
    """The requeues of ``slurm.max_requeues`` this job used before ``attempt``: the warning signal's and
    the node faults' (Slurm's own NODE_FAIL requeue included), from each attempt's notes."""
    paths = RunDir(run_dir)
    return sum(attempt_end.used_requeue(attempt_end.read_end(paths.end_note(a)), read_note(paths.preempted_file(a)))
               for a in range(attempt))


def start(run_dir: Path, job_id: str, attempt: int, max_requeues: int | None) -> int:
    for e in record(run_dir, job_id, attempt, current_done=False):
        print(f"slurmrl: attempt {e.attempt}: {e.kind} {e.node or ''} {e.detail.get('class', '')} {e.cause}".rstrip())
    used = requeues_used(run_dir, attempt)
    if max_requeues is not None and used > max_requeues:
        print(f"slurmrl: this job was requeued {used} time(s) (warning signal and node faults), more than "
              f"slurm.max_requeues ({max_requeues})")
        return 4
    return 0


def main(argv: list[str]) -> int:
    run_dir, job_id = Path(os.environ["RUN_DIR"]), os.environ["SLURM_JOB_ID"]
    attempt = int(os.environ.get(job_env.ATTEMPT) or 0)
    if argv[:1] == ["record"]:
        record(run_dir, job_id, attempt, current_done=True)
        return 0
    if argv[:1] == ["start"]:
        limit = argv[1] if len(argv) > 1 else ""
        return start(run_dir, job_id, attempt, int(limit) if limit.isdigit() else None)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
