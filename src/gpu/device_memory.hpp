// Owning arrays in GPU memory and in pinned host memory.
//
// Allocation failures say what was being allocated, how much, and how much the device has
// free, so "out of memory" tells the user which model dimension to shrink.
#pragma once

#include "cuda_check.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

namespace hslide::gpu {

/// Bytes free and in total on the current device.
std::pair<size_t, size_t> device_memory_info();

/// cudaMalloc with an error that names `what` and the free memory.
void* device_allocate(size_t bytes, const char* what);

/// The largest single device_allocate since the last reset (process-wide): lets a test check
/// that a pass allocates no block of its full size (prediction's batch x rows scores).
size_t largest_device_allocation();
void reset_largest_device_allocation();

/// n elements of T in device memory (uninitialised unless zeroed); moves, never copies.
template <class T>
class device_array {
  public:
    device_array() = default;
    device_array(size_t n, const char* what) { resize(n, what); }
    device_array(const device_array&) = delete;
    device_array& operator=(const device_array&) = delete;
    device_array(device_array&& o) noexcept { swap(o); }
    device_array& operator=(device_array&& o) noexcept {
        swap(o);
        return *this;
    }
    ~device_array() { release(); }

    /// Reallocates to exactly n elements when the size differs (contents are not kept).
    void resize(size_t n, const char* what) {
        if (n == size_) return;
        release();
        if (n) data_ = static_cast<T*>(device_allocate(n * sizeof(T), what));
        size_ = n;
    }
    /// Grows to at least n elements (contents are not kept when it grows). The first
    /// allocation is exact (the model-sized arrays are reserved once); a later growth takes
    /// 1.5x, so arrays sized by each batch's active sets settle instead of being reallocated at
    /// every new maximum (cudaFree waits for the whole device).
    void reserve(size_t n, const char* what) {
        if (n > size_) resize(size_ ? std::max(n, size_ + size_ / 2) : n, what);
    }
    void zero(cudaStream_t stream) {
        if (size_) HSLIDE_CUDA_CHECK(cudaMemsetAsync(data_, 0, size_ * sizeof(T), stream));
    }
    T* data() { return data_; }
    const T* data() const { return data_; }
    size_t size() const { return size_; }
    size_t bytes() const { return size_ * sizeof(T); }
    void swap(device_array& o) noexcept {
        std::swap(data_, o.data_);
        std::swap(size_, o.size_);
    }

  private:
    void release() {
        if (data_) cudaFree(data_);  // never fails on a valid pointer; nothing to report here
        data_ = nullptr;
        size_ = 0;
    }
    T* data_ = nullptr;
    size_t size_ = 0;
};

/// Runs a CUB-style call twice: call(nullptr, bytes) asks for the scratch size, then
/// call(scratch, bytes) runs with `scratch` grown to fit (it is kept for the next call).
template <class Call>
void with_scratch(device_array<uint8_t>& scratch, Call&& call) {
    size_t bytes = 0;
    HSLIDE_CUDA_CHECK(call(nullptr, bytes));
    scratch.reserve(bytes > 0 ? bytes : 1, "CUB scratch");
    bytes = scratch.size();
    HSLIDE_CUDA_CHECK(call(scratch.data(), bytes));
}

/// cudaMallocHost with an error that names `what`.
void* pinned_allocate(size_t bytes, const char* what);

/// Page-locked host memory (fast, asynchronous copies to and from the device).
template <class T>
class pinned_array {
  public:
    pinned_array() = default;
    pinned_array(const pinned_array&) = delete;
    pinned_array& operator=(const pinned_array&) = delete;
    ~pinned_array() {
        if (data_) cudaFreeHost(data_);
    }
    /// Grows to at least n elements (contents are not kept when it grows).
    void reserve(size_t n, const char* what) {
        if (n <= size_) return;
        if (data_) cudaFreeHost(data_);
        data_ = nullptr;
        size_ = 0;  // a failed allocation below leaves an empty array, not a dangling size
        // 1.5x growth: batches vary in size, and reallocating pinned memory is slow.
        const size_t grown = n + n / 2;
        data_ = static_cast<T*>(pinned_allocate(grown * sizeof(T), what));
        size_ = grown;
    }
    T* data() { return data_; }
    size_t size() const { return size_; }

  private:
    T* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace hslide::gpu
