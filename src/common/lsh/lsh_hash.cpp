// The LSH hash families (DWTA, WTA, SimHash, densified MinHash) declared in hslide/lsh.hpp,
// with the enum parsing and configuration validation that go with them.
#include "common/lsh/lsh_hash_kernels.hpp"
#include "common/util/enum_names.hpp"
#include "hslide/error.hpp"
#include "hslide/isa.hpp"
#include "hslide/lsh.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

namespace hslide {

// --- names and validation --------------------------------------------------------------------

namespace {
const std::pair<const char*, hash_kind> hash_kind_names[] = {{"dwta", hash_kind::dwta},
                                                             {"wta", hash_kind::wta},
                                                             {"simhash", hash_kind::simhash},
                                                             {"minhash", hash_kind::minhash}};
const std::pair<const char*, insertion_policy> policy_names[] = {
    {"fifo", insertion_policy::fifo}, {"reservoir", insertion_policy::reservoir}};

using detail::name_of;
using detail::parse_named;

}  // namespace

hash_kind parse_hash_kind(const std::string& name) {
    return parse_named(name, "hash family", hash_kind_names);
}
const char* to_string(hash_kind kind) {
    return name_of(kind, hash_kind_names);
}
insertion_policy parse_insertion_policy(const std::string& name) {
    return parse_named(name, "insertion policy", policy_names);
}
const char* to_string(insertion_policy policy) {
    return name_of(policy, policy_names);
}
std::vector<std::string> names_of(hash_kind) {
    return detail::names_in(hash_kind_names);
}
std::vector<std::string> names_of(insertion_policy) {
    return detail::names_in(policy_names);
}

void validate(const lsh_config& config) {
    HSLIDE_CHECK(config.K >= 1, "LSH K (hashes per table) must be at least 1, got {}", config.K);
    HSLIDE_CHECK(config.L >= 1, "LSH L (number of tables) must be at least 1, got {}", config.L);
    HSLIDE_CHECK(config.L <= lsh_max_tables, "LSH L (number of tables) must be at most {}, got {}",
                 lsh_max_tables, config.L);
    HSLIDE_CHECK(config.bits_per_hash >= 1, "LSH bits per hash must be at least 1, got {}",
                 config.bits_per_hash);
    HSLIDE_CHECK(static_cast<int64_t>(config.K) * config.bits_per_hash <= 32,
                 "LSH K * bits per hash must be at most 32 (a bucket code is 32 bits), got "
                 "{} * {} = {}",
                 config.K, config.bits_per_hash,
                 static_cast<int64_t>(config.K) * config.bits_per_hash);
    HSLIDE_CHECK(config.bucket_capacity >= 1, "LSH bucket capacity must be at least 1, got {}",
                 config.bucket_capacity);
}

hash_function_data hash_family::common_data() const {
    hash_function_data d;
    d.kind = config_.kind;
    d.K = config_.K;
    d.L = config_.L;
    d.bits_per_hash = config_.bits_per_hash;
    d.dim = dim_;
    return d;
}

void hash_family::codes_dense_rows(const float* rows, uint32_t n_rows, size_t row_stride,
                                   uint32_t* codes) const {
    const size_t L = static_cast<size_t>(config_.L);
#pragma omp parallel for schedule(dynamic, 256) if (!omp_in_parallel() && n_rows > 256)
    for (int64_t r = 0; r < static_cast<int64_t>(n_rows); ++r)
        codes_dense(rows + static_cast<size_t>(r) * row_stride, codes + static_cast<size_t>(r) * L);
}

void hash_family::probe_codes_dense(const float* x, uint32_t probes, uint32_t* codes) const {
    // No runner-ups: the base codes, each repeated. Written from the last table back, so the
    // base codes can be computed in place at the front.
    codes_dense(x, codes);
    for (int t = config_.L; t-- > 0;)
        for (uint32_t p = 0; p <= probes; ++p)
            codes[static_cast<size_t>(t) * (1 + probes) + p] = codes[t];
}

namespace {

constexpr int densify_probes = 100;
constexpr float minus_inf = -std::numeric_limits<float>::infinity();

// Scratch reused by every call on a thread, so hashing allocates only when a thread first
// meets a larger family.
struct hash_scratch {
    std::vector<int32_t> values;
    std::vector<float> floats;
    std::vector<uint32_t> ids;
    std::vector<float> xs;
    std::vector<float> dense;  // all zero between calls
};
hash_scratch& thread_scratch() {
    thread_local hash_scratch scratch;
    return scratch;
}
template <class T>
T* sized(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
}

// --- bin families: dwta, wta, minhash --------------------------------------------------------

using detail::bin_layout;
using detail::project_fn;
using detail::wta_scan_fn;

#if HSLIDE_X86
// The instruction-set level of the kernels a family picks when it is created: active_isa(),
// where avx512bf16 and amx add nothing to hashing and mean avx512.
isa_level hash_isa() {
    const isa_level level = active_isa();
    return level >= isa_level::avx512bf16 ? isa_level::avx512 : level;
}
#endif

// The scalar winner-take-all scan (see wta_scan_fn).
void wta_scan_scalar(const float* x, const bin_layout& b, int32_t* values) {
    // 16 hashes side by side: independent dependency chains, no branches.
    const uint32_t n_groups = (b.n_hashes + 15) / 16;
    for (uint32_t g = 0; g < n_groups; ++g) {
        const uint32_t* gi = b.interleaved + static_cast<size_t>(g) * b.w * 16;
        float best[16];
        int32_t pos[16];
        for (int lane = 0; lane < 16; ++lane) best[lane] = minus_inf, pos[lane] = -1;
        for (uint32_t j = 0; j < b.w; ++j)
            for (int lane = 0; lane < 16; ++lane) {
                const float v = x[gi[j * 16 + lane]];
                const bool wins = (v != 0.0f) & (v > best[lane]);
                best[lane] = wins ? v : best[lane];
                pos[lane] = wins ? static_cast<int32_t>(j) : pos[lane];
            }
        const uint32_t n = std::min<uint32_t>(16, b.n_hashes - g * 16);
        std::memcpy(values + g * 16, pos, n * sizeof(int32_t));
    }
}

wta_scan_fn pick_wta_scan(uint32_t dim) {
#if HSLIDE_X86
    const isa_level level = hash_isa();
    if (level == isa_level::avx512 && dim <= 128) return detail::wta_scan_avx512_small;
    if (level != isa_level::scalar) return detail::wta_scan_avx2;
#endif
    return wta_scan_scalar;
}

// DWTA, WTA and MinHash share their structure: hash h looks at a bin of `width_` distinct
// coordinates (consecutive slices of random permutations of the dimensions) and returns a
// position in it, or "empty"; the families differ in the position they pick and in whether
// an empty bin is densified.
class bin_family final : public hash_family {
  public:
    bin_family(const lsh_config& config, uint32_t dim, uint64_t seed)
        : hash_family(config, dim, seed) {
        const uint64_t n_hashes = static_cast<uint64_t>(config.K) * config.L;
        HSLIDE_CHECK(n_hashes <= (1u << 24), "LSH K * L = {} is too large (at most 2^24)",
                     n_hashes);
        n_hashes_ = static_cast<uint32_t>(n_hashes);
        const uint64_t bin = uint64_t{1} << std::min(config.bits_per_hash, 40);
        uint64_t width = std::min<uint64_t>(bin, dim);
        // One-permutation MinHash over a wide sparse input: wider bins, so that a sparse set
        // still falls into most of them (the hash keeps the low bits of the offset).
        if (config.kind == hash_kind::minhash && dim / n_hashes > width) width = dim / n_hashes;
        width_ = static_cast<uint32_t>(width);
        HSLIDE_CHECK(n_hashes * width_ <= UINT32_MAX,
                     "LSH family too large: {} hashes of {} coordinates", n_hashes, width_);
        value_mask_ = static_cast<uint32_t>(std::min<uint64_t>(bin - 1, UINT32_MAX));
        densify_ = config.kind != hash_kind::wta;
        minhash_ = config.kind == hash_kind::minhash;

        rng gen(derive_seed(seed, 0x1000 + static_cast<uint64_t>(config.kind)));
        densify_seed_ = gen();
        // Bins are whole slices of a permutation (the remainder of each permutation is unused),
        // so no bin repeats a coordinate.
        const uint32_t bins_per_perm = dim / width_;
        bins_.resize(static_cast<size_t>(n_hashes_) * width_);
        std::vector<uint32_t> perm(dim);
        for (uint32_t h = 0; h < n_hashes_; h += bins_per_perm) {
            std::iota(perm.begin(), perm.end(), 0u);
            shuffle(perm.begin(), perm.end(), gen);
            const uint32_t n = std::min(bins_per_perm, n_hashes_ - h);
            std::copy(perm.begin(), perm.begin() + static_cast<size_t>(n) * width_,
                      bins_.begin() + static_cast<size_t>(h) * width_);
        }

        // The dense layout: 16 hashes side by side per position (padding hashes read x[0]).
        const uint32_t n_groups = (n_hashes_ + 15) / 16;
        interleaved_.assign(static_cast<size_t>(n_groups) * width_ * 16, 0);
        for (uint32_t h = 0; h < n_hashes_; ++h)
            for (uint32_t j = 0; j < width_; ++j)
                interleaved_[(static_cast<size_t>(h / 16) * width_ + j) * 16 + h % 16] =
                    bins_[static_cast<size_t>(h) * width_ + j];

        // The sparse layout: for each coordinate, the (hash, position) pairs that read it.
        inv_offsets_.assign(static_cast<size_t>(dim) + 1, 0);
        for (uint32_t c : bins_) ++inv_offsets_[c + 1];
        for (uint32_t i = 0; i < dim; ++i) inv_offsets_[i + 1] += inv_offsets_[i];
        inv_entries_.resize(bins_.size());
        std::vector<uint32_t> fill(inv_offsets_.begin(), inv_offsets_.end() - 1);
        for (uint32_t h = 0; h < n_hashes_; ++h)
            for (uint32_t j = 0; j < width_; ++j)
                inv_entries_[fill[bins_[static_cast<size_t>(h) * width_ + j]]++] = {h, j};
        scan_ = pick_wta_scan(dim);
    }

    void codes_dense(const float* x, uint32_t* codes) const override {
        int32_t* values = sized(thread_scratch().values, n_hashes_);
        if (minhash_) {
            // The first position holding a positive value; 16 hashes side by side, no
            // branches (as wta_scan_scalar).
            const uint32_t n_groups = (n_hashes_ + 15) / 16;
            for (uint32_t g = 0; g < n_groups; ++g) {
                const uint32_t* gi = interleaved_.data() + static_cast<size_t>(g) * width_ * 16;
                int32_t pos[16];
                for (int lane = 0; lane < 16; ++lane) pos[lane] = -1;
                for (uint32_t j = width_; j-- > 0;)  // backwards: the last write is the first
                    for (int lane = 0; lane < 16; ++lane)
                        pos[lane] =
                            x[gi[j * 16 + lane]] > 0.0f ? static_cast<int32_t>(j) : pos[lane];
                const uint32_t n = std::min<uint32_t>(16, n_hashes_ - g * 16);
                std::memcpy(values + g * 16, pos, n * sizeof(int32_t));
            }
        } else {
            scan_(x, bin_layout{bins_.data(), interleaved_.data(), width_, n_hashes_, dim_},
                  values);
        }
        finish(values, codes);
    }

    void codes_sparse(const uint32_t* ids, const float* vals, uint32_t nnz,
                      uint32_t* codes) const override {
        for (uint32_t n = 0; n < nnz; ++n)
            HSLIDE_CHECK(ids[n] < dim_, "sparse id {} out of range (dim {})", ids[n], dim_);
        hash_scratch& scratch = thread_scratch();
        if (8 * static_cast<uint64_t>(nnz) >= dim_) {
            // Not very sparse: scattering into a dense buffer and running the SIMD scan is
            // faster than visiting each coordinate's ~K*L*w/dim bins, and gives the same codes.
            float* dense = sized(scratch.dense, dim_);
            for (uint32_t n = 0; n < nnz; ++n) dense[ids[n]] = vals[n];
            codes_dense(dense, codes);
            for (uint32_t n = 0; n < nnz; ++n) dense[ids[n]] = 0.0f;
            return;
        }
        int32_t* values = sized(scratch.values, n_hashes_);
        std::fill(values, values + n_hashes_, -1);
        if (minhash_) {
            for (uint32_t n = 0; n < nnz; ++n) {
                if (!(vals[n] > 0.0f)) continue;
                for (uint32_t e = inv_offsets_[ids[n]]; e < inv_offsets_[ids[n] + 1]; ++e) {
                    const auto [h, j] = inv_entries_[e];
                    if (values[h] < 0 || static_cast<int32_t>(j) < values[h])
                        values[h] = static_cast<int32_t>(j);
                }
            }
        } else {
            // Coordinates come in id order, not bin order: a tie goes to the lower position,
            // as in the dense scan.
            float* best = sized(scratch.floats, n_hashes_);
            std::fill(best, best + n_hashes_, minus_inf);
            for (uint32_t n = 0; n < nnz; ++n) {
                const float v = vals[n];
                if (!(v != 0.0f && v > minus_inf)) continue;  // zero, NaN, -inf never win
                for (uint32_t e = inv_offsets_[ids[n]]; e < inv_offsets_[ids[n] + 1]; ++e) {
                    const auto [h, j] = inv_entries_[e];
                    if (v > best[h] || (v == best[h] && static_cast<int32_t>(j) < values[h]))
                        best[h] = v, values[h] = static_cast<int32_t>(j);
                }
            }
        }
        finish(values, codes);
    }

    hash_function_data function_data() const override {
        hash_function_data d = common_data();
        d.n_hashes = n_hashes_;
        d.width = width_;
        d.value_mask = value_mask_;
        d.densify = densify_;
        d.densify_seed = densify_seed_;
        d.bins = bins_;
        return d;
    }

  private:
    // The value of hash h after densification: the raw values of a fixed pseudo-random
    // sequence of other hashes are probed (never densified ones, so the result does not
    // depend on the order hashes are visited).
    uint32_t densified(const int32_t* values, uint32_t h) const {
        for (uint64_t attempt = 1; attempt <= densify_probes; ++attempt) {
            const uint64_t mixed = splitmix64(densify_seed_ ^ ((uint64_t{h} << 32) | attempt));
            const uint32_t other = static_cast<uint32_t>(((mixed >> 32) * n_hashes_) >> 32);
            if (values[other] >= 0) return static_cast<uint32_t>(values[other]);
        }
        return 0;
    }

    uint32_t table_code(const int32_t* values, int t) const {
        const int K = config_.K, bits = config_.bits_per_hash;
        uint64_t code = 0;
        for (int k = 0; k < K; ++k) {
            const uint32_t h = static_cast<uint32_t>(t * K + k);
            uint32_t v = values[h] >= 0 ? static_cast<uint32_t>(values[h])
                                        : (densify_ ? densified(values, h) : 0u);
            code = (code << bits) | (v & value_mask_);
        }
        return static_cast<uint32_t>(code);
    }

    void finish(const int32_t* values, uint32_t* codes) const {
        for (int t = 0; t < config_.L; ++t) codes[t] = table_code(values, t);
    }

  public:
    void probe_codes_dense(const float* x, uint32_t probes, uint32_t* codes) const override {
        if (minhash_ || probes == 0) return hash_family::probe_codes_dense(x, probes, codes);
        int32_t* values = sized(thread_scratch().values, n_hashes_);
        scan_(x, bin_layout{bins_.data(), interleaved_.data(), width_, n_hashes_, dim_}, values);
        const int K = config_.K;
        struct candidate {
            float margin;
            int k;
            int32_t runner_up;
        };
        thread_local std::vector<candidate> found;  // reused: a query allocates nothing
        for (int t = 0; t < config_.L; ++t) {
            uint32_t* out = codes + static_cast<size_t>(t) * (1 + probes);
            out[0] = table_code(values, t);
            // Each sub-hash's runner-up under the scan's rule (a nonzero value; the first of
            // equal values), and by how much the winner beat it.
            found.clear();
            for (int k = 0; k < K; ++k) {
                const uint32_t h = static_cast<uint32_t>(t * K + k);
                if (values[h] < 0) continue;
                const uint32_t* bin = bins_.data() + static_cast<size_t>(h) * width_;
                const float best = x[bin[values[h]]];
                int32_t second = -1;
                float second_value = 0.0f;
                for (uint32_t j = 0; j < width_; ++j) {
                    const float v = x[bin[j]];
                    if (static_cast<int32_t>(j) == values[h] || v == 0.0f) continue;
                    if (second < 0 || v > second_value)
                        second = static_cast<int32_t>(j), second_value = v;
                }
                if (second >= 0) found.push_back({best - second_value, k, second});
            }
            std::sort(found.begin(), found.end(), [](const candidate& a, const candidate& b) {
                return a.margin < b.margin || (a.margin == b.margin && a.k < b.k);
            });
            for (uint32_t p = 0; p < probes; ++p) {
                if (p >= found.size()) {
                    out[1 + p] = out[0];
                    continue;
                }
                const uint32_t h = static_cast<uint32_t>(t * K + found[p].k);
                const int32_t winner = values[h];
                values[h] = found[p].runner_up;
                out[1 + p] = table_code(values, t);
                values[h] = winner;
            }
        }
    }

  private:
    struct inv_entry {
        uint32_t hash, pos;
    };
    uint32_t n_hashes_ = 0, width_ = 0, value_mask_ = 0;
    bool densify_ = true, minhash_ = false;
    uint64_t densify_seed_ = 0;
    std::vector<uint32_t> bins_;         // bin h = bins_[h * width_ .. + width_)
    std::vector<uint32_t> interleaved_;  // bins_ in the 16-lane layout of wta_scan_*
    std::vector<uint32_t> inv_offsets_;  // coordinate i is read by inv_entries_[off[i]..off[i+1])
    std::vector<inv_entry> inv_entries_;
    wta_scan_fn scan_ = wta_scan_scalar;
};

// --- simhash ---------------------------------------------------------------------------------

// The scalar projection (see project_fn and project_impl).
void project_generic(const uint32_t* ids, const float* xs, uint32_t nnz, const int8_t* signs,
                     size_t stride, float* acc, uint32_t P) {
    detail::project_impl(ids, xs, nnz, signs, stride, acc, P);
}
project_fn pick_project() {
#if HSLIDE_X86
    switch (hash_isa()) {
        case isa_level::avx512:
        case isa_level::avx512bf16:
        case isa_level::amx:
            return detail::project_avx512;
        case isa_level::avx2:
            return detail::project_avx2;
        case isa_level::scalar:
            break;
    }
#endif
    return project_generic;
}

class simhash_family final : public hash_family {
  public:
    simhash_family(const lsh_config& config, uint32_t dim, uint64_t seed)
        : hash_family(config, dim, seed) {
        const uint64_t P = static_cast<uint64_t>(config.K) * config.L * config.bits_per_hash;
        HSLIDE_CHECK(P <= (1u << 24), "simhash: K * L * bits = {} projections is too many", P);
        HSLIDE_CHECK(P * dim <= (uint64_t{1} << 34),
                     "simhash: {} projections over {} dimensions need {} bytes; use dwta", P, dim,
                     P * dim);
        P_ = static_cast<uint32_t>(P);
        stride_ = (P_ + 63) / 64 * 64;
        signs_.assign(static_cast<size_t>(dim) * stride_, 0);
        rng gen(derive_seed(seed, 0x1000 + static_cast<uint64_t>(config.kind)));
        const uint32_t sample = (dim + 2) / 3;
        std::vector<uint32_t> coords(dim);
        std::iota(coords.begin(), coords.end(), 0u);
        for (uint32_t p = 0; p < P_; ++p) {
            // A partial Fisher-Yates step picks `sample` distinct coordinates for projection p.
            for (uint32_t i = 0; i < sample; ++i) {
                const uint32_t j = i + static_cast<uint32_t>(gen.below(dim - i));
                std::swap(coords[i], coords[j]);
                signs_[static_cast<size_t>(coords[i]) * stride_ + p] = (gen() >> 63) ? 1 : -1;
            }
        }
        project_ = pick_project();
    }

    void codes_dense(const float* x, uint32_t* codes) const override {
        hash_scratch& scratch = thread_scratch();
        uint32_t* ids = sized(scratch.ids, dim_);
        float* xs = sized(scratch.xs, dim_);
        uint32_t nnz = 0;
        for (uint32_t i = 0; i < dim_; ++i)
            if (x[i] != 0.0f) ids[nnz] = i, xs[nnz++] = x[i];
        project(ids, xs, nnz, codes);
    }

    void codes_sparse(const uint32_t* ids, const float* vals, uint32_t nnz,
                      uint32_t* codes) const override {
        hash_scratch& scratch = thread_scratch();
        uint32_t* kept = sized(scratch.ids, nnz);
        float* xs = sized(scratch.xs, nnz);
        uint32_t n = 0;
        for (uint32_t i = 0; i < nnz; ++i) {
            HSLIDE_CHECK(ids[i] < dim_, "sparse id {} out of range (dim {})", ids[i], dim_);
            if (vals[i] != 0.0f) kept[n] = ids[i], xs[n++] = vals[i];
        }
        project(kept, xs, n, codes);
    }

    hash_function_data function_data() const override {
        hash_function_data d = common_data();
        d.projections = P_;
        d.sign_stride = static_cast<uint32_t>(stride_);
        d.signs = signs_;
        return d;
    }

  private:
    void project(const uint32_t* ids, const float* xs, uint32_t nnz, uint32_t* codes) const {
        float* acc = sized(thread_scratch().floats, P_);
        std::fill(acc, acc + P_, 0.0f);
        project_(ids, xs, nnz, signs_.data(), stride_, acc, P_);
        const int K = config_.K, bits = config_.bits_per_hash;
        const float* a = acc;
        for (int t = 0; t < config_.L; ++t) {
            uint64_t code = 0;
            for (int b = 0; b < K * bits; ++b) code = (code << 1) | (*a++ > 0.0f ? 1u : 0u);
            codes[t] = static_cast<uint32_t>(code);
        }
    }

    uint32_t P_ = 0;
    size_t stride_ = 0;
    std::vector<int8_t> signs_;  // signs_[i * stride_ + p]: sign of coordinate i in projection p
    project_fn project_ = project_generic;
};

}  // namespace

std::unique_ptr<hash_family> hash_family::create(const lsh_config& config, uint32_t dim,
                                                 uint64_t seed) {
    validate(config);
    HSLIDE_CHECK(dim >= 1, "an LSH family needs vectors of at least one dimension");
    if (config.kind == hash_kind::simhash)
        return std::unique_ptr<hash_family>(new simhash_family(config, dim, seed));
    return std::unique_ptr<hash_family>(new bin_family(config, dim, seed));
}

}  // namespace hslide
