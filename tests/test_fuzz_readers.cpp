// A mutation fuzzer driven by GoogleTest, one target per reader (XC, LibSVM, XC split files)
// and for the checkpoint and dataset-cache loaders. Seeds come from tests/fuzz_corpus and from
// files the test writes; each target mutates them (bit flips, inserted tokens, cuts, splices,
// and for the binary formats structured forgeries with checksums recomputed) for a bounded
// time: HSLIDE_FUZZ_SECONDS per target (default 1; scripts/test.sh --sanitize gives more).
// Every input must either load (and then pass the shared input check) or be refused with an
// hslide::error; anything else (another exception, a crash or a sanitizer report) fails.
#include "hslide/checkpoint.hpp"
#include "hslide/checkpoint_file.hpp"
#include "hslide/dataset.hpp"
#include "hslide/input_check.hpp"
#include "hslide/lsh.hpp"
#include "test_util.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using hslide::testing::read_text;
using hslide::testing::temp_dir;
using hslide::testing::write_text;

double fuzz_seconds() {
    const char* s = std::getenv("HSLIDE_FUZZ_SECONDS");
    const double v = s ? std::atof(s) : 1.0;
    return v > 0 ? v : 1.0;
}

std::string corpus(const std::string& name) {
    return read_text(std::string(HSLIDE_SOURCE_DIR) + "/tests/fuzz_corpus/" + name);
}

// Tokens that have broken readers before, or sit at their limits.
const char* const tokens[] = {"nan",
                              "inf",
                              "-inf",
                              "1e-400",
                              "1e400",
                              "-1",
                              "4294967295",
                              "4294967296",
                              "18446744073709551616",
                              ":",
                              ",",
                              ",,",
                              " ",
                              "\t",
                              "\r\n",
                              "\n",
                              "\n\n",
                              "0:",
                              ":1",
                              "+",
                              "-",
                              "e",
                              ".",
                              "0x1p3",
                              std::string("\0", 1).c_str(),
                              "\xef\xbb\xbf",
                              "99999999999",
                              "1,1",
                              "0:1 0:2",
                              "[",
                              "]",
                              "{",
                              "}",
                              "\"",
                              "\\"};

/// One random mutation of `s` (never longer than `max_size`).
std::string mutate(std::string s, std::mt19937_64& gen, size_t max_size = 1 << 16) {
    auto pick = [&](size_t n) { return n ? size_t(gen() % n) : 0; };
    const int rounds = 1 + int(gen() % 4);
    for (int r = 0; r < rounds; ++r) {
        switch (gen() % 7) {
            case 0:  // flip a bit
                if (!s.empty()) s[pick(s.size())] ^= char(1u << (gen() % 8));
                break;
            case 1:  // a random byte
                if (!s.empty()) s[pick(s.size())] = char(gen());
                break;
            case 2:  // insert a token
                s.insert(pick(s.size() + 1), tokens[pick(std::size(tokens))]);
                break;
            case 3:  // delete a range
                if (!s.empty()) {
                    const size_t at = pick(s.size());
                    s.erase(at, 1 + pick(std::min<size_t>(16, s.size() - at)));
                }
                break;
            case 4:  // truncate
                s.resize(pick(s.size() + 1));
                break;
            case 5:  // duplicate a range (lines, points)
                if (!s.empty()) {
                    const size_t at = pick(s.size());
                    const std::string piece = s.substr(at, 1 + pick(64));
                    s.insert(pick(s.size() + 1), piece);
                }
                break;
            default:  // replace a digit run with a token
                if (!s.empty()) {
                    size_t at = pick(s.size());
                    while (at < s.size() && !std::isdigit(static_cast<unsigned char>(s[at]))) ++at;
                    size_t end = at;
                    while (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end])))
                        ++end;
                    s.replace(at, end - at, tokens[pick(std::size(tokens))]);
                }
                break;
        }
    }
    if (s.size() > max_size) s.resize(max_size);
    return s;
}

/// Runs `target` on mutations of `seeds` for fuzz_seconds(); returns (inputs, accepted).
std::pair<size_t, size_t> fuzz(const std::vector<std::string>& seeds, uint64_t seed,
                               const std::function<void(const std::string&)>& target) {
    std::mt19937_64 gen(seed);
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(fuzz_seconds());
    size_t inputs = 0, accepted = 0;
    for (const std::string& s : seeds) {  // the seeds themselves first (regressions)
        ++inputs;
        try {
            target(s);
            ++accepted;
        } catch (const hslide::error&) {
        }
    }
    while (std::chrono::steady_clock::now() < until) {
        std::string input = mutate(seeds[gen() % seeds.size()], gen);
        if (gen() % 8 == 0) {  // splice two seeds
            const std::string& other = seeds[gen() % seeds.size()];
            input = input.substr(0, input.size() / 2) + other.substr(other.size() / 2);
        }
        ++inputs;
        try {
            target(input);
            ++accepted;
        } catch (const hslide::error&) {
        } catch (const std::exception& e) {
            ADD_FAILURE() << "not an hslide::error: " << e.what() << "\ninput (" << input.size()
                          << " bytes): " << input.substr(0, 200);
            return {inputs, accepted};
        }
    }
    return {inputs, accepted};
}

void expect_valid(const hslide::dataset& d) {
    EXPECT_EQ(hslide::dataset_problem(d), "");
}

TEST(FuzzReaders, Xc) {
    const auto [inputs, accepted] =
        fuzz({corpus("xc_small.txt"), corpus("xc_regressions.txt")}, 1,
             [](const std::string& text) { expect_valid(hslide::parse_xc(text, "fuzz")); });
    EXPECT_GT(accepted, 0u);
    RecordProperty("inputs", int(inputs));
}

TEST(FuzzReaders, LibSvm) {
    const auto [inputs, accepted] =
        fuzz({corpus("libsvm_small.txt")}, 2, [](const std::string& text) {
            expect_valid(hslide::parse_libsvm(text, "fuzz"));
            hslide::detect_format(text);
        });
    EXPECT_GT(accepted, 0u);
    RecordProperty("inputs", int(inputs));
}

TEST(FuzzReaders, SplitFile) {
    temp_dir dir;
    const std::string path = dir.file("split.txt");
    const auto [inputs, accepted] = fuzz({corpus("split_small.txt")}, 3, [&](const std::string& s) {
        write_text(path, s);
        for (const uint32_t row : hslide::read_split(path, 1, 5)) EXPECT_LT(row, 5u);
    });
    EXPECT_GT(accepted, 0u);
    RecordProperty("inputs", int(inputs));
}

// A real checkpoint of a tiny model, written by the library.
std::string tiny_checkpoint(const temp_dir& dir) {
    const std::string path = dir.file("seed.ck");
    hslide::model_config mc =
        hslide::testing::two_layer_model(20, 8, 10, hslide::sparsity_mode::dense);
    const hslide::model_state m = hslide::model_state::create(mc, 7);
    hslide::trainer_state t;
    t.epochs_done = 1;
    hslide::save_checkpoint(path, m, t, std::vector<uint32_t>(10, 1), 3);
    return read_text(path);
}

// `seed`'s sections written to `path` as a valid container (checksums recomputed), with
// section `name`'s bytes replaced by `bytes`: a forged file.
void write_with_section(const hslide::checkpoint_reader& seed, const std::string& path,
                        const std::string& name, std::string_view bytes) {
    hslide::checkpoint_writer w(path);
    for (const std::string& section : seed.names()) {
        if (section == name) {
            w.add_string(section, bytes);
        } else {
            const auto v = seed.get(section);
            w.add(section, v.data, v.size);
        }
    }
    w.commit();
}

TEST(FuzzReaders, CheckpointBytes) {
    temp_dir dir;
    const std::string seed = tiny_checkpoint(dir);
    const std::string path = dir.file("m.ck");
    const auto [inputs, accepted] = fuzz({seed}, 4, [&](const std::string& bytes) {
        write_text(path, bytes);
        hslide::load_checkpoint(path);
    });
    EXPECT_GT(accepted, 0u);  // the seed
    RecordProperty("inputs", int(inputs));
}

TEST(FuzzReaders, CheckpointMetadataWithChecksumsRecomputed) {
    // The checksums stop random damage; a forged file recomputes them, so the metadata's
    // parser and range checks are what stand: mutate the JSON and write a valid container.
    temp_dir dir;
    const std::string seed_path = dir.file("seed.ck");
    write_text(seed_path, tiny_checkpoint(dir));
    const hslide::checkpoint_reader seed(seed_path);
    const std::string meta = seed.get_string("meta");
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    const std::string path = dir.file("m.ck");
    const auto [inputs, accepted] = fuzz(
        {meta, "{\"x\":" + deep + "}", meta.substr(0, meta.size() - 1) + ",\"d\":" + deep + "}"}, 5,
        [&](const std::string& text) {
            write_with_section(seed, path, "meta", text);
            hslide::load_checkpoint(path);
        });
    EXPECT_GT(accepted, 0u);
    RecordProperty("inputs", int(inputs));
}

TEST(FuzzReaders, ACheckpointWhoseValuesAreNotFiniteIsRefused) {
    // Checksums over a NaN written as it was: the model would score every label NaN and
    // evaluate to P@1 0 without a word. Each section, with one value made NaN or infinite.
    temp_dir dir;
    const std::string seed_path = dir.file("seed.ck");
    write_text(seed_path, tiny_checkpoint(dir));
    const hslide::checkpoint_reader seed(seed_path);
    const std::string path = dir.file("m.ck");
    for (const char* section :
         {"layer0.weights", "layer1.adam_m", "layer1.adam_v", "layer1.bias", "layer0.bias_v"}) {
        for (const float bad :
             {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
            std::string bytes = seed.get_string(section);
            ASSERT_GE(bytes.size(), 3 * sizeof(float)) << section;
            std::memcpy(bytes.data() + 2 * sizeof(float), &bad, sizeof bad);
            write_with_section(seed, path, section, bytes);
            try {
                hslide::load_checkpoint(path);
                FAIL() << section << " holds " << bad;
            } catch (const hslide::input_error& e) {
                EXPECT_EQ(e.file(), path);
                EXPECT_NE(e.reason().find(std::string("section '") + section + "' holds"),
                          std::string::npos)
                    << e.what();
                EXPECT_NE(e.reason().find("at index 2"), std::string::npos) << e.what();
            }
        }
    }
    // The untouched copy loads.
    EXPECT_NO_THROW(hslide::load_checkpoint(seed_path));
}

TEST(FuzzReaders, ACheckpointCountingTooFewLabelsIsRefused) {
    // Its PSP@k would fail in the middle of an evaluation, naming no file.
    temp_dir dir;
    const std::string path = dir.file("m.ck");
    hslide::model_config mc =
        hslide::testing::two_layer_model(20, 8, 10, hslide::sparsity_mode::dense);
    const hslide::model_state m = hslide::model_state::create(mc, 7);
    hslide::save_checkpoint(path, m, hslide::trainer_state{}, std::vector<uint32_t>(2, 1), 3);
    try {
        hslide::load_checkpoint(path);
        FAIL();
    } catch (const hslide::input_error& e) {
        EXPECT_EQ(e.file(), path);
        EXPECT_NE(e.reason().find("'label_counts' holds 2 counts, and the model's labels need 10"),
                  std::string::npos)
            << e.what();
    }
    hslide::save_checkpoint(path, m, hslide::trainer_state{}, std::vector<uint32_t>(10, 1), 3);
    EXPECT_EQ(hslide::load_checkpoint(path).label_counts.size(), 10u);
}

TEST(FuzzReaders, ACheckpointAskingForMoreHashTablesThanTheCommandLineAllowsIsRefused) {
    // The command line stops --L at lsh_max_tables; a forged checkpoint's L went on to the
    // tables' construction, L tables of every output row.
    temp_dir dir;
    const std::string seed_path = dir.file("seed.ck");
    hslide::model_config mc =
        hslide::testing::two_layer_model(20, 8, 10, hslide::sparsity_mode::lsh);
    hslide::save_checkpoint(seed_path, hslide::model_state::create(mc, 7), hslide::trainer_state{},
                            std::vector<uint32_t>(10, 1), 3);
    const hslide::checkpoint_reader seed(seed_path);
    nlohmann::json meta = nlohmann::json::parse(seed.get_string("meta"));
    const std::string path = dir.file("m.ck");
    for (const int tables : {hslide::lsh_max_tables + 1, 1000000}) {
        meta["model"]["layers"][1]["L"] = tables;
        write_with_section(seed, path, "meta", meta.dump());
        try {
            hslide::load_checkpoint(path);
            FAIL() << tables;
        } catch (const hslide::input_error& e) {
            EXPECT_EQ(e.file(), path);
            EXPECT_NE(e.reason().find(fmt::format("L (number of tables) must be at most {}",
                                                  hslide::lsh_max_tables)),
                      std::string::npos)
                << e.what();
        }
    }
    meta["model"]["layers"][1]["L"] = hslide::lsh_max_tables;
    write_with_section(seed, path, "meta", meta.dump());
    EXPECT_EQ(hslide::load_checkpoint(path).model.config.layers[1].lsh.L, hslide::lsh_max_tables);
}

// The cache header's fields this test forges (see dataset_cache.cpp's cache_header).
constexpr size_t cache_header_size = 128, payload_hash_at = 104, header_hash_at = 120;

// Recomputes a cache's payload and header checksums after `bytes` was edited, from the array
// sizes its header records (left as they are when the header is too damaged to say).
void reseal_cache(std::string& bytes) {
    if (bytes.size() < cache_header_size) return;
    uint64_t n = 0, fnnz = 0, lnnz = 0;
    std::memcpy(&n, bytes.data() + 64, 8);
    std::memcpy(&fnnz, bytes.data() + 88, 8);
    std::memcpy(&lnnz, bytes.data() + 96, 8);
    const uint64_t sizes[5] = {(n + 1) * 8, (n + 1) * 8, fnnz * 4, fnnz * 4, lnnz * 4};
    uint64_t total = 0;
    for (const uint64_t s : sizes) total += s;
    if (n > bytes.size() || fnnz > bytes.size() || lnnz > bytes.size() ||
        cache_header_size + total != bytes.size())
        return;
    uint64_t hashes[5];
    size_t at = cache_header_size;
    for (int i = 0; i < 5; ++i) {
        hashes[i] = XXH3_64bits(bytes.data() + at, sizes[i]);
        at += sizes[i];
    }
    const uint64_t payload = XXH3_64bits(hashes, sizeof hashes);
    std::memcpy(bytes.data() + payload_hash_at, &payload, 8);
    const uint64_t header = XXH3_64bits(bytes.data(), header_hash_at);
    std::memcpy(bytes.data() + header_hash_at, &header, 8);
}

TEST(FuzzReaders, DatasetCache) {
    spdlog::set_level(spdlog::level::warn);  // every refused cache is an info line
    temp_dir dir;
    const std::string source = dir.file("data.txt");
    write_text(source, corpus("xc_small.txt"));
    const hslide::dataset parsed = hslide::load_dataset(source);
    const std::string cache_path = hslide::cache_path_for(source);
    const std::string seed = read_text(cache_path);
    ASSERT_GT(seed.size(), cache_header_size);
    // The regressions: a NaN value and duplicate ids, checksums recomputed. Each must be
    // refused as a cache (and the text parsed instead), never handed to the trainer.
    std::vector<std::string> seeds{seed};
    {
        uint64_t n = 0;
        std::memcpy(&n, seed.data() + 64, 8);
        const size_t ids_at = cache_header_size + 2 * (n + 1) * 8;
        const size_t values_at = ids_at + parsed.feature_ids.size() * 4;
        std::string nan_value = seed;
        const float nan = std::nanf("");
        std::memcpy(nan_value.data() + values_at, &nan, 4);
        reseal_cache(nan_value);
        seeds.push_back(nan_value);
        std::string duplicate = seed;  // point 0's features 0, 3 -> 0, 0
        std::memcpy(duplicate.data() + ids_at + 4, duplicate.data() + ids_at, 4);
        reseal_cache(duplicate);
        seeds.push_back(duplicate);
    }
    for (size_t i = 1; i < seeds.size(); ++i) {
        write_text(cache_path, seeds[i]);
        const hslide::dataset d = hslide::load_dataset(source);
        EXPECT_EQ(d.feature_values, parsed.feature_values) << "forged cache " << i << " used";
        EXPECT_EQ(d.feature_ids, parsed.feature_ids) << "forged cache " << i << " used";
    }
    size_t forged_loads = 0;
    const auto [inputs, accepted] = fuzz(seeds, 6, [&](const std::string& bytes) {
        std::string forged = bytes;
        const bool resealed = forged.size() % 2 == 1;  // half with checksums made to match
        if (resealed) reseal_cache(forged);
        write_text(cache_path, forged);
        const hslide::dataset d = hslide::load_dataset(source);
        expect_valid(d);
        if (!resealed) {  // damage the checksums catch: the text is parsed instead
            EXPECT_EQ(d.feature_ids, parsed.feature_ids);
            EXPECT_EQ(d.label_ids, parsed.label_ids);
        }
        ++forged_loads;
    });
    EXPECT_EQ(forged_loads, inputs);  // a bad cache is never an error: it is re-parsed
    RecordProperty("inputs", int(inputs));
    (void)accepted;
}

}  // namespace
