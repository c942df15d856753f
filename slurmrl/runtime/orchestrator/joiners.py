"""Servers of other jobs that join this RL job's live set (`slurmrl submit RECIPE --join RUN_DIR`).

Each joiner server writes ``RUN_DIR/joined/<jobid>.<task>.json`` once it is ready (``slurmrl.rundir.joined``).
``Joiners.poll`` runs with the members' monitor (every ``members.PROBE_S``): a file not taken yet whose server
answers ``/health`` is handed to ``Members.join``; the next step's ``readmit`` loads the current weights into
it and admits it (event ``joined``), exactly as a server that came back. When it stops answering, its job
ended or was preempted: it has ``left`` (an event, not a fault) and its file is not taken again (a joiner job
that Slurm requeues writes it again, with a later ``since``, and joins again). A file whose
server does not answer (an old joiner's, or one still starting) is looked at again at the next poll.
"""

from __future__ import annotations

from pathlib import Path

from slurmrl.rundir.joined import read_all
from slurmrl.runtime.orchestrator.members import Members, probe


class Joiners:
    def __init__(self, members: Members, run_dir: Path | str):
        self.members, self.run_dir = members, Path(run_dir)
        self.taken: set[tuple[str, int, float]] = set()  # (job, task, since) handed over (one that left stays out)

    def poll(self) -> list[str]:
        """Hand every new, answering joined server to the live set; their URLs."""
        new = []
        for j in read_all(self.run_dir):
            key = (j.job_id, j.task, j.since)  # a requeued joiner registers again, since later
            if key in self.taken or probe(j.url, self.members.probe_s):
                continue
            self.taken.add(key)
            if self.members.join(j.url, j.task, j.job_id):
                new.append(j.url)
        return new


def attach(members: Members, run_dir: Path | str) -> Joiners:
    """Joiners of ``run_dir``, polled by ``members``' monitor."""
    joiners = Joiners(members, run_dir)
    members.polls.append(joiners.poll)
    return joiners
