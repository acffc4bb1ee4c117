// Tests of the progress reporter (plain-line and bar modes, written to a temporary FILE*), the
// human-readable formatters and the logging setup.
#include "hslide/progress.hpp"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "hslide/error.hpp"

namespace {

using hslide::human_bytes;
using hslide::human_count;
using hslide::human_duration;
using hslide::progress;
using hslide::progress_options;

// A FILE* in memory-backed storage whose contents can be read back.
class capture {
  public:
    capture() : file_(std::tmpfile()) { EXPECT_NE(file_, nullptr); }
    ~capture() { std::fclose(file_); }
    FILE* file() { return file_; }
    std::string text() {
        std::fflush(file_);
        std::rewind(file_);
        std::string out;
        char buf[4096];
        size_t n;
        while ((n = std::fread(buf, 1, sizeof(buf), file_)) > 0) out.append(buf, n);
        std::fseek(file_, 0, SEEK_END);
        return out;
    }
    std::vector<std::string> lines() {
        std::vector<std::string> out;
        std::istringstream in(text());
        for (std::string line; std::getline(in, line);) out.push_back(line);
        return out;
    }

  private:
    FILE* file_;
};

progress_options plain(FILE* out, double interval) {
    progress_options o;
    o.out = out;
    o.is_tty = 0;
    o.log_interval_s = interval;
    return o;
}

const std::regex log_prefix(R"(^\[\d\d:\d\d:\d\d\] info .*)");

TEST(HumanFormat, Count) {
    EXPECT_EQ(human_count(0), "0");
    EXPECT_EQ(human_count(7), "7");
    EXPECT_EQ(human_count(950), "950");
    EXPECT_EQ(human_count(3.5), "3.50");
    EXPECT_EQ(human_count(0.25), "0.25");
    EXPECT_EQ(human_count(42.25), "42.2");
    EXPECT_EQ(human_count(999.7), "1.00k");  // rounds up into the next unit, never "1000"
    EXPECT_EQ(human_count(1234), "1.23k");
    EXPECT_EQ(human_count(12345), "12.3k");
    EXPECT_EQ(human_count(123456), "123k");
    EXPECT_EQ(human_count(999499), "999k");
    EXPECT_EQ(human_count(999999), "1.00M");
    EXPECT_EQ(human_count(1.5e6), "1.50M");
    EXPECT_EQ(human_count(6.7e9), "6.70G");
    EXPECT_EQ(human_count(2.5e12), "2.50T");
    EXPECT_EQ(human_count(-1234), "-1.23k");
}

TEST(HumanFormat, Bytes) {
    EXPECT_EQ(human_bytes(0), "0 B");
    EXPECT_EQ(human_bytes(512), "512 B");
    EXPECT_EQ(human_bytes(1023), "1023 B");
    EXPECT_EQ(human_bytes(1024), "1.00 KiB");
    EXPECT_EQ(human_bytes(1536), "1.50 KiB");
    EXPECT_EQ(human_bytes(1023.0 * 1024), "1.00 MiB");
    EXPECT_EQ(human_bytes(12.3 * 1024 * 1024), "12.3 MiB");
    EXPECT_EQ(human_bytes(123.0 * (1ull << 30)), "123 GiB");
    EXPECT_EQ(human_bytes(2.0 * (1ull << 40)), "2.00 TiB");
}

TEST(HumanFormat, Duration) {
    EXPECT_EQ(human_duration(12e-6), "12 us");
    EXPECT_EQ(human_duration(0.35), "350 ms");
    EXPECT_EQ(human_duration(0.9999), "1.00 s");
    EXPECT_EQ(human_duration(2.346), "2.35 s");
    EXPECT_EQ(human_duration(42), "42.0 s");
    EXPECT_EQ(human_duration(59.97), "1m00s");
    EXPECT_EQ(human_duration(307), "5m07s");
    EXPECT_EQ(human_duration(7380), "2h03m");
    EXPECT_EQ(human_duration(3 * 86400 + 4 * 3600), "3d04h");
    EXPECT_EQ(human_duration(1.0 / 0.0), "?");
    EXPECT_EQ(human_duration(std::nan("")), "?");
}

TEST(Progress, PlainLinesAtEveryUpdateWhenIntervalIsZero) {
    capture out;
    {
        progress p("epoch 1/3", 1000, "samples", plain(out.file(), 0.0));
        p.update(250);
        p.set_suffix("loss 0.5000");
        p.update(500);
        p.finish();
        p.finish();  // a second finish prints nothing
    }                // nor does the destructor
    const auto lines = out.lines();
    ASSERT_EQ(lines.size(), 3u) << out.text();
    for (const auto& line : lines) EXPECT_TRUE(std::regex_match(line, log_prefix)) << line;
    EXPECT_NE(lines[0].find("info epoch 1/3: 250/1.00k samples (25%), "), std::string::npos)
        << lines[0];
    EXPECT_NE(lines[0].find(" samples/s, ETA "), std::string::npos) << lines[0];
    EXPECT_EQ(lines[0].find("loss"), std::string::npos);
    EXPECT_NE(lines[1].find("500/1.00k samples (50%)"), std::string::npos) << lines[1];
    EXPECT_NE(lines[1].find(" | loss 0.5000"), std::string::npos) << lines[1];
    EXPECT_NE(lines[2].find("info epoch 1/3: done, 500 samples in "), std::string::npos)
        << lines[2];
    EXPECT_NE(lines[2].find(" | loss 0.5000"), std::string::npos) << lines[2];
}

TEST(Progress, PlainModeWithLongIntervalPrintsOnlyTheFinalLine) {
    capture out;
    {
        progress p("parse", 0, "lines", plain(out.file(), 1e9));
        for (int i = 0; i < 1000; ++i) p.add(3);
        EXPECT_EQ(p.done(), 3000u);
    }  // the destructor finishes
    const auto lines = out.lines();
    ASSERT_EQ(lines.size(), 1u) << out.text();
    EXPECT_NE(lines[0].find("parse: done, 3.00k lines in "), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find(" lines/s)"), std::string::npos) << lines[0];
}

TEST(Progress, UnknownTotalHasNoPercentageOrEta) {
    capture out;
    progress p("generate", 0, "points", plain(out.file(), 0.0));
    p.update(1234567);
    const auto lines = out.lines();
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find("generate: 1.23M points, "), std::string::npos) << lines[0];
    EXPECT_EQ(lines[0].find('%'), std::string::npos);
    EXPECT_EQ(lines[0].find("ETA"), std::string::npos);
}

TEST(Progress, DisabledPrintsNothing) {
    capture out;
    progress_options o = plain(out.file(), 0.0);
    o.enabled = false;
    {
        progress p("quiet", 10, "items", o);
        p.add(5);
        p.finish();
        EXPECT_EQ(p.done(), 5u);
    }
    EXPECT_EQ(out.text(), "");
}

TEST(Progress, BarModeRedrawsOneLine) {
    capture out;
    progress_options o;
    o.out = out.file();
    o.is_tty = 1;
    o.redraw_interval_s = 0.0;
    o.width = 100;
    {
        progress p("train", 200, "samples", o);
        p.update(100);
        p.set_suffix("loss 1.2345 " + std::string(200, 'x'));  // too long for the line
        p.update(200);
        p.finish();
    }
    const std::string text = out.text();
    // One terminal line: carriage returns between redraws, one newline at the very end.
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.back(), '\n');
    EXPECT_EQ(text.find('\n'), text.size() - 1);
    // The bar gets 30 columns while there is room for them, none once the suffix fills it.
    EXPECT_NE(text.find("\rtrain [===============>              ]  50% 100/200 [0:00<"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("\rtrain 100% 200/200 [0:00<0:00, "), std::string::npos) << text;
    EXPECT_NE(text.find(" samples/s] loss 1.2345 xxx"), std::string::npos) << text;
    // Every drawn line is clipped to width - 1 columns.
    size_t pos = 0, draws = 0;
    while ((pos = text.find('\r', pos)) != std::string::npos) {
        const size_t end = text.find("\x1b[K", pos);
        ASSERT_NE(end, std::string::npos);
        EXPECT_LE(end - pos - 1, 99u);
        pos = end;
        ++draws;
    }
    EXPECT_EQ(draws, 3u);
}

TEST(Progress, ConcurrentAddsFromOpenMpThreads) {
    capture out;
    {
        progress p("threads", 8 * 20000, "items", plain(out.file(), 0.0005));
#pragma omp parallel for num_threads(8)
        for (int i = 0; i < 8 * 20000; ++i) p.add(1);
        EXPECT_EQ(p.done(), 8u * 20000u);
    }
    // Lines are never interleaved: only one thread draws at a time.
    const auto lines = out.lines();
    ASSERT_GE(lines.size(), 1u);
    for (const auto& line : lines) EXPECT_TRUE(std::regex_match(line, log_prefix)) << line;
    EXPECT_NE(lines.back().find("done, 160k items"), std::string::npos) << lines.back();
}

TEST(Logging, SetupLevels) {
    hslide::setup_logging("debug", false);
    EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::debug);
    EXPECT_EQ(spdlog::default_logger()->name(), "hslide");
    hslide::setup_logging("debug", true);  // quiet keeps warnings and errors only
    EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::warn);
    hslide::setup_logging("error", true);
    EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::err);
    hslide::setup_logging("warning", false);
    EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::warn);
    EXPECT_THROW(hslide::setup_logging("verbose", false), hslide::error);
    hslide::setup_logging("info", false);
    EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::info);
}

}  // namespace
