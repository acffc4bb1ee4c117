// The atomic output file of hslide/output_file.hpp.
#include "hslide/output_file.hpp"

#include "hslide/error.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

namespace hslide {

namespace {

constexpr size_t buffer_bytes = size_t{1} << 20;

std::string folder_of(const std::string& path) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

std::string name_of(const std::string& path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Writes all of [p, p + n) to fd; false with errno set on failure.
bool write_fully(int fd, const char* p, size_t n) {
    while (n > 0) {
        const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = ENOSPC;
            return false;
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

// The pid in a temporary's name after "NAME.tmp.": digits, optionally ".digits" (0: not one).
pid_t temporary_pid(const char* suffix) {
    const char* p = suffix;
    long long pid = 0;
    while (*p >= '0' && *p <= '9' && pid < (1LL << 31)) pid = pid * 10 + (*p++ - '0');
    if (p == suffix || pid <= 0 || pid >= (1LL << 31)) return 0;
    if (*p == '.') {
        const char* q = ++p;
        while (*p >= '0' && *p <= '9') ++p;
        if (p == q) return 0;
    }
    return *p == '\0' ? pid_t(pid) : 0;
}

}  // namespace

size_t remove_stale_temporaries(const std::string& path) {
    const std::string folder = folder_of(path);
    const std::string prefix = name_of(path) + ".tmp.";
    DIR* dir = ::opendir(folder.c_str());
    if (!dir) return 0;
    size_t removed = 0;
    const pid_t self = ::getpid();
    while (const dirent* entry = ::readdir(dir)) {
        if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) != 0) continue;
        const pid_t pid = temporary_pid(entry->d_name + prefix.size());
        // Only a process that is gone: a live one (another hslide saving the same file) keeps
        // its temporary. A pid reused since then only delays the clean-up.
        if (pid == 0 || pid == self || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
        const std::string file = folder + "/" + entry->d_name;
        struct stat st {};
        if (::lstat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::unlink(file.c_str()) == 0)
            ++removed;
    }
    ::closedir(dir);
    return removed;
}

output_file::output_file(std::string path, bool durable)
    : path_(std::move(path)), durable_(durable) {
    HSLIDE_CHECK(!path_.empty(), "an output file's path is empty");
    struct stat st {};
    if (::stat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
        HSLIDE_CHECK_KIND(!S_ISDIR(st.st_mode), error_kind::io, "cannot write {}: it is a folder",
                          path_);
        // In place. O_NONBLOCK so that a FIFO nobody reads is an error (ENXIO), not a hang.
        fd_ = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd_ < 0 && errno == ENXIO)
            throw error(
                error_kind::io,
                fmt::format("cannot write {}: it is a FIFO that no process is reading", path_));
        if (fd_ < 0) fail("open", errno);
        const int flags = ::fcntl(fd_, F_GETFL);
        if (flags >= 0) (void)::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
        return;
    }
    remove_stale_temporaries(path_);
    static std::atomic<uint64_t> serial{0};
    temp_ = fmt::format("{}.tmp.{}.{}", path_, long(::getpid()), serial++);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) {
        const int err = errno;
        temp_.clear();  // not ours to remove
        throw error(error_kind::io, fmt::format("cannot create a temporary file beside {}: {}",
                                                path_, std::strerror(err)));
    }
}

output_file::~output_file() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
}

output_file::output_file(output_file&& other) noexcept
    : path_(std::move(other.path_)),
      temp_(std::move(other.temp_)),
      fd_(std::exchange(other.fd_, -1)),
      durable_(other.durable_),
      committed_(std::exchange(other.committed_, true)),
      buffer_(std::move(other.buffer_)) {
    other.temp_.clear();
}

void output_file::fail(const char* what, int err) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!temp_.empty()) ::unlink(temp_.c_str());
    temp_.clear();
    committed_ = true;  // nothing left to clean up
    throw error(error_kind::io, fmt::format("cannot {} {}: {}", what, path_, std::strerror(err)));
}

void output_file::flush_buffer() {
    if (buffer_.empty()) return;
    if (!write_fully(fd_, buffer_.data(), buffer_.size())) fail("write", errno);
    buffer_.clear();
}

void output_file::write(const void* data, size_t size) {
    HSLIDE_CHECK(fd_ >= 0, "output file {} is already closed", path_);
    const char* p = static_cast<const char*>(data);
    if (buffer_.size() + size <= buffer_bytes) {
        if (buffer_.capacity() == 0) buffer_.reserve(buffer_bytes);
        buffer_.insert(buffer_.end(), p, p + size);
        return;
    }
    flush_buffer();
    if (size >= buffer_bytes / 2) {
        if (!write_fully(fd_, p, size)) fail("write", errno);
    } else {
        buffer_.insert(buffer_.end(), p, p + size);
    }
}

void output_file::commit() {
    HSLIDE_CHECK(fd_ >= 0, "output file {} is already closed", path_);
    flush_buffer();
    // The data must be on disk before the rename makes it the file.
    if (durable_ && !temp_.empty() && ::fsync(fd_) != 0) fail("sync", errno);
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail("write", errno);  // NFS and quotas report here
    if (!temp_.empty() && ::rename(temp_.c_str(), path_.c_str()) != 0) fail("rename into", errno);
    committed_ = true;
    if (durable_ && !temp_.empty()) {
        // Persist the rename itself; a folder that cannot be synced is no reason to fail.
        const int dfd = ::open(folder_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)::fsync(dfd);
            ::close(dfd);
        }
    }
}

void append_to_file(const std::string& path, std::string_view text) {
    std::string old;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            throw error(error_kind::io, fmt::format("cannot read {} to append to it: {}", path,
                                                    std::strerror(errno)));
        old.resize(size_t(st.st_size));
        size_t got = 0;
        for (;;) {
            if (got == old.size()) old.resize(old.size() * 2 + 4096);
            const ssize_t n = ::read(fd, old.data() + got, old.size() - got);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                const int err = errno;
                ::close(fd);
                throw error(error_kind::io, fmt::format("cannot read {} to append to it: {}", path,
                                                        std::strerror(err)));
            }
            if (n == 0) break;
            got += size_t(n);
        }
        ::close(fd);
        old.resize(got);
    }
    output_file out(path);
    out.write(old);
    out.write(text);
    out.commit();
}

}  // namespace hslide
