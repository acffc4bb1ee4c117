// Exact scoring of a layer's rows against a chunk of queries, blocked for the caches: what a
// top-k selection searched exactly, exact prediction and the selection probe's reference use.
//
// Scoring a query against every row one query at a time streams the whole layer from memory
// per query (686 MB at 670k x 256): memory-bound, ~30 ms a query on 2 cores. Here a block of
// rows small enough to stay in L2 is scored against the chunk's queries before the next block
// is read, so the layer streams once a chunk (once a thread, where the threads share out the
// chunk's queries rather than the blocks). In fp32, dots16 multiplies the block by 16
// queries at once (the queries transposed): a GEMM without horizontal sums; in bf16,
// dots16_bf16 does the same with vdpbf16ps. Their sums run in another order than the
// per-query kernels', so scores can differ from those of the forward pass in the last bits.
#pragma once

#include "kernels.hpp"
#include "layer_rows.hpp"
#include "top_k.hpp"

#include <cstdint>
#include <vector>

namespace hslide::cpu {

/// The stride of a bf16 copy of rows of `width` values that score() reads: whole 64-byte lines
/// a row (width rounded up to 32), the tail zero.
inline size_t bf16_copy_stride(uint32_t width) {
    return (size_t(width) + 31) / 32 * 32;
}

/// Rounds rows ids[0..n) of `layer` (ids null: rows 0..n-1) with k.to_bf16 into `copy`
/// (bf16_copy_stride(layer.width) values a row; the tails are not written, so a copy allocated
/// zeroed keeps them zero), on `threads` threads. Returns `layer` scoring the copy (weights16).
layer_rows round_rows_to_bf16(const layer_rows& layer, const kernel_table& k, bf16* copy,
                              const uint32_t* ids, size_t n, int threads);

/// The stride of an int8 copy of rows of `width` values (int8_rows): whole 64-byte lines a row.
inline size_t int8_copy_stride(uint32_t width) {
    return (size_t(width) + 63) / 64 * 64;
}

/// The arrays of an int8 copy of `rows` rows of `width` values (int8_copy_stride), all zero.
struct int8_copy {
    std::vector<int8_t> values;
    std::vector<float> scale;
    std::vector<int32_t> sum;
    size_t stride = 0;

    int8_copy() = default;
    int8_copy(uint32_t rows, uint32_t width)
        : values(size_t(rows) * int8_copy_stride(width), int8_t{0}),
          scale(rows, 0.0f),
          sum(rows, 0),
          stride(int8_copy_stride(width)) {}
    int8_rows view() { return {values.data(), stride, scale.data(), sum.data()}; }
};

/// Whether an exact search over kernels `k` (top_k_search::automatic) scores an int8 copy of
/// the rows: where they have 8-bit products (dots16_u8s8) and are not the scalar reference
/// (whose int8 products are slower than its fp32 ones). vpdpbusd on avx512bf16 with VNNI
/// doubles vdpbf16ps' products an instruction; vpmaddubsw on avx2 (4-bit queries) does 2.5x
/// the fp32 kernel's products a second.
inline bool searches_int8_copy(const kernel_table& k) {
    return k.level != isa_level::scalar && k.dots16_u8s8 != nullptr;
}

/// Quantizes rows ids[0..n) of `layer` (ids null: rows 0..n-1) with k.to_int8_row into `copy`,
/// on `threads` threads: round_rows_to_bf16's int8 twin.
void quantize_rows_to_int8(const layer_rows& layer, const kernel_table& k, const int8_rows& copy,
                           const uint32_t* ids, size_t n, int threads);

/// Quantizes a query of `width` values to u8 for dots16_u8s8 over its range with 0 in it: x ~
/// *scale * (u - *zero), u = round(x / scale) + zero in [0, max] (max: the kernels'
/// u8s8_input_max; an all-zero query: scale 0). u[i] is written to out[(i / 4) * 64 + i % 4]
/// (its lane of a group of 16 queries in fours), the last four's unused values zero. SSE2 where
/// the build targets it (x86-64), else quantize_query_u8_reference; the two write the same
/// bytes, scale and zero point for finite x (a non-finite x's bytes are unspecified).
void quantize_query_u8(const float* x, uint32_t width, uint8_t max, uint8_t* out, float* scale,
                       int32_t* zero);
/// quantize_query_u8 in plain scalar code, a value at a time: the reference.
void quantize_query_u8_reference(const float* x, uint32_t width, uint8_t max, uint8_t* out,
                                 float* scale, int32_t* zero);

/// The blocked exact scorer and its buffers (reused from call to call).
class exact_scoring {
  public:
    /// Queries per call for a top k: 256, fewer when k is large (at most 2^22 candidates, 32
    /// MiB, a thread).
    static uint32_t chunk(uint32_t k);

    /// Scores every row of `rows` against queries[0..n) (n <= chunk(k); each `rows.width`
    /// floats, a dense layer input) and writes each query's k best rows, best first, ties to
    /// the smaller id, NaN skipped, padded with UINT32_MAX / -inf (select_top_k's contract), to
    /// labels/scores[q * k..]; with log_partition != null, the log-sum-exp of all its logits to
    /// log_partition[q] (summed block by block in block order). Deterministic whatever the
    /// thread count. `threads` per-thread buffers are kept.
    /// With `copy8` (and k.dots16_u8s8), the rows' scores are those of that int8 copy of
    /// them against the queries quantized to u8 (each by its own range, 0 included): the
    /// candidates of a search, not logits (no log_partition).
    void score(const layer_rows& rows, const kernel_table& k, int threads,
               const float* const* queries, uint32_t n, uint32_t top, uint32_t* labels,
               float* scores, double* log_partition, const int8_rows* copy8 = nullptr);

    /// Row scores a second of this scorer on `threads` threads at rows of `width`, measured
    /// for about a tenth of a second on random rows that fit in the caches, in bf16 where an
    /// exact top-k search would copy the rows to bf16 (cpu_exact_search_in_bf16) and fp32
    /// otherwise: the rate a rank of a sharded run offers (--shard-weights auto).
    static double measure_rate(const kernel_table& k, int threads, uint32_t width);

  private:
    struct thread_buffers {
        std::vector<float> logits;     // a block's scores of 16 queries
        std::vector<float> one_query;  // one query's logits of a block (the log-partition)
        std::vector<bf16> input16;     // a query rounded to bf16
    };
    std::vector<float> hidden_;       // the chunk's queries (fp32: transposed in groups of 16)
    std::vector<uint8_t> hidden8_;    // int8 copy: the queries in u8, in fours, 16 a group
    std::vector<float> query_scale_;  // int8 copy: each query's scale and zero point
    std::vector<int32_t> query_zero_;
    std::vector<double> block_log_partition_;  // per block and query
    std::vector<thread_buffers> threads_;
    // Per thread and query: candidates for its best `kept` over the blocks the thread scored
    // (room for 2 * kept: a superset of them, offer_candidate), their count and floor.
    std::vector<std::vector<scored_label>> candidates_;
    std::vector<std::vector<uint32_t>> counts_;
    std::vector<std::vector<float>> floors_;
};

}  // namespace hslide::cpu
