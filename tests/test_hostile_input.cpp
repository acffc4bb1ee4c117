// Hostile input and faults (issue 31): every reproducer of the adversarial probe, each as a
// test that fails on the old behaviour (a crash, a hang, a silently accepted value, a file
// left behind) and passes when hslide refuses with a clear error, exits below 128, or works.
#include "common/util/json_util.hpp"
#include "hslide/checkpoint.hpp"
#include "hslide/checkpoint_file.hpp"
#include "hslide/config.hpp"
#include "hslide/dataset.hpp"
#include "hslide/input_check.hpp"
#include "hslide/metrics.hpp"
#include "hslide/output_file.hpp"
#include "hslide/thread_limits.hpp"
#include "hslide/validation.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using hslide::testing::files_in;
using hslide::testing::generated_data_dir;
using hslide::testing::read_text;
using hslide::testing::run_hslide;
using hslide::testing::temp_dir;
using hslide::testing::write_text;

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

/// The message of the hslide::error `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const hslide::error& e) {
        return e.what();
    }
    return "";
}

/// A refusal: a clear message, an exit code from hslide's error handler (not a signal).
void expect_refused(const hslide::testing::command_result& r, const std::string& part) {
    EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << r.exit_code << ": " << r.output;
    EXPECT_TRUE(contains(r.output, part)) << "expected '" << part << "' in:\n" << r.output;
}

std::string tiny_args() {
    return " --train " + generated_data_dir("--scale 0.2 --seed 3") + "/train.txt --test " +
           generated_data_dir("--scale 0.2 --seed 3") +
           "/test.txt --no-cache --no-progress --threads 2 --hidden 16 ";
}

hslide::dataset two_points() {
    hslide::dataset d;
    d.n_features = 4;
    d.n_labels = 3;
    const uint32_t f0[] = {0, 2}, f1[] = {1};
    const float v0[] = {1.0f, 0.5f}, v1[] = {2.0f};
    const uint32_t l0[] = {0, 2}, l1[] = {1};
    d.push_back(f0, v0, 2, l0, 2);
    d.push_back(f1, v1, 1, l1, 1);
    return d;
}

// --- 1. thread counts ----------------------------------------------------------------------

TEST(HostileThreads, OneCheckForEveryEntryPoint) {
    EXPECT_GE(hslide::max_thread_count(), 64);
    EXPECT_EQ(hslide::check_thread_count(0, "--threads"), 0);
    EXPECT_EQ(hslide::check_thread_count(hslide::max_thread_count(), "--threads"),
              hslide::max_thread_count());
    const std::string big = error_of([] { hslide::check_thread_count(100000, "--threads"); });
    EXPECT_TRUE(contains(big, "--threads 100000 is more than")) << big;
    EXPECT_FALSE(error_of([] { hslide::check_thread_count(-1, "x"); }).empty());
    EXPECT_FALSE(error_of([] { hslide::check_thread_count(2.5, "x"); }).empty());
    EXPECT_FALSE(error_of([] { hslide::check_thread_count(1e300, "x"); }).empty());
    hslide::train_config tc;
    tc.threads = 100000;
    EXPECT_FALSE(error_of([&] { hslide::validate(tc); }).empty());
}

TEST(HostileThreads, CommandsRefuseInsteadOfCrashing) {
    expect_refused(run_hslide("train --preset tiny --scale 0.1 --epochs 1 --threads 100000 -q"),
                   "--threads) 100000 is more than");
    expect_refused(run_hslide("train --preset tiny --scale 0.1 --epochs 1 --backend hybrid "
                              "--workers cpu,cpu --worker-threads 100000 -q"),
                   "--worker-threads 100000");
    temp_dir dir;
    expect_refused(
        run_hslide("gen --preset tiny --scale 0.01 --threads 100000 --out " + dir.file("g")),
        "--threads 100000");
    setenv("OMP_NUM_THREADS", "100000", 1);  // --threads 0 (all) then means 100000
    const auto all = run_hslide("gen --preset tiny --scale 0.01 --out " + dir.file("g"));
    unsetenv("OMP_NUM_THREADS");
    expect_refused(all, "OMP_NUM_THREADS = 100000");
    write_text(dir.file("c.toml"), "threads = 100000\n");
    expect_refused(
        run_hslide("train --preset tiny --scale 0.1 --epochs 1 -q --config " + dir.file("c.toml")),
        "100000 is more than");
}

// --- 2, 3, 11. the shared input-matrix check -------------------------------------------------

TEST(HostileMatrices, NonFiniteValuesAndBadStructureAreRefused) {
    hslide::dataset d = two_points();
    EXPECT_EQ(hslide::dataset_problem(d), "");
    d.feature_values[1] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(contains(hslide::dataset_problem(d), "point 0: NaN or infinite"))
        << hslide::dataset_problem(d);
    d.feature_values[1] = std::numeric_limits<float>::infinity();
    EXPECT_FALSE(hslide::dataset_problem(d).empty());
    d = two_points();
    d.label_ids[1] = 0;  // point 0's labels {0, 0}
    EXPECT_TRUE(contains(hslide::dataset_problem(d), "duplicate label 0"));
    d = two_points();
    d.feature_offsets[1] = 1000000;  // monotone, but past the entries
    EXPECT_TRUE(contains(hslide::dataset_problem(d), "past its 3 entries"))
        << hslide::dataset_problem(d);
    const int64_t decreasing[] = {0, 3, 2, 3};
    EXPECT_TRUE(contains(hslide::csr_offsets_problem(decreasing, 3, 3, "X"), "decrease at row 1"));
    d = two_points();
    d.feature_ids[1] = 0;  // {0, 0}
    EXPECT_TRUE(contains(hslide::dataset_problem(d), "duplicate feature id 0"));
    d = two_points();
    d.label_ids[2] = 3;  // >= L
    EXPECT_TRUE(contains(hslide::dataset_problem(d), "point 1: label id 3 out of range"));
    const uint32_t f[] = {0};
    const float nan[] = {std::nanf("")};
    d = two_points();
    EXPECT_THROW(d.push_back(f, nan, 1, nullptr, 0), hslide::error);
    EXPECT_EQ(d.size(), 2u);
}

TEST(HostileMatrices, WriteXcRefusesWhatReadXcWouldRefuse) {
    temp_dir dir;
    hslide::dataset d = two_points();
    d.feature_values[0] = std::nanf("");
    EXPECT_THROW(hslide::write_xc(d, dir.file("x.txt")), hslide::input_error);
    EXPECT_TRUE(files_in(dir.path()).empty());
}

TEST(HostileMatrices, TooManyLabelsNamesTheCountsAndTheFile) {
    hslide::dataset d = two_points();
    d.source = "big.txt";
    d.n_labels = uint64_t{1} << 32;
    const std::string why = error_of([&] { hslide::check_model_dimensions(d); });
    EXPECT_TRUE(contains(why, "big.txt") && contains(why, "4294967296 labels") &&
                contains(why, "4 features"))
        << why;
}

// --- 4, 11. checkpoints: JSON depth and wrapping integers ----------------------------------

// A copy of the checkpoint `from` at `to` with its meta section replaced by `meta`.
void rewrite_meta(const std::string& from, const std::string& to, const std::string& meta) {
    hslide::checkpoint_reader r(from);
    hslide::checkpoint_writer w(to);
    for (const std::string& name : r.names()) {
        if (name == "meta") {
            w.add_string(name, meta);
        } else {
            const auto v = r.get(name);
            w.add(name, v.data, v.size);
        }
    }
    w.commit();
}

std::string small_checkpoint(const temp_dir& dir) {
    const std::string path = dir.file("model.ck");
    const auto r = run_hslide("train" + tiny_args() + "--epochs 1 -q --save " + path);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return path;
}

TEST(HostileCheckpoints, DeeplyNestedMetaIsRefusedNotACrash) {
    temp_dir dir;
    const std::string good = small_checkpoint(dir);
    nlohmann::json meta = hslide::checkpoint_reader(good).get_json("meta");
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    std::string text = meta.dump();
    text.insert(1, "\"x\":" + deep + ",");
    rewrite_meta(good, dir.file("deep.ck"), text);
    const std::string why = error_of([&] { hslide::load_checkpoint(dir.file("deep.ck")); });
    EXPECT_TRUE(contains(why, "nested deeper than 64")) << why;
    expect_refused(
        run_hslide("eval --model " + dir.file("deep.ck") + " --test " +
                   generated_data_dir("--scale 0.2 --seed 3") + "/test.txt --no-cache -q"),
        "nested deeper than 64");
    // Depth within the limit still parses; strings with brackets do not count.
    EXPECT_EQ(hslide::detail::parse_json_limited("[[\"[[[[\"]]", "t", 2).dump(), "[[\"[[[[\"]]");
}

TEST(HostileCheckpoints, IntegersThatWouldWrapAreRefused) {
    temp_dir dir;
    const std::string good = small_checkpoint(dir);
    nlohmann::json meta = hslide::checkpoint_reader(good).get_json("meta");
    meta["model"]["input_dim"] = -1;
    rewrite_meta(good, dir.file("neg.ck"), meta.dump());
    std::string why = error_of([&] { hslide::load_checkpoint(dir.file("neg.ck")); });
    EXPECT_TRUE(contains(why, "'input_dim' = -1 is out of range")) << why;
    meta = hslide::checkpoint_reader(good).get_json("meta");
    meta["trainer"]["epochs_done"] = uint64_t{1} << 33;
    rewrite_meta(good, dir.file("big.ck"), meta.dump());
    why = error_of([&] { hslide::load_checkpoint(dir.file("big.ck")); });
    EXPECT_TRUE(contains(why, "epochs_done")) << why;
    meta = hslide::checkpoint_reader(good).get_json("meta");
    meta["model"]["layers"][0]["K"] = 2.5;
    rewrite_meta(good, dir.file("frac.ck"), meta.dump());
    why = error_of([&] { hslide::load_checkpoint(dir.file("frac.ck")); });
    EXPECT_TRUE(contains(why, "not an integer")) << why;
}

// --- 5, 8. output files -------------------------------------------------------------------

TEST(HostileOutput, FullDiskFailsAndLeavesNoTemporary) {
    temp_dir dir;
    const std::string path = dir.file("out.txt");
    write_text(path, "old\n");
    {
        const hslide::testing::file_size_limit limit(1000);
        const std::string why = error_of([&] {
            hslide::output_file out(path);
            out.write(std::string(5000, 'x'));
            out.commit();
        });
        EXPECT_TRUE(contains(why, "cannot write " + path + ": File too large")) << why;
        EXPECT_FALSE(
            error_of([&] { hslide::append_to_file(path, std::string(5000, 'y')); }).empty());
    }
    EXPECT_EQ(read_text(path), "old\n");
    EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"out.txt"});
    hslide::append_to_file(path, "new\n");
    EXPECT_EQ(read_text(path), "old\nnew\n");
    // Abandoned without commit: nothing changes, nothing is left.
    {
        hslide::output_file out(path);
        out.write("partial");
    }
    EXPECT_EQ(read_text(path), "old\nnew\n");
    EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"out.txt"});
}

TEST(HostileOutput, DevicesAreWrittenInPlaceAndTheirErrorsReported) {
    hslide::output_file null("/dev/null");
    null.write("fine");
    null.commit();
    const std::string why = error_of([] { hslide::append_to_file("/dev/full", "record\n"); });
    EXPECT_TRUE(contains(why, "No space left on device")) << why;
    temp_dir dir;
    EXPECT_FALSE(error_of([&] { hslide::output_file out(dir.path()); }).empty());  // a folder
}

TEST(HostileOutput, FifoWithoutReaderIsAnErrorNotAHang) {
    temp_dir dir;
    const std::string fifo = dir.file("fifo");
    ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string why = error_of([&] { hslide::output_file out(fifo); });
    EXPECT_TRUE(contains(why, "FIFO that no process is reading")) << why;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5);
}

pid_t dead_pid() {
    const pid_t child = fork();
    if (child == 0) _exit(0);
    int status = 0;
    waitpid(child, &status, 0);
    return child;
}

TEST(HostileOutput, StaleTemporariesOfDeadProcessesAreRemoved) {
    temp_dir dir;
    const std::string path = dir.file("model.ck");
    const pid_t dead = dead_pid();
    const std::string stale = path + ".tmp." + std::to_string(dead);
    const std::string stale2 = path + ".tmp." + std::to_string(dead) + ".3";
    const std::string live = path + ".tmp.1";  // init: alive
    const std::string other = path + ".tmp.notapid";
    for (const auto& f : {stale, stale2, live, other}) write_text(f, "x");
    hslide::output_file out(path);
    out.write("new");
    out.commit();
    EXPECT_EQ(files_in(dir.path()),
              (std::vector<std::string>{"model.ck", "model.ck.tmp.1", "model.ck.tmp.notapid"}));
}

TEST(HostileOutput, MetricsOutOnAFullDiskFailsTheCommand) {
    expect_refused(run_hslide("train" + tiny_args() + "--epochs 1 -q --metrics-out /dev/full"),
                   "No space left on device");
    temp_dir dir;
    const std::string ck = small_checkpoint(dir);
    expect_refused(
        run_hslide("eval --model " + ck + " --test " + generated_data_dir("--scale 0.2 --seed 3") +
                   "/test.txt --no-cache -q --metrics-out /dev/full"),
        "No space left on device");
    expect_refused(run_hslide("predict --model " + ck + " --data " +
                              generated_data_dir("--scale 0.2 --seed 3") +
                              "/test.txt --no-cache -q --out /dev/full"),
                   "No space left on device");
    EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"model.ck"});
}

/// Starts `hslide args...` without a shell; returns its pid.
pid_t spawn_hslide(const std::vector<std::string>& args) {
    const char* binary = std::getenv("HSLIDE_BINARY");
    std::vector<std::string> all{binary && *binary ? binary : HSLIDE_BINARY_PATH};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = 0;
    EXPECT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    return pid;
}

TEST(HostileOutput, KillDuringSaveKeepsTheLastCheckpointAndCleansUp) {
    temp_dir dir;
    const std::string ck = dir.file("model.ck");
    const std::vector<std::string> args{"train",
                                        "--train",
                                        generated_data_dir("--scale 0.2 --seed 3") + "/train.txt",
                                        "--no-cache",
                                        "--threads",
                                        "2",
                                        "--hidden",
                                        "64",
                                        "--epochs",
                                        "40",
                                        "-q",
                                        "--save",
                                        ck};
    std::mt19937 gen(31);
    std::uniform_int_distribution<int> delay_ms(150, 1500);
    int killed_with_checkpoint = 0;
    for (int round = 0; round < 20; ++round) {
        const pid_t pid = spawn_hslide(args);
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(gen)));
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        if (std::filesystem::exists(ck)) {
            EXPECT_NO_THROW(hslide::load_checkpoint(ck)) << "round " << round;
            ++killed_with_checkpoint;
        }
    }
    EXPECT_GT(killed_with_checkpoint, 0);
    std::vector<std::string> last = args;
    last[9] = "1";  // --epochs 1: one complete save
    const auto r = run_hslide([&] {
        std::string line;
        for (size_t i = 0; i < last.size(); ++i) line += " " + last[i];
        return line;
    }());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"model.ck"});
    EXPECT_NO_THROW(hslide::load_checkpoint(ck));
}

// --- 6, 9. pipes and FIFOs ----------------------------------------------------------------

TEST(HostilePipes, TrainingDataFromAPipeIsRead) {
    const std::string train = generated_data_dir("--scale 0.2 --seed 3") + "/train.txt";
    auto r = run_hslide("train --train /dev/stdin --epochs 1 --hidden 8 --threads 2 -q < " + train);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    r = run_hslide("train --train /dev/stdin --epochs 1 --hidden 8 --threads 2 < /dev/null");
    expect_refused(r, "empty file");
    // Through a pipe in this process (the loader's path for `<(zcat f)`).
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const std::string text = "2 3 2\n0 0:1 2:0.5\n1 1:2\n";
    ASSERT_EQ(write(fds[1], text.data(), text.size()), ssize_t(text.size()));
    close(fds[1]);
    const hslide::dataset d = hslide::load_dataset("/proc/self/fd/" + std::to_string(fds[0]));
    close(fds[0]);
    EXPECT_EQ(d.size(), 2u);
    EXPECT_EQ(d.feature_ids.size(), 3u);
}

TEST(HostilePipes, FifoAsModelOrCacheDoesNotBlock) {
    temp_dir dir;
    const std::string fifo = dir.file("fifo");
    ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
    const auto t0 = std::chrono::steady_clock::now();
    expect_refused(run_hslide("eval --model " + fifo + " --test " +
                              generated_data_dir("--scale 0.2 --seed 3") + "/test.txt -q"),
                   "not a regular file");
    const std::string data = dir.file("data.txt");
    write_text(data, "2 3 2\n0 0:1 2:0.5\n1 1:2\n");
    ASSERT_EQ(mkfifo((data + ".hscache").c_str(), 0644), 0);
    const hslide::dataset d = hslide::load_dataset(data);
    EXPECT_EQ(d.size(), 2u);
    struct stat st {};
    ASSERT_EQ(stat((data + ".hscache").c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode));  // left alone
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10);
}

// --- 13. what the cache checks, and --verify-cache -----------------------------------------

TEST(HostileCache, VerifyCacheCatchesAnEditTheSampleMisses) {
    temp_dir dir;
    const std::string path = dir.file("big.txt");
    std::string text = "1200000 10 2\n";
    for (int i = 0; i < 1200000; ++i) text += "0 1:0.5 2:0.25\n";  // 18 MB: sampled
    write_text(path, text);
    const hslide::dataset first = hslide::load_dataset(path);
    struct stat before {};
    ASSERT_EQ(stat(path.c_str(), &before), 0);
    // Between the first two sampled 16 KiB blocks (at 0 and ~68 KiB), keeping size and time.
    const size_t at = text.find("0.25", 40000);
    text[at + 3] = '7';  // 0.25 -> 0.27
    write_text(path, text);
    const struct timespec times[2] = {before.st_atim, before.st_mtim};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
    const size_t point = std::count(text.begin(), text.begin() + long(at), '\n') - 1;
    const float edited = 0.27f;
    hslide::load_options lo;
    EXPECT_NE(hslide::load_dataset(path, lo).features(point).values[1], edited);  // the gap
    lo.verify_cache = true;
    EXPECT_EQ(hslide::load_dataset(path, lo).features(point).values[1], edited);
    EXPECT_EQ(first.size(), 1200000u);
}

// --- 7. gen sized up front ----------------------------------------------------------------

TEST(HostileGen, AnImpossibleSizeIsRefusedAtOnce) {
    temp_dir dir;
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = run_hslide("gen --preset tiny --scale 1000000 --out " + dir.file("d"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, "2000000000 train")) << r.output;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10);
    EXPECT_TRUE(files_in(dir.path()).empty());
}

// --- 10. values too small for a double ------------------------------------------------------

TEST(HostileValues, UnderflowIsZeroAtAnyExponent) {
    const hslide::dataset d = hslide::parse_xc(
        "1 6 1\n0 0:1e-50 1:1e-400 2:-1e-400 3:123e-402 4:0.00001e-999999 "
        "5:1e-45\n",
        "t");
    ASSERT_EQ(d.feature_values.size(), 6u);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(d.feature_values[i], 0.0f) << i;
    EXPECT_GT(d.feature_values[5], 0.0f);  // the smallest denormal, kept
    for (const char* big : {"1e39", "1e400", "0.001e999", "123456789e300"}) {
        const std::string why =
            error_of([&] { hslide::parse_xc(std::string("1 1 1\n0 0:") + big + "\n", "t"); });
        EXPECT_TRUE(contains(why, "out of the float range")) << big << ": " << why;
    }
}

// --- 11, 12. values accepted silently, and messages -----------------------------------------

TEST(HostileValues, NonsenseSettingsAreRefused) {
    expect_refused(run_hslide("train --preset tiny --scale 0.1 --epochs 0 -q"),
                   "--epochs (epochs) must be 'auto' or a positive number of epochs, got '0'");
    expect_refused(run_hslide("train --preset tiny --scale 0.1 --epochs 1 --adam-eps inf -q"),
                   "--adam-eps: must be a finite number, not inf");
    expect_refused(run_hslide("train --preset tiny --scale 0.1 --epochs 1 --propensity-a nan -q"),
                   "--propensity-a: must be a finite number, not nan");
    const auto lr = run_hslide("train --preset tiny --scale 0.1 --epochs 1 --lr inf -q");
    expect_refused(lr, "--lr: must be a finite number, not inf");
    EXPECT_LT(lr.output.size(), 300u) << lr.output;
    temp_dir dir;
    const std::string ck = small_checkpoint(dir);
    expect_refused(run_hslide("train" + tiny_args() + "--epochs 1 -q --resume " + ck),
                   "nothing to train: give --epochs 2 or more");
    hslide::metrics_config mc;
    mc.propensity_b = -1;
    EXPECT_THROW(hslide::validate(mc), hslide::error);
    EXPECT_THROW(hslide::check_validation_fraction(-0.5), hslide::error);
    EXPECT_THROW(hslide::check_validation_fraction(1.0), hslide::error);
    EXPECT_NO_THROW(hslide::check_validation_fraction(0.0));
}

}  // namespace
