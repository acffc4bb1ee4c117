// Small, fast, seedable random number generators with explicit state.
//
// hslide never uses std::rand or a global engine: every random decision (shuffles, hash
// functions, random fill of active sets, weight initialisation) draws from a generator whose
// seed derives from the user's --seed and a stream id, so runs are reproducible and a
// checkpoint can store the exact state.
#pragma once

#include "hslide/host_device.hpp"

#include <cstdint>
#include <limits>

namespace hslide {

/// SplitMix64: mixes a 64-bit value; used to derive seeds for independent streams.
constexpr uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/// Derives the seed of stream `stream` from a base seed (independent streams per purpose).
constexpr uint64_t derive_seed(uint64_t seed, uint64_t stream) {
    return splitmix64(seed ^ splitmix64(stream + 0x632be59bd9b4e019ULL));
}

/// xoshiro256** generator. Its core (HSLIDE_HD) compiles for kernels too, so that a kernel
/// draws exactly what the CPU draws from the same seed (the top-k fill: fill_pool.hpp). Satisfies
/// UniformRandomBitGenerator, so it works with <random> distributions and std::shuffle, but hslide
/// uses the helpers below for portability of results across standard libraries.
class rng {
  public:
    using result_type = uint64_t;

    HSLIDE_HD explicit rng(uint64_t seed = 0) { reseed(seed); }

    HSLIDE_HD void reseed(uint64_t seed) {
        for (auto& word : s_) {
            seed = splitmix64(seed);
            word = seed;
        }
    }

    static constexpr result_type min() { return 0; }
    static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }

    HSLIDE_HD result_type operator()() {
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

    /// Uniform integer in [0, bound) (Lemire's multiply-shift: the high word of next() * bound;
    /// bound > 0).
    HSLIDE_HD uint64_t below(uint64_t bound) {
#if defined(__CUDA_ARCH__)
        return __umul64hi((*this)(), bound);
#else
        return static_cast<uint64_t>((static_cast<__uint128_t>((*this)()) * bound) >> 64);
#endif
    }

    /// Uniform float in [0, 1).
    float uniform() {
        return static_cast<float>((*this)() >> 40) * (1.0f / 16777216.0f);
    }

    /// Uniform double in [0, 1).
    double uniform_double() {
        return static_cast<double>((*this)() >> 11) * (1.0 / 9007199254740992.0);
    }

    /// Standard normal variate (Box-Muller; one value per call, deterministic).
    double normal();

    /// The full state, for checkpoints.
    const uint64_t* state() const {
        return s_;
    }
    void set_state(const uint64_t state[4]) {
        for (int i = 0; i < 4; ++i) s_[i] = state[i];
    }

  private:
    HSLIDE_HD static uint64_t rotl(uint64_t x, int k) {
        return (x << k) | (x >> (64 - k));
    }
    uint64_t s_[4];
};

/// Fisher-Yates shuffle driven by hslide::rng (identical results on every platform).
template <class RandomIt>
void shuffle(RandomIt first, RandomIt last, rng& gen) {
    const auto n = last - first;
    for (decltype(last - first) i = n - 1; i > 0; --i) {
        const auto j = static_cast<decltype(i)>(gen.below(static_cast<uint64_t>(i) + 1));
        auto tmp = first[i];
        first[i] = first[j];
        first[j] = tmp;
    }
}

}  // namespace hslide
