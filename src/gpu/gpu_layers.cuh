// The GPU backend's layer kernels: the sparse-input first layer, the output layer over an
// active set (or over every neuron through cuBLAS), the fused softmax + loss + gradient, the
// backward pass, row-sparse Adam, and top-k selection.
//
// Layouts follow model.hpp: rows of `stride` floats (a multiple of 16, so every row starts on
// a 64-byte boundary and 16-byte loads are aligned); hidden activations are batch rows of
// `stride` floats too. A bf16 copy of a layer, when kept, has the same stride. Gradients are
// never accumulated with one atomic per (sample, neuron, unit): entries are sorted by row
// (CUB) and one warp reduces each row's segment in sample order, then applies Adam to it.
//
// Every launcher takes the stream it runs on and checks its launch.
#pragma once

#include "device_memory.hpp"

#include <cuda_bf16.h>

#include <cstdint>

namespace hslide::gpu {

/// Adam's hyperparameters for one step (c1, c2: the bias corrections 1 / (1 - beta^t)).
struct adam_params {
    float lr, beta1, beta2, eps, c1, c2;
};

/// One layer's parameters on the device (bf16 copy null in fp32 precision).
struct layer_view {
    float* weights;
    float* adam_m;
    float* adam_v;
    float* bias;
    float* bias_m;
    float* bias_v;
    __nv_bfloat16* weights16;
    uint32_t rows, width, stride;

    /// A layer as the scoring passes read it: weights, bias and the bf16 copy, no Adam state.
    static layer_view for_scoring(float* weights, float* bias, __nv_bfloat16* weights16,
                                  uint32_t rows, uint32_t width, uint32_t stride) {
        return {weights, nullptr, nullptr, bias, nullptr, nullptr, weights16, rows, width, stride};
    }
};

/// A batch in CSR form on the device (offsets relative to the batch).
struct batch_csr {
    const uint32_t* feature_offsets;  ///< batch + 1
    const uint32_t* feature_ids;
    const float* feature_values;
    const uint32_t* label_offsets;  ///< batch + 1
    const uint32_t* label_ids;
    uint32_t size;
};

/// hidden[s] = relu(bias + sum_k x_k W0[f_k]) for every sample, rows of layer.stride floats
/// (padding zero); also its bf16 rounding into hidden16 when not null. Reads W0's bf16 copy
/// when the layer has one.
void first_layer_forward(const layer_view& layer, const batch_csr& batch, float* hidden,
                         __nv_bfloat16* hidden16, cudaStream_t stream);

/// logits[e] = W[ids[e]] . hidden[entry_sample[e]] + bias[ids[e]] for e < n_entries (one warp
/// per entry; bf16 weights and hidden when `bf16`).
void sparse_output_forward(const layer_view& layer, const float* hidden,
                           const __nv_bfloat16* hidden16, bool bf16, const uint32_t* ids,
                           const uint32_t* entry_sample, uint32_t n_entries, float* logits,
                           cudaStream_t stream);

/// The fused softmax + cross-entropy + gradient over each sample's entries
/// [offsets[s], offsets[s + 1]) (or n_columns consecutive ones per sample when offsets is
/// null, adding bias[j] to column j of each labelled sample first: an unlabelled sample's
/// logits are left as they are, since it is not trained). The target is 1/|y| on each label: the
/// first |y| entries when labels_first, else the label columns. delta = softmax - target; loss[s]
/// is the sample's cross-entropy (0 without labels, delta 0 then too). One pass over the logits
/// gives their maximum and partition sum together (online_softmax.hpp), a second writes delta.
void softmax_loss(float* logits, const float* bias, const uint32_t* offsets, uint32_t n_columns,
                  bool labels_first, const batch_csr& batch, float* delta, float* loss,
                  cudaStream_t stream);

/// softmax_loss's counterpart for --loss logistic (loss.hpp), over the same entries and labels
/// (the bias added alike): delta = sigmoid(logit) - 1 on each label (a label listed twice
/// counts twice), sigmoid(logit) on the other entries; loss[s] = the sum of the entries'
/// softplus(logit) less the labels' logits (0 without labels, delta 0 then too). One pass.
/// logistic_loss_gradient (the CPU's) is its reference.
void logistic_loss(float* logits, const float* bias, const uint32_t* offsets, uint32_t n_columns,
                   bool labels_first, const batch_csr& batch, float* delta, float* loss,
                   cudaStream_t stream);

/// d_hidden[s] = relu'(hidden[s]) * sum_e delta[e] W[ids[e]] over sample s's entries.
void sparse_output_backward(const layer_view& layer, bool bf16, const uint32_t* offsets,
                            const uint32_t* ids, const float* delta, const float* hidden,
                            uint32_t batch, float* d_hidden, cudaStream_t stream);

/// share[s * width + j] = sum over sample s's entries e, in entry order, of double(delta[e]) *
/// double(W[ids[e]][j]) (the layer's bf16 copy when `bf16`), for j < width: a rank's share of
/// the hidden gradient of a label-sharded output layer, in double (a float product is exact
/// there), so that the ranks' shares summed in rank order and rounded once give the bits one
/// rank does. The CPU kernels' weighted_row_sum_f64 / weighted_row_sum_bf16_f64 are its
/// reference. One block per sample, a thread per hidden unit.
void hidden_gradient_share_f64(const layer_view& layer, bool bf16, const uint32_t* offsets,
                               const uint32_t* ids, const float* delta, uint32_t batch,
                               double* share, cudaStream_t stream);

/// d_hidden[s] = relu'(hidden[s]) * d_hidden[s] (after a dense product wrote W^T delta).
void relu_backward(const float* hidden, uint32_t batch, uint32_t stride, float* d_hidden,
                   cudaStream_t stream);

/// For each distinct row in `rows` (sorted, with `order` the entry of each position): the
/// row's batch-mean gradient sum over its entries of delta[e] * hidden[sample[e]] (output
/// layer) is formed by one warp in entry order, and Adam is applied to the row and its bias.
/// unique_rows / segment_begin (n_unique + 1) / n_unique come from a run-length encoding.
void output_rows_adam(const layer_view& layer, const uint32_t* unique_rows,
                      const uint32_t* segment_begin, const uint32_t* n_unique, uint32_t max_unique,
                      const uint32_t* order, const uint32_t* entry_sample, const float* delta,
                      const float* hidden, float inv_batch, const adam_params& adam,
                      cudaStream_t stream);

/// The same for the first layer: row f's gradient sums x_k * d_hidden[sample of k] over the
/// batch's nonzeros k of feature f; rows equal to UINT32_MAX (points without labels) are
/// skipped. No bias (the first layer's bias is dense: first_layer_bias_adam).
void first_layer_rows_adam(const layer_view& layer, const uint32_t* unique_rows,
                           const uint32_t* segment_begin, const uint32_t* n_unique,
                           uint32_t max_unique, const uint32_t* order,
                           const uint32_t* nonzero_sample, const float* values,
                           const float* d_hidden, float inv_batch, const adam_params& adam,
                           cudaStream_t stream);

/// Adam with a zero gradient (momentum only) on every row of the layer whose touched[row] is
/// 0 (--adam input-dense on the first layer: rows the batch did not touch still move).
void untouched_rows_adam(const layer_view& layer, const uint8_t* touched, const adam_params& adam,
                         cudaStream_t stream);

/// Adam on the first layer's bias with the batch-mean of d_hidden.
void first_layer_bias_adam(const layer_view& layer, const float* d_hidden, uint32_t batch,
                           float inv_batch, const adam_params& adam, cudaStream_t stream);

/// Adam on every row of a dense layer from a full gradient (rows x stride, G = float or
/// __nv_bfloat16) and a bias gradient; refreshes the bf16 copy.
template <class G>
void dense_adam(const layer_view& layer, const G* gradient, const float* bias_gradient,
                const adam_params& adam, cudaStream_t stream);

/// bias_gradient[j] = inv_batch * sum_s delta[s * n + j].
void column_sums(const float* delta, uint32_t batch, uint32_t n, float inv_batch,
                 float* bias_gradient, cudaStream_t stream);

/// Rounds n floats to bf16 (round to nearest even).
void to_bf16(const float* in, __nv_bfloat16* out, size_t n, cudaStream_t stream);

/// For each of the batch's nonzeros: its sample, and its feature as a sort key (UINT32_MAX for
/// samples without labels, whose rows a step does not touch).
void nonzero_keys(const batch_csr& batch, uint32_t* keys, uint32_t* sample, uint32_t* index,
                  cudaStream_t stream);

/// Fills index[i] = i for i < n.
void iota(uint32_t* index, uint32_t n, cudaStream_t stream);

/// The k best (score, id) of each sample, best first, ties to the smaller id; padded with
/// UINT32_MAX / -inf. Entries of sample s: [offsets[s], offsets[s + 1]) with ids[e], or when
/// offsets is null the n_columns consecutive scores with id = column. A score is
/// scores[e] + bias[id] when bias is not null. Ids must be unique within a sample. For k up
/// to 32 the scores are read once (per-thread lists, then k block-wide picks); a larger k reads
/// them k times.
void top_k(const float* scores, const uint32_t* offsets, const uint32_t* ids, uint32_t n_columns,
           uint32_t batch, uint32_t k, uint32_t* out_labels, float* out_scores, cudaStream_t stream,
           const float* bias);

}  // namespace hslide::gpu
