// Row-level transfers: the small optional interface through which the hybrid backend's
// row-sparse merges move only the rows that changed (a row: an input feature's layer-0
// weights, or a neuron's weights and bias; layer 0's bias vector goes with every row set).
//
// A backend that knows the rows its updates touch offers it (backend::offer_rows: the CPU and
// GPU backends); backend::rows() is nullptr for one that does not, and whole_model_rows then
// stands in for it with whole-model export_state / import_state, so every backend can take
// part in a hybrid, just with whole-model cost. Calls are not concurrent with the backend's
// other calls.
#pragma once

#include "hslide/model.hpp"

#include <memory>

namespace hslide {

class backend;

class row_transfer {
  public:
    virtual ~row_transfer() = default;

    /// Writes into `rows` the rows of each layer this replica's training changed since the
    /// last call (or since it was created or last imported a whole state with import_state),
    /// and starts a new period; rows written by import_rows are not changes of its own. Rows
    /// may be reported that did not move (a touched row whose update was zero). Returns false
    /// when the rows are not tracked (whole_model_rows): treat every row as changed.
    virtual bool take_changed_rows(row_sets& rows) = 0;

    /// Copies the weights and biases (not Adam state) of `rows` into `out`, which must have
    /// this model's shapes already; other rows of `out` are left as they are.
    virtual void export_rows(const row_sets& rows, model_state& out) const = 0;

    /// Overwrites the weights and biases of `rows` with those of `in` (shaped like this
    /// model), keeping Adam state, hash functions and the step count. Derived copies (a bf16
    /// copy) follow at once; LSH tables may keep the imported neurons in their old buckets
    /// until the next refresh_selections (a backend's own updates leave them stale the same way).
    virtual void import_rows(const model_state& in, const row_sets& rows) = 0;

    /// The replica's parameters, writable in place, where it lives in host memory and a
    /// merge may write rows straight into it (saving import_rows' copy: the merge has the
    /// rows in cache); nullptr (the default) where rows go through import_rows. Whoever writes
    /// rows through it calls rows_written with them before the next train_batch.
    virtual model_state* writable_host_state() { return nullptr; }

    /// Makes rows written in place through writable_host_state() current, as import_rows
    /// does after its copy (derived bf16 copies; the tables re-hash them at the next rebuild).
    /// The writer has set the rows' weights and biases (layer 0's bias vector whole).
    /// The default throws: there is nothing to write into.
    virtual void rows_written(const row_sets& rows);

    /// Applies updates the optimizer deferred (--adam catch-up: the momentum steps of rows the
    /// batches skipped), so that the replica is the model dense Adam would have; the rows it
    /// moves count as changed rows. predict and the exports do it themselves; a multi-device
    /// backend calls it on each device before merging them whole. Returns whether it moved any
    /// row. The default: nothing is deferred.
    virtual bool complete_deferred_updates() { return false; }

    /// Exchanges the replica's weights and biases with `other`'s (this model's shapes, checked)
    /// without copying them: the replica then holds what import_state(other, false) would give
    /// it, and `other` the weights and biases the replica had, every row up to date as
    /// export_state gives them. Adam state, the step and the hash functions stay. Returns false
    /// where not offered (the default): the caller exports and imports instead. The trainer
    /// shows its weight average to the evaluation this way (weight_average.hpp).
    virtual bool swap_parameters(model_state& other) { return false; }
};

/// The stand-in for a backend that offers no row_transfer: no rows tracked (every row counts
/// as changed), export_rows exports the whole state and copies the rows out of it, import_rows
/// exports the whole state, patches the rows and imports it (tables rebuilt).
class whole_model_rows final : public row_transfer {
  public:
    explicit whole_model_rows(backend& device) : device_(device) {}
    bool take_changed_rows(row_sets& rows) override;
    void export_rows(const row_sets& rows, model_state& out) const override;
    void import_rows(const model_state& in, const row_sets& rows) override;

  private:
    backend& device_;
};

/// `device`'s row interface, or, where it offers none, a whole_model_rows over it made in
/// `fallback` (which must outlive the use of the result).
row_transfer& rows_of(backend& device, std::unique_ptr<row_transfer>& fallback);

}  // namespace hslide
