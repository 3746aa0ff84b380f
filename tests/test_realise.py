"""How each environment is realised for its cells (ptspeed.envs.realise), how the images are
made, and the device class and effective config the workflow hands on: the functions behind
workflow/rules/common.smk and common_images.smk, without Snakemake."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from helpers import settings_of

from ptspeed.envs import realise
from ptspeed.envs.apptainer import SifPlan
from ptspeed.envs.apptainer_cells import CELL_PYTHON
from ptspeed.envs.realise import Images, Realisation
from ptspeed.envs.venvs import lock_hash
from ptspeed.errors import ConfigError
from ptspeed.plan import device
from ptspeed.plan.config import effective_config_json
from ptspeed.plan.device import detect_device_class

ROOT = Path(__file__).resolve().parents[1]
PYTHON = "/opt/py/bin/python3"
DIGEST = "sha256:" + "ab" * 32
CUDA_BASE = f"nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04@{DIGEST}"


def environments() -> dict[str, dict[str, str]]:
    return {
        "host": {"kind": "host"},
        "venv": {"kind": "venv", "requirements": "envs/venv.txt", "python": "3.10"},
        "boxed": {
            "kind": "container",
            "requirements": "envs/boxed.txt",
            "python": "3.11",
            "container": f"docker://r.example/boxed@{DIGEST}",
            "base_image": CUDA_BASE,
        },
    }


def realisation(
    workdir: Path,
    runtime: str = "podman",
    in_apptainer: bool = False,
    device_class: str = "cpu",
    **containers: Any,
) -> Realisation:
    (workdir / "envs").mkdir(exist_ok=True)
    for name in ("venv", "boxed"):
        (workdir / f"envs/{name}.txt").write_text(f"torch=={name}\n")
    config = {
        "results": "results",
        "env_cache": str(workdir / "cache"),
        "environments": environments(),
        "containers": {"runtime": runtime, **containers},
    }
    return Realisation(settings_of(config, device_class), in_apptainer, ROOT, workdir, PYTHON)


# --- the cells of each environment ------------------------------------------------------------


def test_a_venv_cell_waits_for_its_venv_and_runs_its_python(tmp_path: Path) -> None:
    found = realisation(tmp_path)
    assert found.ready("venv") == "results/envs/venv.json"
    assert found.container("venv") is None
    venv = tmp_path / f"cache/venv-{lock_hash(tmp_path / 'envs/venv.txt')}"
    assert found.python("venv") == shlex.quote(f"{venv}/bin/python")


def test_a_host_cell_waits_for_nothing_and_runs_this_python(tmp_path: Path) -> None:
    found = realisation(tmp_path, in_apptainer=True)
    assert (found.ready("host"), found.container("host")) == ([], None)
    assert found.python("host") == PYTHON


def test_the_lock_is_hashed_once_per_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = realisation(tmp_path)
    calls = []
    real = realise.venv_dir
    monkeypatch.setattr(realise, "venv_dir", lambda *a: calls.append(a) or real(*a))
    assert len({found.python("venv") for _ in range(5)}) == 1
    assert len(calls) == 1


@pytest.mark.parametrize(("engine", "device_class"), [("podman", "cpu"), ("docker", "cuda")])
def test_a_container_cell_runs_in_the_engines_run_of_its_image(
    tmp_path: Path, engine: str, device_class: str
) -> None:
    found = realisation(tmp_path, runtime=engine, device_class=device_class)
    assert found.engine("boxed") == engine and found.engine("venv") is None
    assert found.ready("boxed") == "results/images/boxed.json"
    assert found.container("boxed") is None
    command = shlex.split(found.python("boxed"))
    assert command[:2] == [PYTHON, str(ROOT / "workflow/scripts/container_run.py")]
    assert command[command.index("--manifest") + 1] == "results/images/boxed.json"
    assert ("--gpus" in command) == (device_class == "cuda")
    mounts = [command[i + 1] for i, word in enumerate(command) if word == "--mount"]
    assert mounts == [str(tmp_path), str((tmp_path / "results").resolve())]
    assert command[-2:] == ["--", "python"]


def test_under_apptainer_every_cell_but_the_hosts_runs_in_its_sif(tmp_path: Path) -> None:
    found = realisation(tmp_path, runtime="apptainer", in_apptainer=True)
    for env in ("venv", "boxed"):
        assert found.ready(env) == [f"results/images/{env}.sif", f"results/images/{env}.sif.digest"]
        assert found.container(env) == f"results/images/{env}.sif"
        digest = f"results/images/{env}.sif.digest"
        assert (
            found.python(env) == f'{CELL_PYTHON} PTSPEED_CONTAINER_DIGEST="$(cat {digest})" python'
        )
    assert found.sif_environments() == ["venv", "boxed"]
    without = realisation(tmp_path, runtime="apptainer")
    assert without.sif_environments() == [] and without.ready("venv") == "results/envs/venv.json"


def test_an_image_a_site_brings_is_used_as_is_once_its_record_is_read(tmp_path: Path) -> None:
    """A .sif the site has and a registry's image pinned by digest: each cell runs in it (no
    sif of the workflow's), after its record and digest, which `snakemake images` makes."""
    registry = f"oras://r.example/ngc@{DIGEST}"
    config = {
        "results": "results",
        "env_cache": "cache",
        "environments": {
            **environments(),
            "site": {"kind": "image", "image": "images/site.sif"},
            "ngc": {"kind": "image", "image": registry},
        },
        "containers": {"runtime": "apptainer"},
    }
    settings = settings_of(config, "cpu")
    found = Realisation(settings, True, ROOT, tmp_path, PYTHON)
    assert found.container("site") == str(tmp_path / "images/site.sif")
    assert found.container("ngc") == registry
    assert found.ready("ngc") == ["results/envs/ngc.json", "results/envs/ngc.digest"]
    digest = "results/envs/ngc.digest"
    assert found.python("ngc") == f'{CELL_PYTHON} PTSPEED_CONTAINER_DIGEST="$(cat {digest})" python'
    assert found.sif_environments() == ["venv", "boxed"]
    assert found.brought_environments() == ["site", "ngc"]
    assert Images(found, "podman", None).targets() == [
        "results/envs/site.json", "results/envs/ngc.json",
    ]  # fmt: skip
    assert Realisation(settings, False, ROOT, tmp_path, PYTHON).brought("site") == ""


def test_only_the_engines_images_are_checked_for_pruning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = []

    def forget(manifest: Path, engine: str) -> str:
        asked.append((manifest, engine))
        return f"{manifest} is gone"

    monkeypatch.setattr(realise, "forget_pruned_image", forget)
    assert realisation(tmp_path).forget_pruned_images() == ["results/images/boxed.json is gone"]
    assert asked == [(Path("results/images/boxed.json"), "podman")]
    assert (
        realisation(tmp_path, runtime="apptainer", in_apptainer=True).forget_pruned_images() == []
    )


def test_a_cuda_base_newer_than_the_driver_is_refused_only_where_cells_use_it(
    tmp_path: Path,
) -> None:
    found = realisation(tmp_path, runtime="apptainer", in_apptainer=True)
    found.check_driver({"host", "venv"}, "470.256.02")  # the default base: CUDA 11.8
    found.check_driver({"boxed"}, "535.104.05")
    with pytest.raises(ConfigError, match=r"^environments\.boxed: .*CUDA 12\.8"):
        found.check_driver({"boxed", "host"}, "470.256.02")
    assert list(found.driver_refusals({"boxed", "host"}, "470.256.02")) == ["boxed"]


# --- the images -------------------------------------------------------------------------------


def images(tmp_path: Path, plan: SifPlan | None = None, **containers: Any) -> Images:
    runtime = "apptainer" if plan else "podman"
    return Images(realisation(tmp_path, runtime, bool(plan), **containers), "podman", plan)


def test_build_options_say_what_the_image_is_made_of(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    made = images(tmp_path, push=True, registry="r.example/p", ca_bundle="ca.pem", image_dir="x")
    assert shlex.split(made.build_options("boxed")) == [
        "--engine", "podman", "--tag", f"docker://r.example/boxed@{DIGEST}",
        "--push-to", "r.example/p", "--python", "3.11", "--base-image", CUDA_BASE,
        "--ca-bundle", str(bundle),
    ]  # fmt: skip
    assert "--tag localhost/ptspeed/venv:latest" in made.build_options("venv")
    assert made.pull_options("boxed") == f"--engine podman --uri docker://r.example/boxed@{DIGEST}"
    assert made.requirements("venv") == "envs/venv.txt"
    with pytest.raises(ConfigError, match=r"^environments\.host: no requirements"):
        made.requirements("host")


def test_the_image_targets_are_the_manifests_or_else_the_sifs(tmp_path: Path) -> None:
    assert images(tmp_path).targets() == ["results/images/venv.json", "results/images/boxed.json"]
    pulled = images(tmp_path, images="pull")
    assert pulled.targets() == ["results/images/boxed.json"]
    assert images(tmp_path, SifPlan("definition")).targets() == [
        "results/images/venv.sif", "results/images/boxed.sif",
    ]  # fmt: skip
    # `snakemake images` makes the images the matrix's cells use, not every configured one.
    assert images(tmp_path, SifPlan("definition")).targets({"boxed"}) == [
        "results/images/boxed.sif"
    ]
    assert images(tmp_path).targets({"venv"}) == ["results/images/venv.json"]


def test_sif_inputs_and_options_follow_the_plan(tmp_path: Path) -> None:
    from_image = images(tmp_path, SifPlan("image", "docker"), image_dir=str(tmp_path / "shared"))
    assert from_image.sif_inputs("venv") == {
        "requirements": "envs/venv.txt", "install": "docker/install.sh", "uv": "docker/uv.txt",
        "manifest": "results/images/venv.json",
    }  # fmt: skip
    assert shlex.split(from_image.sif_options("venv")) == [
        "--source", "image", "--engine", "docker", "--manifest", "results/images/venv.json",
        "--requirements", "envs/venv.txt", "--python", "3.10",
        "--image-dir", str(tmp_path / "shared"),
    ]  # fmt: skip
    defined = images(tmp_path, SifPlan("definition"))
    assert defined.sif_inputs("venv")["definition"] == "docker/ptspeed.def"
    assert defined.sif_options("venv").startswith("--source definition --requirements")
    registry = images(tmp_path, SifPlan("registry"))
    assert registry.sif_inputs("boxed") == {}
    assert (
        registry.sif_options("boxed")
        == f"--source registry --uri docker://r.example/boxed@{DIGEST}"
    )
    with pytest.raises(ConfigError, match=r"boxed\.sif: made only under"):
        images(tmp_path).sif_options("boxed")
    assert images(tmp_path).sif_inputs("boxed") == {}


# --- the device class and the effective config -----------------------------------------------


def test_device_auto_is_cuda_only_where_nvidia_smi_lists_a_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert detect_device_class("cuda") == "cuda"
    monkeypatch.setattr(device.shutil, "which", lambda _: None)
    assert detect_device_class("auto") == "cpu"
    for listing, expected in (("GPU 0: NVIDIA H100 (UUID: GPU-0)", "cuda"), ("", "cpu")):
        smi = tmp_path / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho '{listing}'\n")
        smi.chmod(0o755)
        monkeypatch.setattr(device.shutil, "which", lambda _, smi=smi: str(smi))
        assert detect_device_class("auto") == expected


def test_the_effective_config_names_the_device_class_used() -> None:
    config = {"results": "r", "device": "auto", "comparisons": {"b": 1, "a": 2}}
    effective = json.loads(effective_config_json(config, "cpu"))
    assert effective["device"] == "cpu" and list(effective["comparisons"]) == ["b", "a"]
    assert config["device"] == "auto"
