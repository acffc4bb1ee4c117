// Shared option groups and data loading of the `hslide` subcommands.
#include "cli_common.hpp"

#include "hslide/error.hpp"
#include "hslide/gpu_devices.hpp"
#include "hslide/isa.hpp"
#include "hslide/progress.hpp"
#include "hslide/synthetic.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>
#include <variant>

namespace hslide::cli {

dataset load_file(const data_options& o, const std::string& path) {
    load_options lo;
    lo.format = o.format == "xc"       ? data_format::xc
                : o.format == "libsvm" ? data_format::libsvm
                                       : data_format::automatic;
    lo.use_cache = !o.no_cache;
    lo.verify_cache = o.verify_cache;
    lo.show_progress = o.show_progress;
    const auto t0 = std::chrono::steady_clock::now();
    dataset d = load_dataset(path, lo);
    spdlog::info("loaded {}: {} points, {} features, {} labels ({:.2f} s)", path, d.size(),
                 d.n_features, d.n_labels,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return d;
}

void warn_shared_rows(const std::string& flag_a, const std::vector<uint32_t>& a,
                      const std::string& flag_b, const std::vector<uint32_t>& b,
                      const std::string& consequence) {
    std::vector<uint32_t> sorted_a = a, sorted_b = b, shared;
    std::sort(sorted_a.begin(), sorted_a.end());
    std::sort(sorted_b.begin(), sorted_b.end());
    std::set_intersection(sorted_a.begin(), sorted_a.end(), sorted_b.begin(), sorted_b.end(),
                          std::back_inserter(shared));
    if (!shared.empty())
        spdlog::warn("{} and {} share {} of their rows (the first: row {}): {}", flag_a, flag_b,
                     shared.size(), shared.front() + 1, consequence);
}

loaded_data load_data(const data_options& o) {
    loaded_data out;
    if (o.train.empty()) {
        HSLIDE_CHECK(o.test.empty() && o.test_split.empty() && o.train_split.empty(),
                     "--test/--test-split/--train-split need --train (without --train, synthetic "
                     "data is used)");
        synthetic_config sc;
        sc.preset = o.preset;
        sc.scale = o.scale;
        sc.n_labels = o.labels;
        sc.n_features = o.features;
        sc.seed = o.data_seed;
        const auto t0 = std::chrono::steady_clock::now();
        synthetic_data data = generate_synthetic(sc, o.show_progress);
        spdlog::info(
            "synthetic '{}' (scale {}): {} train / {} test points, {} features, {} labels ({:.1f} "
            "s)",
            o.preset, o.scale, data.train.size(), data.test.size(), data.train.n_features,
            data.train.n_labels,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        out.train = std::move(data.train);
        out.test = std::move(data.test);
        return out;
    }
    dataset train_file = load_file(o, o.train);
    const std::string test_path = !o.test.empty() ? o.test : (!o.test_split.empty() ? o.train : "");
    dataset test_file;
    if (!test_path.empty()) test_file = test_path == o.train ? train_file : load_file(o, test_path);
    if (!o.train_split.empty()) {
        out.train_rows = read_split(o.train_split, o.split_column, train_file.size());
        out.train = subset(train_file, out.train_rows);
    } else {
        out.train = std::move(train_file);
    }
    if (!o.test_split.empty()) {
        const std::vector<uint32_t> test_rows =
            read_split(o.test_split, o.split_column, test_file.size());
        if (!o.train_split.empty() && test_path == o.train)
            warn_shared_rows("--train-split " + o.train_split, out.train_rows,
                             "--test-split " + o.test_split, test_rows,
                             "the test scores points the model trains on");
        out.test = subset(test_file, test_rows);
    } else {
        out.test = std::move(test_file);
    }
    // Files without a header (LibSVM) only know the largest id they saw: use one size for both.
    const uint64_t d = std::max(out.train.n_features, out.test.n_features);
    const uint64_t l = std::max(out.train.n_labels, out.test.n_labels);
    out.train.n_features = out.test.n_features = d;
    out.train.n_labels = out.test.n_labels = l;
    return out;
}

// CLI11 would take "-1" for an unsigned option as its largest value, saturate a value past
// the type's range and let "nan" through every range check.
template <class T>
CLI::Validator number_of_type() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            const char* begin = text.c_str();
            const char* end = begin + text.size();
            if constexpr (std::is_floating_point_v<T>) {
                char* stop = nullptr;
                errno = 0;
                const double value = std::strtod(begin, &stop);
                if (text.empty() || stop != end || std::isspace(static_cast<unsigned char>(*begin)))
                    return fmt::format("must be a number, not '{}'", text);
                if (!std::isfinite(value) || errno == ERANGE ||
                    std::abs(value) > double(std::numeric_limits<T>::max()))
                    return fmt::format("must be a finite number, not {}", text);
            } else {
                T value{};
                const auto [stop, error] = std::from_chars(begin, end, value);
                if (text.empty() || error != std::errc() || stop != end)
                    return fmt::format("must be a whole number from {} to {}, not '{}'",
                                       std::numeric_limits<T>::min(), std::numeric_limits<T>::max(),
                                       text);
            }
            return {};
        },
        "", "number");
}

CLI::Validator meets(const option_check& check) {
    return CLI::Validator(
        [check](std::string& text) {
            return option_value_problem(check, std::strtod(text.c_str(), nullptr));
        },
        "", "check");
}

CLI::Validator not_empty() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            return text.empty() ? "an empty value (leave the option out for none)" : "";
        },
        "", "not empty");
}

template CLI::Validator number_of_type<int>();
template CLI::Validator number_of_type<uint32_t>();
template CLI::Validator number_of_type<uint64_t>();
template CLI::Validator number_of_type<float>();
template CLI::Validator number_of_type<double>();

namespace {
/// Whether two paths name one file: the same file where both exist (links, relative spellings),
/// else the same path once made absolute.
bool same_file(const std::string& a, const std::string& b) {
    namespace fs = std::filesystem;
    std::error_code ec_a, ec_b;
    if (fs::exists(a, ec_a) && fs::exists(b, ec_b)) return fs::equivalent(a, b, ec_a) && !ec_a;
    const fs::path canonical_a = fs::weakly_canonical(a, ec_a);
    const fs::path canonical_b = fs::weakly_canonical(b, ec_b);
    return ec_a || ec_b ? a == b : canonical_a == canonical_b;
}
}  // namespace

std::string config_path(const CLI::App& app) {
    const CLI::Option* config = app.get_config_ptr();
    return config && config->count() ? config->as<std::string>() : "";
}

void check_outputs_apart(const std::vector<named_path>& inputs,
                         const std::vector<named_path>& outputs) {
    for (size_t o = 0; o < outputs.size(); ++o) {
        const named_path& out = outputs[o];
        if (out.path.empty()) continue;
        for (const named_path& in : inputs)
            HSLIDE_CHECK(in.path.empty() || !same_file(out.path, in.path),
                         "{} {} is the {} file: writing there would destroy what it holds (give "
                         "another path)",
                         out.flag, out.path, in.flag);
        for (size_t other = 0; other < o; ++other)
            HSLIDE_CHECK(outputs[other].path.empty() || !same_file(out.path, outputs[other].path),
                         "{} {} is the {} file too: one would overwrite the other (give another "
                         "path)",
                         out.flag, out.path, outputs[other].flag);
    }
}

namespace {
// A list option's default as it is typed (`4` or `256,128`): CLI11 would print "[4]", which
// --print-config writes as a quoted string.
template <class T>
std::string list_text(const std::vector<T>& values) {
    return fmt::format("{}", fmt::join(values, ","));
}

template <class T>
struct is_list : std::false_type {};
template <class T>
struct is_list<std::vector<T>> : std::true_type {};
template <class T>
struct element_of {
    using type = T;
};
template <class T>
struct element_of<std::vector<T>> {
    using type = T;
};

CLI::Option* add_table_option(CLI::App& app, const option_spec& o, train_settings& s) {
    const std::string flags = (o.short_name.empty() ? "" : o.short_name + ",") + "--" + o.name;
    CLI::Option* option = std::visit(
        [&](auto* target) {
            using T = std::remove_pointer_t<decltype(target)>;
            CLI::Option* added = nullptr;
            if constexpr (std::is_same_v<T, bool>) {
                added = app.add_flag(flags, *target, o.help);
            } else if constexpr (is_list<T>::value) {
                added = app.add_option(flags, *target, o.help)
                            ->delimiter(',')
                            ->default_str(list_text(*target));
            } else {
                added = app.add_option(flags, *target, o.help)->capture_default_str();
            }
            using element = typename element_of<T>::type;
            if constexpr (std::is_arithmetic_v<element> && !std::is_same_v<element, bool>) {
                added->check(number_of_type<element>());
                if (o.check.which != option_check::kind::none) added->check(meets(o.check));
            } else if constexpr (std::is_same_v<element, std::string>) {
                added->check(not_empty());
            }
            return added;
        },
        o.target(s));
    option->group(title(o.group));
    if (!o.choices.empty()) option->check(CLI::IsMember(o.choices));
    return option;
}

/// The table's entries that fill model_options (the network), by the setting's address.
bool fills_model(const option_spec& o) {
    train_settings probe;
    const auto* begin = reinterpret_cast<const char*>(&probe.model);
    const auto* end = begin + sizeof(probe.model);
    return std::visit(
        [&](auto* target) {
            const auto* at = reinterpret_cast<const char*>(target);
            return at >= begin && at < end;
        },
        o.target(probe));
}
}  // namespace

std::vector<CLI::Option*> add_table_options(CLI::App& app, train_settings& s,
                                            const std::vector<std::string>& names) {
    std::vector<CLI::Option*> added;
    for (const std::string& name : names)
        HSLIDE_ASSERT(find_option(name) != nullptr);  // a typo in a command's list
    for (const option_spec& o : train_option_table()) {
        if (names.empty() ? o.surface == option_surface::python
                          : std::find(names.begin(), names.end(), o.name) == names.end())
            continue;
        added.push_back(add_table_option(app, o, s));
    }
    return added;
}

std::vector<CLI::Option*> model_flags(const std::vector<CLI::Option*>& options) {
    std::vector<CLI::Option*> out;
    for (CLI::Option* option : options) {
        const option_spec* o = find_option(option->get_single_name());
        if (o && fills_model(*o)) out.push_back(option);
    }
    return out;
}

void apply_compute_options(const compute_options& o, backend_options& backend) {
    if (o.isa != "auto") set_active_isa(parse_isa(o.isa));
    backend.precision = parse_precision(o.precision);
    backend.device = o.gpu;
    backend.gpu_async_rebuild = o.gpu_async_rebuild;
}

rank_backend check_rank_backend(shard_comm& comm, backend_kind kind,
                                const compute_options& compute) {
    HSLIDE_CHECK_KIND(kind == backend_kind::cpu || kind == backend_kind::gpu,
                      error_kind::unsupported,
                      "--backend {}: only --backend cpu and --backend gpu run sharded across MPI "
                      "ranks ({} ranks)",
                      to_string(kind), comm.size());
    // What decides the replicated layers' roundings: the backend, a CPU's instruction set
    // (its kernels sum in other orders), the precision.
    const std::string arithmetic =
        fmt::format("{} {}{}", to_string(kind),
                    kind == backend_kind::gpu
                        ? ""
                        : std::string(to_string(compute.isa == "auto" ? active_isa()
                                                                      : parse_isa(compute.isa))) +
                              " ",
                    compute.precision);
    std::array<char, 48> mine{};
    std::snprintf(mine.data(), mine.size(), "%s", arithmetic.c_str());
    std::vector<std::array<char, 48>> all(size_t(comm.size()));
    comm.all_gather(mine.data(), mine.size(), all.data());
    rank_backend out;
    out.gpu = compute.gpu;
    std::string ranks;
    for (size_t r = 0; r < all.size(); ++r) {
        out.replicas_differ |= std::strcmp(all[r].data(), all[0].data()) != 0;
        ranks += fmt::format("{}rank {}: {}", r ? ", " : "", r, all[r].data());
    }
    if (out.replicas_differ && comm.rank() == 0)
        spdlog::info(
            "the ranks compute the replicated layers differently ({}): their roundings differ, "
            "so rank 0's are copied to every rank at each epoch's end",
            ranks);
    if (kind == backend_kind::gpu && gpu_count() > 0)
        out.gpu = (compute.gpu + launched_local_rank()) % gpu_count();
    return out;
}

void add_hybrid_worker_help(CLI::App& app) {
    CLI::Option* workers = app.get_option("--workers");
    workers->description(
        workers->get_description() + " (kinds: " +
        join_names(backend_names([](const backend_entry& e) { return e.caps.hybrid_worker; })) +
        ")");
}

std::string join_names(const std::vector<std::string>& names) {
    std::string out;
    for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
    return out;
}

void restrict_backends(CLI::App& app, bool (*keep)(const backend_entry&)) {
    const std::vector<std::string> names = backend_names(keep);
    app.footer("Backends, and what each supports:\n" + describe_backends());
    CLI::Option* backend = app.get_option("--backend");
    backend->description("where to compute: " + join_names(names) + " (see Backends below)");
    backend->check(CLI::IsMember(names));
}

hybrid_options make_hybrid_options(const hybrid_cli& o, const backend_options& device,
                                   const train_config& train) {
    auto split = [](const std::string& text) {
        std::vector<std::string> parts;
        std::stringstream in(text);
        for (std::string part; std::getline(in, part, ',');) parts.push_back(part);
        return parts;
    };
    const std::vector<std::string> names = split(o.workers);
    const size_t n = names.size();
    HSLIDE_CHECK(n > 0, "--workers names no worker");
    const std::vector<std::string> worker_kinds =
        backend_names([](const backend_entry& e) { return e.caps.hybrid_worker; });
    std::vector<backend_kind> kinds;
    for (const std::string& name : names) {
        HSLIDE_CHECK(
            std::find(worker_kinds.begin(), worker_kinds.end(), name) != worker_kinds.end(),
            "--workers: unknown worker '{}' ({})", name, join_names(worker_kinds));
        kinds.push_back(parse_backend_kind(name));
    }
    auto on_gpu = [&](size_t i) { return backend_entry_of(kinds[i]).caps.needs_gpu; };
    // The i-th value of a list flag as a number, the one value standing for every worker.
    auto value = [&](const std::string& text, const char* flag, size_t i) {
        const std::vector<std::string> values = split(text);
        HSLIDE_CHECK(values.size() == 1 || values.size() == n,
                     "{} has {} values for {} hybrid workers (give one, or one per worker)", flag,
                     values.size(), n);
        const std::string& v = values.size() == 1 ? values[0] : values[i];
        size_t used = 0;
        double x = 0;
        try {
            x = std::stod(v, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        HSLIDE_CHECK(used == v.size() && used > 0 && x >= 0, "{}: '{}' is not a number >= 0", flag,
                     v);
        return x;
    };
    std::vector<int> requested(n, 0);
    for (size_t i = 0; i < n; ++i)
        if (!on_gpu(i))
            requested[i] =
                check_thread_count(value(o.threads, "--worker-threads", i), "--worker-threads");
    const std::vector<int> threads = split_worker_threads(
        kinds, requested, train.threads > 0 ? train.threads : omp_get_max_threads());
    bool beside_gpu = false;
    for (size_t i = 0; i < n; ++i) beside_gpu = beside_gpu || on_gpu(i);
    hybrid_options h;
    h.policy = parse_schedule_policy(o.policy);
    h.reference_batch = train.batch_size;
    h.merge_every = o.merge_every;
    h.first_layer_merge_every = o.first_layer_merge_every;
    h.min_batch = o.min_batch;
    h.max_batch = o.max_batch;
    h.park_below_share = o.park_below_share;
    for (size_t i = 0; i < n; ++i) {
        hybrid_worker_options w;
        w.device = device;
        w.device.kind = kinds[i];
        if (!on_gpu(i)) w.device.threads = threads[i];
        w.merge_threads = o.merge_threads;
        if (o.batch == "auto") {
            w.batch_size = on_gpu(i)    ? 8 * train.batch_size
                           : beside_gpu ? std::max(1u, train.batch_size / 4)
                                        : train.batch_size;
        } else {
            w.batch_size = uint32_t(value(o.batch, "--worker-batch", i));
        }
        HSLIDE_CHECK(w.batch_size > 0, "--worker-batch sizes must be positive");
        w.update_share = value(o.share, "--update-share", i);
        HSLIDE_CHECK(w.update_share > 0, "--update-share values must be positive");
        const std::vector<std::string> sparsity = split(o.output_sparsity);
        HSLIDE_CHECK(sparsity.size() == 1 || sparsity.size() == n,
                     "--worker-output-sparsity has {} values for {} hybrid workers (give one, or "
                     "one per worker)",
                     sparsity.size(), n);
        const std::string& own = sparsity.size() == 1 ? sparsity[0] : sparsity[i];
        if (own != "model") w.output_sparsity = parse_sparsity(own);
        h.workers.push_back(w);
    }
    return h;
}

void add_config_option(CLI::App& app, const std::string& help) {
    app.set_config("--config", "", help);
    app.allow_config_extras(CLI::config_extras_mode::error);
}

namespace {
/// The first list option (one with a delimiter) given more than once on the command line:
/// CLI11 would append the second's values to the first's (--hidden 8 --hidden 8,8: three
/// layers).
const CLI::Option* repeated_list(const CLI::App& app, int argc, char** argv) {
    for (const CLI::Option* option : app.get_options()) {
        if (option->get_delimiter() == '\0') continue;
        int seen = 0;
        for (int i = 1; i < argc; ++i) {
            const std::string arg = argv[i];
            if (arg == "--") break;
            for (const std::string& name : option->get_lnames())
                if (arg == "--" + name || arg.rfind("--" + name + "=", 0) == 0) ++seen;
        }
        if (seen > 1) return option;
    }
    return nullptr;
}
}  // namespace

namespace {
/// The --config file a command line names ("" = none), read before CLI11 parses it.
std::string config_argument(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--") break;
        if (arg == "--config" && i + 1 < argc) return argv[i + 1];
        if (arg.rfind("--config=", 0) == 0) return arg.substr(9);
    }
    return "";
}

/// Checks a config file's lines before CLI11 reads it: CLI11 names no line in its errors, took
/// `hidden = [8, 16` (a bracket never closed) as a value, and let a key given twice override
/// itself. Each line is blank, a comment (# or ;), a [section] or key = value; a value's
/// brackets and quotes close (brackets may span lines); no key is given twice.
void check_config_lines(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
        throw input_error(path, 0, fmt::format("--config: cannot open ({})", std::strerror(errno)));
    std::map<std::string, size_t> seen;
    size_t line_no = 0, open_line = 0;
    int depth = 0;
    for (std::string line; std::getline(in, line);) {
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find('\0') != std::string::npos)
            throw input_error(path, line_no, "a NUL byte: a config file is text");
        const size_t start = line.find_first_not_of(" \t");
        if (depth == 0) {
            if (start == std::string::npos || line[start] == '#' || line[start] == ';') continue;
            if (line[start] == '[') continue;  // a section (CLI11 reads [name] as a prefix)
            const size_t eq = line.find('=');
            if (eq == std::string::npos)
                throw input_error(path, line_no,
                                  fmt::format("'{}' is no 'key = value' line", line.substr(start)));
            std::string key = line.substr(start, eq - start);
            key.erase(key.find_last_not_of(" \t") + 1);
            if (const auto [at, fresh] = seen.emplace(key, line_no); !fresh)
                throw input_error(
                    path, line_no,
                    fmt::format("'{}' is given again (first on line {})", key, at->second));
            open_line = line_no;
            line = line.substr(eq + 1);
        }
        char quote = 0;
        for (size_t i = 0; i < line.size(); ++i) {
            const char c = line[i];
            if (quote) {
                if (c == quote) quote = 0;
                // CLI11 ends the value there, quotes or not: "/data/a#b" would name "/data/a".
                if (c == '#')
                    throw input_error(path, line_no,
                                      "a '#' inside a quoted value, which the config reader "
                                      "takes for a comment: give that value as a flag");
            } else if (c == '"' || c == '\'') {
                quote = c;
            } else if (c == '#' && depth == 0) {
                break;
            } else if (c == '[') {
                ++depth;
            } else if (c == ']') {
                if (--depth < 0) throw input_error(path, line_no, "a ']' that closes no '['");
                // CLI11 reads the lines after such a list as its values.
                if (depth == 0 && line_no != open_line &&
                    line.find_first_not_of(" \t", i + 1) != std::string::npos)
                    throw input_error(path, line_no,
                                      fmt::format("text after the ']' that ends the list of line "
                                                  "{}: put a comment on a line of its own",
                                                  open_line));
            }
        }
        if (quote) throw input_error(path, line_no, fmt::format("a {} quote never closed", quote));
    }
    if (depth > 0) throw input_error(path, open_line, "a '[' never closed (a list is [a, b])");
}
}  // namespace

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv, bool train_table) {
    try {
        const std::string config = config_argument(argc, argv);
        if (!config.empty() && app.get_config_ptr()) check_config_lines(config);
    } catch (const input_error& e) {
        std::fprintf(stderr, "%s: error: %s\n", app.get_name().c_str(), e.what());
        return 2;
    }
    if (const CLI::Option* twice = repeated_list(app, argc, argv)) {
        std::fprintf(
            stderr,
            "%s: error: %s is given more than once; a list is one value (e.g. %s 256,128)\n",
            app.get_name().c_str(), twice->get_name().c_str(), twice->get_name().c_str());
        return 2;
    }
    try {
        app.parse(argc, argv);
        return std::nullopt;
    } catch (const CLI::ConfigError& e) {
        // CLI11 says "INI was not able to parse KEY": name the file and what keys it takes.
        const std::string path = config_path(app);
        std::fprintf(stderr, "%s: error: %s%s (config keys are the long flag names; see --help)\n",
                     app.get_name().c_str(), path.empty() ? "" : (path + ": ").c_str(), e.what());
        return 2;
    } catch (const CLI::ExtrasError& e) {
        for (const std::string& extra : app.remaining()) {
            if (!train_table || extra.rfind("--", 0) != 0 || extra.size() < 3) continue;
            const std::string name = extra.substr(2, extra.find('=') - 2);
            std::fprintf(stderr, "%s: error: %s; see --help\n", app.get_name().c_str(),
                         unknown_option_message(name, option_surface::cli, '-').c_str());
            return 2;
        }
        return app.exit(e) == 0 ? 0 : 2;
    } catch (const CLI::ValidationError& e) {
        // "--batch-size: must be more than 0, not -5", in the form of the command's other errors.
        std::fprintf(stderr, "%s: error: %s; see --help\n", app.get_name().c_str(), e.what());
        return 2;
    } catch (const CLI::ConversionError& e) {
        std::fprintf(stderr, "%s: error: %s; see --help\n", app.get_name().c_str(), e.what());
        return 2;
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
}

bool apply_output_options(const output_options& o) {
    setup_logging(o.log_level, o.quiet);
    return !o.quiet && !o.no_progress;
}

}  // namespace hslide::cli
