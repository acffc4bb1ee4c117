// The ranks of a label-sharded run and the few collectives they need: the one place that knows
// whether MPI is there (issue 32, DESIGN.md "Past one device").
//
// A shard_comm is a group of `size()` ranks, each a process (MPI) or, in tests, a thread
// (local_group). One virtual moves data, all_gather's (counted: traffic()); the reductions a
// sharded step needs (the maximum and the sum of exponentials of the set softmax, the hidden
// layer's gradient, the loss) are built on it here and reduce in rank order on every rank, so that
// every rank holds the same bits, whatever the MPI library's reduction order would have been. A
// step moves O(batch x (hidden + k)) values, so the all-gather's N copies cost nothing that
// matters.
//
// world_comm() is the process's group: MPI_COMM_WORLD when hslide was built with MPI
// (HSLIDE_MPI) and launched by mpirun with more than one rank, else one rank. The backend and
// the trainer hold a shard_comm&, never an #if.
//
// Failures. An error on one rank must not leave the others waiting in a collective: the CLI
// catches it, logs it with the rank and calls abort(), which (MPI_Abort) ends every rank of the
// job with a non-zero status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace hslide {

class shard_comm {
  public:
    virtual ~shard_comm() = default;

    /// This rank, in [0, size()).
    virtual int rank() const = 0;
    /// Ranks in the group (1: not sharded).
    virtual int size() const = 0;
    /// Every rank sends `bytes` bytes of `send`; `recv` (size() * bytes) receives rank r's at
    /// r * bytes, on every rank. Every rank calls it with the same `bytes`. Counted in
    /// traffic().
    void all_gather(const void* send, size_t bytes, void* recv);
    /// Ends every rank of the group with `exit_code` (never returns).
    [[noreturn]] virtual void abort(int exit_code) = 0;
    /// A short name of the implementation ("one process", "MPI (Open MPI 4.1.4)", ...).
    virtual const char* name() const = 0;

    /// Every rank sends `bytes` bytes of `send`, a count of its own; `recv` receives every
    /// rank's, rank r's at recv[offsets[r]..offsets[r + 1]) (offsets: size() + 1 values), on
    /// every rank. Two all-gathers: the counts, then the messages padded to the longest.
    void all_gather_varying(const void* send, size_t bytes, std::vector<unsigned char>& recv,
                            std::vector<size_t>& offsets);
    /// Waits until every rank arrived.
    void barrier();
    /// data[0..bytes) becomes rank 0's on every rank (every rank calls it with the same
    /// `bytes`). All-gathers of at most 8 MiB a rank, so that it needs little memory beside
    /// `data` whatever its size.
    void copy_from_first_rank(void* data, size_t bytes);
    /// values[0..n) becomes the maximum over ranks, element by element.
    void all_reduce_max(float* values, size_t n);
    /// values[0..n) becomes the sum over ranks, element by element, added in rank order.
    void all_reduce_sum(double* values, size_t n);
    void all_reduce_sum(float* values, size_t n);
    /// Rank 0's value of a check; throws hslide::error when any rank's differs, naming `what`
    /// and the ranks' values (configurations that must agree: row counts, seeds, data sizes).
    void check_same(uint64_t value, const char* what);

    /// What this rank's collectives moved since the group started (every one is an
    /// all-gather). Read by the thread that calls them.
    struct traffic_count {
        uint64_t collectives = 0;
        /// Bytes received from the other ranks: (size() - 1) x each all-gather's message (what
        /// a ring all-gather also sends).
        uint64_t bytes = 0;
        /// Wall seconds inside the collectives, waiting for the slowest rank included.
        double seconds = 0;
    };
    const traffic_count& traffic() const { return traffic_; }

  protected:
    /// all_gather's transfer (the implementation's).
    virtual void all_gather_impl(const void* send, size_t bytes, void* recv) = 0;

  private:
    std::vector<unsigned char> gathered_;  // all_gather's receive buffer of the reductions
    std::vector<unsigned char> padded_;    // all_gather_varying's message and receive buffer
    traffic_count traffic_;
};

/// One rank: every collective is a copy.
class single_process_comm final : public shard_comm {
  public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    [[noreturn]] void abort(int exit_code) override;
    const char* name() const override { return "one process"; }

  protected:
    void all_gather_impl(const void* send, size_t bytes, void* recv) override;
};

/// `ranks` ranks as threads of one process (tests: sharded backends side by side without MPI).
/// local_group::make() returns one communicator per rank; each is called from its own thread.
/// abort() throws std::runtime_error on that thread (a test has no job to end).
class local_group {
  public:
    static std::vector<std::unique_ptr<shard_comm>> make(int ranks);
    /// Marks the group of `comm` (one of make()'s) failed: every rank waiting in a collective,
    /// or entering one later, throws std::runtime_error instead of waiting for a rank that
    /// will not come (what MPI_Abort does to an MPI job). The thread of a rank that threw calls
    /// it before it ends.
    static void fail(shard_comm& comm);
};

/// Whether this hslide was built with MPI.
bool mpi_built();
/// Ranks the launcher started (Open MPI's OMPI_COMM_WORLD_SIZE, or PMI_SIZE), 1 without one.
int launched_ranks();
/// This rank's index among the ranks the launcher started on its host (Open MPI's
/// OMPI_COMM_WORLD_LOCAL_RANK, or MPI_LOCALRANKID / PMI_LOCAL_RANK), 0 without one.
int launched_local_rank();
/// The process's group: started on first call (MPI_Init_thread when launched as more than one
/// rank). Throws hslide::error (unsupported) when launched as several ranks by a build without
/// MPI.
shard_comm& world_comm();
/// The group if world_comm() started one of more than one rank, else null (the CLI's error path).
shard_comm* started_multi_rank_comm();
/// Ends MPI (MPI_Finalize) when world_comm() started it: the CLI's normal exit.
void finish_world_comm();

}  // namespace hslide
