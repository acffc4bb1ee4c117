// The coefficients the GPU's catch-up kernels read (gpu_catch_up.cuh) and the lookup and update
// they run, in host C++ (no CUDA types), so that the host tests run them against the CPU
// backend's schedule (tests/test_gpu_catch_up.cpp).
//
// A row up to date at step `from` catches up to step `now` (both counted from the schedule's
// restart) with the coefficients of the gap d = now - from. Up to the horizon they change with
// every step: the host uploads one entry per gap length each step. Past it, S and eps' are the
// sums over the horizon after `from` (cpu::adam_catch_up's tail), the same for every later
// `now`: one entry per start, uploaded once, and the decays beta^d computed where they are used.
#pragma once

#include "cpu/adam_catch_up.hpp"
#include "hslide/host_device.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace hslide::gpu {

/// A gap's coefficients, as cpu::catch_up_step: w -= s m / (sqrt(v) + eps), m *= m_decay,
/// v *= v_decay.
struct alignas(16) gap_coefficients {
    float s = 0, m_decay = 1, v_decay = 1, eps = 1;
};

/// A gap past the horizon: its S and eps', which depend on its start only.
struct alignas(8) tail_coefficients {
    float s = 0, eps = 1;
};

/// What a catch-up kernel reads to bring rows up to date at `now`.
struct catch_up_table {
    const gap_coefficients* gaps;   ///< gaps[d], d <= min(horizon, now)
    const tail_coefficients* tail;  ///< tail[from], from + horizon < now
    uint32_t now, horizon;
    double beta1, beta2;
};

/// The coefficients for a row up to date at `from` (<= now), as cpu::adam_catch_up::from.
HSLIDE_HD inline gap_coefficients catch_up_lookup(const catch_up_table& t, uint32_t from) {
    const uint32_t d = t.now - from;
    if (d <= t.horizon) return t.gaps[d];
    const tail_coefficients c = t.tail[from];
    return gap_coefficients{c.s, float(pow(t.beta1, double(d))), float(pow(t.beta2, double(d))),
                            c.eps};
}

/// cpu::apply_catch_up on one element: the same float operations in the same order.
HSLIDE_HD inline void catch_up_element(float& w, float& m, float& v, const gap_coefficients& c) {
    w -= c.s * m / (sqrtf(v) + c.eps);
    m *= c.m_decay;
    v *= c.v_decay;
}

/// Tail entries a table for step `now` needs: one per start more than `horizon` steps back.
inline uint32_t tail_entries_needed(uint32_t now, uint32_t horizon) {
    return now > horizon ? now - horizon : 0;
}

/// Fills gaps[0..n] with the coefficients of the gaps ending at schedule.current() (steps
/// counted from `base`, its last restart), n = min(horizon, steps since base); returns n.
inline uint32_t fill_gap_coefficients(const cpu::adam_catch_up& schedule, uint64_t base,
                                      gap_coefficients* gaps) {
    const uint64_t now = schedule.current();
    const uint32_t n = uint32_t(std::min<uint64_t>(schedule.horizon(), now - base));
    for (uint32_t d = 0; d <= n; ++d) {
        const cpu::catch_up_step c = schedule.from(now - d);
        gaps[d] = gap_coefficients{c.displacement, c.m_decay, c.v_decay, c.eps};
    }
    return n;
}

/// The tail entry of gaps from step base + i (defined once i + horizon < the current step).
inline tail_coefficients tail_coefficient(const cpu::adam_catch_up& schedule, uint64_t base,
                                          uint32_t i) {
    const cpu::catch_up_step c = schedule.from(base + i);  // a gap past the horizon
    return tail_coefficients{c.displacement, c.eps};
}

}  // namespace hslide::gpu
