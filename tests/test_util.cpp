// Helpers shared by the tests (see test_util.hpp).
#include "test_util.hpp"

#include "hslide/rng.hpp"
#include "hslide/synthetic.hpp"

#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace hslide::testing {

dataset tiny_synthetic_train(uint64_t seed) {
    synthetic_config sc;
    sc.preset = "tiny";
    sc.scale = 0.5;
    sc.n_labels = 200;
    sc.n_features = 1000;
    sc.seed = seed;
    return generate_synthetic(sc).train;
}

lsh_config make_lsh_config(hash_kind kind, int K, int L, int bits, int capacity,
                           insertion_policy policy) {
    lsh_config c;
    c.kind = kind;
    c.K = K;
    c.L = L;
    c.bits_per_hash = bits;
    c.bucket_capacity = capacity;
    c.policy = policy;
    return c;
}

model_config two_layer_model(uint32_t input_dim, uint32_t hidden, uint32_t outputs,
                             sparsity_mode output) {
    model_config c;
    c.input_dim = input_dim;
    layer_config l;
    l.size = hidden;
    c.layers.push_back(l);
    l.size = outputs;
    l.sparsity = output;
    c.layers.push_back(l);
    return c;
}

dataset label_dataset(const std::vector<std::vector<uint32_t>>& rows, uint64_t n_labels) {
    dataset data;
    data.n_labels = n_labels;
    for (const auto& row : rows) {
        data.label_ids.insert(data.label_ids.end(), row.begin(), row.end());
        data.label_offsets.push_back(data.label_ids.size());
        data.feature_offsets.push_back(0);
    }
    return data;
}

dataset random_dataset(uint32_t n, uint32_t features, uint32_t labels, uint64_t seed,
                       uint32_t unlabelled_every) {
    dataset d;
    d.source = "random";
    d.n_features = features;
    d.n_labels = labels;
    rng gen(seed);
    for (uint32_t p = 0; p < n; ++p) {
        std::vector<uint32_t> f(features);
        std::iota(f.begin(), f.end(), 0u);
        shuffle(f.begin(), f.end(), gen);
        f.resize(2 + gen.below(5));
        std::sort(f.begin(), f.end());
        std::vector<float> v(f.size());
        for (auto& x : v) x = float(0.2f + gen.uniform());
        std::vector<uint32_t> y(labels);
        std::iota(y.begin(), y.end(), 0u);
        shuffle(y.begin(), y.end(), gen);
        y.resize(1 + gen.below(3));
        if (unlabelled_every && p % unlabelled_every == unlabelled_every - 1) y.clear();
        d.push_back(f.data(), v.data(), uint32_t(f.size()), y.data(), uint32_t(y.size()));
    }
    return d;
}

std::string shared_data_dir() {
    const char* env = std::getenv("HSLIDE_SHARED_DATA");
    std::string dir = env ? env : HSLIDE_SHARED_DATA_DIR;
    std::error_code ec;
    if (std::filesystem::is_directory(dir + "/bibtex", ec)) return dir;
    return "";
}

temp_dir::temp_dir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "hslide_test_XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
}

temp_dir::~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
    if (!out) throw std::runtime_error("cannot write " + path);
}

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::vector<std::string> read_lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

double last_p_at_1(const std::string& metrics_path) {
    const std::vector<std::string> lines = read_lines(metrics_path);
    if (lines.empty()) return std::numeric_limits<double>::quiet_NaN();
    return nlohmann::json::parse(lines.back())
        .value("p@1", std::numeric_limits<double>::quiet_NaN());
}

std::string bibtex_train_flags() {
    const std::string dir = shared_data_dir() + "/bibtex/";
    return "--train " + dir + "Bibtex_data.txt --train-split " + dir +
           "bibtex_trSplit.txt --test-split " + dir + "bibtex_tstSplit.txt ";
}

std::vector<isa_level> bf16_search_levels() {
    std::vector<isa_level> levels;
    for (isa_level level : {isa_level::avx512bf16, isa_level::amx})
        if (isa_supported(level) && cpu_exact_search_in_bf16(level)) levels.push_back(level);
    return levels;
}

std::vector<isa_level> copy_search_levels() {
    std::vector<isa_level> levels;
    for (isa_level level :
         {isa_level::avx2, isa_level::avx512, isa_level::avx512bf16, isa_level::amx})
        if (isa_supported(level) &&
            (cpu_exact_search_in_int8(level) || cpu_exact_search_in_bf16(level)))
            levels.push_back(level);
    return levels;
}

std::vector<std::string> files_in(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir))
        names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

file_size_limit::file_size_limit(uint64_t bytes) {
    struct rlimit rl {};
    getrlimit(RLIMIT_FSIZE, &rl);
    old_soft_ = rl.rlim_cur;
    rl.rlim_cur = bytes;
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &rl);
}

file_size_limit::~file_size_limit() {
    struct rlimit rl {};
    getrlimit(RLIMIT_FSIZE, &rl);
    rl.rlim_cur = old_soft_;
    setrlimit(RLIMIT_FSIZE, &rl);
    std::signal(SIGXFSZ, old_handler_);
}

command_result run_hslide(const std::string& args) {
    // $HSLIDE_BINARY overrides the build's path: scripts/gpu_check.sh runs packed binaries.
    const char* binary = std::getenv("HSLIDE_BINARY");
    const std::string cmd =
        std::string(binary && *binary ? binary : HSLIDE_BINARY_PATH) + " " + args + " 2>&1";
    FILE* pipe = popen(cmd.c_str(), "r");
    if (!pipe) throw std::runtime_error("popen failed");
    std::string output;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) output.append(buf.data(), n);
    const int status = pclose(pipe);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output};
}

const std::string& generated_data_dir(const std::string& gen_args) {
    static std::map<std::string, temp_dir> dirs;
    auto [it, made] = dirs.try_emplace(gen_args);
    if (made) {
        const auto r =
            run_hslide("gen --preset tiny " + gen_args + " --out " + it->second.path() + " -q");
        if (r.exit_code != 0) throw std::runtime_error("hslide gen failed: " + r.output);
    }
    return it->second.path();
}

double max_parameter_difference(const layer_state& a, const layer_state& b) {
    double worst = 0;
    for (uint32_t r = 0; r < a.rows; ++r)
        for (uint32_t i = 0; i < a.width; ++i)
            worst = std::max(worst, double(std::abs(a.row(r)[i] - b.row(r)[i])));
    for (size_t j = 0; j < a.bias.size(); ++j)
        worst = std::max(worst, double(std::abs(a.bias[j] - b.bias[j])));
    return worst;
}

size_t parameters_differing_by_more(const layer_state& a, const layer_state& b, double tolerance) {
    size_t n = 0;
    for (uint32_t r = 0; r < a.rows; ++r)
        for (uint32_t i = 0; i < a.width; ++i) n += std::abs(a.row(r)[i] - b.row(r)[i]) > tolerance;
    for (size_t j = 0; j < a.bias.size(); ++j) n += std::abs(a.bias[j] - b.bias[j]) > tolerance;
    return n;
}

double max_parameter_difference(const model_state& a, const model_state& b) {
    double worst = 0;
    for (size_t l = 0; l < a.layers.size(); ++l)
        worst = std::max(worst, max_parameter_difference(a.layers[l], b.layers[l]));
    return worst;
}

}  // namespace hslide::testing
