// Every file hslide writes (checkpoints, metrics records, predictions, dataset caches,
// generated data) goes through output_file, so that each of them is all there or not there:
//
//  - a regular file (or a new one) is written to `PATH.tmp.<pid>.<n>` in the same folder and
//    renamed over PATH by commit(), so a reader never sees half a file and a failed or killed
//    write leaves the previous PATH as it was;
//  - every write, the flush and the close are checked, and a failure (a full disk, a quota,
//    a file-size limit) is an hslide::error (io) naming PATH and the system's reason; the
//    temporary file is removed then, and when the object is destroyed without commit();
//  - temporaries of PATH left by processes that no longer exist (a kill -9 mid-save) are
//    removed when the next output_file for PATH starts;
//  - a PATH that exists and is not a regular file is written in place, without a temporary:
//    a character device (/dev/stdout, /dev/null) or a FIFO that a reader has open
//    (`--out >(gzip > f)`); a FIFO without a reader is an error at once rather than a hang, and
//    so is a directory.
// With `durable`, commit() also fsyncs the file before the rename and the folder after it
// (checkpoints: the rename must not reach the disk before the data).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace hslide {

/// One file being written (see the file comment). Not copyable; movable.
class output_file {
  public:
    explicit output_file(std::string path, bool durable = false);
    ~output_file();
    output_file(output_file&& other) noexcept;
    output_file& operator=(output_file&&) = delete;
    output_file(const output_file&) = delete;
    output_file& operator=(const output_file&) = delete;

    /// Appends bytes (buffered; large writes go straight through).
    void write(const void* data, size_t size);
    void write(std::string_view text) { write(text.data(), text.size()); }

    /// Flushes and closes the file (and fsyncs when durable), then renames it into place.
    /// Throws hslide::error (io) on any failure, after removing the temporary file.
    void commit();

    const std::string& path() const { return path_; }
    /// Where the bytes go until commit(): the temporary file, or path() when written in place.
    const std::string& writing_to() const { return temp_.empty() ? path_ : temp_; }

  private:
    void flush_buffer();
    [[noreturn]] void fail(const char* what, int err);

    std::string path_, temp_;
    int fd_ = -1;
    bool durable_ = false;
    bool committed_ = false;
    std::vector<char> buffer_;
};

/// Appends `text` to `path` through an output_file: the old content and `text` are written to
/// a temporary file that replaces `path`, so a failed append (a full disk) leaves the file as
/// it was and is an error. For small files such as --metrics-out's records. A non-regular
/// `path` gets `text` written in place.
void append_to_file(const std::string& path, std::string_view text);

/// Removes the temporary files of `path` (`PATH.tmp.<pid>` and `PATH.tmp.<pid>.<n>`) whose
/// process no longer exists; returns how many it removed. output_file calls it.
size_t remove_stale_temporaries(const std::string& path);

}  // namespace hslide
