// The text readers of hslide/dataset.hpp (XC, LibSVM, XC split files) and the in-memory
// operations on a dataset (push_back, subset). The binary cache is in dataset_cache.cpp.
#include "hslide/dataset.hpp"

#include "common/data/dataset_io.hpp"
#include "hslide/error.hpp"
#include "hslide/input_check.hpp"
#include "hslide/memory.hpp"
#include "hslide/progress.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

namespace hslide {

namespace detail {

void advise_huge_pages(const void* p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    constexpr uintptr_t huge = uintptr_t{2} << 20;
    if (bytes < 2 * huge) return;
    const auto b = reinterpret_cast<uintptr_t>(p);
    const uintptr_t first = (b + huge - 1) & ~(huge - 1);
    const uintptr_t last = (b + bytes) & ~(huge - 1);
    // Only advice: a kernel without transparent huge pages refuses, and that is fine.
    if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

text_buffer::text_buffer(size_t capacity) {
    if (capacity == 0) return;
    void* m = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<char*>(m);
    capacity_ = capacity;
    advise_huge_pages(data_, capacity_);
}

text_buffer::~text_buffer() {
    if (data_) ::munmap(data_, capacity_);
}

text_buffer::text_buffer(text_buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)) {}

text_buffer& text_buffer::operator=(text_buffer&& other) noexcept {
    if (this != &other) {
        if (data_) ::munmap(data_, capacity_);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        capacity_ = std::exchange(other.capacity_, 0);
    }
    return *this;
}

// The bytes read_all checks for a NUL as it reads them.
constexpr size_t text_check_bytes = size_t(1) << 20;

text_buffer read_all(int fd, const std::string& path, size_t size_hint) {
    // One spare byte, so that reading a file of exactly the expected size ends with a read
    // of 0 bytes rather than a reallocation.
    text_buffer buf(std::max<size_t>(size_hint + 1, 1 << 16));
    size_t used = 0;
    bool seekable = true;
    for (;;) {
        if (used == buf.capacity()) {  // the file grew, or its size was unknown
            text_buffer bigger(buf.capacity() * 2);
            std::memcpy(bigger.data(), buf.data(), used);
            buf = std::move(bigger);
        }
        // pread where the file can seek (the file position is then unused); read() on a pipe,
        // where pread fails with ESPIPE.
        const ssize_t n = seekable
                              ? ::pread(fd, buf.data() + used, buf.capacity() - used, off_t(used))
                              : ::read(fd, buf.data() + used, buf.capacity() - used);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == ESPIPE && seekable && used == 0) {
                seekable = false;
                continue;
            }
            throw input_error(path, 0, fmt::format("cannot read: {}", std::strerror(errno)));
        }
        if (n == 0) break;
        // A device that never ends (/dev/zero, /dev/urandom) would fill the memory before the
        // parser saw its first line: its first bytes already say it is no text file.
        if (used < text_check_bytes) {
            const char* begin = buf.data();
            const char* nul = static_cast<const char*>(std::memchr(begin + used, '\0', size_t(n)));
            if (nul)
                throw input_error(
                    path, size_t(std::count(begin, nul, '\n')) + 1,
                    fmt::format("a NUL byte (byte {}): not a text file", size_t(nul - begin) + 1));
        }
        used += static_cast<size_t>(n);
    }
    buf.set_size(used);
    return buf;
}

text_buffer read_file(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw input_error(path, 0, fmt::format("cannot open: {}", std::strerror(errno)));
    struct fd_closer {
        int fd;
        ~fd_closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    size_t hint = 0;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) hint = static_cast<size_t>(st.st_size);
    text_buffer text = read_all(fd, path, hint);
    if (text.size() == 0) throw input_error(path, 0, "empty file");
    return text;
}

}  // namespace detail

namespace {

constexpr uint64_t max_id = std::numeric_limits<uint32_t>::max();

inline bool is_blank(char c) {
    return c == ' ' || c == '\t';
}
inline bool is_digit(char c) {
    return static_cast<unsigned char>(c - '0') < 10;
}

// A printable excerpt of the input for error messages (control bytes escaped, long tokens cut).
std::string quote(const char* b, const char* e) {
    constexpr size_t max_len = 40;
    std::string out = "'";
    for (const char* p = b; p < e && out.size() < max_len; ++p) {
        const auto c = static_cast<unsigned char>(*p);
        if (c >= 0x20 && c < 0x7f) {
            out += static_cast<char>(c);
        } else {
            out += fmt::format("\\x{:02x}", c);
        }
    }
    if (static_cast<size_t>(e - b) > max_len) out += "...";
    return out + "'";
}

// The token starting at p: up to the next blank or line end.
const char* token_end(const char* p, const char* e) {
    while (p < e && !is_blank(*p)) ++p;
    return p;
}

// Reads decimal digits at p (at least one is there); values above 2^32-1 saturate just above
// it so that the caller can report "too large" without overflow.
inline const char* parse_digits(const char* p, const char* e, uint64_t& value) {
    uint64_t v = 0;
    while (p < e && is_digit(*p)) {
        if (v <= max_id) v = v * 10 + static_cast<uint64_t>(*p - '0');
        ++p;
    }
    value = v;
    return p;
}

// The power of ten of the first non-zero digit of the decimal number [b, e) (digits, an
// optional '.', an optional exponent; a leading sign is skipped): 2 for 123.4, -3 for 0.0012e0,
// -398 for 12e-400. Saturates far beyond any float. Only called on numbers from_chars read.
long long leading_exponent(const char* b, const char* e) {
    if (b < e && (*b == '-' || *b == '+')) ++b;
    const char* p = b;
    long long lead = 0;
    bool found = false;
    for (; p < e && is_digit(*p); ++p) {  // the integer part: each digit after the first
        if (found) ++lead;                // non-zero one is one more power of ten
        found = found || *p != '0';
    }
    if (p < e && *p == '.') {
        long long place = 0;
        for (++p; p < e && is_digit(*p); ++p) {
            --place;
            if (!found && *p != '0') {
                found = true;
                lead = place;
            }
        }
    }
    long long exponent = 0;
    if (p < e && (*p == 'e' || *p == 'E')) {
        ++p;
        const bool negative = p < e && *p == '-';
        if (p < e && (*p == '-' || *p == '+')) ++p;
        for (; p < e && is_digit(*p); ++p)
            if (exponent < 1000000) exponent = exponent * 10 + (*p - '0');
        if (negative) exponent = -exponent;
    }
    return lead + exponent;
}

// Text saved by Windows editors may start with a UTF-8 byte-order mark; it is not content.
std::string_view skip_bom(std::string_view text) {
    if (text.size() >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.remove_prefix(3);
    return text;
}

// One line of the text: [begin, end) without the line break (a CR before the LF is dropped).
struct line_view {
    const char* begin;
    const char* end;
    const char* next;  // start of the following line
};

inline line_view next_line(const char* p, const char* text_end) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', text_end - p));
    const char* le = nl ? nl : text_end;
    const char* next = nl ? nl + 1 : text_end;
    if (le > p && le[-1] == '\r') --le;
    return {p, le, next};
}

inline bool is_blank_line(const char* b, const char* e) {
    while (b < e && is_blank(*b)) ++b;
    return b == e;
}

// Splits a line into blank-separated tokens (only for short lines: headers, split rows).
std::vector<std::pair<const char*, const char*>> tokens(const char* b, const char* e) {
    std::vector<std::pair<const char*, const char*>> out;
    while (b < e) {
        while (b < e && is_blank(*b)) ++b;
        if (b == e) break;
        const char* t = token_end(b, e);
        out.emplace_back(b, t);
        b = t;
    }
    return out;
}

bool all_digits(const char* b, const char* e) {
    if (b == e) return false;
    for (; b < e; ++b)
        if (!is_digit(*b)) return false;
    return true;
}

// The parser shared by the XC and LibSVM readers. `libsvm` selects 1-based features and
// bounds found from the data instead of a header.
class point_parser {
  public:
    point_parser(const std::string& name, bool libsvm, uint64_t n_features, uint64_t n_labels,
                 dataset& out)
        : name_(name), libsvm_(libsvm), d_(n_features), l_(n_labels), out_(out) {}

    // Parses one non-blank line [b, e) as a point and appends it to the dataset.
    void parse(const char* b, const char* e, size_t line_no) {
        line_ = line_no;
        line_begin_ = b;
        line_end_ = e;
        const char* p = b;
        const size_t label_start = out_.label_ids.size();
        if (!is_blank(*p)) p = parse_labels(p, e);
        const size_t n_labels = out_.label_ids.size() - label_start;
        if (n_labels > 1) check_unique_labels(label_start, n_labels);
        parse_features(p, e);
        out_.feature_offsets.push_back(out_.feature_ids.size());
        out_.label_offsets.push_back(out_.label_ids.size());
    }

    uint64_t max_feature_plus_one() const { return max_feature_plus_one_; }
    uint64_t max_label_plus_one() const { return max_label_plus_one_; }

  private:
    [[noreturn]] void fail(const char* at, const std::string& reason) const {
        throw input_error(name_, line_,
                          fmt::format("{} (column {})", reason, at - line_begin_ + 1));
    }

    // An id was expected at p but p holds no digit.
    [[noreturn]] void bad_id(const char* p, const char* e, const char* what) const {
        const char* t = token_end(p, e);
        if (p == e || is_blank(*p)) fail(p, fmt::format("missing {} id", what));
        if (*p == ',') fail(p, fmt::format("empty {} id between commas", what));
        if (*p == '-') fail(p, fmt::format("negative {} id in {}", what, quote(p, t)));
        fail(p, fmt::format("non-numeric {} id in {}", what, quote(p, t)));
    }

    const char* parse_labels(const char* p, const char* e) {
        const char* list = p;
        if (!is_digit(*p)) {
            // The first token may be a label list or a feature; name what it looks like.
            const char* t = token_end(p, e);
            const bool feature_like = std::find(p, t, ':') != t;
            bad_id(p, e, feature_like ? "feature" : "label");
        }
        uint64_t v;
        p = parse_digits(p, e, v);
        if (p < e && *p == ':') return list;  // no labels: the line starts with a feature
        const char* id_begin = list;
        for (;;) {
            add_label(v, id_begin, p);
            if (p == e || is_blank(*p)) return p;
            if (*p != ',') {
                fail(p, fmt::format("unexpected character {} in label list {}", quote(p, p + 1),
                                    quote(list, token_end(list, e))));
            }
            ++p;
            if (p == e || is_blank(*p)) {
                fail(p, fmt::format("truncated label list {}: ',' is not followed by a label id",
                                    quote(list, p)));
            }
            if (!is_digit(*p)) bad_id(p, e, "label");
            id_begin = p;
            p = parse_digits(p, e, v);
            if (p < e && *p == ':') {
                fail(p, fmt::format("unexpected ':' in label list {} (missing space before the "
                                    "features?)",
                                    quote(list, token_end(list, e))));
            }
        }
    }

    void add_label(uint64_t v, const char* b, const char* e) {
        if (v > max_id) fail(b, fmt::format("label id {} is too large", quote(b, e)));
        if (libsvm_) {
            max_label_plus_one_ = std::max(max_label_plus_one_, v + 1);
        } else if (v >= l_) {
            fail(b, fmt::format("label id {} out of range: must be < L = {}", v, l_));
        }
        out_.label_ids.push_back(static_cast<uint32_t>(v));
    }

    void check_unique_labels(size_t start, size_t n) {
        const uint32_t* ids = out_.label_ids.data() + start;
        bool dup = false;
        uint32_t which = 0;
        if (n <= 32) {
            for (size_t i = 1; i < n && !dup; ++i)
                for (size_t j = 0; j < i; ++j)
                    if (ids[i] == ids[j]) {
                        dup = true;
                        which = ids[i];
                        break;
                    }
        } else {
            label_scratch_.assign(ids, ids + n);
            std::sort(label_scratch_.begin(), label_scratch_.end());
            const auto it = std::adjacent_find(label_scratch_.begin(), label_scratch_.end());
            if (it != label_scratch_.end()) {
                dup = true;
                which = *it;
            }
        }
        if (dup) fail(line_begin_, fmt::format("duplicate label {} in the label list", which));
    }

    void parse_features(const char* p, const char* e) {
        const size_t start = out_.feature_ids.size();
        bool sorted = true;
        uint32_t prev = 0;
        for (;;) {
            while (p < e && is_blank(*p)) ++p;
            if (p == e) break;
            const char* tok = p;
            if (!is_digit(*p)) bad_id(p, e, "feature");
            uint64_t v;
            p = parse_digits(p, e, v);
            if (p == e || *p != ':') {
                if (p == e || is_blank(*p)) {
                    fail(tok, fmt::format("truncated feature {}: no ':value'", quote(tok, p)));
                }
                fail(p, fmt::format("unexpected character {} after feature id in {}",
                                    quote(p, p + 1), quote(tok, token_end(tok, e))));
            }
            const char* id_end = p;
            ++p;
            const float value = parse_value(tok, p, e, p);
            const uint32_t id = check_feature(v, tok, id_end);
            if (out_.feature_ids.size() > start) {
                if (id == prev) fail(tok, fmt::format("duplicate feature id {}", v));  // as written
                sorted &= id > prev;
            }
            prev = id;
            out_.feature_ids.push_back(id);
            out_.feature_values.push_back(value);
        }
        if (!sorted) sort_features(start);
    }

    // Parses the value after "id:" at p; `tok` is the feature's start. Sets `after`.
    float parse_value(const char* tok, const char* p, const char* e, const char*& after) {
        if (p == e || is_blank(*p)) {
            fail(tok, fmt::format("truncated feature {}: no value after ':'", quote(tok, p)));
        }
        const char* vb = p;
        // std::from_chars takes no '+', which some writers put on positive values.
        if (*p == '+') {
            ++p;
            if (p == e || *p == '+' || *p == '-') {
                fail(vb, fmt::format("non-numeric value in {}", quote(tok, token_end(tok, e))));
            }
        }
        float x = 0.0f;
        auto r = std::from_chars(p, e, x);
        if (r.ec == std::errc::invalid_argument) {
            fail(vb, fmt::format("non-numeric value in {}", quote(tok, token_end(tok, e))));
        }
        if (r.ec == std::errc::result_out_of_range) {
            // Tell underflow (keep the nearest float, possibly 0) from overflow (an error).
            // Beyond double's range too (1e-400), from_chars leaves d alone: the decimal
            // exponent of the number's leading digit tells the two apart.
            double d = 0.0;
            r = std::from_chars(p, e, d);
            const bool tiny = r.ec == std::errc() ? std::fabs(d) < 1.0
                                                  : r.ec == std::errc::result_out_of_range &&
                                                        leading_exponent(p, r.ptr) < 0;
            if (!tiny) {
                fail(vb, fmt::format("value {} is out of the float range", quote(vb, r.ptr)));
            }
            x = r.ec == std::errc() ? static_cast<float>(d) : (*p == '-' ? -0.0f : 0.0f);
        }
        if (r.ptr < e && !is_blank(*r.ptr)) {
            fail(r.ptr, fmt::format("unexpected character {} after the value in {}",
                                    quote(r.ptr, r.ptr + 1), quote(tok, token_end(tok, e))));
        }
        if (!std::isfinite(x)) {
            fail(vb, fmt::format("NaN or infinite value in {}", quote(tok, r.ptr)));
        }
        after = r.ptr;
        return x;
    }

    uint32_t check_feature(uint64_t v, const char* b, const char* e) {
        if (libsvm_) {
            if (v == 0) {
                fail(b, "feature id 0: LibSVM feature ids are 1-based");
            }
            if (v > max_id + 1) fail(b, fmt::format("feature id {} is too large", quote(b, e)));
            max_feature_plus_one_ = std::max(max_feature_plus_one_, v);
            return static_cast<uint32_t>(v - 1);
        }
        if (v >= d_) {
            fail(b, fmt::format("feature id {} out of range: must be < D = {}", quote(b, e), d_));
        }
        return static_cast<uint32_t>(v);
    }

    // Where the second `id:value` token with this id (as written) starts, for the column of a
    // duplicate found after sorting; the line start if it cannot be found.
    const char* second_feature_token(uint64_t written_id) const {
        int seen = 0;
        for (const char* p = line_begin_; p < line_end_;) {
            while (p < line_end_ && is_blank(*p)) ++p;
            const char* tok = p;
            uint64_t v = 0;
            const char* q = parse_digits(p, line_end_, v);
            if (q != tok && q < line_end_ && *q == ':' && v == written_id && ++seen == 2) {
                return tok;
            }
            while (p < line_end_ && !is_blank(*p)) ++p;
        }
        return line_begin_;
    }

    // Unsorted features are accepted: sort the line's (id, value) pairs by id.
    void sort_features(size_t start) {
        const size_t n = out_.feature_ids.size() - start;
        uint32_t* ids = out_.feature_ids.data() + start;
        float* values = out_.feature_values.data() + start;
        pair_scratch_.resize(n);
        for (size_t i = 0; i < n; ++i) pair_scratch_[i] = {ids[i], values[i]};
        std::sort(pair_scratch_.begin(), pair_scratch_.end(),
                  [](const auto& a, const auto& b) { return a.first < b.first; });
        for (size_t i = 0; i < n; ++i) {
            if (i > 0 && pair_scratch_[i].first == pair_scratch_[i - 1].first) {
                const uint64_t shown = pair_scratch_[i].first + (libsvm_ ? 1 : 0);
                fail(second_feature_token(shown), fmt::format("duplicate feature id {}", shown));
            }
            ids[i] = pair_scratch_[i].first;
            values[i] = pair_scratch_[i].second;
        }
    }

    const std::string& name_;
    bool libsvm_;
    uint64_t d_, l_;
    dataset& out_;
    size_t line_ = 0;
    const char* line_begin_ = nullptr;
    const char* line_end_ = nullptr;
    uint64_t max_feature_plus_one_ = 0;
    uint64_t max_label_plus_one_ = 0;
    std::vector<std::pair<uint32_t, float>> pair_scratch_;
    std::vector<uint32_t> label_scratch_;
};

// Reserves the dataset's arrays from a quick count of lines, ':' and ',' (exact for valid
// files, so the arrays never grow while parsing).
void reserve_for(std::string_view text, dataset& out) {
    size_t lines = 1, colons = 0, commas = 0;
    const char* p = text.data();
    const size_t n = text.size();
    // Block-wise with small counters so that the compiler vectorises the byte compares.
    for (size_t i = 0; i < n;) {
        const size_t block = std::min<size_t>(n - i, 255);
        uint8_t a = 0, b = 0, c = 0;
        for (size_t j = 0; j < block; ++j) {
            const char ch = p[i + j];
            a += ch == '\n';
            b += ch == ':';
            c += ch == ',';
        }
        lines += a;
        colons += b;
        commas += c;
        i += block;
    }
    const uint64_t bytes = (lines + 1) * 2 * sizeof(uint64_t) +
                           colons * (sizeof(uint32_t) + sizeof(float)) +
                           (commas + lines) * sizeof(uint32_t);
    allocate_checked(fmt::format("the dataset {} ({} lines, {} features, {} labels at most)",
                                 out.source, lines, colons, commas + lines),
                     bytes, [&] {
                         detail::reserve_huge(out.feature_offsets, lines + 1);
                         detail::reserve_huge(out.label_offsets, lines + 1);
                         detail::reserve_huge(out.feature_ids, colons);
                         detail::reserve_huge(out.feature_values, colons);
                         detail::reserve_huge(out.label_ids, commas + lines);
                     });
}

// Parses a header value; `limit` is the largest accepted.
uint64_t header_value(const std::string& name, size_t line_no, const char* b, const char* e,
                      const char* what, uint64_t limit) {
    uint64_t v = 0;
    for (const char* p = b; p < e; ++p) {
        v = v * 10 + static_cast<uint64_t>(*p - '0');
        if (v > limit) {
            throw input_error(name, line_no,
                              fmt::format("bad header: {} = {} is too large (at most {})", what,
                                          quote(b, e), limit));
        }
    }
    return v;
}

}  // namespace

data_format detect_format(std::string_view text) {
    text = skip_bom(text);
    const char* p = text.data();
    const char* end = p + text.size();
    while (p < end) {
        const line_view l = next_line(p, end);
        p = l.next;
        if (is_blank_line(l.begin, l.end)) continue;
        const auto toks = tokens(l.begin, l.end);
        if (toks.size() != 3) return data_format::libsvm;
        for (const auto& t : toks)
            if (!all_digits(t.first, t.second)) return data_format::libsvm;
        return data_format::xc;
    }
    return data_format::libsvm;
}

// Points between progress updates: rare enough to cost nothing against the parse.
constexpr size_t progress_points = 8192;

dataset parse_xc(std::string_view text, const std::string& name, progress* bar) {
    text = skip_bom(text);
    const char* p = text.data();
    const char* end = p + text.size();
    size_t line_no = 0;

    // The header: the first non-blank line.
    uint64_t n = 0, d = 0, l = 0;
    size_t header_line = 0;
    while (p < end && header_line == 0) {
        const line_view lv = next_line(p, end);
        p = lv.next;
        ++line_no;
        if (is_blank_line(lv.begin, lv.end)) continue;
        header_line = line_no;
        const auto toks = tokens(lv.begin, lv.end);
        bool ok = toks.size() == 3;
        for (size_t i = 0; ok && i < 3; ++i) ok = all_digits(toks[i].first, toks[i].second);
        if (!ok) {
            throw input_error(name, line_no,
                              fmt::format("bad header {}: expected 'N D L' (three non-negative "
                                          "integers: points, features, labels)",
                                          quote(lv.begin, lv.end)));
        }
        n = header_value(name, line_no, toks[0].first, toks[0].second, "N", max_id);
        d = header_value(name, line_no, toks[1].first, toks[1].second, "D", max_id + 1);
        l = header_value(name, line_no, toks[2].first, toks[2].second, "L", max_id + 1);
    }
    if (header_line == 0) throw input_error(name, 0, "empty file (no header line)");

    dataset out;
    out.source = name;
    out.n_features = d;
    out.n_labels = l;
    reserve_for(std::string_view(p, static_cast<size_t>(end - p)), out);
    point_parser parser(name, false, d, l, out);
    size_t points = 0;
    while (p < end) {
        const line_view lv = next_line(p, end);
        p = lv.next;
        ++line_no;
        if ((lv.begin == lv.end || is_blank(*lv.begin)) && is_blank_line(lv.begin, lv.end)) {
            continue;
        }
        if (points == n) {
            throw input_error(name, line_no,
                              fmt::format("more points than the header's N = {}: this line "
                                          "would be point {}",
                                          n, n + 1));
        }
        parser.parse(lv.begin, lv.end, line_no);
        ++points;
        if (bar && points % progress_points == 0) bar->update(uint64_t(p - text.data()));
    }
    if (bar) bar->update(text.size());
    if (points != n) {
        throw input_error(name, header_line,
                          fmt::format("point count mismatch: the header declares N = {} points "
                                      "but the file has {} (blank lines are not points)",
                                      n, points));
    }
    return out;
}

dataset parse_libsvm(std::string_view text, const std::string& name, uint64_t min_features,
                     uint64_t min_labels, progress* bar) {
    HSLIDE_CHECK(min_features <= max_id + 1 && min_labels <= max_id + 1,
                 "LibSVM minima must be at most 2^32 (got {} features, {} labels)", min_features,
                 min_labels);
    text = skip_bom(text);
    const char* p = text.data();
    const char* end = p + text.size();
    dataset out;
    out.source = name;
    reserve_for(text, out);
    point_parser parser(name, true, 0, 0, out);
    size_t line_no = 0;
    while (p < end) {
        const line_view lv = next_line(p, end);
        p = lv.next;
        ++line_no;
        if ((lv.begin == lv.end || is_blank(*lv.begin)) && is_blank_line(lv.begin, lv.end)) {
            continue;
        }
        parser.parse(lv.begin, lv.end, line_no);
        if (bar && out.size() % progress_points == 0) bar->update(uint64_t(p - text.data()));
    }
    if (bar) bar->update(text.size());
    if (out.size() == 0) throw input_error(name, 0, "empty file (no points)");
    out.n_features = std::max(min_features, parser.max_feature_plus_one());
    out.n_labels = std::max(min_labels, parser.max_label_plus_one());
    return out;
}

dataset read_xc(const std::string& path) {
    return parse_xc(detail::read_file(path).view(), path);
}

dataset read_libsvm(const std::string& path, uint64_t min_features, uint64_t min_labels) {
    return parse_libsvm(detail::read_file(path).view(), path, min_features, min_labels);
}

std::vector<uint32_t> read_split(const std::string& path, int column, size_t n_points) {
    HSLIDE_CHECK(column >= 1, "split column must be >= 1 (1-based), got {}", column);
    const detail::text_buffer buf = detail::read_file(path);
    const std::string_view text = skip_bom(buf.view());
    const char* p = text.data();
    const char* end = p + text.size();
    std::vector<uint32_t> rows;
    std::vector<uint32_t> line_of_row;  // each row's line in the file (0: not listed yet)
    size_t line_no = 0, columns = 0;
    while (p < end) {
        const line_view lv = next_line(p, end);
        p = lv.next;
        ++line_no;
        if (is_blank_line(lv.begin, lv.end)) continue;
        const auto toks = tokens(lv.begin, lv.end);
        if (columns == 0) {
            columns = toks.size();
            if (static_cast<size_t>(column) > columns) {
                throw input_error(path, line_no,
                                  fmt::format("missing column: the split file has {} column(s), "
                                              "column {} was asked for",
                                              columns, column));
            }
        } else if (toks.size() != columns) {
            throw input_error(path, line_no,
                              fmt::format("ragged rows: this row has {} column(s), the first "
                                          "has {}",
                                          toks.size(), columns));
        }
        for (size_t c = 0; c < toks.size(); ++c) {
            const auto [b, e] = toks[c];
            if (!all_digits(b, e)) {
                const char* what = *b == '-' ? "negative" : "non-numeric";
                throw input_error(
                    path, line_no,
                    fmt::format("{} row number {} in column {}", what, quote(b, e), c + 1));
            }
            if (c + 1 != static_cast<size_t>(column)) continue;
            uint64_t v;
            parse_digits(b, e, v);
            if (v == 0 || v > n_points) {
                throw input_error(path, line_no,
                                  fmt::format("row number {} out of range: split files are "
                                              "1-based and the data has {} points",
                                              quote(b, e), n_points));
            }
            // A row listed twice trains (or is scored) twice: a split made wrong, not a weight.
            if (line_of_row.empty()) line_of_row.assign(n_points, 0);
            if (line_of_row[v - 1] != 0)
                throw input_error(path, line_no,
                                  fmt::format("row number {} repeats line {}'s: a split lists "
                                              "each point once",
                                              quote(b, e), line_of_row[v - 1]));
            line_of_row[v - 1] = uint32_t(std::min<size_t>(line_no, UINT32_MAX));
            rows.push_back(static_cast<uint32_t>(v - 1));
        }
    }
    if (columns == 0) throw input_error(path, 0, "empty file (no rows)");
    return rows;
}

void dataset::push_back(const uint32_t* fids, const float* fvals, uint32_t nf, const uint32_t* lids,
                        uint32_t nl) {
    const std::string why = point_problem(fids, fvals, nf, lids, nl, n_features, n_labels);
    HSLIDE_CHECK(why.empty(), "dataset::push_back: {}", why);
    feature_ids.insert(feature_ids.end(), fids, fids + nf);
    feature_values.insert(feature_values.end(), fvals, fvals + nf);
    feature_offsets.push_back(feature_ids.size());
    label_ids.insert(label_ids.end(), lids, lids + nl);
    label_offsets.push_back(label_ids.size());
}

void normalize_rows_l2(dataset& data) {
    const int64_t n = int64_t(data.size());
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < n; ++p) {
        float* v = data.feature_values.data() + data.feature_offsets[p];
        const uint64_t count = data.feature_offsets[p + 1] - data.feature_offsets[p];
        double sum = 0;
        for (uint64_t i = 0; i < count; ++i) sum += double(v[i]) * v[i];
        if (sum <= 0) continue;
        const float inv = float(1.0 / std::sqrt(sum));
        for (uint64_t i = 0; i < count; ++i) v[i] *= inv;
    }
}

dataset subset(const dataset& data, const std::vector<uint32_t>& rows) {
    dataset out;
    out.source = data.source;
    out.n_features = data.n_features;
    out.n_labels = data.n_labels;
    uint64_t nf = 0, nl = 0;
    for (const uint32_t r : rows) {
        HSLIDE_CHECK(r < data.size(), "subset: row {} out of range (the dataset has {} points)", r,
                     data.size());
        nf += data.feature_offsets[r + 1] - data.feature_offsets[r];
        nl += data.label_offsets[r + 1] - data.label_offsets[r];
    }
    detail::reserve_huge(out.feature_offsets, rows.size() + 1);
    detail::reserve_huge(out.label_offsets, rows.size() + 1);
    detail::reserve_huge(out.feature_ids, nf);
    detail::reserve_huge(out.feature_values, nf);
    detail::reserve_huge(out.label_ids, nl);
    for (const uint32_t r : rows) {
        const auto fb = data.feature_offsets[r], fe = data.feature_offsets[r + 1];
        out.feature_ids.insert(out.feature_ids.end(), data.feature_ids.begin() + fb,
                               data.feature_ids.begin() + fe);
        out.feature_values.insert(out.feature_values.end(), data.feature_values.begin() + fb,
                                  data.feature_values.begin() + fe);
        out.feature_offsets.push_back(out.feature_ids.size());
        const auto lb = data.label_offsets[r], le = data.label_offsets[r + 1];
        out.label_ids.insert(out.label_ids.end(), data.label_ids.begin() + lb,
                             data.label_ids.begin() + le);
        out.label_offsets.push_back(out.label_ids.size());
    }
    return out;
}

}  // namespace hslide
