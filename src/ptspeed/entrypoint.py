"""How the project's commands end on an error: one ``error:`` line on stderr and an exit status,
never a traceback for what a user can mend (a file, a value, an environment, an image).

The workflow's scripts, the developer tools in scripts/ and ``python -m ptspeed`` share it.
Standard library only: the cell command imports it inside a benchmark environment.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from ptspeed.errors import (
    ContainerError,
    EnvBuildError,
    GpuRequestError,
    ResultsInUse,
    Unsupported,
)

EXIT_BAD_INPUT = 2
# What a command expects to go wrong: a file it cannot read or write (OSError, WriteFailed), a
# value it cannot take (ValueError, ConfigError, BadInput, InputError), and the rest of the
# project's own errors.
PROJECT_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    ValueError,
    EnvBuildError,
    ContainerError,
    GpuRequestError,
    ResultsInUse,
    Unsupported,
)


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as bad input: one ``error:`` line naming the argument, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"error: {message}\n")


@contextmanager
def one_line_errors(
    *expected: type[Exception],
    about: str = "",
    status: int = EXIT_BAD_INPUT,
    unexpected: bool = False,
) -> Iterator[None]:
    """End the command on an error of ``expected`` (the project's errors where none are named)
    raised in the block: ``error: ABOUT: MESSAGE`` on stderr, then SystemExit(status).
    ``unexpected``: any other Exception too, as ``error: unexpected TYPE: MESSAGE`` (a bug, but
    one line for the user of a command that must never show a traceback); without it such an
    exception goes on up, as do KeyboardInterrupt and SystemExit."""
    caught = expected or PROJECT_ERRORS
    try:
        yield
    except caught as error:
        _exit(f"{about}: {error}" if about else str(error), status)
    except Exception as error:
        if not unexpected:
            raise
        _exit(f"unexpected {type(error).__name__}: {error}", status)


def _exit(message: str, status: int) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(status) from None
