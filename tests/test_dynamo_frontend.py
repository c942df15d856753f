"""Dynamo's frontend options ([inference.dynamo]): each rendered into the frontend's real command
line only when it differs from Dynamo's default, read back by Dynamo's own parser
(``dynamo.frontend.main.parse_args`` in .venv-dynamo, ai-dynamo 1.4) into the config field it
names, and refused in one line where the frontend would not read it."""

from __future__ import annotations

import json
import subprocess

import pytest
from dynamo_plans import base, dynamo_python, engine_argv, render, tasks

from slurmrl.errors import UserError
from slurmrl.plan.engines.dynamo.frontend import OPTIONS
from slurmrl.recipe.dynamo import Dynamo

# the FrontendConfig attribute Dynamo parses each option into (the others are named alike)
CONFIG_KEY = {"kv_overlap_score_credit": "overlap_score_credit", "kv_events": "use_kv_events",
              "track_active_blocks": "router_track_active_blocks", "assume_kv_reuse": "router_assume_kv_reuse",
              "track_output_blocks": "router_track_output_blocks", "queue_threshold": "router_queue_threshold",
              "queue_policy": "router_queue_policy"}

CONFIG = r"""
import contextlib, io, json, sys
from dynamo.frontend.main import parse_args
out = []
for argv in json.load(sys.stdin):
    sys.argv = ["dynamo.frontend", *argv]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            config = parse_args()[0]
        out.append({"ok": True, "config": {k: v for k, v in vars(config).items()
                                           if isinstance(v, (str, int, float, bool, type(None)))}})
    except (SystemExit, ValueError) as e:
        out.append({"ok": False, "error": repr(e) + err.getvalue()[-1500:]})
print(json.dumps(out))
"""


def configs(argvs: list[list[str]]) -> list[dict]:
    """Each argv through Dynamo's frontend parser (and its config's validate), in one process."""
    r = subprocess.run([dynamo_python(), "-c", CONFIG], input=json.dumps(argvs), capture_output=True, text=True,
                       timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def frontend_argv(tmp_path, **dynamo) -> list[str]:
    out = render(tmp_path, base(dynamo=dynamo))
    module, argv = engine_argv(tasks(out, "frontend")[0][1])
    assert module == "dynamo.frontend"
    return argv


KV = {"router_mode": "kv", "kv_cache_block_size": 32, "router_temperature": 0.5, "kv_overlap_score_credit": 0.25,
      "prefill_load_scale": 2.0, "kv_events": False, "router_ttl_secs": 30.0, "track_active_blocks": True,
      "track_output_blocks": True, "assume_kv_reuse": False, "queue_threshold": 0.75, "queue_policy": "wspt"}
ANY = {"router_mode": "least-loaded", "chat_processor": "sglang", "migration_limit": 3,
       "session_affinity_ttl_secs": 600, "active_decode_blocks_threshold": 0.85,
       "active_prefill_tokens_threshold": 4096, "active_prefill_tokens_threshold_frac": 1.5}


@pytest.mark.parametrize("options", [KV, ANY], ids=["kv", "any-mode"])
def test_options_reach_dynamos_config_as_set(tmp_path, options):
    argv = frontend_argv(tmp_path, **options)
    # only what differs from Dynamo's default is on the line (track_active_blocks = true is its default)
    assert "--router-track-active-blocks" not in argv and "--no-router-track-active-blocks" not in argv
    [result] = configs([argv])
    assert result["ok"], (argv, result)
    for name, value in options.items():
        assert result["config"][CONFIG_KEY.get(name, name)] == value, (name, argv)


def test_defaults_render_no_option_and_are_dynamos(tmp_path):
    argv = frontend_argv(tmp_path)
    assert argv[:2] == ["--http-host", "0.0.0.0"] and argv[4:] == ["--request-plane", "tcp", "--event-plane", "zmq"]
    [result] = configs([["--router-mode", "kv"]])  # kv: the KV router's options are parsed too
    assert result["ok"], result
    for name in OPTIONS:
        default = Dynamo.model_fields[name].default
        theirs = result["config"][CONFIG_KEY.get(name, name)]
        assert theirs == ("kv" if name == "router_mode" else default), name


def test_every_option_renders_a_flag_dynamo_takes(tmp_path):
    """Each option alone, away from its default: one flag (and value), parsed into its own field."""
    changed = {"router_mode": "power-of-two", "chat_processor": "sglang", "migration_limit": 1,
               "session_affinity_ttl_secs": 1, "active_decode_blocks_threshold": 0.5,
               "active_prefill_tokens_threshold": 1, "active_prefill_tokens_threshold_frac": 0.5,
               "kv_cache_block_size": 64, "router_temperature": 1.0, "kv_overlap_score_credit": 2.0,
               "prefill_load_scale": 0.5, "kv_events": False, "router_ttl_secs": 5.0, "track_active_blocks": False,
               "assume_kv_reuse": False, "track_output_blocks": True, "queue_threshold": 0.0, "queue_policy": "wspt"}
    assert set(changed) == set(OPTIONS)
    needs = {"router_ttl_secs": {"kv_events": False}, "assume_kv_reuse": {"track_active_blocks": True},
             "queue_policy": {"queue_threshold": 0.5}}
    argvs, cases = [], []
    for i, (name, value) in enumerate(changed.items()):
        d = tmp_path / str(i)
        d.mkdir()
        kv = {"router_mode": "kv"} if OPTIONS[name].kv else {}
        given = {**kv, **needs.get(name, {}), name: value}
        argvs.append(frontend_argv(d, **given))
        cases.append((name, value))
    for (name, value), argv, result in zip(cases, argvs, configs(argvs)):
        assert result["ok"], (name, argv, result)
        assert result["config"][CONFIG_KEY.get(name, name)] == value, (name, argv)
        assert OPTIONS[name].flag in argv


@pytest.mark.parametrize("dynamo,field,words", [
    ({"router_temperature": 0.5}, "inference.dynamo.router_temperature", "KV router only"),
    ({"router_mode": "round-robin", "kv_events": True}, "inference.dynamo.kv_events", "it is 'round-robin'"),
    ({"kv_cache_block_size": 16}, "inference.dynamo.kv_cache_block_size", "router_mode = \"kv\""),
    ({"router_mode": "kv", "router_ttl_secs": 10}, "inference.dynamo.router_ttl_secs", "kv_events = false"),
    ({"router_mode": "kv", "track_active_blocks": False, "assume_kv_reuse": False},
     "inference.dynamo.assume_kv_reuse", "track_active_blocks = true"),
    ({"router_mode": "kv", "queue_policy": "wspt"}, "inference.dynamo.queue_policy", "queue_threshold"),
    ({"frontend_args": ["--router-temperature", "0.5"]}, "inference.dynamo.frontend_args[0]",
     "is inference.dynamo.router_temperature"),
    ({"frontend_args": ["--kv-overlap-score-weight=2"]}, "inference.dynamo.frontend_args[0]",
     "is inference.dynamo.prefill_load_scale"),
    ({"frontend_args": ["--trust-remote-code", "--no-kv-events"]}, "inference.dynamo.frontend_args[1]",
     "is inference.dynamo.kv_events"),
    ({"frontend_args": ["--router-mod", "kv"]}, "inference.dynamo.frontend_args[0]", "router_mode"),
    ({"frontend_args": ["--http-port", "9"]}, "inference.dynamo.frontend_args[0]", "the port table"),
    ({"frontend_args": ["--load-aware"]}, "inference.dynamo.frontend_args[0]", "kv_overlap_score_credit = 0"),
    ({"env": {"DYN_ROUTER_MODE": "kv"}}, "inference.dynamo.env.DYN_ROUTER_MODE",
     "Dynamo reads it as inference.dynamo.router_mode"),
    ({"migration_limit": -1}, "inference.dynamo.migration_limit", ""),
    ({"active_decode_blocks_threshold": 1.5}, "inference.dynamo.active_decode_blocks_threshold", ""),
    ({"router_mode": "direct"}, "inference.dynamo.router_mode", ""),
])
def test_refused_in_one_line_naming_the_field(tmp_path, dynamo, field, words):
    with pytest.raises(UserError) as e:
        render(tmp_path, base(dynamo=dynamo))
    assert e.value.field == field and words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_frontend_args_of_other_flags_still_pass(tmp_path):
    argv = frontend_argv(tmp_path, frontend_args=["--router-event-threads", "8", "--migration-max-seq-len", "9"])
    [result] = configs([argv])
    assert result["ok"] and result["config"]["router_event_threads"] == 8, result
