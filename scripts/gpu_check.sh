#!/usr/bin/env bash
# The GPU check every session with a GPU machine runs: build here, test and measure there.
#
#   scripts/gpu_check.sh pack               # here: build with CUDA and MPI into build-gpu/ and
#                                           # pack the binaries, the shared libraries they need,
#                                           # Open MPI (below) and the Bibtex data into
#                                           # gpu-pack/hslide-gpu.tar.gz (git-ignored; 31 MB,
#                                           # Open MPI 3.6 MB of it; the device tool carries
#                                           # at most 64 MiB).
#                                           # PACK_CUDA=OFF: the same pack of a CPU build
#                                           # (build-pack-cpu/, no GPU tests), to try the pack
#                                           # here (the `mpi` step) without the CUDA build
#   scripts/gpu_check.sh all [EPOCHS] [BUDGET]
#                                           # on the GPU machine: THE check (issue 22), in
#                                           # BUDGET seconds (460): the GPU tests; Amazon-670K-
#                                           # shaped at full size, EPOCHS (3) each: gpu topk,
#                                           # topk with the fused scoring pass
#                                           # (HSLIDE_GPU_TOPK_FUSED=1), gpu-dense, gpu LSH,
#                                           # topk without the fill pool (--fill-pool 0),
#                                           # topk with --fill-correction 1, the hybrid (gpu
#                                           # topk, cpu LSH); Amazon-3M at 0.02 and
#                                           # WikiLSHTC-325K at 0.25 (2 epochs: topk, topk
#                                           # corrected, dense, LSH); memcheck and racecheck;
#                                           # an Nsight Compute table of LSH, top-k (cuBLAS
#                                           # and fused) and dense steps; PyTorch bf16; the
#                                           # peers; the `ranks` rows (2 epochs on the
#                                           # profiles' Amazon-670K slice); PyTorch fp32. Each
#                                           # part runs only while its estimate fits; one
#                                           # summary.md.
#   scripts/gpu_check.sh tests              # on the GPU machine: the GPU tests, then
#                                           # compute-sanitizer memcheck and racecheck on the
#                                           # LSH and top-k kernels' tests (where it exists)
#   scripts/gpu_check.sh bench [SCALE] [EPOCHS] [PRESETS]
#                                           # on the GPU machine: the presets (comma separated;
#                                           # default amazon670k,wikilshtc325k,amazon3m) at full
#                                           # label and feature counts, SCALE x the points
#                                           # (default 0.1), EPOCHS each (default 2), with the
#                                           # preset's network (scripts/presets.sh): gpu fp32
#                                           # and bf16 (the preset's top-k output layer), gpu
#                                           # LSH bf16, gpu-dense bf16 and cpu (all cores),
#                                           # PyTorch on the GPU in fp32 and bf16 autocast on
#                                           # amazon670k (where python3 has torch with CUDA),
#                                           # the preset's batch; on amazon670k also gpu bf16
#                                           # at batch 1024, gpu LSH with --gpu-async-rebuild,
#                                           # and hybrid cpu+gpu (adaptive; hogbatch); gpu,
#                                           # gpu LSH and gpu-dense bf16 only on amazon3m
#                                           # (2,000 test points scored).
#                                           # A PRESETS entry NAME@S takes scale S instead.
#   scripts/gpu_check.sh topk [EPOCHS]      # on the GPU machine: issue 19's checks, EPOCHS (3)
#                                           # each: gpu topk bf16 (without and with
#                                           # --fill-correction 1), gpu-dense bf16 and gpu (LSH)
#                                           # bf16 on amazon670k at full size, wikilshtc325k at
#                                           # scale 0.25 and amazon3m at scale 0.02 (2,000 test
#                                           # points scored there), and on amazon670k a hybrid
#                                           # of a top-k GPU worker and an LSH CPU worker;
#                                           # bench's summary
#   scripts/gpu_check.sh peers              # on the GPU machine: the hardware comparison a
#                                           # user would make (issue 30): napkinXC's default
#                                           # label trees on all the host's cores beside hslide
#                                           # --backend gpu with its defaults and with --loss
#                                           # logistic (the CPU's auto), on Debian-recs,
#                                           # Bibtex and Corel5k; P@1, train seconds and
#                                           # hslide's time to napkinXC's P@1 (the pack carries
#                                           # napkinXC when packed with NAPKINXC=/path/to/nxc;
#                                           # `all` ends with it)
#   scripts/gpu_check.sh ranks [EPOCHS] [PRESET@SCALE] [BUDGET]
#                                           # on the GPU machine: issue 32's rows, EPOCHS (2)
#                                           # on PRESET@SCALE (amazon670k@0.02: full label and
#                                           # feature counts, 9,809 training points), exact
#                                           # top-k, in BUDGET seconds (540): the `mpi` check;
#                                           # 1 GPU process against 2 ranks on the one GPU
#                                           # (P@1 per epoch, s/epoch of both); a GPU rank
#                                           # with 3/4 of the output rows beside a CPU rank
#                                           # with 1/4 (--shard-weights 3,1, MPMD: `mpirun -np
#                                           # 1 hslide ... --backend gpu : -np 1 hslide ...
#                                           # --backend cpu`), and the same pair split by
#                                           # --shard-weights auto; 2 CPU ranks. Each mpirun under
#                                           # a timeout (120-150 s, then killed with its ranks);
#                                           # a run the engine refuses is a row with
#                                           # hslide's message.
#   scripts/gpu_check.sh mpi                # wherever the pack is unpacked (here too): the
#                                           # pack's Open MPI (ompi_info's folders, ldd) and 2
#                                           # CPU ranks of the packed hslide on the tiny preset
#                                           # beside one process, under strace where there is
#                                           # one: any file of Open MPI, PMIx, hwloc, libevent
#                                           # or munge opened outside the pack is listed
#   scripts/gpu_check.sh reproduce [SCALE] [EPOCHS] [PRESET] [REPRODUCE OPTIONS...]
#                                           # on the GPU machine: scripts/reproduce.sh with its
#                                           # default configurations (every CPU one, the GPU,
#                                           # hybrid and dense GPU ones, PyTorch on CPU and GPU)
#                                           # on PRESET (amazon670k) at SCALE (0.01), EPOCHS (2);
#                                           # further options go to reproduce.sh (--configs,
#                                           # --eval-max, --target-p1, ...)
#
# With the device tool: run `scripts/gpu_check.sh pack` here, then (one call, about 7 minutes)
#   run(command="scripts/gpu_check.sh all", carry=["gpu-pack"], timeout_s=540)
# or one call per step, each well inside the tool's 10 minutes a call:
#   run(command="scripts/gpu_check.sh tests", carry=["gpu-pack"])
#   run(command="scripts/gpu_check.sh topk 3", carry=["gpu-pack"])
#   run(command="scripts/gpu_check.sh bench 0.1 2 amazon670k", carry=["gpu-pack"])
#   run(command="scripts/gpu_check.sh bench 0.1 2 wikilshtc325k,amazon3m", carry=["gpu-pack"])
#   run(command="scripts/gpu_check.sh ranks", carry=["gpu-pack"], timeout_s=560)
#   run(command="scripts/gpu_check.sh reproduce 0.01 2", carry=["gpu-pack"])
#   run(command="scripts/gpu_check.sh reproduce 0.01 2 amazon3m --configs 'gpu:bf16 gpu-dense:bf16' --eval-max 2000", carry=["gpu-pack"])
#     (time to a P@1 of the LSH path against the dense bf16 output layer, issue 4's check)
# Each step works in results/gpu-<step>/ and puts at most 8 files in $OUT (the tool returns no
# more): its summary or report, machine.txt, and its logs as one .tar.gz, refreshed after each
# run so that a step cut off at its limit still returns what it finished. Without $OUT the
# files stay in the work folder.
# The GPU machine has no Debian packages: the pack carries libfmt, libspdlog, libxxhash,
# libgomp, libopenblas and libstdc++ beside the binaries; the CUDA runtime is linked statically
# and cuBLAS (gpu-dense only) is loaded from the machine's CUDA or PyTorch (set HSLIDE_CUBLAS).
# Open MPI (issue 32's ranks) travels too, from this machine's Debian openmpi-bin 4.1
# (pack_open_mpi): orterun (as mpirun and mpiexec), orted and ompi_info in bin/; libmpi,
# libopen-rte, libopen-pal and what they and the plugins load (Debian's external PMIx, hwloc,
# libevent, munge, udev, zlib) in lib/; the plugins in lib/openmpi (PMIx's in lib/pmix), all
# but those of fabrics the pack does not carry (UCX, libfabric, verbs, PSM, netlink) and
# OpenSHMEM's (share/openmpi/pack-left-out.txt names them); the help texts in share/openmpi and
# share/pmix; openmpi-mca-params.conf in etc/. Debian's layout is multiarch and partly outside
# the prefix (libdir /usr/lib/x86_64-linux-gnu/openmpi/lib, plugins in .../openmpi3,
# configuration in /etc/openmpi, PMIx under /usr/lib/x86_64-linux-gnu/pmix2 with its plugin
# path written in its own configuration file), so OPAL_PREFIX alone is not enough:
# open_mpi_env sets OPAL_PREFIX and every folder the pack moves (OPAL_LIBDIR, OPAL_PKGLIBDIR,
# OPAL_DATADIR, OPAL_PKGDATADIR, OPAL_SYSCONFDIR, ...), the PMIX_* twins and PMIx's plugin path
# (PMIX_MCA_mca_base_component_path); mpirun hands that environment to the ranks. hslide's and
# orterun's RUNPATH name /usr/lib/x86_64-linux-gnu/openmpi/lib; LD_LIBRARY_PATH ($root/lib) is
# searched before it, and the GPU machine has no such folder. Shared memory's single-copy
# transfers (CMA, refused in containers without ptrace) are off.
# The dry run here (bench/scale.md, "Open MPI in the GPU pack"), with the system's Open MPI
# hidden from the run in a private mount namespace:
#   PACK_CUDA=OFF scripts/gpu_check.sh pack
#   unshare -m bash -c 'for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 \
#       /usr/share/openmpi /etc/openmpi; do mount --bind "$(mktemp -d)" $d; done
#     for f in /usr/lib/x86_64-linux-gnu/lib{mpi,open-pal,open-rte,mca_common,pmix,hwloc,event,munge}*.so* \
#       /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info; do [ -e $f ] && mount --bind /dev/null $f; done
#     GPU_CHECK_UNPACK=/tmp/gpu-pack-test scripts/gpu_check.sh mpi'
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/presets.sh

pack_file=gpu-pack/hslide-gpu.tar.gz
# The GPU test binaries (tests/test_gpu_*.cpp and the device hash's host-device test).
gpu_tests="test_device_hash test_gpu_fill test_gpu_kernels test_gpu_topk test_gpu_backend test_gpu_catch_up test_gpu_hybrid test_shard"
mode=${1:-}

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2
    exit 2
}

# pack_libraries STAGE FILE...: the shared libraries FILEs need (ldd: all of them, transitively),
# but the C library's, copied into STAGE/lib.
pack_libraries() {
    local stage=$1 lib
    shift
    for lib in $(ldd "$@" | awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u); do
        case "$(basename "$lib")" in
        libc.so* | libm.so* | ld-linux* | libdl.so* | libpthread.so* | librt.so*) ;;
        *) [[ -f $stage/lib/$(basename "$lib") ]] || cp -L "$lib" "$stage/lib/" ;;
        esac
    done
}

# pack_open_mpi STAGE: the Open MPI this machine runs (Debian's openmpi-bin 4.1), relocatable to
# wherever the pack is unpacked (open_mpi_env says how): orterun (mpirun, mpiexec), orted and
# ompi_info in STAGE/bin; libmpi and every library it and the plugins need in STAGE/lib (the
# external PMIx, hwloc, libevent, munge, udev, zlib); Open MPI's plugins in STAGE/lib/openmpi,
# PMIx's in STAGE/lib/pmix; the help texts in STAGE/share/openmpi and STAGE/share/pmix;
# openmpi-mca-params.conf and the default hostfile in STAGE/etc. Plugins for fabrics the pack
# does not carry (UCX, libfabric, verbs, PSM, netlink) and OpenSHMEM's are left out, as
# Debian's openmpi-mca-params.conf already turns most of them off: one machine's ranks talk
# through shared memory (btl vader) and TCP. STAGE/share/openmpi/pack-left-out.txt lists them.
pack_open_mpi() {
    local stage=$1 orterun info pkglibdir pkgdatadir sysconfdir pmix_lib pmix_prefix plugin
    local deps skip fabric='^lib(ucp|ucs|uct|ucm|fabric|ibverbs|rdmacm|efa|psm|psm2|psm_infinipath|infinipath|nl-3|nl-route-3|oshmem|mca_common_(ucx|ofi|verbs))[.-]'
    orterun=$(readlink -f "$(command -v mpirun)")
    info=$(dirname "$orterun")/ompi_info
    [[ $(basename "$orterun") == orterun && -x $info ]] ||
        { echo "gpu_check.sh pack: mpirun is not Open MPI's orterun (install openmpi-bin)" >&2; exit 1; }
    pkglibdir=$("$info" --path pkglibdir --parsable | cut -d: -f3)
    pkgdatadir=$("$info" --path pkgdatadir --parsable | cut -d: -f3)
    sysconfdir=$("$info" --path sysconfdir --parsable | cut -d: -f3)
    mkdir -p "$stage/lib/openmpi" "$stage/lib/pmix" "$stage/share" "$stage/etc"
    cp "$orterun" "$(dirname "$orterun")/orted" "$info" "$stage/bin/"
    ln -sf orterun "$stage/bin/mpirun"
    ln -sf orterun "$stage/bin/mpiexec"
    pack_libraries "$stage" "$stage/bin/orterun" "$stage/bin/orted" "$stage/bin/ompi_info"
    : >"$stage/lib/openmpi/.left-out"
    for plugin in "$pkglibdir"/*.so; do
        deps=$(ldd "$plugin" | awk '/=>/ {print $1 ($3 == "not" ? "(not-found)" : "")}')
        skip=$(grep -E "$fabric|not-found" <<<"$deps" | tr '\n' ' ' || true)
        if [[ -n $skip ]]; then
            echo "$(basename "$plugin"): needs $skip" >>"$stage/lib/openmpi/.left-out"
        else
            cp "$plugin" "$stage/lib/openmpi/"
            pack_libraries "$stage" "$plugin"
        fi
    done
    # PMIx (external to Debian's Open MPI): its plugins and help texts beside its library.
    pmix_lib=$(readlink -f "$(ldd "$stage"/lib/openmpi/mca_pmix_*.so | awk '$1 ~ /^libpmix\.so/ {print $3; exit}')")
    [[ -f $pmix_lib ]] || { echo "gpu_check.sh pack: no PMIx library behind Open MPI's pmix plugin" >&2; exit 1; }
    pmix_prefix=$(dirname "$(dirname "$pmix_lib")")
    for plugin in "$(dirname "$pmix_lib")"/pmix/*.so; do
        [[ -f $plugin ]] || continue
        cp "$plugin" "$stage/lib/pmix/"
        pack_libraries "$stage" "$plugin"
    done
    cp -r "$pkgdatadir" "$stage/share/openmpi"
    [[ -d $pmix_prefix/share/pmix ]] && cp -r "$pmix_prefix/share/pmix" "$stage/share/pmix"
    cp "$sysconfdir/openmpi-mca-params.conf" "$sysconfdir/openmpi-default-hostfile" "$stage/etc/"
    mv "$stage/lib/openmpi/.left-out" "$stage/share/openmpi/pack-left-out.txt"
    echo "$("$info" --version | head -1):" \
        "$(ls "$stage/lib/openmpi" | wc -l) plugins packed," \
        "$(wc -l <"$stage/share/openmpi/pack-left-out.txt") left out (share/openmpi/pack-left-out.txt)"
}

# open_mpi_env: the pack's Open MPI (pack_open_mpi), unpacked at $root, in this shell's
# environment, which mpirun passes on to its ranks. Debian builds Open MPI with its libdir at
# /usr/lib/x86_64-linux-gnu/openmpi/lib, its plugins in .../openmpi3, its help texts in
# /usr/share/openmpi, its configuration in /etc/openmpi (absolute, not under the prefix) and an
# external PMIx whose own configuration names its plugins' absolute folder: OPAL_PREFIX alone
# would move only what is under the prefix, so every folder the pack's layout changes is given
# (Open MPI's installdirs "env" component; PMIx's twin reads PMIX_*), and PMIx's plugin path as
# an MCA variable, which outranks its file. The libraries come from LD_LIBRARY_PATH ($root/lib,
# searched before the binaries' RUNPATH, /usr/lib/x86_64-linux-gnu/openmpi/lib, which the GPU
# machine does not have); hwloc's plugins (PCI, XML, OpenCL) are not carried, and it is kept
# from the build machine's. The single-copy transfers of shared memory (CMA) are off: containers
# without ptrace refuse them, and the ranks' messages are small.
open_mpi_env() {
    [[ -x $root/bin/orterun ]] || return 0
    export PATH="$root/bin:$PATH"
    export OPAL_PREFIX=$root OPAL_EXEC_PREFIX=$root OPAL_BINDIR=$root/bin OPAL_LIBDIR=$root/lib \
        OPAL_PKGLIBDIR=$root/lib/openmpi OPAL_DATAROOTDIR=$root/share OPAL_DATADIR=$root/share \
        OPAL_PKGDATADIR=$root/share/openmpi OPAL_SYSCONFDIR=$root/etc
    export PMIX_PREFIX=$root PMIX_EXEC_PREFIX=$root PMIX_LIBDIR=$root/lib \
        PMIX_PKGLIBDIR=$root/lib/pmix PMIX_DATADIR=$root/share PMIX_PKGDATADIR=$root/share/pmix \
        PMIX_SYSCONFDIR=$root/etc PMIX_MCA_mca_base_component_path=$root/lib/pmix
    export HWLOC_PLUGINS_PATH=$root/lib/hwloc
    export OMPI_MCA_btl_vader_single_copy_mechanism=none
}

case "$mode" in
pack)
    ./scripts/setup.sh
    # PACK_CUDA=OFF: the same pack from a CPU build (build-pack-cpu: hslide alone, no GPU tests),
    # to try the pack's machinery (Open MPI's relocation: the `mpi` step) on a machine without
    # the time for the CUDA build.
    build="build-gpu"
    [[ ${PACK_CUDA:-ON} == OFF ]] && { build="build-pack-cpu"; gpu_tests=""; }
    # The ranks (the `ranks` step) need MPI in the build: a pack without it is refused here.
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHSLIDE_CUDA="${PACK_CUDA:-ON}" \
        -DHSLIDE_MPI=ON -DHSLIDE_BUILD_BENCH=OFF >/dev/null
    cmake --build "$build" -j "$(nproc)" --target hslide $gpu_tests
    stage=$build/pack
    rm -rf "$stage" gpu-pack
    mkdir -p "$stage/bin" "$stage/lib" "$stage/data" gpu-pack
    cp "$build/hslide" "$stage/bin/"
    for t in $gpu_tests; do cp "$build/$t" "$stage/bin/"; done
    pack_libraries "$stage" "$stage"/bin/*
    pack_open_mpi "$stage"
    shared=${HSLIDE_SHARED_DATA:-../shared/data}
    for set in bibtex debian-recs corel5k; do
        if [[ -d $shared/$set ]]; then cp -r "$shared/$set" "$stage/data/"; fi
    done
    # The peer (the `peers` step): napkinXC's CLI as built outside the repository, and GNU time
    # for its peak memory (the GPU machine has no Debian packages).
    if [[ -n ${NAPKINXC:-} ]]; then
        "$NAPKINXC" version | grep -q '^napkinXC ' ||
            { echo "gpu_check.sh: $NAPKINXC is not napkinXC's nxc" >&2; exit 2; }
        cp "$NAPKINXC" "$stage/bin/nxc"
        cp /usr/bin/time "$stage/bin/time"
    fi
    # Compressed: the libraries (OpenBLAS alone is 35 MB) shrink to a third, and the tool
    # carries at most 64 MiB with the working tree.
    tar -C "$stage" -czf "$pack_file" .
    du -h "$pack_file"
    ;;
tests | bench | topk | all | peers | reproduce | mpi | ranks)
    [[ -f $pack_file ]] || { echo "gpu_check.sh: no $pack_file: run '$0 pack' first and carry gpu-pack" >&2; exit 1; }
    # Unpacked once per machine (again when the pack is newer), in gpu-pack/unpacked or in
    # $GPU_CHECK_UNPACK (the `mpi` step's dry run here: a folder outside the repository).
    root=${GPU_CHECK_UNPACK:-gpu-pack/unpacked}
    if [[ ! -f $root/.done || $pack_file -nt $root/.done ]]; then
        rm -rf "$root"
        mkdir -p "$root"
        tar -C "$root" -xzf "$pack_file"
        touch "$root/.done"
    fi
    root=$(cd "$root" && pwd)
    work="$PWD/results/gpu-$mode"
    out=${OUT:-$work}
    mkdir -p "$work" "$out"
    export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    open_mpi_env
    export HSLIDE_SHARED_DATA="$root/data"
    export HSLIDE_BINARY="$root/bin/hslide"  # the tests' CLI runs use the packed binary
    # Where PyTorch brings its own cuBLAS, gpu-dense can use it.
    if [[ -z ${HSLIDE_CUBLAS:-} ]]; then
        # The newest libcublas.so.N under the nvidia wheels' folders (cu12: nvidia/cublas/lib,
        # cu13 wheels may differ).
        torch_cublas=$(python3 -c '
import glob, os, re, nvidia
found = [p for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "**", "libcublas.so.*"), recursive=True)
         if re.search(r"libcublas\.so\.[0-9]+$", p)]
print(max(found, key=lambda p: int(p.rsplit(".", 1)[1])) if found else "")' 2>/dev/null || true)
        if [[ -n $torch_cublas && -f $torch_cublas ]]; then export HSLIDE_CUBLAS=$torch_cublas; fi
    fi
    { nvidia-smi || true; "$root/bin/hslide" info; } >"$out/machine.txt" 2>&1
    cat "$out/machine.txt"
    ;;
*) usage ;;
esac

# The logs of a step (everything in its work folder but generated data) as one file in $OUT.
ship_logs() {
    tar -C "$work" --exclude='./data-*' --exclude='./data' --exclude='*.hscache' \
        -czf "$out/$mode-logs.tar.gz.part" . && mv "$out/$mode-logs.tar.gz.part" "$out/$mode-logs.tar.gz"
}

# Whether python3 has PyTorch with a CUDA device (the PyTorch baseline's rows).
have_torch_cuda() {
    python3 -c 'import torch, numpy, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null
}

# The summary table's head.
summary_head() {
    echo "Per epoch: training seconds (median over epochs), P@1 after each evaluated epoch, and"
    echo "the stage seconds of the last epoch (hashing, active sets, forward, backward, update,"
    echo "table rebuilds, host-device transfer). $1"
    echo
    echo "dropped: top-k rows, the mean softmax mass outside the sets in the last epoch (issue 19)."
    echo "rows: the share of the output rows a step's update touched in the last epoch."
    echo
    echo "| preset | backend | precision | s/epoch | P@1 | hash | sets | fwd | bwd | update | rebuild | transfer | dropped | rows |"
    echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
}

# prepare_preset NAME[@SCALE]: sets preset, preset_scale, data and network, generating the data
# (in $work, once) if needed.
prepare_preset() {
    preset=${1%@*}
    preset_scale=$scale
    [[ $1 == *@* ]] && preset_scale=${1##*@}
    data="$work/data-$preset-s$preset_scale"
    # The papers' network and LSH settings, as reproduce.sh trains them.
    preset_settings "$preset" || { echo "gpu_check.sh: unknown preset $preset" >&2; exit 2; }
    [[ -f $data/test.txt ]] ||
        "$root/bin/hslide" gen --preset "$preset" --scale "$preset_scale" --out "$data" -q
    # Every label's row, as the dense baseline (torch_dense.py) and the earlier GPU figures
    # have them (--label-rows auto would drop the synthetic presets' labels no point carries).
    network=(--hidden "$p_hidden" --K "$p_K" --L "$p_L" --bits "$p_bits"
             --bucket-capacity "$p_capacity" --min-active "$p_min_active" --label-rows all)
}

# run_config "BACKEND PRECISION [BATCH [VARIANT]]": trains the prepared preset for $epochs and
# appends its row (and a hybrid's worker rows) to $summary.
run_config() {
    local backend precision batch variant name label extra run_env=() started=$SECONDS
    read -r backend precision batch variant <<<"$1"
    batch=${batch:-$p_batch}
    name="$preset-s$preset_scale-$backend-$precision-b$batch${variant:+-$variant}"
    label=$backend
    [[ $batch == "$p_batch" ]] || label="$backend (batch $batch)"
    # No variant: the preset's output layer (top-k, with the --fill-pool default).
    extra=(--output-sparsity "$p_sparsity")
    [[ $variant == topk ]] && { extra=(--output-sparsity topk); label="$label topk"; }
    # topk-nopool: the fill drawn from the whole layer, as before --fill-pool (the 2026-11-26
    # H200 figures).
    [[ $variant == topk-nopool ]] &&
        { extra=(--output-sparsity topk --fill-pool 0); label="$label topk (no fill pool)"; }
    [[ $variant == lsh ]] && { extra=(--output-sparsity lsh); label="$label lsh"; }
    # topk-fused: the fused scoring pass (gpu_topk.cuh), its variable set for this run only.
    [[ $variant == topk-fused ]] && {
        extra=(--output-sparsity topk)
        run_env=(HSLIDE_GPU_TOPK_FUSED=1)
        label="$label topk (fused scoring)"
    }
    [[ $variant == topk-fc ]] &&
        { extra=(--output-sparsity topk --fill-correction 1); label="$label topk (fill correction 1)"; }
    [[ $variant == async ]] &&
        { extra=(--output-sparsity lsh --gpu-async-rebuild); label="$label lsh (async rebuild)"; }
    if [[ $backend == hybrid && $variant == topk-gpu ]]; then
        extra+=(--workers gpu,cpu --schedule adaptive --worker-output-sparsity topk,lsh)
        label="$label (gpu topk, cpu lsh)"
    elif [[ $backend == hybrid && $variant == hog ]]; then
        extra+=(--workers cpu,gpu --schedule hogbatch --worker-batch "$((batch / 4)),$batch")
        label="$label (hogbatch $((batch / 4)),$batch)"
    elif [[ $backend == hybrid ]]; then
        extra+=(--workers cpu,gpu --schedule adaptive)
    fi
    [[ $preset == amazon3m ]] && extra+=(--eval-max 2000)
    [[ $mode == bench ]] || extra+=(--eval-every 1)  # P@1 after each epoch
    local failed="| $preset@$preset_scale | $label | $precision | failed: see $name.log in $mode-logs.tar.gz |"
    if [[ $backend == torch ]]; then
        rm -f "$work/$name.jsonl"  # torch_dense.py appends
        python3 scripts/baselines/torch_dense.py --train "$data/train.txt" \
            --test "$data/test.txt" --device cuda --hidden "$p_hidden" --epochs "$epochs" \
            --batch-size "$batch" --precision "$precision" --metrics-out "$work/$name.jsonl" \
            >"$work/$name.log" 2>&1 || echo "$failed" >>"$summary"
    else
        env ${run_env[@]+"${run_env[@]}"} "$root/bin/hslide" train --train "$data/train.txt" \
            --test "$data/test.txt" --backend "$backend" --precision "$precision" --epochs "$epochs" "${network[@]}" \
            --batch-size "$batch" --no-progress --metrics-out "$work/$name.jsonl" "${extra[@]}" \
            >"$work/$name.log" 2>&1 || echo "$failed" >>"$summary"
    fi
    echo "$name: $((SECONDS - started)) s"
    if [[ -s $work/$name.jsonl ]]; then
        python3 - "$work/$name.jsonl" "$preset@$preset_scale" "$label" "$precision" >>"$summary" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = rows[-1]
st = last.get("stage_seconds", {})
stages = " | ".join(f"{st.get(k, 0):.2f}" for k in
                    ("hashing", "active_sets", "forward", "backward", "update", "rebuild",
                     "transfer"))
p1 = ", ".join(f"{r['p@1']:.4f}" for r in rows if "p@1" in r) or "nan"
dropped = f"{last['dropped_mass']:.4f}" if "dropped_mass" in last else ""
touched = f"{100 * last['touched_share']:.0f}%" if "touched_share" in last else ""
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | "
      f"{statistics.median(r['epoch_seconds'] for r in rows):.2f} | "
      f"{p1} | {stages} | {dropped} | {touched} |")
# Hybrid: each worker's share of samples and updates, utilisation and parked time, per epoch.
for r in rows:
    for w in r.get("workers", []):
        wall = w["wall_seconds"] or 1
        print(f"|  | epoch {r['epoch']}: {w['name']} | | "
              f"{w['samples']} samples, {100 * w['update_share']:.0f}% of updates | "
              f"busy {100 * w['utilisation']:.0f}% | "
              f"parked {100 * w['parked_seconds'] / wall:.0f}% | | | | | | | | |")
EOF
    fi
    # What is done so far comes back even if the call is cut off at its limit.
    [[ $out == "$work" ]] || { cp "$summary" "$out/"; ship_logs; }
}

# run_tests: the GPU tests. Here a skipped GPU test is a broken setup (no device seen, no
# cuBLAS), so it fails instead. Returns non-zero if any failed.
run_tests() {
    local t status=0 only
    for t in $gpu_tests; do
        only=()  # test_shard: its GPU ranks' tests (the rest are the CPU's, run by CI)
        [[ $t == test_shard ]] && only=(--gtest_filter='*Gpu*')
        HSLIDE_EXPECT_GPU=1 "$root/bin/$t" ${only[@]+"${only[@]}"} --gtest_output="xml:$work/$t.xml" \
            >"$work/$t.log" 2>&1 || status=1
        grep -E '^\[  (PASSED|FAILED)  \]|tests ran' "$work/$t.log" | sed "s/^/$t: /"
    done
    return $status
}

# run_sanitizers SECONDS: compute-sanitizer memcheck and racecheck, each at most SECONDS, on the
# kernels with shared-memory hash sets, warp shuffles, block-wide picks and the row updates,
# where the machine's CUDA has it. Returns non-zero on a finding.
run_sanitizers() {
    local sanitizer tool rc status=0
    sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 || true)
    if [[ -z $sanitizer ]]; then
        echo "no compute-sanitizer on this machine: kernels not sanitized"
        return 0
    fi
    for tool in memcheck racecheck; do
        rc=0
        # racecheck is slow: the kernels' own tests only, the heavy top-k ones left to memcheck.
        filter='GpuLsh.*:GpuTopK.*:GpuLayers.*:GpuDenseSoftmax.*:GpuBackend.InputCatchUp*-GpuTopK.FusedScoringPassAtScale*'
        [[ $tool == racecheck ]] &&
            filter='GpuLayers.*:GpuDenseSoftmax.*:GpuTopK.Fill*:GpuTopK.Sets*:GpuTopK.ChunkedSelectionIsExact*:GpuLsh.*:GpuTopK.FusedScoringPassMatches*'
        # The kernels' tests are in three binaries; the filter picks in each (none: no test).
        timeout "$1" bash -c 'for t in test_gpu_kernels test_gpu_topk test_gpu_backend; do
                "$0" --tool "$1" --error-exitcode 3 "$2/bin/$t" --gtest_filter="$3" || exit $?
            done' "$sanitizer" "$tool" "$root" "$filter" \
            >"$work/sanitizer-$tool.log" 2>&1 || rc=$?
        if ((rc == 124)); then
            echo "compute-sanitizer $tool: out of time after $1 s (not a finding; see sanitizer-$tool.log)"
        elif ((rc != 0)); then
            status=1
            echo "compute-sanitizer $tool: exit $rc, see sanitizer-$tool.log"
        fi
        grep -E 'ERROR SUMMARY|tests ran' "$work/sanitizer-$tool.log" | sed "s/^/$tool: /"
    done
    return $status
}

# profile_step LABEL LAUNCHES TRAIN-OPTIONS...: Nsight Compute on LAUNCHES kernel launches of
# training on the prepared preset (past the table builds and the first steps), then a table per
# kernel of its launches, time, DRAM bytes and bandwidth per step, appended to $summary. A step
# begins with first_layer_forward_kernel, which every GPU step launches once; only whole steps
# count.
profile_step() {
    local label=$1 count=$2 ncu run_env=()
    shift 2
    # Leading NAME=VALUE arguments: the environment of this profile only.
    while [[ ${1:-} == [A-Z]*=* ]]; do run_env+=("$1"); shift; done
    ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
    [[ -n $ncu ]] || { echo "no ncu on this machine: no step profile"; return 0; }
    timeout 90 env ${run_env[@]+"${run_env[@]}"} "$ncu" --csv --launch-skip 300 --launch-count "$count" --clock-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        "$root/bin/hslide" train --train "$data/train.txt" --test "$data/test.txt" \
        --epochs 2 --eval-every 0 --no-progress "${network[@]}" --batch-size "$p_batch" "$@" \
        >"$work/ncu-$label.csv" 2>"$work/ncu-$label.log" || echo "ncu $label: exit $? (see ncu-$label.log)"
    python3 - "$work/ncu-$label.csv" "$label" "$preset_scale" >>"$summary" <<'EOF'
import collections, csv, re, sys
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
launches = collections.defaultdict(dict)
for r in csv.DictReader(rows):
    name = re.sub(r"^void |<unnamed>::|\(anonymous namespace\)::|hslide::", "", r["Kernel Name"])
    name = name.split("(")[0].split("<")[0]
    launches[(int(r["ID"]), name)][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
# Whole steps only: from the first step's first kernel to the last step's start.
marks = sorted(i for i, name in launches if name == "first_layer_forward_kernel")
steps = max(len(marks) - 1, 1)
if len(marks) > 1:
    launches = {k: v for k, v in launches.items() if marks[0] <= k[0] < marks[-1]}
per = collections.defaultdict(lambda: [0, 0.0, 0.0])
for (_, name), m in launches.items():
    per[name][0] += 1
    per[name][1] += m.get("gpu__time_duration.sum", 0) * 1e-9
    per[name][2] += m.get("dram__bytes_read.sum", 0) + m.get("dram__bytes_write.sum", 0)
total = sum(v[1] for v in per.values()) or 1
print(f"\nNsight Compute, Amazon-670K-shaped at scale {sys.argv[3]}, {sys.argv[2]}: "
      f"{len(launches)} launches over {steps} steps; kernel time {1e3 * total / steps:.3f} ms a step\n")
print("| kernel | launches/step | share | us/step | MB/step | TB/s |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for name, (n, t, b) in sorted(per.items(), key=lambda kv: -kv[1][1]):
    print(f"| {name} | {n / steps:.1f} | {100 * t / total:.1f}% | {1e6 * t / steps:.1f} | "
          f"{b / steps / 1e6:.1f} | {b / t / 1e12 if t else 0:.2f} |")
EOF
    [[ $out == "$work" ]] || { cp "$summary" "$out/"; ship_logs; }
}


# run_peers: napkinXC (default settings, all cores) and hslide on the GPU (its defaults, and
# --loss logistic: the CPU's default, which the GPU's auto takes once this table shows it
# winning there too) on the real sets in the pack, appended to $summary as one table.
run_peers() {
    local threads set args=() started
    threads=$(nproc)
    printf '\n## Beside napkinXC (issue 30: the GPU row)\n\n' >>"$summary"
    if [[ ! -x $root/bin/nxc ]]; then
        echo "no napkinXC in the pack: run 'NAPKINXC=/path/to/nxc $0 pack'" >>"$summary"
        return 0
    fi
    {
        echo "napkinXC 0.7.2's defaults with -t $threads; hslide --backend gpu with its defaults"
        echo "(--loss auto: the softmax on a GPU) and with --loss logistic, and a test evaluation"
        echo "after every epoch (to napkinXC's P@1: hslide's epochs' training seconds until the"
        echo "first epoch at or above it)."
        echo
        echo "| data | napkinXC P@1 | napkinXC train s | hslide --loss | hslide P@1 | hslide train s | hslide s to napkinXC's P@1 | speedup |"
        echo "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"
    } >>"$summary"
    for set in debian-recs bibtex corel5k; do
        case $set in
        debian-recs) args=(--train "$root/data/$set/train.txt" --test "$root/data/$set/test.txt") ;;
        bibtex) args=(--train "$root/data/$set/Bibtex_data.txt"
            --train-split "$root/data/$set/bibtex_trSplit.txt"
            --test-split "$root/data/$set/bibtex_tstSplit.txt") ;;
        corel5k) args=(--train "$root/data/$set/corel5k_train.txt"
            --test "$root/data/$set/corel5k_test.txt") ;;
        esac
        [[ -f ${args[1]} ]] || continue
        started=$SECONDS
        rm -f "$work/peers-$set-nxc.jsonl" "$work/peers-$set-hslide"*.jsonl
        TIME_BIN="$root/bin/time" scripts/baselines/napkinxc.sh --nxc "$root/bin/nxc" \
            --threads "$threads" "${args[@]}" --metrics-out "$work/peers-$set-nxc.jsonl" \
            >"$work/peers-$set-nxc.csv" 2>"$work/peers-$set-nxc.log" ||
            echo "| $set | napkinXC failed: see peers-$set-nxc.log |" >>"$summary"
        for loss in auto logistic; do
            local hs=peers-$set-hslide-$loss
            "$root/bin/hslide" train "${args[@]}" --backend gpu --loss "$loss" --eval-every 1 \
                --no-progress --metrics-out "$work/$hs.jsonl" >"$work/$hs.log" 2>&1 ||
                echo "| $set | hslide --loss $loss failed: see $hs.log |" >>"$summary"
            python3 - "$set" "$loss" "$work/peers-$set-nxc.jsonl" "$work/$hs.jsonl" \
                >>"$summary" <<'EOF'
import json, os, sys
name, loss, nxc_file, hs_file = sys.argv[1:5]
if not (os.path.exists(nxc_file) and os.path.exists(hs_file)):
    sys.exit(0)
nxc = [json.loads(l) for l in open(nxc_file) if l.strip()][-1]
hs = [json.loads(l) for l in open(hs_file) if l.strip()]
target, nxc_s = nxc["p@1"], nxc["epoch_seconds"]
spent, to_target = 0.0, None
for r in hs:
    spent += r["epoch_seconds"]
    if to_target is None and r.get("p@1", 0) >= target:
        to_target = spent
reached = f"{to_target:.2f}" if to_target is not None else "not reached"
speedup = f"{nxc_s / to_target:.1f}x" if to_target else ""
print(f"| {name} | {target:.4f} | {nxc_s:.2f} | {loss} | {hs[-1].get('p@1', float('nan')):.4f} | "
      f"{sum(r['epoch_seconds'] for r in hs):.2f} | {reached} | {speedup} |")
EOF
        done
        echo "peers $set: $((SECONDS - started)) s"
        [[ $out == "$work" ]] || { cp "$summary" "$out/"; ship_logs; }
    done
}

# The pack's mpirun for this check's runs: as root (the GPU machine's tool runs as root), more
# ranks than cores allowed, and no binding (a rank's OpenMP threads would share one core).
mpirun_opts=(--allow-run-as-root --oversubscribe --bind-to none)

# run_mpi_check: whether the pack's Open MPI works where it was unpacked, appended to $summary:
# its folders (ompi_info), where hslide's and mpirun's MPI libraries resolve (ldd), then 2 CPU
# ranks of the packed hslide on the tiny preset beside one process (exact top-k: the same P@1
# every epoch). Where the machine has strace, mpirun and the ranks run under it, and every file
# of Open MPI, PMIx, hwloc, libevent or munge they opened outside the pack is listed (none: the
# unpacked copy alone served them). Returns non-zero when the ranks failed or such a file was
# opened.
run_mpi_check() {
    local status=0 rc=0 tiny=() trace=() opened foreign probed
    local libs='libmpi|libopen-(pal|rte)|libpmix|libhwloc|libevent|libmunge|libmca_common'
    { echo; echo "## Open MPI from the pack"; echo; } >>"$summary"
    if [[ ! -x $root/bin/orterun ]]; then
        echo "no Open MPI in the pack (packed before the \`ranks\` step): run '$0 pack' again" >>"$summary"
        return 1
    fi
    {
        echo '```'
        echo "mpirun: $(command -v mpirun) -> $(readlink -f "$(command -v mpirun)")"
        ompi_info --version | head -1
        for p in prefix libdir pkglibdir pkgdatadir sysconfdir; do ompi_info --path "$p" --parsable; done
        ompi_info --param mca base --level 9 --parsable | grep -E 'component_path:value' || true
        ldd "$root/bin/hslide" "$root/bin/orterun" | grep -E "^/|$libs"
        echo '```'
    } >>"$summary" 2>&1
    [[ -f $work/data-tiny/test.txt ]] || "$root/bin/hslide" gen --preset tiny --out "$work/data-tiny" -q
    tiny=(--train "$work/data-tiny/train.txt" --test "$work/data-tiny/test.txt" --hidden 64 --seed 5
        --epochs 2 --threads 1 --no-progress --output-sparsity topk --top-k-search exact
        --top-k 16 --min-active 64 --loss softmax)  # the loss these rows were first compared at
    rm -f "$work"/mpi-*.jsonl "$work"/mpi-strace*
    timeout -k 5 60 "$root/bin/hslide" train "${tiny[@]}" --metrics-out "$work/mpi-one.jsonl" \
        >"$work/mpi-one.log" 2>&1 || echo "one process: exit $? (mpi-one.log)" >>"$summary"
    command -v strace >/dev/null &&
        trace=(strace -ff -qq -e "trace=openat,execve" -e signal=none -o "$work/mpi-strace")
    timeout -k 10 120 ${trace[@]+"${trace[@]}"} mpirun "${mpirun_opts[@]}" -np 2 "$root/bin/hslide" \
        train "${tiny[@]}" --metrics-out "$work/mpi-two.jsonl" >"$work/mpi-two.log" 2>&1 || rc=$?
    # One file a process (-ff: no call split across lines by another's), then one file.
    if compgen -G "$work/mpi-strace.*" >/dev/null; then
        cat "$work"/mpi-strace.* >"$work/mpi-strace.txt"
        rm -f "$work"/mpi-strace.[0-9]*
    fi
    {
        echo
        if ((rc == 0)) && grep -q '2 ranks (MPI' "$work/mpi-two.log"; then
            echo "2 ranks of hslide (cpu, tiny preset, exact top-k) under the pack's mpirun:" \
                "$(grep -o '2 ranks (MPI.*): the output' "$work/mpi-two.log" | head -1 | sed 's/: the output//')"
            python3 - "$work/mpi-one.jsonl" "$work/mpi-two.jsonl" <<'EOF' || status=1
import json, sys
one, two = ([json.loads(l) for l in open(f) if l.strip()] for f in sys.argv[1:3])
for a, b in zip(one, two):
    print(f"- epoch {a['epoch']}: P@1 {a['p@1']:.4f} in one process, {b['p@1']:.4f} on 2 ranks; "
          f"loss {a['loss']:.6f}, {b['loss']:.6f}")
same = len(one) == len(two) and all(f"{a['p@1']:.4f}" == f"{b['p@1']:.4f}" for a, b in zip(one, two))
print("- the same P@1 every epoch" if same else "- P@1 DIFFERS between one process and 2 ranks")
sys.exit(not same)
EOF
        else
            status=1
            echo "2 ranks under the pack's mpirun FAILED (exit $rc$( ((rc == 124)) && echo ', timed out after 120 s')):"
            echo '```'
            tail -15 "$work/mpi-two.log"
            echo '```'
        fi
        if [[ -s $work/mpi-strace.txt ]]; then
            # Files opened (not merely probed) and programs run, outside the pack.
            opened=$(grep -E 'openat\(|execve\(' "$work/mpi-strace.txt" | grep -v ' = -1 ' |
                grep -oE '"/[^"]*"' | tr -d '"' | sort -u)
            foreign=$(grep -vE "^($root|$work|/proc|/sys|/dev|/tmp)" <<<"$opened" |
                grep -E "openmpi|pmix|hwloc|$libs" || true)
            probed=$(grep -E 'openat\(' "$work/mpi-strace.txt" | grep ' = -1 ' | grep -oE '"/[^"]*"' |
                tr -d '"' | sort -u | grep -vE "^($root|$work|/proc|/sys|/dev|/tmp)" |
                grep -cE "openmpi|pmix|hwloc|$libs" || true)
            echo "- strace -f of mpirun and both ranks: $(grep -c "^$root/" <<<"$opened") files of the pack" \
                "opened, $(grep -cE "^$root/lib/(openmpi|pmix)/" <<<"$opened") of them plugins," \
                "$(grep -cE "^$root/etc/" <<<"$opened") configuration files," \
                "$(grep -cE "^$root/share/(openmpi|pmix)/" <<<"$opened") help texts"
            if [[ -n $foreign ]]; then
                status=1
                echo "- FILES OF OPEN MPI'S RUNTIME OPENED OUTSIDE THE PACK:"
                sed 's/^/  - /' <<<"$foreign"
            else
                echo "- no file of Open MPI, PMIx, hwloc, libevent or munge opened outside the pack" \
                    "(${probed:-0} paths of theirs outside it looked for and not found)"
            fi
        else
            echo "- no strace on this machine: where the files came from is not traced"
        fi
    } >>"$summary"
    return $status
}

# rank_run LABEL SECONDS COMMAND...: one run of run_ranks, at most SECONDS (then killed, with its
# ranks); its row (what ran, or why not) appended to $summary. Each @metrics in COMMAND becomes
# --metrics-out $work/ranks-LABEL.jsonl (one in each program of an MPMD launch, as its ranks
# must agree; rank 0 writes it); its GPU memory per process is sampled by nvidia-smi.
# Returns 0 whatever the run did: the row says it.
rank_run() {
    local label=$1 limit=$2 name rc=0 started=$SECONDS smi_pid="" why=ran command=() a
    shift 2
    name=ranks-$label
    for a in "$@"; do
        if [[ $a == @metrics ]]; then command+=(--metrics-out "$work/$name.jsonl"); else command+=("$a"); fi
    done
    rm -f "$work/$name.jsonl" "$work/$name.gpumem"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 500 \
            >"$work/$name.gpumem" 2>/dev/null &
        smi_pid=$!
    fi
    timeout -k 10 "$limit" "${command[@]}" >"$work/$name.log" 2>&1 || rc=$?
    if [[ -n $smi_pid ]]; then
        kill "$smi_pid" 2>/dev/null || true
        wait "$smi_pid" 2>/dev/null || true
    fi
    echo "$name: $((SECONDS - started)) s, exit $rc"
    if ((rc == 124 || rc == 137)); then
        why="timed out after $limit s (killed with its ranks)"
    elif ((rc != 0)); then
        # The error hslide printed (with its rank), else Open MPI's, else the log's last line.
        why=$(grep -m1 -E '^hslide .*error' "$work/$name.log" ||
            grep -m1 -iE 'error|MPI_ABORT' "$work/$name.log" || tail -1 "$work/$name.log")
        why="exit $rc: ${why//|/\\|}"
        grep -qiE 'only --backend|unsupported|not supported' "$work/$name.log" && why="refused, $why"
    fi
    python3 - "$work/$name.jsonl" "$work/$name.gpumem" "$label" "$why" \
        "$(grep -o 'output rows per rank [^;]*' "$work/$name.log" | head -1)" >>"$summary" <<'EOF'
import collections, json, os, sys
metrics, gpumem, label, result, split = sys.argv[1:6]
rows = [json.loads(l) for l in open(metrics) if l.strip()] if os.path.exists(metrics) else []
mem = collections.defaultdict(int)
if os.path.exists(gpumem):
    for line in open(gpumem):
        f = [x.strip() for x in line.split(",")]
        if len(f) == 2 and f[1].isdigit():
            mem[f[0]] = max(mem[f[0]], int(f[1]))
secs = ", ".join(f"{r['epoch_seconds']:.2f}" for r in rows) or "-"
p1 = ", ".join(f"{r['p@1']:.4f}" for r in rows if "p@1" in r) or "-"
comm = ", ".join(f"{r.get('stage_seconds', {}).get('transfer', 0):.2f}" for r in rows) or "-"
rss = f"{rows[-1]['peak_rss_bytes'] / 2**30:.2f} GiB" if rows and "peak_rss_bytes" in rows[-1] else "-"
gpu = " + ".join(f"{m / 1024:.1f}" for m in sorted(mem.values(), reverse=True)) + " GiB" if mem else "-"
print(f"| {label} | {result}{'; ' + split if split else ''} | {secs} | {p1} | {comm} | {rss} | {gpu} |")
EOF
    [[ $out == "$work" ]] || { cp "$summary" "$out/"; ship_logs; }
}

# run_ranks EPOCHS: issue 32's GPU rows on the prepared preset, exact top-k, each mpirun under a
# timeout and each run only while the budget has room for it (fits: the `all` budget's, or the
# `ranks` step's own): the pack's Open MPI (run_mpi_check); 1 GPU process against 2 ranks on the
# one GPU (the same P@1 every epoch, s/epoch of both); a GPU rank holding three quarters of the
# output rows beside a CPU rank holding the rest (MPMD: one mpirun, two programs); 2 CPU ranks
# (the pack's MPI at this size, whatever the GPU ranks do); CPU ranks of 3/4 and 1/4 of the cores
# with --shard-weights auto (the split their measured rates give). A run the engine refuses is a
# row saying so, with hslide's message.
run_ranks() {
    local epochs=$1 threads half rest most few common=() one=gpu-1-process two=gpu-2-ranks
    threads=$(nproc)
    half=$((threads > 1 ? threads / 2 : 1))
    rest=$((threads > 2 ? threads - 2 : 1))
    most=$((threads > 3 ? threads * 3 / 4 : 1))
    few=$((threads > most ? threads - most : 1))
    { echo; echo "## Ranks (issue 32): the output layer sharded across MPI ranks"; } >>"$summary"
    run_mpi_check || echo "the pack's Open MPI check failed: see the summary" >&2
    common=(--train "$data/train.txt" --test "$data/test.txt" "${network[@]}" --batch-size "$p_batch"
        --epochs "$epochs" --output-sparsity topk --top-k-search exact --seed 1 --eval-every 1
        --no-progress @metrics)
    {
        echo
        echo "$preset at scale $preset_scale, $epochs epochs, exact top-k, fp32, on $threads cores."
        echo "transfer: the collectives' seconds an epoch (rank 0's stage_seconds.transfer). Memory:"
        echo "rank 0's peak RSS; each process's GPU memory (nvidia-smi, sampled every 0.5 s)."
        echo
        echo "| run | result | s/epoch | P@1 per epoch | transfer s/epoch | peak RSS (rank 0) | GPU memory |"
        echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    } >>"$summary"
    fits 40 && rank_run "$one" 120 "$root/bin/hslide" train --backend gpu --threads "$half" "${common[@]}"
    fits 40 && rank_run "$two" 120 mpirun "${mpirun_opts[@]}" -np 2 "$root/bin/hslide" train \
        --backend gpu --threads "$half" "${common[@]}"
    fits 40 && rank_run gpu-3-cpu-1 150 mpirun "${mpirun_opts[@]}" \
        -np 1 "$root/bin/hslide" train --backend gpu --threads 2 --shard-weights 3,1 "${common[@]}" \
        : -np 1 "$root/bin/hslide" train --backend cpu --threads "$rest" --shard-weights 3,1 "${common[@]}"
    # The same pair split by their measured rates and the memory each can spare (the GPU's).
    fits 40 && rank_run gpu-cpu-auto 150 mpirun "${mpirun_opts[@]}" \
        -np 1 "$root/bin/hslide" train --backend gpu --threads 2 --shard-weights auto "${common[@]}" \
        : -np 1 "$root/bin/hslide" train --backend cpu --threads "$rest" --shard-weights auto "${common[@]}"
    fits 40 && rank_run cpu-2-ranks 150 mpirun "${mpirun_opts[@]}" -np 2 "$root/bin/hslide" train \
        --backend cpu --threads "$half" "${common[@]}"
    # Ranks of three quarters and a quarter of the cores, split by their measured rates.
    fits 40 && rank_run cpu-auto 150 mpirun "${mpirun_opts[@]}" \
        -np 1 "$root/bin/hslide" train --backend cpu --threads "$most" --shard-weights auto \
        "${common[@]}" : -np 1 "$root/bin/hslide" train --backend cpu --threads "$few" \
        --shard-weights auto "${common[@]}"
    if [[ -s $work/ranks-$one.jsonl && -s $work/ranks-$two.jsonl ]]; then
        python3 - "$work/ranks-$one.jsonl" "$work/ranks-$two.jsonl" >>"$summary" <<'EOF'
import json, sys
one, two = ([json.loads(l) for l in open(f) if l.strip()] for f in sys.argv[1:3])
same = len(one) == len(two) and all(f"{a['p@1']:.4f}" == f"{b['p@1']:.4f}" for a, b in zip(one, two))
ratio = sum(r["epoch_seconds"] for r in two) / max(sum(r["epoch_seconds"] for r in one), 1e-9)
print(f"\n2 GPU ranks against 1 process: {'the same' if same else 'NOT the same'} P@1 every epoch "
      f"(four digits); {ratio:.2f}x its seconds an epoch")
EOF
    fi
    {
        echo
        echo "Commands (the pack's mpirun with ${mpirun_opts[*]}; every run adds the common options):"
        echo "- 1 GPU process: hslide train --backend gpu --threads $half"
        echo "- 2 ranks on one GPU: mpirun -np 2 hslide train --backend gpu --threads $half"
        echo "- GPU + CPU: mpirun -np 1 hslide train --backend gpu --threads 2 --shard-weights 3,1 : -np 1 hslide train --backend cpu --threads $rest --shard-weights 3,1"
        echo "- GPU + CPU by measured rate: the same with --shard-weights auto on both"
        echo "- 2 CPU ranks: mpirun -np 2 hslide train --backend cpu --threads $half"
        echo "- CPU ranks by measured rate: mpirun -np 1 hslide train --backend cpu --threads $most --shard-weights auto : -np 1 hslide train --backend cpu --threads $few --shard-weights auto"
        echo "- common: ${common[*]//$work\//} (@metrics: --metrics-out ranks-RUN.jsonl)"
    } >>"$summary"
}

case "$mode" in
peers)
    summary="$work/summary.md"
    echo "# gpu_check.sh peers ($(date -u +%FT%TZ))" >"$summary"
    run_peers
    cat "$summary"
    ;;
mpi)
    summary="$work/summary.md"
    echo "# gpu_check.sh mpi ($(date -u +%FT%TZ)): the pack at $root" >"$summary"
    status=0
    run_mpi_check || status=1
    cat "$summary"
    [[ $out == "$work" ]] || { cp "$summary" "$out/"; ship_logs; }
    exit $status
    ;;
ranks)
    # Issue 32's rows alone: PRESET@SCALE (amazon670k@0.02), EPOCHS (2), in BUDGET seconds (540).
    epochs=${2:-2}
    scale=1
    budget=${4:-540}
    fits() { ((budget - SECONDS > $1)); }
    summary="$work/summary.md"
    echo "# gpu_check.sh ranks ($(date -u +%FT%TZ))" >"$summary"
    prepare_preset "${3:-amazon670k@0.02}"
    run_ranks "$epochs"
    printf '\ndone in %s s\n' "$SECONDS" >>"$summary"
    [[ $out == "$work" ]] || { cp "$summary" "$out/"; ship_logs; }
    cat "$summary"
    ;;
tests)
    status=0
    run_tests >"$work/tests.txt" || status=1
    cat "$work/tests.txt"
    # The logs so far come back even if the sanitizers below outlast the call's time limit.
    [[ $out == "$work" ]] || ship_logs
    run_sanitizers 150 || status=1
    [[ $out == "$work" ]] || ship_logs
    exit $status
    ;;
bench | topk)
    if [[ $mode == topk ]]; then
        # Issue 19: top-k against dense (and LSH) at the issue's sizes, top-k first.
        scale=1
        epochs=${2:-3}
        presets=amazon670k@1,wikilshtc325k@0.25,amazon3m@0.02
    else
        scale=${2:-0.1}
        epochs=${3:-2}
        presets=${4:-amazon670k,wikilshtc325k,amazon3m}
    fi
    summary="$work/summary.md"
    summary_head "Scale $scale (NAME@S: S), $epochs epochs." >"$summary"
    for spec in ${presets//,/ }; do
        prepare_preset "$spec"
        # BACKEND PRECISION [BATCH [VARIANT]] (default: the preset's batch). On amazon670k, gpu
        # bf16 at 1024 too:
        # how much of a step at 256 is per-step overhead (launches, the wait for the set sizes)
        # tells whether CUDA graphs and a wait-free step are worth building; and with the table
        # rebuilds on a side stream (--gpu-async-rebuild), to decide its default; and the hybrid
        # both adaptive (its default: equal update shares, so the GPU worker's batches grow
        # far past the single backend's) and hogbatch with the GPU worker at the single
        # backend's batch (a quarter of it on the CPU), to see which reaches a P@1 sooner.
        configs=("gpu fp32" "gpu bf16" "gpu bf16 $p_batch lsh" "gpu-dense bf16" "cpu fp32")
        [[ $preset == amazon670k ]] &&
            configs+=("gpu bf16 1024" "gpu bf16 $p_batch async" "hybrid fp32" "hybrid fp32 $p_batch hog")
        # The PyTorch baseline in fp32 and in bf16 autocast (the fastest dense baseline the
        # sparse paths are measured against, issue 22).
        [[ $preset == amazon670k ]] && have_torch_cuda && configs+=("torch fp32" "torch bf16")
        # 2.8M labels: exact scores of every test point would dominate the run.
        [[ $preset == amazon3m ]] && configs=("gpu bf16" "gpu bf16 $p_batch lsh" "gpu-dense bf16")
        [[ $mode == topk ]] && configs=("gpu bf16 $p_batch topk" "gpu bf16 $p_batch topk-fc"
            "gpu-dense bf16" "gpu bf16 $p_batch lsh")
        # Issue 19's hybrid: top-k on the GPU worker beside LSH on a CPU worker.
        [[ $mode == topk && $preset == amazon670k ]] && configs+=("hybrid bf16 $p_batch topk-gpu")
        for config in "${configs[@]}"; do run_config "$config"; done
    done
    cat "$summary"
    ;;
all)
    # Issue 22's one check. Its parts run in order of what matters most, each only while the
    # budget (seconds, default 460: inside 8 minutes with the unpacking) leaves room for its
    # estimate, so that a slow machine loses the last parts, not the whole summary.
    epochs=${2:-3}
    budget=${3:-460}
    summary="$work/summary.md"
    status=0
    fits() { ((budget - SECONDS > $1)); }
    {
        echo "# gpu_check.sh all ($(date -u +%FT%TZ))"
        echo
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
        echo
        echo "## GPU tests"
        echo
    } >"$summary"
    # The datasets are generated on the CPU while the GPU tests run.
    scale=1
    (for spec in amazon670k@1 wikilshtc325k@0.25 amazon3m@0.02 amazon670k@0.02; do
        prepare_preset "$spec"
    done) >"$work/gen.log" 2>&1 &
    gen_pid=$!
    run_tests >>"$summary" || status=1
    wait "$gen_pid" || { cat "$work/gen.log" "$summary"; echo "gpu_check.sh: data generation failed" >&2; exit 1; }
    echo "data ready at $SECONDS s"
    {
        echo
        summary_head "Amazon-670K-shaped at full size, $epochs epochs; WikiLSHTC-325K-shaped at scale 0.25 and Amazon-3M-shaped at scale 0.02, 2 epochs."
    } >>"$summary"
    # "CONFIG:ESTIMATED SECONDS" (2026-11-26's H200 run, rounded up), run while the estimate
    # fits: what issues 19 and 22 check first, PyTorch (2 minutes a precision) last.
    prepare_preset amazon670k@1
    parts=("gpu bf16 $p_batch topk:30" "gpu bf16 $p_batch topk-fused:30" "gpu-dense bf16:45"
        "gpu bf16 $p_batch lsh:25" "gpu bf16 $p_batch topk-nopool:30" "gpu bf16 $p_batch topk-fc:30"
        "hybrid bf16 $p_batch topk-gpu:30")
    for part in "${parts[@]}"; do fits "${part##*:}" && run_config "${part%:*}"; done
    epochs=2
    for spec in amazon3m@0.02 wikilshtc325k@0.25; do
        prepare_preset "$spec"
        for part in "gpu bf16 $p_batch topk:20" "gpu bf16 $p_batch topk-fc:20" "gpu-dense bf16:20" \
            "gpu bf16 $p_batch lsh:20"; do
            fits "${part##*:}" && run_config "${part%:*}"
        done
    done
    if fits 60; then
        { echo; echo "## compute-sanitizer"; echo; } >>"$summary"
        run_sanitizers 40 >>"$summary" || status=1
    fi
    # One step's kernels, on a slice of Amazon-670K with its full label and feature counts.
    prepare_preset amazon670k@0.02
    # About 0.2 s a profiled launch; a step launches about 40 (LSH), 90 (top-k), 15 (dense).
    fits 40 && profile_step lsh-bf16 130 --backend gpu --precision bf16 --output-sparsity lsh
    fits 50 && profile_step topk-bf16 200 --backend gpu --precision bf16 --output-sparsity topk
    fits 30 && profile_step topk-fused-bf16 120 HSLIDE_GPU_TOPK_FUSED=1 --backend gpu \
        --precision bf16 --output-sparsity topk
    fits 30 && profile_step dense-bf16 70 --backend gpu-dense --precision bf16
    prepare_preset amazon670k@1
    epochs=${2:-3}
    have_torch_cuda && fits 130 && run_config "torch bf16"
    fits 60 && run_peers
    # Issue 32's ranks on the profiles' slice of Amazon-670K, 2 epochs a run, each run only
    # while 40 s are left (about 60 s in all while GPU ranks are refused; more once they train),
    # before the last PyTorch row, which already ran only as time was left.
    if fits 70; then
        prepare_preset amazon670k@0.02
        run_ranks 2
        prepare_preset amazon670k@1
    fi
    have_torch_cuda && fits 150 && run_config "torch fp32"
    printf '\ndone in %s s\n' "$SECONDS" >>"$summary"
    [[ $out == "$work" ]] || { cp "$summary" "$out/"; ship_logs; }
    cat "$summary"
    exit $status
    ;;
reproduce)
    scale=${2:-0.01}
    epochs=${3:-2}
    preset=${4:-amazon670k}
    shift $(($# < 4 ? $# : 4))
    # The python with PyTorch and matplotlib: the PATH's python3 on the GPU machine (a venv),
    # Debian's elsewhere.
    if [[ -z ${PYTHON:-} ]]; then
        for candidate in "$(command -v python3)" /usr/bin/python3; do
            if "$candidate" -c 'import torch, matplotlib' 2>/dev/null; then
                export PYTHON=$candidate
                break
            fi
        done
    fi
    status=0
    scripts/reproduce.sh --preset "$preset" --scale "$scale" --epochs "$epochs" \
        --hslide "$root/bin/hslide" --out "$work/report" --data-cache "$work/data" "$@" \
        2>&1 | tee "$work/reproduce.log" || status=1
    if [[ $out != "$work" ]]; then
        for f in report.md results.csv hardware.json p1_vs_time.png stages.png; do
            [[ -f $work/report/$f ]] && cp "$work/report/$f" "$out/"
        done
        ship_logs
    fi
    exit $status
    ;;
esac
