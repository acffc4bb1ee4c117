// The backend registry: the one table of backend kinds (name, factory, capabilities), and the
// one file that includes the backends themselves (src/cpu, src/gpu).
#include "hslide/backend_registry.hpp"

#include "cpu/cpu_backend.hpp"
#include "cpu/dense_backend.hpp"
#include "cpu/exact_scoring.hpp"
#include "hslide/error.hpp"
#include "hslide/memory.hpp"
#if HSLIDE_HAVE_CUDA
#include "gpu/gpu_backend.hpp"
#endif

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

namespace hslide {

namespace {

std::unique_ptr<backend> create_cpu(const backend_options& o, model_state initial,
                                    const train_config& train) {
    return std::make_unique<cpu::cpu_backend>(std::move(initial), train, o.threads,
                                              cpu::kernels_for(o.isa ? *o.isa : active_isa()),
                                              o.precision, o.shard);
}

std::unique_ptr<backend> create_cpu_dense(const backend_options& o, model_state initial,
                                          const train_config& train) {
    return std::make_unique<cpu::dense_backend>(std::move(initial), train, o.threads,
                                                cpu::kernels_for(o.isa ? *o.isa : active_isa()),
                                                o.precision);
}

std::unique_ptr<backend> create_gpu_kind(const backend_options& o, model_state initial,
                                         const train_config& train) {
#if HSLIDE_HAVE_CUDA
    return gpu::create_gpu_backend(std::move(initial), train, o.device, o.precision,
                                   /*dense_output=*/o.kind == backend_kind::gpu_dense,
                                   o.gpu_async_rebuild, o.shard);
#else
    throw error(error_kind::unsupported,
                fmt::format("--backend={}: this build of hslide has no CUDA backend (rebuild with "
                            "nvcc available and -DHSLIDE_CUDA=ON)",
                            to_string(o.kind)));
#endif
}

constexpr std::optional<adam_mode> refused = std::nullopt;
constexpr size_t n_adam_modes = 5;
// adam_runs_as, indexed by adam_mode: sparse, dense, input_dense, catch_up, input_catch_up.
constexpr std::array<std::optional<adam_mode>, n_adam_modes> every_adam_mode{
    adam_mode::sparse, adam_mode::dense, adam_mode::input_dense, adam_mode::catch_up,
    adam_mode::input_catch_up};

backend_capabilities cpu_caps() {
    backend_capabilities c;
    c.bf16 = true;
    c.multi_probe = true;
    c.top_k_selection = true;
    c.ivf_top_k_search = true;
    c.adam_runs_as = every_adam_mode;
    c.logistic_loss = c.logistic_loss_by_default = true;
    c.hybrid_worker = true;
    return c;
}

backend_capabilities cpu_dense_caps() {
    backend_capabilities c;
    c.computes_every_neuron = true;
    // Its dense Adam is catch-up's result already; input-catch-up is input-dense there.
    c.adam_runs_as = {adam_mode::sparse, adam_mode::dense, adam_mode::input_dense, adam_mode::dense,
                      adam_mode::input_dense};
    c.logistic_loss = c.logistic_loss_by_default = true;
    return c;
}

backend_capabilities gpu_caps(bool dense) {
    backend_capabilities c;
    c.bf16 = true;
    c.max_hidden_layers = 1;    // a fixed shape: a sparse-input hidden layer, the output layer
    c.max_hidden_width = 1024;  // a hidden activation row per thread block
    c.computes_every_neuron = dense;
    c.top_k_selection = !dense;  // exact scoring in chunked GEMMs, fused k-selection
    // Dense Adam over every row is CPU-only so far; input-catch-up catches the input rows up
    // as the CPU does (src/gpu/gpu_catch_up.cuh: input-dense's pass over every input row is
    // most of a step at WikiLSHTC-325K's 1.6M features).
    c.adam_runs_as = {adam_mode::sparse, refused, adam_mode::input_dense, refused,
                      adam_mode::input_catch_up};
    c.logistic_loss = true;  // not its auto yet: logistic_loss_by_default
    c.needs_gpu = true;
    c.hybrid_worker = !dense;
    return c;
}

backend_capabilities hybrid_caps() {
    backend_capabilities c;  // its workers' union; each worker is checked on its own entry
    c.bf16 = true;
    c.multi_probe = true;
    c.top_k_selection = true;
    c.ivf_top_k_search = true;
    c.adam_runs_as = every_adam_mode;
    return c;
}

std::vector<backend_entry> make_registry() {
    std::vector<backend_entry> table = {
        {backend_kind::cpu, "cpu",
         "sparse training on the CPU: LSH or top-k active sets (OpenMP, SIMD kernels)", cpu_caps(),
         create_cpu},
        {backend_kind::cpu_dense, "cpu-dense",
         "every neuron through BLAS GEMMs on the CPU (the dense baseline)", cpu_dense_caps(),
         create_cpu_dense},
        {backend_kind::gpu, "gpu", "sparse training on one GPU (CUDA): LSH or top-k active sets",
         gpu_caps(false), create_gpu_kind},
        {backend_kind::gpu_dense, "gpu-dense", "every neuron through cuBLAS on one GPU",
         gpu_caps(true), create_gpu_kind},
        {backend_kind::hybrid, "hybrid",
         "CPU and GPU workers (--workers) training one model together", hybrid_caps(), nullptr},
    };
    for (size_t i = 0; i < table.size(); ++i) HSLIDE_ASSERT(size_t(table[i].kind) == i);
    return table;
}

std::string join(const std::vector<std::string>& names) {
    std::string out;
    for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
    return out;
}

constexpr adam_mode adam_modes[n_adam_modes] = {adam_mode::sparse, adam_mode::dense,
                                                adam_mode::input_dense, adam_mode::catch_up,
                                                adam_mode::input_catch_up};

/// What `caps` says of the Adam modes: "sparse, input-dense, input-catch-up (as input-dense)".
std::string adam_support(const backend_capabilities& caps) {
    std::vector<std::string> modes;
    for (adam_mode m : adam_modes) {
        const std::optional<adam_mode> runs = caps.adam_runs_as[size_t(m)];
        if (!runs) continue;
        modes.push_back(*runs == m ? std::string(to_string(m))
                                   : fmt::format("{} (as {})", to_string(m), to_string(*runs)));
    }
    return join(modes);
}

}  // namespace

const std::vector<backend_entry>& backend_registry() {
    static const std::vector<backend_entry> table = make_registry();
    return table;
}

const backend_entry& backend_entry_of(backend_kind kind) {
    const std::vector<backend_entry>& table = backend_registry();
    HSLIDE_ASSERT(size_t(kind) < table.size());
    return table[size_t(kind)];
}

const char* to_string(backend_kind kind) {
    return backend_entry_of(kind).name;
}

backend_kind parse_backend_kind(const std::string& name) {
    for (const backend_entry& e : backend_registry())
        if (name == e.name) return e.kind;
    throw error(error_kind::invalid_argument,
                fmt::format("unknown backend '{}' (valid: {})", name,
                            join(backend_names([](const backend_entry&) { return true; }))));
}

std::string describe_backends() {
    std::string out;
    for (const backend_entry& e : backend_registry()) {
        const backend_capabilities& c = e.caps;
        out += fmt::format("  {:<10} {}\n", e.name, e.description);
        auto line = [&](const std::string& text) { out += fmt::format("  {:<10} {}\n", "", text); };
        if (e.kind == backend_kind::hybrid) {
            line("supports what each of its workers does; workers: " +
                 join(backend_names([](const backend_entry& w) { return w.caps.hybrid_worker; })));
            continue;
        }
        line(fmt::format(
            "precision: {}; hidden layers: {}; selection: {}; scoring: {}",
            c.bf16 ? "fp32, bf16" : "fp32",
            c.max_hidden_layers == 0
                ? std::string("any number")
                : fmt::format("{}", c.max_hidden_layers) +
                      (c.max_hidden_width ? fmt::format(" (at most {} neurons)", c.max_hidden_width)
                                          : std::string()),
            c.computes_every_neuron ? "every neuron"
            : c.ivf_top_k_search    ? "LSH, top-k (exact or IVF)"
            : c.top_k_selection     ? "LSH, top-k (exact)"
                                    : "LSH",
            c.computes_every_neuron ? std::string("exact")
                                    : std::string(c.multi_probe ? "exact, LSH (with --probes)"
                                                                : "exact, LSH (without --probes)") +
                                          (c.ivf_top_k_search ? ", IVF" : "")));
        std::string last = "--adam: " + adam_support(c);
        if (c.needs_gpu) last += "; needs a GPU";
        if (c.hybrid_worker) last += "; hybrid worker";
        line(last);
    }
    return out;
}

adam_mode adam_mode_run_by(backend_kind kind, adam_mode mode) {
    const backend_entry& e = backend_entry_of(kind);
    const std::optional<adam_mode> runs = e.caps.adam_runs_as[size_t(mode)];
    HSLIDE_CHECK_KIND(runs.has_value(), error_kind::unsupported,
                      "--backend {} does not take --adam {} (it takes {})", e.name, to_string(mode),
                      adam_support(e.caps));
    return *runs;
}

void check_supported(backend_kind kind, const model_config& model, const train_config& train,
                     precision_mode precision, scoring_mode scoring) {
    if (kind == backend_kind::hybrid) return;
    const backend_entry& e = backend_entry_of(kind);
    const backend_capabilities& c = e.caps;
    auto names_where = [](auto keep) { return join(backend_names(keep)); };
    // A usage error (exit code 2), as the backend itself reports it.
    HSLIDE_CHECK(precision != precision_mode::bf16 || c.bf16,
                 "--precision bf16: --backend {} computes in fp32 only; use --precision fp32, or "
                 "--backend {} for bf16",
                 e.name, names_where([](const backend_entry& x) {
                     return x.caps.bf16 && x.kind != backend_kind::hybrid;
                 }));
    const size_t hidden = model.layers.empty() ? 0 : model.layers.size() - 1;
    HSLIDE_CHECK_KIND(
        c.max_hidden_layers == 0 || hidden <= c.max_hidden_layers, error_kind::unsupported,
        "--backend {} trains networks with {} hidden layer{}; this one has {} (use "
        "--backend {} for deeper networks)",
        e.name, c.max_hidden_layers == 1 ? "one" : std::to_string(c.max_hidden_layers),
        c.max_hidden_layers == 1 ? "" : "s", hidden, names_where([](const backend_entry& x) {
            return x.caps.max_hidden_layers == 0 && x.kind != backend_kind::hybrid;
        }));
    for (size_t l = 0; l < hidden && c.max_hidden_width; ++l)
        HSLIDE_CHECK_KIND(model.layers[l].size <= c.max_hidden_width, error_kind::unsupported,
                          "--backend {} supports hidden layers of at most {} neurons; layer {} "
                          "has {}",
                          e.name, c.max_hidden_width, l, model.layers[l].size);
    for (size_t l = 0; l < model.layers.size(); ++l)
        HSLIDE_CHECK_KIND(c.computes_every_neuron || c.top_k_selection ||
                              model.selection(l) != neuron_selection::top_k,
                          error_kind::unsupported,
                          "--backend {} does not select neurons by top-k (layer {}); use "
                          "--backend {}, or lsh or dense selection with it",
                          e.name, l, names_where([](const backend_entry& x) {
                              return x.caps.top_k_selection && x.kind != backend_kind::hybrid;
                          }));
    for (size_t l = 0; l < model.layers.size(); ++l)
        HSLIDE_CHECK_KIND(c.computes_every_neuron || c.ivf_top_k_search ||
                              model.selection(l) != neuron_selection::top_k ||
                              model.layers[l].search != top_k_search::ivf,
                          error_kind::unsupported,
                          "--backend {} does not find top-k sets with --top-k-search ivf (layer "
                          "{}); use --top-k-search exact with it, or --backend {}",
                          e.name, l, names_where([](const backend_entry& x) {
                              return x.caps.ivf_top_k_search && x.kind != backend_kind::hybrid;
                          }));
    adam_mode_run_by(kind, train.adam);
    HSLIDE_CHECK_KIND(
        train.loss == output_loss::softmax || c.logistic_loss, error_kind::unsupported,
        "--backend {} trains with --loss softmax only; use --backend {} for --loss {}", e.name,
        names_where([](const backend_entry& x) {
            return x.caps.logistic_loss && x.kind != backend_kind::hybrid;
        }),
        to_string(train.loss));
    const bool probes = std::any_of(model.layers.begin(), model.layers.end(),
                                    [](const layer_config& l) { return l.active.probes > 0; });
    // auto scores an LSH layer with LSH, as lsh does.
    const bool lsh_scoring = scoring == scoring_mode::lsh || scoring == scoring_mode::automatic;
    HSLIDE_CHECK_KIND(!(probes && lsh_scoring && !c.computes_every_neuron && !c.multi_probe),
                      error_kind::unsupported,
                      "--backend {} does not support multi-probe LSH scoring (--probes), which "
                      "runs on {}; use --probes 0 or --scoring exact with it",
                      e.name, names_where([](const backend_entry& x) {
                          return x.caps.multi_probe && x.kind != backend_kind::hybrid;
                      }));
    if (scoring != scoring_mode::ivf || model.layers.empty()) return;
    const size_t out = model.layers.size() - 1;
    HSLIDE_CHECK_KIND(model.selection(out) == neuron_selection::top_k, error_kind::unsupported,
                      "--scoring ivf searches a top-k output layer's IVF index; this output "
                      "layer selects {} (use --scoring exact{})",
                      model.selection(out) == neuron_selection::lsh ? "by LSH" : "every neuron",
                      model.selection(out) == neuron_selection::lsh ? " or lsh" : "");
    HSLIDE_CHECK_KIND(c.ivf_top_k_search, error_kind::unsupported,
                      "--backend {} has no IVF search (--scoring ivf runs on {}); use --scoring "
                      "exact or auto with it",
                      e.name, names_where([](const backend_entry& x) {
                          return x.caps.ivf_top_k_search && x.kind != backend_kind::hybrid;
                      }));
}

void resolve_auto_training(train_config& train, backend_kind kind, bool sharded,
                           uint64_t training_points) {
    if (train.loss == output_loss::automatic)
        train.loss = backend_entry_of(kind).caps.logistic_loss_by_default ? output_loss::logistic
                                                                          : output_loss::softmax;
    const bool automatic_batch = train.batch_size == 0;
    if (automatic_batch) train.batch_size = automatic_batch_size(train.loss, training_points);
    if (train.reuse_candidates_epochs < 0) {
        train.reuse_candidates_epochs =
            kind == backend_kind::cpu && !sharded ? reuse_candidates_auto_epochs : 0;
        train.reuse_candidates_min_rows = reuse_candidates_auto_min_rows;
    }
    train.reuse_candidates_steps =
        train.reuse_candidates_epochs > 0 && std::isfinite(train.reuse_candidates_epochs) &&
                training_points > 0
            ? std::max<uint64_t>(
                  1, uint64_t(std::ceil(train.reuse_candidates_epochs * double(training_points) /
                                        double(train.batch_size))))
            : 0;
    if (train.learning_rate == 0)
        train.learning_rate = automatic_learning_rate(
            train.loss, automatic_batch ? train.batch_size : base_batch_size);
}

void validate_before_data(const train_config& train, backend_kind kind, bool sharded) {
    train_config resolved = train;
    resolve_auto_training(resolved, kind, sharded, 0);
    validate(resolved);
}

std::unique_ptr<backend> create_backend(const backend_options& options, model_state initial,
                                        const train_config& train) {
    const backend_entry& e = backend_entry_of(options.kind);
    HSLIDE_CHECK(e.create != nullptr,
                 "a {} backend is made of workers: create it with create_hybrid_backend", e.name);
    // A backend without the IVF search would run it as exact, silently: refused here too, for
    // callers that create a backend without check_supported (the hybrid's workers, tests).
    const model_config& mc = initial.config;
    const size_t out = mc.layers.size() - 1;
    HSLIDE_CHECK_KIND(e.caps.computes_every_neuron || e.caps.ivf_top_k_search ||
                          mc.layers.empty() || mc.selection(out) != neuron_selection::top_k ||
                          mc.layers[out].search != top_k_search::ivf,
                      error_kind::unsupported,
                      "--backend {} does not find top-k sets with --top-k-search ivf; use "
                      "--top-k-search exact with it",
                      e.name);
    HSLIDE_CHECK_KIND(!options.shard.sharded() || options.kind == backend_kind::cpu ||
                          options.kind == backend_kind::gpu,
                      error_kind::unsupported,
                      "--backend {}: only --backend cpu and --backend gpu run with their output "
                      "layer sharded across MPI ranks ({} ranks); run one process, or one of them",
                      e.name, options.shard.sharded() ? options.shard.comm->size() : 1);
    const std::string what = fmt::format("creating the {} backend (its buffers and tables for {})",
                                         e.name, describe_model_allocation(initial, true));
    try {
        return e.create(options, std::move(initial), train);
    } catch (const std::bad_alloc&) {
        throw_host_out_of_memory(what, 0);
    }
}

double measure_scoring_rate(const backend_options& options, uint32_t width) {
#if HSLIDE_HAVE_CUDA
    if (options.kind == backend_kind::gpu)
        return gpu::measure_gpu_scoring_rate(options.device, width,
                                             options.precision == precision_mode::bf16);
#endif
    HSLIDE_CHECK_KIND(options.kind == backend_kind::cpu, error_kind::unsupported,
                      "--shard-weights auto measures the scoring rate of --backend cpu and gpu "
                      "ranks; give --backend {} ranks their shares (--shard-weights 3,1)",
                      to_string(options.kind));
    const int threads = options.threads > 0 ? options.threads : omp_get_max_threads();
    return cpu::exact_scoring::measure_rate(
        cpu::kernels_for(options.isa ? *options.isa : active_isa()), threads, width);
}

}  // namespace hslide
