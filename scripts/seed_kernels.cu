/******************************************************************************
 * Baseline kernels for scripts/bench_kernel.py. NOT multireduce's kernel.
 *
 * These are the seed document's kernels (../shared/seeds/: "Reduction (CUDA)" and
 * "The Reduction pattern"), reproduced as baselines so that the benchmark measures them
 * in the same run as multireduce's own kernel (kernels/multireduce/reduce.cuh). They are
 * deliberately left as the seed wrote them; do not tune them.
 *
 * seed_tree_sum_kernel<T>
 *   One element per thread, 256 threads per block: `__shared__ T s[256]`, each thread
 *   loads its element or the identity (zero) when it is past the end, then a shared-memory
 *   tree whose stride halves each round (128, 64, ..., 1), with the __syncthreads() outside
 *   the `if` so that every thread reaches it. Thread 0 adds the block's value into *out with
 *   one atomicAdd. *out must be zeroed before the launch (the benchmark does it with a fill,
 *   as the seed does). Launch with blockDim.x == 256 and gridDim.x == ceil(n / 256).
 *
 * seed_atomic_sum_kernel<T>
 *   The "direct port" the seed warns about: every thread atomicAdds its one element into
 *   *out. Same launch shape and zeroing as above.
 *
 *   Both take `int n`, as the seed does, so n must be below 2**31. T is one of float,
 *   double, int and __half (the types with a native atomicAdd; __half needs sm_70+).
 *   The sum is formed in T, so float and __half results carry the seed's rounding error.
 *
 * spin_kernel
 *   Not from the seed: the timing harness. One thread busy-waits (with __nanosleep between
 *   reads of the %globaltimer nanosecond clock) for duration_ns, so that the host can
 *   enqueue the timed calls behind it and host launch overhead stays out of the device
 *   time. max_cycles (SM clock) bounds the wait if %globaltimer does not advance.
 ******************************************************************************/
#include <cuda_fp16.h>

// The identity of addition, the pad value for threads past the end of the input.
template <class T> struct SeedZero {
    static __device__ __forceinline__ T value() { return static_cast<T>(0); }
};
template <> struct SeedZero<__half> {
    static __device__ __forceinline__ __half value() { return __float2half(0.0f); }
};

// a + b in T; for __half through the intrinsic, so no half operators are required.
template <class T> __device__ __forceinline__ T seed_add(T a, T b) { return a + b; }
template <> __device__ __forceinline__ __half seed_add<__half>(__half a, __half b) { return __hadd(a, b); }

template <class T>
__global__ void seed_tree_sum_kernel(const T* in, T* out, int n) {
    __shared__ T s[256];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;

    s[t] = (i < n) ? in[i] : SeedZero<T>::value();
    __syncthreads();

    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (t < stride)
            s[t] = seed_add(s[t], s[t + stride]);
        __syncthreads();
    }

    if (t == 0)
        atomicAdd(out, s[0]);
}

template <class T>
__global__ void seed_atomic_sum_kernel(const T* in, T* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        atomicAdd(out, in[i]);
}

extern "C" __global__ void spin_kernel(long long duration_ns, long long max_cycles) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    unsigned long long start;
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    const long long c0 = clock64();
    do {
        __nanosleep(200);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < static_cast<unsigned long long>(duration_ns) && clock64() - c0 < max_cycles);
}

#ifndef __CUDACC_RTC__
// Explicit instantiations for an nvcc build check (`nvcc -arch=sm_90 -c`); under NVRTC the
// benchmark instantiates the same templates through RawModule's name_expressions.
template __global__ void seed_tree_sum_kernel<float>(const float*, float*, int);
template __global__ void seed_tree_sum_kernel<double>(const double*, double*, int);
template __global__ void seed_tree_sum_kernel<int>(const int*, int*, int);
template __global__ void seed_tree_sum_kernel<__half>(const __half*, __half*, int);
template __global__ void seed_atomic_sum_kernel<float>(const float*, float*, int);
template __global__ void seed_atomic_sum_kernel<double>(const double*, double*, int);
template __global__ void seed_atomic_sum_kernel<int>(const int*, int*, int);
template __global__ void seed_atomic_sum_kernel<__half>(const __half*, __half*, int);
#endif
