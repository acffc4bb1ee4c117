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
#include "hslide/label_map.hpp"
#include "hslide/memory.hpp"
#include "hslide/metrics.hpp"
#include "hslide/model.hpp"
#include "hslide/model_options.hpp"
#include "hslide/progress.hpp"
#include "hslide/synthetic.hpp"
#include "hslide/trainer.hpp"
#include "hslide/validation.hpp"

#include "cli/option_table.hpp"

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <variant>
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

/// Every option of hslide.Model: the entries of `hslide train`'s option table that Python
/// takes (cli/option_table.hpp), by their long flag names with '_' for '-', with the same
/// defaults (but log_level "warn" and no progress bars), parsed and checked as the CLI does.
struct options {
    cli::train_settings settings;
    backend_options device;  ///< from settings: backend, threads, precision, gpu

    options() {
        settings.output.log_level = "warn";
        settings.trainer.eval.show_progress = false;
    }
    /// The model options for a run at `batch` (the automatic output layer's sets follow it).
    model_options model(uint32_t batch) const {
        model_options m = settings.model;
        m.batch_size = batch;
        return m;
    }
    const train_config& train() const { return settings.train; }
    const evaluation_options& eval() const { return settings.trainer.eval; }
    const std::string& isa() const { return settings.compute.isa; }
};

template <class T>
std::vector<T> list_of(py::handle value) {
    const bool list = py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value);
    // True is no width or count (Python would take it for 1).
    if constexpr (std::is_arithmetic_v<T>)
        for (py::handle item : list ? py::iter(value) : py::iter(py::make_tuple(value)))
            if (py::isinstance<py::bool_>(item)) throw py::cast_error("a bool");
    if (list) return value.cast<std::vector<T>>();
    return {value.cast<T>()};
}

/// Sets the setting `target` points at to `value`: a list setting takes one value or a
/// list of them, a text setting whose default is empty (a path, keep_best) takes None.
void set_option(const cli::option_target& target, py::handle value) {
    std::visit(
        [&](auto* field) {
            using T = std::remove_pointer_t<decltype(field)>;
            if constexpr (std::is_same_v<T, std::vector<uint32_t>> ||
                          std::is_same_v<T, std::vector<int>> ||
                          std::is_same_v<T, std::vector<std::string>>) {
                *field = list_of<typename T::value_type>(value);
            } else if constexpr (std::is_same_v<T, std::string>) {
                if (py::isinstance<py::int_>(value) && !py::isinstance<py::bool_>(value)) {
                    // A text setting that also takes a count (epochs: "auto" or a count), with
                    // the range error an integer setting gives.
                    const py::int_ low(0), high(std::numeric_limits<uint32_t>::max());
                    if (PyObject_RichCompareBool(value.ptr(), low.ptr(), Py_LT) == 1 ||
                        PyObject_RichCompareBool(value.ptr(), high.ptr(), Py_GT) == 1)
                        throw std::out_of_range(fmt::format("{} is out of its range [0, {}]",
                                                            std::string(py::str(value)),
                                                            std::numeric_limits<uint32_t>::max()));
                    *field = std::string(py::str(value));
                } else if (!value.is_none()) {
                    *field = value.cast<std::string>();
                } else if (!field->empty()) {
                    throw py::cast_error("None for a setting that has a value");
                }
            } else {
                // True is no count, rate or width (Python would take it for 1).
                if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
                    if (py::isinstance<py::bool_>(value)) throw py::cast_error("a bool");
                if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
                    // A Python int is unbounded: one past the setting's range is a range
                    // error, not "the wrong type" (what the cast would report).
                    if (py::isinstance<py::int_>(value) && !py::isinstance<py::bool_>(value)) {
                        const py::int_ low(std::numeric_limits<T>::min()),
                            high(std::numeric_limits<T>::max());
                        if (PyObject_RichCompareBool(value.ptr(), low.ptr(), Py_LT) == 1 ||
                            PyObject_RichCompareBool(value.ptr(), high.ptr(), Py_GT) == 1)
                            throw std::out_of_range(fmt::format(
                                "{} is out of its range [{}, {}]", std::string(py::str(value)),
                                std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
                    }
                }
                *field = value.cast<T>();
            }
        },
        target);
}

std::vector<std::string> option_names() {
    std::vector<std::string> names;
    for (const cli::option_spec& o : cli::train_option_table()) {
        if (o.surface == cli::option_surface::cli) continue;
        std::string name = o.name;
        std::replace(name.begin(), name.end(), '-', '_');
        names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
}

options parse_options(const py::dict& given) {
    options o;
    for (const auto& item : given) {
        const std::string name = item.first.cast<std::string>();
        std::string flag = name;  // the table's spelling
        std::replace(flag.begin(), flag.end(), '_', '-');
        const cli::option_spec* spec =
            name.find('-') == std::string::npos ? cli::find_option(flag) : nullptr;
        if (name.find('-') != std::string::npos && cli::find_option(flag))
            throw py::type_error(
                fmt::format("hslide.Model: option '{}' is spelt '{}' in Python", name, [&] {
                    std::string python = name;
                    std::replace(python.begin(), python.end(), '-', '_');
                    return python;
                }()));
        if (!spec || spec->surface == cli::option_surface::cli)
            throw py::type_error(
                fmt::format("hslide.Model: {}; hslide.option_names() lists the options",
                            cli::unknown_option_message(flag, cli::option_surface::python, '_')));
        try {
            set_option(spec->target(o.settings), item.second);
            // The command line's range checks (the table's), and no NaN anywhere.
            std::string problem;
            std::visit(
                [&](auto* field) {
                    using T = std::remove_pointer_t<decltype(field)>;
                    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
                        problem = cli::option_value_problem(spec->check, double(*field));
                    } else if constexpr (std::is_same_v<T, std::vector<uint32_t>> ||
                                         std::is_same_v<T, std::vector<int>>) {
                        for (const auto value : *field)
                            if (problem.empty())
                                problem = cli::option_value_problem(spec->check, double(value));
                    }
                },
                spec->target(o.settings));
            if (!problem.empty())
                throw error(error_kind::invalid_argument,
                            fmt::format("hslide.Model: option '{}': {}", name, problem));
        } catch (const std::out_of_range& e) {
            throw error(error_kind::invalid_argument,
                        fmt::format("hslide.Model: option '{}': {}", name, e.what()));
        } catch (const py::cast_error&) {
            throw py::type_error(fmt::format("hslide.Model: option '{}' has the wrong type ({})",
                                             name, std::string(py::str(item.second.get_type()))));
        }
    }
    cli::train_settings& s = o.settings;
    s.apply_names();
    o.device.kind = parse_backend_kind(s.backend);
    o.device.threads = s.train.threads;
    o.device.precision = parse_precision(s.compute.precision);
    o.device.device = s.compute.gpu;
    o.device.gpu_async_rebuild = s.compute.gpu_async_rebuild;
    HSLIDE_CHECK(o.device.kind != backend_kind::hybrid,
                 "backend 'hybrid' is offered by the command line only (hslide train)");
    validate_before_data(s.train, o.device.kind, /*sharded=*/false);  // fit() resolves it
    validate(s.trainer.eval.metrics);
    check_validation_fraction(s.valid_fraction);
    return o;
}

/// OpenMP's team size when the module was loaded (OMP_NUM_THREADS, else every CPU): what
/// threads=0 means, whatever an earlier model with threads=N set the process to.
const int default_threads = omp_get_max_threads();

/// The threads a model runs on: `threads`, or with 0 the process's default.
void use_threads(uint32_t threads) {
    omp_set_num_threads(threads > 0 ? int(threads) : default_threads);
}

/// A model: its options, and once fitted or loaded, a backend holding it.
class model {
  public:
    explicit model(const py::dict& given) : options_(parse_options(given)) {
        setup_logging(options_.settings.output.log_level, false);
    }

    static std::unique_ptr<model> load(const std::string& path, const py::dict& given) {
        auto m = std::make_unique<model>(given);
        checkpoint_contents ck = load_checkpoint(path);
        m->state_ = ck.trainer;
        m->label_counts_ = std::move(ck.label_counts);
        m->train_points_ = ck.train_points;
        m->rows_ = std::move(ck.rows);
        m->open(std::move(ck.model));
        return m;
    }

    /// `epochs`: None (the model's option), "auto" or a count, as the option takes.
    /// `callback` gets each epoch's record (hslide.Model.fit keeps them as history_).
    void fit(const dataset& train_in, const dataset* valid_in, py::object epochs,
             py::object callback) {
        const in_use guard(*this, /*training=*/true);
        train_config tc = options_.train();
        if (!epochs.is_none()) {
            const bool number =
                py::isinstance<py::int_>(epochs) && !py::isinstance<py::bool_>(epochs);
            if (!number && !py::isinstance<py::str>(epochs))
                throw py::type_error(
                    fmt::format("fit(epochs=...) takes None, 'auto' or a positive int, not {}",
                                std::string(py::str(epochs.get_type()))));
            parse_epochs(std::string(py::str(epochs)), tc);
        }
        dataset train = train_in, valid;
        if (valid_in) valid = *valid_in;
        if (options_.settings.valid_fraction > 0) {
            HSLIDE_CHECK(!valid_in, "give X_valid/Y_valid or the option valid_fraction, not both");
            auto parts = hold_out(train, options_.settings.valid_fraction, tc.seed);
            train = std::move(parts.first);
            valid = std::move(parts.second);
        } else if (tc.epochs_auto && !valid_in) {
            // epochs="auto" with no validation set of the caller's: a small seeded hold-out.
            auto parts = hold_out_for_auto_epochs(train, tc.seed);
            train = std::move(parts.first);
            valid = std::move(parts.second);
        }
        resolve_auto_training(tc, options_.device.kind, /*sharded=*/false, train.size());
        validate(tc);
        const uint64_t n_features = std::max(train.n_features, valid.n_features);
        const uint64_t n_labels = std::max(train.n_labels, valid.n_labels);
        HSLIDE_CHECK(n_features > 0 && n_labels > 0, "the training data has no labels or features");
        train.n_features = valid.n_features = n_features;
        train.n_labels = valid.n_labels = n_labels;
        validation_options vo = options_.settings.trainer.validation;
        HSLIDE_CHECK(valid.size() > 0 || (!vo.keep_best && vo.patience == 0),
                     "keep_best and patience need a validation set: X_valid/Y_valid or "
                     "valid_fraction");
        if (options_.isa() != "auto") set_active_isa(parse_isa(options_.isa()));
        use_threads(tc.threads);

        ++fits_begun_;  // the model fitted before is gone from here on
        engine_.reset();
        // Rows for the labels the training points carry (label_map.hpp), as `hslide train`.
        rows_ = output_label_rows(train, options_.settings.model.label_rows);
        labels_to_rows(train, rows_);
        labels_to_rows(valid, rows_);
        const model_config config = make_model_config(
            options_.model(tc.batch_size), uint32_t(n_features),
            rows_.identity() ? uint32_t(n_labels) : uint32_t(rows_.labels.size()));
        normalize_inputs(train, config);
        normalize_inputs(valid, config);
        check_supported(options_.device.kind, config, tc, options_.device.precision,
                        options_.eval().scoring);
        backend_options bo = options_.device;
        bo.threads = tc.threads;
        check_training_memory(config, tc, train.size(), tc.epochs_auto || vo.keep_best);
        model_state initial = model_state::create(config, tc.seed, tc.adam_moments);
        if (tc.loss == output_loss::logistic) start_at_label_prior(initial, train);
        engine_ = create_backend(bo, std::move(initial), tc);
        config_ = config;

        trainer_options to;
        to.train = tc;
        to.eval = options_.eval();
        to.eval.show_progress = options_.settings.progress;
        to.show_progress = options_.settings.progress;
        to.selection_probe_points = options_.settings.trainer.selection_probe_points;
        to.selection_probe_top = options_.settings.trainer.selection_probe_top;
        vo.valid = valid.size() > 0 ? &valid : nullptr;
        to.validation = vo;
        // Ctrl-C between two steps, not at the epoch's end: Python's handler runs (raising
        // KeyboardInterrupt) only when asked, and the training thread holds no GIL.
        to.between_steps = [] {
            py::gil_scoped_acquire gil;
            if (PyErr_CheckSignals() != 0) throw py::error_already_set();
        };
        trainer run(*engine_, train, nullptr, to);
        // The model's counts and state are the new run's from here on, also where it ends by
        // an exception (Ctrl-C mid-epoch) or a callback saves it: the backend holds its model.
        label_counts_ = label_counts(train);
        train_points_ = train.size();
        state_ = run.state();
        best_epoch_ = 0;
        std::exception_ptr failure;
        auto on_epoch = [&](const epoch_record& r) {
            py::gil_scoped_acquire gil;
            state_ = run.state();
            best_epoch_ = run.best_epoch();
            if (callback.is_none()) return;
            py::object record = py::module_::import("json").attr("loads")(run.record_json(r));
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
        try {
            py::gil_scoped_release release;
            run.run(on_epoch);
        } catch (...) {
            state_ = run.state();
            best_epoch_ = run.best_epoch();
            throw;
        }
        state_ = run.state();
        best_epoch_ = run.best_epoch();
        if (failure) std::rethrow_exception(failure);
    }

    py::tuple predict(const dataset& points_in, uint32_t k) {
        const in_use guard(*this, /*training=*/false);
        HSLIDE_CHECK(k > 0, "k must be positive");
        dataset points = checked_input(points_in, false);
        const size_t n = points.size();
        py::array_t<int64_t> labels({py::ssize_t(n), py::ssize_t(k)});
        py::array_t<float> scores({py::ssize_t(n), py::ssize_t(k)});
        int64_t* out_labels = labels.mutable_data();
        float* out_scores = scores.mutable_data();
        {
            py::gil_scoped_release release;
            const uint32_t batch = uint32_t(std::min<size_t>(1024, std::max<size_t>(n, 1)));
            std::vector<uint32_t> rows, top(size_t(batch) * k);
            for (size_t begin = 0; begin < n; begin += batch) {
                const uint32_t size = uint32_t(std::min<size_t>(batch, n - begin));
                rows.resize(size);
                std::iota(rows.begin(), rows.end(), uint32_t(begin));
                engine_->predict({&points, rows.data(), size}, k, options_.eval().scoring,
                                 top.data(), out_scores + begin * k);
                for (size_t i = 0; i < size_t(size) * k; ++i)
                    out_labels[begin * k + i] =
                        top[i] == UINT32_MAX ? -1 : int64_t(rows_.label_of_row(top[i]));
            }
        }
        return py::make_tuple(labels, scores);
    }

    py::dict evaluate(const dataset& test_in, int k) {
        const in_use guard(*this, /*training=*/false);
        HSLIDE_CHECK(k >= 1, "k must be at least 1, got {}", k);
        HSLIDE_CHECK(test_in.size() > 0, "X has no rows to evaluate");
        dataset test = checked_input(test_in, true);
        evaluation_options eo = options_.eval();
        eo.metrics.max_k = k;
        eo.show_progress = false;
        const std::vector<double> inv_prop = saved_inverse_propensities(
            label_counts_, train_points_, test.n_labels, !rows_.identity(), eo.metrics.propensity_a,
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

    void save(const std::string& path) {
        const in_use guard(*this, /*training=*/false);
        const backend& engine = fitted();
        if (const model_state* held = engine.host_state()) {
            save_checkpoint(path, *held, state_, label_counts_, train_points_, rows_);
            return;
        }
        model_state snapshot;
        engine.export_state(snapshot, /*with_optimizer=*/true);
        save_checkpoint(path, snapshot, state_, label_counts_, train_points_, rows_);
    }

    uint64_t n_features() const { return fitted_config().input_dim; }
    /// One past the largest label the model has a row for.
    uint64_t n_labels() const {
        return rows_.identity() ? fitted_config().output_dim() : uint64_t(rows_.labels.back()) + 1;
    }
    uint32_t epochs_done() const { return state_.epochs_done; }
    uint32_t best_epoch() const { return best_epoch_; }
    bool is_fitted() const { return engine_ != nullptr; }
    /// fit() calls that got as far as dropping the model before them (hslide.Model.fit keeps
    /// its history where a fit fails before that).
    uint64_t fits_begun() const { return fits_begun_; }

  private:
    /// A model is used by one thread at a time: fit releases the GIL while it trains, and a
    /// second thread's fit or predict on the same backend crashed. Its own callbacks (on the
    /// fitting thread) may predict, evaluate and save between epochs; a fit from one of them
    /// would replace the backend the running fit trains.
    class in_use {
      public:
        in_use(model& m, bool training) : m_(m) {
            const std::thread::id me = std::this_thread::get_id();
            std::thread::id user{};
            if (m_.user_.compare_exchange_strong(user, me)) {
                owner_ = true;
                return;
            }
            if (user == me && !training) return;  // a callback of this thread's fit
            throw error(error_kind::invalid_argument,
                        user == me ? "fit() called from a callback of the model's own fit(): "
                                     "stop it (return False) and fit again after it returns"
                                   : "the model is in use by another thread (a fit, predict, "
                                     "evaluate or save): use a model from one thread at a time");
        }
        ~in_use() {
            if (owner_) m_.user_.store(std::thread::id{});
        }
        in_use(const in_use&) = delete;
        in_use& operator=(const in_use&) = delete;

      private:
        model& m_;
        bool owner_ = false;
    };

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
        // A model with rows for some labels only scores any label id (label_map.hpp).
        if (with_labels)
            HSLIDE_CHECK(!rows_.identity() || in.n_labels <= config_.output_dim(),
                         "Y has {} labels but the model has {}", in.n_labels, config_.output_dim());
        dataset d = in;
        normalize_inputs(d, config_);
        if (with_labels) labels_to_rows(d, rows_);
        return d;
    }

    void open(model_state state) {
        if (options_.isa() != "auto") set_active_isa(parse_isa(options_.isa()));
        use_threads(options_.train().threads);
        config_ = state.config;
        train_config scoring_only;
        scoring_only.adam = adam_mode::sparse;
        check_supported(options_.device.kind, config_, scoring_only, options_.device.precision,
                        options_.eval().scoring);
        engine_ = create_backend(options_.device, std::move(state), scoring_only);
    }

    options options_;
    std::unique_ptr<backend> engine_;
    model_config config_;
    trainer_state state_;
    std::vector<uint32_t> label_counts_;  // by the ids labels_to_rows gives, as the trainer
    uint64_t train_points_ = 0;
    uint64_t fits_begun_ = 0;
    label_map rows_;  // the label each output row stands for
    uint32_t best_epoch_ = 0;
    std::atomic<std::thread::id> user_{};  // the thread using the model (in_use), or none
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
    m.def("option_names", &option_names);

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
        .def_property_readonly("is_fitted", &model::is_fitted)
        .def_property_readonly("fits_begun", &model::fits_begun);
}
