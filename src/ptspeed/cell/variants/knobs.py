"""Variants as composable knobs.

A variant is written as knobs joined by ``+``, each ``name`` or ``name=value``::

    eager                      nothing on: the reference
    compile                    torch.compile, default mode, inductor backend
    compile=max-autotune+backend=aot_eager
    amp                        autocast: fp16 with GradScaler on CUDA, bf16 on CPU
    amp=bf16 | amp=fp16
    channels_last              NHWC weights and inputs (image models)
    cudagraphs                 whole-step CUDA graph capture (CUDA, no compile)
    loader=N                   DataLoader over host tensors with N workers, copied each step
    pin                        pinned host memory and non-blocking copies (with loader, CUDA)
    memfrac=F                  torch.cuda.set_per_process_memory_fraction(F) (CUDA)
    ddp                        DistributedDataParallel over several processes (torchrun)
    fsdp                       FullyShardedDataParallel (the whole model as one unit)
    fsdp=offload               FSDP with CPUOffload(offload_params=True) (CUDA)
    procs=N                    processes of ddp/fsdp, 1 to 64 (default 2)
    tf32=on|off                TF32 in matmuls and cuDNN convolutions (CUDA; default: what the
                               torch version does, recorded in provenance)
    cudnn_benchmark[=on|off]   cuDNN autotuning of convolution algorithms (CUDA; default: off)
    modelpar=N                 model parallelism: the model's layers cut into N consecutive stages,
                               one process (device) each, one micro-batch at a time (naive)
    pipeline=N                 the same N stages run as a GPipe pipeline over chunks micro-batches
    chunks=M                   micro-batches of a pipeline, 1 to 1024 (default 2; batch_size >= M)
    jit=script|trace           TorchScript: torch.jit.script, or torch.jit.trace of the model's
                               first call; infer mode also torch.jit.freeze and
                               torch.jit.optimize_for_inference; train mode trains the
                               TorchScript module (its backward), unfrozen. Not with compile or
                               cudagraphs
    attn=sdpa|eager            transformers' attention implementation (bert-base, gpt2): fused
                               torch scaled_dot_product_attention or the plain matmul-softmax
                               one; default: what transformers picks for this torch (recorded
                               as metrics.attn_implementation)
    prefetch                   copy batch k+1 to the device on a side CUDA stream while step k
                               runs (with loader and pin; CUDA)
    prefetch_factor=K          batches each loader worker prepares ahead, 1 to 64 (DataLoader's
                               prefetch_factor; with loader=N, N >= 1; default: torch's, 2)
    persistent                 loader workers outlive an epoch (DataLoader's persistent_workers;
                               with loader=N, N >= 1; default: off, as in torch). The loader
                               serves the whole cell as one epoch, so the measured steps never
                               cross an epoch boundary: this changes no measured step time

Distributed variants (ddp, fsdp) run N processes started by torchrun: NCCL on CUDA (one GPU
per process), gloo on the CPU (the cell's threads divided among them). Every process trains
on the same seeded batch, so batch_size is per process, the trajectory is that of eager on
one process (and is checked against it), and the throughput is the global one:
procs x batch_size x steps / the slowest process's wall time. Recorded as unsupported: fsdp
on the CPU before torch 2.1 (it fails in 1.13.1 and 2.0.1, runs in 2.14.1); fsdp=offload off
CUDA (FSDP pins the offloaded shards); fsdp with fp16 AMP (needs ShardedGradScaler); ddp or
fsdp with cudagraphs; on CUDA, procs=N with fewer than N visible GPUs.

Staged variants (modelpar, pipeline) also run N processes under torchrun, rank r holding stage
r (cuda:r, or the CPU over gloo): the model's layers (see :mod:`ptspeed.cell.parallelism.stages`)
are cut into N consecutive stages balanced by parameter count, activations go forward and gradients
back with send/recv, and pipeline runs a GPipe schedule (every micro-batch's forward, then every
backward, gradients accumulated). batch_size is the whole batch, split into the micro-batches;
the throughput is batch_size x steps / the slowest stage's wall time; the split is recorded
(metrics.stage_split). Refused when parsed: a staged variant with ddp, fsdp or procs, with
compile, cudagraphs or jit (untested per stage), and chunks without pipeline. Recorded as
unsupported: fp16 AMP (no GradScaler across stages), a model without layers to cut
(mask-rcnn), more stages than layers.
TorchScript, attention and prefetching (tried on the CPU in torch 1.13.1, 2.0.1 and 2.14.1,
transformers 4.46.3 in all three): a model TorchScript cannot take is unsupported with torch's
reason (BERT and GPT-2 do not script; BERT traces from torch 2.0, whose torch.jit.trace takes
keyword inputs; GPT-2 does not trace: its output holds the attention cache beside the logits);
jit with amp in infer mode (the optimised module ignores autocast) and jit with ddp or fsdp are
unsupported. attn=sdpa needs torch >= 2.1.1 in transformers 4.46.3 (unsupported with its reason
in 1.13.1 and 2.0.1, where its default is eager; in 2.14.1 the default is sdpa). attn on a
model without transformers' attention, and prefetch off CUDA (no host-to-device copy to
overlap), are unsupported. The numerics gate compares jit variants with eager, and attn
variants with eager with transformers' eager attention; on CUDA, where TorchScript's fusers and
SDPA's kernels draw their own dropout masks, it allows for other masks as it does for compiled
variants. A compiled cell records what the compiler did where the torch version exposes it
(metrics.compiled_graphs, graph_breaks and their reasons, recompilations, compile time by phase).

This module needs no torch: parsing happens before any process imports it. What a given
torch and device can do is decided by :func:`ptspeed.cell.variants.support.unsupported_reason`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ptspeed.errors import BadInput

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
AMP_DTYPES = ("auto", "fp16", "bf16")
FSDP_OPTIONS = ("offload",)
DEFAULT_PROCESSES = 2
MAX_PROCESSES = 64
# Tried with 2 gloo processes: FSDP fails on the CPU in 1.13.1 and 2.0.1 ("Found no NVIDIA
# driver"), runs in 2.14.1 (given device_id=cpu). CPU support landed in mid-2023 (pytorch#103171).
FSDP_ON_CPU_SINCE = (2, 1)
JIT_MODES = ("script", "trace")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
MAX_PREFETCH_FACTOR = 64
KNOB_NAMES = (
    "eager",
    "compile",
    "backend",
    "amp",
    "channels_last",
    "cudagraphs",
    "loader",
    "pin",
    "memfrac",
    "ddp",
    "fsdp",
    "procs",
    "tf32",
    "cudnn_benchmark",
    "jit",
    "attn",
    "prefetch",
    "prefetch_factor",
    "persistent",
    *("modelpar", "pipeline", "chunks"),  # staged variants (ptspeed.cell.parallelism.stages)
)
SWITCH_VALUES = ("on", "off")
_NAME_PATTERN = re.compile(r"[a-z0-9_]+(=[a-z0-9_.-]+)?")  # fullmatch: "$" would allow "\n"


@dataclass(frozen=True)
class Knobs:
    compile_mode: str | None = None
    compile_backend: str = "inductor"
    amp: str | None = None
    channels_last: bool = False
    cudagraphs: bool = False
    loader_workers: int | None = None
    pin_memory: bool = False
    memory_fraction: float | None = None
    parallel: str | None = None  # "ddp" or "fsdp"
    cpu_offload: bool = False
    processes: int = 1
    tf32: bool | None = None  # None: the torch version's default
    cudnn_benchmark: bool | None = None
    jit: str | None = None  # "script" or "trace"
    attn: str | None = None  # None: transformers' default for this torch
    prefetch: bool = False
    prefetch_factor: int | None = None  # None: DataLoader's default
    persistent_workers: bool = False
    chunks: int = 1  # micro-batches of a staged variant (parallel modelpar or pipeline)

    @property
    def is_eager_fp32(self) -> bool:
        return self == Knobs()

    def draws_own_random(self, device_type: str) -> bool:
        """Whether the step's random ops (dropout) may draw other numbers than eager's from the
        same generator state: compiled and captured graphs; on CUDA also TorchScript's fusers
        and SDPA's fused kernels. On the CPU, TorchScript and SDPA (its math path) draw eager's
        dropout masks: their losses equal eager's (tried in 2.14.1)."""
        fused_on_cuda = device_type == "cuda" and (self.jit is not None or self.attn == "sdpa")
        return self.compile_mode is not None or self.cudagraphs or fused_on_cuda

    @property
    def reference_attention(self) -> str | None:
        """The attention of the eager reference: transformers' eager one where the variant
        chooses one (attn=sdpa is then checked against the plain implementation), else the
        default, as the variant runs."""
        return ATTENTION_IMPLEMENTATIONS[1] if self.attn else None

    @property
    def world_size(self) -> int:
        """Processes the cell runs as: ``procs`` for ddp/fsdp, the stages of modelpar/pipeline,
        else 1."""
        return self.processes if self.parallel else 1

    def precision(self, device_type: str) -> str:
        """fp32, fp16 or bf16: the precision the step computes in on ``device_type``."""
        if self.amp is None:
            return "fp32"
        if self.amp == "auto":
            return "fp16" if device_type == "cuda" else "bf16"
        return self.amp


def parse_knobs(text: str) -> Knobs:
    """Parse a variant's knob string; raise :class:`BadInput` naming the bad part."""
    if not text or not text.strip():
        raise BadInput(f"knobs: empty (accepted knobs: {', '.join(KNOB_NAMES)})")
    settings: dict[str, object] = {}
    seen: set[str] = set()
    for token in text.strip().split("+"):
        if not _NAME_PATTERN.fullmatch(token):
            raise BadInput(f"knobs: {token!r} is not name or name=value (in {text!r})")
        name, _, value = token.partition("=")
        if name in seen:
            raise BadInput(f"knobs: {name!r} given twice in {text!r}")
        seen.add(name)
        settings.update(_parse_one(name, value))
    if "compile_backend" in settings and "compile_mode" not in settings:
        raise BadInput(f"knobs: backend= needs compile in {text!r}")
    if settings.get("pin_memory") and "loader_workers" not in settings:
        raise BadInput(f"knobs: pin needs loader in {text!r} (pinning applies to host batches)")
    if "eager" in seen and len(seen) > 1:
        raise BadInput(f"knobs: eager cannot be combined with other knobs in {text!r}")
    _check_jit(seen, text)
    _check_loader(seen, settings, text)
    _check_distributed(seen, settings, text)
    return Knobs(**settings)  # type: ignore[arg-type]


def _check_jit(seen: set[str], text: str) -> None:
    for other in ("compile", "cudagraphs"):
        if {"jit", other} <= seen:
            raise BadInput(f"knobs: jit and {other} cannot be combined in {text!r} (choose one)")


def _check_loader(seen: set[str], settings: dict[str, object], text: str) -> None:
    if "prefetch" in seen and not settings.get("pin_memory"):
        raise BadInput(f"knobs: prefetch needs loader=N and pin in {text!r}")
    workers = settings.get("loader_workers")
    for name in ("prefetch_factor", "persistent"):
        if name in seen and not (isinstance(workers, int) and workers >= 1):
            raise BadInput(
                f"knobs: {name} needs loader=N with N >= 1 workers in {text!r} "
                "(it acts on the DataLoader's worker processes)"
            )


def _check_distributed(seen: set[str], settings: dict[str, object], text: str) -> None:
    if {"ddp", "fsdp"} <= seen:
        raise BadInput(f"knobs: ddp and fsdp cannot be combined in {text!r} (choose one)")
    if "procs" in seen and "parallel" not in settings:
        raise BadInput(f"knobs: procs needs ddp or fsdp in {text!r}")
    if "parallel" in settings:
        settings.setdefault("processes", DEFAULT_PROCESSES)
    _check_staged(seen, settings, text)


# --- staged variants: modelpar=N, pipeline=N+chunks=M ---
STAGED = ("modelpar", "pipeline")
DEFAULT_CHUNKS = 2
MAX_CHUNKS = 1024
STAGED_REFUSED = ("ddp", "fsdp", "procs", "compile", "cudagraphs", "jit")


def _check_staged(seen: set[str], settings: dict[str, object], text: str) -> None:
    staged = seen & set(STAGED)
    if "chunks" in seen and "pipeline" not in seen:
        raise BadInput(f"knobs: chunks needs pipeline in {text!r} (e.g. pipeline=2+chunks=4)")
    if not staged:
        return
    others = [name for name in STAGED_REFUSED if name in seen]
    if len(staged) > 1:
        raise BadInput(f"knobs: modelpar and pipeline cannot be combined in {text!r} (choose one)")
    if others:
        what = f"{min(staged)} with {others[0]}"
        raise BadInput(f"knobs: {what} is not supported in {text!r} ({_STAGED_WHY[others[0]]})")
    if "pipeline" in staged:
        settings.setdefault("chunks", DEFAULT_CHUNKS)


_STAGED_WHY = {
    "ddp": "one process per stage, no data parallelism across stages",
    "fsdp": "one process per stage, no data parallelism across stages",
    "procs": "the stage count is the process count: modelpar=N or pipeline=N",
    "compile": "compiling each stage is untested",
    "cudagraphs": "capturing send/recv between stages is untested",
    "jit": "TorchScript of each stage is untested",
}


def _parse_staged(name: str, value: str) -> dict[str, object]:
    if name == "chunks":
        return {"chunks": _integer(name, value, minimum=1, maximum=MAX_CHUNKS)}
    return {"parallel": name, "processes": _integer(name, value, minimum=1, maximum=MAX_PROCESSES)}


def _parse_one(name: str, value: str) -> dict[str, object]:
    if name == "eager":
        return _flag(name, value, {})
    if name == "compile":
        return {"compile_mode": _choice(name, value or "default", COMPILE_MODES)}
    if name == "backend":
        if not value:
            raise BadInput("knobs: backend needs a value, e.g. backend=inductor")
        return {"compile_backend": value}
    if name == "amp":
        return {"amp": _choice(name, value or "auto", AMP_DTYPES)}
    if name in ("channels_last", "cudagraphs"):
        return _flag(name, value, {name: True})
    if name == "pin":
        return _flag(name, value, {"pin_memory": True})
    if name == "loader":
        return {"loader_workers": _integer(name, value or "0", minimum=0, maximum=64)}
    if name == "memfrac":
        return {"memory_fraction": _fraction(value)}
    if name == "ddp":
        return _flag(name, value, {"parallel": "ddp"})
    if name == "fsdp":
        offload = bool(value) and _choice(name, value, FSDP_OPTIONS) == "offload"
        return {"parallel": "fsdp", "cpu_offload": offload}
    if name == "procs":
        return {"processes": _integer(name, value, minimum=1, maximum=MAX_PROCESSES)}
    if name == "tf32":
        return {"tf32": _choice(name, value, SWITCH_VALUES) == "on"}
    if name == "cudnn_benchmark":
        return {"cudnn_benchmark": _choice(name, value or "on", SWITCH_VALUES) == "on"}
    if name in (*STAGED, "chunks"):
        return _parse_staged(name, value)
    return _parse_code_or_input(name, value)


def _parse_code_or_input(name: str, value: str) -> dict[str, object]:
    """The knobs of the model's code (jit, attn) and of its input pipeline."""
    if name == "jit":
        return {"jit": _choice(name, value, JIT_MODES)}
    if name == "attn":
        return {"attn": _choice(name, value, ATTENTION_IMPLEMENTATIONS)}
    if name == "prefetch":
        return _flag(name, value, {"prefetch": True})
    if name == "prefetch_factor":
        return {"prefetch_factor": _integer(name, value, minimum=1, maximum=MAX_PREFETCH_FACTOR)}
    if name == "persistent":
        return _flag(name, value, {"persistent_workers": True})
    raise BadInput(f"knobs: unknown knob {name!r} (accepted: {', '.join(KNOB_NAMES)})")


def _flag(name: str, value: str, result: dict[str, object]) -> dict[str, object]:
    if value:
        raise BadInput(f"knobs: {name} takes no value (got {name}={value})")
    return result


def _choice(name: str, value: str, accepted: tuple[str, ...]) -> str:
    if value not in accepted:
        raise BadInput(f"knobs: {name}={value} is not one of {', '.join(accepted)}")
    return value


def _integer(name: str, value: str, minimum: int, maximum: int) -> int:
    if not value.isdigit() or not minimum <= int(value) <= maximum:
        raise BadInput(f"knobs: {name}={value} must be an integer from {minimum} to {maximum}")
    return int(value)


def _fraction(value: str) -> float:
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0.0 < fraction <= 1.0:
        raise BadInput(f"knobs: memfrac={value} must be a number in (0, 1], e.g. memfrac=0.8")
    return fraction


def threads_per_process(requested: int, world_size: int) -> int:
    """The cell's CPU threads (0: every CPU this process may use) shared out among its ranks."""
    total = requested or len(os.sched_getaffinity(0))
    return max(1, total // world_size)
