"""The GPU code a PyTorch build carries, and whether it runs on a GPU.

A CUDA build of torch ships machine code (cubins) for some GPU architectures and possibly PTX,
which the driver compiles for newer ones. ``torch._C._cuda_getArchFlags()`` names them without
a GPU, as in ``"sm_37 sm_50 sm_60 sm_70 sm_75 sm_80 sm_86"`` (torch 1.13.1+cu117) or
``"sm_75 sm_80 sm_86 sm_90 compute_90"``. CUDA's rule decides what runs where:

- a cubin for sm_XY runs on a GPU of compute capability X.Z with Z >= Y (same major);
- PTX for compute_XY is compiled by the driver for any capability >= X.Y;
- architecture-specific code (sm_90a, compute_90a) runs on exactly that capability.

A build without code for the cell's GPU fails at its first kernel ("no kernel image is
available"); :func:`device_reason` says so before the cell builds its model, in words a user
can act on. Standard library only at import: torch is passed in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ptspeed.errors import BadInput

Capability = tuple[int, int]  # (major, minor), as torch.cuda.get_device_capability gives it

# Well-known GPUs by compute capability, the first of each capability its usual example.
KNOWN_GPUS: dict[str, Capability] = {
    "K80": (3, 7),
    "P100": (6, 0),
    "V100": (7, 0),
    "T4": (7, 5),
    "A100": (8, 0),
    "A30": (8, 0),
    "A10": (8, 6),
    "A40": (8, 6),
    "RTX 3090": (8, 6),
    "L40S": (8, 9),
    "L4": (8, 9),
    "RTX 4090": (8, 9),
    "H100": (9, 0),
    "H200": (9, 0),
    "GH200": (9, 0),
    "B200": (10, 0),
    "GB200": (10, 0),
    "B300": (10, 3),
    "RTX 5090": (12, 0),
}
# Injected faults (ptspeed.cell.faults) that make the cell's GPU report a capability, sm-90
# for 9.0: one per capability of KNOWN_GPUS. With one, the check runs on the CPU too.
FAKED_GPU_PREFIX = "sm-"
FAKED_GPU_FAULTS = tuple(
    f"{FAKED_GPU_PREFIX}{major}{minor}" for major, minor in dict.fromkeys(KNOWN_GPUS.values())
)

_TOKEN = re.compile(r"(sm|compute)_([0-9]{2,})([af]?)")
_ARCH = re.compile(r"([0-9]+)\.([0-9])(\+PTX)?")
# Letters whose spoken name starts with a vowel: "an A100", "an H100", "an RTX 3090".
_VOWEL_SOUNDING = frozenset("AEFHILMNORSX")


@dataclass(frozen=True)
class GpuCode:
    """The GPU code of one torch build. ``cubins``: architectures with machine code;
    ``ptx``: those with PTX; ``specific``: architecture-specific code (sm_90a), which runs on
    exactly that capability. A CPU-only build has ``cuda_version`` '' and no code."""

    torch_version: str
    cuda_version: str
    cubins: tuple[Capability, ...] = ()
    ptx: tuple[Capability, ...] = ()
    specific: tuple[Capability, ...] = ()

    @classmethod
    def from_torch(cls, torch: Any) -> GpuCode:
        """The code of the imported ``torch`` (no GPU needed; none for a CPU-only build and
        for a ROCm build, whose torch.version.cuda is None)."""
        cuda = torch.version.cuda or ""
        read_flags = getattr(torch._C, "_cuda_getArchFlags", None)
        flags = read_flags() if cuda and read_flags is not None else None
        return cls.from_arch_flags(flags or "", str(torch.__version__), cuda)

    @classmethod
    def from_arch_flags(cls, flags: str, torch_version: str, cuda_version: str) -> GpuCode:
        """Parse ``torch._C._cuda_getArchFlags()``: sm_XY, compute_XY, sm_XYa, sm_XYf …"""
        cubins, ptx, specific = set(), set(), set()
        for token in flags.split():
            match = _TOKEN.fullmatch(token)
            if match is None:
                raise BadInput(f"arch_flags: {token!r} is not sm_XY or compute_XY")
            kind, digits, suffix = match.groups()
            capability = (int(digits[:-1]), int(digits[-1]))
            if suffix == "a":
                specific.add(capability)
            elif kind == "sm" or suffix == "f":  # family PTX JITs within its major: a cubin's rule
                cubins.add(capability)
            else:
                ptx.add(capability)
        return cls(
            torch_version, cuda_version, *(tuple(sorted(s)) for s in (cubins, ptx, specific))
        )

    @classmethod
    def from_arch_list(cls, arch_list: str, torch_version: str, cuda_version: str) -> GpuCode:
        """Parse a TORCH_CUDA_ARCH_LIST as PyTorch's build scripts set it: '7.5;8.0;8.6+PTX'."""
        cubins, ptx = [], []
        for entry in arch_list.replace(";", " ").split():
            match = _ARCH.fullmatch(entry)
            if match is None:
                raise BadInput(f"TORCH_CUDA_ARCH_LIST: {entry!r} is not X.Y or X.Y+PTX")
            capability = (int(match[1]), int(match[2]))
            cubins.append(capability)
            if match[3]:
                ptx.append(capability)
        return cls(torch_version, cuda_version, tuple(sorted(cubins)), tuple(sorted(ptx)))

    @property
    def arch_flags(self) -> str:
        """The code in ``torch._C._cuda_getArchFlags()``'s words."""
        words = [f"sm_{arch_digits(c)}" for c in self.cubins]
        words += [f"sm_{arch_digits(c)}a" for c in self.specific]
        words += [f"compute_{arch_digits(c)}" for c in self.ptx]
        return " ".join(words)

    def to_json(self) -> dict[str, str]:
        """The JSON object of this code (:meth:`from_json` reads it back)."""
        return {
            "torch_version": self.torch_version,
            "cuda_version": self.cuda_version,
            "arch_flags": self.arch_flags,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuCode:
        """The code in a :meth:`to_json` object; :class:`BadInput` names a bad field."""
        if not isinstance(data, Mapping):
            raise BadInput(f"gpu_code: must be an object, not {type(data).__name__}")
        fields = {}
        for name in ("torch_version", "cuda_version", "arch_flags"):
            value = data.get(name)
            if not isinstance(value, str):
                raise BadInput(f"gpu_code.{name}: must be a string, not {value!r}")
            fields[name] = value
        try:
            return cls.from_arch_flags(
                fields["arch_flags"], fields["torch_version"], fields["cuda_version"]
            )
        except BadInput as error:
            raise BadInput(f"gpu_code.{error}") from None

    def runs_on(self, capability: Capability) -> bool:
        """Whether this code runs on a GPU of ``capability`` (CUDA's rule)."""
        major, minor = capability
        return (
            any(m == major and n <= minor for m, n in self.cubins)
            or any(c <= capability for c in self.ptx)
            or capability in self.specific
        )

    def architectures(self) -> tuple[Capability, ...]:
        """Every capability this build has code for, oldest first."""
        return tuple(sorted({*self.cubins, *self.ptx, *self.specific}))


def arch_digits(capability: Capability) -> str:
    """'90' for (9, 0), '100' for (10, 0): how CUDA spells an architecture."""
    return f"{capability[0]}{capability[1]}"


def gpu_named(capability: Capability) -> str:
    """The first well-known GPU of ``capability`` ('' when there is none)."""
    return next((name for name, c in KNOWN_GPUS.items() if c == capability), "")


def faked_capability(fault: str) -> Capability | None:
    """The capability an ``sm-XY`` fault makes the cell's GPU report (None for other faults)."""
    if fault not in FAKED_GPU_FAULTS:
        return None
    digits = fault.removeprefix(FAKED_GPU_PREFIX)
    return int(digits[:-1]), int(digits[-1])


def unsupported_reason(code: GpuCode, capability: Capability, device_name: str = "") -> str:
    """Why ``code`` cannot run on a GPU of ``capability`` named ``device_name``, and what to
    do instead; '' when it can."""
    if code.runs_on(capability):
        return ""
    where = f"sm_{arch_digits(capability)}" + (f" ({device_name})" if device_name else "")
    architectures = code.architectures()
    if not architectures:
        return (
            f"torch {code.torch_version} has no GPU code (a CPU-only build), so it cannot run "
            f"on {where} — install a CUDA build of torch in this environment"
        )
    if capability > architectures[-1]:
        has = f"its newest is sm_{arch_digits(architectures[-1])}"
        wanted = f"a GPU of compute capability {_newest_major_phrase(code, architectures[-1][0])}"
    elif capability < architectures[0]:
        has = f"its oldest is sm_{arch_digits(architectures[0])}"
        wanted = f"a GPU of compute capability {_dotted(architectures[0])} or newer"
    else:
        has = "its code is for " + " ".join(f"sm_{arch_digits(c)}" for c in architectures)
        wanted = "a GPU of one of those"
    advice = f"run this environment on {wanted}{_example_gpu(code, capability)}"
    return f"torch {code.torch_version} has no code for {where}; {has} — {advice}"


def device_reason(torch: Any, device: Any, fault: str = "") -> str:
    """Why the imported ``torch`` cannot run on ``device``'s GPU ('' when it can, and for a
    device that is no CUDA GPU or a ROCm build). An ``sm-XY`` fault fakes the GPU's
    capability, also on the CPU, so that the check can be tested without a GPU."""
    faked = faked_capability(fault)
    if faked is None and getattr(device, "type", "") != "cuda":
        return ""
    if getattr(torch.version, "hip", None):
        return ""  # CUDA's rule does not describe a ROCm build
    if faked is not None:
        capability, name = faked, f"NVIDIA {gpu_named(faked)}, faked by fault {fault}"
    else:
        major, minor = torch.cuda.get_device_capability(device)
        capability, name = (major, minor), torch.cuda.get_device_name(device)
    return unsupported_reason(GpuCode.from_torch(torch), capability, name)


# TORCH_CUDA_ARCH_LIST of PyTorch's Linux x86_64 wheels, by torch version with its local tag:
# pytorch/builder's manywheel/build_cuda.sh, branch release/1.13 (CUDA 11.x: 3.7 to 8.6) and
# release/2.0 (11.7 as 1.13; 11.8 adds 9.0), none with PTX; 2.14.1+cu130 as the wheel itself
# reports (torch._C._cuda_getArchFlags(), measured). Each also checked against the installed
# wheel where this project has one (tests/test_gpu_code.py).
_PUBLISHED_ARCH_LISTS = {
    "1.13.1+cu117": ("11.7", "3.7;5.0;6.0;7.0;7.5;8.0;8.6"),
    "2.0.1+cu117": ("11.7", "3.7;5.0;6.0;7.0;7.5;8.0;8.6"),
    "2.0.1+cu118": ("11.8", "3.7;5.0;6.0;7.0;7.5;8.0;8.6;9.0"),
    "2.14.1+cu130": ("13.0", "7.5;8.0;8.6;9.0;10.0;12.0"),
}
PUBLISHED_VERSIONS = tuple(_PUBLISHED_ARCH_LISTS)


def published_code(torch_version: str) -> GpuCode | None:
    """The GPU code of the published build ``torch_version`` ('2.0.1+cu118'; '+cpu': none),
    known before any environment is built; None for a build this table does not know."""
    if torch_version.endswith("+cpu"):
        return GpuCode(torch_version, "")
    if torch_version not in _PUBLISHED_ARCH_LISTS:
        return None
    cuda, arch_list = _PUBLISHED_ARCH_LISTS[torch_version]
    return GpuCode.from_arch_list(arch_list, torch_version, cuda)


def _dotted(capability: Capability) -> str:
    return f"{capability[0]}.{capability[1]}"


def _newest_major_phrase(code: GpuCode, major: int) -> str:
    """'8.x', or '8.6 or a later 8.x' where the oldest code of that major is 8.6."""
    oldest = min(c for c in code.architectures() if c[0] == major)
    return f"{major}.x" if oldest[1] == 0 else f"{_dotted(oldest)} or a later {major}.x"


def _example_gpu(code: GpuCode, capability: Capability) -> str:
    """' (e.g. an A100)': the well-known GPU nearest below ``capability`` whose major has code
    (after a GPU that is too new), else the oldest that runs it; '' when none does."""
    runnable = [(c, name) for name, c in KNOWN_GPUS.items() if code.runs_on(c)]
    if not runnable:
        return ""
    older = [(c, name) for c, name in runnable if c < capability]
    if older and capability > code.architectures()[-1]:
        newest_major = max(c[0] for c, _ in older)
        candidates = [(c, name) for c, name in older if c[0] == newest_major]
    else:
        candidates = runnable
    name = min(candidates, key=lambda pair: pair[0])[1]  # the first in the table of its capability
    article = "an" if name[0] in _VOWEL_SOUNDING else "a"
    return f" (e.g. {article} {name})"
