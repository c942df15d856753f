"""The [collector]: ``python -m slurmrl.runtime.collector`` scrapes the job's Prometheus ``/metrics``
endpoints at an interval into RUN_DIR/metrics/scrape/ (``loop``), and the node's GPUs (``gpus``)."""
