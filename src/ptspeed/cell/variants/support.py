"""What a given torch, device, Python and model can run of a variant's knobs: the reason a
cell is recorded as unsupported ('' where it can run), decided before the step is built.

Needs no torch: the versions and the device type are passed in.
"""

from __future__ import annotations

from typing import Any

from ptspeed.cell.variants.knobs import FSDP_ON_CPU_SINCE, STAGED, Knobs


def unsupported_reason(
    knobs: Knobs,
    device_type: str,
    torch_version: tuple[int, int],
    python: tuple[int, int],
    image_model: bool,
    attention_model: bool = False,
    ragged_output: bool = False,
    sdpa_mask_check: bool = False,
) -> str:
    """Why this torch on this device cannot run ``knobs`` ('' when it can); ``attention_model``:
    the model has transformers' attention implementations (the attn knob); ``ragged_output``:
    its outputs have data-dependent shapes (detections); ``sdpa_mask_check``: its SDPA path
    checks the attention mask on the host (transformers' BERT).

    These are limits of PyTorch itself, known before running anything; the cell is then
    recorded as ``unsupported`` with this reason instead of crashing. What only trying can
    tell (a model TorchScript cannot take, SDPA in an old transformers stack) is found when
    the model is built or first called.
    """
    return (
        _compile_reason(knobs, torch_version, python)
        or _cuda_only_reason(knobs, device_type)
        or _cudagraphs_reason(knobs, device_type, torch_version, ragged_output, sdpa_mask_check)
        or _model_reason(knobs, image_model, attention_model)
        or _distributed_reason(knobs, device_type, torch_version)
    )


def _compile_reason(knobs: Knobs, torch_version: tuple[int, int], python: tuple[int, int]) -> str:
    """Why this torch and Python cannot compile as ``knobs`` ask ('' when they can)."""
    if knobs.compile_mode is None:
        return ""
    version = ".".join(map(str, torch_version))
    if torch_version < (2, 0):
        return f"torch.compile needs PyTorch >= 2.0 (this environment has {version})"
    if torch_version < (2, 1) and python >= (3, 11):
        return "torch.compile in PyTorch 2.0 supports Python <= 3.10"
    if knobs.cudagraphs:
        return "cudagraphs with compile: use compile=reduce-overhead instead"
    if knobs.compile_mode == "max-autotune-no-cudagraphs" and torch_version < (2, 1):
        return (
            "compile=max-autotune-no-cudagraphs needs PyTorch >= 2.1 (torch.compile in "
            f"{version} knows default, reduce-overhead and max-autotune)"
        )
    return ""


def _cuda_only_reason(knobs: Knobs, device_type: str) -> str:
    """The first knob of ``knobs`` that only CUDA has, on another device ('' when none)."""
    if device_type == "cuda":
        return ""
    cuda_only = {
        "prefetch (host-to-device copies on a side CUDA stream; the CPU has none to "
        "overlap)": knobs.prefetch,
        "cudagraphs": knobs.cudagraphs,
        "pin (pinned host memory)": knobs.pin_memory,
        "memfrac (set_per_process_memory_fraction)": knobs.memory_fraction is not None,
        "amp=fp16 (fp16 autocast with GradScaler)": knobs.precision(device_type) == "fp16",
        "tf32 (TF32 matmuls and convolutions)": knobs.tf32 is not None,
        "cudnn_benchmark (cuDNN autotuning)": knobs.cudnn_benchmark is not None,
    }
    for what, wanted in cuda_only.items():
        if wanted:
            return f"{what} needs a CUDA device (this cell runs on {device_type})"
    return ""


def _cudagraphs_reason(
    knobs: Knobs,
    device_type: str,
    torch_version: tuple[int, int],
    ragged_output: bool,
    sdpa_mask_check: bool,
) -> str:
    """Why a whole-step CUDA graph cannot capture this cell's step ('' when it can)."""
    if not knobs.cudagraphs:
        return ""
    if knobs.precision(device_type) == "fp16":
        return (
            "cudagraphs with fp16 AMP: GradScaler synchronises with the host and cannot be captured"
        )
    if (knobs.loader_workers or knobs.pin_memory) and torch_version < (2, 1):
        return (
            "cudagraphs with a DataLoader or pinned memory needs PyTorch >= 2.1: the loader's "
            "threads call CUDA during the capture, which only capture_error_mode='thread_local' "
            f"(2.1) allows ({'.'.join(map(str, torch_version))})"
        )
    if ragged_output:
        return (
            "cudagraphs: the model's shapes depend on its data (proposals, detections), and a "
            "CUDA graph replays fixed shapes"
        )
    if sdpa_mask_check and torch_version >= (2, 1) and knobs.attn != "eager":
        return (
            "cudagraphs with transformers' SDPA attention: its attention-mask check reads the "
            "device from the host, which a CUDA graph capture forbids; use attn=eager"
        )
    return ""


def _model_reason(knobs: Knobs, image_model: bool, attention_model: bool) -> str:
    """Why the model's kind does not take a model-level knob ('' when it does)."""
    if knobs.channels_last and not image_model:
        return "channels_last applies to image models (4-D inputs) only"
    if knobs.attn and not attention_model:
        return "attn applies to models with transformers' attention (the text models) only"
    return ""


def unsupported_for_model(
    knobs: Knobs,
    device_type: str,
    torch_version: tuple[int, int],
    python: tuple[int, int],
    model_spec: Any,
) -> str:
    """:func:`unsupported_reason` for a model of the zoo (a ptspeed.models.ModelSpec)."""
    return unsupported_reason(
        knobs,
        device_type,
        torch_version,
        python,
        model_spec.image_model,
        attention_model=model_spec.attention is not None,
        ragged_output=model_spec.ragged_output,
        sdpa_mask_check=model_spec.sdpa_mask_check,
    )


def _distributed_reason(knobs: Knobs, device_type: str, torch_version: tuple[int, int]) -> str:
    if knobs.parallel is None:
        return ""
    if knobs.jit:
        return f"jit with {knobs.parallel}: ptspeed makes TorchScript of single-process models only"
    if knobs.cudagraphs:
        return (
            f"cudagraphs with {knobs.parallel}: ptspeed captures single-process steps only "
            "(capturing collectives needs the model wrapped on the capture stream)"
        )
    if knobs.parallel in STAGED and knobs.precision(device_type) == "fp16":
        return (
            f"{knobs.parallel} with fp16 AMP: ptspeed's stages have no GradScaler across them "
            "(one scale for every stage's gradients): use amp=bf16"
        )
    if knobs.parallel != "fsdp":
        return ""
    if knobs.channels_last:
        return (
            "fsdp with channels_last: FSDP's flat parameters give the weights back in NCHW "
            "(contiguous) layout, so the cell would measure layout conversions in every step"
        )
    version = ".".join(map(str, torch_version))
    if device_type != "cuda" and knobs.cpu_offload:
        return (
            "fsdp=offload needs a CUDA device: FSDP pins the offloaded shards in page-locked "
            f"memory, which needs CUDA (this cell runs on {device_type})"
        )
    if device_type != "cuda" and torch_version < FSDP_ON_CPU_SINCE:
        since = ".".join(map(str, FSDP_ON_CPU_SINCE))
        return f"fsdp on the CPU needs PyTorch >= {since} (FSDP in {version} needs CUDA)"
    if knobs.precision(device_type) == "fp16":
        return (
            "fsdp with fp16 AMP needs ShardedGradScaler (each process holds a shard of the "
            "gradients) and ptspeed's fp16 step uses GradScaler: use amp=bf16"
        )
    return ""
