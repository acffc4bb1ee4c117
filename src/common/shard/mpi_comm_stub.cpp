// shard_comm's MPI functions in a build without MPI (HSLIDE_MPI=OFF, or none found): never
// started, since world_comm() refuses a multi-rank launch first.
#include "mpi_comm.hpp"

#include "hslide/error.hpp"

namespace hslide::detail {

bool mpi_available() {
    return false;
}

std::unique_ptr<shard_comm> start_mpi_world() {
    HSLIDE_ASSERT(!"start_mpi_world in a build without MPI");
    return nullptr;
}

void finish_mpi_world() {}

}  // namespace hslide::detail
