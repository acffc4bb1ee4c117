// A non-owning view of a layer's rows (weights, bias, and their bf16 copies in bf16 precision):
// what the neuron selections and the IVF index read of the layer they serve.
#pragma once

#include "kernels.hpp"  // bf16

#include <cstddef>
#include <cstdint>

namespace hslide::cpu {

/// The rows of one layer, not owned. Clustering and hashing read the fp32 rows; scoring reads
/// the bf16 copies when `weights16` is set (bf16 precision), the fp32 rows otherwise.
struct layer_rows {
    const float* weights = nullptr;  ///< rows * stride floats, the first width of each used
    size_t stride = 0;
    const float* bias = nullptr;  ///< one per row
    uint32_t rows = 0, width = 0;
    const bf16* weights16 = nullptr;  ///< bf16 copies (rows * stride16), or null: fp32
    size_t stride16 = 0;

    const float* row(uint32_t r) const { return weights + size_t(r) * stride; }
    const bf16* row16(uint32_t r) const { return weights16 + size_t(r) * stride16; }
};

}  // namespace hslide::cpu
