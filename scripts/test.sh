#!/usr/bin/env bash
# Sets up, builds, and runs every test with ctest.
#
#   scripts/test.sh                 # build/ (Release, CUDA where nvcc is found)
#   scripts/test.sh --sanitize      # build-sanitize/: the C++ code under AddressSanitizer and
#                                   # UndefinedBehaviorSanitizer (CUDA off, no benchmarks); any
#                                   # finding fails its test; the fuzz targets of the
#                                   # readers and loaders run 20 s each (HSLIDE_FUZZ_SECONDS)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --sanitize ]]; then
    ./scripts/setup.sh
    cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHSLIDE_CUDA=OFF \
        -DHSLIDE_BUILD_BENCH=OFF -DHSLIDE_SANITIZE=address,undefined >/dev/null
    cmake --build build-sanitize -j "$(nproc)"
    cd build-sanitize
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    # The fuzz targets (tests/test_fuzz_readers.cpp) mutate for this long each under the
    # sanitizers (1 s in a plain run).
    export HSLIDE_FUZZ_SECONDS=${HSLIDE_FUZZ_SECONDS:-20}
elif (($#)); then
    echo "usage: scripts/test.sh [--sanitize]" >&2
    exit 2
else
    ./scripts/build.sh
    cd build
fi
ctest --output-on-failure -j "$(nproc)" --timeout 900
