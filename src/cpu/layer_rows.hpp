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

/// A copy of a layer's rows quantized to int8 a row at a time (kernel_table::to_int8_row), not
/// owned: what an exact search scores with dots16_u8s8 where the CPU has 8-bit products.
struct int8_rows {
    int8_t* values = nullptr;  ///< rows * stride
    size_t stride = 0;
    float* scale = nullptr;  ///< one per row: row r ~ values of r * scale[r]
    int32_t* sum = nullptr;  ///< one per row: the sum of its values

    explicit operator bool() const { return values != nullptr; }
    const int8_t* row(uint32_t r) const { return values + size_t(r) * stride; }
    /// Quantizes `weights` (width values) into row r.
    void write(uint32_t r, const float* weights, uint32_t width, const kernel_table& k) const {
        scale[r] = k.to_int8_row(weights, values + size_t(r) * stride, width, &sum[r]);
    }
};

}  // namespace hslide::cpu
