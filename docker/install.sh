#!/usr/bin/env bash
# The steps of docker/Dockerfile and docker/ptspeed.def (one script, so the Docker image and the
# Apptainer image bootstrapped from the same base install the same things):
#   install.sh system PYTHON_VERSION               the OS's Python, its venv and headers, g++
#   install.sh python PYTHON_VERSION TORCH_VERSION /opt/venv with exactly the lock, then checks
#                                                  it and writes its torch's GPU code (GPU_CODE)
# A CA bundle at /run/secrets/ca_bundle (a build secret) is trusted by apt, pip and uv. The
# site's package index (PIP_INDEX_URL, UV_INDEX_URL, ...: NAME='value' lines in the build secret
# /run/secrets/package_index, which workflow/scripts/image.py writes) is used by pip and uv, and is
# written into no file of the image: a mirror's URL may carry a token.
set -euo pipefail

CA_BUNDLE=/run/secrets/ca_bundle
PACKAGE_INDEX=/run/secrets/package_index
VENV=/opt/venv
REQUIREMENTS=/opt/ptspeed/requirements.txt
UV_REQUIREMENTS=/opt/ptspeed/uv.txt
# The GPU code of the image's torch, as ptspeed.cell.gpu_code.GpuCode.to_json writes it.
GPU_CODE=/opt/ptspeed/gpu-code.json
# uv's cache: a build cache mount in docker/Dockerfile, or the host's own uv cache (`uv cache
# dir`) mounted by podman build or apptainer build, so that a wheel the host's environments
# already downloaded is not downloaded again (workflow/scripts/image.py sets UV_CACHE_DIR).
export UV_CACHE_DIR=${UV_CACHE_DIR:-/var/cache/uv}
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1

apt_options=()
if [[ -s $CA_BUNDLE ]]; then
    apt_options+=(-o "Acquire::https::CAInfo=$CA_BUNDLE")
    export PIP_CERT=$CA_BUNDLE SSL_CERT_FILE=$CA_BUNDLE
fi

has_python_with_headers() {
    command -v "$1" >/dev/null 2>&1 \
        && "$1" -c 'import sys, sysconfig, venv; from pathlib import Path
sys.exit(not Path(sysconfig.get_paths()["include"], "Python.h").is_file())'
}

install_system() {
    local python=python$1 packages=(g++ ca-certificates)
    # A base that brings this Python (with its headers and venv) keeps it; otherwise the
    # distribution's. g++ and the headers: torch.compile's C++ (inductor) and Triton's launcher
    # compile at run time.
    if ! has_python_with_headers "$python"; then
        packages+=("$python" "$python-venv" "$python-dev")
    fi
    apt-get "${apt_options[@]}" update -qq
    apt-get "${apt_options[@]}" install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
    apt-get clean
    rm -rf /var/lib/apt/lists/*
    "$python" --version
}

use_package_index() {
    [[ -s $PACKAGE_INDEX ]] || return 0
    set -a
    # shellcheck disable=SC1090
    . "$PACKAGE_INDEX"
    set +a
    # uv reads its own names only: a site that names its mirror to pip alone reaches it too.
    if [[ -n ${PIP_INDEX_URL:-} && -z ${UV_INDEX_URL:-}${UV_DEFAULT_INDEX:-} ]]; then
        export UV_DEFAULT_INDEX=$PIP_INDEX_URL
    fi
    if [[ -n ${PIP_EXTRA_INDEX_URL:-} && -z ${UV_EXTRA_INDEX_URL:-}${UV_INDEX:-} ]]; then
        export UV_INDEX=$PIP_EXTRA_INDEX_URL
    fi
}

install_python() {
    local python=python$1 torch_version=$2 tools
    use_package_index
    "$python" -m venv "$VENV"
    tools=$(mktemp -d)
    "$python" -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --require-hashes --no-deps -r "$UV_REQUIREMENTS"
    # Exactly the lock, hash-checked. Copies out of the cache (it may be another filesystem).
    # Compiled to bytecode here: the image is read-only where it runs, and a cell that compiles
    # torch's sources at import time spends 5 to 20 s before its first step.
    "$tools/bin/uv" pip install --quiet --python "$VENV/bin/python" --require-hashes --no-deps \
        --link-mode copy --compile-bytecode -r "$REQUIREMENTS"
    rm -rf "$tools"
    "$VENV/bin/python" -m pip check
    "$VENV/bin/python" - "$torch_version" "$GPU_CODE" <<'PYTHON'
import json
import sys

import torch
import torchvision
import transformers

wanted = sys.argv[1]
# A PyPI lock pins 2.0.1 and PyPI's wheel reports 2.0.1+cu117; a lock that pins a build by its
# wheel's URL (or a local version) pins 2.0.1+cu118, and only that build will do.
if wanted not in (torch.__version__, torch.__version__.split("+")[0]):
    sys.exit(f"torch {torch.__version__} installed, the lock pins {wanted}")
print("torch", torch.__version__, "torchvision", torchvision.__version__,
      "transformers", transformers.__version__, "CUDA", torch.version.cuda)
read_flags = getattr(torch._C, "_cuda_getArchFlags", None)
flags = (read_flags() if torch.version.cuda and read_flags else None) or ""
code = {"torch_version": torch.__version__, "cuda_version": torch.version.cuda or "",
        "arch_flags": " ".join(flags.split())}
with open(sys.argv[2], "w", encoding="utf-8") as out:
    json.dump(code, out)
print("GPU code:", flags or "none")
PYTHON
}

case ${1:-} in
system) install_system "$2" ;;
python) install_python "$2" "$3" ;;
*)
    echo "usage: install.sh system PYTHON_VERSION | python PYTHON_VERSION TORCH_VERSION" >&2
    exit 2
    ;;
esac
