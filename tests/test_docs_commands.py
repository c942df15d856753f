"""The command lines in README.md and docs/*.md that need no cluster run as written.

Code blocks: every line that runs `slurmrl init|validate|plan|render|templates` is run, in order,
in a scratch folder (with `recipes/` linked), as a user pasting them would; a `$ command` line
followed by output must print that output. Inline code: every `slurmrl <command> ARGS` of those
commands parses (a missing recipe would exit 2: `slurmrl plan --json`)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slurmrl import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LOCAL = ("init", "validate", "plan", "render", "templates")


def code_lines(doc: Path) -> list[tuple[str, list[str]]]:
    """(command, documented output lines) for each local slurmrl command in the doc's code blocks."""
    out, block, inside = [], [], False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            if inside:
                i = 0
                while i < len(block):
                    text = block[i]
                    prompt = text.startswith("$ ")
                    cmd = text[2:] if prompt else text
                    words = cmd.split()
                    if len(words) > 1 and words[0] == "slurmrl" and words[1] in LOCAL:
                        shown = []
                        while prompt and i + 1 < len(block) and block[i + 1] and not block[i + 1].startswith("$ "):
                            i += 1
                            shown.append(block[i])
                        out.append((cmd, shown))
                    i += 1
            block, inside = [], not inside
        elif inside:
            block.append(line)
    return out


def inline_commands(doc: Path) -> list[str]:
    spans = re.findall(r"`(slurmrl [^`]+)`", doc.read_text())
    return [s for s in spans if len(s.split()) > 2 and s.split()[1] in LOCAL and "[" not in s and "..." not in s]


CODE = [(doc.name, cmd, shown) for doc in DOCS for cmd, shown in code_lines(doc)]
INLINE = sorted({(doc.name, s) for doc in DOCS for s in inline_commands(doc)})


def test_found_the_quickstart():
    assert any(cmd.startswith("slurmrl init rl-multinode > my.toml") for _, cmd, _ in CODE)
    assert any("--json" in s for _, s in INLINE) and any("--salloc" in s for _, s in INLINE)


@pytest.mark.parametrize("doc", sorted({d for d, _, _ in CODE}))
def test_code_blocks_run_as_written(doc, tmp_path):
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    for _, cmd, shown in [c for c in CODE if c[0] == doc]:
        p = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
        if shown:
            assert (p.stdout + p.stderr).splitlines()[: len(shown)] == shown, (cmd, p.stdout, p.stderr)
        else:
            assert p.returncode == 0, (cmd, p.stderr)
        said = re.search(r"# writes (runs/[^ ]+/)", cmd)
        if said:
            assert (tmp_path / said.group(1)).is_dir() and p.stdout.strip() == str(tmp_path / said.group(1))


def test_readme_plan_output_is_what_plan_prints():
    text = (ROOT / "README.md").read_text()
    intro = "What `plan` prints for `recipes/rl-1node.toml`"
    block = text[text.index(intro):].split("```")[1].strip("\n").splitlines()
    p = subprocess.run([sys.executable, "-m", "slurmrl", "plan", str(ROOT / "recipes" / "rl-1node.toml")],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    printed = p.stdout.splitlines()
    assert p.returncode == 0 and block
    missing = [line for line in block if line not in printed]
    assert not missing, missing


@pytest.mark.parametrize("doc,span", INLINE, ids=[f"{d}:{s}" for d, s in INLINE])
def test_inline_commands_parse(doc, span, tmp_path):
    words = shlex.split(span)[1:]
    words = [{"my.toml": "recipes/rl-1node.toml", "RECIPE": "recipes/rl-1node.toml"}.get(w, w) for w in words]
    try:
        cli._parser().parse_args(words)
    except SystemExit as e:
        assert e.code == 0, f"{doc}: `{span}` does not run as written"
