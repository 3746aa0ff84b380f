"""The project's exceptions: those raised in one module and caught in another.

Standard library only, so that every side imports it: the cell in a benchmark environment,
the launcher, the workflow and the analysis. Each message is one line that names what is
wrong (a config key, a field, a file) for the user to read as it is.
"""

from __future__ import annotations

REASON_CHARACTERS = 200  # of a library's reason quoted in an unsupported record


class ConfigError(ValueError):
    """The config cannot be run, or lacks what a step needs; the message names the key."""


class BadInput(ValueError):
    """A user-supplied value is not acceptable; the message names the field and the options."""


class InputError(ValueError):
    """A result set that cannot be read or compared; the message names the path and the
    problem."""


class Unsupported(Exception):
    """This torch, device or model cannot run the cell; the message says why."""

    @classmethod
    def because(cls, what: str, error: BaseException) -> Unsupported:
        """``what`` cannot be done, for the reason ``error`` gives (torch's or a library's):
        the first line of its message, shortened (it may print a tensor)."""
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        reason = lines[0] if lines else "no message"
        if len(reason) > REASON_CHARACTERS:
            reason = reason[: REASON_CHARACTERS - 1] + "…"
        return cls(f"{what}: {type(error).__name__}: {reason}")


class WriteFailed(OSError):
    """A file could not be written whole (a full disk, a read-only directory, a quota); no part
    of it was left behind. The message names the file and the system's reason."""


class GpuRequestError(Exception):
    """The cell asks for GPUs this node cannot give; the message says what it has."""


class ResultsInUse(RuntimeError):
    """Another run holds the results directory; the message says which."""


class EnvBuildError(RuntimeError):
    """An environment cannot be built; the message is one line that says what to do."""


class ContainerError(Exception):
    """A build, pull or inspection failed; the message says which command and why."""
