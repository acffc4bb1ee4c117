// Catch-up Adam's schedule (see adam_catch_up.hpp).
#include "adam_catch_up.hpp"

#include "hslide/error.hpp"

#include <algorithm>
#include <cmath>

namespace hslide::cpu {

void adam_catch_up::series::init(double r, uint32_t horizon) {
    powers.resize(size_t(horizon) + 1);
    powers[0] = 1;
    for (uint32_t d = 1; d <= horizon; ++d) powers[d] = powers[d - 1] * r;
    restart(horizon);
}

void adam_catch_up::series::restart(uint32_t horizon) {
    recent.assign(size_t(horizon) + 1, 0.0);
    tail.clear();
}

void adam_catch_up::series::record(double c, uint64_t steps, uint32_t horizon) {
    // The gap of d ending at the new step is the gap of d - 1 ending at the last one, plus the
    // new step's term (r^d: it is the d-th step of the gap).
    const uint32_t valid = uint32_t(std::min<uint64_t>(steps, horizon));
    for (uint32_t d = valid; d >= 1; --d) recent[d] = recent[d - 1] + c * powers[d];
    if (steps >= horizon) tail.push_back(recent[horizon]);
}

double adam_catch_up::series::sum(uint64_t d, uint64_t from_base, uint32_t horizon) const {
    return d <= horizon ? recent[d] : tail[from_base];
}

adam_catch_up::adam_catch_up(double beta1, double beta2, double eps, uint64_t current_step)
    : beta1_(beta1), beta2_(beta2), eps_(eps) {
    const double rho = beta1 / std::sqrt(beta2);
    HSLIDE_CHECK(rho < 1.0,
                 "--adam catch-up needs beta1 < sqrt(beta2) (momentum that dies out): beta1 {} "
                 "and beta2 {} do not; use --adam dense",
                 beta1, beta2);
    // Without momentum (beta1 = 0) a skipped step moves nothing: one term, always 0.
    const double steps = rho > 0 ? std::ceil(std::log(1e-12) / std::log(rho)) : 1.0;
    HSLIDE_CHECK(steps <= 65536,
                 "--adam catch-up: with beta1 {} and beta2 {} the momentum of a skipped row "
                 "lasts over 65,536 steps; use --adam dense",
                 beta1, beta2);
    horizon_ = std::max<uint32_t>(1, uint32_t(steps));
    s_.init(rho, horizon_);
    e_.init(beta1, horizon_);
    restart(current_step);
}

void adam_catch_up::restart(uint64_t step) {
    base_ = step;
    steps_ = 0;
    s_.restart(horizon_);
    e_.restart(horizon_);
}

void adam_catch_up::record_step(double lr) {
    const double j = double(current() + 1);
    const double c1 = 1.0 / (1.0 - std::pow(beta1_, j));
    const double c2 = 1.0 / (1.0 - std::pow(beta2_, j));
    ++steps_;
    s_.record(lr * c1 / std::sqrt(c2), steps_, horizon_);
    e_.record(lr * c1, steps_, horizon_);
}

catch_up_step adam_catch_up::from(uint64_t from) const {
    HSLIDE_ASSERT(from >= base_ && from <= current());
    const uint64_t d = current() - from;
    catch_up_step c;
    if (d == 0) return c;
    const double s = s_.sum(d, from - base_, horizon_);
    const double e = e_.sum(d, from - base_, horizon_);  // E times eps
    c.displacement = float(s);
    c.m_decay = float(std::pow(beta1_, double(d)));
    c.v_decay = float(std::pow(beta2_, double(d)));
    c.eps = e > 0 ? float(eps_ * s / e) : 1.0f;
    return c;
}

void apply_catch_up(float* w, float* m, float* v, uint32_t n, const catch_up_step& c) {
    for (uint32_t i = 0; i < n; ++i) {
        w[i] -= c.displacement * m[i] / (std::sqrt(v[i]) + c.eps);
        m[i] *= c.m_decay;
        v[i] *= c.v_decay;
    }
}

}  // namespace hslide::cpu
