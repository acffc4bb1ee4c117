// shard_comm over MPI_COMM_WORLD (compiled only when CMake found MPI: HSLIDE_MPI). Only the
// thread that started MPI calls it (the OpenMP teams never do): MPI_THREAD_FUNNELED.
#include "mpi_comm.hpp"

#include "hslide/error.hpp"

#include <mpi.h>

#include <climits>
#include <cstdio>
#include <string>

namespace hslide::detail {

namespace {

/// Throws hslide::error (runtime) naming the call when an MPI call fails (MPI_ERRORS_RETURN).
void check_mpi(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw error(error_kind::runtime, fmt::format("{} failed: {}", call, std::string(text, length)));
}

class mpi_comm final : public shard_comm {
  public:
    mpi_comm() {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &size_);
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int length = 0;
        MPI_Get_library_version(version, &length);
        std::string v(version, size_t(length));
        name_ = "MPI (" + v.substr(0, v.find_first_of(",\n")) + ")";
    }
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    [[noreturn]] void abort(int exit_code) override {
        std::fflush(stdout);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, exit_code);
        std::_Exit(exit_code);  // MPI_Abort does not return; if it did, end this rank anyway
    }
    const char* name() const override { return name_.c_str(); }

  protected:
    void all_gather_impl(const void* send, size_t bytes, void* recv) override {
        HSLIDE_CHECK_KIND(bytes <= size_t(INT_MAX), error_kind::runtime,
                          "an all-gather of {} bytes is past MPI's int counts", bytes);
        check_mpi(
            MPI_Allgather(send, int(bytes), MPI_BYTE, recv, int(bytes), MPI_BYTE, MPI_COMM_WORLD),
            "MPI_Allgather");
    }

  private:
    int rank_ = 0, size_ = 1;
    std::string name_;
};

}  // namespace

bool mpi_available() {
    return true;
}

std::unique_ptr<shard_comm> start_mpi_world() {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    // Errors come back as codes (check_mpi throws), so a rank logs them before the abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    return std::make_unique<mpi_comm>();
}

void finish_mpi_world() {
    MPI_Finalize();
}

}  // namespace hslide::detail
