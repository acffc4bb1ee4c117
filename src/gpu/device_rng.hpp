// hslide::rng (include/hslide/rng.hpp: xoshiro256** seeded through splitmix64) for the host
// and the kernels alike, so that a kernel draws exactly the numbers the CPU backend draws from
// the same seed (the top-k sets' random fill: fill_draw.hpp). Plain C++ under a host
// compiler; tests/test_gpu_fill.cpp checks it against hslide::rng, below() included.
#pragma once

#include "host_device.hpp"
#include "hslide/rng.hpp"

#include <cstdint>

namespace hslide::gpu {

/// xoshiro256**: the same state, outputs and below() as hslide::rng from the same seed.
class device_rng {
  public:
    HSLIDE_HD explicit device_rng(uint64_t seed) {
        for (auto& word : s_) {
            seed = splitmix64(seed);
            word = seed;
        }
    }

    HSLIDE_HD uint64_t operator()() {
        const uint64_t result = rotl(s_[1] * 5, 7) * 9;
        const uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return result;
    }

    /// Uniform integer in [0, bound): the high word of next() * bound, as hslide::rng::below.
    HSLIDE_HD uint64_t below(uint64_t bound) {
        const uint64_t x = (*this)();
#if defined(__CUDA_ARCH__)
        return __umul64hi(x, bound);
#else
        return static_cast<uint64_t>((static_cast<__uint128_t>(x) * bound) >> 64);
#endif
    }

  private:
    HSLIDE_HD static uint64_t rotl(uint64_t x, int k) {
        return (x << k) | (x >> (64 - k));
    }
    uint64_t s_[4];
};

}  // namespace hslide::gpu
