"""Step wrappers: what runs around (or in place of) a task's command inside a job step. Standard
library and psutil only: the supervisor and the probe start without pydantic, torch or vLLM."""
