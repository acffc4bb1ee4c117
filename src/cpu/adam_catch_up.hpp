// Catch-up Adam (`--adam catch-up`): dense Adam's result at sparse Adam's cost.
//
// Dense Adam (SLIDE's) moves every row every step: a row no sample touched gets a zero
// gradient, and its momentum keeps moving it, m / sqrt(v) shrinking by rho = beta1 / sqrt(beta2)
// a step. Sparse (lazy) Adam skips those rows, which costs nothing but loses that motion: a
// feature seen once moves one step instead of the ~1 / (1 - beta1) steps its momentum would
// make, and on the Amazon-670K shape lazy Adam learns several times less per early epoch.
//
// With g = 0, d skipped steps t0+1 .. t0+d have a closed form per element:
//   m <- beta1^d m,   v <- beta2^d v,
//   w <- w - S(t0, d) m / (sqrt(v) + eps'),   S(t0, d) = sum_{k=1..d} a(t0 + k) rho^k,
// where a(j) = lr_j c1(j) / sqrt(c2(j)) is step j's learning rate with Adam's bias corrections
// (c1 = 1 / (1 - beta1^j), c2 = 1 / (1 - beta2^j)). S is one number per (t0, d), shared by
// every element of every row: a row catches up on any number of skipped steps in one pass, at
// the cost of one Adam update. The one approximation is epsilon. Step k divides by
// sqrt(v) + eps_k, eps_k = eps / (sqrt(c2(t0 + k)) beta2^(k/2)), so an element moves by
//   m * f(sqrt(v)),   f(x) = sum_k w_k / (x + eps_k),   w_k = a(t0 + k) rho^k,
// which the closed form replaces by S / (x + eps'). With eps' = S / E, where
//   E = f(0) = sum_k w_k / eps_k = (1 / eps) sum_k lr c1(t0 + k) beta1^k
// (a second series of the same kind), both ends are exact: elements whose sqrt(v) dwarfs eps
// (f -> S / x) and elements whose gradients were so small that eps dominates (f(0) = E). In
// between the error is a fraction of eps's share of the step (tests/test_adam_catch_up.cpp).
//
// The backend brings a row up to date when a step is about to read it (cpu_backend.hpp), so
// every forward and backward sees the weights dense Adam would have; rows nobody reads wait,
// and are brought up to date at once before predictions and exports.
//
// This file holds the schedule: S and E for any (t0, d). Terms shrink as rho^k (E's as beta1^k,
// faster), so a sum for d past `horizon` (where rho^k < 1e-12) equals its sum to the
// horizon, kept per t0; shorter gaps come from a table updated at every step.
#pragma once

#include "kernels.hpp"  // catch_up_step

#include <cstdint>
#include <vector>

namespace hslide::cpu {

class adam_catch_up {
  public:
    adam_catch_up() = default;
    /// Throws hslide::error unless beta1 < sqrt(beta2) by enough for the momentum to die out
    /// within 65,536 steps (beta1 0.9, beta2 0.999: within 270).
    adam_catch_up(double beta1, double beta2, double eps, uint64_t current_step);

    /// Forgets the history: every row is up to date at `step` (after an import or a resume).
    void restart(uint64_t step);

    /// Records step `current() + 1`, taken with learning rate `lr` (the step every row the
    /// batch touched has just been updated at).
    void record_step(double lr);

    /// The last step recorded.
    uint64_t current() const { return base_ + steps_; }

    /// How to bring a row up to date at current() from step `from` (<= current()).
    catch_up_step from(uint64_t from) const;

    /// Steps after which a skipped step's share is below 1e-12 of the first one's.
    uint32_t horizon() const { return horizon_; }

  private:
    /// sum_{k=1..d} c(t0 + k) r^k for every gap: the steps' terms c(j), decaying by r.
    struct series {
        std::vector<double> powers;  // r^d, d <= horizon
        std::vector<double> recent;  // recent[d]: the sum over the d steps up to current()
        std::vector<double> tail;    // tail[i]: the sum over the horizon after base_ + i
        void init(double r, uint32_t horizon);
        void restart(uint32_t horizon);
        void record(double c, uint64_t steps, uint32_t horizon);
        double sum(uint64_t d, uint64_t from_base, uint32_t horizon) const;
    };
    double beta1_ = 0.9, beta2_ = 0.999, eps_ = 1e-8;
    uint32_t horizon_ = 0;
    uint64_t base_ = 0;   // the step every row was up to date at (restart)
    uint64_t steps_ = 0;  // steps recorded since
    series s_, e_;        // S, and E times eps
};

/// Applies `c` to a row of n elements (weights w, Adam moments m and v): the scalar reference
/// of kernel_table::catch_up.
void apply_catch_up(float* w, float* m, float* v, uint32_t n, const catch_up_step& c);

}  // namespace hslide::cpu
