"""Mooncake store services from the ``mooncake-transfer-engine`` package.

- ``mode = "master"``: ``mooncake_master`` on the head inference node, with its HTTP metadata
  server and metrics port from the port table; ready when its RPC port accepts connections.
- ``mode = "client"``: one ``mooncake_client`` per inference node, contributing ``cpu_gb`` of
  host memory (and a disk folder) to the store; ready when its service port accepts.

The client binary links the CUDA driver (``libcuda.so.1``): it runs on GPU nodes only.

    python -m slurmrl.runtime.mooncake --config RUN_DIR/components/mooncake-master.toml
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from slurmrl.runtime import component as rt
from slurmrl.runtime import supervised


def binary(name: str) -> str:
    try:
        import mooncake  # the package ships its binaries inside
    except ImportError:
        raise SystemExit("slurmrl: mooncake: pip install mooncake-transfer-engine") from None
    return str(Path(mooncake.__file__).parent / name)


def master_argv(comp: rt.Component) -> tuple[list[str], int]:
    p = {k: rt.port(v) for k, v in comp.instance["ports"].items()}
    argv = [
        binary("mooncake_master"), f"-rpc_port={p['rpc']}", "-enable_http_metadata_server=true",
        f"-http_metadata_server_port={p['metadata']}", f"-metrics_port={p['admin']}",
    ]
    return argv, p["rpc"]


def client_argv(comp: rt.Component) -> tuple[list[str], int]:
    s = comp.settings
    master_host, master_port = rt.endpoint(s["master"])
    meta_host, meta_port = rt.endpoint(s["metadata"])
    port = rt.port(comp.instance["ports"]["client"])
    argv = [
        binary("mooncake_client"),
        f"--master_server_address={master_host}:{master_port}",
        f"--metadata_server=http://{meta_host}:{meta_port}/metadata",
        f"--global_segment_size={s['cpu_gb']:g} GB",
        f"--protocol={s['protocol']}",
        f"--local_hostname={socket.gethostname()}",
        f"--port={port}",
    ]
    if s.get("device"):
        argv.append(f"--device_names={s['device']}")
    if s.get("disk_path"):
        argv.append("--enable_offload=true")
    return argv, port


def cuda_runtime_libs() -> list[str]:
    """The CUDA runtime from the nvidia-cuda-runtime-cu12 wheel, when installed."""
    try:
        import nvidia.cuda_runtime as cr
    except ImportError:
        return []
    return [str(Path(p) / "lib") for p in cr.__path__]


def main() -> int:
    args = rt.config_arg(__doc__.splitlines()[0])
    comp = rt.load(args.config)
    mode = comp.settings["mode"]
    argv, port = master_argv(comp) if mode == "master" else client_argv(comp)
    extra = {}
    libs = cuda_runtime_libs()
    if libs:
        extra["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, os.environ.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
    if mode == "client" and comp.settings.get("disk_path"):
        extra["MOONCAKE_OFFLOAD_STORAGE_ROOT_DIR"] = comp.settings["disk_path"]
    env = supervised.child_env(comp, extra)
    return supervised.run(comp, argv, env, lambda: supervised.tcp_ok("127.0.0.1", port), f"mooncake_{mode}")


if __name__ == "__main__":
    supervised.exit_with(main())
