#!/usr/bin/env bash
# Installs the Debian packages hslide builds against, where they are missing.
# Nothing is vendored: every dependency comes from Debian 12's archive.
set -euo pipefail

packages=(build-essential cmake pkg-config libcli11-dev libfmt-dev libspdlog-dev
          nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev
          # --backend cpu-dense (and PyTorch's matrix products: no reference-BLAS fallback)
          libopenblas-dev libopenblas0-pthread
          # scripts/reproduce.sh: the PyTorch baseline, the report's plots (for /usr/bin/python3)
          python3-torch python3-numpy python3-matplotlib
          # the Python module (build/python/hslide) and its tests (ctest's python_tests)
          pybind11-dev python3-pybind11 python3-dev python3-scipy python3-pytest
          # the output layer sharded across MPI ranks (mpirun -np N hslide train; HSLIDE_MPI)
          openmpi-bin libopenmpi-dev)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
    exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
fi
echo "setup.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
