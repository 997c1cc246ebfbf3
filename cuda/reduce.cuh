// Block-wide reductions and scans with a fixed shape (warp shuffles, then one warp over the
// warps' results): the same inputs in the same launch shape give the same bits, run after
// run. No atomics. Every thread of the block must call them (they synchronise).
#ifndef MOE_CUDA_REDUCE_CUH
#define MOE_CUDA_REDUCE_CUH

#include <math.h>

// Not installed: what this header declares stays inside libmoe (hidden in libmoe.so).
#pragma GCC visibility push(hidden)

template <typename T> struct op_sum {
    __device__ static T apply(T a, T b) { return a + b; }
    __device__ static T identity() { return T(0); }
};
template <typename T> struct op_max {
    // NaN wins, as the CPU's loops let it through the later arithmetic
    __device__ static T apply(T a, T b) { return (a != a || a > b) ? a : b; }
    __device__ static T identity() { return -INFINITY; }
};

// The block's reduction of v, returned to every thread. blockDim.x a multiple of 32, <= 1024.
template <typename Op, typename T> __device__ T block_reduce(T v) {
    __shared__ T part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads(); // part[] may still be read by a previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : Op::identity();
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_down_sync(0xffffffffu, v, o));
    if (threadIdx.x == 0) part[0] = v;
    __syncthreads();
    return part[0];
}
template <typename T> __device__ T block_sum(T v) { return block_reduce<op_sum<T>, T>(v); }
template <typename T> __device__ T block_max(T v) { return block_reduce<op_max<T>, T>(v); }

// Exclusive prefix sum of flag over the block; *total = the block's sum.
__device__ inline int block_exclusive_scan(int flag, int *total) {
    __shared__ int warp_sum[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = flag;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) warp_sum[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nw ? warp_sum[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < nw) warp_sum[lane] = w; // inclusive over warps
    }
    __syncthreads();
    const int before = warp > 0 ? warp_sum[warp - 1] : 0;
    *total = warp_sum[nw - 1];
    return before + x - flag;
}

#pragma GCC visibility pop

#endif
