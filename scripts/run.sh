#!/usr/bin/env bash
# Sets up, builds, and trains the default model on the built-in synthetic data
# (an Amazon-670K-shaped workload). Extra arguments go to `hslide train`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh --target hslide
exec ./build/hslide train "$@"
