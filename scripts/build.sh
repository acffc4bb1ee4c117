#!/usr/bin/env bash
# Configures and builds hslide into build/ (Release). Extra arguments go to the build step,
# e.g. `scripts/build.sh --target hslide`. HSLIDE_CUDA=ON|OFF|AUTO picks the CUDA backend.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DHSLIDE_CUDA="${HSLIDE_CUDA:-AUTO}" >/dev/null
cmake --build build -j "$(nproc)" "$@"
