// The output layer's loss: the softmax cross-entropy over a sample's set (the default), or a
// logistic loss per output neuron (one-vs-all binary cross-entropy over the same set).
//
// The softmax with the labels' mass spread evenly (target 1 / |Y| each) learns which label a
// point "picks"; ranked by it, a label that comes in large label sets is pushed below one
// that comes alone. The logistic loss learns each label's own probability of being one of
// the point's labels, which is what P@k ranks by (Menon et al., "Multilabel reductions: what
// is my loss optimising?", NeurIPS 2019). On a real set with 4.7 labels a point (Debian's
// Depends, scripts/debian_packages_set.py) it raised test P@1 from 0.835 to 0.851 at
// --lr 0.005 (bench/peers.md, 2026-12-07 third session).
//
// Over a sparse set (the labels, the top-k, the random fill) it is the negative-sampling
// form: the set's other members are the negatives. Its output biases start at the labels'
// prior log-odds (logistic_prior_bias): from 0, every member's sigmoid starts at 0.5, the
// negatives' push swamps the labels', and on the Amazon-670K shape nothing was learnt in 5
// epochs.
#pragma once

#include "hslide/dataset.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace hslide {

struct model_state;  // model.hpp (which includes config.hpp, which includes this)

enum class output_loss {
    softmax,   ///< cross-entropy of the set's softmax against the labels (1 / |Y| each)
    logistic,  ///< a binary cross-entropy per member: 1 for a label, 0 for the others
    /// The front ends' default (--loss auto): logistic where it is the backend's default (on
    /// every rank of a sharded run: resolve_auto_training in backend_registry.hpp), else
    /// softmax.
    automatic,
};
output_loss parse_output_loss(const std::string& name);
const char* to_string(output_loss loss);
std::vector<std::string> names_of(output_loss);

/// --lr's auto (0): the rate each loss was measured best at on the real sets (bench/peers.md):
/// the softmax's 0.003; the logistic loss's 0.005 (at 0.003 it lost 0.010-0.016 P@1 on Bibtex
/// and Corel5k and took 1-2 epochs more elsewhere).
constexpr float softmax_learning_rate = 3e-3f;
constexpr float logistic_learning_rate = 5e-3f;

/// --batch-size's auto (0): the batch the rates above were measured at, 128, doubled to 256
/// under the logistic loss on at least this many training points (32 steps of 256 an epoch).
/// Measured (bench/peers.md, 2026-12-07, fourth and fifth sessions; the rate times sqrt(2)):
/// Debian's Depends (41k points) P@1 0.8506 -> 0.8521 in 5-6 epochs of 2.3 s instead of 6 of
/// 2.8; the Amazon-670K shape at --scale 0.05 (23k) 0.7471 -> 0.7462 in 13% less time;
/// Debian-recs (10k) the same P@1 over seeds 1-6 (0.5109 -> 0.5103) in 12-26% less time to
/// the kept epoch; on the small sets fewer steps an epoch lose (Bibtex 4.6k points: 0.6277 ->
/// 0.6237, Corel5k 4.3k: 0.407 -> 0.385).
constexpr uint64_t large_batch_points = 8192;
constexpr uint32_t base_batch_size = 128;

/// The batch --batch-size auto resolves to for `loss` over `training_points` points: 256 for
/// the logistic loss on large_batch_points or more, else base_batch_size.
uint32_t automatic_batch_size(output_loss loss, uint64_t training_points);

/// --lr's auto for `loss` at a batch of `batch` that --batch-size auto chose: the loss's rate
/// at base_batch_size times sqrt(batch / base_batch_size), Adam's square-root rule (Malladi et
/// al., 2022). A batch the user gives keeps the loss's rate (--lr-scaling scales it).
float automatic_learning_rate(output_loss loss, uint32_t batch);

/// The logistic loss of one sample over `n` logits, and its gradient: delta[i] =
/// sigmoid(logits[i]) - t[i], where t[i] is 1 for a label and 0 otherwise. The labels are the
/// logits at `label_ids` (`labels` of them), or the first `labels` logits where label_ids is
/// null (a sparse set, which puts them first). Returns sum_i softplus(logits[i]) - sum over
/// the labels of their logits (the sum of the members' binary cross-entropies), in double.
/// delta may alias logits.
double logistic_loss_gradient(const float* logits, uint32_t n, const uint32_t* label_ids,
                              uint32_t labels, float* delta);

/// The output biases' starting value under the logistic loss: the log-odds of the prior
/// p = (mean labels a training point carries) / rows, clamped to [1e-6, 0.5] (0 for a set
/// without labels).
float logistic_prior_bias(const dataset& train, uint64_t rows);

/// Sets a freshly created model's output biases to logistic_prior_bias(train, its output
/// layer's rows: the whole layer's where the model holds a rank's shard of them): what the
/// front ends do to a new model trained with the logistic loss.
void start_at_label_prior(model_state& model, const dataset& train);

}  // namespace hslide
