"""The quoting property tests' harness (tests/test_quoting_property.py): write a recipe, render it, read
its #SBATCH lines the way sbatch reads them, run a stubbed copy of the batch script, and run its
task functions (``tests/support/task_expand.py``) to see what each task really execs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

from hypothesis import assume
from task_expand import RECORDER, Expanded, expand, inline_functions

from slurmrl.app.build import build
from slurmrl.errors import UserError

# What a stage exports for the next one; the values do not matter here.
URLS = {"URLS_INFERENCE": "http://h:1", "URLS_ROUTER": "http://h:2", "URLS_PREFILL": "http://h:3",
        "URLS_DECODE": "http://h:4"}


def toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_str(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def toml_dumps(d: dict) -> str:
    return "".join(f"{toml_str(k)} = {toml_value(v)}\n" for k, v in d.items())


def base_recipe() -> dict:
    """RL colocated on one 2-GPU node: trainer, orchestrator and one vLLM server in one script."""
    return {
        "name": "q",
        "kind": "rl",
        "slurm": {"gpus_per_node": 2, "cpus_per_node": 8},
        "placement": {"colocate": True},
        "model": {"path": "m"},
        "inference": {"gpus_per_node": 1},
        "trainer": {"micro_batch_size": 1},
        "orchestrator": {"prompts_per_step": 2, "rollouts_per_prompt": 2},
    }


def render_or_skip(recipe: dict, tmp: Path, run_dir: Path | None = None):
    path = tmp / "recipe.toml"
    path.write_text(toml_dumps(recipe), encoding="utf-8")
    assert tomllib.loads(path.read_text(encoding="utf-8")) == recipe  # the test's own writer is right
    try:
        out = build(path, run_dir=run_dir or tmp / "run")
    except UserError:
        assume(False)
    out.run_dir.mkdir(parents=True)  # the script makes the job's secret there
    return out


def tasks(out, *names: str, env: dict | None = None) -> dict[str, Expanded]:
    """What task 0 of each named component execs."""
    return {n: expand(out.script, out.plan, n, env={**URLS, **(env or {})}) for n in names}


def header(script: str) -> list[str]:
    """Lines before the first command; sbatch and bash must both see only comments here."""
    lines = script.split("\n")
    end = lines.index("set -euo pipefail")
    return lines[:end]


def assert_header_is_comments(script: str) -> None:
    for line in header(script):
        assert line == "" or line.startswith("#"), f"user text escaped the comment block: {line!r}"


def sbatch_argument(line: str) -> tuple[str | None, int]:
    """Slurm's src/sbatch/opt.c get_argument(): one argument of a #SBATCH line and how far it read."""
    i, n, out, quoted, q, escape = 0, len(line), [], False, "", False
    while i < n and line[i].isspace():
        i += 1
    if i == n:
        return None, i
    while i < n and (quoted or not line[i].isspace()) and line[i] != "\n":
        ch = line[i]
        if escape:
            escape = False
        elif ch == "\\":
            escape = True
            i += 1
            continue
        elif quoted:
            if ch == q:
                quoted = False
                i += 1
                continue
        elif ch in "\"'":
            quoted, q = True, ch
            i += 1
            continue
        elif ch == "#":
            break
        out.append(ch)
        i += 1
    if quoted:
        raise AssertionError(f"sbatch: unmatched {q} in {line!r}")
    return ("".join(out) if out else None), i


def sbatch_options(script: str) -> list[list[str]]:
    """The options sbatch reads, per het group (src/sbatch/opt.c _opt_batch_script)."""
    groups: list[list[str]] = [[]]
    for line in script.split("\n")[1:]:
        if not line.startswith("#SBATCH"):
            if line.strip() and not line.lstrip().startswith("#"):
                break  # sbatch stops at the first command
            continue
        rest = line[len("#SBATCH"):]
        if rest.strip() == "hetjob":
            groups.append([])
            continue
        while True:
            arg, used = sbatch_argument(rest)
            if arg is None:
                break
            groups[-1].append(arg)
            rest = rest[used:]
            if not rest or rest.lstrip().startswith("#"):
                break
    return groups


# The batch shell's helpers that would wait on real steps; each becomes a stub (the script's own
# definition is renamed away). `launch` must be there: it is where every srun line goes.
STUBS = {
    "launch": 'launch() { [[ $1 != --orchestrated ]] || shift; local n=$1; shift; printf "%s\\0" "$@" >"$SLURMRL_TEST_OUT/launch.$n"; }',
    "wait_ready": "wait_ready() { :; }",
    "ready_urls": "ready_urls() { echo http://host-a:1; }",
    "supervise": 'supervise() { env -0 >"$SLURMRL_TEST_OUT/env"; }',
    # ports and the node check need real steps on the nodes (tests/test_port_claims.py, test_node_faults.py)
    "pick_port_base": 'pick_port_base() { PORT_BASE=$1; export PORT_BASE SLURMRL_PORT_BASE="$1"; }',
    "start_nodes": "start_nodes() { :; }",
}


def run_stubbed(script: str, tmp: Path) -> dict:
    """Run the batch script with srun/scontrol/module/source and the waiting helpers replaced by
    recorders. Returns what they saw: ``launch.<component>`` (the srun argv) and ``env`` (what the
    batch shell exports to every step)."""
    out = tmp / "out"
    out.mkdir()
    bindir = tmp / "bin"
    bindir.mkdir()
    for tool in ("mkdir", "rm", "env", "od", "tr"):  # the prologue makes folders and the job's secret
        os.symlink(shutil.which(tool), bindir / tool)
    stubs = (
        "#!/bin/bash\n"
        'scontrol() { echo node-a; }\n'
        'hostname() { echo host-a; }\n'
        'srun() { return 0; }  # the port claim steps: every node grants the first block\n'
        'source() { printf "%s\\0" "$@" >>"$SLURMRL_TEST_OUT/source"; }\n'
        'module() { printf "%s\\0" "$@" >>"$SLURMRL_TEST_OUT/module"; }\n'
    )
    body = inline_functions(script)
    assert "\nlaunch() {" in body
    for fn, stub in STUBS.items():
        if f"\n{fn}() {{" in body:
            body = body.replace(f"\n{fn}() {{", f"\n_script_{fn}() {{", 1)
            stubs += stub + "\n"
    (tmp / "stubbed.sh").write_text(stubs + body, encoding="utf-8")
    env = {"PATH": str(bindir), "HOME": str(tmp), "SLURM_JOB_ID": "4321", "SLURM_JOB_NODELIST": "node-a",
           "SLURMRL_TEST_OUT": str(out), "LC_ALL": "C.UTF-8"}
    p = subprocess.run([shutil.which("bash"), str(tmp / "stubbed.sh")], cwd=tmp, env=env, capture_output=True,
                       timeout=30)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    seen: dict = {}
    for f in out.iterdir():
        items = f.read_bytes().decode("utf-8").split("\0")[:-1]
        if f.name == "env":
            seen["env"] = dict(item.split("=", 1) for item in items)
        else:
            seen[f.name] = items
    return seen


def bash_n(script: str, tmp: Path) -> None:
    (tmp / "job.sbatch").write_text(script, encoding="utf-8")
    p = subprocess.run(["bash", "-n", str(tmp / "job.sbatch")], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr


def recorder(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(RECORDER)
    path.chmod(0o755)
