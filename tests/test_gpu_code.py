"""Tests of ptspeed.cell.gpu_code and ptspeed.envs.gpu_code: the GPU code of a torch build,
CUDA's rule of what runs where, the reason a cell gives on a GPU its build has no code for,
and the ``sm-XY`` faults that fake a GPU's capability on this GPU-less machine."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from helpers import benchmark_python, settings_of, tiny_cell
from hypothesis import given
from hypothesis import strategies as st

from ptspeed.cell import harness
from ptspeed.cell.checks import FAULTS, check_cell
from ptspeed.cell.faults import FAULTS_VARIABLE, parse_faults
from ptspeed.cell.gpu_code import (
    FAKED_GPU_FAULTS,
    KNOWN_GPUS,
    PUBLISHED_VERSIONS,
    GpuCode,
    device_reason,
    faked_capability,
    gpu_named,
    published_code,
    unsupported_reason,
)
from ptspeed.cell.harness import run_cell
from ptspeed.cell.record import Record
from ptspeed.envs.gpu_code import (
    environment_code,
    environment_codes,
    environment_record,
    environment_record_path,
    pinned_torch,
    probe_code,
    recorded_code,
)
from ptspeed.errors import BadInput, EnvBuildError

ROOT = Path(__file__).resolve().parents[1]
OLD_FLAGS = "sm_37 sm_50 sm_60 sm_70 sm_75 sm_80 sm_86"  # torch 1.13.1 and 2.0.1, cu117
NEW_FLAGS = "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"  # torch 2.14.1+cu130
ENV_BUILDS = {
    "torch-1.13": "1.13.1+cu117",
    "torch-2.0": "2.0.1+cu117",
    "torch-2.0-cu118": "2.0.1+cu118",
    "torch-2.14": "2.14.1+cu130",
}

# --- parsing torch._C._cuda_getArchFlags() ---------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "cubins", "ptx", "specific"),
    [
        (OLD_FLAGS, ((3, 7), (5, 0), (6, 0), (7, 0), (7, 5), (8, 0), (8, 6)), (), ()),
        (NEW_FLAGS, ((7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)), (), ()),
        ("sm_80 sm_90 compute_90", ((8, 0), (9, 0)), ((9, 0),), ()),
        ("  sm_86\tsm_80\n", ((8, 0), (8, 6)), (), ()),  # any whitespace, any order
        ("sm_90a sm_100a compute_90a", (), (), ((9, 0), (10, 0))),
        ("sm_100f compute_120f", ((10, 0), (12, 0)), (), ()),  # family code: a cubin's rule
        ("", (), (), ()),
    ],
)
def test_arch_flags_are_parsed(
    flags: str, cubins: tuple[Any, ...], ptx: tuple[Any, ...], specific: tuple[Any, ...]
) -> None:
    code = GpuCode.from_arch_flags(flags, "9.9.9", "12.0")
    assert (code.cubins, code.ptx, code.specific) == (cubins, ptx, specific)


@pytest.mark.parametrize("token", ["gfx90a", "sm_9", "sm90", "compute_xy", "sm_86+PTX", "sm_90b"])
def test_a_strange_arch_flag_is_refused_naming_it(token: str) -> None:
    with pytest.raises(BadInput) as caught:
        GpuCode.from_arch_flags(f"sm_80 {token}", "9.9.9", "12.0")
    assert str(caught.value) == f"arch_flags: {token!r} is not sm_XY or compute_XY"


def test_the_arch_flags_are_written_as_torch_writes_them() -> None:
    assert GpuCode.from_arch_flags(OLD_FLAGS, "1.13.1+cu117", "11.7").arch_flags == OLD_FLAGS
    code = GpuCode.from_arch_flags("compute_90 sm_90a sm_80", "x", "12.4")
    assert code.arch_flags == "sm_80 sm_90a compute_90"


def test_an_arch_list_gives_cubins_and_ptx() -> None:
    code = GpuCode.from_arch_list("7.0;7.5 8.0;8.6+PTX", "x", "11.8")
    assert code.cubins == ((7, 0), (7, 5), (8, 0), (8, 6))
    assert code.ptx == ((8, 6),)
    with pytest.raises(BadInput, match=r"TORCH_CUDA_ARCH_LIST: '8\.6\+ptx' is not X\.Y"):
        GpuCode.from_arch_list("8.0;8.6+ptx", "x", "11.8")


def fake_torch(flags: Any, cuda: str | None = "11.7", **more: Any) -> Any:
    """A torch module as far as gpu_code reads one; ``flags`` ... means no _cuda_getArchFlags."""
    binding = (
        SimpleNamespace() if flags is ... else SimpleNamespace(_cuda_getArchFlags=lambda: flags)
    )
    version = SimpleNamespace(cuda=cuda, hip=more.pop("hip", None))
    return SimpleNamespace(__version__="1.13.1+cu117", version=version, _C=binding, **more)


@pytest.mark.parametrize(
    ("torch_module", "cubins"),
    [
        (fake_torch(OLD_FLAGS), ((3, 7), (5, 0), (6, 0), (7, 0), (7, 5), (8, 0), (8, 6))),
        (fake_torch(..., cuda=None), ()),  # a CPU-only build has no _cuda_getArchFlags
        (fake_torch(None), ()),
        (fake_torch(""), ()),
        (fake_torch("gfx90a gfx942", cuda=None, hip="6.2"), ()),  # ROCm: not read
    ],
)
def test_code_of_a_torch_module(torch_module: Any, cubins: tuple[Any, ...]) -> None:
    code = GpuCode.from_torch(torch_module)
    assert code.cubins == cubins and code.ptx == () and code.torch_version == "1.13.1+cu117"


def test_the_code_of_this_torch_is_read_without_a_gpu() -> None:
    code = GpuCode.from_torch(torch)
    assert code.torch_version == torch.__version__
    assert code.cuda_version == (torch.version.cuda or "")
    if torch.__version__ in PUBLISHED_VERSIONS:
        assert code == published_code(torch.__version__)


# --- JSON ----------------------------------------------------------------------------------

capabilities = st.tuples(st.integers(1, 15), st.integers(0, 9))
architectures = st.lists(capabilities, unique=True).map(lambda found: tuple(sorted(found)))


@given(
    torch_version=st.text(max_size=20),
    cuda_version=st.sampled_from(["", "11.7", "13.0"]),
    cubins=architectures,
    ptx=architectures,
    specific=architectures,
)
def test_json_round_trip(
    torch_version: str, cuda_version: str, cubins: Any, ptx: Any, specific: Any
) -> None:
    code = GpuCode(torch_version, cuda_version, cubins, ptx, specific)
    assert GpuCode.from_json(json.loads(json.dumps(code.to_json()))) == code


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "gpu_code: must be an object, not list"),
        ({"cuda_version": "11.7", "arch_flags": ""}, "gpu_code.torch_version: must be a string"),
        ({"torch_version": "x", "cuda_version": None, "arch_flags": ""}, "gpu_code.cuda_version"),
        (
            {"torch_version": "x", "cuda_version": "11.7", "arch_flags": "sm_80 gfx90a"},
            "gpu_code.arch_flags: 'gfx90a' is not sm_XY or compute_XY",
        ),
    ],
)
def test_bad_json_is_refused_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(BadInput) as caught:
        GpuCode.from_json(data)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


# --- CUDA's rule ---------------------------------------------------------------------------

RUNS = {  # the table: which build runs on which GPU
    "1.13.1+cu117": {"V100": True, "A100": True, "L40S": True, "H100": False, "B200": False},
    "2.0.1+cu117": {"V100": True, "A100": True, "L40S": True, "H100": False, "B200": False},
    "2.0.1+cu118": {"V100": True, "A100": True, "L40S": True, "H100": True, "B200": False},
    "2.14.1+cu130": {"V100": False, "A100": True, "L40S": True, "H100": True, "B200": True},
}


def assert_runs_as_the_table_says(code: GpuCode, build: str) -> None:
    found = {gpu: code.runs_on(KNOWN_GPUS[gpu]) for gpu in RUNS[build]}
    assert found == RUNS[build], build
    for gpu, runs in RUNS[build].items():
        assert (unsupported_reason(code, KNOWN_GPUS[gpu], gpu) == "") == runs, (build, gpu)


@pytest.mark.parametrize("build", list(RUNS))
def test_published_builds_run_where_the_table_says(build: str) -> None:
    code = published_code(build)
    assert code is not None and code.torch_version == build
    assert_runs_as_the_table_says(code, build)


def test_the_published_table_is_the_measured_flags() -> None:
    assert published_code("1.13.1+cu117") == GpuCode.from_arch_flags(
        OLD_FLAGS, "1.13.1+cu117", "11.7"
    )
    assert published_code("2.0.1+cu117") == GpuCode.from_arch_flags(
        OLD_FLAGS, "2.0.1+cu117", "11.7"
    )
    assert published_code("2.14.1+cu130") == GpuCode.from_arch_flags(
        NEW_FLAGS, "2.14.1+cu130", "13.0"
    )
    assert published_code("2.0.1+cu118").arch_flags == f"{OLD_FLAGS} sm_90"  # type: ignore[union-attr]
    assert published_code("2.0.1+cpu") == GpuCode("2.0.1+cpu", "")
    assert published_code("2.0.1") is None and published_code("1.12.0+cu116") is None


@pytest.mark.parametrize(
    ("flags", "capability", "runs"),
    [
        ("sm_86", (8, 9), True),  # same major, newer minor
        ("sm_86", (8, 0), False),  # same major, older minor
        ("sm_86", (9, 0), False),  # a cubin never crosses a major
        ("sm_80 compute_80", (12, 0), True),  # PTX JITs on anything newer
        ("compute_90", (8, 9), False),  # but not on anything older
        ("sm_90a", (9, 0), True),  # architecture-specific: exactly its capability
        ("sm_100a", (10, 3), False),
        ("", (8, 0), False),
    ],
)
def test_cuda_compatibility_rule(flags: str, capability: tuple[int, int], runs: bool) -> None:
    assert GpuCode.from_arch_flags(flags, "x", "12.8").runs_on(capability) is runs


def test_the_reason_for_a_gpu_too_new() -> None:
    code = published_code("1.13.1+cu117")
    assert code is not None
    assert unsupported_reason(code, (9, 0), "NVIDIA H100 80GB HBM3") == (
        "torch 1.13.1+cu117 has no code for sm_90 (NVIDIA H100 80GB HBM3); its newest is sm_86 "
        "— run this environment on a GPU of compute capability 8.x (e.g. an A100)"
    )


def test_the_reason_for_a_gpu_too_old() -> None:
    code = published_code("2.14.1+cu130")
    assert code is not None
    assert unsupported_reason(code, (7, 0), "Tesla V100-SXM2-32GB") == (
        "torch 2.14.1+cu130 has no code for sm_70 (Tesla V100-SXM2-32GB); its oldest is sm_75 "
        "— run this environment on a GPU of compute capability 7.5 or newer (e.g. a T4)"
    )


def test_the_reason_for_a_gpu_between_the_builds_architectures() -> None:
    code = GpuCode.from_arch_flags("sm_75 sm_90", "2.9.9+custom", "12.8")
    assert unsupported_reason(code, (8, 0), "NVIDIA A100-SXM4-80GB") == (
        "torch 2.9.9+custom has no code for sm_80 (NVIDIA A100-SXM4-80GB); its code is for "
        "sm_75 sm_90 — run this environment on a GPU of one of those (e.g. a T4)"
    )


def test_the_reason_when_only_a_later_minor_of_the_newest_major_has_code() -> None:
    code = GpuCode.from_arch_flags("sm_75 sm_86", "x", "11.7")
    assert unsupported_reason(code, (9, 0)) == (
        "torch x has no code for sm_90; its newest is sm_86 — run this environment on a GPU of "
        "compute capability 8.6 or a later 8.x (e.g. an A10)"
    )


def test_the_reason_for_a_cpu_only_build() -> None:
    assert unsupported_reason(GpuCode("2.14.1+cpu", ""), (9, 0), "NVIDIA H100") == (
        "torch 2.14.1+cpu has no GPU code (a CPU-only build), so it cannot run on sm_90 "
        "(NVIDIA H100) — install a CUDA build of torch in this environment"
    )


# --- the cell's check and its faults ---------------------------------------------------------


def torch_reading_gpu(flags: str, cuda: Any) -> Any:
    """A CUDA build of torch with code ``flags`` whose torch.cuda is ``cuda``."""
    module = fake_torch(flags)
    module.cuda = cuda
    return module


def test_a_cuda_device_is_checked_against_its_capability() -> None:
    cuda = SimpleNamespace(
        get_device_capability=lambda device: (9, 0),
        get_device_name=lambda device: "NVIDIA H100 80GB HBM3",
    )
    old = torch_reading_gpu(OLD_FLAGS, cuda)
    reason = device_reason(old, torch.device("cuda", 0))
    assert reason.startswith("torch 1.13.1+cu117 has no code for sm_90 (NVIDIA H100 80GB HBM3)")
    assert (
        device_reason(torch_reading_gpu(f"{OLD_FLAGS} sm_90", cuda), torch.device("cuda", 0)) == ""
    )


def test_a_device_that_is_no_cuda_gpu_is_not_checked() -> None:
    untouchable = SimpleNamespace()  # reading the GPU would raise AttributeError
    assert device_reason(torch_reading_gpu(OLD_FLAGS, untouchable), torch.device("cpu")) == ""
    rocm = fake_torch("gfx942", cuda=None, hip="6.2")
    rocm.cuda = untouchable
    assert device_reason(rocm, torch.device("cuda", 0)) == ""


def test_a_faked_capability_is_checked_also_on_the_cpu() -> None:
    untouchable = SimpleNamespace()
    old = torch_reading_gpu(OLD_FLAGS, untouchable)
    assert device_reason(old, torch.device("cpu"), "sm-90") == (
        "torch 1.13.1+cu117 has no code for sm_90 (NVIDIA H100, faked by fault sm-90); its "
        "newest is sm_86 — run this environment on a GPU of compute capability 8.x (e.g. an A100)"
    )
    assert device_reason(old, torch.device("cpu"), "sm-80") == ""
    assert device_reason(old, torch.device("cuda", 0), "sm-80") == ""  # the fault wins


def test_every_known_capability_has_a_fault() -> None:
    assert {faked_capability(fault) for fault in FAKED_GPU_FAULTS} == set(KNOWN_GPUS.values())
    assert faked_capability("sm-100") == (10, 0) and gpu_named((10, 0)) == "B200"
    assert faked_capability("sm-91") is None and faked_capability("oom") is None
    assert set(FAKED_GPU_FAULTS) <= set(FAULTS)


def test_a_capability_fault_passes_the_fault_variable_and_the_cell_check() -> None:
    assert parse_faults("torch-1.13/mlp/*/*/*=sm-90, */*/*/*/1=sm-100") == [
        (("torch-1.13", "mlp", "*", "*", "*"), "sm-90"),
        (("*", "*", "*", "*", "1"), "sm-100"),
    ]
    check_cell(tiny_cell("mlp", fault="sm-90"))
    with pytest.raises(BadInput, match="fault 'sm-91' is not one of"):
        parse_faults("*/*/*/*/*=sm-91")
    with pytest.raises(BadInput, match="is not ENV/MODEL/VARIANT/MODE/TRIAL=FAULT"):
        parse_faults("*/*/*/*/*=9-sm")
    with pytest.raises(BadInput, match="fault: 'sm-91' is not one of"):
        check_cell(tiny_cell("mlp", fault="sm-91"))


def unbuildable(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the model was built")


def test_a_cell_refuses_a_gpu_without_code_before_building_its_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(harness, "build_model", unbuildable)
    monkeypatch.setattr(torch._C, "_cuda_getArchFlags", lambda: OLD_FLAGS, raising=False)
    monkeypatch.setattr(torch.version, "cuda", "11.7")
    record = run_cell(tiny_cell("mlp", fault="sm-90"))
    assert record.status == "unsupported", record.detail
    assert "has no code for sm_90 (NVIDIA H100, faked by fault sm-90)" in record.reason
    assert "its newest is sm_86" in record.reason
    assert record.metrics.throughput_samples_per_s is None


def test_a_cell_on_a_gpu_it_has_code_for_runs_as_usual(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch._C, "_cuda_getArchFlags", lambda: OLD_FLAGS, raising=False)
    monkeypatch.setattr(torch.version, "cuda", "11.7")
    record = run_cell(tiny_cell("mlp", fault="sm-80"))
    assert record.status == "ok", record.reason
    assert record.cell.fault == "sm-80"
    assert record.metrics.throughput_samples_per_s


# --- the environments' code, on the host ------------------------------------------------------


def test_pinned_torch_names_its_build(tmp_path: Path) -> None:
    lock = tmp_path / "lock.txt"
    cases = {
        "torch==1.13.1 \\\n    --hash=sha256:00\n": "1.13.1+cu117",
        "torchvision==0.15.2\ntorch==2.0.1\n": "2.0.1+cu117",
        "torch==2.0.1+cu118 \\\n    --hash=sha256:00\n": "2.0.1+cu118",
        "torch @ https://download.pytorch.org/whl/cu118/torch-2.0.1%2Bcu118-cp310-cp310-"
        "linux_x86_64.whl#sha256=00\n": "2.0.1+cu118",
        "torch==2.3.0\n": "2.3.0",
        "torchvision==0.15.2\n": None,
    }
    for text, pinned in cases.items():
        lock.write_text(text)
        assert pinned_torch(lock) == pinned, text


@pytest.mark.parametrize("env", list(ENV_BUILDS))
def test_the_locks_pin_published_builds(env: str) -> None:
    lock = ROOT / "envs" / f"{env}.txt"
    if not lock.is_file():
        pytest.skip(f"{lock.name} is not locked yet")
    assert pinned_torch(lock) == ENV_BUILDS[env]
    code = environment_code(ROOT / "no-results-here", env, lock)
    assert code == published_code(ENV_BUILDS[env])


def test_a_recorded_code_comes_before_the_published_one(tmp_path: Path) -> None:
    lock = ROOT / "envs" / "torch-2.0.txt"
    record = Path(environment_record_path(tmp_path, "torch-2.0"))
    record.parent.mkdir(parents=True)
    record.write_text("/old/venv/bin/python\n")  # written before records held code
    assert environment_code(tmp_path, "torch-2.0", lock) == published_code("2.0.1+cu117")
    realised = GpuCode.from_arch_flags(f"{OLD_FLAGS} sm_90", "2.0.1+cu118", "11.8")
    record.write_text(json.dumps(environment_record("/venv/bin/python", realised)))
    assert environment_code(tmp_path, "torch-2.0", lock) == realised
    record.write_text(json.dumps({"python": "p", "gpu_code": {"torch_version": 1}}))
    with pytest.raises(BadInput, match=r"torch-2\.0\.json: gpu_code\.torch_version"):
        recorded_code(record)


def test_an_image_a_site_brings_has_the_code_its_record_holds(tmp_path: Path) -> None:
    """Known to the planner once rule brought_image has read it; unknown before."""
    config = {"results": "results", "environments": {"ngc": {"kind": "image", "image": "x.sif"}}}
    assert environment_codes(settings_of(config), tmp_path) == {"ngc": None}
    record = tmp_path / environment_record_path("results", "ngc")
    record.parent.mkdir(parents=True)
    brought = GpuCode.from_arch_flags(f"{OLD_FLAGS} sm_90 compute_90", "1.13.0a0+936e930", "11.8")
    record.write_text(json.dumps(environment_record("python", brought)))
    assert environment_codes(settings_of(config), tmp_path) == {"ngc": brought}


OLDER_PYTHONS = sorted(Path.home().glob(".pyenv/versions/3.[6-9].*/bin/python3"))


@pytest.mark.skipif(not OLDER_PYTHONS, reason="needs a Python older than 3.10 (pyenv)")
def test_a_python_older_than_the_cells_need_is_named() -> None:
    """NGC's 1.13-era images have Python 3.8: the probe names it, not a syntax error."""
    python = OLDER_PYTHONS[-1]
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    with pytest.raises(EnvBuildError) as raised:
        probe_code(python)
    assert str(raised.value).endswith(
        f"failed (exit 1): its Python is {version}; ptspeed's cells need Python >= 3.10"
    )


# --- the older environments themselves ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.crossversion
@pytest.mark.parametrize("env", ["torch-1.13", "torch-2.0"])
def test_the_realised_environments_run_where_the_table_says(env: str) -> None:
    from ptspeed.envs.gpu_code import probe_code

    code = probe_code(benchmark_python(env))
    assert code == published_code(ENV_BUILDS[env])
    assert_runs_as_the_table_says(code, ENV_BUILDS[env])


def cell_in(env: str, out: Path, *arguments: str, faults: str = "") -> Record:
    """``python -m ptspeed cell`` of a tiny mlp cell in environment ``env``'s venv."""
    environment = {k: v for k, v in os.environ.items() if k != FAULTS_VARIABLE}
    environment["PYTHONPATH"] = str(ROOT / "src")
    if faults:
        environment[FAULTS_VARIABLE] = faults
    command = [
        benchmark_python(env), "-m", "ptspeed", "cell", "--env", env, "--model", "mlp",
        "--batch-size", "2", "--warmup-steps", "1", "--measured-steps", "2", "--device", "cpu",
        "--out", str(out), *arguments,
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env=environment, check=False
    )
    assert out.exists(), done.stderr
    return Record.from_dict(json.loads(out.read_text()))


@pytest.mark.slow
@pytest.mark.crossversion
@pytest.mark.parametrize("env", ["torch-1.13", "torch-2.0"])
@pytest.mark.timeout(900)
def test_an_older_environment_refuses_an_h100_and_runs_on_an_a100(env: str, tmp_path: Path) -> None:
    refused = cell_in(env, tmp_path / "h100.json", "--fault", "sm-90")
    build = ENV_BUILDS[env]
    assert refused.status == "unsupported", refused.detail
    assert refused.reason == (
        f"torch {build} has no code for sm_90 (NVIDIA H100, faked by fault sm-90); its newest "
        "is sm_86 — run this environment on a GPU of compute capability 8.x (e.g. an A100)"
    )
    assert refused.cell.fault == "sm-90" and refused.provenance.torch == build
    assert refused.metrics.throughput_samples_per_s is None  # no step ran
    assert refused.duration_s < 5.0  # the check comes before the model is built
    ran = cell_in(env, tmp_path / "a100.json", faults=f"{env}/mlp/*/*/*=sm-80")
    assert ran.status == "ok", ran.reason
    assert ran.cell.fault == "sm-80"
    assert ran.metrics.throughput_samples_per_s and ran.numerics.passed
