// The blocked exact scorer (exact_scoring.hpp says why blocks).
#include "exact_scoring.hpp"

#include "hslide/clock.hpp"
#include "hslide/config.hpp"
#include "hslide/error.hpp"
#include "hslide/rng.hpp"

#include <omp.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace hslide::cpu {

namespace {

/// Bit j set where row[j] >= floor[j] (NaN on either side: clear), j < 16.
inline uint32_t passes_floor(const float* row, const float* floor) {
    uint32_t pass = 0;
#if defined(__SSE2__)
    // SSE2 is x86-64's baseline: four compares and four movemasks, no ISA dispatch needed.
    for (int q = 0; q < 4; ++q)
        pass |= uint32_t(_mm_movemask_ps(
                    _mm_cmpge_ps(_mm_loadu_ps(row + 4 * q), _mm_loadu_ps(floor + 4 * q))))
                << (4 * q);
#else
    for (uint32_t j = 0; j < 16; ++j) pass |= uint32_t(row[j] >= floor[j]) << j;
#endif
    return pass;
}

/// Appends c to a query's candidates buf[0..count) (room for 2 * kept): when they fill it, they
/// are cut to the best `kept` (ties to the smaller id) and `floor` rises to the worst of those,
/// below which no later candidate can enter the query's top. A candidate costs an append
/// instead of a heap's log(kept) sift (a heap offer was most of a search's time beside the
/// products: bench/peers.md, 2026-12-06); callers offer only scores >= floor.
inline void offer_candidate(const kernel_table& k, scored_label* buf, uint32_t& count, float& floor,
                            uint32_t kept, const scored_label& c) {
    buf[count++] = c;
    if (count == 2 * kept) {
        floor = k.keep_best(buf, count, kept);
        count = kept;
    }
}

/// offer_candidate of a block's scores of 16 queries, row by row (z[a * 16 + j]: row first + a,
/// query j < n_x; query j's candidates at bufs[j * 2 * kept..], count counts[j], floor
/// floors[j]): a row's 16 scores are tested against the 16 floors at once, and only the
/// queries a score reaches get it. Most rows reach none once the floors have risen.
void offer_rows_of_16(const kernel_table& k, const float* z, uint32_t nb, uint32_t first,
                      uint32_t n_x, uint32_t kept, scored_label* bufs, uint32_t* counts,
                      float* floors) {
    if (kept == 0) return;
    float floor[16];
    for (uint32_t j = 0; j < 16; ++j)
        floor[j] = j < n_x ? floors[j] : std::numeric_limits<float>::quiet_NaN();  // never passes
    for (uint32_t a = 0; a < nb; ++a) {
        const float* row = z + size_t(a) * 16;
        uint32_t pass = passes_floor(row, floor);
        while (pass != 0) {
            const uint32_t j = uint32_t(__builtin_ctz(pass));
            pass &= pass - 1;
            offer_candidate(k, bufs + size_t(j) * 2 * kept, counts[j], floor[j], kept,
                            {row[j], first + a});
        }
    }
    for (uint32_t j = 0; j < n_x; ++j) floors[j] = floor[j];
}

/// offer_candidate of one query's scores of a block, z[i * step] for row first + i.
void offer_scores(const kernel_table& k, const float* z, size_t step, uint32_t nb, uint32_t first,
                  uint32_t kept, scored_label* buf, uint32_t& count, float& floor) {
    if (kept == 0) return;
    for (uint32_t i = 0; i < nb; ++i) {
        const float s = z[size_t(i) * step];
        if (s >= floor) offer_candidate(k, buf, count, floor, kept, {s, first + i});  // NaN fails
    }
}

}  // namespace

layer_rows round_rows_to_bf16(const layer_rows& layer, const kernel_table& k, bf16* copy,
                              const uint32_t* ids, size_t n, int threads) {
    const size_t stride16 = bf16_copy_stride(layer.width);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i) {
        const uint32_t r = ids ? ids[i] : uint32_t(i);
        k.to_bf16(layer.row(r), copy + size_t(r) * stride16, layer.width);
    }
    layer_rows rounded = layer;
    rounded.weights16 = copy;
    rounded.stride16 = stride16;
    return rounded;
}

namespace {

/// The query's range with 0 in it, [lo, hi], as its bytes' scale `step` and zero point z: u =
/// nearbyint(x * step) + z in [0, max].
struct query_range {
    float step;
    int32_t zero;
};

query_range range_of(float lo, float hi, uint8_t max) {
    // A ReLU layer's output (lo = 0) gets zero point 0: all max + 1 levels cover [0, hi].
    const float levels = float(max);
    const float inv = hi > lo ? levels / (hi - lo) : 0.0f;
    const float step = std::isfinite(inv) ? inv : 0.0f;
    return {step, int32_t(std::clamp(std::nearbyint(-lo * step), 0.0f, levels))};
}

void write_range(float lo, float hi, uint8_t max, const query_range& r, float* scale,
                 int32_t* zero) {
    *scale = r.step > 0.0f ? (hi - lo) / float(max) : 0.0f;
    *zero = r.step > 0.0f ? r.zero : 0;
}

}  // namespace

void quantize_query_u8_reference(const float* x, uint32_t width, uint8_t max, uint8_t* out,
                                 float* scale, int32_t* zero) {
    float lo = 0.0f, hi = 0.0f;
    for (uint32_t i = 0; i < width; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
    }
    const query_range r = range_of(lo, hi, max);
    const float levels = float(max);
    for (uint32_t i = 0; i < (width + 3) / 4 * 4; ++i) {
        const float u = i < width ? std::nearbyint(x[i] * r.step) + float(r.zero) : 0.0f;
        out[size_t(i / 4) * 64 + i % 4] = uint8_t(std::clamp(u, 0.0f, levels));
    }
    write_range(lo, hi, max, r, scale, zero);
}

void quantize_query_u8(const float* x, uint32_t width, uint8_t max, uint8_t* out, float* scale,
                       int32_t* zero) {
#if defined(__SSE2__)
    // SSE2 is x86-64's baseline (no dispatch): four values a four, one instruction each where
    // the reference takes a libm call (nearbyint) a value. cvtps2dq rounds to nearest even, as
    // nearbyint does in the default rounding mode; min(x, lo) and max(x, hi) keep lo and hi
    // where x is NaN, as std::min(lo, x) and std::max(hi, x) do.
    const uint32_t whole = width / 4;
    __m128 lo4 = _mm_setzero_ps(), hi4 = _mm_setzero_ps();
    for (uint32_t p = 0; p < whole; ++p) {
        const __m128 v = _mm_loadu_ps(x + 4 * p);
        lo4 = _mm_min_ps(v, lo4);
        hi4 = _mm_max_ps(v, hi4);
    }
    float lanes_lo[4], lanes_hi[4];
    _mm_storeu_ps(lanes_lo, lo4);
    _mm_storeu_ps(lanes_hi, hi4);
    float lo = 0.0f, hi = 0.0f;
    for (uint32_t j = 0; j < 4; ++j) {
        lo = std::min(lo, lanes_lo[j]);
        hi = std::max(hi, lanes_hi[j]);
    }
    for (uint32_t i = 4 * whole; i < width; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
    }
    const query_range r = range_of(lo, hi, max);
    const __m128 step = _mm_set1_ps(r.step);
    const __m128i z = _mm_set1_epi32(r.zero), top = _mm_set1_epi8(char(max));
    auto four = [&](__m128 v, uint8_t* to) {
        const __m128i u = _mm_add_epi32(_mm_cvtps_epi32(_mm_mul_ps(v, step)), z);
        // Saturating packs clamp to [0, 255], then to [0, max].
        const __m128i bytes =
            _mm_min_epu8(_mm_packus_epi16(_mm_packs_epi32(u, u), _mm_setzero_si128()), top);
        const int32_t b = _mm_cvtsi128_si32(bytes);
        std::memcpy(to, &b, 4);
    };
    for (uint32_t p = 0; p < whole; ++p) four(_mm_loadu_ps(x + 4 * p), out + size_t(p) * 64);
    if (whole * 4 < width) {
        // The last four's missing values are 0 bytes (not the zero point), as the reference's.
        float tail[4] = {0, 0, 0, 0};
        for (uint32_t i = 4 * whole; i < width; ++i) tail[i - 4 * whole] = x[i];
        four(_mm_loadu_ps(tail), out + size_t(whole) * 64);
        for (uint32_t i = width; i < 4 * whole + 4; ++i) out[size_t(whole) * 64 + i % 4] = 0;
    }
    write_range(lo, hi, max, r, scale, zero);
#else
    quantize_query_u8_reference(x, width, max, out, scale, zero);
#endif
}

void quantize_rows_to_int8(const layer_rows& layer, const kernel_table& k, const int8_rows& copy,
                           const uint32_t* ids, size_t n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i) {
        const uint32_t r = ids ? ids[i] : uint32_t(i);
        copy.write(r, layer.row(r), layer.width, k);
    }
}

uint32_t exact_scoring::chunk(uint32_t k) {
    return uint32_t(std::clamp<uint64_t>((uint64_t{1} << 22) / std::max(k, 1u), 1, 256));
}

void exact_scoring::score(const layer_rows& layer, const kernel_table& k_, int threads,
                          const float* const* queries, uint32_t n, uint32_t k, uint32_t* labels,
                          float* scores, double* log_partition, const int8_rows* copy8) {
    const bool int8 = copy8 != nullptr && *copy8;
    HSLIDE_ASSERT(!int8 || (k_.dots16_u8s8 && !log_partition && layer.width <= 65536));
    const bool bf16_rows = !int8 && layer.weights16 != nullptr;
    const bool with_log_partition = log_partition != nullptr;
    const uint32_t width = layer.width;
    const size_t in_stride = int8 ? copy8->stride : bf16_rows ? layer.stride16 : layer.stride;
    const size_t value_bytes = int8 ? 1 : bf16_rows ? sizeof(bf16) : sizeof(float);
    const uint32_t block_rows = uint32_t(std::clamp<size_t>(
        (size_t(512) << 10) / (in_stride * value_bytes), 16, std::max<size_t>(layer.rows, 16)));
    const int64_t n_blocks = (int64_t(layer.rows) + block_rows - 1) / block_rows;
    // Each thread keeps candidates for the best `kept` labels per query over the blocks it
    // scores (offer_candidate; merged as select_top_k ranks them).
    const uint32_t kept = std::min(k, layer.rows);
    // fp32: groups of 16 transposed queries (n rounded up to 16); bf16: a row a query (using
    // half of each in_stride floats).
    if (!int8) hidden_.resize(size_t(n + 15) / 16 * 16 * in_stride);
    // Each block's log-partition per query, summed in block order afterwards: the result does
    // not depend on which thread scored which block.
    if (with_log_partition) block_log_partition_.resize(size_t(n_blocks) * n);
    if (threads_.size() < size_t(threads)) threads_.resize(size_t(threads));
    candidates_.resize(size_t(threads));
    counts_.resize(size_t(threads));
    floors_.resize(size_t(threads));
    // bf16 with a native dots16_bf16: the queries in pairs, 16 at a time, as fp32's dots16 takes
    // them transposed (the buffer holds (n + 15) / 16 * 16 * in_stride floats, twice what this
    // needs); without one, a row of bf16 a query for active_dots_bf16.
    const bool paired = bf16_rows && k_.dots16_bf16;
    const uint32_t pairs = (width + 1) / 2;
    bf16* const hidden16 = reinterpret_cast<bf16*>(hidden_.data());
    // int8: groups of 16 queries in fours, element i of query s at
    // [(s / 16) * fours * 64 + (i / 4) * 64 + (s % 16) * 4 + i % 4]; the last group's missing
    // queries all zero, scale 0.
    const uint32_t fours = (width + 3) / 4;
    const size_t n16 = size_t(n + 15) / 16 * 16;
    if (int8) {
        hidden8_.assign(n16 / 16 * fours * 64, 0);
        query_scale_.assign(n16, 0.0f);
        query_zero_.assign(n16, 0);
    }
#pragma omp parallel num_threads(threads)
    {
        const int thread = omp_get_thread_num();
        thread_buffers& scratch = threads_[size_t(thread)];
        if (bf16_rows && scratch.input16.size() < width) scratch.input16.resize(width);
#pragma omp for schedule(static)
        for (int64_t s = 0; s < int64_t(n); ++s) {
            const float* h = queries[s];
            if (int8) {
                quantize_query_u8(h, width, k_.u8s8_input_max,
                                  hidden8_.data() + size_t(s / 16) * fours * 64 + (s % 16) * 4,
                                  &query_scale_[size_t(s)], &query_zero_[size_t(s)]);
            } else if (paired) {
                // Groups of 16 queries in pairs: element i of query s at
                // [(s / 16) * pairs * 32 + (i / 2) * 32 + (s % 16) * 2 + i % 2].
                bf16* group = hidden16 + size_t(s / 16) * pairs * 32 + (s % 16) * 2;
                k_.to_bf16(h, scratch.input16.data(), width);
                for (uint32_t i = 0; i < 2 * pairs; ++i)
                    group[size_t(i / 2) * 32 + i % 2] = i < width ? scratch.input16[i] : bf16{0};
            } else if (bf16_rows) {
                k_.to_bf16(h, hidden16 + size_t(s) * in_stride, width);
            } else {
                // Groups of 16 queries, each transposed: element i of query s at
                // [(s / 16) * width * 16 + i * 16 + s % 16].
                float* group = hidden_.data() + size_t(s / 16) * width * 16;
                for (uint32_t i = 0; i < width; ++i) group[size_t(i) * 16 + s % 16] = h[i];
            }
        }
        // The last group's missing queries: zeros (their scores are never read).
        if (paired)
#pragma omp single
            for (uint32_t s = n; s % 16 != 0; ++s) {
                bf16* group = hidden16 + size_t(s / 16) * pairs * 32 + (s % 16) * 2;
                for (uint32_t i = 0; i < 2 * pairs; ++i) group[size_t(i / 2) * 32 + i % 2] = 0;
            }
        else if (!bf16_rows && !int8)
#pragma omp single
            for (uint32_t s = n; s % 16 != 0; ++s) {
                float* group = hidden_.data() + size_t(s / 16) * width * 16;
                for (uint32_t i = 0; i < width; ++i) group[size_t(i) * 16 + s % 16] = 0.0f;
            }
        std::vector<scored_label>& bufs = candidates_[size_t(thread)];
        std::vector<uint32_t>& counts = counts_[size_t(thread)];
        std::vector<float>& floors = floors_[size_t(thread)];
        bufs.resize(size_t(n) * 2 * kept);
        counts.assign(n, 0);
        floors.assign(n, -std::numeric_limits<float>::infinity());
        constexpr uint32_t inputs = 16;  // queries per dots16 call
        std::vector<float>& logits = scratch.logits;
        logits.resize(size_t(inputs) * block_rows);
        std::vector<float>& one_query = scratch.one_query;  // a query's logits of the block
        if (with_log_partition && one_query.size() < block_rows) one_query.resize(block_rows);
        // Block blk's scores of the 16 queries from s0: offered to this thread's candidates.
        auto score_block = [&](int64_t blk, uint32_t s0) {
            const uint32_t r0 = uint32_t(blk) * block_rows;
            const uint32_t nb = std::min(block_rows, layer.rows - r0);
            const uint32_t n_x = std::min(inputs, n - s0);
            // Score of row r0 + i for query s0 + j: logits[i * row_step + j * col_step].
            size_t row_step = 1, col_step = block_rows;
            if (int8) {
                k_.dots16_u8s8(copy8->row(r0), copy8->stride, width, nb,
                               hidden8_.data() + size_t(s0 / 16) * fours * 64, copy8->scale + r0,
                               copy8->sum + r0, query_scale_.data() + s0, query_zero_.data() + s0,
                               layer.bias + r0, logits.data());
                row_step = inputs;
                col_step = 1;
            } else if (paired) {
                k_.dots16_bf16(layer.row16(r0), layer.stride16, width, nb,
                               hidden16 + size_t(s0 / 16) * pairs * 32, layer.bias + r0,
                               logits.data());
                row_step = inputs;
                col_step = 1;
            } else if (bf16_rows) {
                for (uint32_t j = 0; j < n_x; ++j)
                    k_.active_dots_bf16(layer.row16(r0), layer.stride16, width, nullptr, nb,
                                        hidden16 + size_t(s0 + j) * in_stride, layer.bias + r0,
                                        logits.data() + size_t(j) * block_rows);
            } else {
                k_.dots16(layer.row(r0), layer.stride, width, nullptr, nb,
                          hidden_.data() + size_t(s0) * width, layer.bias + r0, logits.data());
                row_step = inputs;
                col_step = 1;
            }
            if (row_step == inputs)
                offer_rows_of_16(k_, logits.data(), nb, r0, n_x, kept,
                                 bufs.data() + size_t(s0) * 2 * kept, counts.data() + s0,
                                 floors.data() + s0);
            for (uint32_t j = 0; j < n_x; ++j) {
                const float* z = logits.data() + size_t(j) * col_step;
                if (row_step != inputs)
                    offer_scores(k_, z, row_step, nb, r0, kept,
                                 bufs.data() + size_t(s0 + j) * 2 * kept, counts[s0 + j],
                                 floors[s0 + j]);
                if (with_log_partition) {
                    // The softmax kernel returns the block's log-sum-exp (its probabilities go
                    // to scratch).
                    for (uint32_t i = 0; i < nb; ++i) one_query[i] = z[size_t(i) * row_step];
                    block_log_partition_[size_t(blk) * n + s0 + j] =
                        k_.softmax(one_query.data(), one_query.data(), nb);
                }
            }
        };
        // With a group of 16 queries or more a thread, each thread takes whole groups and scores
        // them against every block: a query's candidates then meet one floor, not one a thread,
        // and a floor of k fed n rows lets ~k ln(n / k) of them through (Debian-recs, 2 threads:
        // 200 offers a query instead of 324, the offers being most of the search after the tile
        // products). Each block is then read once a thread instead of once: only where the
        // rows fit in a cache (16 MiB), as a layer streamed from memory once a thread would cost
        // more than the offers save. Otherwise, or with fewer groups than threads, the blocks
        // are shared out instead.
        const int team = omp_get_num_threads();
        const uint32_t groups = (n + inputs - 1) / inputs;
        const size_t layer_bytes = size_t(layer.rows) * in_stride * value_bytes;
        if (groups >= uint32_t(team) && layer_bytes <= (size_t(16) << 20)) {
            for (int64_t blk = 0; blk < n_blocks; ++blk)
                for (uint32_t g = uint32_t(thread); g < groups; g += uint32_t(team))
                    score_block(blk, g * inputs);
#pragma omp barrier
        } else {
#pragma omp for schedule(dynamic, 1)
            for (int64_t blk = 0; blk < n_blocks; ++blk)
                for (uint32_t s0 = 0; s0 < n; s0 += inputs) score_block(blk, s0);
        }
        // Merge the team's candidates per query (after the barrier; the team may be smaller
        // than `threads` when OpenMP limits it).
        std::vector<scored_label> top;
        std::vector<float> cand_score;
        std::vector<uint32_t> cand_id;
#pragma omp for schedule(static)
        for (int64_t s = 0; s < int64_t(n); ++s) {
            merge_thread_top_k(candidates_, counts_, team, size_t(s), 2 * kept, k,
                               labels + size_t(s) * k, scores + size_t(s) * k, cand_score, cand_id,
                               top);
            if (with_log_partition) {
                double max_lp = -std::numeric_limits<double>::infinity();
                for (int64_t b = 0; b < n_blocks; ++b)
                    max_lp = std::max(max_lp, block_log_partition_[size_t(b) * n + size_t(s)]);
                double sum = 0;
                for (int64_t b = 0; b < n_blocks; ++b)
                    sum += std::exp(block_log_partition_[size_t(b) * n + size_t(s)] - max_lp);
                log_partition[size_t(s)] = max_lp + std::log(sum);
            }
        }
    }
}

double exact_scoring::measure_rate(const kernel_table& k, int threads, uint32_t width) {
    // 16 MiB of fp32 rows at most, whatever the width: what a block-by-block scorer keeps in
    // its caches, so that the rate is the cores' and not the memory's.
    const uint32_t rows = uint32_t(std::clamp<uint64_t>((uint64_t{4} << 20) / width, 64, 16384));
    constexpr uint32_t queries = 128, top = 32;
    std::vector<float> weights(size_t(rows) * width), bias(rows, 0.0f),
        inputs(size_t(queries) * width);
    rng gen(0x5ca1ab1e);  // the values do not matter, only that they are not all zero
    for (float& w : weights) w = gen.uniform() - 0.5f;
    for (float& x : inputs) x = gen.uniform() - 0.5f;
    std::vector<bf16> weights16;
    int8_copy weights8;
    int8_rows copy8;
    layer_rows layer{weights.data(), width, bias.data(), rows, width, nullptr, 0};
    // As exact_top_k searches: an int8 copy where the kernels have 8-bit products, else bf16.
    if (searches_int8_copy(k)) {
        weights8 = int8_copy(rows, width);
        copy8 = weights8.view();
        quantize_rows_to_int8(layer, k, copy8, nullptr, rows, threads);
    } else if (cpu_exact_search_in_bf16(k.level)) {
        weights16.assign(size_t(rows) * bf16_copy_stride(width), bf16{0});
        layer = round_rows_to_bf16(layer, k, weights16.data(), nullptr, rows, threads);
    }
    std::vector<const float*> query(queries);
    for (uint32_t q = 0; q < queries; ++q) query[q] = inputs.data() + size_t(q) * width;
    std::vector<uint32_t> labels(size_t(queries) * top);
    std::vector<float> scores(size_t(queries) * top);
    exact_scoring scorer;
    auto score_once = [&] {
        scorer.score(layer, k, threads, query.data(), queries, top, labels.data(), scores.data(),
                     nullptr, &copy8);
    };
    score_once();  // buffers and first touches
    uint64_t calls = 0;
    const auto t0 = clock_type::now();
    double seconds = 0;
    while (calls < 2 || seconds < 0.1) {
        score_once();
        ++calls;
        seconds = seconds_since(t0);
    }
    return double(rows) * double(queries) * double(calls) / seconds;
}

}  // namespace hslide::cpu
