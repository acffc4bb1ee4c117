// Row-level traffic of the GPU backend, for the hybrid backend's row-sparse merges: which
// rows a replica's updates changed, and copying chosen rows of a layer out of and into the
// device (weights, their bf16 copy, and per-row biases; never Adam state).
//
// Changes are tracked with one byte per row on the device, set by the update's own grouping
// (its sorted list of distinct rows), so tracking costs one tiny kernel per update; taking the
// changed rows reads the flags back (one byte per row) and clears them. Rows travel packed:
// the host gathers them into a pinned block, one copy moves the block, and a kernel scatters
// it (and the reverse for exports), so a merge costs one transfer per chunk, not one per row.
#pragma once

#include "gpu_layers.cuh"

#include <cstdint>

namespace hslide::gpu {

/// flags[rows[i]] = 1 for i < *n_rows (read on the device; at most max_rows), skipping
/// UINT32_MAX (the key of entries that update nothing).
void mark_rows(uint8_t* flags, const uint32_t* rows, const uint32_t* n_rows, uint32_t max_rows,
               cudaStream_t stream);

/// packed[i] = layer row rows[i] (stride floats), and bias[i] = its bias when `bias` is not
/// null, for i < n.
void gather_rows(const layer_view& layer, const uint32_t* rows, uint32_t n, float* packed,
                 float* bias, cudaStream_t stream);

/// The reverse: layer row rows[i] = packed[i] (and its bias from bias[i] when not null); the
/// bf16 copy of each row, when the layer keeps one, is rounded again.
void scatter_rows(const layer_view& layer, const uint32_t* rows, uint32_t n, const float* packed,
                  const float* bias, cudaStream_t stream);

}  // namespace hslide::gpu
