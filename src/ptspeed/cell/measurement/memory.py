"""Telling an out-of-memory error apart, in any torch version and on any device."""

from __future__ import annotations

import torch


def is_out_of_memory(exc: BaseException) -> bool:
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if isinstance(exc, MemoryError) or (oom_type is not None and isinstance(exc, oom_type)):
        return True
    message = str(exc).lower()
    return "out of memory" in message or "can't allocate memory" in message
