// Entry points into the GPU's LSH, top-k and row-update pieces for the tests, in plain C++ (no
// CUDA types), so tests/test_gpu_backend.cpp can compare them with the CPU's hash families,
// tables and active sets, or with references, on the same inputs. They run on the current GPU
// and synchronise.
#pragma once

#include "hslide/fill_pool.hpp"
#include "hslide/lsh.hpp"

#include <cstdint>
#include <map>
#include <vector>

namespace hslide::gpu::testing {

/// Codes (n_rows * L) of dense rows that are row_stride floats apart, computed on the GPU.
std::vector<uint32_t> hash_rows(const hash_function_data& functions, const std::vector<float>& rows,
                                uint32_t n_rows, size_t row_stride);

/// Per table: bucket code -> its items (ascending), built on the GPU from codes[item * L + t].
std::vector<std::map<uint32_t, std::vector<uint32_t>>> build_tables(
    const std::vector<uint32_t>& codes, uint32_t n_items, const lsh_config& config, uint64_t seed);

/// Per sample: its active set (ascending ids), built on the GPU over tables of item_codes,
/// from sample_codes (n_samples * L) and, when label_offsets is not empty, forced labels.
std::vector<std::vector<uint32_t>> query_active_sets(const std::vector<uint32_t>& item_codes,
                                                     uint32_t n_items, const lsh_config& config,
                                                     const active_set_config& active,
                                                     const std::vector<uint32_t>& sample_codes,
                                                     const std::vector<uint32_t>& label_offsets,
                                                     const std::vector<uint32_t>& label_ids,
                                                     uint64_t seed);

/// The GPU's top_k on host inputs: with offsets (batch + 1 entries) the entries of sample s
/// are [offsets[s], offsets[s + 1]) with their ids, else n_columns consecutive scores per
/// sample; bias (one per id) is added when not empty. Labels and scores, batch * k, best first.
void top_k(const std::vector<float>& scores, const std::vector<uint32_t>& offsets,
           const std::vector<uint32_t>& ids, uint32_t n_columns, uint32_t batch, uint32_t k,
           const std::vector<float>& bias, std::vector<uint32_t>& labels,
           std::vector<float>& top_scores);

/// The GPU's chunked top-k merge (gpu_topk.cuh) on host scores, batch x n row-major (bias, n
/// floats, added when not empty), merged `chunk` columns at a time: the k best per sample
/// (batch * k, best first, UINT32_MAX / -inf past the scored) and each sample's
/// log-partition over all n scores.
void top_k_chunked(const std::vector<float>& scores, uint32_t n, uint32_t batch, uint32_t k,
                   uint32_t chunk, const std::vector<float>& bias, std::vector<uint32_t>& labels,
                   std::vector<float>& top_scores, std::vector<float>& log_partition);

/// The GPU's whole scoring pass (score_top_k: cuBLAS GEMMs of `chunk` rows, 0 = the
/// backend's choice, and the merge): a layer of `rows` rows of `stride` floats (width used)
/// and its bias against batch hidden rows of `stride` floats; bf16 rounds both first. Throws
/// hslide::error (unsupported, naming cuBLAS) where cuBLAS does not load.
void score_top_k(const std::vector<float>& weights, const std::vector<float>& bias, uint32_t rows,
                 uint32_t width, uint32_t stride, const std::vector<float>& hidden, uint32_t batch,
                 bool bf16, uint32_t k, uint32_t chunk, std::vector<uint32_t>& labels,
                 std::vector<float>& top_scores, std::vector<float>& log_partition);

/// The GPU's top-k sets (build_top_k_sets) from best ids (batch * k, UINT32_MAX: none) and,
/// when label_offsets is not empty, labels: each set as built (labels first, then the top-k
/// ascending, then the fill ascending; `drawn_from`, if given, gets where each fill begins),
/// the fill drawn from `pool`.
std::vector<std::vector<uint32_t>> top_k_sets(const std::vector<uint32_t>& best, uint32_t k,
                                              uint32_t batch,
                                              const std::vector<uint32_t>& label_offsets,
                                              const std::vector<uint32_t>& label_ids, uint32_t fill,
                                              uint32_t n_items, uint64_t seed,
                                              std::vector<uint32_t>* drawn_from = nullptr,
                                              const fill_pool& pool = {});

/// The GPU's fill correction (apply_fill_correction) of set logits (CSR: offsets, batch + 1
/// entries), each sample's fill beginning at drawn_from[s].
std::vector<float> fill_corrected(const std::vector<float>& logits,
                                  const std::vector<uint32_t>& offsets,
                                  const std::vector<uint32_t>& drawn_from, uint32_t rows,
                                  float weight);

/// One layer's parameters on the host for the row-kernel tests: `rows` rows of `stride` floats.
struct host_layer {
    uint32_t rows = 0, stride = 0;
    std::vector<float> weights, adam_m, adam_v, bias, bias_m, bias_v;
    std::vector<uint16_t> weights16;  ///< the bf16 copy's bits, when not empty
};

/// Adam's hyperparameters for one step (gpu_layers.cuh's adam_params).
struct host_adam {
    float lr, beta1, beta2, eps, c1, c2;
};

/// The GPU's row-sparse Adam on `layer`, in place (output_rows_adam, or first_layer_rows_adam
/// when first_layer: no bias): entry e touches row entry_row[e] (UINT32_MAX: none) with
/// scale[e] times row entry_sample[e] of `vectors` (rows of layer.stride floats). The
/// entries are grouped by row on the host (a stable sort, as the step's radix sort).
void rows_adam(host_layer& layer, bool first_layer, const std::vector<uint32_t>& entry_row,
               const std::vector<uint32_t>& entry_sample, const std::vector<float>& scale,
               const std::vector<float>& vectors, float inv_batch, const host_adam& adam);

/// The GPU's sparse_output_backward: d_hidden (batch rows of layer.stride floats) of the
/// entries [offsets[s], offsets[s + 1]) of each sample (ids, delta), masked by hidden's ReLU;
/// reads the bf16 copy when bf16.
std::vector<float> sparse_output_backward(const host_layer& layer, bool bf16,
                                          const std::vector<uint32_t>& offsets,
                                          const std::vector<uint32_t>& ids,
                                          const std::vector<float>& delta,
                                          const std::vector<float>& hidden, uint32_t batch);

/// The dense output layer's fused softmax (gpu_dense.cuh) on host inputs: logits are batch
/// rows of dense_ld(rows) floats (the padding columns are never read: fill them with NaN),
/// rounded to bf16 when `bf16` (the bf16 step's logits: give values that are bf16 already to
/// compare exactly), bias rows floats; the labels in CSR form (batch + 1 offsets). Returns
/// delta as written (batch x dense_ld(rows), bf16 values widened when `bf16`), the bias
/// gradient (rows, the batch mean of delta) and the per-sample losses.
/// The GPU's hidden_gradient_share_f64 over the first `width` values of layer's rows: batch rows
/// of `width` doubles (a rank's share of the hidden gradient over each sample's entries
/// [offsets[s], offsets[s + 1]) of ids and deltas); reads the bf16 copy when bf16.
std::vector<double> hidden_gradient_share(const host_layer& layer, uint32_t width, bool bf16,
                                          const std::vector<uint32_t>& offsets,
                                          const std::vector<uint32_t>& ids,
                                          const std::vector<float>& delta, uint32_t batch);

uint32_t dense_ld(uint32_t rows);
/// With `logistic`: dense_logistic_loss (gpu_dense.cuh) instead, on the same inputs.
void dense_softmax_loss(const std::vector<float>& logits, const std::vector<float>& bias,
                        uint32_t rows, uint32_t batch, const std::vector<uint32_t>& label_offsets,
                        const std::vector<uint32_t>& label_ids, bool bf16,
                        std::vector<float>& delta, std::vector<float>& bias_gradient,
                        std::vector<float>& loss, bool logistic = false);

/// The set losses (gpu_layers.cuh) on host inputs: softmax_loss, or logistic_loss with
/// `logistic`, over each sample's entries [offsets[s], offsets[s + 1]) of `logits` (labels
/// first), or with `offsets` empty over n_columns a sample, bias added, the labels by column.
/// Returns the deltas and the per-sample losses (label_offsets: batch + 1 values).
void set_loss(const std::vector<float>& logits, const std::vector<float>& bias,
              const std::vector<uint32_t>& offsets, uint32_t n_columns,
              const std::vector<uint32_t>& label_offsets, const std::vector<uint32_t>& label_ids,
              bool logistic, std::vector<float>& delta, std::vector<float>& loss);

/// score_top_k_fused's pilot_rows for "chosen from k and the layer" (gpu::fused_auto_pilot).
constexpr uint32_t fused_auto_pilot = 0xffffffffu;

/// The GPU's fused scoring pass (score_top_k_fused, bf16: both sides rounded first) on the
/// inputs of score_top_k above, with `pilot_rows` rows through the cuBLAS pass first
/// (fused_auto_pilot: chosen). Returns whether it ran (false: not applicable here, or a
/// sample's candidates overflowed; the outputs are then left empty). Throws hslide::error
/// (unsupported, naming cuBLAS) where cuBLAS does not load.
bool score_top_k_fused(const std::vector<float>& weights, const std::vector<float>& bias,
                       uint32_t rows, uint32_t width, uint32_t stride,
                       const std::vector<float>& hidden, uint32_t batch, uint32_t k,
                       uint32_t pilot_rows, std::vector<uint32_t>& labels,
                       std::vector<float>& top_scores, std::vector<float>& log_partition);

/// The largest single GPU allocation since the last reset (device_memory.hpp), process-wide.
size_t largest_device_allocation();
void reset_largest_device_allocation();

}  // namespace hslide::gpu::testing
