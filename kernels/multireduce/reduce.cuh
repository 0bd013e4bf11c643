/******************************************************************************
 * multireduce: single-launch, deterministic full reduction of a dense array.
 *
 * ALGORITHM
 *   reduce_kernel<T, Acc, Out, Op, BLOCK, UNROLL, LOAD> reduces n elements of type T to
 *   one value of type Out, forming partials in the accumulator type Acc with Op::combine.
 *   LOAD selects the cache policy of the 16-byte loads (see load16).
 *
 *   1. Grid-stride loop. The input is split into a scalar head (elements before the first
 *      16-byte boundary), an aligned body read as 16-byte vectors (uint4), and a scalar tail
 *      (fewer than one vector). Each thread keeps ACC independent accumulators and issues
 *      UNROLL vector loads before it uses the first, so that enough bytes are in flight to
 *      saturate HBM.
 *   2. Block tree. Each warp reduces its 32 values with shuffles (16, 8, 4, 2, 1 lanes:
 *      the number of active lanes halves each round); lane 0 of each warp writes its value
 *      to shared memory; warp 0 reads those BLOCK/32 values, padding lanes beyond them with
 *      the identity, and reduces them with shuffles again.
 *   3. Last block done. Thread 0 of each block stores the block's partial, fences, and
 *      increments a global counter. The block that brings the counter to gridDim.x reads
 *      all partials in block order, reduces them with the same block tree, converts the
 *      result to Out and resets the counter to zero for the next launch.
 *
 *   There are no floating-point atomics: the order of every combine depends only on n, the
 *   input's address modulo 16 and gridDim.x, so the same input and launch configuration
 *   give the same bits on every run.
 *
 * LAUNCH CONSTRAINTS
 *   - blockDim.x == BLOCK, a multiple of 32 and at most 1024; BLOCK >= 16.
 *   - gridDim.x >= 1 and at most the length of `partials`.
 *   - n >= 1 (empty inputs are handled by the caller).
 *   - `in` is aligned to sizeof(T).
 *   - *counter == 0 on entry. The kernel leaves it 0 on exit, so one (partials, counter)
 *     workspace may be reused by launches that are ordered with respect to each other
 *     (the same stream), but not by concurrent launches.
 *   - The identity must be the neutral element of Op for Acc: it pads idle lanes.
 *
 * RESULT
 *   Written to *out by thread 0 of the last block. block_reduce's return value is
 *   undefined in threads other than thread 0.
 *
 * BARRIERS
 *   block_reduce contains one __syncthreads() and must be reached by every thread of the
 *   block. Shared memory it writes is not read again until after the next barrier, so it
 *   may be called twice in a row without an extra __syncthreads().
 ******************************************************************************/
#pragma once

#include <cuda_fp16.h>

namespace multireduce {

constexpr unsigned FULL_MASK = 0xffffffffu;

// ---------------------------------------------------------------------------------------
// Type helpers (NVRTC has no <type_traits>).

template <class T> struct IsFloating { static constexpr bool value = false; };
template <> struct IsFloating<float> { static constexpr bool value = true; };
template <> struct IsFloating<double> { static constexpr bool value = true; };

__device__ __forceinline__ bool sign_bit(float x) { return __float_as_int(x) < 0; }
__device__ __forceinline__ bool sign_bit(double x) { return __double_as_longlong(x) < 0; }

// Conversion between element, result and accumulator types. __half converts through float
// (exact); conversions to __half go through double so that each is one correct rounding.
template <class To, class From> struct Convert {
    static __device__ __forceinline__ To apply(From x) { return static_cast<To>(x); }
};
template <class To> struct Convert<To, __half> {
    static __device__ __forceinline__ To apply(__half x) { return static_cast<To>(__half2float(x)); }
};
template <class From> struct Convert<__half, From> {
    static __device__ __forceinline__ __half apply(From x) { return __double2half(static_cast<double>(x)); }
};
// double to float, one correct rounding, subnormal results included: CuPy compiles with
// -ftz=true, under which static_cast<float>(double) is cvt.rn.ftz.f32.f64 and flushed a
// result below 2**-126 to zero (a float32 sum of [1.5e-38, -1.4e-38] was 0.0, not 1e-39). A
// subnormal's significand is |x| * 2**149 rounded to an integer (exact scaling, then rint in
// the default mode, to nearest even); 2**23 there is 2**-126's bits, the smallest normal.
template <> struct Convert<float, double> {
    static __device__ __forceinline__ float apply(double x) {
        if (fabs(x) < 0x1p-126) {  // false for NaN
            const unsigned k = static_cast<unsigned>(rint(fabs(x) * 0x1p149));
            return __uint_as_float(k | (sign_bit(x) ? 0x80000000u : 0u));
        }
        return static_cast<float>(x);
    }
};
template <> struct Convert<__half, float> {
    static __device__ __forceinline__ __half apply(float x) { return __float2half_rn(x); }
};
template <> struct Convert<__half, __half> {
    static __device__ __forceinline__ __half apply(__half x) { return x; }
};

template <class To, class From>
__device__ __forceinline__ To convert(From x) { return Convert<To, From>::apply(x); }

// An input element as the kernels see it: converted to the result type first (NumPy's
// sum(dtype=...) converts before it adds), then widened to the accumulator.
template <class Acc, class Out, class T>
__device__ __forceinline__ Acc load_as(T x) { return convert<Acc>(convert<Out>(x)); }

// ---------------------------------------------------------------------------------------
// Operators. Each is the device half of one multireduce.ops.Op (the functor field names
// it); the identity comes from that Op as a kernel argument, so it is defined only there.
// An operator has `combine` and `load`: `load` turns one input element into an accumulator
// value as it is read (in the same pass, never a separate one). Fold's load is load_as;
// NanSum, NanProd, Any, All and CountNonzero map the element first.

template <class T> __device__ __forceinline__ bool is_nan(T x) {
    if constexpr (IsFloating<T>::value) {
        return x != x;
    } else {
        return false;
    }
}
template <> __device__ __forceinline__ bool is_nan<__half>(__half x) { return __hisnan(x); }

// x != 0 as NumPy means it for truth values: NaN is nonzero, -0.0 is zero. float from its
// bits: under CuPy's -ftz=true, x != 0.0f is setp.neu.ftz.f32, which counted a subnormal as
// zero (count_nonzero([1e-40]) was 0, any([1e-40]) False).
template <class T> __device__ __forceinline__ bool nonzero(T x) { return x != T(0); }
template <> __device__ __forceinline__ bool nonzero<float>(float x) { return (__float_as_uint(x) << 1) != 0u; }
template <> __device__ __forceinline__ bool nonzero<__half>(__half x) { return __half2float(x) != 0.0f; }
template <> __device__ __forceinline__ bool nonzero<bool>(bool x) { return x; }

struct Fold {
    template <class Acc, class Out, class T> static __device__ __forceinline__ Acc load(T x) {
        return load_as<Acc, Out>(x);
    }
};

struct Sum : Fold {
    template <class A> static __device__ __forceinline__ A combine(A a, A b) { return a + b; }
};

struct Prod : Fold {
    template <class A> static __device__ __forceinline__ A combine(A a, A b) { return a * b; }
};

// nansum: NaN elements count as zero (before any dtype= conversion, as on the CPU); a NaN
// made by the sum itself (inf + -inf) stays. Its partials combine with Sum.
struct NanSum : Sum {
    template <class Acc, class Out, class T> static __device__ __forceinline__ Acc load(T x) {
        return is_nan(x) ? Acc(0) : load_as<Acc, Out>(x);
    }
};

// nanprod: NaN elements count as one (before any dtype= conversion); a NaN made by the
// product itself (inf * 0) stays. Its partials combine with Prod.
struct NanProd : Prod {
    template <class Acc, class Out, class T> static __device__ __forceinline__ Acc load(T x) {
        return is_nan(x) ? Acc(1) : load_as<Acc, Out>(x);
    }
};

// IEEE 754-2019 maximum/minimum: NaN propagates, and -0.0 orders below +0.0, so that the
// result does not depend on the order of the operands.
struct Max : Fold {
    template <class A> static __device__ __forceinline__ A combine(A a, A b) {
        if constexpr (IsFloating<A>::value) {
            return (a > b || a != a || (a == b && !sign_bit(a))) ? a : b;
        } else {
            return a > b ? a : b;
        }
    }
};

struct Min : Fold {
    template <class A> static __device__ __forceinline__ A combine(A a, A b) {
        if constexpr (IsFloating<A>::value) {
            return (a < b || a != a || (a == b && sign_bit(a))) ? a : b;
        } else {
            return a < b ? a : b;
        }
    }
};

// IEEE 754-2019 maximumNumber/minimumNumber (nanmax, nanmin): NaN loses to any number, and
// is the identity; zeros order as in Max/Min. All-NaN gives NaN.
template <class Extreme>
struct NanIgnoring : Fold {
    template <class A> static __device__ __forceinline__ A combine(A a, A b) {
        if constexpr (IsFloating<A>::value) {
            if (b != b) return a;
            if (a != a) return b;
        }
        return Extreme::combine(a, b);
    }
};

struct NanMax : NanIgnoring<Max> {};
struct NanMin : NanIgnoring<Min> {};

// any, all (bool accumulators) and count_nonzero (int64): each element read as x != 0.
struct Any {
    template <class Acc, class Out, class T> static __device__ __forceinline__ Acc load(T x) {
        return static_cast<Acc>(nonzero(x));
    }
    // Bitwise, not || and &&: both operands are already loaded, and a short circuit would let
    // the compiler make the loads conditional.
    template <class A> static __device__ __forceinline__ A combine(A a, A b) { return static_cast<A>(a | b); }
};

struct All : Any {
    template <class A> static __device__ __forceinline__ A combine(A a, A b) { return static_cast<A>(a & b); }
};

struct CountNonzero : Sum {
    template <class Acc, class Out, class T> static __device__ __forceinline__ Acc load(T x) {
        return nonzero(x) ? Acc(1) : Acc(0);
    }
};

// ---------------------------------------------------------------------------------------
// 16-byte loads of read-only data. LOAD 0: the non-coherent (texture) path, __ldg.
// LOAD 1: the same, but not allocated in L1 and with a 256-byte L2 prefetch hint, for data
// that is read exactly once. LOAD 2: not allocated in L1, no hint. LOAD 3: cache-streaming (__ldcs).
// (Measured on the H200: see docs/kernel-notes.md; 0 is the default.)

template <int LOAD>
__device__ __forceinline__ uint4 load16(const uint4* p) {
    uint4 r;
    if constexpr (LOAD == 1) {
        asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
            : "l"(p));
        return r;
    } else if constexpr (LOAD == 2) {
        asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
            : "l"(p));
        return r;
    } else if constexpr (LOAD == 3) {
        return __ldcs(p);  // ld.global.cs: streaming, likely to be accessed once
    } else {
        return __ldg(p);
    }
}

// ---------------------------------------------------------------------------------------
// Warp and block trees.

template <class A>
__device__ __forceinline__ A shfl_down(A v, int offset) {
    if constexpr (sizeof(A) >= 4) {  // __shfl_down_sync has overloads for every 32/64-bit type
        return __shfl_down_sync(FULL_MASK, v, offset);
    } else {  // bool, 8- and 16-bit integers: widen exactly, shuffle, narrow back
        return static_cast<A>(__shfl_down_sync(FULL_MASK, static_cast<int>(v), offset));
    }
}

// Lane 0 receives the combination of all 32 lanes, in a fixed order.
template <class Op, class A>
__device__ __forceinline__ A warp_reduce(A v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = Op::combine(v, shfl_down(v, offset));
    return v;
}

// Thread 0 receives the combination of all BLOCK threads' values; see BARRIERS above.
template <class Op, int BLOCK, class A>
__device__ __forceinline__ A block_reduce(A v, A identity, A* warp_values) {
    static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "BLOCK must be a multiple of 32, at most 1024");
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_reduce<Op>(v);
    if (lane == 0) warp_values[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = (lane < BLOCK / 32) ? warp_values[lane] : identity;
        v = warp_reduce<Op>(v);
    }
    return v;
}

// ---------------------------------------------------------------------------------------
// Building blocks shared by the kernels.

// How a contiguous range in[0, n) splits for 16-byte loads: a scalar head up to the first
// 16-byte boundary (at most n elements), `nvec` aligned vectors starting at `body`, and a
// scalar tail from `tail_start` (fewer than one vector).
template <class T>
struct VectorSplit {
    long long head, nvec, tail_start;
    const uint4* body;
    __device__ __forceinline__ VectorSplit(const T* in, long long n) {
        constexpr int VEC = 16 / sizeof(T);
        const unsigned long long address = reinterpret_cast<unsigned long long>(in);
        head = static_cast<long long>(((16u - (address & 15u)) & 15u) / sizeof(T));
        if (head > n) head = n;
        nvec = (n - head) / VEC;
        tail_start = head + nvec * VEC;
        body = reinterpret_cast<const uint4*>(in + head);
    }
};

// Fold the 16-byte vectors body[i], body[i + stride], ... below `end` into the thread's ACC
// accumulators (element j of a vector into acc[j % ACC]), UNROLL loads in flight. Shared by
// the grid-stride and the tiled loops.
template <class T, class Acc, class Out, class Op, int UNROLL, int LOAD, int ACC>
__device__ __forceinline__ void fold_vectors(Acc (&acc)[ACC], const uint4* __restrict__ body, long long i,
                                             long long end, long long stride) {
    constexpr int VEC = 16 / sizeof(T);
    for (; i + (UNROLL - 1) * stride < end; i += UNROLL * stride) {
        uint4 raw[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) raw[u] = load16<LOAD>(body + i + u * stride);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const T* e = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
            for (int j = 0; j < VEC; ++j) acc[j % ACC] = Op::combine(acc[j % ACC], Op::template load<Acc, Out>(e[j]));
        }
    }
    for (; i < end; i += stride) {
        const uint4 raw = load16<LOAD>(body + i);
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j % ACC] = Op::combine(acc[j % ACC], Op::template load<Acc, Out>(e[j]));
    }
}

// One thread's share of a reduction of the contiguous range in[0, n), where threads
// tid = 0 .. nthreads-1 cooperate: a scalar head up to the first 16-byte boundary, the
// aligned body as 16-byte vectors (UNROLL loads in flight, ACC accumulators), a scalar
// tail. Returns the combination of the thread's accumulators, in a fixed order.
template <class T, class Acc, class Out, class Op, int UNROLL, int LOAD>
__device__ __forceinline__ Acc thread_reduce(const T* __restrict__ in, long long n, Acc identity, long long tid,
                                             long long nthreads) {
    constexpr int VEC = 16 / sizeof(T);          // elements per 16-byte load
    constexpr int ACC = VEC < 4 ? VEC : 4;       // independent accumulators per thread
    static_assert(16 % sizeof(T) == 0, "element size must divide 16");

    Acc acc[ACC];
#pragma unroll
    for (int k = 0; k < ACC; ++k) acc[k] = identity;

    const VectorSplit<T> split(in, n);
    const long long head = split.head, nvec = split.nvec, tail_start = split.tail_start;
    const uint4* __restrict__ body = split.body;

    if (tid < head) acc[0] = Op::combine(acc[0], Op::template load<Acc, Out>(in[tid]));
    if (tid < n - tail_start) acc[ACC - 1] = Op::combine(acc[ACC - 1], Op::template load<Acc, Out>(in[tail_start + tid]));

    fold_vectors<T, Acc, Out, Op, UNROLL, LOAD>(acc, body, tid, nvec, nthreads);

    Acc v = acc[0];
#pragma unroll
    for (int k = 1; k < ACC; ++k) v = Op::combine(v, acc[k]);
    return v;
}

// One thread's share of a reduction of in[0, n) by a grid of blocks that each read whole
// tiles: the aligned body is cut into tiles of TILE 16-byte vectors (a multiple of
// BLOCK * UNROLL), and block b reads tiles b, b + gridDim.x, ... front to back, UNROLL loads
// in flight per thread. So each block streams through contiguous memory, and the grid as a
// whole through gridDim.x tiles at a time. The scalar head and tail go to the grid's first
// threads, as in thread_reduce. Returns the combination of the thread's accumulators, in a
// fixed order (the result does not depend on timing).
template <class T, class Acc, class Out, class Op, int BLOCK, int UNROLL, int LOAD, long long TILE>
__device__ __forceinline__ Acc tile_reduce(const T* __restrict__ in, long long n, Acc identity) {
    constexpr int VEC = 16 / sizeof(T);
    constexpr int ACC = VEC < 4 ? VEC : 4;
    static_assert(TILE % (static_cast<long long>(BLOCK) * UNROLL) == 0, "a tile is whole unrolled steps");

    Acc acc[ACC];
#pragma unroll
    for (int k = 0; k < ACC; ++k) acc[k] = identity;

    const VectorSplit<T> split(in, n);
    const long long head = split.head, nvec = split.nvec, tail_start = split.tail_start;
    const uint4* __restrict__ body = split.body;
    const long long tid = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;

    if (tid < head) acc[0] = Op::combine(acc[0], Op::template load<Acc, Out>(in[tid]));
    if (tid < n - tail_start) acc[ACC - 1] = Op::combine(acc[ACC - 1], Op::template load<Acc, Out>(in[tail_start + tid]));

    for (long long start = static_cast<long long>(blockIdx.x) * TILE; start < nvec;
         start += static_cast<long long>(gridDim.x) * TILE) {
        const long long end = start + TILE < nvec ? start + TILE : nvec;
        fold_vectors<T, Acc, Out, Op, UNROLL, LOAD>(acc, body, start + threadIdx.x, end, BLOCK);
    }

    Acc v = acc[0];
#pragma unroll
    for (int k = 1; k < ACC; ++k) v = Op::combine(v, acc[k]);
    return v;
}

// Combine one value per thread of the `nblocks` blocks that share one output (this block
// is number `b` of them) into *out: the block tree, then the block that finishes last
// combines the blocks' partials in block order and resets *counter to zero. Must be
// reached by every thread of the block; see BARRIERS above.
template <class Op, int BLOCK, class Acc, class Out>
__device__ __forceinline__ void finish(Acc v, Acc identity, unsigned int nblocks, unsigned int b,
                                       Acc* __restrict__ partials, unsigned int* __restrict__ counter,
                                       Out* __restrict__ out) {
    __shared__ Acc warp_values[BLOCK / 32];
    __shared__ bool is_last_block;
    v = block_reduce<Op, BLOCK>(v, identity, warp_values);

    if (nblocks == 1) {
        if (threadIdx.x == 0) *out = convert<Out>(v);
        return;
    }
    if (threadIdx.x == 0) {
        partials[b] = v;
        __threadfence();  // publish the partial before the counter says it is there
        const unsigned int done = atomicAdd(counter, 1u);
        is_last_block = (done == nblocks - 1);
    }
    __syncthreads();
    if (!is_last_block) return;

    __threadfence();  // see every other block's partial
    const volatile Acc* vpartials = partials;
    Acc w = identity;
    unsigned int k = threadIdx.x;
    if (nblocks > 4u * BLOCK) {
        // Many partials (grids of one block per tile): four loads in flight per thread, in
        // a fixed order, instead of one chain of dependent loads.
        Acc w1 = identity, w2 = identity, w3 = identity;
        for (; k + 3u * BLOCK < nblocks; k += 4u * BLOCK) {
            w = Op::combine(w, static_cast<Acc>(vpartials[k]));
            w1 = Op::combine(w1, static_cast<Acc>(vpartials[k + BLOCK]));
            w2 = Op::combine(w2, static_cast<Acc>(vpartials[k + 2u * BLOCK]));
            w3 = Op::combine(w3, static_cast<Acc>(vpartials[k + 3u * BLOCK]));
        }
        w = Op::combine(Op::combine(w, w1), Op::combine(w2, w3));
    }
    for (; k < nblocks; k += BLOCK) w = Op::combine(w, static_cast<Acc>(vpartials[k]));
    w = block_reduce<Op, BLOCK>(w, identity, warp_values);
    if (threadIdx.x == 0) {
        *out = convert<Out>(w);
        *counter = 0u;
    }
}

// ---------------------------------------------------------------------------------------
// The kernels.

// Full reduction of in[0, n) to *out in one launch (ALGORITHM above).
template <class T, class Acc, class Out, class Op, int BLOCK, int UNROLL, int LOAD>
__global__ void __launch_bounds__(BLOCK)
reduce_kernel(const T* __restrict__ in, long long n, Acc identity, Acc* __restrict__ partials,
              unsigned int* __restrict__ counter, Out* __restrict__ out) {
    static_assert(BLOCK >= 16 / sizeof(T), "head and tail are handled by the first threads");
    // LOAD packs two choices: bits 0-1 the load policy (load16), bits 2+ the tiling. 0: the
    // grid-stride interleave of thread_reduce; t > 0: tile_reduce with tiles of
    // BLOCK * UNROLL << (t - 1) vectors.
    constexpr int POLICY = LOAD & 3;
    constexpr int TILING = LOAD >> 2;
    Acc v;
    if constexpr (TILING == 0) {
        const long long tid = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;
        const long long nthreads = static_cast<long long>(gridDim.x) * BLOCK;
        v = thread_reduce<T, Acc, Out, Op, UNROLL, POLICY>(in, n, identity, tid, nthreads);
    } else {
        constexpr long long TILE = (static_cast<long long>(BLOCK) * UNROLL) << (TILING - 1);
        v = tile_reduce<T, Acc, Out, Op, BLOCK, UNROLL, POLICY, TILE>(in, n, identity);
    }
    finish<Op, BLOCK>(v, identity, gridDim.x, blockIdx.x, partials, counter, out);
}

// Row reduction: `rows` contiguous rows of `length` elements each (the last axis of a
// C-contiguous array), out[row] for each. gridDim.x blocks share a row (the full kernel's
// scheme per row, with partials[row * gridDim.x ...] and counters[row]); gridDim.y strides
// over the rows. Each row is read once, with 16-byte loads wherever it is aligned.
template <class T, class Acc, class Out, class Op, int BLOCK, int UNROLL, int LOAD>
__global__ void __launch_bounds__(BLOCK, 1)
reduce_rows_kernel(const T* __restrict__ in, long long rows, long long length, Acc identity,
                   Acc* __restrict__ partials, unsigned int* __restrict__ counters, Out* __restrict__ out) {
    static_assert(BLOCK >= 16 / sizeof(T), "head and tail are handled by the first threads");
    const long long tid = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;
    const long long nthreads = static_cast<long long>(gridDim.x) * BLOCK;
    for (long long row = blockIdx.y; row < rows; row += gridDim.y) {
        const Acc v = thread_reduce<T, Acc, Out, Op, UNROLL, LOAD>(in + row * length, length, identity, tid, nthreads);
        finish<Op, BLOCK>(v, identity, gridDim.x, blockIdx.x, partials + row * gridDim.x, counters + row, out + row);
        __syncthreads();  // finish's shared memory is written again for the next row
    }
}

// Column reduction: reduce the middle axis of a C-contiguous (outer, R, inner) array to
// out[o * inner + c]. Thread c of the grid's x dimension owns column c, so a warp's loads
// are 32 consecutive elements (coalesced); each thread keeps UNROLL independent
// accumulators over the rows. gridDim.y strides over `outer`; gridDim.z splits R into
// slabs, whose partials (partials[(o * slabs + s) * inner + c]) the last slab to finish
// combines in slab order (counters[o * gridDim.x + blockIdx.x]).
template <class T, class Acc, class Out, class Op, int BLOCK, int UNROLL>
__global__ void __launch_bounds__(BLOCK, 1)
reduce_cols_kernel(const T* __restrict__ in, long long outer, long long R, long long inner, Acc identity,
                   Acc* __restrict__ partials, unsigned int* __restrict__ counters, Out* __restrict__ out) {
    __shared__ bool is_last_slab;
    const long long c = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;
    const unsigned int slabs = gridDim.z;
    const long long per_slab = (R + slabs - 1) / slabs;
    const long long r0 = static_cast<long long>(blockIdx.z) * per_slab;
    const long long r1 = r0 + per_slab < R ? r0 + per_slab : R;
    for (long long o = blockIdx.y; o < outer; o += gridDim.y) {
        Acc acc[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc[u] = identity;
        if (c < inner) {
            const T* __restrict__ column = in + o * R * inner + c;
            long long r = r0;
            for (; r + UNROLL <= r1; r += UNROLL) {
                T x[UNROLL];
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) x[u] = column[(r + u) * inner];
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) acc[u] = Op::combine(acc[u], Op::template load<Acc, Out>(x[u]));
            }
            for (; r < r1; ++r) acc[0] = Op::combine(acc[0], Op::template load<Acc, Out>(column[r * inner]));
        }
        Acc v = acc[0];
#pragma unroll
        for (int u = 1; u < UNROLL; ++u) v = Op::combine(v, acc[u]);

        if (slabs == 1) {
            if (c < inner) out[o * inner + c] = convert<Out>(v);
            continue;
        }
        if (c < inner) {
            partials[(o * slabs + blockIdx.z) * inner + c] = v;
            __threadfence();  // publish the partial before the counter says it is there
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned int done = atomicAdd(counters + o * gridDim.x + blockIdx.x, 1u);
            is_last_slab = (done == slabs - 1);
        }
        __syncthreads();
        if (is_last_slab) {
            __threadfence();  // see every other slab's partials
            if (c < inner) {
                const volatile Acc* vpartials = partials;
                Acc w = identity;
                for (unsigned int s = 0; s < slabs; ++s)
                    w = Op::combine(w, static_cast<Acc>(vpartials[(o * slabs + s) * inner + c]));
                out[o * inner + c] = convert<Out>(w);
            }
            if (threadIdx.x == 0) counters[o * gridDim.x + blockIdx.x] = 0u;
        }
        __syncthreads();  // is_last_slab is written again for the next o
    }
}

// ---------------------------------------------------------------------------------------
// Exact sums for the reproducible mode, in multireduce/_exact.py's format: the sum as an
// integer number of 2**-1074 units, in EXACT_LIMBS 32-bit digits held in int64 slots,
// followed by counts of NaN, +inf and -inf. Integer additions are associative, so the
// result does not depend on the grid, the block or the order of the atomics.
//
// float16 and float32 inputs (the fast path): each thread adds its elements into float64
// accumulators that stay exact inside a *window* of exponents. With the window
// 2**a <= |x| < 2**(a + EXACT_WINDOW), every element is an integer multiple of the unit
// u = 2**(a - 23) (a float32's ulp at 2**a) below 2**(EXACT_WINDOW + 23) u, so a float64
// sum of fewer than 2**(53 - EXACT_WINDOW - 23) of them is an integer multiple of u below
// 2**53 u: every add is exact, and the fast path costs what the fast sum's float64
// accumulation costs, one conversion and one add, plus two integer compares (SUMS independent
// sums per thread, UNROLL 16-byte loads in flight). The slow path is inlined: as an
// out-of-line call it forced the thread's window into local memory (3.6 ms vs 1.3 ms for
// 2^30 float32 on the H200). Every
// EXACT_FOLD elements the float64 sums are folded (exactly) into an int64 count of u, and
// every EXACT_FLUSHES folds that goes to the block's limbs in shared memory with three
// integer atomics. An element above the window moves the window up (after a fold and a
// flush). Below the window is a *low window* of EXACT_LOW_WINDOW more exponents with one
// float64 sum of its own, folded and flushed with the window's (an element there costs a
// compare more than one in the window). Elements below both (more than about 2**36 times
// smaller than the largest of the thread's window), subnormals, NaN and infinities go
// straight to the block's slots.
// Subnormals never take the float path: CuPy compiles every kernel with -ftz=true, under
// which a float32 subnormal compares and converts as zero, so the window tests use the
// bits (integer compares) and a subnormal's digits go to the slots as integers. Zeros always
// take the fast path. Data spread over a huge dynamic range leaves the fast path often and
// is slower; every path is exact.
// float64 inputs: every element's digits go to the block's slots with three integer
// atomics (correct; not fast).
//
// Block slots stay below 2**63 while each block adds fewer than 2**31 terms below 2**32 per
// slot; the caller sizes the grid so, and launches at most EXACT_MAX_N elements per launch
// so that the sum over blocks stays below 2**63 too.

constexpr int EXACT_LIMBS = 70;
constexpr int EXACT_SLOTS = EXACT_LIMBS + 3;  // limbs, then NaN, +inf, -inf counts
constexpr int EXACT_WINDOW = 20;    // float32 exponents one window spans
constexpr int EXACT_HEADROOM = 2;   // exponents kept free above a new window's first element
constexpr int EXACT_LOW_WINDOW = 19;  // float32 exponents the low window spans, just below the window
constexpr int EXACT_FOLD = 1024;    // elements per thread between folds (two float64 sums)
constexpr int EXACT_FLUSHES = 64;   // folds between flushes of the int64 to shared memory
// A float64 sum of fewer than 2**10 elements below 2**(EXACT_WINDOW + 23) u stays below 2**53 u.
static_assert(EXACT_WINDOW + 23 + 10 <= 53, "the float64 window sums must stay exact");
// The low window has one float64 sum, which may take every element between two folds: fewer
// than EXACT_FOLD + 32 (one unrolled trip of the loop) < 2**11 elements below 2**(19 + 23) u.
static_assert(EXACT_LOW_WINDOW + 23 + 11 <= 53, "the float64 low-window sum must stay exact");
// Each fold adds less than 4 * 2**53 u to the int64; EXACT_FLUSHES folds stay below 2**62.
static_assert(55 + 6 + 1 <= 62, "the int64 window sum must not overflow");

// The special-value counters: slot EXACT_LIMBS + 0 (NaN), + 1 (+inf), + 2 (-inf).
__device__ __forceinline__ void exact_count_special(unsigned long long* slots, bool nan, bool negative) {
    atomicAdd(slots + EXACT_LIMBS + (nan ? 0 : (negative ? 2 : 1)), 1ull);
}

// Adds v * 2**(position - 1074) to the slots (|v| <= 2**63, 0 <= position <= 1074 + 1024).
__device__ __forceinline__ void exact_add_scaled(unsigned long long* slots, long long v, int position) {
    if (v == 0) return;
    const bool negative = v < 0;
    const unsigned long long u = negative ? 0ull - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
    const int limb = position >> 5;
    const int shift = position & 31;
    const unsigned long long low = u << shift;                         // bits 0..63 of u * 2**shift
    const unsigned long long high = shift ? u >> (64 - shift) : 0ull;  // bits 64..94, < 2**31
    long long d0 = static_cast<long long>(low & 0xFFFFFFFFull);
    long long d1 = static_cast<long long>(low >> 32);
    long long d2 = static_cast<long long>(high);
    if (negative) {
        d0 = -d0;
        d1 = -d1;
        d2 = -d2;
    }
    // Two's-complement wrap-around makes unsigned atomics add signed values exactly.
    if (d0 != 0) atomicAdd(slots + limb, static_cast<unsigned long long>(d0));
    if (d1 != 0) atomicAdd(slots + limb + 1, static_cast<unsigned long long>(d1));
    if (d2 != 0) atomicAdd(slots + limb + 2, static_cast<unsigned long long>(d2));
}

// One float64 element straight into the slots.
__device__ __forceinline__ void exact_add(unsigned long long* slots, double v) {
    const unsigned long long bits = static_cast<unsigned long long>(__double_as_longlong(v));
    const int exponent = static_cast<int>((bits >> 52) & 0x7FF);
    long long m = static_cast<long long>(bits & ((1ull << 52) - 1));
    const bool negative = (bits >> 63) != 0;
    if (exponent == 0x7FF) {  // NaN or infinity: counted, not summed
        exact_count_special(slots, m != 0, negative);
        return;
    }
    if (exponent != 0) m |= 1ll << 52;  // normal: the hidden bit
    // v = m * 2**(position - 1074), with m < 2**53.
    exact_add_scaled(slots, negative ? -m : m, exponent == 0 ? 0 : exponent - 1);
}

// One thread's window over float32 values (float16 values are converted to float32 first,
// exactly).
struct ExactWindow {
    double sum[4] = {0.0, 0.0, 0.0, 0.0};  // exact float64 sums of elements in the window
    long long folded = 0;           // exact sum of earlier folds, in units u = 2**(a - 23)
    int a = -126;                   // the window's lowest exponent (-126: the smallest normal's)
    // The bits of 2**a and of 2**(a + EXACT_WINDOW) (or of +inf): the window holds the x with
    // lo <= bits(|x|) < hi, normal numbers only. hi = 0: no window yet.
    unsigned int lo = 0u, hi = 0u;
    // The low window, just below: 2**a_low <= |x| < 2**a with a_low = max(a - EXACT_LOW_WINDOW,
    // -126) (derived from a where needed, which keeps registers for occupancy), normal numbers
    // only, one float64 sum in units u_low = 2**(a_low - 23). Elements there would otherwise
    // take the slots' atomics: with it, data spread over EXACT_WINDOW + EXACT_LOW_WINDOW
    // exponents stays off the slots.
    double low = 0.0;
    long long folded_low = 0;
    int since_fold = 0, folds = 0;

    __device__ __forceinline__ int a_low() const { return a - EXACT_LOW_WINDOW < -126 ? -126 : a - EXACT_LOW_WINDOW; }

    __device__ __forceinline__ void fold() {
        const double inv_u = __longlong_as_double(static_cast<long long>(1023 + 23 - a) << 52);  // 2**(23 - a)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            folded += __double2ll_rn(sum[k] * inv_u);  // an exact integer
            sum[k] = 0.0;
        }
        const double inv_u_low = __longlong_as_double(static_cast<long long>(1023 + 23 - a_low()) << 52);
        folded_low += __double2ll_rn(low * inv_u_low);  // an exact integer
        low = 0.0;
        since_fold = 0;
        ++folds;
    }

    __device__ __forceinline__ void flush(unsigned long long* slots) {
        fold();
        exact_add_scaled(slots, folded, a + 1051);  // u = 2**(a - 23) = 2**((a + 1051) - 1074)
        exact_add_scaled(slots, folded_low, a_low() + 1051);
        folded = 0;
        folded_low = 0;
        folds = 0;
    }

    // Called after every EXACT_FOLD or so elements.
    __device__ __forceinline__ void maybe_fold(unsigned long long* slots) {
        if (since_fold >= EXACT_FOLD) {
            fold();
            if (folds >= EXACT_FLUSHES) flush(slots);
        }
    }

    // k (0..3, a constant after unrolling) picks the sum.
    __device__ __forceinline__ void add(unsigned long long* slots, float x, int k) {
        const unsigned int ax = __float_as_uint(x) & 0x7FFFFFFFu;
        if (ax - lo < hi - lo || ax == 0u) {  // lo <= ax < hi (unsigned wrap-around), or a zero
            sum[k] += static_cast<double>(x);
        } else {
            slow(slots, x);
        }
    }

    __device__ void slow(unsigned long long* slots, float x) {
        const unsigned int bits = __float_as_uint(x);
        const int e = static_cast<int>((bits >> 23) & 0xFF);
        long long m = static_cast<long long>(bits & 0x7FFFFF);
        const bool negative = (bits >> 31) != 0;
        if (e == 0xFF) {
            exact_count_special(slots, m != 0, negative);
            return;
        }
        if (e != 0) m |= 1ll << 23;
        if (m == 0) return;  // +-0.0 before the first window
        if (e == 0 || (bits & 0x7FFFFFFFu) < hi) {  // subnormal or below the window
            if (e != 0 && e - 127 >= a_low()) {  // in the low window: exact, x normal
                low += static_cast<double>(x);
                return;
            }
            exact_add_scaled(slots, negative ? -m : m, (e == 0 ? 1 : e) + 924);  // x = m * 2**(max(e, 1) - 150)
            return;
        }
        // Above the window (or no window yet): move it up so that x lies near its top.
        if (hi != 0u) flush(slots);
        a = (e - 127) - (EXACT_WINDOW - 1 - EXACT_HEADROOM);  // e - 127 = floor(log2|x|), x normal
        if (a < -126) a = -126;
        lo = static_cast<unsigned int>(a + 127) << 23;
        hi = a + EXACT_WINDOW > 127 ? 0x7F800000u : static_cast<unsigned int>(a + EXACT_WINDOW + 127) << 23;
        sum[0] = static_cast<double>(x);  // exact: x is normal
    }
};

template <class T>
__device__ __forceinline__ float as_float(T x) { return static_cast<float>(x); }
template <>
__device__ __forceinline__ float as_float<__half>(__half x) { return __half2float(x); }

// The exact sum of this thread's share of in[0, n) (threads tid = 0 .. nthreads-1), added to
// the block's slots: scalar head, 16-byte vector body, scalar tail, as thread_reduce.
template <class T, int UNROLL, int SUMS>
__device__ __forceinline__ void exact_thread(const T* __restrict__ in, long long n, long long tid, long long nthreads,
                                             unsigned long long* slots) {
    if constexpr (sizeof(T) == 8) {
        for (long long i = tid; i < n; i += nthreads) exact_add(slots, static_cast<double>(in[i]));
    } else {
        constexpr int VEC = 16 / sizeof(T);
        // At least two: the fold comes every EXACT_FOLD elements of the body, and the head and
        // tail add one element each to sums SUMS - 1 and 0 besides; with one sum those two
        // meet in it (EXACT_FOLD + 2 adds before a fold, past the count the window's
        // exactness needs: an emulated case rounded by one unit).
        static_assert(SUMS >= 2 && SUMS <= 4, "two to four window sums");
        ExactWindow w;
        const VectorSplit<T> split(in, n);
        const long long head = split.head, nvec = split.nvec, tail_start = split.tail_start;
        const uint4* __restrict__ body = split.body;
        if (tid < head) w.add(slots, as_float(in[tid]), 0);
        if (tid < n - tail_start) w.add(slots, as_float(in[tail_start + tid]), SUMS - 1);
        w.since_fold = 2;
        long long i = tid;
        for (; i + (UNROLL - 1) * nthreads < nvec; i += UNROLL * nthreads) {
            uint4 raw[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) raw[u] = __ldg(body + i + u * nthreads);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const T* e = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
                for (int j = 0; j < VEC; ++j) w.add(slots, as_float(e[j]), j % SUMS);
            }
            w.since_fold += UNROLL * VEC;
            w.maybe_fold(slots);
        }
        for (; i < nvec; i += nthreads) {
            const uint4 raw = __ldg(body + i);
            const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
            for (int j = 0; j < VEC; ++j) w.add(slots, as_float(e[j]), j % SUMS);
        }
        if (w.hi != 0u) w.flush(slots);
    }
}

// out[0 .. EXACT_SLOTS) = the exact sum of in[0, n) (limbs and special-value counts).
// partials holds gridDim.x * EXACT_SLOTS slots; *counter is 0 on entry and on exit.
template <class T, int BLOCK, int UNROLL = 2, int SUMS = 2>
__global__ void __launch_bounds__(BLOCK)
exact_sum_kernel(const T* __restrict__ in, long long n, unsigned long long* __restrict__ partials,
                 unsigned int* __restrict__ counter, unsigned long long* __restrict__ out) {
    __shared__ unsigned long long slots[EXACT_SLOTS];
    __shared__ bool is_last_block;
    for (int k = threadIdx.x; k < EXACT_SLOTS; k += BLOCK) slots[k] = 0ull;
    __syncthreads();
    exact_thread<T, UNROLL, SUMS>(in, n, static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x,
                 static_cast<long long>(gridDim.x) * BLOCK, slots);
    __syncthreads();
    for (int k = threadIdx.x; k < EXACT_SLOTS; k += BLOCK) partials[blockIdx.x * EXACT_SLOTS + k] = slots[k];
    __threadfence();  // publish the partials before the counter says they are there
    __syncthreads();
    if (threadIdx.x == 0) is_last_block = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!is_last_block) return;
    __threadfence();  // see every other block's partials
    const volatile unsigned long long* vpartials = partials;
    for (int k = threadIdx.x; k < EXACT_SLOTS; k += BLOCK) {
        unsigned long long total = 0ull;
        for (unsigned int b = 0; b < gridDim.x; ++b) total += vpartials[b * EXACT_SLOTS + k];
        out[k] = total;
    }
    if (threadIdx.x == 0) *counter = 0u;
}

// ---------------------------------------------------------------------------------------
// The reproducible sum's one rounding, on the device: exact_round_kernel<Out> reads `parts`
// exact accumulators (EXACT_SLOTS each, as exact_sum_kernel writes them), adds them exactly,
// and writes the sum rounded once to Out (round half to even, subnormals, overflow to
// +-inf), bit for bit what multireduce._exact.round_to_dtype gives on the host. NaN if any
// NaN or both infinities; else an infinity if any; a zero sum is +0.0. One thread.

template <class Out> struct FloatFormat;
template <> struct FloatFormat<double> {
    static constexpr int precision = 53, min_exp = -1022, max_exp = 1024, bias = 1023;
    static __device__ __forceinline__ double from_bits(unsigned long long b) { return __longlong_as_double(static_cast<long long>(b)); }
};
template <> struct FloatFormat<float> {
    static constexpr int precision = 24, min_exp = -126, max_exp = 128, bias = 127;
    static __device__ __forceinline__ float from_bits(unsigned long long b) { return __uint_as_float(static_cast<unsigned int>(b)); }
};
template <> struct FloatFormat<__half> {
    static constexpr int precision = 11, min_exp = -14, max_exp = 16, bias = 15;
    static __device__ __forceinline__ __half from_bits(unsigned long long b) { return __ushort_as_half(static_cast<unsigned short>(b)); }
};

// Bits [start, start + count) of the little-endian digit array (count <= 53, start >= 0).
__device__ __forceinline__ unsigned long long exact_bits(const unsigned int* d, int start, int count) {
    const int k = start >> 5, shift = start & 31;
    unsigned long long w = static_cast<unsigned long long>(d[k]) >> shift;
    if (k + 1 < EXACT_LIMBS) w |= static_cast<unsigned long long>(d[k + 1]) << (32 - shift);
    if (shift > 0 && k + 2 < EXACT_LIMBS && 64 - shift < count) w |= static_cast<unsigned long long>(d[k + 2]) << (64 - shift);
    return count >= 64 ? w : (w & ((1ull << count) - 1));
}

// Whether any of bits [0, end) is set.
__device__ __forceinline__ bool exact_any_below(const unsigned int* d, int end) {
    const int k = end >> 5, shift = end & 31;
    for (int j = 0; j < k; ++j)
        if (d[j] != 0u) return true;
    return shift > 0 && (d[k] & ((1u << shift) - 1u)) != 0u;
}

// The rounded sum of `parts` accumulators as the raw bits of an Out. `acc` and `d` are
// EXACT_LIMBS of scratch (shared memory: one thread runs this).
template <class Out>
__device__ unsigned long long exact_round_bits(const unsigned long long* __restrict__ slots, int parts, long long* acc,
                                               unsigned int* d) {
    using F = FloatFormat<Out>;
    constexpr int P = F::precision;
    const int width = sizeof(Out) * 8;
    const unsigned long long sign_bit = 1ull << (width - 1);
    const unsigned long long exp_all = static_cast<unsigned long long>(2 * F::bias + 1) << (P - 1);  // all-ones exponent
    unsigned long long nan = 0, pos_inf = 0, neg_inf = 0;
    for (int k = 0; k < EXACT_LIMBS; ++k) acc[k] = 0;
    long long top = 0;  // the carry out of the last digit: the sign (and size) beyond it
    for (int p = 0; p < parts; ++p) {
        const unsigned long long* part = slots + static_cast<long long>(p) * EXACT_SLOTS;
        long long carry = 0;
        for (int k = 0; k < EXACT_LIMBS; ++k) {  // carry each part into digits first: no overflow
            const long long t = static_cast<long long>(part[k]) + carry;  // |part[k]| < 2**62
            acc[k] += t & 0xFFFFFFFFll;
            carry = t >> 32;  // arithmetic: floor division
        }
        top += carry;
        nan += part[EXACT_LIMBS];
        pos_inf += part[EXACT_LIMBS + 1];
        neg_inf += part[EXACT_LIMBS + 2];
    }
    if (nan != 0 || (pos_inf != 0 && neg_inf != 0)) return exp_all | (1ull << (P - 2));  // quiet NaN
    if (pos_inf != 0) return exp_all;
    if (neg_inf != 0) return sign_bit | exp_all;
    long long carry = 0;
    for (int k = 0; k < EXACT_LIMBS; ++k) {
        const long long t = acc[k] + carry;
        d[k] = static_cast<unsigned int>(t & 0xFFFFFFFFll);
        carry = t >> 32;
    }
    top += carry;  // 0 or -1: the value fits in the digits, two's complement
    const bool negative = top < 0;
    if (negative) {  // magnitude: two's complement negation of the digits
        unsigned long long c = 1;
        for (int k = 0; k < EXACT_LIMBS; ++k) {
            const unsigned long long t = static_cast<unsigned long long>(~d[k]) + c;
            d[k] = static_cast<unsigned int>(t);
            c = t >> 32;
        }
    }
    int high = EXACT_LIMBS - 1;
    while (high >= 0 && d[high] == 0u) --high;
    if (high < 0) return 0ull;  // +0.0
    const int msb = high * 32 + (31 - __clz(d[high]));  // value = M * 2**-1074, 2**msb <= M
    const int floor_log2 = msb - 1074;
    int e = floor_log2 - (P - 1);
    if (e < F::min_exp - (P - 1)) e = F::min_exp - (P - 1);
    const int s = e + 1074;  // the last significand bit's position in M (>= 0)
    // q: bits [s, msb] of M; none (q = 0) when M < 2**s, below the smallest subnormal, where
    // the guard bit and the sticky bits decide between 0 and the smallest subnormal.
    unsigned long long q = s <= msb ? exact_bits(d, s, msb - s + 1) : 0ull;
    if (s > 0) {
        const bool guard = (d[(s - 1) >> 5] >> ((s - 1) & 31)) & 1u;
        if (guard && ((q & 1ull) || exact_any_below(d, s - 1))) ++q;
    }
    if (q >> P) {  // rounding carried into a new bit: q == 2**P
        q >>= 1;
        ++e;
    }
    const int bits = 64 - __clzll(static_cast<long long>(q));
    const unsigned long long sign = negative ? sign_bit : 0ull;
    if (e + bits - 1 >= F::max_exp) return sign | exp_all;  // beyond the largest finite value
    if (q >> (P - 1)) {  // normal: the hidden bit is set
        const unsigned long long field = static_cast<unsigned long long>(e + (P - 1) + F::bias);
        return sign | (field << (P - 1)) | (q & ((1ull << (P - 1)) - 1));
    }
    return sign | q;  // subnormal: e is the smallest exponent, the field is 0
}

template <class Out>
__global__ void exact_round_kernel(const unsigned long long* __restrict__ slots, int parts, Out* __restrict__ out) {
    __shared__ long long acc[EXACT_LIMBS];
    __shared__ unsigned int digits[EXACT_LIMBS];
    if (blockIdx.x == 0 && threadIdx.x == 0)
        *out = FloatFormat<Out>::from_bits(exact_round_bits<Out>(slots, parts, acc, digits));
}

}  // namespace multireduce
