// The CUDA backend's factory, in plain C++ (no CUDA types), for the backend registry
// (src/backends/registry.cpp).
//
// The backend (gpu_backend_impl.cuh) trains a network of a sparse-input hidden layer and an
// output layer on one GPU, G-SLIDE style: the output layer's selection (gpu_selection.cuh: LSH
// with its hash functions and tables, or exact top-k) and the per-sample active sets live on
// the GPU, and forward, backward and Adam touch only the active neurons (sorted by neuron,
// reduced per row, no atomics on gradients). With `dense_output` (the gpu-dense baseline) or
// an output layer configured dense, the output layer is computed for every neuron with cuBLAS
// (tensor cores in bf16).
#pragma once

#include "hslide/backend.hpp"
#include "hslide/output_shard.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace hslide::gpu {

/// Creates the CUDA backend on GPU `device` holding `initial`, and builds its tables. Throws
/// hslide::error (unsupported) when there is no such GPU or the network has a shape this
/// backend cannot train yet (more than one hidden layer, a hidden layer wider than 1024,
/// --adam dense), saying which. With `async_rebuild`, table rebuilds (other than those with
/// new hash functions) run on a side stream while the steps go on with the tables in use,
/// which are swapped for the new ones when they are done (G-SLIDE's scheme); without, the
/// next step uses the new tables.
///
/// With a `shard` that is sharded, the backend is one rank of a label-sharded run (issue 32,
/// output_shard.hpp): `initial`'s output layer holds that shard's rows
/// (model_state::create_shard), and each step selects within the shard (exact top-k, or every
/// row of a dense layer), merges the candidates and builds the sets with the other ranks on
/// the host (as the CPU backend's ranks do: the same sets), computes its members' logits on
/// the GPU, the set softmax over ranks on the host (shard_softmax.hpp), its share of the
/// hidden gradient in double on the GPU, summed over ranks on the host, and updates its rows
/// and the replicated layer on the GPU. The collectives' buffers are staged through host
/// memory. LSH output layers and --fill-correction are refused (the CPU backend's ranks take
/// LSH).
std::unique_ptr<backend> create_gpu_backend(model_state initial, const train_config& train,
                                            int device, precision_mode precision, bool dense_output,
                                            bool async_rebuild, const output_shard& shard = {});

/// Row scores a second of exact top-k scoring (score_top_k: the chunked GEMMs and the merge) on
/// GPU `device`, over a layer of rows `width` wide, in bf16 products (`bf16`) or fp32: what a GPU
/// rank offers --shard-weights auto (output_shard.hpp). Measured on random rows, about 0.1 s.
double measure_gpu_scoring_rate(int device, uint32_t width, bool bf16);

/// Waits for the table rebuilds a GPU backend made with `async_rebuild` still runs, and puts
/// the last one in use (tests and benchmarks; nothing for other backends).
void finish_table_rebuild(backend& b);

/// The output layer's active sets of a GPU backend's last training step, per sample as built
/// (labels first), after waiting for it (tests; empty for a dense output layer or another
/// backend).
std::vector<std::vector<uint32_t>> last_output_active_sets(backend& b);

}  // namespace hslide::gpu
