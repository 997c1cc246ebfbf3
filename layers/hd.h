// MOE_HD marks a small inline function that both the host and a device compile: the per-row and
// per-element bodies of kernels that the CPU backend and a GPU backend share, so that one text
// fixes the arithmetic and the tie rules of both. A C compiler sees nothing; nvcc sees
// __host__ __device__. A portability annotation like `restrict`, not backend code: nothing in
// layers/ depends on which backends a build has.
#ifndef MOE_HD_H
#define MOE_HD_H

#if defined(__CUDACC__)
#define MOE_HD __host__ __device__
#else
#define MOE_HD
#endif

#endif
