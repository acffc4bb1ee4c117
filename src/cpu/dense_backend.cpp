// The dense baseline CPU backend (see dense_backend.hpp for the shape of a step).
#include "dense_backend.hpp"

#include "top_k.hpp"

#include "hslide/backend_registry.hpp"
#include "hslide/clock.hpp"
#include "hslide/error.hpp"
#include "hslide/isa.hpp"
#include "hslide/system_info.hpp"

#include <cblas.h>
#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>

// Declared here as well as in OpenBLAS's cblas.h: a build that found another vendor's cblas.h
// still links OpenBLAS's entry points when the CMake check found them.
extern "C" {
#if HSLIDE_HAVE_OPENBLAS_THREADS
void openblas_set_num_threads(int num_threads);
#endif
#if HSLIDE_HAVE_OPENBLAS_CORENAME
char* openblas_get_corename(void);
#endif
}

namespace hslide::cpu {

namespace {

/// Floats in one block of a weight gradient (1 MiB, per thread): the dW SGEMM of a block writes
/// it and the Adam pass reads it back from cache, and no gradient as large as the layer is held
/// (another 686 MB at 670k x 256).
constexpr size_t gradient_block_floats = size_t(1) << 18;
/// The fewest samples predict scores at once (more when training sized the buffers larger).
constexpr uint32_t default_predict_chunk = 128;
}  // namespace

namespace {
/// Warns (once a process) when OpenBLAS runs its SSE-era kernels on a CPU with AVX2 or AVX-512.
/// OpenBLAS picks its kernels from the CPU model at load time; a release older than the CPU
/// (Debian 12's 0.3.21 on Sapphire/Emerald Rapids) falls back to "Prescott", whose SGEMM is
/// 2-4x slower here, and a baseline slowed that way would flatter the sparse paths.
void warn_about_blas_core() {
#if HSLIDE_HAVE_OPENBLAS_CORENAME
    static std::once_flag once;
    std::call_once(once, [] {
        const std::string core = openblas_get_corename();
        const bool old_core = core == "Prescott" || core == "Core2" || core == "Penryn" ||
                              core == "Dunnington" || core == "Nehalem" || core == "Atom";
        if (!old_core || detected_isa() < isa_level::avx2) return;
        spdlog::warn(
            "OpenBLAS does not recognise this CPU and picked its '{}' kernels (no AVX2 or "
            "AVX-512): the cpu-dense GEMMs run several times slower than they can. Set "
            "OPENBLAS_CORETYPE={} in the environment for its {} kernels",
            core, detected_isa() >= isa_level::avx512 ? "SkylakeX" : "Haswell",
            detected_isa() >= isa_level::avx512 ? "AVX-512" : "AVX2");
    });
#endif
}
}  // namespace

std::string dense_backend::blas_name() {
#if HSLIDE_HAVE_OPENBLAS_CORENAME
    // The core picked at run time (DYNAMIC_ARCH builds such as Debian's choose it from CPUID;
    // openblas_get_config names the build's baseline target instead).
    return std::string(HSLIDE_BLAS_NAME) + " " + openblas_get_corename();
#else
    return HSLIDE_BLAS_NAME;
#endif
}

dense_backend::dense_backend(model_state initial, const train_config& train, int threads,
                             const kernel_table& kernels, precision_mode precision)
    : model_(std::move(initial)),
      train_(train),
      threads_(threads > 0 ? threads : omp_get_max_threads()),
      k_(kernels) {
    HSLIDE_CHECK(precision == precision_mode::fp32,
                 "--precision {}: the cpu-dense backend computes in fp32 only (its GEMMs are "
                 "BLAS sgemm); use --precision fp32, or --backend cpu for bf16",
                 to_string(precision));
    HSLIDE_CHECK_KIND(train.adam_moments == moment_storage::fp32, error_kind::unsupported,
                      "--adam-moments {}: the cpu-dense backend keeps fp32 moments (use "
                      "--backend cpu)",
                      to_string(train.adam_moments));
    validate(model_.config);
    const size_t n_layers = model_.layers.size();
    HSLIDE_ASSERT(n_layers >= 2);  // validate: a hidden layer and the output layer
    ld_.resize(n_layers);
    for (size_t l = 0; l < n_layers; ++l) ld_[l] = padded_stride(model_.neurons(l));
    act_.resize(n_layers);
    delta_.resize(n_layers);
    size_t max_stride = 0;
    for (size_t l = 1; l < n_layers; ++l)
        max_stride = std::max<size_t>(max_stride, model_.layers[l].stride);
    grad_blocks_.resize(size_t(threads_));
    for (aligned_floats& g : grad_blocks_) g.resize(std::max(gradient_block_floats, max_stride));
    thread_grad_.assign(size_t(threads_), std::vector<float>(model_.layers[0].stride));
    row_touched_.assign(model_.layers[0].rows, 0);
    set_blas_threads();
    warn_about_blas_core();
}

void dense_backend::set_blas_threads() const {
    // OpenBLAS's thread count is process-wide: set it before every call that runs GEMMs, so a
    // second backend with another --threads (a test, a benchmark) cannot leave it wrong.
#if HSLIDE_HAVE_OPENBLAS_THREADS
    openblas_set_num_threads(threads_);
#endif
}

void dense_backend::ensure_capacity(uint32_t samples) {
    if (samples <= capacity_) return;
    const size_t n_layers = model_.layers.size();
    for (size_t l = 0; l < n_layers; ++l) {
        act_[l].resize(size_t(samples) * ld_[l]);
        if (l + 1 < n_layers) delta_[l].resize(size_t(samples) * ld_[l]);
    }
    loss_.assign(samples, 0.0);
    trained_.assign(samples, 0);
    capacity_ = samples;
}

void dense_backend::check_points(const dataset& data, const uint32_t* rows, uint32_t n,
                                 bool labels) const {
    const uint32_t inputs = model_.layers[0].rows, outputs = model_.config.output_dim();
    for (uint32_t s = 0; s < n; ++s) {
        const feature_row x = data.features(rows[s]);
        for (uint32_t i = 0; i < x.count; ++i)
            HSLIDE_CHECK(x.ids[i] < inputs,
                         "{}: point {} has feature {} but the model has {} inputs", data.source,
                         rows[s], x.ids[i], inputs);
        if (!labels) continue;
        const label_row y = data.labels(rows[s]);
        for (uint32_t i = 0; i < y.count; ++i)
            HSLIDE_CHECK(y.ids[i] < outputs,
                         "{}: point {} has label {} but the model has {} labels", data.source,
                         rows[s], y.ids[i], outputs);
    }
}

void dense_backend::forward(const dataset& data, const uint32_t* rows, uint32_t n, bool training) {
    const size_t n_layers = model_.layers.size();
    // Layer 0: CSR x dense, parallel over samples. Each output row is the bias plus the
    // weighted sum of the sample's feature rows of W0 (feature-major, so rows are contiguous).
    {
        const layer_state& layer = model_.layers[0];
        float* out = act(0);
        const size_t ldo = ld(0);
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads_)
        for (int64_t s = 0; s < int64_t(n); ++s) {
            float* a = out + size_t(s) * ldo;
            std::copy(layer.bias.begin(), layer.bias.end(), a);
            const feature_row x = data.features(rows[s]);
            k_.weighted_row_sum(layer.weights.data(), layer.stride, layer.width, x.ids, x.values,
                                x.count, a);
            for (uint32_t j = 0; j < layer.width; ++j) a[j] = a[j] > 0.0f ? a[j] : 0.0f;
        }
    }
    // Later layers: Z = A_{l-1} W^T (W is neurons x width, rows `stride` floats apart).
    for (size_t l = 1; l < n_layers; ++l) {
        const layer_state& layer = model_.layers[l];
        const bool output = l + 1 == n_layers;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(layer.rows),
                    int(layer.width), 1.0f, act(l - 1), int(ld(l - 1)), layer.weights.data(),
                    int(layer.stride), 0.0f, act(l), int(ld(l)));
        if (output) break;  // the output's bias is added with the softmax, in one pass
        float* z = act(l);
        const size_t ldz = ld(l);
#pragma omp parallel for schedule(static) num_threads(threads_)
        for (int64_t s = 0; s < int64_t(n); ++s) {
            float* a = z + size_t(s) * ldz;
            for (uint32_t j = 0; j < layer.rows; ++j) {
                const float v = a[j] + layer.bias[j];
                a[j] = v > 0.0f ? v : 0.0f;
            }
        }
    }

    // The output layer: bias, then (training) softmax over every neuron against 1/|y| on each
    // label, as cpu_backend computes it; the probabilities overwrite the logits in place and
    // become the deltas p - y.
    const size_t out_layer = n_layers - 1;
    const layer_state& last = model_.layers[out_layer];
    const uint32_t n_out = model_.neurons(out_layer);
    float* z = act(out_layer);
    const size_t ldz = ld(out_layer);
#pragma omp parallel num_threads(threads_)
    {
        std::vector<float> label_logits;
#pragma omp for schedule(dynamic, 1)
        for (int64_t s = 0; s < int64_t(n); ++s) {
            float* a = z + size_t(s) * ldz;
            for (uint32_t j = 0; j < n_out; ++j) a[j] += last.bias[j];
            if (!training) continue;
            const label_row y = data.labels(rows[s]);
            trained_[s] = y.count > 0;
            loss_[s] = 0;
            if (y.count == 0) {
                // Not trained on, but counted in the batch mean (cpu_backend does the same).
                std::fill(a, a + n_out, 0.0f);
                continue;
            }
            if (train_.loss == hslide::output_loss::logistic) {
                loss_[s] = logistic_loss_gradient(a, n_out, y.ids, y.count, a);
                continue;
            }
            label_logits.resize(y.count);
            for (uint32_t i = 0; i < y.count; ++i) label_logits[i] = a[y.ids[i]];
            // softmax reads each logit before it writes that probability, so in place is safe.
            const double log_sum = k_.softmax(a, a, n_out);
            const float target = 1.0f / float(y.count);
            for (uint32_t i = 0; i < y.count; ++i) {
                loss_[s] -= target * (label_logits[i] - log_sum);
                a[y.ids[i]] -= target;
            }
        }
    }
}

void dense_backend::backward(uint32_t n) {
    // dA_{l-1} = delta_l W_l (n x width), then the ReLU mask of layer l-1. Points without
    // labels have zero deltas, so they add nothing.
    for (size_t l = model_.layers.size() - 1; l >= 1; --l) {
        const layer_state& layer = model_.layers[l];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(layer.width),
                    int(layer.rows), 1.0f, delta(l), int(ld(l)), layer.weights.data(),
                    int(layer.stride), 0.0f, delta(l - 1), int(ld(l - 1)));
        float* d = delta(l - 1);
        const float* a = act(l - 1);
        const size_t ldp = ld(l - 1);
#pragma omp parallel for schedule(static) num_threads(threads_)
        for (int64_t s = 0; s < int64_t(n); ++s)
            for (uint32_t i = 0; i < layer.width; ++i)
                if (!(a[size_t(s) * ldp + i] > 0.0f)) d[size_t(s) * ldp + i] = 0.0f;
    }
}

void dense_backend::apply_gemm_layer(size_t l, uint32_t n, float inv_batch, const adam_step* step,
                                     model_state* gradient_out) {
    layer_state& layer = model_.layers[l];
    const float* d = delta(l);
    const size_t ldd = ld(l);
    // Bias: the batch-mean delta, summed in sample order (as cpu_backend sums a row's entries).
    bias_grad_.assign(layer.rows, 0.0f);
    {
        float* bg = bias_grad_.data();
        const int64_t rows = int64_t(layer.rows);
#pragma omp parallel for schedule(static) num_threads(threads_)
        for (int64_t j0 = 0; j0 < rows; j0 += 4096) {
            const int64_t j1 = std::min(rows, j0 + 4096);
            for (uint32_t s = 0; s < n; ++s)
                for (int64_t j = j0; j < j1; ++j) bg[j] += d[size_t(s) * ldd + size_t(j)];
            for (int64_t j = j0; j < j1; ++j) bg[j] *= inv_batch;
        }
    }
    if (step)
        k_.adam(layer.bias.data(), layer.bias_m.data(), layer.bias_v.data(), bias_grad_.data(),
                layer.rows, *step);
    else
        std::copy(bias_grad_.begin(), bias_grad_.end(), gradient_out->layers[l].bias.begin());

    // Weights, a block of rows at a time: dW[r0:r0+nb) = delta[:, r0:r0+nb)^T A_{l-1} / B,
    // then Adam on the block while it is still in cache. Each OpenMP thread takes whole blocks
    // and calls a single-threaded SGEMM: handing every block to OpenBLAS's own threads and
    // then to OpenMP's for Adam made the two pools alternate hundreds of times a step, and on
    // 2 shared cores each hand-over waited for the scheduler (13 s a step instead of 1.5).
    // At least 16 blocks a layer (so threads share small layers too), of whole multiples of 16
    // rows, at most one gradient block. The blocking depends on the layer alone, not on the
    // thread count, so every thread count computes the same bits.
    const uint32_t wanted = ((layer.rows + 15) / 16 + 15) / 16 * 16;
    const uint32_t block = std::max<uint32_t>(
        1, std::min<uint32_t>(uint32_t(gradient_block_floats / layer.stride), wanted));
    const int64_t n_blocks = (int64_t(layer.rows) + block - 1) / block;
    const float* a = act(l - 1);
    const int lda = int(ld(l - 1));
#if HSLIDE_HAVE_OPENBLAS_THREADS
    openblas_set_num_threads(1);
#endif
#pragma omp parallel num_threads(threads_)
    {
        float* scratch = grad_blocks_[omp_get_thread_num()].data();
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < n_blocks; ++b) {
            const uint32_t r0 = uint32_t(b) * block;
            const uint32_t nb = std::min(block, layer.rows - r0);
            float* g = step ? scratch : gradient_out->layers[l].row(r0);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(nb), int(layer.width), int(n),
                        inv_batch, d + r0, int(ldd), a, lda, 0.0f, g, int(layer.stride));
            if (!step) continue;
            for (uint32_t i = 0; i < nb; ++i) {
                const size_t off = size_t(r0 + i) * layer.stride;
                k_.adam(layer.weights.data() + off, layer.adam_m.data() + off,
                        layer.adam_v.data() + off, g + size_t(i) * layer.stride, layer.width,
                        *step);
            }
        }
    }
    set_blas_threads();
}

void dense_backend::apply_input_layer(const batch_view& batch, float inv_batch,
                                      const adam_step* step, model_state* gradient_out) {
    layer_state& layer = model_.layers[0];
    const dataset& data = *batch.data;
    const float* d = delta(0);
    const size_t ldd = ld(0);
    // Group the (row, sample) pairs of the labelled points by row, samples in order within a
    // row, so each row's gradient is summed in the order cpu_backend sums it.
    entries_.clear();
    for (uint32_t s = 0; s < batch.size; ++s) {
        if (!trained_[s]) continue;
        const feature_row x = data.features(batch.rows[s]);
        for (uint32_t k = 0; k < x.count; ++k) entries_.push_back({x.ids[k], s, k});
    }
    std::sort(entries_.begin(), entries_.end(), [](const input_entry& a, const input_entry& b) {
        return a.row != b.row ? a.row < b.row : a.sample < b.sample;
    });
    row_offsets_.clear();
    for (size_t e = 0; e < entries_.size(); ++e)
        if (e == 0 || entries_[e].row != entries_[e - 1].row) row_offsets_.push_back(uint32_t(e));
    row_offsets_.push_back(uint32_t(entries_.size()));
    const int64_t touched = int64_t(row_offsets_.size()) - 1;

#pragma omp parallel num_threads(threads_)
    {
        float* grad = thread_grad_[omp_get_thread_num()].data();
#pragma omp for schedule(dynamic, 16)
        for (int64_t t = 0; t < touched; ++t) {
            const uint32_t row = entries_[row_offsets_[t]].row;
            std::fill(grad, grad + layer.stride, 0.0f);
            for (uint32_t e = row_offsets_[t]; e < row_offsets_[t + 1]; ++e) {
                const input_entry& en = entries_[e];
                const float xf = data.features(batch.rows[en.sample]).values[en.index];
                k_.axpy(xf, d + size_t(en.sample) * ldd, grad, layer.width);
            }
            for (uint32_t i = 0; i < layer.width; ++i) grad[i] *= inv_batch;
            if (step) {
                const size_t off = size_t(row) * layer.stride;
                k_.adam(layer.weights.data() + off, layer.adam_m.data() + off,
                        layer.adam_v.data() + off, grad, layer.width, *step);
            } else {
                std::memcpy(gradient_out->layers[0].row(row), grad, layer.width * sizeof(float));
            }
        }
    }
    // The catch-up modes' result is dense Adam's on this layer: here, where cost is not the
    // point, run them as such.
    if (step && adam_momentum_reaches_untouched_rows(train_.adam, 0)) {
        // SLIDE's behaviour, as cpu_backend: untouched rows move with their momentum.
        for (int64_t t = 0; t < touched; ++t) row_touched_[entries_[row_offsets_[t]].row] = 1;
        const std::vector<float> zero(layer.stride, 0.0f);
#pragma omp parallel for schedule(static) num_threads(threads_)
        for (int64_t r = 0; r < int64_t(layer.rows); ++r) {
            if (row_touched_[r]) continue;
            const size_t off = size_t(r) * layer.stride;
            k_.adam(layer.weights.data() + off, layer.adam_m.data() + off,
                    layer.adam_v.data() + off, zero.data(), layer.width, *step);
        }
        for (int64_t t = 0; t < touched; ++t) row_touched_[entries_[row_offsets_[t]].row] = 0;
    }

    // Layer 0's bias is one dense vector: the mean of the layer-0 deltas, in sample order.
    bias_grad_.assign(layer.width, 0.0f);
    for (uint32_t s = 0; s < batch.size; ++s)
        if (trained_[s]) k_.axpy(inv_batch, d + size_t(s) * ldd, bias_grad_.data(), layer.width);
    if (step)
        k_.adam(layer.bias.data(), layer.bias_m.data(), layer.bias_v.data(), bias_grad_.data(),
                layer.width, *step);
    else
        std::copy(bias_grad_.begin(), bias_grad_.end(), gradient_out->layers[0].bias.begin());
}

void dense_backend::apply_gradients(const batch_view& batch, const adam_step* step,
                                    model_state* gradient_out) {
    const float inv_batch = 1.0f / float(batch.size);
    adam_step scaled{};
    const auto layer_step = [&](size_t l) -> const adam_step* {  // null: gradients out
        if (!step) return nullptr;
        scaled = *step;
        scaled.lr *= model_.config.layers[l].lr_scale;
        return &scaled;
    };
    apply_input_layer(batch, inv_batch, layer_step(0), gradient_out);
    for (size_t l = 1; l < model_.layers.size(); ++l)
        apply_gemm_layer(l, batch.size, inv_batch, layer_step(l), gradient_out);
}

step_report dense_backend::train_batch(const batch_view& batch, float learning_rate) {
    HSLIDE_CHECK(batch.size > 0 && batch.data, "empty batch");
    check_points(*batch.data, batch.rows, batch.size, true);
    const auto t_start = clock_type::now();
    set_blas_threads();
    ensure_capacity(batch.size);
    step_report report;

    auto t0 = clock_type::now();
    forward(*batch.data, batch.rows, batch.size, true);
    report.times.forward = seconds_since(t0);
    t0 = clock_type::now();
    backward(batch.size);
    report.times.backward = seconds_since(t0);

    t0 = clock_type::now();
    model_.adam_step += 1;
    const double t = double(model_.adam_step);
    const adam_step step{learning_rate,
                         train_.adam_beta1,
                         train_.adam_beta2,
                         train_.adam_epsilon,
                         float(1.0 / (1.0 - std::pow(double(train_.adam_beta1), t))),
                         float(1.0 / (1.0 - std::pow(double(train_.adam_beta2), t)))};
    apply_gradients(batch, &step, nullptr);
    report.times.update = seconds_since(t0);

    report.samples = batch.size;
    for (uint32_t s = 0; s < batch.size; ++s) report.loss_sum += loss_[s];
    report.active_per_layer.resize(model_.layers.size());
    for (size_t l = 0; l < model_.layers.size(); ++l)
        report.active_per_layer[l] = uint64_t(batch.size) * model_.neurons(l);
    report.seconds = seconds_since(t_start);
    return report;
}

double dense_backend::compute_gradient(const batch_view& batch, model_state& gradient) {
    HSLIDE_CHECK(batch.size > 0 && batch.data, "empty batch");
    check_points(*batch.data, batch.rows, batch.size, true);
    set_blas_threads();
    ensure_capacity(batch.size);
    forward(*batch.data, batch.rows, batch.size, true);
    backward(batch.size);
    gradient = model_state::layout(model_.config);
    for (size_t l = 0; l < model_.layers.size(); ++l) {
        gradient.layers[l].weights.resize(size_t(model_.layers[l].rows) * model_.layers[l].stride);
        gradient.layers[l].bias.assign(model_.layers[l].bias.size(), 0.0f);
    }
    apply_gradients(batch, nullptr, &gradient);
    double loss = 0;
    for (uint32_t s = 0; s < batch.size; ++s) loss += loss_[s];
    return loss / batch.size;
}

void dense_backend::predict(const batch_view& batch, uint32_t k, scoring_mode scoring,
                            uint32_t* labels, float* scores) {
    HSLIDE_CHECK(k > 0, "top-k must be positive");
    if (batch.size == 0) return;
    check_points(*batch.data, batch.rows, batch.size, false);
    set_blas_threads();
    // Chunks of the training batch size, at least 128: an output row of 670k labels is 2.7 MB,
    // so the buffers stay about what training already holds.
    const uint32_t chunk = std::max(capacity_, default_predict_chunk);
    ensure_capacity(std::min(chunk, batch.size));
    const size_t out_layer = model_.layers.size() - 1;
    const uint32_t n_out = model_.neurons(out_layer);
    for (uint32_t begin = 0; begin < batch.size; begin += chunk) {
        const uint32_t n = std::min(chunk, batch.size - begin);
        forward(*batch.data, batch.rows + begin, n, false);
        const float* z = act(out_layer);
        const size_t ldz = ld(out_layer);
#pragma omp parallel num_threads(threads_)
        {
            std::vector<scored_label> heap;
#pragma omp for schedule(dynamic, 1)
            for (int64_t s = 0; s < int64_t(n); ++s) {
                const size_t at = size_t(begin + uint32_t(s)) * k;
                select_top_k(z + size_t(s) * ldz, nullptr, n_out, k, labels + at, scores + at,
                             heap);
            }
        }
    }
}

void dense_backend::export_state(model_state& out, bool with_optimizer) const {
    out.copy_from(model_, with_optimizer);
}

void dense_backend::import_state(const model_state& in, bool with_optimizer) {
    model_.assign(in, with_optimizer);  // hash seeds too: unused here, kept for `--backend cpu`
}

backend_info dense_backend::info() const {
    backend_info bi;
    bi.kind = to_string(backend_kind::cpu_dense);
    bi.device = read_system_info().cpu_model + " (" + std::to_string(threads_) + " threads, " +
                blas_name() + ", kernels " + k_.name + ")";
    bi.precision = to_string(precision_mode::fp32);
    bi.memory_bytes = model_.memory_bytes();
    for (const aligned_floats& g : grad_blocks_) bi.memory_bytes += g.size() * sizeof(float);
    for (size_t l = 0; l < act_.size(); ++l)
        bi.memory_bytes += (act_[l].size() + delta_[l].size()) * sizeof(float);
    return bi;
}

}  // namespace hslide::cpu
