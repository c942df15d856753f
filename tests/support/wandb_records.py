"""Read W&B's offline run files (``RUN_DIR/wandb/offline-run-*/run-<id>.wandb``) back in tests: the run
record each holds (project, entity, group, name, tags, job type) and the history keys logged.

The file is W&B's LevelDB-style log: a 7-byte header (``:W&B``, a version), then 32 KiB blocks of
chunks, each with a 7-byte header (CRC32, length, type: 1 full, 2 first, 3 middle, 4 last) and a
piece of one protobuf ``Record`` (``wandb.proto.wandb_internal_pb2``)."""

from __future__ import annotations

import struct
from pathlib import Path

BLOCK = 32768


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, piece, out = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            break
        piece += data[pos:pos + length]
        pos += length
        if kind in (1, 4):
            out.append(pb.Record.FromString(piece))
            piece = b""
    return out


def runs(run_dir: Path) -> dict[str, dict]:
    """Run id -> what its offline file says: project, entity, group, name, tags, job_type, history keys."""
    found: dict[str, dict] = {}
    for path in sorted(Path(run_dir, "wandb").glob("offline-run-*/run-*.wandb")):
        for rec in records(path):
            what = rec.WhichOneof("record_type")
            if what == "run":
                r = rec.run
                info = found.setdefault(r.run_id, {"history": set()})
                info.update(project=r.project, entity=r.entity, group=r.run_group, name=r.display_name,
                            tags=list(r.tags), job_type=r.job_type)
            elif what == "history":
                rid = path.stem.removeprefix("run-")
                found.setdefault(rid, {"history": set()})["history"] |= {i.key or "/".join(i.nested_key)
                                                                        for i in rec.history.item}
    return found
