// Helpers shared by the tests: the shared data folder, temporary directories, running the
// hslide binary.
#pragma once

#include <gtest/gtest.h>

#include "hslide/config.hpp"
#include "hslide/dataset.hpp"
#include "hslide/isa.hpp"
#include "hslide/lsh.hpp"
#include "hslide/model.hpp"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace hslide::testing {

/// Bit for bit: the same bytes (NaN-safe, unlike ==).
template <class Array>
bool same_bytes(const Array& a, const Array& b) {
    return a.size() == b.size() &&
           (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
}

/// The training points of the tiny synthetic preset at scale 0.5 with 200 labels and 1,000
/// features, drawn with `seed` (the trainer's tests' small real-looking set).
dataset tiny_synthetic_train(uint64_t seed);

/// Expects every layer's weights and biases (not Adam state) the same bit for bit.
inline void expect_same_parameters(const model_state& a, const model_state& b) {
    ASSERT_EQ(a.layers.size(), b.layers.size());
    for (size_t l = 0; l < a.layers.size(); ++l) {
        EXPECT_TRUE(same_bytes(a.layers[l].weights, b.layers[l].weights)) << "layer " << l;
        EXPECT_TRUE(same_bytes(a.layers[l].bias, b.layers[l].bias)) << "layer " << l;
    }
}

/// The ../shared/data folder beside the checkout, or "" when this clone has none.
std::string shared_data_dir();

/// Skips the current test with a message when ../shared/data is absent (a user's clone).
#define HSLIDE_REQUIRE_SHARED_DATA()                                                         \
    do {                                                                                     \
        if (::hslide::testing::shared_data_dir().empty())                                    \
            GTEST_SKIP() << "../shared/data not found beside the checkout; this test needs " \
                            "the real datasets (CI has them)";                               \
    } while (0)

/// A fresh, empty directory removed when the object dies.
class temp_dir {
  public:
    temp_dir();
    ~temp_dir();
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    const std::string& path() const { return path_; }
    /// path() + "/" + name
    std::string file(const std::string& name) const { return path_ + "/" + name; }

  private:
    std::string path_;
};

/// Writes `text` to `path` verbatim (binary mode, so CRLF stays CRLF).
void write_text(const std::string& path, const std::string& text);

/// Reads a whole file.
std::string read_text(const std::string& path);

/// The lines of a text file (none when it is missing).
std::vector<std::string> read_lines(const std::string& path);

/// P@1 of the last record of a --metrics-out file; NaN when it has none (so any comparison
/// fails).
double last_p_at_1(const std::string& metrics_path);

/// `--train ... --train-split ... --test-split ... ` for the shared Bibtex files (callers
/// check HSLIDE_REQUIRE_SHARED_DATA first).
std::string bibtex_train_flags();

/// The result of running the hslide binary.
struct command_result {
    int exit_code;
    std::string output;  // stdout and stderr together
};

/// An LSH configuration with the given family, shape and bucket policy.
lsh_config make_lsh_config(hash_kind kind, int K, int L, int bits, int capacity = 128,
                           insertion_policy policy = insertion_policy::fifo);

/// input_dim -> hidden (dense, ReLU) -> outputs, the output layer `output` sparse or dense
/// with the default LSH and active-set settings.
model_config two_layer_model(uint32_t input_dim, uint32_t hidden, uint32_t outputs,
                             sparsity_mode output);

/// A random dataset: `n` points, 2..6 distinct features with values in [0.2, 1.2), 1..3
/// distinct labels; with `unlabelled_every` > 0, every unlabelled_every-th point has no labels
/// (training skips it but counts it in the batch mean).
dataset random_dataset(uint32_t n, uint32_t features, uint32_t labels, uint64_t seed,
                       uint32_t unlabelled_every = 0);

/// A dataset holding only labels (no features), one point per element of `rows`, built
/// without the readers.
dataset label_dataset(const std::vector<std::vector<uint32_t>>& rows, uint64_t n_labels);

/// The largest |a - b| over two layers' weights (width columns) and biases.
double max_parameter_difference(const layer_state& a, const layer_state& b);
/// The same over every layer of two models of one shape.
double max_parameter_difference(const model_state& a, const model_state& b);
/// How many weights and biases of two same-shaped layers differ by more than `tolerance`.
size_t parameters_differing_by_more(const layer_state& a, const layer_state& b, double tolerance);

/// The ISA levels this CPU runs whose automatic exact top-k search scores a bf16 copy of the
/// rows (cpu_exact_search_in_bf16): avx512bf16 and amx where supported.
std::vector<isa_level> bf16_search_levels();
/// The ISA levels this CPU runs whose automatic exact top-k search scores a copy of the rows,
/// int8 (cpu_exact_search_in_int8: avx2 up, where the level has 8-bit products) or bf16.
std::vector<isa_level> copy_search_levels();

/// The names in a folder, sorted (no "." or "..").
std::vector<std::string> files_in(const std::string& dir);

/// Limits the size of files this process writes (RLIMIT_FSIZE, with SIGXFSZ ignored so that a
/// write past it fails with EFBIG) while the object lives: a full disk, for tests.
class file_size_limit {
  public:
    explicit file_size_limit(uint64_t bytes);
    ~file_size_limit();
    file_size_limit(const file_size_limit&) = delete;
    file_size_limit& operator=(const file_size_limit&) = delete;

  private:
    uint64_t old_soft_ = 0;
    void (*old_handler_)(int) = nullptr;
};

/// Runs `build/hslide <args>` ($HSLIDE_BINARY when set) through the shell and captures its
/// output.
command_result run_hslide(const std::string& args);

/// The folder of `hslide gen --preset tiny <gen_args> --out DIR` (train.txt, test.txt), made
/// once per test binary and distinct arguments, in a temporary folder removed at exit.
const std::string& generated_data_dir(const std::string& gen_args = "--seed 5");

}  // namespace hslide::testing
