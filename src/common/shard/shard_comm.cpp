// The collectives built on all_gather, one-process and thread groups, and the process's group
// (shard_comm.hpp). MPI itself is in mpi_comm.cpp (mpi_comm_stub.cpp without MPI).
#include "hslide/shard_comm.hpp"

#include "mpi_comm.hpp"

#include "hslide/clock.hpp"
#include "hslide/error.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

namespace hslide {

void shard_comm::all_gather(const void* send, size_t bytes, void* recv) {
    const auto t0 = clock_type::now();
    all_gather_impl(send, bytes, recv);
    traffic_.seconds += seconds_since(t0);
    traffic_.collectives += 1;
    traffic_.bytes += uint64_t(size() - 1) * bytes;
}

void shard_comm::all_gather_varying(const void* send, size_t bytes,
                                    std::vector<unsigned char>& recv,
                                    std::vector<size_t>& offsets) {
    const size_t ranks = size_t(size());
    std::vector<uint64_t> counts(ranks);
    const uint64_t mine = bytes;
    all_gather(&mine, sizeof mine, counts.data());
    const size_t longest = size_t(*std::max_element(counts.begin(), counts.end()));
    padded_.resize(longest * (ranks + 1));
    if (bytes) std::memcpy(padded_.data(), send, bytes);
    all_gather(padded_.data(), longest, padded_.data() + longest);
    offsets.assign(ranks + 1, 0);
    for (size_t r = 0; r < ranks; ++r) offsets[r + 1] = offsets[r] + size_t(counts[r]);
    recv.resize(offsets[ranks]);
    for (size_t r = 0; r < ranks; ++r)
        if (counts[r])
            std::memcpy(recv.data() + offsets[r], padded_.data() + longest * (r + 1),
                        size_t(counts[r]));
}

void shard_comm::copy_from_first_rank(void* data, size_t bytes) {
    constexpr size_t piece = size_t{8} << 20;
    unsigned char* p = static_cast<unsigned char*>(data);
    for (size_t at = 0; at < bytes; at += piece) {
        const size_t n = std::min(piece, bytes - at);
        gathered_.resize(n * size_t(size()));
        all_gather(p + at, n, gathered_.data());
        std::memcpy(p + at, gathered_.data(), n);  // rank 0's part
    }
}

void shard_comm::barrier() {
    unsigned char token = 0;
    gathered_.resize(size_t(size()));
    all_gather(&token, 1, gathered_.data());
}

void shard_comm::all_reduce_max(float* values, size_t n) {
    const int ranks = size();
    if (ranks == 1 || n == 0) return;
    gathered_.resize(size_t(ranks) * n * sizeof(float));
    all_gather(values, n * sizeof(float), gathered_.data());
    const float* all = reinterpret_cast<const float*>(gathered_.data());
    for (size_t i = 0; i < n; ++i) {
        float m = all[i];
        for (int r = 1; r < ranks; ++r) m = std::max(m, all[size_t(r) * n + i]);
        values[i] = m;
    }
}

namespace {
// Sums in rank order: rank 0's value, plus rank 1's, ... (the same bits on every rank).
template <typename T>
void sum_in_rank_order(const unsigned char* gathered, int ranks, T* values, size_t n) {
    const T* all = reinterpret_cast<const T*>(gathered);
    for (size_t i = 0; i < n; ++i) {
        T s = all[i];
        for (int r = 1; r < ranks; ++r) s += all[size_t(r) * n + i];
        values[i] = s;
    }
}
}  // namespace

void shard_comm::all_reduce_sum(double* values, size_t n) {
    const int ranks = size();
    if (ranks == 1 || n == 0) return;
    gathered_.resize(size_t(ranks) * n * sizeof(double));
    all_gather(values, n * sizeof(double), gathered_.data());
    sum_in_rank_order(gathered_.data(), ranks, values, n);
}

void shard_comm::all_reduce_sum(float* values, size_t n) {
    const int ranks = size();
    if (ranks == 1 || n == 0) return;
    gathered_.resize(size_t(ranks) * n * sizeof(float));
    all_gather(values, n * sizeof(float), gathered_.data());
    sum_in_rank_order(gathered_.data(), ranks, values, n);
}

void shard_comm::check_same(uint64_t value, const char* what) {
    const int ranks = size();
    if (ranks == 1) return;
    std::vector<uint64_t> all(static_cast<size_t>(ranks));
    all_gather(&value, sizeof value, all.data());
    std::string listed;
    bool same = true;
    for (int r = 0; r < ranks; ++r) {
        same = same && all[size_t(r)] == all[0];
        listed += fmt::format("{}rank {}: {}", r ? ", " : "", r, all[size_t(r)]);
    }
    HSLIDE_CHECK(same,
                 "the ranks disagree on {} ({}); every rank must run the same command on "
                 "the same data",
                 what, listed);
}

void single_process_comm::all_gather_impl(const void* send, size_t bytes, void* recv) {
    if (bytes) std::memmove(recv, send, bytes);
}

void single_process_comm::abort(int exit_code) {
    std::exit(exit_code);
}

namespace {

/// What the ranks of a local_group share: a reusable barrier and the posted send buffers.
struct local_shared {
    explicit local_shared(int n) : ranks(n), sends(size_t(n)) {}
    void wait() {
        std::unique_lock<std::mutex> lock(mutex);
        const uint64_t gen = generation;
        if (!failed && ++arrived == ranks) {
            arrived = 0;
            ++generation;
            cv.notify_all();
        } else {
            cv.wait(lock, [&] { return generation != gen || failed; });
        }
        if (failed) throw std::runtime_error("local_group: another rank failed");
    }
    void fail() {
        const std::lock_guard<std::mutex> lock(mutex);
        failed = true;
        cv.notify_all();
    }
    int ranks;
    std::vector<const void*> sends;
    std::mutex mutex;
    std::condition_variable cv;
    int arrived = 0;
    uint64_t generation = 0;
    bool failed = false;  // local_group::fail
};

class local_comm final : public shard_comm {
  public:
    local_comm(std::shared_ptr<local_shared> shared, int rank)
        : shared_(std::move(shared)), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return shared_->ranks; }
    [[noreturn]] void abort(int exit_code) override {
        throw std::runtime_error("local_group rank " + std::to_string(rank_) + " aborted with " +
                                 std::to_string(exit_code));
    }
    const char* name() const override { return "threads of one process"; }
    local_shared& shared() const { return *shared_; }

  protected:
    void all_gather_impl(const void* send, size_t bytes, void* recv) override {
        // Post, wait for every rank's post, copy, and wait again so that no rank reuses its
        // send buffer while another still reads it.
        shared_->sends[size_t(rank_)] = send;
        shared_->wait();
        for (int r = 0; r < shared_->ranks; ++r)
            if (bytes)
                std::memcpy(static_cast<unsigned char*>(recv) + size_t(r) * bytes,
                            shared_->sends[size_t(r)], bytes);
        shared_->wait();
    }

  private:
    std::shared_ptr<local_shared> shared_;
    int rank_;
};

std::mutex world_mutex;
std::unique_ptr<shard_comm> world;

int env_int(const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? std::atoi(v) : 0;
}

}  // namespace

std::vector<std::unique_ptr<shard_comm>> local_group::make(int ranks) {
    HSLIDE_ASSERT(ranks >= 1);
    auto shared = std::make_shared<local_shared>(ranks);
    std::vector<std::unique_ptr<shard_comm>> comms;
    for (int r = 0; r < ranks; ++r) comms.push_back(std::make_unique<local_comm>(shared, r));
    return comms;
}

void local_group::fail(shard_comm& comm) {
    auto* local = dynamic_cast<local_comm*>(&comm);
    HSLIDE_ASSERT(local != nullptr);
    local->shared().fail();
}

bool mpi_built() {
    return detail::mpi_available();
}

int launched_ranks() {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
        if (const int n = env_int(name); n > 0) return n;
    return 1;
}

int launched_local_rank() {
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"})
        if (const int n = env_int(name); n > 0) return n;
    return 0;
}

shard_comm& world_comm() {
    std::lock_guard<std::mutex> lock(world_mutex);
    if (world) return *world;
    const int ranks = launched_ranks();
    if (ranks > 1) {
        HSLIDE_CHECK_KIND(mpi_built(), error_kind::unsupported,
                          "launched as {} MPI ranks, but this hslide was built without MPI "
                          "(configure with -DHSLIDE_MPI=ON after installing libopenmpi-dev); "
                          "run it without mpirun, or rebuild",
                          ranks);
        world = detail::start_mpi_world();
    } else {
        world = std::make_unique<single_process_comm>();
    }
    return *world;
}

shard_comm* started_multi_rank_comm() {
    std::lock_guard<std::mutex> lock(world_mutex);
    return world && world->size() > 1 ? world.get() : nullptr;
}

void finish_world_comm() {
    std::lock_guard<std::mutex> lock(world_mutex);
    if (world && world->size() > 1) detail::finish_mpi_world();
}

}  // namespace hslide
