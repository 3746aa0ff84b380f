"""Run every CUDA path of the harness once, at small sizes, in each environment present.

    PYTHONPATH=src python3 scripts/gpu_check.py                 # on a GPU machine
    PYTHONPATH=src python3 scripts/gpu_check.py --device cpu    # its CPU half
    PYTHONPATH=src python3 scripts/gpu_check.py --paths eager,cudagraphs   # some paths only

Each path is one real cell (``python -m ptspeed cell``, its own process under the watchdog)
in the host interpreter and in every venv of the default config already built in its
environment cache; nothing is built or downloaded. A path's expected status is ``ok`` unless
the cell's own rules say the torch version or the device cannot run it (``unsupported``), or
the path is meant to fail (a real out-of-memory, an injected wrong gradient). Run inside an
Apptainer image on a GPU (``apptainer exec --nv IMAGE python3 scripts/gpu_check.py``), it first
checks that Triton can link against the driver Apptainer bound. Each
environment's train-mode paths then get aggregation's late numerics check against its eager
path (the loss at eager's last step: a CUDA graph's replayed steps, TorchScript's longer
warm-up); a failed one makes the path a ``numerics_mismatch``. The check needs pandas, and is
left out, saying so, where the interpreter running this script has none. Writes one JSON
summary, prints a table, and exits 1 when any path ended otherwise than expected.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from _checkout import ROOT

from ptspeed.cell import hostenv
from ptspeed.cell.arguments import to_arguments
from ptspeed.cell.measurement.telemetry import NVML_ENERGY_MIN_WINDOW_S
from ptspeed.cell.record import CellSpec, Record, read_record
from ptspeed.cell.variants.knobs import parse_knobs
from ptspeed.cell.variants.support import unsupported_for_model
from ptspeed.envs.venvs import venv_dir, venv_python
from ptspeed.launch.gpus import node_pool
from ptspeed.launch.watchdog import end_process_group
from ptspeed.models import get_model
from ptspeed.plan.schema import default_of

CONFIG = ROOT / "config" / "config.yaml"
MISMATCH = "numerics_mismatch"
STEPS = {"warmup_steps": 3, "measured_steps": 5, "numerics_steps": 2}


@dataclass(frozen=True)
class CheckedPath:
    """One path to check: a model, a knob string, a size, and what it should end as."""

    name: str
    model: str
    knobs: str
    batch_size: int = 16
    image_size: int = 64
    fault: str = ""
    expect: str = "ok"  # what it ends as where the torch version and device can run it
    devices: tuple[str, ...] = ("cuda", "cpu")
    since: tuple[int, int] = (0, 0)  # older torch versions record it unsupported
    mode: str = "train"
    seq_len: int = 32
    gpus: int = 1  # GPUs it needs (2-process NCCL, two stages): left out on a smaller node
    profiled: int = 0  # steps run under torch.profiler after the window (the workflow's 3)
    # Seconds the path takes on a GPU node, start-up, probes, cold compile and profiled steps
    # included (measured on an H200, torch 2.11, 2026-12-04); scaled by this node's pace as the
    # check runs.
    cost_s: float = 10.0


# In the order they run: when --budget-s runs out, the paths left are the least telling.
PATHS = (
    CheckedPath("eager", "mlp", "eager", profiled=3, cost_s=10.0),
    CheckedPath("compile", "mlp", "compile", profiled=3, cost_s=24.0),
    # Logits of 16 x 32 x 50257 = 25.7 M elements, past 2**24: the numerics gate's output
    # sample of an infer cell once indexed past the end there (a device-side assert).
    CheckedPath("infer compile, big output", "gpt2-tiny", "compile", mode="infer", cost_s=29.0),
    CheckedPath("infer cudagraphs", "mlp", "cudagraphs", mode="infer", cost_s=10.0),
    CheckedPath("cudagraphs", "mlp", "cudagraphs", profiled=3, cost_s=11.0),
    CheckedPath("amp fp16", "mlp", "amp=fp16", cost_s=10.0),
    CheckedPath("amp bf16", "mlp", "amp=bf16", cost_s=11.0),
    CheckedPath("cudagraphs bf16", "mlp", "cudagraphs+amp=bf16", cost_s=10.0),
    CheckedPath(
        "gate: wrong gradients", "mlp", "loader=0", fault="grad", expect="numerics_mismatch"
    ),
    CheckedPath(
        "gate: skipped step", "mlp", "amp=bf16", fault="skip-step", expect="numerics_mismatch"
    ),
    CheckedPath(
        "out of memory",
        "resnet50",
        "eager",
        batch_size=8192,
        image_size=224,
        expect="oom",
        devices=("cuda",),
        cost_s=15.0,
    ),
    CheckedPath(
        "compile reduce-overhead", "mlp", "compile=reduce-overhead", profiled=3, cost_s=24.0
    ),
    CheckedPath("lstm (cuDNN RNN)", "lstm-lm", "eager", batch_size=8, cost_s=11.0),
    CheckedPath("attn sdpa", "bert-tiny", "attn=sdpa", batch_size=2, since=(2, 1), cost_s=15.0),
    CheckedPath("ddp, 1 process", "mlp", "ddp+procs=1", cost_s=16.0),
    CheckedPath("ddp, 2 processes", "mlp", "ddp", gpus=2, cost_s=20.0),
    CheckedPath("pipeline, 2 stages", "mlp", "pipeline=2+chunks=2", gpus=2, cost_s=20.0),
    CheckedPath("fsdp, 1 process", "resnet50", "fsdp+procs=1", batch_size=2, cost_s=19.0),
    CheckedPath("fsdp offload, 1 process", "mlp", "fsdp=offload+procs=1", cost_s=15.0),
    CheckedPath("jit script", "mlp", "jit=script", cost_s=11.0),
    CheckedPath("jit trace", "resnet50", "jit=trace", batch_size=2, cost_s=20.0),
    CheckedPath("channels_last", "resnet50", "channels_last", batch_size=2, cost_s=18.0),
    CheckedPath("memfrac", "mlp", "memfrac=0.5", cost_s=9.0),
    CheckedPath("loader", "mlp", "loader=2", cost_s=10.0),
    CheckedPath("pin + loader", "mlp", "loader=2+pin", cost_s=10.0),
    CheckedPath("prefetch", "mlp", "loader=2+pin+prefetch", cost_s=12.0),
    CheckedPath("cudagraphs + loader", "mlp", "cudagraphs+loader=2+pin", since=(2, 1), cost_s=9.0),
    CheckedPath("tf32 on", "resnet50", "tf32=on", batch_size=2, cost_s=15.0),
    CheckedPath("cudnn_benchmark", "resnet50", "cudnn_benchmark", batch_size=2, cost_s=36.0),
)
NOT_RUN = "not run"
# A cell's watchdog ends it at its own time limit; a child still running this long after
# that is stuck, and is killed so that the check can print its table.
STUCK_AFTER_S = 120.0
# Six minutes: a node lent for 15 holds a run, its start and a rerun.
DEFAULT_BUDGET_S = 360.0


@dataclass
class Outcome:
    env: str
    torch: str
    path: str
    knobs: str
    expected: str
    status: str
    reason: str
    seconds: float
    throughput: float | None
    numerics: str
    record: str
    late: str = ""
    telemetry: str = ""  # on CUDA: the in-window NVML samples and energy, or what is missing
    profile: str = ""  # a profiled path's breakdown: timeline, step, kernels, idle, sum error
    perturbed: str = ""  # why aggregation judged the trial perturbed ('' for quiet)
    complaint: str = ""  # on CUDA, a fault-free ok path without telemetry or not quiet

    @property
    def as_expected(self) -> bool:
        return self.status == self.expected and not self.complaint


def interpreters(config: dict) -> dict[str, str]:
    """The host interpreter, and the python of every venv environment of the default config
    already built in its environment cache."""
    found = {"host": sys.executable}
    env_cache = Path(config.get("env_cache", default_of("env_cache"))).expanduser()
    for name, env in config["environments"].items():
        if env.get("kind", "venv") != "venv":
            continue
        python = venv_python(venv_dir(env_cache, name, ROOT / env["requirements"]))
        if python.exists():
            found[name] = str(python)
    return found


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def chosen_paths(slugs: str) -> tuple[CheckedPath, ...]:
    """The paths named by comma-separated slugs and eager (the late numerics check compares
    the others with it), in PATHS's order; all of them for ''."""
    wanted = {name for name in slugs.split(",") if name}
    known = [slug(path.name) for path in PATHS]
    unknown = sorted(wanted.difference(known))
    if unknown:
        raise ValueError(f"{', '.join(unknown)} unknown; the paths are {', '.join(known)}")
    if not wanted:
        return PATHS
    wanted.add(slug(PATHS[0].name))
    return tuple(path for path in PATHS if slug(path.name) in wanted)


def torch_version(python: str) -> tuple[str, tuple[int, int], tuple[int, int]]:
    probe = "import sys, torch; print(torch.__version__, *sys.version_info[:2])"
    version, major, minor = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    numbers = tuple(int("".join(c for c in part if c.isdigit())) for part in version.split(".")[:2])
    return version, numbers, (int(major), int(minor))  # type: ignore[return-value]


def gpu_code_reason(python: str) -> str:
    """Why the torch of ``python`` has no code for this node's first GPU ('' when it has, or
    when it cannot tell: its cells then say why CUDA does not work)."""
    probe = (
        "import torch; from ptspeed.cell.gpu_code import device_reason; "
        "print(device_reason(torch, torch.device('cuda', 0)))"
    )
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, env=environment, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else ""


def expected_status(
    path: CheckedPath, device: str, torch: tuple[int, int], py: tuple[int, int]
) -> str:
    knobs = parse_knobs(path.knobs)
    if torch < path.since or unsupported_for_model(knobs, device, torch, py, get_model(path.model)):
        return "unsupported"
    return path.expect


def record_file(out_dir: Path, env: str, path: CheckedPath) -> Path:
    return out_dir / env / f"{slug(path.name)}.json"


def run_path(
    env: str, python: str, path: CheckedPath, device: str, out_dir: Path, timeout_s: float
) -> tuple[Record | None, float, str]:
    """Run the path's cell; its record (None when it wrote none), the seconds it took, and why
    it was killed ('' when it ended by itself)."""
    record_path = record_file(out_dir, env, path)
    record_path.unlink(missing_ok=True)  # an earlier check's record is not this one's
    spec = CellSpec(
        model=path.model, variant=slug(path.name), knobs=path.knobs, mode=path.mode,
        batch_size=path.batch_size, image_size=path.image_size, seq_len=path.seq_len, env=env,
        device=device, timeout_s=timeout_s, fault=path.fault, **STEPS,
        compiler_cache=str(out_dir / "compiler" / env / slug(path.name)), compiler_cache_cold=True,
        profile_steps=path.profiled,
        profile_trace=str(out_dir / "traces" / env / f"{slug(path.name)}.json.gz")
        if path.profiled else "",
    )  # fmt: skip
    command = [python, "-m", "ptspeed", "cell", *to_arguments(spec), "--out", str(record_path)]
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    started = time.monotonic()
    killed = run_bounded(command, environment, timeout_s + STUCK_AFTER_S)
    seconds = time.monotonic() - started
    return (read_record(record_path) if record_path.exists() else None), seconds, killed


def run_bounded(command: list[str], environment: dict[str, str], limit_s: float) -> str:
    """Run ``command`` in a process group of its own; past ``limit_s``, or when the check
    itself is stopped, end the whole group. Why it was ended ('' when it ended by itself)."""
    child = subprocess.Popen(command, env=environment, cwd=ROOT, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        child.wait(timeout=limit_s)
        return ""
    except subprocess.TimeoutExpired:
        return f"stuck: still running {limit_s:.0f} s after it started, killed"
    finally:
        if child.poll() is None:
            end_process_group(child, grace_s=10.0)


def outcome_of(
    env: str, version: str, path: CheckedPath, expected: str, record: Record | None,
    seconds: float, record_path: Path,
) -> Outcome:  # fmt: skip
    """The path's row: its status, numerics verdict and, on CUDA, its telemetry."""
    if record is None:
        return Outcome(env, version, path.name, path.knobs, expected, "no record",
                       "the cell wrote no record", seconds, None, "", str(record_path))  # fmt: skip
    check = record.numerics
    bound = f"/{check.allowed_error:.2g}" if check.allowed_error is not None else ""
    verdict = (
        f"{'pass' if check.passed else 'FAIL'} {check.worst_quantity} "
        f"{check.max_relative_error:.2g}{bound}"
        if check.checked and check.max_relative_error is not None
        else ("not checked" if not check.checked else "non-finite")
    )
    outcome = Outcome(env, version, path.name, path.knobs, expected, record.status,
                      record.reason, seconds, record.metrics.throughput_samples_per_s, verdict,
                      str(record_path))  # fmt: skip
    outcome.telemetry, missing = telemetry_of(record)
    if record.cell.device.startswith("cuda") and record.status == "ok" and missing:
        outcome.complaint = f"no in-window telemetry: {missing}"
    if path.profiled and record.status == "ok":
        outcome.profile, wrong = profile_of(record)
        outcome.complaint = "; ".join(c for c in (outcome.complaint, wrong) if c)
    return outcome


def profile_of(record: Record) -> tuple[str, str]:
    """(a profiled path's breakdown in a line, what is wrong with it: '' when nothing). On
    CUDA the breakdown is of the GPU's timeline, with its idle time, and the kinds sum to the
    step; on the CPU of the stepping thread's."""
    profile = record.profile
    if not profile.profiled:
        return f"not profiled: {profile.reason}", f"not profiled: {profile.reason}"
    step = profile.step_time_s or 0.0
    idle = profile.time_by_kind_s.get("idle", 0.0) / step if step else 0.0
    counted = "kernels" if profile.timeline == "gpu" else "ops"
    line = (
        f"{profile.timeline} {step * 1e3:.2f} ms/step, {profile.kernels_per_step or 0:.0f} "
        f"{counted}/step, idle {idle:.0%}, sum error {profile.sum_error or 0:+.1%}"
    )
    wrong = []
    if record.cell.device.startswith("cuda") and profile.timeline != "gpu":
        wrong.append(f"the breakdown is of the {profile.timeline or '?'} timeline, not the GPU's")
    if not profile.sums:
        wrong.append(f"the kinds miss the step time by {profile.sum_error or 0:+.1%}")
    if not profile.trace or not Path(profile.trace).is_file():
        wrong.append("no trace kept")
    return line, "; ".join(wrong)


def telemetry_of(record: Record) -> tuple[str, str]:
    """(what the window's telemetry says, what a CUDA trial's lacks: '' when nothing)."""
    conditions = record.conditions
    energy = (
        f"{conditions.energy_j:.1f} J ({conditions.energy_source})"
        if conditions.energy_j is not None
        else f"energy: {conditions.energy_not_measured or 'not measured'}"
    )
    if not record.cell.device.startswith("cuda"):
        return energy, ""
    missing = []
    if conditions.gpu_source != "nvml" or conditions.gpu_samples < 1:
        missing.append(f"GPU samples ({conditions.gpu_source or 'none'}, {conditions.gpu_samples})")
    if conditions.energy_j is None and (conditions.window_s or 0) >= NVML_ENERGY_MIN_WINDOW_S:
        missing.append("energy")
    if conditions.probe_gpu_gemm_s_before is None or conditions.probe_gpu_gemm_s_after is None:
        missing.append("the GPU's machine-speed probe")
    clocks = f"SM {conditions.gpu_sm_mhz_median or 0:.0f} MHz"
    probe = (
        f"probe {conditions.probe_gpu_gemm_s_before * 1e3:.1f}/"
        f"{conditions.probe_gpu_gemm_s_after * 1e3:.1f} ms at "
        f"{conditions.probe_gpu_sm_mhz_after or 0:.0f} MHz"
        if conditions.probe_gpu_gemm_s_before is not None
        and conditions.probe_gpu_gemm_s_after is not None
        else "no probe"
    )
    return f"{conditions.gpu_samples} samples, {clocks}, {energy}, {probe}", ", ".join(missing)


def check_with_aggregation(outcomes: list[Outcome], quiet_required: bool = False) -> None:
    """Give each outcome aggregation's late numerics check (status and reason too, where it
    fails) and its judgement of the trial's conditions, reading the records as the workflow's
    aggregate rule does; with ``quiet_required`` (a GPU node to itself) a fault-free ok trial
    judged perturbed is a complaint."""
    try:
        from ptspeed.analysis.aggregate import load_tables
    except ImportError as error:  # pandas: the host side's, not the cell's
        print(f"note: the late numerics check is left out ({error})")
        return
    written = [o for o in outcomes if o.status != NOT_RUN and o.record and Path(o.record).exists()]
    runs, _ = load_tables(o.record for o in written)
    for outcome, row in zip(written, runs.to_dict("records"), strict=True):
        outcome.late = row["late_check"] or ""
        if row["status"] != outcome.status:
            outcome.status, outcome.reason = row["status"], row["reason"]
        if str(row.get("perturbed")) == "True":  # a nullable boolean: True, False or NA
            outcome.perturbed = row["perturbed_reason"]
            if quiet_required and outcome.expected == "ok" and not outcome.complaint:
                outcome.complaint = f"judged perturbed: {outcome.perturbed}"


def check_in_image(
    device: str, driver_libs: Path = hostenv.APPTAINER_DRIVER_LIBS
) -> Outcome | None:
    """Inside an Apptainer image on a GPU (APPTAINER_CONTAINER set): the driver that --nv bound
    is linkable with -lcuda as Triton 2.0 links its launcher, under the variables the cells'
    workers get (ptspeed.cell.hostenv); None elsewhere."""
    if device != "cuda" or not os.environ.get("APPTAINER_CONTAINER"):
        return None
    started = time.monotonic()
    variables = hostenv.triton_libcuda(driver_libs)
    problem = f"no libcuda.so* in {driver_libs}: run the image with --nv"
    if variables:
        with tempfile.TemporaryDirectory() as scratch:
            problem = hostenv.link_against_libcuda(Path(scratch), {**os.environ, **variables})
    return Outcome("image", "", "triton: link -lcuda", "", "ok", "failed" if problem else "ok",
                   problem, time.monotonic() - started, None, "", "")  # fmt: skip


def print_table(outcomes: list[Outcome]) -> None:
    header = (
        f"{'env':<11} {'torch':<13} {'path':<26} {'status':<18} {'expected':<18} {'s':>5}  "
        f"{'late':<12} {'numerics':<26} telemetry"
    )
    print(header)
    print("-" * len(header))
    for o in outcomes:
        mark = "" if o.as_expected or o.status == NOT_RUN else "   <-- unexpected"
        detail = (
            o.reason if o.status == NOT_RUN else "; ".join(filter(None, [o.telemetry, o.profile]))
        )
        print(
            f"{o.env:<11} {o.torch:<13} {o.path:<26} {o.status:<18} {o.expected:<18} "
            f"{o.seconds:5.0f}  {o.late.split(':')[0]:<12} {o.numerics:<26} {detail}{mark}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--config", type=Path, default=CONFIG, help="whose environments to use")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu-check")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per cell")
    parser.add_argument(
        "--budget-s", type=float, default=DEFAULT_BUDGET_S,
        help="seconds for the whole check: the paths left when it is spent are listed, not run",
    )  # fmt: skip
    parser.add_argument("--envs", default="", help="comma-separated subset of environments")
    parser.add_argument(
        "--paths",
        default="",
        help="comma-separated subset of paths, by slug (amp-bf16, cudagraphs, …), with eager",
    )
    args = parser.parse_args(argv)
    found = interpreters(yaml.safe_load(args.config.read_text()))
    wanted = [name for name in args.envs.split(",") if name] or list(found)
    try:
        paths = chosen_paths(args.paths)
    except ValueError as error:
        print(f"error: paths: {error}")
        return 2
    missing = [env for env in wanted if env not in found]
    if missing:
        print(f"error: envs: {missing[0]!r} is not built (present: {', '.join(found)})")
        return 2
    in_image = check_in_image(args.device)
    outcomes = [in_image] if in_image else []
    signal.signal(signal.SIGTERM, _stop)  # a time limit's TERM: the table is still printed
    try:
        run_paths(args, wanted, found, paths, outcomes)
    except KeyboardInterrupt:
        print("stopped: the table holds the paths that ran", flush=True)
    check_with_aggregation(outcomes, quiet_required=args.device == "cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"device": args.device, "outcomes": [asdict(o) for o in outcomes]}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print()
    print_table(outcomes)
    unexpected = [o for o in outcomes if not o.as_expected and o.status != NOT_RUN]
    for o in unexpected:
        print(f"unexpected: {o.env} {o.path}: {o.status} ({(o.complaint or o.reason)[:300]})")
    ran = [o for o in outcomes if o.status != NOT_RUN]
    print(f"\n{len(ran) - len(unexpected)} of {len(ran)} paths as expected"
          f"{f', {len(outcomes) - len(ran)} not run' if len(ran) < len(outcomes) else ''}; "
          f"summary: {args.out / 'summary.json'}")  # fmt: skip
    return 1 if unexpected else 0


class Budget:
    """The check's seconds, spent path by path: a path is admitted only where its cost,
    scaled by this node's pace so far (seconds taken over seconds estimated), fits in what is
    left."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._begun = time.monotonic()
        self._taken_s = self._estimated_s = 0.0

    def left_s(self) -> float:
        return self.seconds - (time.monotonic() - self._begun)

    def estimate_s(self, path: CheckedPath) -> float:
        pace = self._taken_s / self._estimated_s if self._estimated_s else 1.0
        return path.cost_s * pace

    def spent(self, path: CheckedPath, seconds: float) -> None:
        self._taken_s += seconds
        self._estimated_s += path.cost_s


def run_paths(
    args: argparse.Namespace,
    wanted: list[str],
    found: dict[str, str],
    paths: tuple[CheckedPath, ...],
    outcomes: list[Outcome],
) -> None:
    """Each environment's paths in priority order, within ``args.budget_s``; a path the
    budget or the node's GPUs leave out is listed as not run, saying why."""
    budget = Budget(args.budget_s)
    gpus = len(node_pool().ids) if args.device == "cuda" else 0
    for env in wanted:
        version, torch, python = torch_version(found[env])
        # A build without code for this GPU refuses every cell (ptspeed.cell.gpu_code).
        no_code = gpu_code_reason(found[env]) if args.device == "cuda" else ""
        for path in paths:
            if args.device not in path.devices:
                continue
            expected = (
                "unsupported" if no_code else expected_status(path, args.device, torch, python)
            )
            why_not = left_out(path, args.device, gpus, budget)
            if why_not:
                outcomes.append(Outcome(env, version, path.name, path.knobs, NOT_RUN, NOT_RUN,
                                        why_not, 0.0, None, "", ""))  # fmt: skip
                continue
            timeout_s = min(args.timeout, budget.left_s())
            try:
                record, seconds, killed = run_path(
                    env, found[env], path, args.device, args.out, timeout_s
                )
            except KeyboardInterrupt:  # stopped: a cell that wrote its record still ran
                outcomes.extend(finished_outcome(env, version, path, expected, args.out))
                raise
            budget.spent(path, seconds)
            record_path = record_file(args.out, env, path)
            outcome = outcome_of(env, version, path, expected, record, seconds, record_path)
            if killed:
                outcome.reason = outcome.complaint = killed
            elif record is not None and record.status == "timeout" and timeout_s < args.timeout:
                outcome.status, outcome.expected = NOT_RUN, NOT_RUN
                outcome.reason = (
                    f"the budget cut it: {timeout_s:.0f} s were left of {args.budget_s:.0f} s"
                )
            outcomes.append(outcome)
            print(f"{env} {path.name}: {outcome.status} ({seconds:.0f} s)", flush=True)


def finished_outcome(
    env: str, version: str, path: CheckedPath, expected: str, out_dir: Path
) -> list[Outcome]:
    """The outcome of a path whose cell wrote its record before the check was stopped (its
    process still ending); none where it had not."""
    record_path = record_file(out_dir, env, path)
    if not record_path.exists():
        return []
    return [outcome_of(env, version, path, expected, read_record(record_path), 0.0, record_path)]


def left_out(path: CheckedPath, device: str, gpus: int, budget: Budget) -> str:
    """Why ``path`` is not run ('' when it is): the node's GPUs, or the budget left."""
    if device == "cuda" and path.gpus > max(gpus, 1):
        return f"needs {path.gpus} GPUs, the node has {gpus}"
    estimate_s, left_s = budget.estimate_s(path), budget.left_s()
    if estimate_s > left_s:
        return (
            f"budget: needs about {estimate_s:.0f} s, {max(left_s, 0):.0f} s left of "
            f"{budget.seconds:.0f} s"
        )
    return ""


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
