#!/usr/bin/env bash
# Regenerate the hash-locked requirement sets envs/<name>.txt from envs/<name>.in.
#
#   scripts/lock_envs.sh                 # all environments
#   scripts/lock_envs.sh torch-2.0 ...   # only these
#
# The locks are for Linux x86_64 with the CUDA wheels from PyPI (what `pip install torch`
# installs there), whatever machine runs this. --exclude-newer pins the index snapshot so that
# rerunning gives the same file; move the date forward (here) to pick up newer releases.
# Needs uv (on PATH, in $UV, or in .venv/bin/uv) and network access to PyPI.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

EXCLUDE_NEWER="2026-11-30T00:00:00Z"
PLATFORM="x86_64-manylinux_2_28"

# Python version of each environment; keep in step with config/config.yaml (environments).
declare -A PYTHON_VERSION=(
    ["torch-1.13"]=3.10
    ["torch-2.0"]=3.10
    ["torch-2.14"]=3.11
)

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

lock_one() {
    local uv=$1 name=$2
    local python_version=${PYTHON_VERSION[$name]:-}
    if [[ -z "$python_version" ]]; then
        echo "error: unknown environment '$name' (known: ${!PYTHON_VERSION[*]})" >&2
        exit 2
    fi
    echo "locking envs/$name.txt (Python $python_version, $PLATFORM)" >&2
    # uv writes the exact command into the file's header; the note above it says where it is kept.
    "$uv" pip compile --quiet --generate-hashes \
        --python-version "$python_version" --python-platform "$PLATFORM" \
        --exclude-newer "$EXCLUDE_NEWER" \
        "envs/$name.in" -o "envs/$name.txt"
    local locked
    locked=$(cat "envs/$name.txt")
    {
        echo "# Environment $name: Python $python_version, Linux x86_64 ($PLATFORM), CUDA wheels from PyPI."
        echo "# Regenerate all locks with scripts/lock_envs.sh, or this one with the command below."
        echo "$locked"
    } >"envs/$name.txt"
}

main() {
    local uv
    uv=$(find_uv)
    local names=("$@")
    if [[ ${#names[@]} -eq 0 ]]; then
        names=(torch-1.13 torch-2.0 torch-2.14)
    fi
    for name in "${names[@]}"; do
        lock_one "$uv" "$name"
    done
}

main "$@"
