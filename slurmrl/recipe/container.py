"""[container]: the Pyxis container every step runs in."""

from __future__ import annotations

from pydantic import Field, field_validator

from slurmrl.recipe.fields import ENV_NAME_RE
from slurmrl.settings.section import PathText, Section


class Container(Section):
    """Pyxis container for every step. The run dir is mounted automatically."""

    image: PathText = Field(description="Image for `--container-image` (squashfs path or registry#image).")
    mounts: list[str] = Field(default_factory=list, description="`SRC:DST[:FLAGS]` for `--container-mounts`.")
    workdir: PathText | None = Field(None, description="`--container-workdir`.")
    env: list[str] = Field(default_factory=list, description="Names of host variables to pass (`--container-env`).")
    remap_root: bool | None = Field(None, description="`--container-remap-root` / `--no-container-remap-root`.")
    mount_home: bool | None = Field(None, description="`--container-mount-home` / `--no-container-mount-home`.")
    writable: bool | None = Field(None, description="`--container-writable` (true) or `--container-readonly`.")
    entrypoint: bool | None = Field(None, description="`--container-entrypoint` / `--no-container-entrypoint`.")
    name: str | None = Field(None, description="`--container-name`, to reuse the unpacked image between steps.")
    cache: PathText | None = Field(
        None, description="Shared folder of squashfs images: the job imports a registry `image` there once "
        "(`enroot import` under a lock; a concurrent job waits for it) and every step uses the .sqsh.",
    )

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            parts = m.split(":")
            if len(parts) not in (2, 3) or not all(parts[:2]) or "," in m:
                raise ValueError(f"{m!r} is not SRC:DST or SRC:DST:FLAGS (no commas)")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: list[str]) -> list[str]:
        for name in v:
            if not ENV_NAME_RE.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return v
