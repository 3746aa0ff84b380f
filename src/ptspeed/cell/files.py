"""Atomic writes of result files: readers see the old file or the whole new one, never a part;
temporaries of writers that died are found and removed.

Imports under Python 3.10 without torch (the watchdog writes records with it).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from ptspeed.errors import WriteFailed

# The temporary file of an atomic write: a dot-file beside its target, named after the target,
# the host and the writing process, so that a leftover of a writer that died can be told apart
# from the file of one still writing.
TEMPORARY_SUFFIX = ".tmp"
FILE_MODE = 0o666  # what open() asks for; the umask takes its bits away


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one.

    The file gets the mode any new file would (0666 less the umask), not mkstemp's 0600, so that
    colleagues sharing a project directory and a web server can read results. Leftover
    temporaries of this target whose writer has died (a killed cell) are removed first. Raises
    :class:`WriteFailed` (an OSError) when the file cannot be written, leaving nothing.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temporaries(target)
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f"{_temporary_prefix(target)}{os.getpid()}.",
            suffix=TEMPORARY_SUFFIX,
            dir=target.parent,
        )
    except OSError as error:
        raise WriteFailed(f"cannot write {target}: {error.strerror or error}") from error
    try:
        os.fchmod(fd, FILE_MODE & ~_current_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise WriteFailed(f"cannot write {target}: {error.strerror or error}") from error
        raise


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, on_wait: Callable[[], None]) -> Iterator[None]:
    """Hold an advisory lock on ``lock_path`` (created if missing) for the ``with`` block;
    ``on_wait`` runs once when another process holds it, before waiting. The kernel drops the
    lock however its holder ends."""
    with open(lock_path, "a+", encoding="utf-8") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(lock_file, fcntl.LOCK_EX)
        yield


def remove_dead_temporaries(target: Path) -> list[Path]:
    """Remove the temporaries of atomic writes of ``target`` left by processes of this host
    that are gone (a writer killed mid-write); return what was removed."""
    removed = []
    prefix = _temporary_prefix(target)
    for leftover in target.parent.glob(f"{glob.escape(prefix)}*{TEMPORARY_SUFFIX}"):
        writer = leftover.name[len(prefix) :].split(".", 1)[0]
        if writer.isdigit() and not process_exists(int(writer)):
            leftover.unlink(missing_ok=True)
            removed.append(leftover)
    return removed


def _temporary_prefix(target: Path) -> str:
    return f".{target.name}.{_host_label()}."


def _host_label() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def process_exists(pid: int) -> bool:
    """Whether a process of this id runs on this host (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
