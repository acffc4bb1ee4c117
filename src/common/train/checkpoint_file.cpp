// The checkpoint file container: atomic writer and validating, memory-mapped reader.
// Layout and guarantees are described in include/hslide/checkpoint_file.hpp.
#include "hslide/checkpoint_file.hpp"

#include "common/util/json_util.hpp"
#include "hslide/output_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the checkpoint format is little-endian and written with plain memcpy");

namespace hslide {

namespace {

constexpr char magic[8] = {'H', 'S', 'L', 'I', 'D', 'E', 'C', 'K'};
constexpr size_t fixed_header = 16;  // magic + version + section count
constexpr size_t trailer = 8;        // whole-file XXH3-64
constexpr size_t min_entry = 4 + 1 + 24;
constexpr size_t max_name = 1024;
constexpr uint64_t alignment = 64;
// No real checkpoint comes near this; rejecting larger values keeps the layout arithmetic of a
// corrupt table free of overflow.
constexpr uint64_t max_plausible = uint64_t{1} << 60;

uint64_t align_up(uint64_t x) {
    return (x + alignment - 1) / alignment * alignment;
}

template <class T>
void put(std::string& out, T value) {
    out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <class T>
T load(const uint8_t* p) {
    T value;
    std::memcpy(&value, p, sizeof(T));
    return value;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// checkpoint_writer

checkpoint_writer::checkpoint_writer(std::string path) : path_(std::move(path)) {
    HSLIDE_CHECK(!path_.empty(), "checkpoint path is empty");
}

void checkpoint_writer::add_section(std::string name, const void* data, size_t bytes, bool copy) {
    HSLIDE_CHECK(!committed_, "checkpoint '{}' was already committed", path_);
    HSLIDE_CHECK(!name.empty() && name.size() <= max_name,
                 "checkpoint section name must be 1 to {} bytes, got {}", max_name, name.size());
    HSLIDE_CHECK(!has(name), "checkpoint section '{}' added twice", name);
    HSLIDE_CHECK(data != nullptr || bytes == 0, "checkpoint section '{}' has no data", name);
    section s{std::move(name), static_cast<const uint8_t*>(data), bytes, nullptr};
    if (copy && bytes > 0) {
        s.owned.reset(new uint8_t[bytes]);
        std::memcpy(s.owned.get(), data, bytes);
        s.data = s.owned.get();
    }
    sections_.push_back(std::move(s));
}

void checkpoint_writer::add(std::string name, const void* data, size_t bytes) {
    add_section(std::move(name), data, bytes, true);
}

void checkpoint_writer::add_unowned(std::string name, const void* data, size_t bytes) {
    add_section(std::move(name), data, bytes, false);
}

void checkpoint_writer::add_string(std::string name, std::string_view text) {
    add(std::move(name), text.data(), text.size());
}

void checkpoint_writer::add_json(std::string name, const nlohmann::json& value) {
    add_string(std::move(name), value.dump());
}

bool checkpoint_writer::has(const std::string& name) const {
    return std::any_of(sections_.begin(), sections_.end(),
                       [&](const section& s) { return s.name == name; });
}

void checkpoint_writer::commit() {
    HSLIDE_CHECK(!committed_, "checkpoint '{}' was already committed", path_);

    size_t table_end = fixed_header;
    for (const auto& s : sections_) table_end += 4 + s.name.size() + 24;
    std::string header;
    header.append(magic, sizeof(magic));
    put<uint32_t>(header, checkpoint_format_version);
    put<uint32_t>(header, static_cast<uint32_t>(sections_.size()));
    std::vector<uint64_t> offsets;
    uint64_t offset = align_up(table_end);
    for (const auto& s : sections_) {
        put<uint32_t>(header, static_cast<uint32_t>(s.name.size()));
        header += s.name;
        put<uint64_t>(header, offset);
        put<uint64_t>(header, s.size);
        put<uint64_t>(header, XXH3_64bits(s.data, s.size));
        offsets.push_back(offset);
        offset = align_up(offset + s.size);
    }
    HSLIDE_ASSERT(header.size() == table_end);

    output_file out(path_, /*durable=*/true);
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash(XXH3_createState(),
                                                                  &XXH3_freeState);
    HSLIDE_ASSERT(hash != nullptr);
    XXH3_64bits_reset(hash.get());
    const auto write = [&](const void* data, size_t size) {
        XXH3_64bits_update(hash.get(), data, size);
        out.write(data, size);
    };
    static const uint8_t zeros[alignment] = {};
    write(header.data(), header.size());
    uint64_t written = header.size();
    for (size_t i = 0; i < sections_.size(); ++i) {
        write(zeros, offsets[i] - written);
        write(sections_[i].data, sections_[i].size);
        written = offsets[i] + sections_[i].size;
    }
    const uint64_t total_hash = XXH3_64bits_digest(hash.get());
    out.write(&total_hash, sizeof(total_hash));
    out.commit();
    committed_ = true;
}

// ---------------------------------------------------------------------------------------------
// checkpoint_reader

checkpoint_reader::checkpoint_reader(std::string path) : path_(std::move(path)) {
    // O_NONBLOCK: a FIFO given as the checkpoint is refused below instead of blocking here.
    const int fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) fail(fmt::format("cannot open: {}", std::strerror(errno)));
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(
            "not a regular file (a checkpoint is memory-mapped: give the file itself, not a "
            "pipe or device)");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        const int err = errno;
        ::close(fd);
        if (p == MAP_FAILED) fail(fmt::format("cannot map: {}", std::strerror(err)));
        map_ = static_cast<const uint8_t*>(p);
    } else {
        ::close(fd);
    }
    try {
        validate();
    } catch (...) {
        unmap();
        throw;
    }
}

checkpoint_reader::~checkpoint_reader() {
    unmap();
}

checkpoint_reader::checkpoint_reader(checkpoint_reader&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      version_(other.version_),
      order_(std::move(other.order_)),
      sections_(std::move(other.sections_)) {}

checkpoint_reader& checkpoint_reader::operator=(checkpoint_reader&& other) noexcept {
    if (this != &other) {
        unmap();
        path_ = std::move(other.path_);
        map_ = std::exchange(other.map_, nullptr);
        size_ = std::exchange(other.size_, 0);
        version_ = other.version_;
        order_ = std::move(other.order_);
        sections_ = std::move(other.sections_);
    }
    return *this;
}

void checkpoint_reader::unmap() noexcept {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
    map_ = nullptr;
}

void checkpoint_reader::fail(const std::string& reason) const {
    throw input_error(path_, 0, reason);
}

void checkpoint_reader::size_error(const std::string& name, size_t size, size_t elem,
                                   bool multiple) const {
    fail(fmt::format("section '{}' has {} bytes, expected {}{}", name, size,
                     multiple ? "a multiple of " : "", elem));
}

void checkpoint_reader::validate() {
    const size_t min_size = fixed_header + trailer;
    // A file shorter than the magic but agreeing with it is a truncated checkpoint.
    const size_t head = std::min(size_, sizeof(magic));
    if (head > 0 && std::memcmp(map_, magic, head) != 0)
        fail("not an hslide checkpoint (bad magic)");
    if (size_ < min_size)
        fail(fmt::format("truncated: expected at least {} bytes, file has {}", min_size, size_));

    const uint64_t file_hash = XXH3_64bits(map_, size_ - trailer);
    const bool file_hash_ok = file_hash == load<uint64_t>(map_ + size_ - trailer);
    version_ = load<uint32_t>(map_ + 8);
    if (version_ != checkpoint_format_version) {
        if (!file_hash_ok)
            fail(
                fmt::format("corrupt header: format version reads {} (this build reads version "
                            "{}) and the file checksum does not match",
                            version_, checkpoint_format_version));
        fail(
            fmt::format("unsupported checkpoint format version {} (this build reads version {}; "
                        "the file was written by {} hslide)",
                        version_, checkpoint_format_version,
                        version_ > checkpoint_format_version ? "a newer" : "an older"));
    }

    const uint32_t count = load<uint32_t>(map_ + 12);
    const size_t body = size_ - trailer;  // where the table and payloads must end
    if (count > (body - fixed_header) / min_entry)
        fail(fmt::format("truncated: a table of {} sections needs at least {} bytes, file has {}",
                         count, fixed_header + uint64_t{count} * min_entry + trailer, size_));

    struct entry {
        std::string name;
        uint64_t offset, size, hash;
    };
    std::vector<entry> entries;
    entries.reserve(count);
    size_t pos = fixed_header;
    for (uint32_t i = 0; i < count; ++i) {
        auto need = [&](size_t n) {
            if (pos + n > body)
                fail(fmt::format("truncated: the section table ends past the file's {} bytes",
                                 size_));
        };
        need(4);
        const uint32_t name_len = load<uint32_t>(map_ + pos);
        pos += 4;
        if (name_len == 0 || name_len > max_name)
            fail(
                fmt::format("corrupt section table: entry {} has a name of {} bytes", i, name_len));
        need(name_len + 24);
        entry e;
        e.name.assign(reinterpret_cast<const char*>(map_ + pos), name_len);
        pos += name_len;
        e.offset = load<uint64_t>(map_ + pos);
        e.size = load<uint64_t>(map_ + pos + 8);
        e.hash = load<uint64_t>(map_ + pos + 16);
        pos += 24;
        entries.push_back(std::move(e));
    }

    // Offsets must follow the writer's layout exactly; sizes are checked against the file
    // before any payload is touched.
    uint64_t expected = align_up(pos);
    uint64_t end = pos;
    for (const auto& e : entries) {
        if (e.offset != expected)
            fail(fmt::format("corrupt section table: section '{}' starts at {} (expected {})",
                             e.name, e.offset, expected));
        if (e.size > max_plausible)
            fail(
                fmt::format("corrupt section table: section '{}' claims {} bytes", e.name, e.size));
        end = e.offset + e.size;
        if (end > max_plausible)
            fail(fmt::format("corrupt section table: section '{}' ends at byte {}", e.name, end));
        expected = align_up(end);
    }
    if (end + trailer > size_)
        fail(fmt::format("truncated: expected {} bytes, file has {}", end + trailer, size_));
    if (end + trailer < size_)
        fail(
            fmt::format("{} unexpected bytes after the end of the checkpoint (expected {} "
                        "bytes, file has {})",
                        size_ - end - trailer, end + trailer, size_));

    for (auto& e : entries) {
        if (sections_.count(e.name))
            fail(fmt::format("corrupt section table: section '{}' appears twice", e.name));
        const uint8_t* data = map_ + e.offset;
        if (XXH3_64bits(data, e.size) != e.hash)
            fail(fmt::format("checksum mismatch in section '{}'", e.name));
        sections_.emplace(e.name, bytes_view{data, static_cast<size_t>(e.size)});
        order_.push_back(std::move(e.name));
    }
    // Every payload matched, so the difference is in the header, table, padding or trailer.
    if (!file_hash_ok) fail("file checksum mismatch (header, section table or padding corrupt)");
}

bool checkpoint_reader::has(const std::string& name) const {
    return sections_.count(name) != 0;
}

std::vector<std::string> checkpoint_reader::names() const {
    return order_;
}

checkpoint_reader::bytes_view checkpoint_reader::get(const std::string& name) const {
    const auto it = sections_.find(name);
    if (it == sections_.end()) fail(fmt::format("missing section '{}'", name));
    return it->second;
}

std::vector<uint8_t> checkpoint_reader::get_bytes(const std::string& name) const {
    const bytes_view v = get(name);
    return std::vector<uint8_t>(v.data, v.data + v.size);
}

std::string checkpoint_reader::get_string(const std::string& name) const {
    const bytes_view v = get(name);
    return std::string(reinterpret_cast<const char*>(v.data), v.size);
}

nlohmann::json checkpoint_reader::get_json(const std::string& name) const {
    const bytes_view v = get(name);
    try {
        return detail::parse_json_limited(
            std::string_view(reinterpret_cast<const char*>(v.data), v.size),
            fmt::format("section '{}'", name));
    } catch (const error& e) {
        fail(e.what());
    }
}

}  // namespace hslide
