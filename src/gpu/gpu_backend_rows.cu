// The CUDA backend's row traffic for hybrid merges (design in gpu_backend_impl.cuh): the
// rows changed since the last take, row export and import in chunks through pinned
// staging, and the deferred updates of --adam input-catch-up.
#include "gpu_backend_impl.cuh"

namespace hslide::gpu {

void gpu_backend::reset_changed_rows() {
    for (size_t l = 0; l < 2; ++l) {
        changed_[l].reserve(layers_[l].rows, "row change flags");
        changed_[l].zero(stream_);
        all_changed_[l] = false;
    }
}

bool gpu_backend::take_changed_rows(row_sets& rows) {
    activate();
    rows.assign(2, {});
    for (size_t l = 0; l < 2; ++l) {
        const uint32_t n = layers_[l].rows;
        if (all_changed_[l]) {
            rows[l].resize(n);
            std::iota(rows[l].begin(), rows[l].end(), 0u);
            continue;
        }
        changed_host_.reserve(n, "row change flags");
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(changed_host_.data(), changed_[l].data(), n,
                                          cudaMemcpyDeviceToHost, stream_));
        HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        const uint8_t* flags = changed_host_.data();
        for (uint32_t r = 0; r < n; ++r)
            if (flags[r]) rows[l].push_back(r);
    }
    reset_changed_rows();
    return true;
}

template <class Chunk>
void gpu_backend::for_row_chunks(size_t l, const std::vector<uint32_t>& rows, Chunk&& chunk) const {
    const uint32_t n_rows = layers_[l].rows;
    for (size_t begin = 0; begin < rows.size(); begin += rows_per_chunk) {
        const uint32_t n = uint32_t(std::min<size_t>(rows_per_chunk, rows.size() - begin));
        row_ids_host_.reserve(n, "row transfer staging");
        for (uint32_t i = 0; i < n; ++i) {
            const uint32_t r = rows[begin + i];
            HSLIDE_CHECK(r < n_rows, "row transfer: row {} of layer {} is out of range ({} rows)",
                         r, l, n_rows);
            row_ids_host_.data()[i] = r;
        }
        row_ids_.reserve(n, "row transfer staging");
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(row_ids_.data(), row_ids_host_.data(), size_t(n) * 4,
                                          cudaMemcpyHostToDevice, stream_));
        chunk(row_ids_host_.data(), n);
    }
}

size_t gpu_backend::reserve_row_staging(uint32_t n, uint32_t stride) const {
    const size_t floats = size_t(n) * stride;
    row_block_.reserve(floats, "row transfer staging");
    row_bias_.reserve(n, "row transfer staging");
    row_block_host_.reserve(floats, "row transfer staging");
    row_bias_host_.reserve(n, "row transfer staging");
    return floats;
}

void gpu_backend::export_rows(const row_sets& rows, model_state& out) const {
    shape_.check_same_layout(out);
    HSLIDE_CHECK(rows.size() == 2, "row export: {} layers of rows for a 2-layer model",
                 rows.size());
    activate();
    for (size_t l = 0; l < 2; ++l) {
        const device_layer& src = layers_[l];
        layer_state& dst = out.layers[l];
        const bool row_bias = l > 0;  // layer 0's bias is one vector, copied whole below
        for_row_chunks(l, rows[l], [&](const uint32_t* ids, uint32_t n) {
            const size_t floats = reserve_row_staging(n, src.stride);
            gather_rows(src.view(), row_ids_.data(), n, row_block_.data(),
                        row_bias ? row_bias_.data() : nullptr, stream_);
            HSLIDE_CUDA_CHECK(cudaMemcpyAsync(row_block_host_.data(), row_block_.data(), floats * 4,
                                              cudaMemcpyDeviceToHost, stream_));
            if (row_bias)
                HSLIDE_CUDA_CHECK(cudaMemcpyAsync(row_bias_host_.data(), row_bias_.data(),
                                                  size_t(n) * 4, cudaMemcpyDeviceToHost, stream_));
            HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
            for (uint32_t i = 0; i < n; ++i) {
                std::memcpy(dst.row(ids[i]), row_block_host_.data() + size_t(i) * src.stride,
                            size_t(src.stride) * 4);
                if (row_bias) dst.bias[ids[i]] = row_bias_host_.data()[i];
            }
        });
        if (!row_bias) {
            HSLIDE_CUDA_CHECK(cudaMemcpyAsync(dst.bias.data(), src.bias.data(), dst.bias.size() * 4,
                                              cudaMemcpyDeviceToHost, stream_));
            HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        }
    }
}

void gpu_backend::import_rows(const model_state& in, const row_sets& rows) {
    shape_.check_same_layout(in);
    HSLIDE_CHECK(rows.size() == 2, "row import: {} layers of rows for a 2-layer model",
                 rows.size());
    activate();
    for (size_t l = 0; l < 2; ++l) {
        device_layer& dst = layers_[l];
        const layer_state& src = in.layers[l];
        const bool row_bias = l > 0;
        for_row_chunks(l, rows[l], [&](const uint32_t* ids, uint32_t n) {
            const size_t floats = reserve_row_staging(n, dst.stride);
            for (uint32_t i = 0; i < n; ++i) {
                std::memcpy(row_block_host_.data() + size_t(i) * dst.stride, src.row(ids[i]),
                            size_t(dst.stride) * 4);
                if (row_bias) row_bias_host_.data()[i] = src.bias[ids[i]];
            }
            HSLIDE_CUDA_CHECK(cudaMemcpyAsync(row_block_.data(), row_block_host_.data(), floats * 4,
                                              cudaMemcpyHostToDevice, stream_));
            if (row_bias)
                HSLIDE_CUDA_CHECK(cudaMemcpyAsync(row_bias_.data(), row_bias_host_.data(),
                                                  size_t(n) * 4, cudaMemcpyHostToDevice, stream_));
            scatter_rows(dst.view(), row_ids_.data(), n, row_block_.data(),
                         row_bias ? row_bias_.data() : nullptr, stream_);
            // The staging blocks are refilled by the next chunk.
            HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        });
        if (!row_bias) {
            HSLIDE_CUDA_CHECK(cudaMemcpyAsync(dst.bias.data(), src.bias.data(), src.bias.size() * 4,
                                              cudaMemcpyHostToDevice, stream_));
            HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        }
    }
}

bool gpu_backend::complete_deferred_updates() {
    if (!rows_behind_) return false;
    activate();
    const drain_on_throw drain(stream_);
    // The rows it moves are changes of this replica's own (flagged for take_changed_rows).
    const bool moved = input_catch_up_.catch_up_all(layers_[0].view(), changed_[0].data(), stream_);
    rows_behind_ = false;
    return moved;
}

}  // namespace hslide::gpu
