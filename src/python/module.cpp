// hslide._core: the library for Python (pybind11). hslide/__init__.py turns scipy matrices
// into datasets and back; this file wraps the library itself: datasets, the model options
// with the CLI's names and defaults, training through the shared trainer (GIL released),
// prediction, evaluation, checkpoints, and hslide::error as Python exceptions.
#include "hslide/backend.hpp"
#include "hslide/backend_registry.hpp"
#include "hslide/checkpoint.hpp"
#include "hslide/config.hpp"
#include "hslide/dataset.hpp"
#include "hslide/error.hpp"
#include "hslide/input_check.hpp"
#include "hslide/isa.hpp"
#include "hslide/memory.hpp"
#include "hslide/metrics.hpp"
#include "hslide/model.hpp"
#include "hslide/model_options.hpp"
#include "hslide/progress.hpp"
#include "hslide/synthetic.hpp"
#include "hslide/trainer.hpp"
#include "hslide/validation.hpp"

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <omp.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;

namespace hslide::python {

namespace {

template <class T>
using array_in = py::array_t<T, py::array::c_style | py::array::forcecast>;

/// A dataset from CSR arrays, checked by the readers' rules (hslide/input_check.hpp): the
/// offsets before any entry is read, then every id and value.
dataset make_dataset(array_in<int64_t> indptr, array_in<uint32_t> indices, array_in<float> values,
                     uint64_t n_features, array_in<int64_t> label_indptr,
                     array_in<uint32_t> label_ids, uint64_t n_labels, const std::string& source) {
    const size_t n = indptr.size() > 0 ? size_t(indptr.size() - 1) : 0;
    HSLIDE_CHECK(indptr.size() > 0 && label_indptr.size() == indptr.size(),
                 "X has {} rows but Y has {}", n,
                 label_indptr.size() > 0 ? label_indptr.size() - 1 : 0);
    HSLIDE_CHECK(indices.size() == values.size(), "X's indices and data differ in length");
    for (const std::string& why :
         {csr_offsets_problem(indptr.data(), n, uint64_t(indices.size()), source),
          csr_offsets_problem(label_indptr.data(), n, uint64_t(label_ids.size()),
                              "the labels of " + source)})
        if (!why.empty()) throw input_error(source, 0, why);
    dataset d;
    d.source = source;
    d.n_features = n_features;
    d.n_labels = n_labels;
    d.feature_offsets.assign(indptr.data(), indptr.data() + n + 1);
    d.label_offsets.assign(label_indptr.data(), label_indptr.data() + n + 1);
    d.feature_ids.assign(indices.data(), indices.data() + indices.size());
    d.feature_values.assign(values.data(), values.data() + values.size());
    d.label_ids.assign(label_ids.data(), label_ids.data() + label_ids.size());
    check_dataset(d, source);
    return d;
}

/// (indptr, indices, data, label_indptr, label_ids) of a dataset, as numpy arrays (copies).
py::tuple dataset_arrays(const dataset& d) {
    auto copy = [](const auto& v) {
        using T = typename std::decay_t<decltype(v)>::value_type;
        py::array_t<T> a(py::ssize_t(v.size()));
        std::copy(v.begin(), v.end(), a.mutable_data());
        return a;
    };
    return py::make_tuple(copy(d.feature_offsets), copy(d.feature_ids), copy(d.feature_values),
                          copy(d.label_offsets), copy(d.label_ids));
}

/// Every option of hslide.Model: the CLI's long flag names with '_' for '-', its defaults
/// (the library's structs).
struct options {
    model_options model;
    train_config train;
    evaluation_options eval;
    backend_options device;
    std::string isa = "auto";
    std::optional<std::string> keep_best;
    uint32_t patience = 0;
    double valid_fraction = 0;
    uint32_t selection_probe = trainer_options{}.selection_probe_points;
    uint32_t selection_top = trainer_options{}.selection_probe_top;
    bool progress = false;
    std::string log_level = "warn";

    options() { eval.show_progress = false; }
};

template <class T>
std::vector<T> list_of(py::handle value) {
    if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value))
        return value.cast<std::vector<T>>();
    return {value.cast<T>()};
}

using setter = std::function<void(options&, py::handle)>;

const std::map<std::string, setter>& option_table() {
    static const std::map<std::string, setter> table = {
        // the network (hslide train's model flags)
        {"hidden", [](options& o, py::handle v) { o.model.hidden = list_of<uint32_t>(v); }},
        {"normalize", [](options& o, py::handle v) { o.model.normalize = v.cast<std::string>(); }},
        {"output_sparsity",
         [](options& o, py::handle v) { o.model.output_sparsity = v.cast<std::string>(); }},
        {"hidden_sparsity",
         [](options& o, py::handle v) { o.model.hidden_sparsity = v.cast<std::string>(); }},
        {"top_k", [](options& o, py::handle v) { o.model.top_k = v.cast<uint32_t>(); }},
        {"top_k_search",
         [](options& o, py::handle v) { o.model.top_k_search = v.cast<std::string>(); }},
        {"ivf_clusters",
         [](options& o, py::handle v) { o.model.ivf_clusters = v.cast<uint32_t>(); }},
        {"ivf_probes", [](options& o, py::handle v) { o.model.ivf_probes = v.cast<uint32_t>(); }},
        {"ivf_refresh",
         [](options& o, py::handle v) { o.model.ivf_refresh = v.cast<uint32_t>(); }},
        {"fill_correction",
         [](options& o, py::handle v) { o.model.fill_correction = v.cast<float>(); }},
        {"fill_pool", [](options& o, py::handle v) { o.model.fill_pool = v.cast<float>(); }},
        {"auto_sparse_min",
         [](options& o, py::handle v) { o.model.auto_sparse_min = v.cast<uint32_t>(); }},
        {"hash", [](options& o, py::handle v) { o.model.hash = list_of<std::string>(v); }},
        {"K", [](options& o, py::handle v) { o.model.K = list_of<int>(v); }},
        {"L", [](options& o, py::handle v) { o.model.L = list_of<int>(v); }},
        {"bits", [](options& o, py::handle v) { o.model.bits = list_of<int>(v); }},
        {"bucket_capacity",
         [](options& o, py::handle v) { o.model.bucket_capacity = list_of<int>(v); }},
        {"insertion",
         [](options& o, py::handle v) { o.model.insertion = list_of<std::string>(v); }},
        {"min_active",
         [](options& o, py::handle v) { o.model.min_active = list_of<uint32_t>(v); }},
        {"max_active",
         [](options& o, py::handle v) { o.model.max_active = list_of<uint32_t>(v); }},
        {"hit_threshold",
         [](options& o, py::handle v) { o.model.hit_threshold = list_of<uint32_t>(v); }},
        {"probes", [](options& o, py::handle v) { o.model.probes = list_of<uint32_t>(v); }},
        // where it computes
        {"backend",
         [](options& o, py::handle v) { o.device.kind = parse_backend_kind(v.cast<std::string>()); }},
        {"threads",
         [](options& o, py::handle v) { o.device.threads = o.train.threads = v.cast<int>(); }},
        {"isa", [](options& o, py::handle v) { o.isa = v.cast<std::string>(); }},
        {"precision",
         [](options& o, py::handle v) {
             o.device.precision = parse_precision(v.cast<std::string>());
         }},
        {"gpu", [](options& o, py::handle v) { o.device.device = v.cast<int>(); }},
        {"gpu_async_rebuild",
         [](options& o, py::handle v) { o.device.gpu_async_rebuild = v.cast<bool>(); }},
        // training
        {"epochs", [](options& o, py::handle v) { o.train.epochs = v.cast<uint32_t>(); }},
        {"batch_size", [](options& o, py::handle v) { o.train.batch_size = v.cast<uint32_t>(); }},
        {"lr_schedule",
         [](options& o, py::handle v) {
             o.train.schedule = parse_lr_schedule(v.cast<std::string>());
         }},
        {"lr", [](options& o, py::handle v) { o.train.learning_rate = v.cast<float>(); }},
        {"lr_scaling",
         [](options& o, py::handle v) {
             o.train.lr_scaling = parse_lr_batch_scaling(v.cast<std::string>());
         }},
        {"lr_base_batch",
         [](options& o, py::handle v) { o.train.lr_base_batch = v.cast<uint32_t>(); }},
        {"warmup", [](options& o, py::handle v) { o.train.warmup_samples = v.cast<uint64_t>(); }},
        {"beta1", [](options& o, py::handle v) { o.train.adam_beta1 = v.cast<float>(); }},
        {"beta2", [](options& o, py::handle v) { o.train.adam_beta2 = v.cast<float>(); }},
        {"adam_eps", [](options& o, py::handle v) { o.train.adam_epsilon = v.cast<float>(); }},
        {"adam",
         [](options& o, py::handle v) { o.train.adam = parse_adam_mode(v.cast<std::string>()); }},
        {"adam_moments",
         [](options& o, py::handle v) {
             o.train.adam_moments = parse_moment_storage(v.cast<std::string>());
         }},
        {"rebuild", [](options& o, py::handle v) { o.train.rebuild_every = v.cast<uint64_t>(); }},
        {"rebuild_decay",
         [](options& o, py::handle v) { o.train.rebuild_decay = v.cast<double>(); }},
        {"rehash", [](options& o, py::handle v) { o.train.rehash_every = v.cast<uint64_t>(); }},
        {"seed", [](options& o, py::handle v) { o.train.seed = v.cast<uint64_t>(); }},
        {"deterministic",
         [](options& o, py::handle v) { o.train.deterministic = v.cast<bool>(); }},
        // evaluation
        {"scoring",
         [](options& o, py::handle v) { o.eval.scoring = parse_scoring(v.cast<std::string>()); }},
        {"eval_max", [](options& o, py::handle v) { o.eval.max_points = v.cast<size_t>(); }},
        {"propensity_a",
         [](options& o, py::handle v) { o.eval.metrics.propensity_a = v.cast<double>(); }},
        {"propensity_b",
         [](options& o, py::handle v) { o.eval.metrics.propensity_b = v.cast<double>(); }},
        {"selection_probe",
         [](options& o, py::handle v) { o.selection_probe = v.cast<uint32_t>(); }},
        {"selection_top", [](options& o, py::handle v) { o.selection_top = v.cast<uint32_t>(); }},
        // validation-driven training
        {"keep_best",
         [](options& o, py::handle v) {
             if (v.is_none()) {
                 o.keep_best.reset();
                 return;
             }
             o.keep_best = v.cast<std::string>();
             parse_selection_metric(*o.keep_best);  // checked now
         }},
        {"patience", [](options& o, py::handle v) { o.patience = v.cast<uint32_t>(); }},
        {"valid_fraction", [](options& o, py::handle v) { o.valid_fraction = v.cast<double>(); }},
        // output
        {"progress", [](options& o, py::handle v) { o.progress = v.cast<bool>(); }},
        {"log_level", [](options& o, py::handle v) { o.log_level = v.cast<std::string>(); }},
    };
    return table;
}

options parse_options(const py::dict& given) {
    options o;
    const auto& table = option_table();
    for (const auto& item : given) {
        const std::string name = item.first.cast<std::string>();
        const auto it = table.find(name);
        if (it == table.end()) {
            std::string known;
            for (const auto& entry : table) known += (known.empty() ? "" : ", ") + entry.first;
            throw py::type_error(
                fmt::format("hslide.Model: unknown option '{}' (options: {})", name, known));
        }
        try {
            it->second(o, item.second);
        } catch (const py::cast_error&) {
            throw py::type_error(fmt::format("hslide.Model: option '{}' has the wrong type ({})",
                                             name, std::string(py::str(item.second.get_type()))));
        }
    }
    HSLIDE_CHECK(o.device.kind != backend_kind::hybrid,
                 "backend 'hybrid' is offered by the command line only (hslide train)");
    validate(o.train);
    validate(o.eval.metrics);
    check_validation_fraction(o.valid_fraction);
    return o;
}

/// A model: its options, and once fitted or loaded, a backend holding it.
class model {
  public:
    explicit model(const py::dict& given) : options_(parse_options(given)) {
        setup_logging(options_.log_level, false);
    }

    static std::unique_ptr<model> load(const std::string& path, const py::dict& given) {
        auto m = std::make_unique<model>(given);
        checkpoint_contents ck = load_checkpoint(path);
        m->state_ = ck.trainer;
        m->label_counts_ = std::move(ck.label_counts);
        m->train_points_ = ck.train_points;
        m->open(std::move(ck.model));
        return m;
    }

    py::list fit(const dataset& train_in, const dataset* valid_in, std::optional<uint32_t> epochs,
                 py::object callback) {
        train_config tc = options_.train;
        if (epochs) tc.epochs = *epochs;
        validate(tc);
        dataset train = train_in, valid;
        if (valid_in) valid = *valid_in;
        if (options_.valid_fraction > 0) {
            HSLIDE_CHECK(!valid_in, "give X_valid/Y_valid or the option valid_fraction, not both");
            auto parts = hold_out(train, options_.valid_fraction, tc.seed);
            train = std::move(parts.first);
            valid = std::move(parts.second);
        }
        const uint64_t n_features = std::max(train.n_features, valid.n_features);
        const uint64_t n_labels = std::max(train.n_labels, valid.n_labels);
        HSLIDE_CHECK(n_features > 0 && n_labels > 0, "the training data has no labels or features");
        train.n_features = valid.n_features = n_features;
        train.n_labels = valid.n_labels = n_labels;
        validation_options vo;
        if (options_.keep_best) {
            vo.keep_best = true;
            vo.metric = parse_selection_metric(*options_.keep_best);
        }
        vo.patience = options_.patience;
        HSLIDE_CHECK(valid.size() > 0 || (!vo.keep_best && vo.patience == 0),
                     "keep_best and patience need a validation set: X_valid/Y_valid or "
                     "valid_fraction");
        if (options_.isa != "auto") set_active_isa(parse_isa(options_.isa));
        if (tc.threads > 0) omp_set_num_threads(tc.threads);

        engine_.reset();
        const model_config config =
            make_model_config(options_.model, uint32_t(n_features), uint32_t(n_labels));
        normalize_inputs(train, config);
        normalize_inputs(valid, config);
        check_supported(options_.device.kind, config, tc, options_.device.precision,
                        options_.eval.scoring);
        backend_options bo = options_.device;
        bo.threads = tc.threads;
        engine_ = create_backend(bo, model_state::create(config, tc.seed, tc.adam_moments), tc);
        config_ = config;

        trainer_options to;
        to.train = tc;
        to.eval = options_.eval;
        to.eval.show_progress = options_.progress;
        to.show_progress = options_.progress;
        to.backend = options_.device.kind;
        to.selection_probe_points = options_.selection_probe;
        to.selection_probe_top = options_.selection_top;
        vo.valid = valid.size() > 0 ? &valid : nullptr;
        to.validation = vo;
        trainer run(*engine_, train, nullptr, to);
        py::list history;
        std::exception_ptr failure;
        auto on_epoch = [&](const epoch_record& r) {
            py::gil_scoped_acquire gil;
            py::object record = py::module_::import("json").attr("loads")(run.record_json(r));
            history.append(record);
            if (callback.is_none()) return;
            try {
                py::object result = callback(record);
                // Python truth ([] stops, as False does), not a cast that refuses a list.
                if (!result.is_none() && !py::bool_(result)) run.request_stop();
            } catch (py::error_already_set& e) {
                if (e.matches(PyExc_StopIteration)) {
                    run.request_stop();
                    return;
                }
                failure = std::current_exception();
                run.request_stop();
            }
        };
        {
            py::gil_scoped_release release;
            run.run(on_epoch);
        }
        label_counts_ = label_counts(train);
        train_points_ = train.size();
        state_ = run.state();
        best_epoch_ = run.best_epoch();
        if (failure) std::rethrow_exception(failure);
        return history;
    }

    py::tuple predict(const dataset& points_in, uint32_t k) {
        HSLIDE_CHECK(k > 0, "k must be positive");
        dataset points = checked_input(points_in, false);
        const size_t n = points.size();
        py::array_t<int64_t> labels({py::ssize_t(n), py::ssize_t(k)});
        py::array_t<float> scores({py::ssize_t(n), py::ssize_t(k)});
        int64_t* out_labels = labels.mutable_data();
        float* out_scores = scores.mutable_data();
        {
            py::gil_scoped_release release;
            const uint32_t batch = 1024;
            std::vector<uint32_t> rows, top(size_t(batch) * k);
            for (size_t begin = 0; begin < n; begin += batch) {
                const uint32_t size = uint32_t(std::min<size_t>(batch, n - begin));
                rows.resize(size);
                std::iota(rows.begin(), rows.end(), uint32_t(begin));
                engine_->predict({&points, rows.data(), size}, k, options_.eval.scoring, top.data(),
                                 out_scores + begin * k);
                for (size_t i = 0; i < size_t(size) * k; ++i)
                    out_labels[begin * k + i] = top[i] == UINT32_MAX ? -1 : int64_t(top[i]);
            }
        }
        return py::make_tuple(labels, scores);
    }

    py::dict evaluate(const dataset& test_in, int k) {
        HSLIDE_CHECK(k >= 1, "k must be at least 1, got {}", k);
        dataset test = checked_input(test_in, true);
        evaluation_options eo = options_.eval;
        eo.metrics.max_k = k;
        eo.show_progress = false;
        std::vector<double> inv_prop;
        if (!label_counts_.empty() && train_points_ > 0)
            inv_prop = inverse_propensities(label_counts_, train_points_, eo.metrics.propensity_a,
                                            eo.metrics.propensity_b);
        metrics_result r;
        {
            py::gil_scoped_release release;
            r = hslide::evaluate(*engine_, test, eo, inv_prop);
        }
        py::dict out;
        for (int i = 1; i <= k; ++i) out[py::str(fmt::format("p@{}", i))] = r.p_at(i);
        for (int i = 1; i <= k; ++i) out[py::str(fmt::format("ndcg@{}", i))] = r.ndcg_at(i);
        if (!r.psp.empty())
            for (int i = 1; i <= k; ++i) out[py::str(fmt::format("psp@{}", i))] = r.psp_at(i);
        out["points"] = r.n;
        return out;
    }

    void save(const std::string& path) const {
        const backend& engine = fitted();
        if (const model_state* held = engine.host_state()) {
            save_checkpoint(path, *held, state_, label_counts_, train_points_);
            return;
        }
        model_state snapshot;
        engine.export_state(snapshot, /*with_optimizer=*/true);
        save_checkpoint(path, snapshot, state_, label_counts_, train_points_);
    }

    uint64_t n_features() const { return fitted_config().input_dim; }
    uint64_t n_labels() const { return fitted_config().output_dim(); }
    uint32_t epochs_done() const { return state_.epochs_done; }
    uint32_t best_epoch() const { return best_epoch_; }
    bool is_fitted() const { return engine_ != nullptr; }

  private:
    const backend& fitted() const {
        HSLIDE_CHECK(engine_, "the model is not trained: call fit() or hslide.load() first");
        return *engine_;
    }
    const model_config& fitted_config() const {
        fitted();
        return config_;
    }

    /// A copy of `in` checked against the model's dimensions and scaled as its inputs are.
    dataset checked_input(const dataset& in, bool with_labels) {
        fitted();
        HSLIDE_CHECK(in.n_features <= config_.input_dim, "X has {} features but the model takes {}",
                     in.n_features, config_.input_dim);
        if (with_labels)
            HSLIDE_CHECK(in.n_labels <= config_.output_dim(),
                         "Y has {} labels but the model has {}", in.n_labels, config_.output_dim());
        dataset d = in;
        normalize_inputs(d, config_);
        return d;
    }

    void open(model_state state) {
        if (options_.isa != "auto") set_active_isa(parse_isa(options_.isa));
        if (options_.train.threads > 0) omp_set_num_threads(options_.train.threads);
        config_ = state.config;
        train_config scoring_only;
        scoring_only.adam = adam_mode::sparse;
        check_supported(options_.device.kind, config_, scoring_only, options_.device.precision,
                        options_.eval.scoring);
        engine_ = create_backend(options_.device, std::move(state), scoring_only);
    }

    options options_;
    std::unique_ptr<backend> engine_;
    model_config config_;
    trainer_state state_;
    std::vector<uint32_t> label_counts_;
    uint64_t train_points_ = 0;
    uint32_t best_epoch_ = 0;
};

}  // namespace

}  // namespace hslide::python

PYBIND11_MODULE(_core, m) {
    using namespace hslide;
    using namespace hslide::python;
    m.doc() = "hslide's library (see the hslide package for the scipy-facing API)";

    // hslide::error -> hslide.Error subclasses of ValueError (a bad argument or input),
    // OSError (I/O) and RuntimeError (the rest), carrying the same message.
    static py::exception<error> base(m, "Error", PyExc_Exception);
    static py::object invalid = py::reinterpret_steal<py::object>(
        PyErr_NewException("hslide.InvalidArgumentError",
                           py::make_tuple(base, py::handle(PyExc_ValueError)).ptr(), nullptr));
    static py::object io = py::reinterpret_steal<py::object>(PyErr_NewException(
        "hslide.IOError", py::make_tuple(base, py::handle(PyExc_OSError)).ptr(), nullptr));
    static py::object runtime = py::reinterpret_steal<py::object>(
        PyErr_NewException("hslide.RuntimeError",
                           py::make_tuple(base, py::handle(PyExc_RuntimeError)).ptr(), nullptr));
    static py::object no_memory = py::reinterpret_steal<py::object>(
        PyErr_NewException("hslide.OutOfMemoryError",
                           py::make_tuple(base, py::handle(PyExc_MemoryError)).ptr(), nullptr));
    m.attr("OutOfMemoryError") = no_memory;
    m.attr("InvalidArgumentError") = invalid;
    m.attr("IOError") = io;
    m.attr("RuntimeError") = runtime;
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const out_of_memory_error& e) {
            PyErr_SetString(no_memory.ptr(), e.what());
        } catch (const error& e) {
            const error_kind kind = e.kind();
            PyObject* type = kind == error_kind::invalid_argument || kind == error_kind::bad_input
                                 ? invalid.ptr()
                             : kind == error_kind::io ? io.ptr()
                                                      : runtime.ptr();
            PyErr_SetString(type, e.what());
        }
    });

    py::class_<dataset>(m, "Dataset", "Points with sparse features and labels (two CSR matrices)")
        .def_property_readonly("size", &dataset::size)
        .def_readonly("n_features", &dataset::n_features)
        .def_readonly("n_labels", &dataset::n_labels)
        .def_readonly("source", &dataset::source)
        .def("arrays", &dataset_arrays,
             "(indptr, indices, data, label_indptr, label_ids) as numpy arrays");
    m.def("make_dataset", &make_dataset, py::arg("indptr"), py::arg("indices"), py::arg("data"),
          py::arg("n_features"), py::arg("label_indptr"), py::arg("label_ids"), py::arg("n_labels"),
          py::arg("source") = "python");
    m.def(
        "read_xc", [](const std::string& path) { return read_xc(path); }, py::arg("path"),
        py::call_guard<py::gil_scoped_release>());
    m.def(
        "read_split",
        [](const std::string& path, int column, size_t n_points) {
            return read_split(path, column, n_points);
        },
        py::arg("path"), py::arg("column"), py::arg("n_points"));
    m.def(
        "write_xc", [](const dataset& d, const std::string& path) { write_xc(d, path); },
        py::arg("dataset"), py::arg("path"), py::call_guard<py::gil_scoped_release>());
    m.def(
        "synthetic",
        [](const std::string& preset, double scale, uint64_t labels, uint64_t features,
           uint64_t seed) {
            synthetic_config sc;
            sc.preset = preset;
            sc.scale = scale;
            sc.n_labels = labels;
            sc.n_features = features;
            sc.seed = seed;
            synthetic_data data = generate_synthetic(sc, false);
            return py::make_tuple(std::move(data.train), std::move(data.test));
        },
        py::arg("preset"), py::arg("scale"), py::arg("labels"), py::arg("features"),
        py::arg("seed"));
    m.def("option_names", [] {
        std::vector<std::string> names;
        for (const auto& entry : option_table()) names.push_back(entry.first);
        return names;
    });

    py::class_<model>(m, "Model")
        .def(py::init<const py::dict&>(), py::arg("options"))
        .def_static("load", &model::load, py::arg("path"), py::arg("options"))
        .def("fit", &model::fit, py::arg("train"), py::arg("valid"), py::arg("epochs"),
             py::arg("callback"))
        .def("predict", &model::predict, py::arg("points"), py::arg("k"))
        .def("evaluate", &model::evaluate, py::arg("test"), py::arg("k"))
        .def("save", &model::save, py::arg("path"))
        .def_property_readonly("n_features", &model::n_features)
        .def_property_readonly("n_labels", &model::n_labels)
        .def_property_readonly("epochs_done", &model::epochs_done)
        .def_property_readonly("best_epoch", &model::best_epoch)
        .def_property_readonly("is_fitted", &model::is_fitted);
}
