// Catch-up Adam for the first layer on the GPU (see gpu_catch_up.cuh).
#include "gpu_catch_up.cuh"
#include "launch.cuh"

#include <algorithm>
#include <cmath>

namespace hslide::gpu {

namespace {

constexpr int block_threads = 256;
constexpr int warps_per_block = block_threads / 32;

// One warp brings a row up to date (the lanes over its float4 chunks; padding stays zero:
// its m is zero), and its bf16 copy with it.
__device__ void catch_up_row(const layer_view& layer, uint32_t row, const gap_coefficients& c,
                             uint32_t lane) {
    const size_t base = size_t(row) * layer.stride;
    for (uint32_t q = lane; q < layer.stride / 4; q += 32) {
        const size_t o = base + 4 * size_t(q);
        float4 w = *reinterpret_cast<float4*>(layer.weights + o);
        float4 m = *reinterpret_cast<float4*>(layer.adam_m + o);
        float4 v = *reinterpret_cast<float4*>(layer.adam_v + o);
        catch_up_element(w.x, m.x, v.x, c);
        catch_up_element(w.y, m.y, v.y, c);
        catch_up_element(w.z, m.z, v.z, c);
        catch_up_element(w.w, m.w, v.w, c);
        *reinterpret_cast<float4*>(layer.weights + o) = w;
        *reinterpret_cast<float4*>(layer.adam_m + o) = m;
        *reinterpret_cast<float4*>(layer.adam_v + o) = v;
        if (layer.weights16) {
            __nv_bfloat162 lo = __floats2bfloat162_rn(w.x, w.y);
            __nv_bfloat162 hi = __floats2bfloat162_rn(w.z, w.w);
            uint2 packed;
            packed.x = *reinterpret_cast<uint32_t*>(&lo);
            packed.y = *reinterpret_cast<uint32_t*>(&hi);
            *reinterpret_cast<uint2*>(layer.weights16 + o) = packed;
        }
    }
}

// One warp per id. A row may appear many times (a feature of several samples): the warp
// whose compare-and-swap moves the row's step to `now` owns its catch-up, the others see
// `now` (or lose the swap) and leave it. The swap reads the step where the atomics do, so a
// stale cached read only makes a warp lose.
__global__ void catch_up_batch_kernel(layer_view layer, const uint32_t* ids, uint32_t n,
                                      catch_up_view s, uint8_t* changed) {
    const uint32_t i = blockIdx.x * warps_per_block + threadIdx.x / 32;
    if (i >= n) return;  // uniform across the warp
    const uint32_t lane = threadIdx.x % 32, row = ids[i];
    uint32_t from = 0;
    int owned = 0;
    if (lane == 0) {
        from = __ldcg(s.row_step + row);
        owned = from != s.table.now && atomicCAS(s.row_step + row, from, s.table.now) == from;
    }
    owned = __shfl_sync(0xffffffffu, owned, 0);
    if (!owned) return;
    from = __shfl_sync(0xffffffffu, from, 0);
    catch_up_row(layer, row, catch_up_lookup(s.table, from), lane);
    if (lane == 0 && changed) changed[row] = 1;
}

// One warp per row of the layer.
__global__ void catch_up_all_kernel(layer_view layer, catch_up_view s, uint8_t* changed,
                                    uint32_t* moved) {
    const uint32_t row = blockIdx.x * warps_per_block + threadIdx.x / 32;
    if (row >= layer.rows) return;
    const uint32_t lane = threadIdx.x % 32, from = s.row_step[row];
    if (from == s.table.now) return;
    catch_up_row(layer, row, catch_up_lookup(s.table, from), lane);
    if (lane == 0) {
        s.row_step[row] = s.table.now;
        if (changed) changed[row] = 1;
        *moved = 1;
    }
}

__global__ void stamp_kernel(uint32_t* row_step, const uint32_t* rows, const uint32_t* n_rows,
                             uint32_t step) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= *n_rows) return;
    const uint32_t row = rows[i];
    if (row != UINT32_MAX) row_step[row] = step;
}

}  // namespace

input_catch_up::~input_catch_up() {
    // Errors are ignored: a destructor must not throw. The owner has waited for its stream.
    for (cudaEvent_t e : staged_)
        if (e) cudaEventDestroy(e);
}

void input_catch_up::start(double beta1, double beta2, double eps, uint32_t rows, uint64_t step,
                           cudaStream_t stream) {
    // The schedule's own check names --adam dense, which the GPU does not take.
    const double rho = beta1 / std::sqrt(beta2);
    HSLIDE_CHECK(rho < 1.0 && (rho == 0.0 || std::log(1e-12) / std::log(rho) <= 65536),
                 "--adam input-catch-up needs beta1 < sqrt(beta2), by enough for a skipped "
                 "row's momentum to die out within 65,536 steps: beta1 {} and beta2 {} do not; "
                 "use --adam input-dense",
                 beta1, beta2);
    schedule_ = cpu::adam_catch_up(beta1, beta2, eps, step);
    beta1_ = beta1;
    beta2_ = beta2;
    for (cudaEvent_t& e : staged_)
        if (!e) HSLIDE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    row_step_.resize(rows, "catch-up row steps");
    gaps_.resize(size_t(schedule_.horizon()) + 1, "catch-up schedule");
    moved_.resize(1, "catch-up flag");
    moved_host_.reserve(1, "catch-up flag");
    restart(step, stream);
}

void input_catch_up::restart(uint64_t step, cudaStream_t stream) {
    schedule_.restart(step);
    base_ = step;
    row_step_.zero(stream);
    tail_uploaded_ = 0;
    uploaded_for_ = ~uint64_t{0};
}

catch_up_view input_catch_up::upload(cudaStream_t stream) {
    const uint64_t now = schedule_.current();
    HSLIDE_ASSERT(now - base_ < (uint64_t{1} << 32));
    const uint32_t now_rel = uint32_t(now - base_), horizon = schedule_.horizon();
    if (uploaded_for_ != now) {
        // Gaps up to the horizon: their coefficients change with every step. Past it, a gap's
        // coefficients depend on its start only: one new entry a step, kept.
        const uint32_t tail_needed = tail_entries_needed(now_rel, horizon);
        HSLIDE_ASSERT(tail_needed >= tail_uploaded_);
        const uint32_t new_tail = tail_needed - tail_uploaded_;
        if (tail_needed > tail_.size()) {
            device_array<tail_coefficients> grown(
                std::max<size_t>({tail_needed, 2 * tail_.size(), size_t{4096}}),
                "catch-up schedule");
            if (tail_uploaded_ > 0)
                HSLIDE_CUDA_CHECK(cudaMemcpyAsync(
                    grown.data(), tail_.data(), size_t(tail_uploaded_) * sizeof(tail_coefficients),
                    cudaMemcpyDeviceToDevice, stream));
            // The old block is freed below: nothing queued may still read it (rare: the
            // table doubles).
            HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream));
            tail_.swap(grown);
        }
        const int slot = next_staging_;
        next_staging_ ^= 1;
        HSLIDE_CUDA_CHECK(cudaEventSynchronize(staged_[slot]));  // its last copy is done
        // The gaps, then the new tail entries (two to a gap entry's 16 bytes).
        pinned_array<gap_coefficients>& block = staging_[slot];
        block.reserve(size_t(horizon) + 1 + (size_t(new_tail) + 1) / 2, "catch-up schedule");
        const uint32_t n_gaps = fill_gap_coefficients(schedule_, base_, block.data());
        auto* tail = reinterpret_cast<tail_coefficients*>(block.data() + n_gaps + 1);
        for (uint32_t i = 0; i < new_tail; ++i)
            tail[i] = tail_coefficient(schedule_, base_, tail_uploaded_ + i);
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(gaps_.data(), block.data(),
                                          (size_t(n_gaps) + 1) * sizeof(gap_coefficients),
                                          cudaMemcpyHostToDevice, stream));
        if (new_tail > 0)
            HSLIDE_CUDA_CHECK(cudaMemcpyAsync(tail_.data() + tail_uploaded_, tail,
                                              size_t(new_tail) * sizeof(tail_coefficients),
                                              cudaMemcpyHostToDevice, stream));
        HSLIDE_CUDA_CHECK(cudaEventRecord(staged_[slot], stream));
        tail_uploaded_ = tail_needed;
        uploaded_for_ = now;
    }
    return catch_up_view{
        catch_up_table{gaps_.data(), tail_.data(), now_rel, horizon, beta1_, beta2_},
        row_step_.data()};
}

void input_catch_up::catch_up_batch(const layer_view& layer, const uint32_t* ids, uint32_t n,
                                    uint8_t* changed, cudaStream_t stream) {
    const catch_up_view view = upload(stream);
    if (n == 0 || view.table.now == 0) return;  // nothing to catch up on before the first step
    catch_up_batch_kernel<<<blocks_for(n, warps_per_block), block_threads, 0, stream>>>(
        layer, ids, n, view, changed);
    HSLIDE_CUDA_LAUNCH();
}

bool input_catch_up::catch_up_all(const layer_view& layer, uint8_t* changed, cudaStream_t stream) {
    const catch_up_view view = upload(stream);
    if (layer.rows == 0 || view.table.now == 0) return false;
    moved_.zero(stream);
    catch_up_all_kernel<<<blocks_for(layer.rows, warps_per_block), block_threads, 0, stream>>>(
        layer, view, changed, moved_.data());
    HSLIDE_CUDA_LAUNCH();
    HSLIDE_CUDA_CHECK(cudaMemcpyAsync(moved_host_.data(), moved_.data(), sizeof(uint32_t),
                                      cudaMemcpyDeviceToHost, stream));
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return moved_host_.data()[0] != 0;
}

void input_catch_up::stamp(const uint32_t* rows, const uint32_t* n_rows, uint32_t max_rows,
                           cudaStream_t stream) {
    if (max_rows == 0) return;
    const uint64_t step = schedule_.current() + 1 - base_;
    HSLIDE_ASSERT(step < (uint64_t{1} << 32));
    stamp_kernel<<<blocks_for(max_rows, block_threads), block_threads, 0, stream>>>(
        row_step_.data(), rows, n_rows, uint32_t(step));
    HSLIDE_CUDA_LAUNCH();
}

}  // namespace hslide::gpu
