// Catch-up Adam for the GPU backend's first layer (--adam input-catch-up): the input rows a
// step touches are brought up to date on the steps they skipped, in the closed form of
// src/cpu/adam_catch_up.hpp, instead of moving every row every step (input-dense).
//
// At WikiLSHTC-325K's shape (1.6M input rows of 128) input-dense moves ~5 GB a step whatever
// the output layer does; catch-up moves the batch's rows (a few MB) and, before predictions,
// exports and merges, every row once. The schedule (S and E per gap) is the CPU's own class,
// kept on the host: each step uploads the gaps' coefficients for the current step (one
// 16-byte entry per gap length up to the horizon, ~4 KB) and the one new coefficient pair of gaps
// past the horizon (those depend on the step a row was left at, not on the gap), so the
// device applies exactly the CPU's numbers.
//
// Per input row the device keeps the step it is up to date at, counted from the schedule's
// restart. A step: catch_up_batch brings every row the batch reads to the current step before
// the forward pass reads it (rows of unlabelled points too, as the CPU does), the update then
// moves the touched rows one step and stamp marks them up to date at the new step.
#pragma once

#include "catch_up_coefficients.hpp"
#include "cpu/adam_catch_up.hpp"
#include "device_memory.hpp"
#include "gpu_layers.cuh"

#include <cstdint>

namespace hslide::gpu {

/// What the catch-up kernels read: the coefficients for catching up to step `table.now`, and
/// the step each row is up to date at.
struct catch_up_view {
    catch_up_table table;
    uint32_t* row_step;
};

/// The first layer's catch-up state: the host schedule, its device copy, the rows' steps.
class input_catch_up {
  public:
    input_catch_up() = default;
    ~input_catch_up();
    input_catch_up(const input_catch_up&) = delete;
    input_catch_up& operator=(const input_catch_up&) = delete;

    /// Every one of `rows` rows up to date at `step` (allocates the device state; throws
    /// hslide::error for betas whose momentum does not die out, as the CPU's schedule does).
    void start(double beta1, double beta2, double eps, uint32_t rows, uint64_t step,
               cudaStream_t stream);
    /// Forgets the history: every row is up to date at `step` (an import with Adam state).
    void restart(uint64_t step, cudaStream_t stream);
    /// Records step current() + 1, taken with learning rate `lr` (its update is queued).
    void record_step(double lr) { schedule_.record_step(lr); }
    uint64_t current() const { return schedule_.current(); }

    /// Brings rows ids[0..n) (repeats allowed) up to date at current(), flagging the rows it
    /// moves in `changed`.
    void catch_up_batch(const layer_view& layer, const uint32_t* ids, uint32_t n, uint8_t* changed,
                        cudaStream_t stream);
    /// Brings every row up to date at current(), flagging those it moves; waits for it and
    /// returns whether it moved any.
    bool catch_up_all(const layer_view& layer, uint8_t* changed, cudaStream_t stream);
    /// The distinct rows rows[0..*n_rows) (UINT32_MAX skipped) are up to date at
    /// current() + 1: the update of the step being queued moved them.
    void stamp(const uint32_t* rows, const uint32_t* n_rows, uint32_t max_rows,
               cudaStream_t stream);

    size_t memory_bytes() const { return row_step_.bytes() + gaps_.bytes() + tail_.bytes(); }

  private:
    /// Uploads the coefficients for current() (once per step) and returns the view.
    catch_up_view upload(cudaStream_t stream);

    cpu::adam_catch_up schedule_;
    double beta1_ = 0, beta2_ = 0;
    uint64_t base_ = 0;  // the step of the last restart: device steps count from it
    device_array<uint32_t> row_step_;
    device_array<gap_coefficients> gaps_;
    device_array<tail_coefficients> tail_;
    uint32_t tail_uploaded_ = 0;                 // tail entries on the device
    uint64_t uploaded_for_ = ~uint64_t{0};       // the step gaps_ holds the coefficients for
    pinned_array<gap_coefficients> staging_[2];  // used in turn, reused once its copy is done
    cudaEvent_t staged_[2] = {};
    int next_staging_ = 0;
    device_array<uint32_t> moved_;
    pinned_array<uint32_t> moved_host_;
};

}  // namespace hslide::gpu
