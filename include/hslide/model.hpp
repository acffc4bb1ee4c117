// The model's parameters and optimizer state in host memory: the canonical form every
// backend exports and imports, the scheduler merges, and checkpoints store.
//
// Layout. Layer 0 (over the sparse input) is feature-major: row f holds the weights from
// input feature f to every neuron of layer 0, so a forward pass adds up the sample's feature
// rows. Every later layer is neuron-major: row j holds neuron j's weights over the previous
// layer, so an active neuron's pre-activation is one contiguous dot product. Rows are padded
// to a multiple of 16 floats (one 64-byte cache line) and blocks are 64-byte aligned, so SIMD
// kernels may load whole lines; the padding is always zero.
#pragma once

#include "hslide/config.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace hslide {

/// A 64-byte aligned, zero-initialised array of floats (large blocks are advised to use huge
/// pages where the kernel allows).
class aligned_floats {
  public:
    aligned_floats() = default;
    explicit aligned_floats(size_t n) { resize(n); }
    aligned_floats(const aligned_floats& other);
    aligned_floats& operator=(const aligned_floats& other);
    aligned_floats(aligned_floats&&) noexcept = default;
    aligned_floats& operator=(aligned_floats&&) noexcept = default;

    /// Resizes to n floats, all zero (contents are not kept).
    void resize(size_t n);
    size_t size() const { return size_; }
    float* data() { return data_.get(); }
    const float* data() const { return data_.get(); }
    float& operator[](size_t i) { return data_.get()[i]; }
    float operator[](size_t i) const { return data_.get()[i]; }

  private:
    struct deleter {
        void operator()(float* p) const;
    };
    std::unique_ptr<float, deleter> data_;
    size_t size_ = 0;
};

/// Row stride (in floats) for rows of `width` floats: width rounded up to a multiple of 16.
inline uint32_t padded_stride(uint32_t width) {
    return (width + 15u) & ~15u;
}

/// One layer's parameters and Adam moments.
struct layer_state {
    uint32_t rows = 0;                       ///< input features (layer 0) or neurons (later layers)
    uint32_t width = 0;                      ///< floats per row that carry weights
    uint32_t stride = 0;                     ///< floats between row starts (padded_stride(width))
    aligned_floats weights, adam_m, adam_v;  ///< rows * stride each
    std::vector<float> bias, bias_m, bias_v;  ///< one per neuron

    float* row(uint32_t r) { return weights.data() + static_cast<size_t>(r) * stride; }
    const float* row(uint32_t r) const { return weights.data() + static_cast<size_t>(r) * stride; }
};

/// The whole model: configuration, parameters, optimizer state and hashing seeds.
struct model_state {
    model_config config;
    std::vector<layer_state> layers;
    uint64_t adam_step = 0;            ///< Adam's t (batches applied so far)
    std::vector<uint64_t> hash_seeds;  ///< per layer: the seed of its current hash functions

    /// Allocates every layer for `config` and initialises the weights from `seed`
    /// (He-normal for ReLU layers, a smaller normal for the softmax layer; biases zero).
    static model_state create(const model_config& config, uint64_t seed);

    /// The shapes of every layer for `config` (rows, width, stride) with nothing allocated:
    /// for loaders that fill the buffers themselves (a checkpoint), so a large model is
    /// neither initialised nor held twice.
    static model_state layout(const model_config& config);

    /// Neurons in layer l.
    uint32_t neurons(size_t l) const { return config.layers[l].size; }
    /// Total number of weights and biases.
    size_t parameter_count() const;
    /// Bytes of host memory held (parameters and optimizer state).
    size_t memory_bytes() const;
};

}  // namespace hslide
