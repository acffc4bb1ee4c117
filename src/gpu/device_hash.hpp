// LSH bucket codes computed from a family's exported arrays (hash_function_data), as
// functions that compile both for the GPU (nvcc: __host__ __device__) and for the host.
//
// The GPU kernels call them per (vector, hash) and (vector, table); the host tests call the
// same code on the CPU and compare it with hash_family::codes_dense, so "the GPU computes the
// same codes as the CPU" is checked even on a machine without a GPU. Views are small copyable
// structs of raw pointers, valid on whichever side owns the memory.
#pragma once

#include "hslide/host_device.hpp"
#include "hslide/rng.hpp"

#include <cstdint>
#include <limits>

namespace hslide::gpu {

/// A bin family (dwta, wta, minhash): see hash_function_data.
struct bin_hash_view {
    const uint32_t* bins = nullptr;  ///< n_hashes * width coordinates
    uint32_t n_hashes = 0, width = 0, value_mask = 0;
    int K = 0, L = 0, bits = 0;
    bool densify = false, minhash = false;
    uint64_t densify_seed = 0;
};

/// A simhash family: see hash_function_data.
struct simhash_view {
    const int8_t* signs = nullptr;  ///< dim * sign_stride
    uint32_t dim = 0, sign_stride = 0;
    int K = 0, L = 0, bits = 0;
};

/// The raw value of bin hash h on the dense vector x: the position in the bin of the largest
/// nonzero value (first on ties; zero, NaN and -inf never win), or for minhash the first
/// position holding a positive value; -1 when the bin has none.
HSLIDE_HD inline int32_t bin_hash_raw(const bin_hash_view& f, const float* x, uint32_t h) {
    const uint32_t* bin = f.bins + static_cast<uint64_t>(h) * f.width;
    if (f.minhash) {
        for (uint32_t j = 0; j < f.width; ++j)
            if (x[bin[j]] > 0.0f) return static_cast<int32_t>(j);
        return -1;
    }
    float best = -std::numeric_limits<float>::infinity();
    int32_t pos = -1;
    for (uint32_t j = 0; j < f.width; ++j) {
        const float v = x[bin[j]];
        if (v != 0.0f && v > best) best = v, pos = static_cast<int32_t>(j);
    }
    return pos;
}

/// The bucket code of table t from every hash's raw value (raw[0..n_hashes)), densifying
/// empty bins as hash_family does.
HSLIDE_HD inline uint32_t bin_hash_code(const bin_hash_view& f, const int32_t* raw, int t) {
    uint64_t code = 0;
    for (int k = 0; k < f.K; ++k) {
        const uint32_t h = static_cast<uint32_t>(t * f.K + k);
        uint32_t v = 0;
        if (raw[h] >= 0) {
            v = static_cast<uint32_t>(raw[h]);
        } else if (f.densify) {
            for (uint64_t attempt = 1; attempt <= 100; ++attempt) {
                const uint64_t mixed = splitmix64(f.densify_seed ^ ((uint64_t{h} << 32) | attempt));
                const uint32_t other = static_cast<uint32_t>(((mixed >> 32) * f.n_hashes) >> 32);
                if (raw[other] >= 0) {
                    v = static_cast<uint32_t>(raw[other]);
                    break;
                }
            }
        }
        code = (code << f.bits) | (v & f.value_mask);
    }
    return static_cast<uint32_t>(code);
}

/// The simhash bucket code of table t of the dense vector x: K * bits sign bits of sparse
/// +-1 projections, summed over the nonzero coordinates in increasing order (the order the
/// CPU sums in, so the signs agree bit for bit).
HSLIDE_HD inline uint32_t simhash_code(const simhash_view& f, const float* x, int t) {
    const uint32_t n_bits = static_cast<uint32_t>(f.K * f.bits);
    uint64_t code = 0;
    for (uint32_t b = 0; b < n_bits; ++b) {
        const uint32_t p = static_cast<uint32_t>(t) * n_bits + b;
        float acc = 0.0f;
        for (uint32_t i = 0; i < f.dim; ++i) {
            const float xi = x[i];
            if (xi != 0.0f)
                acc +=
                    xi * static_cast<float>(f.signs[static_cast<uint64_t>(i) * f.sign_stride + p]);
        }
        code = (code << 1) | (acc > 0.0f ? 1u : 0u);
    }
    return static_cast<uint32_t>(code);
}

}  // namespace hslide::gpu
