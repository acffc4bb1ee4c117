// The checkpoint file container: a set of named binary sections (weights, optimizer state,
// hash tables, rng states, a JSON description...) in one checksummed file, written atomically.
//
// The model code decides what the sections hold; this header only stores and validates them.
//
// File layout (little-endian; format version 1):
//
//     "HSLIDECK"                      8 bytes of magic
//     uint32 version                  checkpoint_format_version
//     uint32 section count
//     per section, in order:          the section table
//         uint32 name length, name bytes (1..1024 bytes, unique names)
//         uint64 payload offset, uint64 payload size, uint64 XXH3-64 of the payload
//     payloads, each starting at a 64-byte-aligned offset (zero padding between them)
//     uint64 XXH3-64 of every byte before it
//
// Writing: checkpoint_writer::commit() writes through a durable hslide::output_file
// (output_file.hpp): `path.tmp.<pid>.<n>`, fsynced, renamed over `path`, the folder fsynced,
// so `path` always holds either the old complete checkpoint or the new complete one; a failed
// or abandoned write leaves the old file untouched, and the temporaries of a killed save are
// removed by the next save of `path`.
//
// Reading: checkpoint_reader maps the file and validates all of it when constructed (magic,
// version, every offset and size against the file size before anything is allocated, each
// section's checksum, the whole-file checksum). Every problem throws hslide::input_error with
// the path and a precise reason, e.g. "truncated: expected 4096 bytes, file has 1000",
// "checksum mismatch in section 'weights'", "not an hslide checkpoint (bad magic)",
// "missing section 'adam_m'".
// The reader keeps the file mapped; it must not be rewritten in place meanwhile (hslide never
// does: a writer replaces the file by rename, and the reader keeps the old one).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "hslide/error.hpp"

namespace hslide {

/// The format version this build writes and reads.
inline constexpr uint32_t checkpoint_format_version = 1;

/// Collects sections in memory, then writes them in one atomic commit().
class checkpoint_writer {
  public:
    explicit checkpoint_writer(std::string path);

    /// Adds a section holding a copy of `bytes` bytes at `data`. Names must be unique and 1 to
    /// 1024 bytes long (checked).
    void add(std::string name, const void* data, size_t bytes);

    /// Like add() without the copy: `data` must stay valid and unchanged until commit() returns
    /// (for large buffers such as weights, to avoid doubling memory).
    void add_unowned(std::string name, const void* data, size_t bytes);

    /// A copy of a vector of trivially copyable values (its raw bytes).
    template <class T>
    void add_vector(std::string name, const std::vector<T>& values) {
        static_assert(std::is_trivially_copyable_v<T>, "sections hold raw bytes");
        add(std::move(name), values.data(), values.size() * sizeof(T));
    }

    /// A copy of one trivially copyable value.
    template <class T>
    void add_pod(std::string name, const T& value) {
        static_assert(std::is_trivially_copyable_v<T>, "sections hold raw bytes");
        add(std::move(name), &value, sizeof(T));
    }

    /// A text section.
    void add_string(std::string name, std::string_view text);

    /// A JSON section (stored as its compact text).
    void add_json(std::string name, const nlohmann::json& value);

    bool has(const std::string& name) const;

    /// Writes the file atomically (see the file comment). Throws hslide::error(io) naming the
    /// path and the OS reason on failure; `path` is then unchanged. Can be called once.
    void commit();

    const std::string& path() const { return path_; }

  private:
    struct section {
        std::string name;
        const uint8_t* data;
        size_t size;
        std::unique_ptr<uint8_t[]> owned;
    };
    void add_section(std::string name, const void* data, size_t bytes, bool copy);

    std::string path_;
    std::vector<section> sections_;
    bool committed_ = false;
};

/// Maps a checkpoint file, validates it completely, and hands out its sections.
class checkpoint_reader {
  public:
    /// Opens and validates `path`; throws hslide::input_error(path, 0, reason) on any problem.
    explicit checkpoint_reader(std::string path);
    ~checkpoint_reader();
    checkpoint_reader(checkpoint_reader&& other) noexcept;
    checkpoint_reader& operator=(checkpoint_reader&& other) noexcept;
    checkpoint_reader(const checkpoint_reader&) = delete;
    checkpoint_reader& operator=(const checkpoint_reader&) = delete;

    /// A read-only view of a payload; valid while the reader lives. `data` is 64-byte aligned.
    struct bytes_view {
        const uint8_t* data;
        size_t size;
    };

    bool has(const std::string& name) const;

    /// Section names in file order.
    std::vector<std::string> names() const;

    /// The payload of section `name`; throws input_error "missing section 'name'".
    bytes_view get(const std::string& name) const;

    /// A copy of the payload.
    std::vector<uint8_t> get_bytes(const std::string& name) const;

    /// The payload as a vector of T; its size must be a multiple of sizeof(T).
    template <class T>
    std::vector<T> get_vector(const std::string& name) const {
        static_assert(std::is_trivially_copyable_v<T>, "sections hold raw bytes");
        const bytes_view v = get(name);
        if (v.size % sizeof(T) != 0) size_error(name, v.size, sizeof(T), true);
        std::vector<T> out(v.size / sizeof(T));
        if (v.size) std::memcpy(out.data(), v.data, v.size);
        return out;
    }

    /// The payload as one T; its size must be sizeof(T).
    template <class T>
    T get_pod(const std::string& name) const {
        static_assert(std::is_trivially_copyable_v<T>, "sections hold raw bytes");
        const bytes_view v = get(name);
        if (v.size != sizeof(T)) size_error(name, v.size, sizeof(T), false);
        T out;
        std::memcpy(&out, v.data, sizeof(T));
        return out;
    }

    std::string get_string(const std::string& name) const;

    /// The payload parsed as JSON; a parse failure is an input_error naming the section.
    nlohmann::json get_json(const std::string& name) const;

    uint32_t version() const { return version_; }
    const std::string& path() const { return path_; }
    /// Size of the whole file in bytes.
    size_t file_size() const { return size_; }

  private:
    [[noreturn]] void fail(const std::string& reason) const;
    [[noreturn]] void size_error(const std::string& name, size_t size, size_t elem,
                                 bool multiple) const;
    void validate();
    void unmap() noexcept;

    std::string path_;
    const uint8_t* map_ = nullptr;
    size_t size_ = 0;
    uint32_t version_ = 0;
    std::vector<std::string> order_;
    std::unordered_map<std::string, bytes_view> sections_;
};

}  // namespace hslide
