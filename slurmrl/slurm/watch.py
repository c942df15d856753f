"""Job state from sacct (through submitit's watcher, taught about het jobs) and squeue.

sacct lists a het job as one row per component, ``<id>+<k>``, with steps ``<id>+<k>.<n>``;
submitit's ``SlurmInfoWatcher`` only matches ``<id>`` rows, so ``HetInfoWatcher.read_info`` folds
the component rows into the job. slurmctld reports to slurmdbd asynchronously, so for about a
second after a submit (and briefly after each change) sacct lags: it may not know the job yet, or
show one ``<id>`` row and steps as ``<id>.<n>``. squeue asks the controller itself and wins while
the job is in its memory; it also gives the pending reason.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from submitit.slurm.slurm import SlurmInfoWatcher

from slurmrl.errors import UserError
from slurmrl.slurm import tools

SACCT_FIELDS = "JobID,JobName,State,ExitCode,Elapsed,NodeList,Reason"
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "COMPLETING", "CONFIGURING",
          "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "UNKNOWN", "SPECIAL_EXIT"}
# the state a het job shows when its components disagree: the first one present wins
ORDER = ("RUNNING", "COMPLETING", "CONFIGURING", "PENDING", "REQUEUED", "SUSPENDED", "FAILED", "OUT_OF_MEMORY",
         "NODE_FAIL", "TIMEOUT", "BOOT_FAIL", "DEADLINE", "PREEMPTED", "CANCELLED", "COMPLETED")
SETTLE_S = 10.0  # after the controller says the job ended, how long to wait for sacct's exit codes
# <id>, a het component <id>+<k>, an array task <id>_<i> (a sweep), each with steps .<n>
_ID = re.compile(r"^(?P<job>\d+(?:_\d+)?)(?:\+(?P<het>\d+))?(?:\.(?P<step>[\w-]+))?$")
_PENDING_TASKS = re.compile(r"^(?P<job>\d+)_\[(?P<spec>[\d,\-]+)(?:%\d+)?\](?P<rest>.*)$")


def array_rows(row: dict, key: str = "JobID") -> list[dict]:
    """sacct and squeue fold an array's tasks that have not started into one row, ``<id>_[2-5%2]``:
    one row per task (``key``: the row's id column)."""
    m = _PENDING_TASKS.match(row.get(key, ""))
    if not m:
        return [row]
    out = []
    for part in m["spec"].split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (hi.isdigit() or not hi):
            out += [{**row, key: f"{m['job']}_{i}{m['rest']}"} for i in range(int(lo), int(hi or lo) + 1)]
    return out


def norm_state(state: str) -> str:
    """``CANCELLED by 0`` -> ``CANCELLED``."""
    return (state.split() or ["UNKNOWN"])[0].upper()


def seconds(elapsed: str) -> int:
    """Slurm's ``[D-][HH:]MM:SS`` -> seconds; 0 when unreadable."""
    days, _, clock = elapsed.rpartition("-")
    try:
        values = [int(x) for x in clock.split(":")]
        h, m, sec = ([0, 0, 0] + values)[-3:]
        return int(days or 0) * 86400 + h * 3600 + m * 60 + sec
    except ValueError:
        return 0


def clock(elapsed: str) -> str:
    """squeue's ``4:05`` -> sacct's ``00:04:05`` (so both read the same)."""
    if not elapsed or not re.fullmatch(r"(\d+-)?[\d:]+", elapsed):
        return elapsed
    total = seconds(elapsed)
    days, rest = divmod(total, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def overall(states: list[str]) -> str:
    present = {norm_state(s) for s in states}
    if not present:
        return "UNKNOWN"
    return next((s for s in ORDER if s in present), sorted(present)[0])


class HetInfoWatcher(SlurmInfoWatcher):
    """submitit's sacct poller, with more columns and het component rows folded into the job.

    ``get_info(job_id)`` gives ``State`` (over all components), ``ExitCode``, ``Elapsed``,
    ``NodeList``, ``Reason``, plus ``components`` (one sacct row per het component; for a plain
    job its one row) and ``steps`` (rows of numbered steps, with ``group``).
    """

    def _make_command(self) -> list[str] | None:
        # Every registered job, ended or not: submitit stops asking about a job once its state is
        # final, but sacct can show a het job ended before it lists every component with its nodes
        # (CI saw ``<id>+0 COMPLETED`` and no ``<id>+1``), so a forced call must ask again.
        to_check = sorted({x.split("_")[0] for x in self._registered})
        if not to_check:
            return None
        command = ["sacct", "-o", SACCT_FIELDS, "--parsable2"]
        for jid in to_check:
            command.append(f"--jobs={jid}")
        return tools.transport().argv(command)  # submitit runs it: here, or over ssh with --cluster

    def read_info(self, string: bytes | str) -> dict[str, dict]:
        if not isinstance(string, str):
            string = string.decode()
        lines = string.splitlines()
        if len(lines) < 2:
            return {}
        names = lines[0].split("|")
        jobs: dict[str, dict] = {}
        rows: list[dict] = [{k: v.strip() for k, v in zip(names, line.split("|"))} for line in lines[1:]]
        # a folded row (``<id>_[0-1%1]``) keeps listing tasks that have a row of their own since they started
        listed = {r.get("JobID") for r in rows}
        rows = [r for folded in rows for r in array_rows(folded) if r is folded or r["JobID"] not in listed]
        for row in rows:
            m = _ID.match(row.get("JobID", ""))
            if not m:
                continue
            job = jobs.setdefault(m["job"], {"plain": None, "components": {}, "steps": []})
            if m["step"] is not None:
                if m["step"].isdigit():
                    row["group"] = int(m["het"]) if m["het"] is not None else None
                    row["step"] = int(m["step"])
                    job["steps"].append(row)
            elif m["het"] is not None:
                row["group"] = int(m["het"])
                job["components"][int(m["het"])] = row
            else:
                row["group"] = 0
                job["plain"] = row
        info = {}
        for job_id, job in jobs.items():
            comps = [job["components"][k] for k in sorted(job["components"])] or [job["plain"]]
            comps = [c for c in comps if c is not None]
            if not comps:
                continue
            info[job_id] = {
                "State": overall([c["State"] for c in comps]),
                "ExitCode": next((c["ExitCode"] for c in comps if c.get("ExitCode", "0:0") != "0:0"),
                                 comps[0].get("ExitCode", "")),
                "Elapsed": max((c.get("Elapsed", "") for c in comps), key=seconds),
                "NodeList": ",".join(c["NodeList"] for c in comps if c.get("NodeList")),
                "Reason": comps[0].get("Reason", ""),
                "components": comps,
                "steps": sorted(job["steps"], key=lambda s: s["step"]),
            }
        return info

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        return self.get_state(job_id, mode=mode).upper() not in ACTIVE


@dataclass
class Part:
    """One het component of the job (the whole job when it is not a het job)."""

    id: str
    group: int
    state: str
    nodes: str = ""
    elapsed: str = ""
    exit_code: str = ""
    reason: str = ""


@dataclass
class Step:
    id: str
    name: str
    group: int | None
    state: str
    exit_code: str
    elapsed: str
    nodes: str


@dataclass
class Snapshot:
    job_id: str
    state: str
    parts: list[Part] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    in_queue: bool = False  # the controller still knows it
    in_accounting: bool = False  # sacct has caught up with it
    restarts: int | None = None  # Slurm's restart count while the job waits in the queue (the next attempt)

    @property
    def done(self) -> bool:
        return self.state not in ACTIVE

    def step(self, name: str) -> Step | None:
        """The latest step named ``name`` (steps are named after components)."""
        found = [s for s in self.steps if s.name == name]
        return found[-1] if found else None

    def to_dict(self) -> dict:
        return {**asdict(self), "done": self.done}


WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}


def restart_count(job_id: str) -> int | None:
    """Slurm's restart count of a job the controller knows (the attempt it will run next when it
    waits after a requeue); None when squeue cannot say."""
    r = tools.call(["squeue", f"--jobs={job_id}", "-h", "-O", "RestartCnt"], check=False)
    counts = [int(w) for w in r.stdout.split() if w.isdigit()] if r.returncode == 0 else []
    return max(counts) if counts else None


def squeue(job_id: str) -> list[dict]:
    r = tools.call(["squeue", f"--jobs={job_id}", "-h", "-o", "%i|%T|%r|%M|%N"], check=False)
    if r.returncode != 0:
        if "Invalid job id" in r.stderr:
            return []  # gone from the controller's memory
        raise UserError(None, tools.first_error("squeue", r))
    rows = []
    for line in r.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 5:
            rows.append(dict(zip(("id", "state", "reason", "elapsed", "nodes"), parts)))
    return rows


class Watch:
    """Snapshots of one job: sacct (through the watcher) merged with squeue."""

    def __init__(self, job_id: str):
        self.job_id = str(job_id)
        self.watcher = HetInfoWatcher(delay_s=5)

    def snapshot(self) -> Snapshot:
        return assemble(self.job_id, squeue(self.job_id), self.watcher.get_info(self.job_id, mode="force"))

    def settled(self, snap: Snapshot) -> bool:
        """Ended, and sacct agrees (so exit codes are final)."""
        if not snap.done:
            return False
        info = self.watcher.get_info(self.job_id, mode="cache")
        return bool(info) and info["State"] not in ACTIVE

    def follow(self, timeout_s: float | None = None, poll_s: float = 1.0) -> Iterator[Snapshot]:
        """A snapshot every ``poll_s`` until the job has ended and sacct agrees (at most ``SETTLE_S``
        after the controller says it ended), or until ``timeout_s``. The last one yielded is final."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        ended_at = None
        while True:
            snap = self.snapshot()
            yield snap
            if snap.done:
                ended_at = ended_at or time.monotonic()
                if self.settled(snap) or time.monotonic() - ended_at > SETTLE_S:
                    return
            if deadline is not None and time.monotonic() > deadline:
                return
            time.sleep(poll_s)


def snapshots(job_ids: list[str]) -> dict[str, Snapshot]:
    """Snapshots of many jobs (a sweep's) from one squeue and one sacct call."""
    ids = [str(j) for j in job_ids]
    if not ids:
        return {}
    queue: dict[str, list[dict]] = {}
    for q in (r for folded in squeue(",".join(ids)) for r in array_rows(folded, "id")):
        m = _ID.match(q["id"])
        if m:
            queue.setdefault(m["job"], []).append(q)
    watcher = HetInfoWatcher(delay_s=5)
    for j in ids:
        watcher.register_job(j)
    watcher.update()
    return {j: assemble(j, queue.get(j, []), watcher.get_info(j, mode="cache")) for j in ids}


def assemble(job_id: str, queue: list[dict], info: dict) -> Snapshot:
    """One job's squeue rows and sacct info (``HetInfoWatcher.get_info``) merged: squeue wins while the
    controller knows the job."""
    parts: dict[int, Part] = {}
    for row in info.get("components", []):
        parts[row["group"]] = Part(
            id=row["JobID"], group=row["group"], state=norm_state(row["State"]), nodes=row.get("NodeList", ""),
            elapsed=row.get("Elapsed", ""), exit_code=row.get("ExitCode", ""),
            # sacct keeps the last pending reason (``BeginTime``) after the job ran: a reason
            # is only current while the part waits
            reason=row.get("Reason", "") if norm_state(row["State"]) in WAITING and
            row.get("Reason") not in ("None", None) else "",
        )
    for q in queue:
        m = _ID.match(q["id"])
        g = int(m["het"]) if m and m["het"] is not None else 0
        p = parts.setdefault(g, Part(id=q["id"], group=g, state=""))
        p.id, p.state, p.elapsed = q["id"], norm_state(q["state"]), clock(q["elapsed"])
        # sacct's NodeList is the whole allocation; squeue's %N shrinks while a job completes
        if not p.nodes or p.nodes == "None assigned":
            p.nodes = q["nodes"]
        p.reason = "" if q["reason"] in ("None", "") or p.state not in WAITING else q["reason"]
    ordered = [parts[g] for g in sorted(parts)]
    steps = [
        Step(id=s["JobID"], name=s["JobName"], group=s["group"], state=norm_state(s["State"]),
             exit_code=s.get("ExitCode", ""), elapsed=s.get("Elapsed", ""), nodes=s.get("NodeList", ""))
        for s in info.get("steps", [])
    ]
    state = overall([p.state for p in ordered]) if ordered else "UNKNOWN"
    restarts = restart_count(job_id) if queue and state in WAITING else None
    return Snapshot(job_id, state, ordered, steps, in_queue=bool(queue), in_accounting=bool(info),
                    restarts=restarts)
