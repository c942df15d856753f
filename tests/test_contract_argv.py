"""Command lines that cross from the planner to a program, defined once (``slurmrl.contract.argv``,
``slurmrl.contract.programs``): each dataclass reads back what it writes, and the words the planner
renders for every gallery recipe, expanded by real bash (tests/support/task_expand.py), are read by the
program's own parser."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from task_expand import expand

from slurmrl.app.build import build
from slurmrl.contract.argv import AuthGate, Guard, Stage, Supervise
from slurmrl.contract.programs import BenchArgs, CollectorArgs, OrchestratorArgs, TrainerArgs, WeightServers
from slurmrl.runtime.bench import runner
from slurmrl.runtime.orchestrator import loop
from slurmrl.runtime.steps import guard, supervise

GALLERY = Path(__file__).resolve().parent.parent / "slurmrl" / "recipes"

word = st.from_regex(r"[A-Za-z0-9_.:/@${}\[\]][A-Za-z0-9_.:/@${}\[\] -]{0,15}", fullmatch=True)  # no leading -
any_word = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=10)
words = st.lists(word, min_size=1, max_size=3).map(tuple)
command = st.lists(any_word, min_size=1, max_size=4).map(tuple)
small = st.integers(1, 10**6)
maybe = st.none() | word

supervises = st.builds(Supervise, name=word, gpus=maybe, ready=maybe, heartbeat=st.integers(0, 10**5),
                       cuda_runtime=st.booleans(), ready_model=maybe, ready_instances=st.none() | small,
                       ready_workers=st.none() | small, ready_completion=maybe,
                       fail_on=st.lists(word, max_size=2).map(tuple), command=command)
guards = st.builds(Guard, command=command, ended=maybe, serves=st.booleans(), fail_on=st.lists(word, max_size=2).map(tuple))
gates = st.builds(AuthGate, listen=word, upstream=small, command=command)
stages = st.builds(Stage, src=word, stage_dir=word, key=word)
trainers = st.one_of(
    st.builds(TrainerArgs, config=word),
    st.builds(TrainerArgs, config=word, weight_servers=st.lists(st.builds(WeightServers, ranks=small, urls=words),
                                                            min_size=1, max_size=3).map(tuple),
              weight_master=st.tuples(word.filter(lambda w: ":" not in w), small).map(lambda t: f"{t[0]}:{t[1]}"),
              weight_world_size=small),
)
orchestrators = st.builds(OrchestratorArgs, config=word, requests_url=words.map(lambda ws: tuple(w.rstrip("/") or "u" for w in ws)),
                          admin_urls=words.map(lambda ws: tuple(w.rstrip("/") or "u" for w in ws)),
                          judge_urls=st.lists(word, max_size=2).map(tuple))
targets = st.tuples(st.from_regex(r"[a-z]{1,6}", fullmatch=True), word).map(lambda t: f"{t[0]}=http://{t[1]}")
collectors = st.builds(CollectorArgs, interval=st.integers(1, 3600).map(float), max_mb=small,
                       ready=st.lists(word, max_size=3).map(tuple), targets=st.lists(targets, max_size=2).map(tuple))
lens = st.lists(small, min_size=1, max_size=3).map(tuple)
benches = st.builds(BenchArgs, out=word, concurrencies=lens, input_lens=lens, output_lens=lens, timeout=small,
                    then=st.sampled_from(("stop", "serve")), vllm_args=command)


@settings(max_examples=60, deadline=None)
@given(st.one_of(supervises, gates, stages, trainers, orchestrators, collectors, benches))
def test_each_command_line_reads_back_what_it_writes(value):
    assert type(value).parse(value.to_argv()) == value


@settings(max_examples=60, deadline=None)
@given(guards)
def test_the_guards_command_line_reads_back(value):
    assert Guard.parse(value.to_argv()) == value


def test_bad_command_lines_are_usage_errors(capsys):
    for cls, argv in ((Supervise, ["x"]), (Supervise, ["x", "--"]), (TrainerArgs, ["--config", "c", "--weight-servers", "u"]),
                      (TrainerArgs, ["--config", "c", "--weight-master", "nohost"]), (BenchArgs, ["--out", "o"]),
                      (CollectorArgs, ["--target", "x"]), (AuthGate, ["--listen", "h:1", "--upstream", "2", "--"])):
        with pytest.raises(SystemExit) as e:
            cls.parse(argv)
        assert e.value.code == 2, (cls, argv)
    assert "--weight-servers u: give the workers per server" in capsys.readouterr().err
    assert Guard.parse(["--bogus", "--", "x"]) is None and Guard.parse(["x"]) is None


# ---- the planner's words into the programs' parsers, for every gallery recipe -----------------
GALLERY_SETS = {"inference-debug": ["collector.interval=5", "benchmark.concurrencies=[1, 2]"]}
OURS = {TrainerArgs.MODULE: TrainerArgs, OrchestratorArgs.MODULE: OrchestratorArgs, CollectorArgs.MODULE: CollectorArgs,
        BenchArgs.MODULE: BenchArgs, AuthGate.MODULE: AuthGate}


def read_program(argv: list[str]) -> tuple[str, object] | None:
    """The slurmrl program ``argv`` runs (after ``-m``), read by its parser; None for another program."""
    for i, w in enumerate(argv[:-1]):
        if w == "-m" and argv[i + 1] in OURS:
            return argv[i + 1], OURS[argv[i + 1]].parse(argv[i + 2:])
    return None


@pytest.mark.parametrize("recipe", sorted(p.stem for p in GALLERY.glob("*.toml")))
def test_the_planners_words_are_read_by_the_programs(recipe, tmp_path):
    sets = list(GALLERY_SETS.get(recipe, []))
    if "\nvenv = " in (GALLERY / f"{recipe}.toml").read_text():  # the batch shell sources VENV/bin/activate
        (tmp_path / "venv" / "bin").mkdir(parents=True)
        (tmp_path / "venv" / "bin" / "activate").write_text("")
        sets.append(f'python.venv="{tmp_path / "venv"}"')
    (tmp_path / "run").mkdir()
    out = build(GALLERY / f"{recipe}.toml", sets, run_dir=str(tmp_path / "run"))
    urls = {f"URLS_{c.name.upper()}": " ".join(f"http://h{i}:{8000 + k}" for k, inst in enumerate(c.instances)
                                               if "http" in inst.ports)
            for i, c in enumerate(out.plan.components) if c.name.isidentifier()}
    seen = set()
    for c in out.plan.components:
        e = expand(out.script, out.plan, c.name, env=urls)
        sup = e.supervisor
        k = sup.index("-m")
        assert sup[k + 1] == Supervise.MODULE
        s = supervise.parse([*sup[k + 2:], "--", *e.command])  # the runtime's parser, which is the contract's
        assert s.name == c.name and list(s.command) == e.command
        found = read_program(e.command)
        if found is None:
            continue
        module, value = found
        seen.add(module)
        if isinstance(value, OrchestratorArgs):  # the orchestrator's own parser reads the same words the same way
            args = loop.arguments(e.command[e.command.index(module) + 1:])
            assert (tuple(args.requests_url), tuple(args.admin_urls), tuple(args.judge_urls)) == \
                   (value.requests_url, value.admin_urls, value.judge_urls)
            assert value.admin_urls == tuple(u for c2 in out.plan.components if c2.role == "inference"
                                             for u in urls.get(f"URLS_{c2.name.upper()}", "").split())
        if isinstance(value, TrainerArgs) and value.weight_servers:
            assert value.weight_world_size == 1 + sum(g.ranks * len(g.urls) for g in value.weight_servers)
            assert value.master[1] > 0
        if isinstance(value, AuthGate):
            assert {"vllm-router", "slurmrl.runtime.gates.router_key"} & set(value.command)
        if isinstance(value, BenchArgs):
            args, vllm_args = runner.parse(e.command[e.command.index(module) + 1:])
            assert args == value and ("--url" if value.aiperf is not None else "--base-url") in vllm_args
    expected = {"rl": {TrainerArgs.MODULE, OrchestratorArgs.MODULE}, "sft": {TrainerArgs.MODULE}}
    want = {m for k, mods in expected.items() if recipe.startswith(k) for m in mods}
    want |= {CollectorArgs.MODULE, BenchArgs.MODULE} if recipe in GALLERY_SETS else set()
    assert want <= seen, (recipe, seen)


def test_the_guard_reads_what_the_supervisor_writes():
    g = Guard(("python3", "-c", "pass"), "/r/ended", True, ("boom",))
    parsed = guard.parse(g.to_argv())
    assert parsed is not None and parsed[0] == g and len(parsed[1]) == 1
