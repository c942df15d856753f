"""Property tests: whatever a user writes reaches bash, sbatch and the programs each task execs verbatim.

(a) ``shq`` round-trips any string through bash.
(b) Recipes whose free-text fields are full of shell syntax render into scripts that pass
    ``bash -n`` (the harness: tests/support/quoting_harness.py), and the ``#SBATCH`` lines, read the way sbatch reads them, carry the exact values.
    End to end, two ways: running a stubbed copy of the batch script (srun/scontrol replaced by
    recorders, PATH limited to a few harmless binaries) shows what every ``srun`` line gets
    (container flags, log paths) and what the batch shell exports; running each component's task
    function (``tests/support/task_expand.py``: the script's own prologue, then the function, with the
    exec'd programs replaced by a recorder) shows the argv and environment each task really
    execs, byte for byte: model path, extra args, env values, router args, interpreter, venv.
    A field may reject a character it cannot carry (the recipe then fails with a UserError:
    ``assume``), but it may never render it wrongly.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path, PurePosixPath
from unittest import mock

import pytest
from hypothesis import HealthCheck, Phase, assume, example, given, settings
from hypothesis import strategies as st
from quoting_harness import (
    URLS,
    assert_header_is_comments,
    base_recipe,
    bash_n,
    recorder,
    render_or_skip,
    run_stubbed,
    sbatch_options,
    tasks,
)
from task_expand import JOB_ID, expand

from slurmrl import ports
from slurmrl.plan.model import Sh
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
leaf = nonempty.map(lambda s: s.replace("/", "_")).filter(lambda s: s not in (".", ".."))  # one file name
rel_path = st.lists(leaf, min_size=1, max_size=2).map("/".join)  # a relative path the test can create


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


# ---- (b) the properties ------------------------------------------------------------------------


@pytest.mark.slow  # over ~7 s on two cores: the full suite runs it, the fast tier does not
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
        assert seen["env"]["USER_VALUE"] == glob  # the batch shell exports it to every step
        assert seen["env"]["OTHER"] == "plain"
        run = tasks(out, "trainer", "orchestrator", "inference")
        own = {"trainer": ("T_VALUE", trainer), "orchestrator": ("O_VALUE", orch), "inference": ("I_VALUE", inf)}
        for name, e in run.items():
            assert e.env["USER_VALUE"] == glob, name
            assert e.env["OTHER"] == "plain", name
            key, value = own[name]
            assert e.env[key] == value, name
            # a component's env is its own
            assert not ({k for k, _ in own.values()} - {key}) & set(e.env), name


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
        for name in ("trainer", "inference", "orchestrator"):
            argv = seen[f"launch.{name}"]
            assert argv[0] == "srun", argv
            start = argv.index(expected[0])
            assert argv[start:start + 4] == expected, name
            # the step runs the component's task function inside the container
            assert argv[-3:] == ["bash", "-c", f"task_{name}"], argv
        # Pyxis splits the mount list on ',' and each mount on ':'
        mounts = expected[1].removeprefix("--container-mounts=").split(",")
        assert [m.split(":") for m in mounts] == [[run_dir, run_dir], [src, dst]]


@pytest.mark.slow  # over ~7 s on two cores: the full suite runs it, the fast tier does not
@SETTINGS
@given(venv=rel_path, venv_abs=st.booleans(), module=nonempty, exe=leaf, exe_dir=st.none() | rel_path,
       exe_abs=st.booleans())
@example(venv="v env/$(id)", venv_abs=True, module="cuda/12 `id`", exe="-python 3'", exe_dir=None, exe_abs=False)
@example(venv="v env/$(id)", venv_abs=False, module="m", exe="py 3'", exe_dir="bin $x/`id`", exe_abs=True)
@example(venv="-v", venv_abs=False, module="m", exe="python", exe_dir="-d", exe_abs=False)
def test_python_fields_reach_the_shell_verbatim(venv, venv_abs, module, exe, exe_dir, exe_abs):
    """venv, modules and the interpreter reach what each task runs: the venv is really sourced, the
    module really loaded, and the interpreter (a name on PATH, or a path, absolute or relative to
    where the job starts) really exec'd, with torchrun taken from beside it."""
    assume(exe != "--")  # the task recorder splits the supervisor from the command at the first "--"
    if exe_dir is None:
        assume(shutil.which(exe) is None and exe != "module")  # a new name: it shadows nothing the script runs
    else:  # the test makes venv/bin/activate and exe_dir/{exe,torchrun}: no file where a folder must be
        files = {f"{venv}/bin/activate", f"{exe_dir}/{exe}", f"{exe_dir}/torchrun"}
        folders = {str(parent) for f in files for parent in PurePosixPath(f).parents}
        assume(not files & folders)
    check_python_fields(venv, venv_abs, module, exe, exe_dir, exe_abs)


def test_a_python_executable_starting_with_a_dash_is_exec_d():
    """`exec '-python' ...` is bash's exec reading an option; a task function must end exec's options."""
    check_python_fields(venv="v", venv_abs=True, module="m", exe="-python", exe_dir=None, exe_abs=False)


def test_a_relative_venv_starting_with_a_dash_is_sourced():
    """`source '-v/bin/activate'` is bash's source reading an option; the script must end its options."""
    check_python_fields(venv="-v", venv_abs=False, module="m", exe="python", exe_dir="d", exe_abs=False)


def check_python_fields(venv: str, venv_abs: bool, module: str, exe: str, exe_dir: str | None, exe_abs: bool):
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cwd = tmp / "cwd"  # where the job starts: relative paths are relative to it
        (cwd / venv / "bin").mkdir(parents=True)
        (cwd / venv / "bin" / "activate").write_text('export SLURMRL_TEST_ACTIVATED="${BASH_SOURCE[0]}"\n')
        venv_path = f"{cwd}/{venv}" if venv_abs else venv
        bindir = tmp / "bin"
        (bindir / "module").parent.mkdir()
        (bindir / "module").write_text(f"#!/bin/bash\nprintf '%s\\0' \"$@\" >{shq(str(tmp / 'module.argv'))}\n")
        (bindir / "module").chmod(0o755)
        if exe_dir is None:
            exe_path = exe
            recorder(bindir / exe)
        else:
            exe_path = f"{cwd}/{exe_dir}/{exe}" if exe_abs else f"{exe_dir}/{exe}"
            recorder(cwd / exe_dir / exe)
            recorder(cwd / exe_dir / "torchrun")
        r = base_recipe()
        r["python"] = {"venv": venv_path, "modules": [module], "executable": exe_path}
        out = render_or_skip(r, tmp)
        bash_n(out.script, tmp)
        assert_header_is_comments(out.script)
        with mock.patch.dict(os.environ, {"PATH": f"{bindir}:{os.environ['PATH']}"}), contextlib.chdir(cwd):
            run = tasks(out, "trainer", "orchestrator")
        assert (tmp / "module.argv").read_bytes().decode().split("\0")[:-1] == ["load", module]
        run_dir = str(out.run_dir)
        t, o = run["trainer"], run["orchestrator"]
        for e in (t, o):
            assert e.env["SLURMRL_TEST_ACTIVATED"] == f"{venv_path}/bin/activate"
            assert e.argv[0] == exe  # the interpreter exec'd (expand keeps its file name)
        assert t.supervisor[1:4] == ["-m", "slurmrl.runtime.steps.supervise", "trainer"]
        torchrun = str(PurePosixPath(exe_path).parent / "torchrun") if "/" in exe_path else "torchrun"
        assert t.command[0] == torchrun
        rdzv = ports.base_for_job(JOB_ID) + ports.offset("torch_rdzv")
        assert f"--rdzv-endpoint=g0n0:{rdzv}" in t.command
        assert t.command[-2:] == ["--config", f"{run_dir}/components/trainer.toml"]
        assert o.command[:5] == [exe_path, "-m", "slurmrl.runtime.orchestrator", "--config",
                                 f"{run_dir}/components/orchestrator.toml"]


# Slurm's names (account, qos, partition, ...) are one token; slurmrl refuses others (test_slurm_spellings.py)
slurm_name = st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,15}\Z")


@SETTINGS
@given(comment=nonempty, job_name=nonempty, account=slurm_name, qos=slurm_name, mail=nonempty)
@example(comment="it's #1", job_name="a b", account="a_b", qos="x.y", mail="me@x")
@example(comment="line1\nrm -rf ~", job_name="j", account="a", qos="q", mail="m")
def test_directive_values_reach_sbatch_verbatim(comment, job_name, account, qos, mail):
    r = base_recipe()
    r["slurm"].update(comment=comment, job_name=job_name, account=account, qos=qos, mail_user=mail, mail_type="END")
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


@pytest.mark.slow  # over ~7 s on two cores: the full suite runs it, the fast tier does not
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
        s = seen["launch.trainer"]
        assert f"--output={run_dir}/logs/attempt-0/trainer.%t.log" in s
        mounts = next(a for a in s if a.startswith("--container-mounts="))
        assert [m.split(":") for m in mounts.removeprefix("--container-mounts=").split(",")] == [[run_dir, run_dir]]
        run = tasks(out, "trainer", "orchestrator")
        assert run["trainer"].command[-1] == f"{run_dir}/components/trainer.toml"
        assert run["orchestrator"].after("--config") == f"{run_dir}/components/orchestrator.toml"
        for e in run.values():
            assert e.env["RUN_DIR"] == e.env["SLURMRL_RUN_DIR"] == run_dir
            assert e.env["SLURMRL_SECRET_FILE"] == f"{run_dir}/secret"
        secret = Path(run_dir) / "secret"
        assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_text()) == 64


@pytest.mark.slow  # over ~7 s on two cores: the full suite runs it, the fast tier does not
@SETTINGS
@given(path=nonempty, served=nonempty, extra=st.lists(nasty, min_size=1, max_size=3), router_arg=nonempty)
@example(path="org/model \"v2\"", served="a'b", extra=["--x", "$(id)"], router_arg="--log-level=debug")
@example(path="a\x7fb", served="s", extra=["--x"], router_arg="x")
def test_model_and_vllm_args_reach_the_engines(path, served, extra, router_arg):
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
        assert parsed["components/trainer.toml"]["model"] == path
        orch = parsed["components/orchestrator.toml"]
        assert orch["model"] == path and orch["served_model_name"] == served
        run = tasks(out, "inference", "router")
        inf = run["inference"]
        assert inf.after("--model") == path
        assert inf.after("--served-model-name") == served
        assert inf.command[-len(extra):] == extra
        assert run["router"].command[-1] == router_arg


@pytest.mark.slow  # over ~7 s on two cores: the full suite runs it, the fast tier does not
@SETTINGS
@given(prefill_arg=nasty, decode_value=nasty, model=nonempty)
@example(prefill_arg="--x='$(id)'", decode_value="a\nb `id`", model="-m")
def test_pd_role_args_and_env_reach_their_servers(prefill_arg, decode_value, model):
    r = {
        "name": "q", "kind": "inference", "slurm": {"gpus_per_node": 2, "cpus_per_node": 8}, "model": {"path": model},
        "inference": {"mode": "pd", "prefill": {"replicas": 1, "extra_args": [prefill_arg]},
                      "decode": {"replicas": 1, "env": {"D_VALUE": decode_value}}},
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        out = render_or_skip(r, tmp)
        bash_n(out.script, tmp)
        run = tasks(out, "prefill", "decode")
        pre, dec = run["prefill"], run["decode"]
        assert pre.command == dec.command + [prefill_arg]  # one command line; the role's extras at its end
        assert dec.env["D_VALUE"] == decode_value and "D_VALUE" not in pre.env
        for e in (pre, dec):
            assert e.after("--model") == model
            assert json.loads(e.after("--kv-transfer-config"))["kv_connector"] == "NixlConnector"


@SETTINGS
@given(disk=nonempty, device=nonempty)
@example(disk='/nvme/"kv" $(id)', device="mlx5_0,mlx5_1 `id`")
@example(disk="@sh0@", device="x")
def test_kv_offload_paths_reach_json_args_and_env(disk, device):
    """User text inside a JSON argument that also holds run-time pieces stays one word, verbatim."""
    for kind in ("cpu_disk", "mooncake"):
        r = {
            "name": "q", "kind": "inference", "slurm": {"gpus_per_node": 2, "cpus_per_node": 8},
            "model": {"path": "m"},
            "inference": {"tp": 1, "kv_offload": {"kind": kind, "cpu_gb": 4, "disk_path": disk}},
        }
        # each kind takes only its own fields (the others are refused: no silent knobs)
        r["inference"]["kv_offload"].update({"disk_gb": 8} if kind == "cpu_disk" else {"mooncake_device": device})
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            out = render_or_skip(r, tmp)
            bash_n(out.script, tmp)
            e = tasks(out, "inference")["inference"]
            cfg = json.loads(e.after("--kv-transfer-config"))
            if kind == "cpu_disk":
                assert cfg["kv_connector_extra_config"]["disk_path"] == disk
            else:
                assert cfg["kv_connector"] == "MooncakeStoreConnector"
                assert e.env["MOONCAKE_DEVICE"] == device
                client = expand(out.script, out.plan, "mooncake-client", env=URLS)
                assert f"--device_names={device}" in client.command
                assert client.env["MOONCAKE_OFFLOAD_STORAGE_ROOT_DIR"] == disk
