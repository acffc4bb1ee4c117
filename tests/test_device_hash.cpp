// The GPU's hash evaluation (src/gpu/device_hash.hpp, the code the CUDA kernels run) against
// the CPU hash families: identical bucket codes for every family on awkward dimensions, with
// zeros, ties, negatives and empty bins. Runs on the host, so it needs no GPU.
#include "gpu/device_hash.hpp"
#include "hslide/lsh.hpp"

#include <gtest/gtest.h>

#include <vector>

using namespace hslide;

namespace {

// Codes of x from the exported arrays, the way the GPU kernels compute them: every raw bin
// value first, then each table's code.
std::vector<uint32_t> device_codes(const hash_function_data& d, const std::vector<float>& x) {
    std::vector<uint32_t> codes(size_t(d.L));
    if (d.kind == hash_kind::simhash) {
        const gpu::simhash_view f{d.signs.data(), d.dim, d.sign_stride, d.K, d.L, d.bits_per_hash};
        for (int t = 0; t < d.L; ++t) codes[t] = gpu::simhash_code(f, x.data(), t);
        return codes;
    }
    const gpu::bin_hash_view f{d.bins.data(),   d.n_hashes, d.width,
                               d.value_mask,    d.K,        d.L,
                               d.bits_per_hash, d.densify,  d.kind == hash_kind::minhash,
                               d.densify_seed};
    std::vector<int32_t> raw(d.n_hashes);
    for (uint32_t h = 0; h < d.n_hashes; ++h) raw[h] = gpu::bin_hash_raw(f, x.data(), h);
    for (int t = 0; t < d.L; ++t) codes[t] = gpu::bin_hash_code(f, raw.data(), t);
    return codes;
}

TEST(DeviceHash, SameCodesAsTheCpuFamilies) {
    rng gen(20261122);
    for (hash_kind kind : {hash_kind::dwta, hash_kind::wta, hash_kind::simhash, hash_kind::minhash})
        for (uint32_t dim : {1u, 15u, 16u, 17u, 33u, 128u, 300u})
            for (auto [K, L, bits] :
                 {std::tuple{4, 7, 3}, std::tuple{2, 16, 2}, std::tuple{6, 5, 3}}) {
                lsh_config config;
                config.kind = kind;
                config.K = K;
                config.L = L;
                config.bits_per_hash = bits;
                const auto family = hash_family::create(config, dim, gen());
                const hash_function_data data = family->function_data();
                ASSERT_EQ(data.kind, kind);
                ASSERT_EQ(data.dim, dim);
                for (int trial = 0; trial < 20; ++trial) {
                    // Densities from very sparse (empty bins, densification) to dense; every
                    // fourth vector has values on a few levels so bins hold ties.
                    const double density = trial % 5 == 0 ? 0.05 : 0.2 * (trial % 5);
                    std::vector<float> x(dim, 0.0f);
                    for (uint32_t i = 0; i < dim; ++i)
                        if (gen.uniform() < density)
                            x[i] =
                                trial % 4 == 0 ? float(int(gen.below(5)) - 2) : float(gen.normal());
                    std::vector<uint32_t> expected(static_cast<size_t>(L));
                    family->codes_dense(x.data(), expected.data());
                    EXPECT_EQ(device_codes(data, x), expected)
                        << to_string(kind) << " dim " << dim << " K " << K << " L " << L << " bits "
                        << bits << " trial " << trial;
                }
            }
}

TEST(DeviceHash, ExportedArraysHaveTheDocumentedShape) {
    lsh_config config;
    config.kind = hash_kind::dwta;
    config.K = 3;
    config.L = 10;
    config.bits_per_hash = 3;
    const auto dwta = hash_family::create(config, 50, 7)->function_data();
    EXPECT_EQ(dwta.n_hashes, 30u);
    EXPECT_EQ(dwta.width, 8u);
    EXPECT_EQ(dwta.value_mask, 7u);
    EXPECT_TRUE(dwta.densify);
    ASSERT_EQ(dwta.bins.size(), size_t(30) * 8);
    for (uint32_t c : dwta.bins) EXPECT_LT(c, 50u);
    config.kind = hash_kind::simhash;
    const auto sim = hash_family::create(config, 50, 7)->function_data();
    EXPECT_EQ(sim.projections, 90u);
    EXPECT_GE(sim.sign_stride, 90u);
    EXPECT_EQ(sim.signs.size(), size_t(50) * sim.sign_stride);
}

}  // namespace
