// The Backend interface: what the trainer and the hybrid scheduler may ask of a device.
//
// A backend owns one replica of the model (parameters, optimizer state, LSH tables) in its
// own memory. It trains on batches of rows of a dataset, rebuilds its tables when asked,
// predicts, and exports/imports its parameters so replicas can be merged. The CPU backend
// (src/cpu) and the CUDA backend (src/gpu) implement it; nothing above this header knows
// which one it talks to. Calls on one backend are not concurrent; different backends may be
// driven from different threads.
//
// Ten virtuals, the destructor counted (ten at most, issue #21): the core a trainer needs.
// The row-level transfers that only the hybrid's merges use are a separate, optional
// interface (hslide/row_transfer.hpp), and so are a multi-device backend's per-worker
// statistics (hslide/worker_stats.hpp). Which backends exist, what each supports (the GPU
// backend: one hidden layer, input-catch-up run as input-dense) and how to make one:
// hslide/backend_registry.hpp.
#pragma once

#include "hslide/candidate_cache.hpp"
#include "hslide/config.hpp"
#include "hslide/dataset.hpp"
#include "hslide/model.hpp"
#include "hslide/selection_quality.hpp"
#include "hslide/step_report.hpp"
#include "hslide/worker_stats.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace hslide {

class row_transfer;  // hslide/row_transfer.hpp

/// A batch: `size` row indices into `data`.
struct batch_view {
    const dataset* data = nullptr;
    const uint32_t* rows = nullptr;
    uint32_t size = 0;
};

/// What a backend is and has.
struct backend_info {
    std::string kind;                ///< its name in the registry (to_string(backend_kind))
    std::string device;              ///< e.g. CPU model with thread count, or GPU name
    std::string precision;           ///< "fp32" or "bf16"
    uint64_t memory_bytes = 0;       ///< bytes the model replica holds
    uint64_t free_memory_bytes = 0;  ///< free device memory (0 when not applicable)
    /// Of memory_bytes, the output layer's: its weights, biases and Adam state (and any bf16
    /// copy), over rows [output_first, output_first + output_rows) of the layer (a rank's
    /// shard, or all of it). 0 rows: not reported (backends that do not count it).
    uint64_t output_layer_bytes = 0;
    uint32_t output_first = 0;
    uint32_t output_rows = 0;
};

class backend {
  public:
    backend() = default;
    /// Not copied: an offered interface points into the backend that offered it.
    backend(const backend&) = delete;
    backend& operator=(const backend&) = delete;
    virtual ~backend() = default;

    /// One SGD step on the batch: sparse forward, backward, Adam update of the touched rows.
    virtual step_report train_batch(const batch_view& batch, float learning_rate) = 0;

    /// Refreshes every sparse layer's neuron selection from the weights as they are now: an
    /// LSH layer rebuilds its tables (with `new_functions`, first drawing new hash functions
    /// from the seed stream it was created with), a top-k layer searched by IVF rebuilds its
    /// index; exact top-k and dense layers have nothing to refresh. The trainer calls it on
    /// the --rebuild schedule. A backend may refresh in the background (the GPU's
    /// gpu_async_rebuild): selections use the old state until then.
    virtual void refresh_selections(bool new_functions) = 0;

    /// Top-k labels per sample: labels[s*k + i], scores[s*k + i], best first; padded with
    /// UINT32_MAX / -inf when fewer than k are scored.
    virtual void predict(const batch_view& batch, uint32_t k, scoring_mode scoring,
                         uint32_t* labels, float* scores) = 0;

    /// Copies the replica into `out` (parameters; with `with_optimizer`, Adam state too).
    virtual void export_state(model_state& out, bool with_optimizer) const = 0;

    /// Replaces the replica's parameters (and Adam state when `with_optimizer`) with `in`,
    /// then rebuilds the tables with the hash seeds in `in`.
    virtual void import_state(const model_state& in, bool with_optimizer) = 0;

    /// The replica itself when it is held in host memory as a model_state (the CPU backend),
    /// so a checkpoint can be written without a copy the size of the model; nullptr when
    /// export_state is the only way to read it.
    virtual const model_state* host_state() const { return nullptr; }

    virtual backend_info info() const = 0;

    /// Waits until every batch handed to train_batch is applied and the model is consistent,
    /// and returns the report of work finished since the last train_batch or synchronize.
    /// train_batch of an asynchronous backend (the hybrid one) may return before its batch is
    /// trained, with the report of earlier ones; synchronous backends return an empty report.
    virtual step_report synchronize() { return {}; }

    /// How well the output layer's active sets retrieve the exact top `top` logits and the
    /// labels of `batch`'s points (selection_quality.hpp), chosen as training would but without
    /// the labels forced in; the trainer asks once an epoch, on a fixed sample of training
    /// points. The default measures nothing (points == 0).
    virtual selection_quality measure_selection(const batch_view& batch, uint32_t top) {
        return {};
    }
    /// Whether the output layer's sets hold each point's exact top logits by construction (a
    /// dense layer, or a top-k found by scoring every row): there measure_selection has nothing
    /// to find, and the trainer's automatic probe (trainer_options::selection_probe_points -1)
    /// does not run. Default false.
    virtual bool selection_is_exact() const { return false; }
    /// The output layer's reused candidates (train_config::reuse_candidates_steps,
    /// candidate_cache.hpp): training state that a checkpoint carries, valid until the next
    /// step or import. Empty where the backend keeps none (the default).
    virtual const candidate_cache& candidates() const {
        static const candidate_cache none;
        return none;
    }
    /// Restores them (a resumed run's, from its checkpoint); a backend that keeps none ignores
    /// them (the default).
    virtual void import_candidates(const candidate_cache& cache) {}

    // Optional interfaces (ggml style): a backend offers one by registering it in its
    // constructor; callers ask for it rather than test which backend they hold.

    /// Row-level transfers for the hybrid's row-sparse merges (hslide/row_transfer.hpp);
    /// nullptr when not offered: rows_of() then stands in with whole-model transfers.
    row_transfer* rows() { return rows_; }
    const row_transfer* rows() const { return rows_; }

    /// Per-worker statistics since the last call (a backend made of workers, the hybrid one,
    /// offers them through hslide/worker_stats.hpp); empty for every other backend.
    std::vector<worker_stats> take_worker_stats() {
        return workers_ ? workers_->take_worker_stats() : std::vector<worker_stats>{};
    }

  protected:
    /// Offers `rows` (usually the backend itself) as this backend's row_transfer.
    void offer_rows(row_transfer* rows) { rows_ = rows; }
    /// Offers `workers` (usually the backend itself) as this backend's worker statistics.
    void offer_worker_stats(worker_stats_source* workers) { workers_ = workers; }

  private:
    row_transfer* rows_ = nullptr;
    worker_stats_source* workers_ = nullptr;
};

}  // namespace hslide
