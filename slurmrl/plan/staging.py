"""Start-up cost paid once: the container image imported once into a shared cache, the model's
weights copied once per node.

``container.cache``: the batch shell runs ``enroot import`` of a registry image into
``CACHE/<image as a file name>.sqsh`` under ``flock`` on the shared folder (a concurrent job waits
for that import instead of doing its own), and every step's ``--container-image`` is that file.

Every job with a container first checks, in one short step in that container with the job's Python,
that slurmrl is there and is the one that rendered the script (``slurmrl_check``).

``model.stage = "node-local"``: before the servers start, one task per node of each het group
that runs a server reading ``model.path`` copies it to ``STAGE_DIR/<node name>/<key>``
(``slurmrl.runtime.steps.stage``: a lock, sha256 checked, a hit when the copy matches), and those
servers' ``--model`` is that copy. The served model name stays ``model.path``'s.
"""

from __future__ import annotations

import hashlib
import posixpath
import re

from slurmrl.contract.argv import Stage
from slurmrl.errors import UserError
from slurmrl.plan.model import Cat, ImageImport, Sh, SlurmrlCheck, StageStep
from slurmrl.plan.rules import changed
from slurmrl.plan.spec import Spec
from slurmrl.recipe.recipe import Recipe
from slurmrl.rundir.paths import RunDir

NODE = Sh(sh="${SLURMD_NODENAME}")  # set by slurmd in every task: the node's name


def _is_file_image(image: str) -> bool:
    return image.startswith(("/", "./")) or image.endswith(".sqsh")


def check(r: Recipe) -> None:
    c = r.container
    if c is not None and c.cache is not None:
        if not c.cache.startswith("/"):
            raise UserError("container.cache", f"{c.cache!r} is not an absolute path; give a folder on a filesystem "
                            "every node mounts")
        if _is_file_image(c.image):
            raise UserError("container.cache", f"container.image {c.image!r} is a squashfs file already; the cache "
                            "imports registry images (remove cache, or name the image as REGISTRY#IMAGE:TAG)")
    judge = getattr(r, "judge", None)
    if judge is not None:
        for name in ("stage", "stage_dir"):
            if changed(judge.model, name):
                raise UserError(f"judge.model.{name}", "staging copies [model] only; the judge's servers read "
                                "judge.model.path where it is")
    m = r.model
    if m.stage == "shared":
        if changed(m, "stage_dir"):
            raise UserError("model.stage_dir", "only applies with model.stage = 'node-local'")
        return
    if not m.path.startswith("/"):
        raise UserError("model.stage", f"'node-local' copies a directory, and model.path {m.path!r} is not an absolute "
                        "path (a Hugging Face id: download it to a shared folder first)")
    if not m.stage_dir.startswith("/"):
        raise UserError("model.stage_dir", f"{m.stage_dir!r} is not an absolute path")


def image_import(r: Recipe) -> ImageImport | None:
    c = r.container
    if c is None or c.cache is None:
        return None
    name = re.sub(r"[^A-Za-z0-9._-]+", "+", c.image).strip("+.") or "image"
    return ImageImport(image=c.image, sqsh=posixpath.join(c.cache, f"{name}.sqsh"))


def container_image(r: Recipe) -> str:
    """What every step's --container-image names: the cached squashfs, or the image as given."""
    imp = image_import(r)
    assert r.container is not None, "asked only for a recipe with [container] (planner.container_flags)"
    return imp.sqsh if imp else r.container.image


def slurmrl_check(r: Recipe, groups: list, python: tuple[str, ...]) -> SlurmrlCheck | None:
    """[container]: one task on the first node of het group 0 runs the run dir's slurmrl-check.py with
    the job's Python in the job's container, against the run dir's lock.toml."""
    if r.container is None:
        return None
    srun: list = ["--het-group=0"] if len(groups) > 1 else []
    srun += ["--job-name=slurmrl-check", "--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--overlap"]
    if groups[0].gpus_per_node:
        srun.append("--gpus-per-node=0")
    srun.append(Sh(sh=f"--output=${{LOG_DIR}}/{RunDir.SLURMRL_CHECK_LOG}"))
    prepare = ("mkdir", "-p", r.model.stage_dir) if r.model.stage == "node-local" else ()  # a mount's source must exist
    return SlurmrlCheck(srun=tuple(srun), log=RunDir.SLURMRL_CHECK_LOG, prepare=prepare,
                        command=(*python, Sh(sh=f"${{RUN_DIR}}/{RunDir.SLURMRL_CHECK}"),
                                 Sh(sh=f"${{RUN_DIR}}/{RunDir.LOCK}"), container_image(r)))


def extra_mounts(r: Recipe) -> list[str]:
    """The node-local model copies must be visible inside the container."""
    m = r.model
    return [f"{m.stage_dir}:{m.stage_dir}"] if m.stage == "node-local" else []


def copy_key(r: Recipe) -> str:
    """The copy's folder name: the last part of model.path and 8 hex digits of its hash."""
    m = r.model
    base = posixpath.basename(m.path.rstrip("/")) or "model"
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', base)}-{hashlib.sha256(m.path.encode()).hexdigest()[:8]}"


def local_copy(r: Recipe) -> Cat:
    """STAGE_DIR/<node name>/<key>, expanded in each task: per node name, so a stage_dir that is
    shared after all still gives each node its own copy and lock."""
    return Cat(parts=(r.model.stage_dir.rstrip("/") + "/", NODE, f"/{copy_key(r)}"))


def steps(r: Recipe, specs: list[Spec], groups: list, python: tuple[str, ...], preflight: bool) -> tuple[StageStep, ...]:
    """The copy steps: one task per node of each het group where a component reads model.path
    (``Spec.reads_model``; its ``--model`` already names ``local_copy``). ``groups``: the planner's
    groups (``.gpus_per_node``)."""
    if r.model.stage != "node-local":
        return ()
    spans: dict[int, tuple[int, int]] = {}  # het group -> (first node, end) of the servers reading the model
    for c in specs:
        if not c.reads_model:
            continue
        lo, hi = spans.get(c.group, (c.first_node, c.first_node + c.nodes))
        spans[c.group] = (min(lo, c.first_node), max(hi, c.first_node + c.nodes))
    if not spans:
        raise UserError("model.stage", "no vLLM server of this job reads model.path (kind sft, or Dynamo's workers); "
                        "use 'shared'")
    if preflight:
        return ()  # the probe stands in for every component: nothing to copy
    out = []
    for group, (first, end) in sorted(spans.items()):
        nodes = end - first
        srun: list = [f"--het-group={group}"] if len(groups) > 1 else []
        srun += ["--job-name=stage-model", f"--nodes={nodes}", f"--relative={first}", f"--ntasks={nodes}",
                 "--ntasks-per-node=1", "--cpus-per-task=1", "--overlap"]
        if groups[group].gpus_per_node:
            srun.append("--gpus-per-node=0")
        srun.append(Sh(sh=f"--output=${{LOG_DIR}}/stage-model.g{group}.%t.log"))
        prepare = ("mkdir", "-p", r.model.stage_dir) if r.container is not None else ()  # a mount's source must exist
        out.append(StageStep(group=group, srun=tuple(srun), prepare=prepare,
                             command=(*python, "-m", Stage.MODULE,
                                      *Stage[str](r.model.path, r.model.stage_dir.rstrip("/"), copy_key(r)).to_argv())))
    return tuple(out)
