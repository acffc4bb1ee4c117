// HSLIDE_HD marks functions that compile both for the GPU (under nvcc: __host__ __device__)
// and for the host, so that host tests run the code the kernels run.
#pragma once

#if defined(__CUDACC__)
#define HSLIDE_HD __host__ __device__
#else
#define HSLIDE_HD
#endif
