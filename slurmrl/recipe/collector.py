"""[collector]: a light step on the head node that keeps every server's, router's, frontend's,
trainer's and orchestrator's Prometheus ``/metrics`` in RUN_DIR/metrics/scrape/ while the job runs."""

from __future__ import annotations

from pydantic import Field

from slurmrl.settings.section import Section


class Collector(Section):
    """Scrapes `/metrics` of the job's components at an interval into `RUN_DIR/metrics/scrape/` (only values
    that changed, compact JSON lines), and the head node's GPUs where `nvidia-smi` exists; `slurmrl report`
    draws them. docs/slurm.md: "After the job"."""

    interval: int = Field(10, ge=1, le=3600, description="Seconds between two scrapes of every endpoint (1-3600).")
    max_mb: int = Field(
        512, ge=1, le=1_000_000,
        description="Megabytes the scraped files may take in all (1-1000000); at the cap the collector stops "
        "writing and says so in its log and in the files.",
    )
    critical: bool = Field(
        False, description="`false` (the default): when the collector exits the job logs it (a phase) and goes "
        "on; `true`: its exit fails the job like any component's.",
    )
