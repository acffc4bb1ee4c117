// Launch-shape arithmetic shared by the kernel files.
#pragma once

#include <cstdint>

namespace hslide::gpu {

/// Blocks of `per_block` threads (or warps, or items) to cover n.
inline uint32_t blocks_for(uint64_t n, uint32_t per_block) {
    return uint32_t((n + per_block - 1) / per_block);
}

}  // namespace hslide::gpu
