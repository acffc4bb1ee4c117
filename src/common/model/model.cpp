// Allocation, initialisation and row copies of model_state.
#include "hslide/model.hpp"

#include "hslide/error.hpp"
#include "hslide/memory.hpp"
#include "hslide/rng.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <numeric>

namespace hslide {

void* detail::allocate_aligned(size_t bytes, bool zeroed, page_size pages) {
    // Round the byte count to 2 MiB for big blocks so they can sit on huge pages. From 2 MiB,
    // not 8: a block on 4 KiB pages costs a fault a page, and on a VM those faults were most
    // of creating Debian-recs' model (its output layer's three 6.3 MB arrays: 143 -> 88 ms,
    // bench/peers.md "2026-12-06, second session"); the rounding costs at most 2 MiB a block.
    constexpr size_t huge = size_t(2) << 20;
    const bool big = bytes >= huge;
    const size_t alignment = big ? huge : 64;
    bytes = (bytes + alignment - 1) / alignment * alignment;
    void* p = std::aligned_alloc(alignment, bytes);
    if (!p) throw std::bad_alloc();
    if (!big) {
        if (zeroed) std::memset(p, 0, bytes);
        return p;
    }
    // A refusal is harmless: normal pages then.
    if (pages == page_size::huge) madvise(p, bytes, MADV_HUGEPAGE);
    if (!zeroed) return p;
    // The first write to a page faults it in and the kernel clears it: for a model of a few
    // GiB that took seconds on one thread, so the threads share the pages.
    char* block = static_cast<char*>(p);
    const int64_t chunks = int64_t(bytes / huge);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) std::memset(block + size_t(c) * huge, 0, huge);
    return p;
}

void detail::free_aligned(void* p) {
    std::free(p);
}

void detail::copy_bytes(void* dst, const void* src, size_t bytes) {
    // Whole-model copies (--epochs auto's best-epoch snapshot and rollback) are GiBs at the
    // Amazon-670K shape, and one thread does not draw all of the memory's bandwidth (this
    // 2-core machine, 53 MB: 4.6-8.7 GB/s on one thread, 8.6-10.3 on two).
    constexpr size_t piece = size_t(2) << 20;
    if (bytes < 2 * piece) {
        std::memcpy(dst, src, bytes);
        return;
    }
    char* to = static_cast<char*>(dst);
    const char* from = static_cast<const char*>(src);
    const int64_t pieces = int64_t((bytes + piece - 1) / piece);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < pieces; ++c) {
        const size_t at = size_t(c) * piece;
        std::memcpy(to + at, from + at, std::min(piece, bytes - at));
    }
}

model_state model_state::parameters() const {
    model_state p;
    p.copy_from(*this, /*with_optimizer=*/false);
    return p;
}

void model_state::copy_from(const model_state& src, bool with_optimizer) {
    if (this == &src) return;
    config = src.config;
    adam_step = src.adam_step;
    hash_seeds = src.hash_seeds;
    output_first = src.output_first;
    layers.resize(src.layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
        layer_state& dst = layers[l];
        const layer_state& from = src.layers[l];
        dst.rows = from.rows;
        dst.width = from.width;
        dst.stride = from.stride;
        dst.weights.copy_from(from.weights, detail::page_size::normal);
        dst.bias = from.bias;
        if (with_optimizer) {
            dst.adam_m.copy_from(from.adam_m, detail::page_size::normal);
            dst.adam_v.copy_from(from.adam_v, detail::page_size::normal);
            dst.bias_m = from.bias_m;
            dst.bias_v = from.bias_v;
        } else {
            dst.adam_m.resize(0);
            dst.adam_v.resize(0);
            dst.bias_m.clear();
            dst.bias_v.clear();
        }
    }
}

model_state model_state::layout(const model_config& config) {
    validate(config);
    model_state m;
    m.config = config;
    m.layers.resize(config.layers.size());
    m.hash_seeds.resize(config.layers.size());
    for (size_t l = 0; l < config.layers.size(); ++l) {
        layer_state& layer = m.layers[l];
        const uint32_t fan_in = l == 0 ? config.input_dim : config.layers[l - 1].size;
        layer.rows = l == 0 ? fan_in : config.layers[l].size;
        layer.width = l == 0 ? config.layers[l].size : fan_in;
        layer.stride = padded_stride(layer.width);
    }
    return m;
}

std::string describe_model_allocation(const model_state& m, bool with_optimizer) {
    std::string shape = std::to_string(m.config.input_dim);
    uint64_t parameters = 0;
    for (size_t l = 0; l < m.layers.size(); ++l) {
        shape += fmt::format(" -> {}", m.config.layers[l].size);
        parameters += uint64_t(m.layers[l].rows) * m.layers[l].width + m.config.layers[l].size;
    }
    return fmt::format("the model {} ({} parameters{})", shape, parameters,
                       with_optimizer ? ", with Adam state" : "");
}

uint64_t model_allocation_bytes(const model_state& m, bool with_optimizer) {
    uint64_t floats = 0;
    for (size_t l = 0; l < m.layers.size(); ++l)
        floats += uint64_t(m.layers[l].rows) * m.layers[l].stride + m.config.layers[l].size;
    return floats * sizeof(float) * (with_optimizer ? 3 : 1);
}

model_state model_state::create(const model_config& config, uint64_t seed, moment_storage moments) {
    return create_shard(config, seed, moments, 0, config.layers.back().size);
}

model_state model_state::create_shard(const model_config& config, uint64_t seed,
                                      moment_storage moments, uint32_t first, uint32_t count) {
    model_state m = layout(config);
    HSLIDE_ASSERT(count > 0 && uint64_t(first) + count <= m.layers.back().rows);
    m.layers.back().rows = count;
    m.output_first = first;
    const std::string what = describe_model_allocation(m, true);
    check_host_allocation(what, model_allocation_bytes(m, true));
    for (size_t l = 0; l < config.layers.size(); ++l) {
        layer_state& layer = m.layers[l];
        const uint32_t fan_in = l == 0 ? config.input_dim : config.layers[l - 1].size;
        const bool output = l + 1 == config.layers.size();
        const uint32_t neurons = output ? count : config.layers[l].size;
        const size_t total = static_cast<size_t>(layer.rows) * layer.stride;
        allocate_checked(fmt::format("{}: layer {}'s {} x {} weights and Adam state", what, l,
                                     layer.rows, layer.stride),
                         uint64_t(total) * 3 * sizeof(float), [&] {
                             layer.weights.resize(total);
                             if (l == 0 || moments == moment_storage::fp32) {
                                 layer.adam_m.resize(total);
                                 layer.adam_v.resize(total);
                             }
                             layer.bias.assign(neurons, 0.0f);
                             layer.bias_m.assign(neurons, 0.0f);
                             layer.bias_v.assign(neurons, 0.0f);
                         });

        // Layer 0 sums a handful of feature rows, so its scale follows the typical number of
        // nonzeros rather than D; He-style for ReLU layers, smaller for the softmax layer.
        const double std_dev = l == 0 ? 0.1 : (output ? 1.0 : 2.0) / std::sqrt(double(fan_in));
        // Uniform on [-a, a] has standard deviation a / sqrt(3). Uniform rather than normal:
        // Box-Muller's log and cos made a 4 M-parameter model's initialisation 0.1 s, a fifth
        // of a small set's whole run, for the same accuracy (bench/peers.md, 2026-12-07).
        const double half_width = std_dev * std::sqrt(3.0);
        // The layer's rows [lo, hi) of the whole layer's (all but a shard's output layer: all).
        const uint32_t lo = output ? first : 0, hi = lo + layer.rows;
        const uint32_t width = layer.width;
        const uint64_t layer_seed = derive_seed(seed, 1000 + l);
        const int64_t first_block = lo / 1024, end_block = (int64_t(hi) + 1023) / 1024;
#pragma omp parallel for schedule(static)
        for (int64_t block = first_block; block < end_block; ++block) {
            // Each block of rows has its own stream: the result does not depend on threads,
            // and a shard's rows are drawn as the whole layer draws them.
            rng gen(derive_seed(layer_seed, block));
            const uint32_t end = std::min<uint32_t>(hi, uint32_t(block + 1) * 1024);
            for (uint32_t r = uint32_t(block) * 1024; r < end; ++r) {
                if (r < lo) {
                    for (uint32_t i = 0; i < width; ++i) gen();
                    continue;
                }
                float* w = layer.row(r - lo);
                for (uint32_t i = 0; i < width; ++i)
                    w[i] = float((2.0 * gen.uniform_double() - 1.0) * half_width);
            }
        }
        m.hash_seeds[l] = derive_seed(seed, 2000 + l);
    }
    return m;
}

row_sets model_state::all_rows() const {
    row_sets rows(layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
        rows[l].resize(layers[l].rows);
        std::iota(rows[l].begin(), rows[l].end(), 0u);
    }
    return rows;
}

void model_state::copy_rows(const model_state& src, const row_sets& rows) {
    HSLIDE_CHECK(src.layers.size() == layers.size() && rows.size() == layers.size(),
                 "row copy: {} layers from a model of {} into one of {}", rows.size(),
                 src.layers.size(), layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
        layer_state& dst = layers[l];
        const layer_state& from = src.layers[l];
        HSLIDE_CHECK(from.rows == dst.rows && from.width == dst.width &&
                         from.stride == dst.stride && from.bias.size() == dst.bias.size() &&
                         dst.weights.size() == size_t(dst.rows) * dst.stride &&
                         from.weights.size() == dst.weights.size(),
                     "row copy: layer {} is {}x{} in the source, {}x{} in the target", l, from.rows,
                     from.width, dst.rows, dst.width);
        for (uint32_t r : rows[l]) {
            HSLIDE_CHECK(r < dst.rows, "row copy: row {} of layer {} is out of range ({} rows)", r,
                         l, dst.rows);
            std::memcpy(dst.row(r), from.row(r), dst.stride * sizeof(float));
            if (l > 0) dst.bias[r] = from.bias[r];
        }
        if (l == 0) dst.bias = from.bias;
    }
}

size_t model_state::parameter_count() const {
    size_t n = 0;
    for (const auto& layer : layers) n += size_t(layer.rows) * layer.width + layer.bias.size();
    return n;
}

size_t model_state::memory_bytes() const {
    size_t n = 0;
    for (const auto& layer : layers)
        n += 3 * (layer.weights.size() + layer.bias.size()) * sizeof(float);
    return n;
}

namespace {
bool same_shape(const layer_state& a, const layer_state& b) {
    return a.rows == b.rows && a.width == b.width && a.stride == b.stride;
}
}  // namespace

bool model_state::same_layout(const model_state& in) const {
    return in.layers.size() == layers.size() &&
           std::equal(layers.begin(), layers.end(), in.layers.begin(), same_shape);
}

void model_state::check_same_layout(const model_state& in) const {
    HSLIDE_CHECK(in.layers.size() == layers.size(), "imported model has {} layers, this one {}",
                 in.layers.size(), layers.size());
    for (size_t l = 0; l < in.layers.size(); ++l) {
        const layer_state& dst = layers[l];
        const layer_state& src = in.layers[l];
        HSLIDE_CHECK(same_shape(src, dst), "imported layer {} is {}x{}, this model's is {}x{}", l,
                     src.rows, src.width, dst.rows, dst.width);
    }
}

void model_state::assign(const model_state& in, bool with_optimizer) {
    check_same_layout(in);
    for (size_t l = 0; l < in.layers.size(); ++l) {
        layer_state& dst = layers[l];
        const layer_state& src = in.layers[l];
        dst.weights = src.weights;
        dst.bias = src.bias;
        if (with_optimizer) {
            dst.adam_m = src.adam_m;
            dst.adam_v = src.adam_v;
            dst.bias_m = src.bias_m;
            dst.bias_v = src.bias_v;
        }
    }
    if (with_optimizer) adam_step = in.adam_step;
    hash_seeds = in.hash_seeds;
}

}  // namespace hslide
