"""What runs inside job steps, grouped by kind (each reads its own settings; none parses the recipe):

- ``steps/``: the wrappers around a task's command: ``supervise`` (ready checks, ready files,
  signals, heartbeat), ``guard`` (ends the process tree), ``ready_check``, ``probe`` (preflight),
  ``stage`` (model staging), ``provenance``, ``container`` and ``fabric`` (what a step sees).
- ``gates/``: the job secret in front of HTTP: ``auth_gate`` (router port), ``job_auth``
  (vLLM's ``--middleware``), ``router_key`` (vllm-router's API key).
- ``vllm/``: ``client`` (the one client for vLLM's HTTP routes), ``admin`` (its command line),
  ``cli`` (vLLM's own CLI in process).
- programs: ``trainer/``, ``orchestrator/``, ``bench/`` (``python -m slurmrl.runtime.<program>``).
- ``fixtures/``: model folders for the demo and the tests (tiny model, SmolLM2).
- ``step_files`` (the run dir's step-numbered files) and ``metrics``: shared by trainer and orchestrator.

Imports: settings/, the run-dir layout, envs, ports, secret, heartbeat, errors; never recipe/,
plan/, render/, slurm/ or the CLI. Heavy imports (torch, vllm) happen inside the modules that need
them, never at package import.
"""
