// The binary cache of parsed datasets, load_dataset and cache_path_for (see
// hslide/dataset.hpp).
//
// Cache file layout (host byte order; the endianness tag rejects a file from a machine of the
// other order): a 128-byte cache_header, then feature_offsets (N+1 x u64), label_offsets
// (N+1 x u64), feature_ids (nnz x u32), feature_values (nnz x f32), label_ids (lnnz x u32).
#include "hslide/dataset.hpp"

#include "common/data/dataset_io.hpp"
#include "hslide/error.hpp"
#include "hslide/input_check.hpp"
#include "hslide/memory.hpp"
#include "hslide/output_file.hpp"
#include "hslide/progress.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>

namespace hslide {

namespace {

constexpr char cache_magic[8] = {'H', 'S', 'L', 'C', 'A', 'C', 'H', 'E'};
constexpr uint32_t cache_version = 3;
constexpr uint32_t endian_tag = 0x01020304;
// Pieces for streaming reads: big enough for few system calls, small enough that the hash
// finds the bytes still in cache.
constexpr size_t io_chunk = size_t{256} << 10;

struct cache_header {
    char magic[8];
    uint32_t version;
    uint32_t endian;
    uint64_t source_size;
    int64_t source_mtime_ns;
    uint64_t source_xxh3;
    uint32_t format;  // 1 = XC, 2 = LibSVM
    uint32_t reserved;
    uint64_t min_features;  // LibSVM only, else 0
    uint64_t min_labels;
    uint64_t n_points;
    uint64_t n_features;
    uint64_t n_labels;
    uint64_t feature_nnz;
    uint64_t label_nnz;
    uint64_t payload_xxh3;
    uint64_t source_full_xxh3;  // XXH3-64 of every byte of the source (0: not recorded)
    uint64_t header_xxh3;       // of every byte before this field
};
static_assert(sizeof(cache_header) == 128, "the cache header is 128 bytes");

uint64_t header_hash(const cache_header& h) {
    return XXH3_64bits(&h, offsetof(cache_header, header_xxh3));
}

uint32_t format_code(data_format f) {
    return f == data_format::xc ? 1 : 2;
}

struct fd_guard {
    int fd = -1;
    ~fd_guard() {
        if (fd >= 0) ::close(fd);
    }
};

int64_t mtime_ns(const struct stat& st) {
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
}

// Reads exactly n bytes (false on error or early end of file).
bool read_exact(int fd, void* dst, size_t n) {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
        const ssize_t r = ::read(fd, p, std::min(n, io_chunk));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

struct xxh3_state {
    XXH3_state_t* s = XXH3_createState();
    xxh3_state() {
        if (!s) throw std::bad_alloc();
        XXH3_64bits_reset(s);
    }
    ~xxh3_state() { XXH3_freeState(s); }
    xxh3_state(const xxh3_state&) = delete;
    xxh3_state& operator=(const xxh3_state&) = delete;
};

// A read-only private mapping of a whole file (data == nullptr when mmap failed).
struct mapped_file {
    const char* data = nullptr;
    size_t size = 0;
    mapped_file(int fd, size_t n) : size(n) {
        void* p = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (p != MAP_FAILED) data = static_cast<const char*>(p);
    }
    ~mapped_file() {
        if (data) ::munmap(const_cast<char*>(data), size);
    }
    mapped_file(const mapped_file&) = delete;
    mapped_file& operator=(const mapped_file&) = delete;
};

// Copies `count` elements at `src` into the (empty) vector `v` piece by piece, hashing each
// piece while it is still in cache; returns the XXH3-64 of the bytes. (assign() after a
// reserve: resize() would zero-fill first, which costs as much as the copy.)
template <class T>
uint64_t copy_array(const char* src, size_t count, std::vector<T>& v) {
    detail::reserve_huge(v, count);
    xxh3_state state;
    const size_t piece = io_chunk / sizeof(T);
    for (size_t done = 0; done < count; done += piece) {
        const size_t k = std::min(piece, count - done);
        const T* p = reinterpret_cast<const T*>(src) + done;
        v.insert(v.end(), p, p + k);
        XXH3_64bits_update(state.s, v.data() + done, k * sizeof(T));
    }
    return XXH3_64bits_digest(state.s);
}

// The source's content checksum. Up to 16 MiB it is XXH3-64 of every byte; above, of 256
// blocks of 16 KiB spread evenly from the first byte to the last (4 MiB read). Size and
// modification time are checked as well, so the sample only has to catch a file replaced
// with one of the same size and time; hashing all of a large file would make a cache hit
// cost a third of a parse, and the cache must be at least 20x faster than parsing.
constexpr uint64_t fingerprint_whole_limit = uint64_t{16} << 20;
constexpr uint64_t fingerprint_blocks = 256;
constexpr uint64_t fingerprint_block = uint64_t{16} << 10;

uint64_t fingerprint_offset(uint64_t i, uint64_t size) {
    return i * (size - fingerprint_block) / (fingerprint_blocks - 1);
}

uint64_t source_fingerprint(std::string_view text) {
    if (text.size() <= fingerprint_whole_limit) return XXH3_64bits(text.data(), text.size());
    xxh3_state st;
    for (uint64_t i = 0; i < fingerprint_blocks; ++i)
        XXH3_64bits_update(st.s, text.data() + fingerprint_offset(i, text.size()),
                           fingerprint_block);
    return XXH3_64bits_digest(st.s);
}

// source_fingerprint of an open file of `size` bytes (false on a read error or short read).
bool fingerprint_file(int fd, uint64_t size, uint64_t& hash) {
    xxh3_state st;
    std::unique_ptr<char[]> buf(new char[io_chunk]);
    auto hash_range = [&](uint64_t off, uint64_t n) {
        while (n > 0) {
            const ssize_t r =
                ::pread(fd, buf.get(), std::min<uint64_t>(n, io_chunk), static_cast<off_t>(off));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return false;
            XXH3_64bits_update(st.s, buf.get(), static_cast<size_t>(r));
            off += static_cast<uint64_t>(r);
            n -= static_cast<uint64_t>(r);
        }
        return true;
    };
    if (size <= fingerprint_whole_limit) {
        if (!hash_range(0, size)) return false;
    } else {
        for (uint64_t i = 0; i < fingerprint_blocks; ++i)
            if (!hash_range(fingerprint_offset(i, size), fingerprint_block)) return false;
    }
    hash = XXH3_64bits_digest(st.s);
    return true;
}

dataset parse_text(std::string_view text, const std::string& path, data_format format,
                   const load_options& options) {
    if (text.empty()) throw input_error(path, 0, "empty file");
    progress bar("parse " + std::filesystem::path(path).filename().string(), text.size(), "bytes",
                 options.show_progress);
    if (format == data_format::xc) return parse_xc(text, path, &bar);
    return parse_libsvm(text, path, options.min_features, options.min_labels, &bar);
}

// parse_text in the format asked for, or the one detect_format finds. A first line of numbers
// alone that is no XC header ("10 6", "10 6.0 4") reads as LibSVM and fails there on a
// LibSVM complaint ("truncated feature '6'"); what the user wrote was a header, so the XC
// reader's complaint about it is the one to give.
dataset parse_text_as(std::string_view text, const std::string& path, const load_options& options) {
    if (options.format != data_format::automatic)
        return parse_text(text, path, options.format, options);
    const data_format detected = detect_format(text);
    try {
        return parse_text(text, path, detected, options);
    } catch (const input_error& libsvm_error) {
        if (detected != data_format::libsvm) throw;
        // The first line that is not blank, and its number.
        std::string_view rest = text, first;
        if (rest.substr(0, 3) == "\xEF\xBB\xBF") rest.remove_prefix(3);
        size_t line = 0;
        while (!rest.empty() && first.empty()) {
            const size_t end = std::min(rest.find('\n'), rest.size());
            first = rest.substr(0, end);
            rest.remove_prefix(std::min(end + 1, rest.size()));
            ++line;
            if (first.find_first_not_of(" \t\r") == std::string_view::npos) first = {};
        }
        const bool numbers_alone =
            !first.empty() &&
            first.find_first_not_of("0123456789+-.eE \t\r") == std::string_view::npos;
        if (!numbers_alone || libsvm_error.line() != line) throw;
        parse_text(text, path, data_format::xc, options);  // throws the header's error
        throw;
    }
}

// XXH3-64 of every byte of an open file of `size` bytes (false on a read error or short read).
bool hash_whole_file(int fd, uint64_t size, uint64_t& hash) {
    xxh3_state st;
    std::unique_ptr<char[]> buf(new char[io_chunk]);
    for (uint64_t off = 0; off < size;) {
        const ssize_t r =
            ::pread(fd, buf.get(), std::min<uint64_t>(size - off, io_chunk), off_t(off));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        XXH3_64bits_update(st.s, buf.get(), size_t(r));
        off += uint64_t(r);
    }
    hash = XXH3_64bits_digest(st.s);
    return true;
}

// Loads the cache at `cache_path` when it matches `expect` (source size, mtime, format and
// minima; format 0 = any) and the source's checksum (with `verify`, of every byte). On a miss
// returns false and sets `why` (empty when there simply is no cache).
bool try_load_cache(const std::string& cache_path, const cache_header& expect, int source_fd,
                    bool verify, dataset& out, std::string& why) {
    // O_NONBLOCK: a FIFO at the cache's path must be refused below, not block the open.
    fd_guard cache{::open(cache_path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
    if (cache.fd < 0) {
        if (errno != ENOENT) why = fmt::format("cannot open it: {}", std::strerror(errno));
        return false;
    }
    struct stat st {};
    if (::fstat(cache.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        why = "not a regular file";
        return false;
    }
    const uint64_t file_size = static_cast<uint64_t>(st.st_size);
    cache_header h{};
    if (file_size < sizeof h || !read_exact(cache.fd, &h, sizeof h)) {
        why = "truncated header";
        return false;
    }
    if (std::memcmp(h.magic, cache_magic, sizeof h.magic) != 0 || h.endian != endian_tag ||
        h.header_xxh3 != header_hash(h)) {
        why = "not an hslide cache, or a corrupt header";
        return false;
    }
    if (h.version != cache_version) {
        why =
            fmt::format("cache format version {} (this build writes {})", h.version, cache_version);
        return false;
    }
    if ((expect.format != 0 && h.format != expect.format) || (h.format != 1 && h.format != 2)) {
        why = "written for another format";
        return false;
    }
    if (h.format == 2 &&
        (h.min_features != expect.min_features || h.min_labels != expect.min_labels)) {
        why = "written for other LibSVM minima";
        return false;
    }
    if (h.source_size != expect.source_size || h.source_mtime_ns != expect.source_mtime_ns) {
        why = "the source's size or modification time changed";
        return false;
    }
    // Sizes, checked piece by piece so that a corrupt count cannot overflow the sum.
    const uint64_t payload = file_size - sizeof h;
    if (h.n_points >= payload / 16 || h.feature_nnz > payload / 8 || h.label_nnz > payload / 4 ||
        (h.n_points + 1) * 16 + h.feature_nnz * 8 + h.label_nnz * 4 != payload ||
        h.n_features > (uint64_t{1} << 32) || h.n_labels > (uint64_t{1} << 32)) {
        why = "truncated or corrupt (sizes disagree)";
        return false;
    }
    // The source's fingerprint is a few MiB of reads: take it first. The payload is mapped
    // and its arrays copied, hashed and range-checked on up to two threads at once (a cache
    // hit is bound by memory traffic, and two streams go faster than one).
    uint64_t source_hash = 0;
    if (!fingerprint_file(source_fd, expect.source_size, source_hash)) {
        why = "cannot read the source";
        return false;
    }
    if (source_hash != h.source_xxh3) {
        why = "the source's content changed";
        return false;
    }
    if (verify && expect.source_size > fingerprint_whole_limit) {
        uint64_t full = 0;
        if (!hash_whole_file(source_fd, expect.source_size, full)) {
            why = "cannot read the source";
            return false;
        }
        if (h.source_full_xxh3 == 0 || std::max<uint64_t>(1, full) != h.source_full_xxh3) {
            why = h.source_full_xxh3 == 0
                      ? "it has no checksum of the whole source (--verify-cache)"
                      : "the source's content changed (whole-file checksum)";
            return false;
        }
    }
    const mapped_file map(cache.fd, file_size);
    if (!map.data) {
        why = fmt::format("cannot map it: {}", std::strerror(errno));
        return false;
    }

    dataset d;
    const size_t n = h.n_points;
    d.n_features = h.n_features;
    d.n_labels = h.n_labels;
    d.feature_offsets.clear();
    d.label_offsets.clear();
    const char* at = map.data + sizeof h;
    const char* const feature_offsets_at = at;
    const char* const label_offsets_at = feature_offsets_at + (n + 1) * 8;
    const char* const feature_ids_at = label_offsets_at + (n + 1) * 8;
    const char* const feature_values_at = feature_ids_at + h.feature_nnz * 4;
    const char* const label_ids_at = feature_values_at + h.feature_nnz * 4;
    uint64_t hashes[5] = {};
    auto copy_one = [&](int array) {
        switch (array) {
            case 0:  // the largest first, so the two threads finish together
                hashes[2] = copy_array(feature_ids_at, h.feature_nnz, d.feature_ids);
                break;
            case 1:
                hashes[3] = copy_array(feature_values_at, h.feature_nnz, d.feature_values);
                break;
            case 2:
                hashes[0] = copy_array(feature_offsets_at, n + 1, d.feature_offsets);
                break;
            case 3:
                hashes[1] = copy_array(label_offsets_at, n + 1, d.label_offsets);
                break;
            default:
                hashes[4] = copy_array(label_ids_at, h.label_nnz, d.label_ids);
                break;
        }
    };
    bool out_of_memory = false;
#pragma omp parallel for schedule(dynamic, 1) num_threads(2)
    for (int array = 0; array < 5; ++array) {
        try {  // nothing may escape an OpenMP region
            copy_one(array);
        } catch (const std::bad_alloc&) {
#pragma omp atomic write
            out_of_memory = true;
        }
    }
    if (out_of_memory)
        throw_host_out_of_memory(
            fmt::format("the dataset cache {} ({} points, {} feature and {} label "
                        "entries)",
                        cache_path, n, h.feature_nnz, h.label_nnz),
            (n + 1) * 16 + h.feature_nnz * 8 + h.label_nnz * 4);
    if (XXH3_64bits(hashes, sizeof hashes) != h.payload_xxh3) {
        why = "corrupt payload (checksum mismatch)";
        return false;
    }
    // The checksum catches accidental damage; the full check (offsets, ids in range, sorted
    // and unique, finite values) keeps a forged cache from handing the trainer what no
    // reader would.
    const std::string problem = dataset_problem(d);
    if (!problem.empty()) {
        why = "inconsistent payload: " + problem;
        return false;
    }
    out = std::move(d);
    return true;
}

// Writes the cache through a temporary file and a rename; returns "" or what went wrong.
std::string write_cache(const std::string& cache_path, cache_header h, const dataset& d) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path dir = fs::path(cache_path).parent_path();
    if (!dir.empty()) fs::create_directories(dir, ec);
    if (ec) return fmt::format("cannot create {}: {}", dir.string(), ec.message());

    std::memcpy(h.magic, cache_magic, sizeof h.magic);
    h.version = cache_version;
    h.endian = endian_tag;
    h.n_points = d.size();
    h.n_features = d.n_features;
    h.n_labels = d.n_labels;
    h.feature_nnz = d.feature_ids.size();
    h.label_nnz = d.label_ids.size();
    struct piece {
        const void* p;
        size_t n;
    };
    const piece pieces[] = {
        {d.feature_offsets.data(), d.feature_offsets.size() * 8},
        {d.label_offsets.data(), d.label_offsets.size() * 8},
        {d.feature_ids.data(), d.feature_ids.size() * 4},
        {d.feature_values.data(), d.feature_values.size() * 4},
        {d.label_ids.data(), d.label_ids.size() * 4},
    };
    {
        // One hash per array, then a hash of the five: the reader checks the arrays in
        // parallel.
        uint64_t hashes[5];
        for (size_t i = 0; i < 5; ++i) hashes[i] = XXH3_64bits(pieces[i].p, pieces[i].n);
        h.payload_xxh3 = XXH3_64bits(hashes, sizeof hashes);
    }
    h.header_xxh3 = header_hash(h);

    // A FIFO or device at the cache's path is no cache: leave it alone.
    struct stat st {};
    if (::stat(cache_path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
        return fmt::format("{} exists and is not a regular file", cache_path);
    try {
        output_file out(cache_path);
        out.write(&h, sizeof h);
        for (const auto& pc : pieces) out.write(pc.p, pc.n);
        out.commit();
    } catch (const error& e) {
        return e.what();
    }
    return "";
}

// A directory counts as writable only when access(2) says so and its mode has a write bit:
// root passes access() on a deliberately read-only (r-x) folder such as the shared data.
bool dir_writable(const std::string& dir) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    if ((st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) == 0) return false;
    return ::access(dir.c_str(), W_OK) == 0;
}

std::string hashed_cache_name(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path abs = fs::weakly_canonical(fs::absolute(path, ec), ec);
    if (ec) abs = fs::absolute(path, ec).lexically_normal();
    const std::string a = abs.string();
    return fmt::format("{}-{:016x}.hscache", fs::path(path).filename().string(),
                       XXH3_64bits(a.data(), a.size()));
}

}  // namespace

std::string cache_path_for(const std::string& path, const load_options& options) {
    namespace fs = std::filesystem;
    if (!options.cache_dir.empty()) {
        return (fs::path(options.cache_dir) / hashed_cache_name(path)).string();
    }
    fs::path dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
    if (dir_writable(dir.string())) return path + ".hscache";
    fs::path base;
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    if (xdg && xdg[0] == '/') {
        base = xdg;
    } else if (home && home[0] != '\0') {
        base = fs::path(home) / ".cache";
    } else {
        base = fs::temp_directory_path();
    }
    return (base / "hslide" / hashed_cache_name(path)).string();
}

dataset load_dataset(const std::string& path, const load_options& options) {
    fd_guard src{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (src.fd < 0)
        throw input_error(path, 0, fmt::format("cannot open: {}", std::strerror(errno)));
    struct stat st {};
    if (::fstat(src.fd, &st) != 0) {
        throw input_error(path, 0, fmt::format("cannot stat: {}", std::strerror(errno)));
    }
    const bool regular = S_ISREG(st.st_mode);
    if (regular && st.st_size == 0) throw input_error(path, 0, "empty file");

    if (!options.use_cache || !regular) {
        // Pipes and devices have no stable identity to cache against.
        const detail::text_buffer text =
            detail::read_all(src.fd, path, regular ? static_cast<size_t>(st.st_size) : 0);
        return parse_text_as(text.view(), path, options);
    }

    const std::string cpath = cache_path_for(path, options);
    cache_header expect{};
    expect.source_size = static_cast<uint64_t>(st.st_size);
    expect.source_mtime_ns = mtime_ns(st);
    expect.format = options.format == data_format::automatic ? 0 : format_code(options.format);
    expect.min_features = options.min_features;
    expect.min_labels = options.min_labels;
    {
        dataset cached;
        std::string why;
        if (try_load_cache(cpath, expect, src.fd, options.verify_cache, cached, why)) {
            cached.source = path;
            spdlog::debug("{}: loaded from cache {}", path, cpath);
            return cached;
        }
        if (!why.empty()) spdlog::info("{}: ignoring cache {}: {}; re-parsing", path, cpath, why);
    }

    const detail::text_buffer buf = detail::read_all(src.fd, path, static_cast<size_t>(st.st_size));
    const std::string_view text = buf.view();
    dataset data = parse_text_as(text, path, options);

    // Record what was parsed; skip the cache when the file changed while it was read.
    struct stat after {};
    if (::fstat(src.fd, &after) != 0 || after.st_size != st.st_size ||
        mtime_ns(after) != mtime_ns(st) || text.size() != static_cast<size_t>(st.st_size)) {
        spdlog::warn("{}: changed while being read; not caching it", path);
        return data;
    }
    cache_header h{};
    h.source_size = text.size();
    h.source_mtime_ns = mtime_ns(st);
    h.source_xxh3 = source_fingerprint(text);
    h.source_full_xxh3 = std::max<uint64_t>(1, XXH3_64bits(text.data(), text.size()));
    // The format it was read in (detection reads the first line alone).
    const data_format f =
        options.format == data_format::automatic ? detect_format(text) : options.format;
    h.format = format_code(f);
    h.min_features = f == data_format::libsvm ? options.min_features : 0;
    h.min_labels = f == data_format::libsvm ? options.min_labels : 0;
    const std::string failure = write_cache(cpath, h, data);
    if (!failure.empty()) spdlog::warn("{}: binary cache not written: {}", path, failure);
    return data;
}

}  // namespace hslide
