// HSLIDE_HD marks functions that compile both for the GPU (under nvcc: __host__ __device__)
// and for the host, so that the CPU and host tests run the code the kernels run (the random
// generator, the top-k fill). Only a macro: no CUDA type reaches a public header through it.
#pragma once

#if defined(__CUDACC__)
#define HSLIDE_HD __host__ __device__
#else
#define HSLIDE_HD
#endif
