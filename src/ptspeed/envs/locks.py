"""What a hash-locked requirements file (``envs/*.txt``) pins a package to: the one reading of a
lock's pins, for the venv build's version check, the container images' build arguments and the
GPU code of a lock's published torch.

A lock pins a package from PyPI (``torch==2.0.1``, or a local version ``torch==2.0.1+cu118``) or
as one wheel by URL (``torch @ https://download.pytorch.org/whl/cu118/torch-2.0.1%2Bcu118-cp310-
cp310-linux_x86_64.whl``), whose version is that of the wheel's file name, URL-decoded
(``2.0.1+cu118``: what the installed package reports as its ``__version__``).
Standard library only: this runs in the orchestrating interpreter, which has no torch.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

# name[extras]==version, or name[extras] @ url; a comment line does not start with a name.
_REQUIREMENT = re.compile(
    r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*(?:==\s*([^\s;\\]+)|@\s*([^\s;\\]+))"
)


def locked_version(lock_text: str, package: str) -> str | None:
    """The version that the lock ``lock_text`` (a lock file's content) pins ``package`` to:
    ``2.0.1`` for ``torch==2.0.1``, ``2.0.1+cu118`` for ``torch==2.0.1+cu118`` and for
    ``torch @ https://…/torch-2.0.1%2Bcu118-cp310-cp310-linux_x86_64.whl``. None when the lock
    does not pin ``package``, or pins it by a URL that is not a wheel of that name."""
    wanted = normalise_name(package)
    for line in lock_text.splitlines():
        match = _REQUIREMENT.match(line)
        if match is None or normalise_name(match[1]) != wanted:
            continue
        return match[2] if match[2] else _wheel_version(match[3], wanted)
    return None


def normalise_name(name: str) -> str:
    """A distribution's name as PEP 503 compares it (``Typing_Extensions`` is
    ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_version(url: str, wanted: str) -> str | None:
    """The version in the file name of the wheel at ``url`` (``name-version[-build]-python-abi-
    platform.whl``, PEP 427), when it is a wheel of the distribution ``wanted``."""
    filename = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    if not filename.endswith(".whl"):
        return None
    parts = filename[: -len(".whl")].split("-")
    if len(parts) not in (5, 6) or normalise_name(parts[0]) != wanted:
        return None
    return parts[1]
