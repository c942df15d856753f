"""Ready means serving: which component's readiness includes one real completion.

After every component is placed, each front of the job gets ``--ready-completion MODEL`` on its
supervisor (``slurmrl.runtime.steps.ready_check``): vllm-router with ``--ready-workers N`` (the URLs it
was given: each must be registered), Dynamo's frontend (its workers are counted by
``--ready-instances``), and every vLLM server that no router fronts (the judge's, or a job's one
server). A server behind the router is ready on /health: the router's completion reaches it.
A pooling server (``--runner pooling``, a reward model) has no completions and keeps /health.
"""

from __future__ import annotations

from slurmrl.plan import vllm
from slurmrl.plan.model import Arg, Sh
from slurmrl.plan.servers import server_names

# The router's worker count, from the arrays its task function reads the servers' URLs into.
ROUTER_WORKERS = {
    "pd": Sh(sh="$((${#prefill[@]} + ${#decode[@]}))"),
    "other": Sh(sh="${#workers[@]}"),
}


def _after(argv: tuple, flag: str) -> Arg | None:
    for i, a in enumerate(argv[:-1]):
        if a == flag:
            return argv[i + 1]
    return None


def _runs(command: tuple, program: tuple) -> bool:
    n = len(program)
    return any(tuple(command[i:i + n]) == program for i in range(len(command) - n + 1))


def _add(c: dict, *flags: Arg) -> None:
    """Put ``flags`` before the supervisor's ``--``."""
    t = c["task"]
    sup = t.supervisor
    c["task"] = t.model_copy(update={"supervisor": (*sup[:-1], *flags, sup[-1])})


def apply(b) -> None:
    if b.preflight:
        return  # the probe stands in for every component
    inf = b.r.inference
    routers = [c for c in b.comps if c["role"] == "router"]
    fronted = set(server_names(b)) if routers and inf is not None else set()
    for c in b.comps:
        sup = c["task"].supervisor
        if not sup or "--ready" not in sup or sup[-1] != "--" or "--ready-completion" in sup:
            continue
        if c["role"] == "router":
            _add(c, "--ready-workers", ROUTER_WORKERS["pd" if inf.mode == "pd" else "other"],
                 "--ready-completion", b.r.model.served_model_name)
        elif "--ready-model" in sup:  # Dynamo's frontend
            _add(c, "--ready-completion", _after(sup, "--ready-model"))
        elif c["name"] not in fronted and (_runs(c["task"].command, vllm.ENTRY) or _runs(c["task"].command, vllm.SERVE)):
            if _after(c["task"].command, "--runner") == "pooling":
                continue
            model = _after(c["task"].command, "--served-model-name") or b.r.model.served_model_name
            _add(c, "--ready-completion", model)
