#!/usr/bin/env bash
# The steps of docker/Dockerfile and docker/ptspeed.def (one script, so the Docker image and the
# Apptainer image bootstrapped from the same base install the same things):
#   install.sh system PYTHON_VERSION               the OS's Python, its venv and headers, g++
#   install.sh python PYTHON_VERSION TORCH_VERSION /opt/venv with exactly the lock, then checks
# A CA bundle at /run/secrets/ca_bundle (a build secret) is trusted by apt and pip.
set -euo pipefail

CA_BUNDLE=/run/secrets/ca_bundle
VENV=/opt/venv
REQUIREMENTS=/opt/ptspeed/requirements.txt
# A cache mount in docker/Dockerfile. pip's own HTTP cache is no help here: it keeps only
# responses with caching headers, which a proxy may strip; a directory of wheels always works.
WHEELS=/var/cache/ptspeed-wheels
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1

apt_options=()
if [[ -s $CA_BUNDLE ]]; then
    apt_options+=(-o "Acquire::https::CAInfo=$CA_BUNDLE")
    export PIP_CERT=$CA_BUNDLE
fi

install_system() {
    local python=python$1
    # g++ and the Python headers: torch.compile's C++ (inductor) and Triton's launcher compile
    # at run time.
    apt-get "${apt_options[@]}" update -qq
    apt-get "${apt_options[@]}" install -y -qq --no-install-recommends \
        "$python" "$python-venv" "$python-dev" g++ ca-certificates >/dev/null
    apt-get clean
    rm -rf /var/lib/apt/lists/*
    "$python" --version
}

install_python() {
    local python=python$1 torch_version=$2
    "$python" -m venv "$VENV"
    mkdir -p "$WHEELS"
    # download skips files already in $WHEELS whose hash the lock lists; install then takes
    # every file from there.
    "$VENV/bin/python" -m pip download --quiet --require-hashes --no-deps \
        --dest "$WHEELS" -r "$REQUIREMENTS"
    "$VENV/bin/python" -m pip install --quiet --no-index --find-links "$WHEELS" \
        --require-hashes --no-deps -r "$REQUIREMENTS"
    "$VENV/bin/python" -m pip check
    "$VENV/bin/python" - "$torch_version" <<'EOF'
import sys

import torch
import torchvision
import transformers

wanted = sys.argv[1]
if torch.__version__.split("+")[0] != wanted:
    sys.exit(f"torch {torch.__version__} installed, the lock pins {wanted}")
print("torch", torch.__version__, "torchvision", torchvision.__version__,
      "transformers", transformers.__version__, "CUDA", torch.version.cuda)
EOF
}

case ${1:-} in
system) install_system "$2" ;;
python) install_python "$2" "$3" ;;
*)
    echo "usage: install.sh system PYTHON_VERSION | python PYTHON_VERSION TORCH_VERSION" >&2
    exit 2
    ;;
esac
