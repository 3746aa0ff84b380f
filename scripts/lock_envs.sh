#!/usr/bin/env bash
# Regenerate the hash-locked requirement sets envs/<name>.txt from envs/<name>.in.
#
#   scripts/lock_envs.sh                 # all environments
#   scripts/lock_envs.sh torch-2.0 ...   # only these
#   scripts/lock_envs.sh --extra-index-url URL my-env   # also resolve from the package index URL
#
# The locks are for Linux x86_64, whatever machine runs this: CUDA wheels from PyPI (what
# `pip install torch` installs there), except where an environment's .in names a wheel by URL
# (torch-2.0-cu118: PyTorch's CUDA 11.8 build of 2.0.1, on download.pytorch.org only), which
# uv then downloads and hashes. --exclude-newer pins the index snapshot so that rerunning gives
# the same file; move the date forward (here) to pick up newer releases.
#
# An extra index (--extra-index-url, or EXTRA_INDEX_URL below for an environment that always
# needs one) is for an environment whose .in asks for a local version that only that index has,
# e.g. torch==2.1.2+cu121 from https://download.pytorch.org/whl/cu121. Those pins come from the
# index (exempt from --exclude-newer; such indexes give no upload times, so under uv's
# --index-strategy unsafe-best-match every other package still comes from PyPI), and the lock
# then names each of their wheels by URL with its one sha256, read from the index's page of the
# package (PEP 503 links carry it): the lock installs without the index. Naming the wheels by URL
# in the .in, as torch-2.0-cu118 does, needs no index at all. The extra index needs python3 (3.9+)
# and a uv that knows --exclude-newer-package NAME=false (0.13 does).
#
# Needs uv (on PATH, in $UV, or in .venv/bin/uv) and network access to PyPI (and to the hosts
# of URL wheels and extra indexes).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

EXCLUDE_NEWER="2026-11-30T00:00:00Z"
PLATFORM="x86_64-manylinux_2_28"

# Every environment, in the order a bare run locks them: those from PyPI alone first, so that a
# machine that cannot reach download.pytorch.org still regenerates them before failing.
ALL=(torch-1.13 torch-2.0 torch-2.14 torch-2.0-cu118)

# Python version of each environment; keep in step with the configs' environments
# (config/config.yaml; torch-2.0-cu118: config/hopper.yaml).
declare -A PYTHON_VERSION=(
    ["torch-1.13"]=3.10
    ["torch-2.0"]=3.10
    ["torch-2.0-cu118"]=3.10
    ["torch-2.14"]=3.11
)

# Where an environment's wheels come from, for the lock's first line (default: PyPI).
declare -A WHEELS_FROM=(
    ["torch-2.0-cu118"]="torch and torchvision CUDA 11.8 wheels by URL from download.pytorch.org, the rest from PyPI"
)

# An extra package index that an environment always needs (none does yet); --extra-index-url
# sets one for the environments of a run instead.
declare -A EXTRA_INDEX_URL=()

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
    echo "environments: ${ALL[*]}"
}

find_uv() {
    if [[ -n "${UV:-}" ]]; then
        echo "$UV"
    elif command -v uv >/dev/null 2>&1; then
        command -v uv
    elif [[ -x .venv/bin/uv ]]; then
        echo .venv/bin/uv
    else
        echo "error: uv not found: pip install uv (or set UV=/path/to/uv)" >&2
        exit 2
    fi
}

# The local-version pins of a .in (name==version+label): what only an extra index has.
local_pins() {
    sed -n -E 's/^[[:space:]]*([A-Za-z0-9._-]+)(\[[^]]*\])?[[:space:]]*==[[:space:]]*[^[:space:];#]*\+.*/\1/p' "$1"
}

# Rewrite the packages of lock $1 at a local version (those from extra index $2) as
# `name @ URL --hash=sha256:H`: the wheel for Python $3 on Linux x86_64 that the index's page of
# the package links with one of the lock's hashes.
pin_by_url() {
    python3 - "$@" <<'PYTHON'
from __future__ import annotations

import re
import sys
import urllib.parse
import urllib.request
from html.parser import HTMLParser

lock_path, index, python_version = sys.argv[1:]
python_tags = {"cp" + python_version.replace(".", ""), "py3", "py" + python_version.replace(".", "")}
PLATFORM = re.compile(r"^(linux|manylinux\w*)_x86_64$|^any$")
HEAD = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+\+\S+) \\$")


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def wheel_url(name: str, version: str, hashes: list[str]) -> tuple[str, str]:
    page = urllib.parse.urljoin(index.rstrip("/") + "/", re.sub(r"[-_.]+", "-", name).lower() + "/")
    with urllib.request.urlopen(page, timeout=60) as response:
        links = Links()
        links.feed(response.read().decode("utf-8", "replace"))
    for href in links.hrefs:
        url, _, fragment = urllib.parse.urljoin(page, href).partition("#")
        digest = fragment.removeprefix("sha256=")
        filename = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        if not filename.endswith(".whl") or digest not in hashes:
            continue
        parts = filename[: -len(".whl")].split("-")
        python, platforms = set(parts[-3].split(".")), parts[-1].split(".")
        if parts[1] == version and python & python_tags and any(map(PLATFORM.match, platforms)):
            return url, digest
    sys.exit(
        f"error: {page} links no wheel of {name}=={version} for Python {python_version} on Linux "
        "x86_64 with a sha256 the lock has; name the wheel by URL in the .in instead"
    )


lines = open(lock_path, encoding="utf-8").read().splitlines()
out: list[str] = []
i = 0
while i < len(lines):
    head = HEAD.match(lines[i])
    if not head:
        out.append(lines[i])
        i += 1
        continue
    hashes = []
    i += 1
    while i < len(lines) and lines[i].lstrip().startswith("--hash=sha256:"):
        hashes.append(lines[i].strip().removesuffix("\\").strip().removeprefix("--hash=sha256:"))
        i += 1
    url, digest = wheel_url(head[1], head[2], hashes)
    out += [f"{head[1]} @ {url} \\", f"    --hash=sha256:{digest}"]
open(lock_path, "w", encoding="utf-8").write("\n".join(out) + "\n")
PYTHON
}

lock_one() {
    local uv=$1 name=$2 index=$3
    local python_version=${PYTHON_VERSION[$name]:-}
    if [[ -z "$python_version" ]]; then
        echo "error: unknown environment '$name' (known: ${ALL[*]})" >&2
        exit 2
    fi
    local from=${WHEELS_FROM[$name]:-CUDA wheels from PyPI}
    local index_options=() pin
    if [[ -n "$index" ]]; then
        index_options=(--extra-index-url "$index" --index-strategy unsafe-best-match)
        for pin in $(local_pins "envs/$name.in"); do
            index_options+=(--exclude-newer-package "$pin=false")
        done
        from="$from; local versions from $index"
    fi
    echo "locking envs/$name.txt (Python $python_version, $PLATFORM)" >&2
    # uv writes the exact command into the file's header; the note above it says where it is kept.
    if ! "$uv" pip compile --quiet --generate-hashes \
        --python-version "$python_version" --python-platform "$PLATFORM" \
        --exclude-newer "$EXCLUDE_NEWER" "${index_options[@]}" \
        "envs/$name.in" -o "envs/$name.txt"; then
        echo "error: locking envs/$name.txt failed; envs/$name.in needs PyPI and every host it" \
            "names (download.pytorch.org for torch-2.0-cu118)" >&2
        exit 1
    fi
    if [[ -n "$index" ]]; then
        pin_by_url "envs/$name.txt" "$index" "$python_version"
    fi
    local locked
    locked=$(cat "envs/$name.txt")
    {
        echo "# Environment $name: Python $python_version, Linux x86_64 ($PLATFORM), $from."
        echo "# Regenerate all locks with scripts/lock_envs.sh, or this one with the command below."
        echo "$locked"
    } >"envs/$name.txt"
}

main() {
    local names=() cli_index=""
    while [[ $# -gt 0 ]]; do
        case $1 in
        -h | --help)
            usage
            return 0
            ;;
        --extra-index-url)
            [[ $# -ge 2 && -n $2 ]] || {
                echo "error: --extra-index-url needs a URL" >&2
                exit 2
            }
            cli_index=$2
            shift 2
            ;;
        --extra-index-url=*)
            cli_index=${1#*=}
            shift
            ;;
        -*)
            echo "error: unknown option $1 (see --help)" >&2
            exit 2
            ;;
        *)
            names+=("$1")
            shift
            ;;
        esac
    done
    if [[ ${#names[@]} -eq 0 ]]; then
        names=("${ALL[@]}")
    fi
    local name
    for name in "${names[@]}"; do
        if [[ -z "${PYTHON_VERSION[$name]:-}" ]]; then
            echo "error: unknown environment '$name' (known: ${ALL[*]})" >&2
            exit 2
        fi
    done
    local uv
    uv=$(find_uv)
    for name in "${names[@]}"; do
        lock_one "$uv" "$name" "${cli_index:-${EXTRA_INDEX_URL[$name]:-}}"
    done
}

# Sourced (tests/test_locks.py), it only defines the functions.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
