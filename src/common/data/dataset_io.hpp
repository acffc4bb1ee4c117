// Internal helpers shared by the dataset readers (dataset.cpp) and the binary cache
// (dataset_cache.cpp): whole-file buffers and huge-page advice for big arrays.
//
// Why huge pages: a dataset's arrays and text are hundreds of MB, and on virtual machines a
// 4 KiB page fault can cost tens of microseconds, so first-touching the memory would cost more
// than parsing it. Advising 2 MiB pages cuts the faults 512-fold where the kernel allows it
// (transparent_hugepage = madvise or always); elsewhere the advice is a no-op.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace hslide::detail {

/// Advises the kernel to back the 2 MiB-aligned interior of [p, p + bytes) with huge pages.
/// Does nothing for ranges under 4 MiB or where madvise is unavailable.
void advise_huge_pages(const void* p, size_t bytes);

/// v.reserve(n), then huge-page advice for the new storage (before it is touched).
template <class T>
void reserve_huge(std::vector<T>& v, size_t n) {
    v.reserve(n);
    advise_huge_pages(v.data(), v.capacity() * sizeof(T));
}

/// A file's bytes in an anonymous mapping advised for huge pages.
class text_buffer {
  public:
    text_buffer() = default;
    explicit text_buffer(size_t capacity);
    ~text_buffer();
    text_buffer(text_buffer&& other) noexcept;
    text_buffer& operator=(text_buffer&& other) noexcept;
    text_buffer(const text_buffer&) = delete;
    text_buffer& operator=(const text_buffer&) = delete;

    char* data() { return data_; }
    size_t size() const { return size_; }
    size_t capacity() const { return capacity_; }
    void set_size(size_t n) { size_ = n; }
    std::string_view view() const { return {data_, size_}; }

  private:
    char* data_ = nullptr;
    size_t size_ = 0;
    size_t capacity_ = 0;
};

/// Everything in the open file `fd`: from offset 0 by pread where it can seek (the file
/// position is then unused), else (a pipe) by read from where it stands;
/// `size_hint` is the expected size (0 when unknown). A read failure is an input_error naming
/// `path`; an empty result is returned as is.
text_buffer read_all(int fd, const std::string& path, size_t size_hint);

/// Opens `path` and reads it whole: a missing or unreadable file and an empty file are
/// input_errors with line 0.
text_buffer read_file(const std::string& path);

}  // namespace hslide::detail
