// The CUDA backend's LSH tables (design in gpu_backend_impl.cuh): rebuilds on the main
// stream, and asynchronous ones on a side stream swapped in when they land.
#include "gpu_backend_impl.cuh"

namespace hslide::gpu {

void gpu_backend::rebuild_output_tables() {
    if (rebuild_in_flight_) {
        // It uses the codes and the scratch, and this rebuild is newer: the main stream waits
        // for it, and its tables are not used.
        HSLIDE_CUDA_CHECK(cudaStreamWaitEvent(stream_, handles_.rebuild_end, 0));
        rebuild_in_flight_ = rebuild_wanted_ = false;
    }
    const lsh_config& cfg = shape_.config.layers[1].lsh;
    if (!hash_ || hash_->seed() != shape_.hash_seeds[1]) {
        // Taken only once uploaded: after a failed upload the next call tries again.
        auto family = hash_family::create(cfg, layers_[1].width, shape_.hash_seeds[1]);
        device_hash_.upload(family->function_data(), stream_);
        hash_ = std::move(family);
    }
    build_output_tables(tables_[front_], stream_);
}

void gpu_backend::build_output_tables(device_tables& tables, cudaStream_t stream) {
    const lsh_config& cfg = shape_.config.layers[1].lsh;
    const device_layer& out = layers_[1];
    table_codes_.reserve(size_t(out.rows) * cfg.L, "LSH codes of the output neurons");
    device_hash_.hash_rows(out.weights.data(), out.stride, out.rows, table_codes_.data(), stream);
    // The priorities depend on the step count, as the CPU's insertion order does.
    tables.build(table_codes_.data(), out.rows, cfg.L, cfg.K * cfg.bits_per_hash,
                 cfg.bucket_capacity, derive_seed(shape_.hash_seeds[1], shape_.adam_step),
                 table_scratch_, stream);
}

void gpu_backend::start_async_rebuild() {
    adopt_rebuilt_tables(/*wait=*/false);
    if (rebuild_in_flight_) {
        rebuild_wanted_ = true;
        return;
    }
    // The spare tables were last read by work queued on the main stream before the last
    // swap, and the weights are those of the steps queued so far: the side stream starts
    // after both. The steps queued after this one update the weights while they are hashed:
    // a row may be read partly before and partly after an update (each float is old or new),
    // the staleness SLIDE's unsynchronised threads accept on the CPU.
    try {
        HSLIDE_CUDA_CHECK(cudaEventRecord(handles_.weights_ready, stream_));
        HSLIDE_CUDA_CHECK(cudaStreamWaitEvent(handles_.side, handles_.weights_ready, 0));
        HSLIDE_CUDA_CHECK(cudaEventRecord(handles_.rebuild_begin, handles_.side));
        build_output_tables(tables_[front_ ^ 1], handles_.side);
        HSLIDE_CUDA_CHECK(cudaEventRecord(handles_.rebuild_end, handles_.side));
    } catch (...) {
        // Part of the build may be queued, with nothing to wait for it: finish it here, so
        // that no later build shares the codes and scratch with it. Asked for again later.
        cudaStreamSynchronize(handles_.side);
        cudaGetLastError();
        rebuild_wanted_ = true;
        throw;
    }
    rebuild_wanted_ = false;
    rebuild_in_flight_ = true;
}

void gpu_backend::adopt_rebuilt_tables(bool wait) {
    if (!rebuild_in_flight_) return;
    if (wait) {
        HSLIDE_CUDA_CHECK(cudaEventSynchronize(handles_.rebuild_end));
    } else {
        const cudaError_t status = cudaEventQuery(handles_.rebuild_end);
        if (status == cudaErrorNotReady) {
            cudaGetLastError();  // "not ready" is no error: clear it for the next launch check
            return;
        }
        HSLIDE_CUDA_CHECK(status);
    }
    float ms = 0;
    HSLIDE_CUDA_CHECK(cudaEventElapsedTime(&ms, handles_.rebuild_begin, handles_.rebuild_end));
    rebuild_seconds_ += double(ms) / 1000.0;
    // Work queued from here on reads the new tables; the old ones become the spare.
    front_ ^= 1;
    rebuild_in_flight_ = false;
}

active_set_params gpu_backend::output_active_params(bool training, uint64_t seed) const {
    const layer_config& cfg = shape_.config.layers[1];
    return active_set_params::of(layers_[1].rows, cfg.lsh, cfg.active, training, seed);
}

void gpu_backend::refresh_selections(bool new_functions) {
    if (!lsh_output()) return;
    activate();
    if (new_functions)
        shape_.hash_seeds[1] = derive_seed(shape_.hash_seeds[1], shape_.adam_step + 1);
    if (async_rebuild_ && !new_functions) {
        // New functions change the samples' codes too: those rebuilds stay synchronous.
        start_async_rebuild();
        return;
    }
    rebuild_output_tables();
    // Wait for it, so that its time is counted as a rebuild, not in the next batch's update.
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace hslide::gpu
