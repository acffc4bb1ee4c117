// Tests of the checkpoint container: round trips, and that every kind of damage (truncation,
// flipped bytes, wrong magic or version, trailing bytes) is an input_error, never a crash; and
// that an existing checkpoint survives a failed or abandoned write.
#include "hslide/checkpoint_file.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hslide/error.hpp"
#include "hslide/rng.hpp"
#include "test_util.hpp"

namespace {

using hslide::checkpoint_reader;
using hslide::checkpoint_writer;
using hslide::testing::file_size_limit;
using hslide::testing::files_in;
using hslide::testing::read_text;
using hslide::testing::temp_dir;
using hslide::testing::write_text;

struct pod_state {
    uint64_t step;
    double lr;
    int32_t epoch;
};

// The reason of the input_error thrown by opening `path` ("" if it opens).
std::string open_error(const std::string& path) {
    try {
        checkpoint_reader reader(path);
    } catch (const hslide::input_error& e) {
        EXPECT_EQ(e.file(), path);
        return e.reason();
    }
    return "";
}

// A small checkpoint with awkward section sizes, used by the damage tests.
std::string write_small(const std::string& path) {
    checkpoint_writer w(path);
    std::vector<uint32_t> ids(33);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(i * 7919 + 1);
    w.add_vector("ids", ids);
    w.add("empty", nullptr, 0);
    w.add_string("note", "hello");
    w.add_json("config", nlohmann::json{{"layers", {128, 670091}}, {"lr", 1e-4}});
    w.commit();
    return read_text(path);
}

// Recomputes the trailing whole-file checksum after a deliberate edit.
void reseal(std::string& bytes) {
    const uint64_t h = XXH3_64bits(bytes.data(), bytes.size() - 8);
    std::memcpy(&bytes[bytes.size() - 8], &h, 8);
}

TEST(CheckpointFile, RoundTripOfSeveralSections) {
    temp_dir dir;
    const std::string path = dir.file("model.ckpt");
    hslide::rng gen(17);
    std::vector<float> weights(6'000'001);  // 24 MB, odd length
    for (auto& x : weights) x = static_cast<float>(gen.normal());
    std::vector<uint32_t> ids(1003);
    for (auto& x : ids) x = static_cast<uint32_t>(gen());
    std::vector<double> big_unowned(100'003);
    for (auto& x : big_unowned) x = gen.uniform_double() + 0.5;
    const pod_state state{123456789012ULL, 0.00025, 7};
    const nlohmann::json config = {{"hidden", 128}, {"hash", "dwta"}, {"k", 6}, {"l", 50}};

    {
        checkpoint_writer w(path);
        w.add_vector("weights", weights);
        w.add_vector("ids", ids);
        w.add_unowned("adam_m", big_unowned.data(), big_unowned.size() * sizeof(double));
        w.add_pod("state", state);
        w.add_string("text", std::string("line\0with nul", 13));
        w.add_json("config", config);
        w.add("empty", nullptr, 0);
        EXPECT_TRUE(w.has("ids"));
        EXPECT_FALSE(w.has("nope"));
        w.commit();
    }
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(getpid())));

    checkpoint_reader r(path);
    EXPECT_EQ(r.version(), hslide::checkpoint_format_version);
    EXPECT_EQ(r.names(), (std::vector<std::string>{"weights", "ids", "adam_m", "state", "text",
                                                   "config", "empty"}));
    EXPECT_EQ(r.get_vector<float>("weights"), weights);
    EXPECT_EQ(r.get_vector<uint32_t>("ids"), ids);
    EXPECT_EQ(r.get_vector<double>("adam_m"), big_unowned);
    const auto s = r.get_pod<pod_state>("state");
    EXPECT_EQ(s.step, state.step);
    EXPECT_EQ(s.lr, state.lr);
    EXPECT_EQ(s.epoch, state.epoch);
    EXPECT_EQ(r.get_string("text"), std::string("line\0with nul", 13));
    EXPECT_EQ(r.get_json("config"), config);
    EXPECT_EQ(r.get("empty").size, 0u);
    EXPECT_TRUE(r.get_vector<float>("empty").empty());
    for (const auto& name : r.names())
        EXPECT_EQ(reinterpret_cast<uintptr_t>(r.get(name).data) % 64, 0u) << name;
    EXPECT_EQ(r.get_bytes("ids").size(), ids.size() * 4);

    // A reader can be moved; the views stay valid.
    checkpoint_reader moved(std::move(r));
    EXPECT_EQ(moved.get_vector<uint32_t>("ids"), ids);
}

TEST(CheckpointFile, ZeroSections) {
    temp_dir dir;
    checkpoint_writer w(dir.file("e"));
    w.commit();
    checkpoint_reader r(dir.file("e"));
    EXPECT_TRUE(r.names().empty());
    EXPECT_EQ(r.file_size(), 24u);
}

TEST(CheckpointFile, TruncationAtEveryOffsetIsAnError) {
    temp_dir dir;
    const std::string full = write_small(dir.file("full"));
    ASSERT_GT(full.size(), 200u);
    const std::string cut = dir.file("cut");
    for (size_t len = 0; len < full.size(); ++len) {
        write_text(cut, full.substr(0, len));
        const std::string reason = open_error(cut);
        ASSERT_FALSE(reason.empty()) << "a checkpoint cut to " << len << " bytes opened";
        EXPECT_NE(reason.find("truncated"), std::string::npos) << len << ": " << reason;
    }
    // Cut inside the payloads: the message gives the exact sizes.
    write_text(cut, full.substr(0, full.size() - 20));
    EXPECT_EQ(open_error(cut), fmt::format("truncated: expected {} bytes, file has {}", full.size(),
                                           full.size() - 20));
}

TEST(CheckpointFile, FlippedByteAnywhereIsAnError) {
    temp_dir dir;
    const std::string full = write_small(dir.file("full"));
    const std::string bad = dir.file("bad");
    for (size_t pos = 0; pos < full.size(); ++pos) {
        std::string bytes = full;
        bytes[pos] = static_cast<char>(bytes[pos] ^ (1 << (pos % 8)));
        write_text(bad, bytes);
        ASSERT_FALSE(open_error(bad).empty()) << "flipping byte " << pos << " went unnoticed";
    }
    // A flip inside a payload names the section.
    std::string bytes = full;
    const size_t note_at = full.find("hello");
    ASSERT_NE(note_at, std::string::npos);
    bytes[note_at + 2] = 'X';
    write_text(bad, bytes);
    EXPECT_EQ(open_error(bad), "checksum mismatch in section 'note'");
    // A flip in a section name is caught by the whole-file checksum.
    bytes = full;
    bytes[full.find("config")] = 'C';
    write_text(bad, bytes);
    EXPECT_NE(open_error(bad).find("file checksum mismatch"), std::string::npos);
}

TEST(CheckpointFile, WrongMagic) {
    temp_dir dir;
    write_text(dir.file("text"), "3 5 7\n0,1 2:0.5\n");
    EXPECT_EQ(open_error(dir.file("text")), "not an hslide checkpoint (bad magic)");
    write_text(dir.file("short"), "HSX");
    EXPECT_EQ(open_error(dir.file("short")), "not an hslide checkpoint (bad magic)");
    std::string bytes = write_small(dir.file("ok"));
    bytes[0] = 'h';
    write_text(dir.file("bad"), bytes);
    EXPECT_EQ(open_error(dir.file("bad")), "not an hslide checkpoint (bad magic)");
    write_text(dir.file("empty"), "");
    EXPECT_NE(open_error(dir.file("empty")).find("truncated"), std::string::npos);
}

TEST(CheckpointFile, WrongVersionNamesBothVersions) {
    temp_dir dir;
    const std::string full = write_small(dir.file("ok"));
    for (uint32_t version : {2u, 0u}) {
        std::string bytes = full;
        std::memcpy(&bytes[8], &version, 4);
        reseal(bytes);  // a genuine file of another version, not a corrupt one
        write_text(dir.file("v"), bytes);
        const std::string reason = open_error(dir.file("v"));
        EXPECT_NE(reason.find(fmt::format("version {}", version)), std::string::npos) << reason;
        EXPECT_NE(reason.find("reads version 1"), std::string::npos) << reason;
        EXPECT_NE(reason.find(version > 1 ? "newer" : "older"), std::string::npos) << reason;
    }
    // The same edit without a valid file checksum is reported as corruption.
    std::string bytes = full;
    bytes[9] = 1;
    write_text(dir.file("v"), bytes);
    EXPECT_NE(open_error(dir.file("v")).find("corrupt header"), std::string::npos);
}

TEST(CheckpointFile, HugeLengthsAreRejectedBeforeAllocating) {
    temp_dir dir;
    const std::string full = write_small(dir.file("ok"));
    // Section count of 2^32-1.
    std::string bytes = full;
    std::memset(&bytes[12], 0xff, 4);
    reseal(bytes);
    write_text(dir.file("b"), bytes);
    EXPECT_NE(open_error(dir.file("b")).find("truncated"), std::string::npos);
    // First section's size field (after magic, version, count, name length 3, "ids", offset)
    // set to 2^62.
    bytes = full;
    const uint64_t huge = uint64_t{1} << 62;
    std::memcpy(&bytes[16 + 4 + 3 + 8], &huge, 8);
    reseal(bytes);
    write_text(dir.file("b"), bytes);
    EXPECT_NE(open_error(dir.file("b")).find("claims"), std::string::npos);
    // Trailing bytes after a valid file.
    write_text(dir.file("b"), full + "xyz");
    EXPECT_NE(open_error(dir.file("b")).find("3 unexpected bytes"), std::string::npos);
}

TEST(CheckpointFile, AccessErrors) {
    temp_dir dir;
    write_small(dir.file("ok"));
    checkpoint_reader r(dir.file("ok"));
    try {
        r.get("adam_v");
        FAIL() << "no error for a missing section";
    } catch (const hslide::input_error& e) {
        EXPECT_EQ(e.reason(), "missing section 'adam_v'");
        EXPECT_EQ(e.file(), dir.file("ok"));
    }
    EXPECT_FALSE(r.has("adam_v"));
    EXPECT_TRUE(r.has("note"));
    EXPECT_THROW(r.get_vector<uint64_t>("note"), hslide::input_error);  // 5 bytes
    EXPECT_THROW(r.get_pod<double>("note"), hslide::input_error);
    EXPECT_THROW(r.get_json("ids"), hslide::input_error);
    EXPECT_NE(open_error(dir.file("missing")).find("cannot open"), std::string::npos);
    EXPECT_EQ(open_error(dir.path()).rfind("not a regular file", 0), 0u) << open_error(dir.path());
}

TEST(CheckpointFile, WriterMisuse) {
    temp_dir dir;
    checkpoint_writer w(dir.file("m"));
    w.add_string("a", "x");
    EXPECT_THROW(w.add_string("a", "y"), hslide::error);
    EXPECT_THROW(w.add_string("", "y"), hslide::error);
    EXPECT_THROW(w.add_string(std::string(1025, 'n'), "y"), hslide::error);
    w.commit();
    EXPECT_THROW(w.commit(), hslide::error);
    EXPECT_THROW(w.add_string("b", "y"), hslide::error);
}

TEST(CheckpointFile, ExistingCheckpointSurvivesFailedWrites) {
    temp_dir dir;
    const std::string path = dir.file("model.ckpt");
    const std::string original = write_small(path);

    // Abandoned before commit: nothing is written.
    {
        checkpoint_writer w(path);
        w.add_string("note", "replacement");
    }
    EXPECT_EQ(read_text(path), original);

    // A directory that does not exist: an io error, nothing created.
    try {
        checkpoint_writer w(dir.file("no/such/dir/model.ckpt"));
        w.add_string("x", "y");
        w.commit();
        FAIL() << "no error";
    } catch (const hslide::error& e) {
        EXPECT_EQ(e.kind(), hslide::error_kind::io);
        EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
    }

    // The commit fails midway (the file-size limit stands in for a full disk): an error with
    // the system's reason, the old checkpoint intact, no temporary file left.
    {
        checkpoint_writer w(path);
        w.add_string("note", std::string(1 << 16, 'r'));
        const file_size_limit limit(4096);
        try {
            w.commit();
            FAIL() << "no error";
        } catch (const hslide::error& e) {
            EXPECT_EQ(e.kind(), hslide::error_kind::io);
            EXPECT_NE(std::string(e.what()).find("File too large"), std::string::npos) << e.what();
        }
    }
    EXPECT_EQ(read_text(path), original);
    EXPECT_EQ(checkpoint_reader(path).get_string("note"), "hello");
    EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"model.ckpt"});

    // A successful commit replaces it.
    {
        checkpoint_writer w(path);
        w.add_string("note", "replacement");
        w.commit();
    }
    EXPECT_EQ(checkpoint_reader(path).get_string("note"), "replacement");
    EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"model.ckpt"});
}

}  // namespace
