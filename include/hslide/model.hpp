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

namespace detail {
/// Whether a big block is advised to use huge pages.
enum class page_size {
    huge,   ///< a block read and written at random (a model that trains): fewer TLB misses
    normal  ///< a block copied in order (a snapshot): on a VM a fresh huge page cost 3-4 ms
            ///< a MiB to fault in where normal pages cost 0.9 (bench/peers.md, 2026-12-06)
};

/// `bytes` of memory, 64-byte aligned, zeroed (by the OpenMP threads where it is big) unless
/// `zeroed` is false (for a block about to be copied over whole); blocks of 2 MiB and more are
/// 2 MiB aligned, their size rounded up to 2 MiB, and with page_size::huge advised to use huge
/// pages (a kernel that refuses leaves them on normal pages).
void* allocate_aligned(size_t bytes, bool zeroed = true, page_size pages = page_size::huge);
void free_aligned(void* p);
/// memcpy of `bytes` from `src` to `dst` (not overlapping); blocks of 4 MiB and more are
/// copied by the OpenMP threads in 2 MiB pieces.
void copy_bytes(void* dst, const void* src, size_t bytes);
}  // namespace detail

/// A 64-byte aligned, zero-initialised array of a trivially copyable type (large blocks on
/// huge pages where the kernel allows).
template <class T>
class aligned_array {
  public:
    aligned_array() = default;
    explicit aligned_array(size_t n) { resize(n); }
    aligned_array(const aligned_array& other) { *this = other; }
    aligned_array& operator=(const aligned_array& other) {
        copy_from(other, detail::page_size::huge);
        return *this;
    }
    /// Makes this a copy of `other`: into the block held where the sizes match (a fresh one
    /// costs page faults, which dominated whole-model copies of a few MB), else into a fresh
    /// block of `pages`, not zeroed first (the copy writes every byte of it).
    void copy_from(const aligned_array& other, detail::page_size pages) {
        if (this == &other) return;
        if (other.size_ != size_) allocate(other.size_, /*zeroed=*/false, pages);
        if (size_) detail::copy_bytes(data(), other.data(), size_ * sizeof(T));
    }
    aligned_array(aligned_array&&) noexcept = default;
    aligned_array& operator=(aligned_array&&) noexcept = default;

    /// Resizes to n elements, all zero (contents are not kept).
    void resize(size_t n) { allocate(n, /*zeroed=*/true); }
    size_t size() const { return size_; }
    T* data() { return data_.get(); }
    const T* data() const { return data_.get(); }
    T& operator[](size_t i) { return data_.get()[i]; }
    T operator[](size_t i) const { return data_.get()[i]; }

  private:
    void allocate(size_t n, bool zeroed, detail::page_size pages = detail::page_size::huge) {
        data_.reset();
        size_ = 0;
        if (n == 0) return;
        data_.reset(static_cast<T*>(detail::allocate_aligned(n * sizeof(T), zeroed, pages)));
        size_ = n;
    }
    struct deleter {
        void operator()(T* p) const { detail::free_aligned(p); }
    };
    std::unique_ptr<T, deleter> data_;
    size_t size_ = 0;
};

using aligned_floats = aligned_array<float>;

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

/// Rows of each layer (`rows[l]`: row ids of layer l, ascending, each once), for row-level
/// transfers between replicas. Row r of layer 0 is input feature r's weights (layer 0 is
/// feature-major); row r of a later layer is neuron r's weights and its bias. Layer 0's bias
/// (one value per neuron of layer 0, which every batch changes) goes with every row-level
/// copy.
using row_sets = std::vector<std::vector<uint32_t>>;

/// The whole model: configuration, parameters, optimizer state and hashing seeds.
struct model_state {
    model_config config;
    std::vector<layer_state> layers;
    uint64_t adam_step = 0;            ///< Adam's t (batches applied so far)
    std::vector<uint64_t> hash_seeds;  ///< per layer: the seed of its current hash functions
    /// A rank's shard (create_shard): the whole layer's id of the output layer's row 0 (its
    /// rows are layers.back().rows of config.output_dim()); 0 for a whole model.
    uint32_t output_first = 0;

    /// Whether the output layer holds a shard of its rows (create_shard) rather than all.
    bool holds_output_shard() const {
        return !layers.empty() && layers.back().rows != config.output_dim();
    }

    /// Allocates every layer for `config` and initialises the weights from `seed`: uniform,
    /// with He's standard deviation for ReLU layers and a smaller one for the output layer
    /// (biases zero). With bf16 `moments` the layers past the input one get no fp32 Adam
    /// moments (the CPU backend keeps them in bf16 and starts them at zero), so they never take
    /// memory.
    static model_state create(const model_config& config, uint64_t seed,
                              moment_storage moments = moment_storage::fp32);
    /// create() holding only rows [first, first + count) of the output layer (a rank's shard,
    /// output_shard.hpp), as row 0..count of its last layer (rows = count; the config keeps
    /// the whole layer's size). Each row is initialised as create() initialises it in the
    /// whole layer, so a sharded run starts from the whole run's model.
    static model_state create_shard(const model_config& config, uint64_t seed,
                                    moment_storage moments, uint32_t first, uint32_t count);

    /// The shapes of every layer for `config` (rows, width, stride) with nothing allocated:
    /// for loaders that fill the buffers themselves (a checkpoint), so a large model is
    /// neither initialised nor held twice.
    static model_state layout(const model_config& config);

    /// A copy of the weights, biases, step count and hash seeds, without the Adam moments.
    model_state parameters() const;
    /// Makes this model a copy of `src` (with_optimizer: with its Adam moments; without: none,
    /// as parameters() gives), keeping this model's buffers where their sizes match: a backend
    /// exports into the same snapshot every epoch (--epochs auto's best model), and fresh
    /// buffers cost page faults and zeroing that took 5-15x the copy itself. Fresh buffers are
    /// on normal pages (detail::page_size::normal): a copy is a snapshot, not a model that
    /// trains.
    void copy_from(const model_state& src, bool with_optimizer);
    /// Takes `in`'s weights, biases and hash seeds (and, with `with_optimizer`, its Adam
    /// moments and step count): what a host backend's import_state does. Throws hslide::error
    /// naming the layer when `in` has other shapes.
    void assign(const model_state& in, bool with_optimizer);
    /// Throws hslide::error naming the layer when `in` has other layer shapes than this model
    /// (the check every import makes first).
    void check_same_layout(const model_state& in) const;
    /// Whether `in` has this model's layer shapes (what check_same_layout checks).
    bool same_layout(const model_state& in) const;

    /// Row sets holding every row of every layer.
    row_sets all_rows() const;

    /// Copies the weights and biases of `rows` (and layer 0's bias) from `src`, which must
    /// have the same shapes (checked); Adam state, step count and hash seeds are not touched.
    void copy_rows(const model_state& src, const row_sets& rows);

    /// Neurons in layer l.
    uint32_t neurons(size_t l) const { return config.layers[l].size; }
    /// Total number of weights and biases.
    size_t parameter_count() const;
    /// Bytes of host memory held (parameters and optimizer state).
    size_t memory_bytes() const;
};

/// Bytes of host memory a model of `layout`'s shapes holds: weights and biases, and with
/// `with_optimizer` their Adam moments (what create() allocates). For checks before allocating.
uint64_t model_allocation_bytes(const model_state& layout, bool with_optimizer);
/// "the model 1836 -> 256 -> 159 (517,375 parameters, with Adam state)": how out-of-memory
/// errors name a model.
std::string describe_model_allocation(const model_state& layout, bool with_optimizer);

}  // namespace hslide
