"""How an environment is realised for its cells: a venv, the host's Python, a docker or podman
image, or an Apptainer image (sif). For each environment: what a cell waits for, the container
Snakemake runs it in, and the command that starts its Python; and how rules image and sif make
the images (:class:`Images`).

Everything here is worked out from the filled config and this run's facts (device class,
whether it runs under Apptainer, the checkout and working directory); only
:meth:`Realisation.forget_pruned_images` asks an engine anything. This module needs no torch
and no Snakemake.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ptspeed.envs.apptainer import DEFINITION, SifPlan, check_driver, default_base_image
from ptspeed.envs.apptainer_cells import CELL_PYTHON
from ptspeed.envs.container_config import runs_in_image
from ptspeed.envs.containers import ENGINES, INSTALL_SCRIPT, UV_REQUIREMENTS
from ptspeed.envs.engine_calls import forget_pruned_image
from ptspeed.envs.gpu_code import environment_record_path
from ptspeed.envs.image_references import is_local_image, strip_scheme, without_tag
from ptspeed.envs.venvs import venv_dir
from ptspeed.errors import ConfigError
from ptspeed.plan.settings import Containers, Environment, Settings

CONTAINER_RUN = Path("workflow/scripts/container_run.py")


def quoted(arguments: Iterable[object]) -> str:
    """``arguments`` as one shell-quoted command line."""
    return " ".join(shlex.quote(str(a)) for a in arguments)


class Realisation:
    """The environments of the settings as this run realises them (on the settings' device
    class). ``project``: the checkout (its scripts/ and docker/); ``workdir``: Snakemake's
    working directory, which relative paths of the config are taken from."""

    def __init__(
        self,
        settings: Settings,
        in_apptainer: bool,
        project: Path,
        workdir: Path,
        host_python: str = sys.executable,
    ) -> None:
        self.environments: Mapping[str, Environment] = settings.environments
        self.containers: Containers = settings.containers
        self.results = settings.results
        self.env_cache = (workdir / Path(settings.env_cache).expanduser()).resolve()
        self.device_class = settings.device
        self.in_apptainer = in_apptainer
        self.project = project
        self.workdir = workdir
        self.host_python = host_python
        # A venv's python names the hash of its lock: read once per environment, not per cell.
        self._pythons: dict[str, str] = {}

    def runs_in_image(self, env: str) -> bool:
        """Whether the cells of ``env`` run in its image (container_config.runs_in_image)."""
        return runs_in_image(self.environments[env], self.containers, self.in_apptainer)

    def engine(self, env: str) -> str | None:
        """docker or podman when the cells of ``env`` run in ``docker run`` / ``podman run`` of
        the image the workflow built or pulled; None when they do not (Apptainer, no image)."""
        if self.runs_in_image(env) and self.containers.runtime in ENGINES:
            return self.containers.runtime
        return None

    def runs_in_sif(self, env: str) -> bool:
        """Whether the cells of ``env`` run in the sif that rule sif makes."""
        return self.runs_in_image(env) and not self.engine(env) and not self.brought(env)

    def brought(self, env: str) -> str:
        """The image the site brings for ``env`` (kind image), as Snakemake's ``container:``
        takes it: a registry's reference, or a local file's absolute path; '' for others."""
        spec = self.environments[env]
        if spec.kind != "image" or not self.in_apptainer:
            return ""
        reference = spec.image
        if reference.startswith("docker://"):
            # Apptainer 1.3 refuses a tag beside the digest (image_references.without_tag).
            return f"docker://{without_tag(strip_scheme(reference))[0]}"
        if not is_local_image(reference):
            return reference
        return os.path.abspath(self.workdir / Path(reference).expanduser())

    def brought_environments(self) -> list[str]:
        return [env for env in self.environments if self.brought(env)]

    def brought_digest(self, env: str) -> str:
        """The digest of a brought image (rule brought_image writes it beside its record)."""
        return f"{self.results}/envs/{env}.digest"

    def manifest(self, env: str) -> str:
        """The manifest of the environment's image (rule image writes it)."""
        return f"{self.results}/images/{env}.json"

    def sif(self, env: str) -> str:
        """The Apptainer image that rule sif makes and the cells of ``env`` run in."""
        return f"{self.results}/images/{env}.sif"

    def sif_digest(self, env: str) -> str:
        """The digest of that image (the built or pulled image's), which every record names."""
        return f"{self.sif(env)}.digest"

    def container(self, env: str) -> str | None:
        """The cell's Snakemake ``container:``: the environment's sif, the image it brings, or
        None."""
        return self.brought(env) or (self.sif(env) if self.runs_in_sif(env) else None)

    def ready(self, env: str) -> str | list[str]:
        """What a cell waits for: its image's manifest (docker or podman), its sif and digest
        (a DAG input: ``container:`` alone is not one), its venv (build_env) or nothing."""
        if self.engine(env):
            return self.manifest(env)
        if self.brought(env):
            return [environment_record_path(self.results, env), self.brought_digest(env)]
        if self.runs_in_image(env):
            return [self.sif(env), self.sif_digest(env)]
        if self.environments[env].kind != "venv":
            return []
        return environment_record_path(self.results, env)

    def venv(self, env: str) -> Path:
        requirements = self.workdir / self.environments[env].requirements
        return venv_dir(self.env_cache, env, requirements)

    def python(self, env: str) -> str:
        """The shell-quoted command that starts the Python of the cells of ``env``."""
        if env not in self._pythons:
            self._pythons[env] = self._python(env)
        return self._pythons[env]

    def _python(self, env: str) -> str:
        engine = self.engine(env)
        if engine:
            return self.container_launcher(env, engine)
        if self.runs_in_image(env):
            return self.apptainer_python(env)
        if self.environments[env].kind == "host":
            return shlex.quote(self.host_python)
        return shlex.quote(str(self.venv(env).resolve() / "bin" / "python"))

    def apptainer_python(self, env: str) -> str:
        """The image's python as the cell's command inside the container starts it: blind to
        the host's Python packages (apptainer_cells.CELL_PYTHON), with the digest for the record."""
        digest_file = self.brought_digest(env) if self.brought(env) else self.sif_digest(env)
        digest = shlex.quote(digest_file)
        return f'{CELL_PYTHON} PTSPEED_CONTAINER_DIGEST="$(cat {digest})" python'

    def container_launcher(self, env: str, engine: str) -> str:
        """``python`` in ``docker run`` / ``podman run`` of the environment's image: the working
        directory and the results mounted at their own paths, on cuda with the GPUs."""
        gpus = ["--gpus"] if self.device_class == "cuda" else []
        return quoted([
            self.host_python, self.project / CONTAINER_RUN, "--engine", engine,
            "--manifest", self.manifest(env), *gpus,
            "--mount", self.workdir, "--mount", (self.workdir / self.results).resolve(),
            "--workdir", self.workdir, "--", "python",
        ])  # fmt: skip

    def image_environments(self) -> list[str]:
        """Environments that have an image: built from a lock, or pulled by their reference."""
        needed = "requirements" if self.containers.images == "build" else "container"
        return [env for env, spec in self.environments.items() if getattr(spec, needed)]

    def sif_environments(self) -> list[str]:
        """Environments whose cells run in an Apptainer image."""
        return [env for env in self.environments if self.runs_in_sif(env)]

    def forget_pruned_images(self) -> list[str]:
        """Remove the manifest of every docker or podman environment whose image the engine no
        longer has, so that rule image makes it again; a notice for each one removed."""
        engines = {env: self.engine(env) for env in self.environments}
        notices = (
            forget_pruned_image(Path(self.manifest(env)), engine)
            for env, engine in engines.items()
            if engine
        )
        return [notice for notice in notices if notice]

    def driver_refusals(self, used: Iterable[str], driver: str) -> dict[str, str]:
        """Of the environments ``used``, those whose sif's CUDA (its base's, or its lock's
        wheels') needs a newer driver than ``driver``, each with the reason."""
        refusals = {}
        for env in sorted(set(used) & set(self.sif_environments())):
            spec = self.environments[env]
            base = spec.base_image or default_base_image(self.project)
            lock = self.workdir / spec.requirements if spec.requirements else None
            text = lock.read_text(encoding="utf-8") if lock and lock.is_file() else ""
            try:
                check_driver(env, base, driver, text)
            except ConfigError as exc:
                refusals[env] = str(exc)
        return refusals

    def check_driver(self, used: Iterable[str], driver: str) -> None:
        """Raise ConfigError for the first of the environments ``used`` whose sif needs a newer
        driver than ``driver`` (:meth:`driver_refusals`)."""
        for reason in self.driver_refusals(used, driver).values():
            raise ConfigError(reason)


@dataclass(frozen=True)
class Images:
    """How rules image and sif make the environments' images: ``engine`` builds or pulls them;
    ``sif_plan`` says how the Apptainer images are made (None: no cell runs in one)."""

    realisation: Realisation
    engine: str
    sif_plan: SifPlan | None

    def spec(self, env: str) -> Environment:
        return self.realisation.environments[env]

    def requirements(self, env: str) -> str:
        """The lock an image is built from; raises ConfigError without one."""
        if not self.spec(env).requirements:
            raise ConfigError(f"environments.{env}: no requirements to build an image from")
        return self.spec(env).requirements

    def tag(self, env: str) -> str:
        """The built image's name: the environment's container reference, else a local name."""
        return self.spec(env).container or f"localhost/ptspeed/{env}:latest"

    def recipe_options(self, env: str) -> list[object]:
        """Options of workflow/scripts/image.py that say what an image is built from."""
        containers, workdir = self.realisation.containers, self.realisation.workdir
        options: list[object] = ["--python", self.spec(env).python]
        if self.spec(env).base_image:
            options += ["--base-image", self.spec(env).base_image]
        if containers.ca_bundle:
            options += [
                "--ca-bundle",
                (workdir / Path(containers.ca_bundle).expanduser()).resolve(),
            ]
        if containers.image_dir and self.sif_plan:
            options += [
                "--image-dir",
                (workdir / Path(containers.image_dir).expanduser()).resolve(),
            ]
        return options

    def build_options(self, env: str) -> str:
        options: list[object] = ["--engine", self.engine, "--tag", self.tag(env)]
        if self.realisation.containers.pushes:
            options += ["--push-to", self.realisation.containers.registry]
        return quoted([*options, *self.recipe_options(env)])

    def pull_options(self, env: str) -> str:
        return quoted(["--engine", self.engine, "--uri", self.spec(env).container])

    def sif_inputs(self, env: str) -> dict[str, str]:
        """The inputs of rule sif: the engine's image, or the recipe and lock that Apptainer
        builds itself; a registry image is an input of no rule (pinned by digest)."""
        if self.sif_plan is None or self.sif_plan.source == "registry":
            return {}
        inputs = {
            "requirements": self.requirements(env),
            "install": str(INSTALL_SCRIPT),
            "uv": str(UV_REQUIREMENTS),
        }
        if self.sif_plan.source == "image":
            return {**inputs, "manifest": self.realisation.manifest(env)}
        return {**inputs, "definition": str(DEFINITION)}

    def sif_options(self, env: str) -> str:
        """Options of ``workflow/scripts/image.py sif``; raises ConfigError without a plan."""
        plan = self.sif_plan
        if plan is None:
            raise ConfigError(
                f"{self.realisation.sif(env)}: made only under --use-singularity / --sdm apptainer"
            )
        options: list[object] = ["--source", plan.source]
        if plan.source == "registry":
            return quoted([*options, "--uri", self.spec(env).container])
        if plan.source == "image":
            options += ["--engine", plan.engine, "--manifest", self.realisation.manifest(env)]
        options += ["--requirements", self.requirements(env)]
        return quoted([*options, *self.recipe_options(env)])

    def targets(self, used: Iterable[str] | None = None) -> list[str]:
        """What `snakemake images` makes, of the environments ``used`` by the matrix's cells
        (None: every one): under Apptainer every <env>.sif (with what it is made of) and the
        record of every image a site brings, else every image's manifest."""
        realisation = self.realisation
        wanted = set(realisation.environments if used is None else used)
        brought = [
            environment_record_path(realisation.results, env)
            for env in realisation.brought_environments()
            if env in wanted
        ]
        sifs = [realisation.sif(env) for env in realisation.sif_environments() if env in wanted]
        if self.sif_plan or brought:
            return [*(sifs if self.sif_plan else []), *brought]
        return [
            realisation.manifest(env) for env in realisation.image_environments() if env in wanted
        ]
