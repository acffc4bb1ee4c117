// The GPU catch-up's coefficient table and lookup (src/gpu/catch_up_coefficients.hpp, the code
// the kernels of gpu_catch_up.cu run) against the CPU backend's use of the schedule: rows read
// at random over hundreds of steps, with gaps short and far past the horizon, full catch-ups
// and a restart, kept up to date the GPU's way (steps from the restart, a gap table uploaded
// per step, tail entries added one a step) end bit-identical to rows kept the CPU's way.
#include "gpu/catch_up_coefficients.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

using namespace hslide;
using namespace hslide::gpu;

namespace {

// One scalar a row is enough: every element of a row takes the same coefficients.
struct rows_state {
    std::vector<float> w, m, v;
};

// The host side of gpu_catch_up.cu's input_catch_up::upload and its kernels, on host arrays.
struct gpu_way {
    cpu::adam_catch_up schedule;
    double beta1, beta2;
    uint64_t base = 0;
    std::vector<uint32_t> row_step;
    std::vector<gap_coefficients> gaps;
    std::vector<tail_coefficients> tail;
    uint32_t tail_uploaded = 0;
    uint32_t longest_gap = 0;

    gpu_way(double b1, double b2, uint32_t rows, uint64_t step)
        : schedule(b1, b2, 1e-8, step), beta1(b1), beta2(b2), row_step(rows, 0) {
        restart(step);
    }
    void restart(uint64_t step) {
        schedule.restart(step);
        base = step;
        std::fill(row_step.begin(), row_step.end(), 0u);
        tail_uploaded = 0;
    }
    catch_up_table upload() {
        const uint32_t now = uint32_t(schedule.current() - base), horizon = schedule.horizon();
        // A fresh table each time, poisoned: an entry the upload does not write is never read.
        gaps.assign(size_t(horizon) + 1, gap_coefficients{NAN, NAN, NAN, NAN});
        const uint32_t n = fill_gap_coefficients(schedule, base, gaps.data());
        EXPECT_EQ(n, std::min(horizon, now));
        const uint32_t needed = tail_entries_needed(now, horizon);
        EXPECT_LE(needed, tail_uploaded + 1) << "one new tail entry a step";
        tail.resize(std::max<size_t>(tail.size(), needed), tail_coefficients{NAN, NAN});
        for (uint32_t i = tail_uploaded; i < needed; ++i)
            tail[i] = tail_coefficient(schedule, base, i);
        tail_uploaded = needed;
        return catch_up_table{gaps.data(), tail.data(), now, horizon, beta1, beta2};
    }
    void catch_up(rows_state& s, uint32_t r, const catch_up_table& t) {
        if (row_step[r] == t.now) return;
        longest_gap = std::max(longest_gap, t.now - row_step[r]);
        catch_up_element(s.w[r], s.m[r], s.v[r], catch_up_lookup(t, row_step[r]));
        row_step[r] = t.now;
    }
};

// Adam with gradient g, as both backends' kernels.
void adam(float& w, float& m, float& v, float g, float lr, double b1, double b2, uint64_t step) {
    const float c1 = float(1 / (1 - std::pow(b1, double(step))));
    const float c2 = float(1 / (1 - std::pow(b2, double(step))));
    m = float(b1) * m + (1 - float(b1)) * g;
    v = float(b2) * v + (1 - float(b2)) * g * g;
    w -= lr * (m * c1) / (std::sqrt(v * c2) + 1e-8f);
}

}  // namespace

TEST(GpuCatchUp, TheGpuWayOfKeepingRowsUpToDateIsTheCpusBitForBit) {
    for (const double beta1 : {0.5, 0.9, 0.0})
        for (const uint64_t start : {uint64_t{0}, uint64_t{17}}) {
            const double beta2 = 0.999;
            const uint32_t rows = 60;
            const int steps = beta1 == 0.9 ? 900 : 300;  // horizons 40, 264, 1
            std::mt19937_64 gen(7);
            std::uniform_real_distribution<double> u(0, 1);
            rows_state cpu_rows, gpu_rows;
            for (uint32_t r = 0; r < rows; ++r) cpu_rows.w.push_back(float(u(gen) - 0.5));
            cpu_rows.m.assign(rows, 0.0f);
            cpu_rows.v.assign(rows, 0.0f);
            gpu_rows = cpu_rows;
            // The CPU's way: absolute steps, cpu::adam_catch_up::from and apply_catch_up.
            cpu::adam_catch_up schedule(beta1, beta2, 1e-8, start);
            std::vector<uint64_t> cpu_step(rows, start);
            auto cpu_catch_up = [&](uint32_t r) {
                if (cpu_step[r] == schedule.current()) return;
                cpu::apply_catch_up(&cpu_rows.w[r], &cpu_rows.m[r], &cpu_rows.v[r], 1,
                                    schedule.from(cpu_step[r]));
                cpu_step[r] = schedule.current();
            };
            gpu_way gpu(beta1, beta2, rows, start);
            uint64_t step = start;
            for (int t = 0; t < steps; ++t) {
                // Rows read with probabilities from 1/2 to 1/2000: gaps of every length.
                std::vector<uint32_t> read;
                for (uint32_t r = 0; r < rows; ++r) {
                    const double p = r < 10 ? 0.5 : r < 30 ? 0.05 : r < 50 ? 0.005 : 0.0005;
                    if (u(gen) < p) read.push_back(r);
                }
                for (uint32_t r : read) cpu_catch_up(r);
                const catch_up_table table = gpu.upload();
                for (uint32_t r : read) gpu.catch_up(gpu_rows, r, table);
                // Two thirds of them trained (the others: points without labels).
                step += 1;
                const float lr = 0.001f * float(1 + t % 5);
                for (uint32_t r : read) {
                    if (r % 3 == 0) continue;
                    const float g = std::sin(float(r * 31 + t));
                    adam(cpu_rows.w[r], cpu_rows.m[r], cpu_rows.v[r], g, lr, beta1, beta2, step);
                    adam(gpu_rows.w[r], gpu_rows.m[r], gpu_rows.v[r], g, lr, beta1, beta2, step);
                    cpu_step[r] = step;
                    gpu.row_step[r] = uint32_t(gpu.schedule.current() + 1 - gpu.base);  // stamp
                }
                schedule.record_step(lr);
                gpu.schedule.record_step(lr);
                if (t == 150 || t + 1 == steps) {  // a prediction or export: every row
                    const catch_up_table all = gpu.upload();
                    for (uint32_t r = 0; r < rows; ++r) {
                        cpu_catch_up(r);
                        gpu.catch_up(gpu_rows, r, all);
                    }
                }
                if (t == 400) {  // an import with Adam state
                    schedule.restart(step);
                    std::fill(cpu_step.begin(), cpu_step.end(), step);
                    gpu.restart(step);
                }
            }
            EXPECT_GT(gpu.longest_gap, gpu.schedule.horizon() + 100) << "beta1 " << beta1;
            for (uint32_t r = 0; r < rows; ++r) {
                EXPECT_EQ(gpu_rows.w[r], cpu_rows.w[r]) << "beta1 " << beta1 << " row " << r;
                EXPECT_EQ(gpu_rows.m[r], cpu_rows.m[r]) << "beta1 " << beta1 << " row " << r;
                EXPECT_EQ(gpu_rows.v[r], cpu_rows.v[r]) << "beta1 " << beta1 << " row " << r;
            }
        }
}
