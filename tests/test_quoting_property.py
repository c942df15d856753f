"""Property tests: whatever a user writes reaches bash, sbatch and the runtime verbatim.

(a) ``shq`` round-trips any string through bash.
(b) Recipes whose free-text fields are full of shell syntax render into scripts that pass
    ``bash -n``; running a stubbed copy of the script (srun/scontrol replaced by recorders,
    PATH limited to two harmless binaries) shows every value arriving byte for byte, and the
    ``#SBATCH`` lines, read the way sbatch reads them, carry the exact values. A field may
    reject a character it cannot carry (the recipe then fails with a UserError: ``assume``),
    but it may never render it wrongly.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

from hypothesis import HealthCheck, Phase, assume, example, given, settings
from hypothesis import strategies as st

from slurmrl.errors import UserError
from slurmrl.plan.model import Sh
from slurmrl.render import build
from slurmrl.render.quoting import shq

# No shrinking: every example runs bash, and shrinking a failure would take minutes. Known hard
# cases are pinned with @example so a failure still reads well.
SETTINGS = settings(max_examples=40, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

PIECES = ["'", '"', "$(", ")", "`", ";", "\n", " ", "  ", "*", "~", "!", "\\", "$", "${", "}", "#", "-", "--",
          "-n", "-e", "&", "|", "<", ">", "\t", "\r", "é", "日本", "💥", "%", "%s", "?", "[", "]", "=", "\x7f",
          "$HOME", "$(id)", "`id`", "'\"'", "\\'", "\u2028"]
CHARS = st.characters(exclude_characters="\x00", exclude_categories=("Cs",))
nasty = st.lists(st.one_of(st.sampled_from(PIECES), st.text(CHARS, max_size=4)), max_size=8).map("".join)
nonempty = nasty.filter(lambda s: s != "")
no_colon = nonempty.map(lambda s: s.replace(":", "_"))  # ':' separates SRC:DST:FLAGS; it cannot be in a path


def bash_printf(values_sh: list[str], prelude: str = "") -> list[str]:
    script = prelude + "\nprintf '%s\\0' " + " ".join(values_sh) + "\n"
    p = subprocess.run(["bash", "-c", script], capture_output=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return p.stdout.decode("utf-8").split("\0")[:-1]


# ---- (a) the quoting filter itself -------------------------------------------------------------


@SETTINGS
@given(st.lists(nasty, min_size=1, max_size=20))
def test_shq_round_trips_through_bash(values):
    assert bash_printf([shq(v) for v in values]) == values


@SETTINGS
@given(nasty, nasty)
def test_sh_expression_expands_once_and_never_splits(value, suffix):
    assume("\n" not in suffix)
    tail = re.sub(r'["`\\$]', "_", suffix)  # planner text never holds quotes; keep the literal tail inert
    out = bash_printf([shq(Sh(sh="--x=${V}/" + tail))], prelude=f"V={shq(value)}")
    assert out == [f"--x={value}/{tail}"]


def test_sh_expression_refuses_quotes():
    for bad in ('a"b', "a`b", "a\\b", "a\nb"):
        try:
            shq(Sh(sh=bad))
        except ValueError:
            continue
        raise AssertionError(f"shq accepted {bad!r}")


# ---- (b) helpers: write a recipe, render it, run a stubbed copy ---------------------------------


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
        return build(path, run_dir=run_dir or tmp / "run")
    except UserError:
        assume(False)


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


def run_stubbed(script: str, tmp: Path) -> dict:
    """Run the script with srun/scontrol/module/source replaced by recorders. Returns what they saw."""
    out = tmp / "out"
    out.mkdir()
    bindir = tmp / "bin"
    bindir.mkdir()
    for tool in ("mkdir", "rm", "env"):
        os.symlink(shutil.which(tool), bindir / tool)
    stubs = (
        "#!/bin/bash\n"
        'scontrol() { echo node-a; }\n'
        'hostname() { echo host-a; }\n'
        'source() { printf "%s\\0" "$@" >>"$SLURMRL_TEST_OUT/source"; }\n'
        'module() { printf "%s\\0" "$@" >>"$SLURMRL_TEST_OUT/module"; }\n'
        'launch() { local n=$1; shift; printf "%s\\0" "$@" >"$SLURMRL_TEST_OUT/launch.$n"; }\n'
        'wait_ready() { :; }\n'
        'supervise() { env -0 >"$SLURMRL_TEST_OUT/env"; }\n'
    )
    body = script
    for fn in ("launch", "wait_ready", "supervise"):
        assert f"\n{fn}() {{" in body
        body = body.replace(f"\n{fn}() {{", f"\n_script_{fn}() {{", 1)
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


def env_after(argv: list[str]) -> list[str]:
    """The NAME=VALUE words between `env` and the command."""
    i = argv.index("env")
    out = []
    for a in argv[i + 1:]:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", a):
            break
        out.append(a)
    return out


# ---- (b) the properties ------------------------------------------------------------------------


@SETTINGS
@given(glob=nasty, trainer=nasty, orch=nasty, inf=nasty)
@example(glob="it's $(id) `id` ${HOME}\n*", trainer="-n", orch="a\\'b\"c", inf="\x7f ~ !")
def test_env_values_reach_every_step_verbatim(glob, trainer, orch, inf):
    r = base_recipe()
    r["env"] = {"USER_VALUE": glob, "OTHER": "plain"}
    r["trainer"]["env"] = {"T_VALUE": trainer}
    r["orchestrator"]["env"] = {"O_VALUE": orch}
    r["inference"]["env"] = {"I_VALUE": inf}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        out = render_or_skip(r, tmp)
        script = out.script
        assert_header_is_comments(script)
        bash_n(script, tmp)
        seen = run_stubbed(script, tmp)
        assert seen["env"]["USER_VALUE"] == glob
        assert seen["env"]["OTHER"] == "plain"
        assert f"T_VALUE={trainer}" in env_after(seen["launch.trainer"])
        assert f"O_VALUE={orch}" in env_after(seen["launch.orchestrator"])
        assert f"I_VALUE={inf}" in env_after(seen["launch.inference"])


@SETTINGS
@given(image=nonempty, src=no_colon, dst=no_colon, workdir=nonempty, cname=nonempty)
@example(image="nvcr.io#nvidia/pytorch:25.01-py3", src="/my data", dst="/d $x", workdir="/w'x", cname="a;b")
def test_container_flags_reach_srun_verbatim(image, src, dst, workdir, cname):
    r = base_recipe()
    r["container"] = {"image": image, "mounts": [f"{src}:{dst}"], "workdir": workdir, "name": cname}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        out = render_or_skip(r, tmp)
        run_dir = str(out.run_dir)
        bash_n(out.script, tmp)
        assert_header_is_comments(out.script)
        seen = run_stubbed(out.script, tmp)
        expected = [f"--container-image={image}", f"--container-mounts={run_dir}:{run_dir},{src}:{dst}",
                    f"--container-workdir={workdir}", f"--container-name={cname}"]
        for name in ("launch.trainer", "launch.inference", "launch.orchestrator"):
            argv = seen[name]
            start = argv.index(expected[0])
            assert argv[start:start + 4] == expected, name
        # Pyxis splits the mount list on ',' and each mount on ':'
        mounts = expected[1].removeprefix("--container-mounts=").split(",")
        assert [m.split(":") for m in mounts] == [[run_dir, run_dir], [src, dst]]


@SETTINGS
@given(venv=nonempty, module=nonempty, exe=nonempty)
@example(venv="/v env/$(id)", module="cuda/12 `id`", exe="-python 3'")
def test_python_fields_reach_the_shell_verbatim(venv, module, exe):
    r = base_recipe()
    r["python"] = {"venv": venv, "modules": [module], "executable": exe}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        out = render_or_skip(r, tmp)
        bash_n(out.script, tmp)
        assert_header_is_comments(out.script)
        seen = run_stubbed(out.script, tmp)
        assert seen["source"] == [f"{venv}/bin/activate"]
        assert seen["module"] == ["load", module]
        run_dir = str(out.run_dir)
        t = seen["launch.trainer"]
        i = t.index(exe)
        assert t[i:i + 3] == [exe, "-m", "torch.distributed.run"]
        assert f"--rdzv-endpoint=node-a:{10000 + (4321 % 272) * 80 + 6}" in t
        assert t[-2:] == ["--config", f"{run_dir}/components/trainer.toml"]
        o = seen["launch.orchestrator"]
        assert o[-5:] == [exe, "-m", "slurmrl.runtime.orchestrator", "--config",
                          f"{run_dir}/components/orchestrator.toml"]


@SETTINGS
@given(comment=nonempty, job_name=nonempty, account=nonempty, qos=nonempty, mail=nonempty)
@example(comment="it's #1", job_name="a b", account="a\\b", qos='x"y', mail="me@x")
@example(comment="line1\nrm -rf ~", job_name="j", account="a", qos="q", mail="m")
def test_directive_values_reach_sbatch_verbatim(comment, job_name, account, qos, mail):
    r = base_recipe()
    r["slurm"].update(comment=comment, job_name=job_name, account=account, qos=qos, mail_user=mail)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        out = render_or_skip(r, tmp)
        assert_header_is_comments(out.script)  # checked before anything runs
        bash_n(out.script, tmp)
        opts = sbatch_options(out.script)
        assert len(opts) == len(out.plan.groups)
        for want in (f"--comment={comment}", f"--job-name={job_name}", f"--account={account}", f"--qos={qos}",
                     f"--mail-user={mail}", "--requeue", f"--time={r['slurm'].get('time', '01:00:00')}"):
            assert want in opts[0], (want, opts[0])


@SETTINGS
@given(leaf=nonempty)
@example(leaf="'s")
@example(leaf=",x:y")
@example(leaf="\necho hi")
def test_run_dir_with_odd_characters(leaf):
    r = base_recipe()
    r["container"] = {"image": "img"}
    leaf = "r" + leaf.replace("/", "_")
    assume(leaf not in (".", ".."))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        out = render_or_skip(r, tmp, run_dir=tmp / leaf)
        run_dir = str(out.run_dir)
        assert run_dir == str(tmp / leaf)
        assert_header_is_comments(out.script)
        bash_n(out.script, tmp)
        opts = sbatch_options(out.script)
        assert f"--output={run_dir}/logs/batch-%j.out" in opts[0], opts[0]
        seen = run_stubbed(out.script, tmp)
        assert seen["env"]["SLURMRL_RUN_DIR"] == run_dir
        t = seen["launch.trainer"]
        assert t[-1] == f"{run_dir}/components/trainer.toml"
        assert f"--output={run_dir}/logs/attempt-0/trainer.%t.log" in t
        mounts = next(a for a in t if a.startswith("--container-mounts="))
        assert [m.split(":") for m in mounts.removeprefix("--container-mounts=").split(",")] == [[run_dir, run_dir]]


@SETTINGS
@given(path=nonempty, served=nonempty, extra=st.lists(nasty, min_size=1, max_size=3), router_arg=nonempty)
@example(path="org/model \"v2\"", served="a'b", extra=["--x", "$(id)"], router_arg="--log-level=debug")
@example(path="a\x7fb", served="s", extra=["--x"], router_arg="x")
def test_model_and_vllm_args_survive_the_toml_files(path, served, extra, router_arg):
    r = base_recipe()
    r["model"] = {"path": path, "served_name": served}
    r["inference"]["extra_args"] = extra
    r["inference"]["router"] = {"enabled": True, "extra_args": [router_arg]}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        out = render_or_skip(r, tmp)
        parsed = {}
        for rel, text in out.files.items():
            if rel.endswith(".toml"):
                parsed[rel] = tomllib.loads(text)  # the runtime reads them with tomllib
        resolved = parsed["recipe.toml"]
        assert resolved["model"]["path"] == path
        assert resolved == out.recipe.model_dump(mode="json", exclude_none=True)
        inf = parsed["components/inference.toml"]
        args = inf["instances"][0]["args"]
        assert args[args.index("--model") + 1] == path
        assert args[args.index("--served-model-name") + 1] == served
        assert args[-len(extra):] == extra
        assert inf["settings"]["served_model_name"] == served
        assert parsed["components/trainer.toml"]["settings"]["model"] == path
        assert parsed["components/router.toml"]["settings"]["extra_args"] == [router_arg]
        orch = parsed["components/orchestrator.toml"]["settings"]
        assert orch["model"] == path and orch["served_model_name"] == served
