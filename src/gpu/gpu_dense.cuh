// The dense output layer's fused softmax + cross-entropy + gradient + bias gradient
// (--backend gpu-dense): the baseline the sparse paths are timed against, so it is kept near
// its floor (step_floor.hpp, "softmax").
//
// Layout: the logits are batch rows of `ld` values (ld = dense_leading_dimension(rows), a
// multiple of 8 at least rows: every row starts on a 16-byte boundary, so 4 columns are read
// in one load and their gradient written in one store); columns rows..ld - 1 are padding,
// never read as logits (cuBLAS does not write them). Logits and gradient have one type: fp32,
// or bf16 with --precision bf16 (the logit GEMM writes bf16, as AMP training's does, and the
// backward products read bf16 deltas: no rounding pass). The gradient's padding is written
// as zeros.
//
// Three kernels, in stream order (w: the bytes of a value, 4 in fp32, 2 in bf16):
//  1. partials: one block per (sample, chunk of 8,192 columns; 82 chunks at Amazon-670K): the
//     online maximum and partition sum of the chunk's logits + bias (online_softmax.hpp), 8
//     loads in flight per thread. Reads B R w bytes (the bias, R 4, stays in L2).
//  2. combine: one block per sample: the chunks' pairs combined in chunk order, the sample's
//     maximum and 1 / partition sum kept, its loss -sum_y (1/|y|) (logit_y + bias_y - log Z).
//     Reads B (R / chunk) 8 + the labels' logits: negligible.
//  3. gradient: one block per 1,024 columns (256 threads of 4), walking every sample in
//     groups of 4: delta = exp(logit + bias - max) / Z - (1/|y|) [column is a label] written,
//     and the bias gradient (the batch mean of delta over each column) summed in registers in
//     sample order. Reads B R w, writes B R w and R 4.
//     Amazon-670K: 655 blocks, one wave at 5 blocks an SM on an H200.
// Total: 3 B R w bytes (Amazon-670K, B = 256, bf16: 1.03 GB, about 0.24 ms on an H200; fp32
// logits with bf16 deltas, the 2026-11-26 form, moved 1.72 GB), against the former fused
// kernel + bf16 rounding + column sums' 4.46 GB and 3.34 ms (measured, Nsight Compute). The
// padded leading dimension also gives cuBLAS 16-byte aligned rows of bf16 (670,091 is odd),
// which its TMA (sm_90) kernels need.
// The loss is the exact cross-entropy, the gradient the same as the shared softmax_loss
// kernel's (gpu_layers.cuh) up to summation order; samples without labels have loss 0 and
// delta 0, as there.
#pragma once

#include "gpu_layers.cuh"

#include <cuda_bf16.h>

#include <cstdint>

namespace hslide::gpu {

/// The leading dimension of the dense logits and gradients for a layer of `rows` neurons.
inline uint32_t dense_leading_dimension(uint32_t rows) {
    return (rows + 7u) / 8u * 8u;
}

/// Floats of scratch dense_softmax_loss (and dense_logistic_loss) needs for a batch of `batch`
/// samples.
size_t dense_softmax_work_floats(uint32_t batch, uint32_t rows);

/// The fused softmax + cross-entropy over every column: logits (batch x ld, bias not added,
/// T = float or __nv_bfloat16, 16-byte aligned) are read only; the target is 1/|y| on each
/// label column (a label listed twice counts twice, as in softmax_loss). Writes delta (batch x
/// ld, T), loss[s], and bias_gradient[j] = inv_batch * sum_s delta[s][j] for j < rows (from
/// the fp32 values, before rounding). `work`: dense_softmax_work_floats(batch, rows) floats.
template <class T>
void dense_softmax_loss(const T* logits, const float* bias, uint32_t rows, uint32_t ld,
                        const batch_csr& batch, float inv_batch, T* delta, float* bias_gradient,
                        float* loss, float* work, cudaStream_t stream);

/// dense_softmax_loss's counterpart for --loss logistic (loss.hpp), the same three kernels,
/// layout and arguments: delta = sigmoid(logit + bias) - 1 on each label column (a label
/// listed twice counts twice), loss[s] = the sum of softplus(logit + bias) over the row less
/// the labels' logit + bias (the partials sum the chunks' softplus, the combine adds them in
/// chunk order); the same bias gradient. logistic_loss_gradient (the CPU's) is its reference.
template <class T>
void dense_logistic_loss(const T* logits, const float* bias, uint32_t rows, uint32_t ld,
                         const batch_csr& batch, float inv_batch, T* delta, float* bias_gradient,
                         float* loss, float* work, cudaStream_t stream);

}  // namespace hslide::gpu
