// The MPI side of shard_comm.hpp, behind three functions: mpi_comm.cpp implements them with
// MPI (built when HSLIDE_MPI finds it), mpi_comm_stub.cpp without.
#pragma once

#include "hslide/shard_comm.hpp"

#include <memory>

namespace hslide::detail {

/// Whether this build has MPI.
bool mpi_available();
/// MPI_Init_thread and a communicator over MPI_COMM_WORLD (only when mpi_available()).
std::unique_ptr<shard_comm> start_mpi_world();
/// MPI_Finalize (after start_mpi_world).
void finish_mpi_world();

}  // namespace hslide::detail
