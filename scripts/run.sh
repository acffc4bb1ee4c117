#!/usr/bin/env bash
# Sets up, builds, and trains the default model on the built-in synthetic data (an
# Amazon-670K-shaped workload: 670,091 labels, 135,909 features, 24.5k training points) for
# 3 epochs. Arguments, when given, go to `hslide train` instead of `--epochs 3`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh --target hslide
if (($# == 0)); then set -- --epochs 3; fi
exec ./build/hslide train "$@"
