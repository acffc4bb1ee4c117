// Creates backends by name: the one place that knows which backends this build has.
#include "hslide/backend.hpp"

#include "cpu/cpu_backend.hpp"
#include "cpu/dense_backend.hpp"
#include "hslide/error.hpp"
#if HSLIDE_HAVE_CUDA
#include "gpu/gpu_backend.hpp"
#endif

#include <algorithm>

namespace hslide {

stage_times& stage_times::operator+=(const stage_times& o) {
    hashing += o.hashing;
    active_sets += o.active_sets;
    forward += o.forward;
    backward += o.backward;
    update += o.update;
    rebuild += o.rebuild;
    transfer += o.transfer;
    return *this;
}

step_report& step_report::operator+=(const step_report& o) {
    samples += o.samples;
    loss_sum += o.loss_sum;
    full_softmax_samples += o.full_softmax_samples;
    dropped_mass_sum += o.dropped_mass_sum;
    if (active_per_layer.size() < o.active_per_layer.size())
        active_per_layer.resize(o.active_per_layer.size(), 0);
    for (size_t l = 0; l < o.active_per_layer.size(); ++l)
        active_per_layer[l] += o.active_per_layer[l];
    times += o.times;
    seconds += o.seconds;
    return *this;
}

worker_stats& worker_stats::operator+=(const worker_stats& o) {
    if (o.batches > 0) {
        batch_min = batches > 0 ? std::min(batch_min, o.batch_min) : o.batch_min;
        batch_max = std::max(batch_max, o.batch_max);
        batch_last = o.batch_last;
    }
    const uint64_t all_merges = merges + o.merges;
    staleness_mean = all_merges
                         ? (staleness_mean * double(merges) + o.staleness_mean * double(o.merges)) /
                               double(all_merges)
                         : 0;
    staleness_max = std::max(staleness_max, o.staleness_max);
    samples += o.samples;
    batches += o.batches;
    batch_mean = batches ? double(samples) / double(batches) : 0;
    busy_seconds += o.busy_seconds;
    wall_seconds += o.wall_seconds;
    merges = all_merges;
    merge_seconds += o.merge_seconds;
    merge_wait_seconds += o.merge_wait_seconds;
    merge_import_seconds += o.merge_import_seconds;
    train_cpu_seconds += o.train_cpu_seconds;
    merge_cpu_seconds += o.merge_cpu_seconds;
    rows_merged += o.rows_merged;
    rows_pulled += o.rows_pulled;
    parked_seconds += o.parked_seconds;
    return *this;
}

std::unique_ptr<backend> create_backend(const backend_options& options, model_state initial,
                                        const train_config& train) {
    if (options.kind == "cpu")
        return std::make_unique<cpu::cpu_backend>(
            std::move(initial), train, options.threads,
            cpu::kernels_for(options.isa ? *options.isa : active_isa()), options.precision);
    if (options.kind == "cpu-dense")
        return std::make_unique<cpu::dense_backend>(
            std::move(initial), train, options.threads,
            cpu::kernels_for(options.isa ? *options.isa : active_isa()), options.precision);
    if (options.kind == "gpu" || options.kind == "gpu-dense") {
#if HSLIDE_HAVE_CUDA
        return gpu::create_gpu_backend(std::move(initial), train, options.device, options.precision,
                                       options.kind == "gpu-dense", options.gpu_async_rebuild);
#else
        throw error(error_kind::unsupported,
                    "--backend=" + options.kind +
                        ": this build of hslide has no CUDA backend (rebuild with nvcc "
                        "available and -DHSLIDE_CUDA=ON)");
#endif
    }
    HSLIDE_CHECK(options.kind != "hybrid",
                 "a hybrid backend is made of workers: create it with create_hybrid_backend");
    throw error(
        error_kind::invalid_argument,
        "unknown backend '" + options.kind + "' (valid: cpu, cpu-dense, gpu, gpu-dense, hybrid)");
}

}  // namespace hslide
