/******************************************************************************
 * multireduce: one-pass moments (count, NaN count, sum, mean, M2, min, max) and
 * argmin/argmax, as states of multireduce/_stats.py (Moments, ArgState).
 *
 * Uses the helpers of reduce.cuh (load16, shfl_down, Min/Max, convert, sign_bit). NVRTC gets
 * the text of reduce.cuh followed by this file's (multireduce/_kernels.py: read_source);
 * nvcc includes reduce.cuh from here.
 *
 * ALGORITHM (moments_rows_kernel)
 *   `rows` contiguous rows of `length` elements; gridDim.x blocks share a row and gridDim.y
 *   strides over rows, as reduce_rows_kernel (rows == 1 is the full reduction). Each row is
 *   read once: a scalar head up to the first 16-byte boundary, 16-byte vectors (UNROLL in
 *   flight), a scalar tail, as thread_reduce.
 *
 *   1. Per thread, per element: NaN test and count (floats), the shifted sums
 *      s1 += x - c and s2 += (x - c)**2 around a per-thread constant c (the thread's first
 *      element if finite; else, past its leading vectors that hold only NaN (counted, not
 *      read again: first_vector_with_a_value), its first element among the next four
 *      vectors (then its tail element) that is finite and at most 2**960 in magnitude,
 *      else the row's base (see 3), else 0; NaN elements add 0) in float64, lo/hi with NaN ignored and
 *      -0.0 < +0.0, and for 4- and 8-byte integers the exact sum in the int64/uint64 sum
 *      accumulator (wrapping as NumPy's). 1- and 2-byte integers and bool instead take
 *      whole 16-byte vectors at a time: the exact sums of x and x**2 (dp4a for bytes) and
 *      packed 16x2 lo/hi lanes (PackedLanes), from which the thread derives the exact
 *      int64 s1 and s2 once. The count is not accumulated: it follows from the thread's
 *      index range minus its NaN count. ACC independent float64 (s1, s2) pairs per thread.
 *   2. Once per thread: n = count - NaN, mean = (c - base) + s1/n (the mean less the row's
 *      base, see 3), M2 = s2 - s1*(s1/n) (clamped at
 *      0; NaN stays), and for floats total = s1 + n*c (in float64, rounded once to the sum
 *      accumulator; exact in int64/uint64 for small integers). An infinite element makes
 *      s1 infinite, so mean is +-inf (NaN for +inf and -inf) and M2 is NaN, as on the CPU.
 *   2b. RESCAN (float64 input only, the one whose shifted sums can overflow): a thread whose
 *      elements are finite (lo, hi finite) but whose mean is not (s1 overflowed), or whose
 *      M2 is not (s2 overflowed: see ERROR) while hi - lo <= 1.9e154, reads its elements
 *      again, twice, in the order it visited them, and forms its state as the CPU forms a
 *      block's (_stats._block_moments):
 *      total = sum(x), mean = total / n, M2 = sum((x - mean)**2) (inf where that is NaN:
 *      a total that overflowed both ways), NaN elements skipped. Its s1 had lost the sum
 *      and the mean (c = 1e308 and x = -1e308 give s1 = -inf where sum(x) is 0). This runs
 *      after the main loop, only in such threads: other threads pay one branch. Where
 *      hi - lo > 1.9e154 and the mean is finite, the true M2 exceeds the largest float64
 *      (shifted_sums_overflowed) and is set to inf without reading anything again.
 *   3. Threads, warps and blocks merge with Chan et al.'s update (merge_moments, the same
 *      rules as _stats.merge: an empty side leaves the other unchanged; finite means whose
 *      difference overflows give their weighted mean; with an infinite or NaN mean the mean
 *      is the weighted mean and M2 is NaN if an element was infinite, else inf). Warp tree
 *      with shuffles, then warp 0 over the warps' states, then the last block of the row
 *      merges the blocks' states in block order. Every state merged here holds its mean
 *      less the row's base (shift_base: the first of the row's first 32 elements that is
 *      finite and at most 2**960 in magnitude), and the row's state is written with the
 *      base added back (from_base). Chan's update adds d**2 * na * nb / n for the
 *      difference d of two means: means rounded at their own magnitude (float64 near 1.7e9
 *      with a spread of 1: about 1e-7) made d wrong by that much, and the variance of the
 *      thousands of thread states kept only 7 to 10 digits; less the base, they are
 *      rounded at the spread's magnitude (as _stats._merged_blocks on the CPU).
 *      A row without such an element among its first 32 (a run of missing samples first)
 *      has a base per block instead (block_base: the shift of the block's first thread
 *      whose shift is its own element and such a value; else none, and the block's means
 *      are less 0). Each block's partial carries its base (BlockPartial), and the last
 *      block moves the blocks' means to the first block's base before merging them (the
 *      difference of two of the row's elements is exact or rounded at the spread's
 *      magnitude). With base 0 there, nanvar of timestamps behind 32 NaN kept 1e-10.
 *   4. The row's state (MomentRecord) also carries the low part of its mean, mean_lo: what
 *      the base-shifted mean adds to the mean written (from_base). Merges of states across
 *      parts (MPI ranks, Dask chunks: _stats.merge on the host) form d from both parts.
 *
 *   ERROR. With d_i = x_i - c, M2 = s2 - s1**2/n is exact in real arithmetic; in float64
 *   its error is at most about (m + 2) * eps * (s2 + s1**2/n) for a thread's m elements,
 *   i.e. relative to M2 about (m + 2) * eps * (1 + 2 * (mean - c)**2 / var) (eps = 2**-53).
 *   As c is one of the thread's own elements, (mean - c)**2 / var is O(1) unless c is an
 *   outlier of that thread's elements. Chan's merges then add O(log(threads)) * eps, the
 *   means being taken less the row's base (3).
 *   Float64 input with |x - c| above about 1e154 overflows s2 (M2 inf, or NaN from
 *   inf - inf), and |sum(x - c)| above about 1.8e308 overflows s1 (mean and total +-inf or
 *   NaN). Such a thread's state comes from the RESCAN (2b), whose M2 is inf only where the
 *   float64 sum of the thread's elements overflows, or that of their squared deviations
 *   from its own mean; NumPy's var (the mean of the squared deviations from the sum over
 *   n) is then inf too, up to the order of the additions. So an outlier c does not make
 *   a var inf whose NumPy value is finite (c = 1e153 among 999 zeros of one thread
 *   overflows s2, not M2).
 *   Merges and the finalize kernels keep the M2 of finite elements from becoming NaN: var
 *   and std are inf wherever the squares overflow, NaN only with an infinite or NaN element.
 *
 * ALGORITHM (arg_rows_kernel)
 *   Same decomposition. Each element becomes an ordered integer key (IEEE total order for
 *   floats, -0.0 < +0.0, complemented for argmin, NaN the largest key for both, or the
 *   smallest for nanargmax/nanargmin), and each
 *   thread visits its elements in increasing index order, keeping the first strictly
 *   larger key (first occurrence). Threads and blocks merge (key, index) pairs with the
 *   rule of _stats.arg_merge: larger key wins, equal keys go to the smaller index,
 *   index -1 is empty. The value written is in[index] converted to the extreme accumulator.
 *
 *   There are no floating-point atomics: every merge order depends only on the row length,
 *   the row's address modulo 16 and the grid, so results are bitwise reproducible.
 *
 * LAUNCH CONSTRAINTS
 *   - Two blocks per SM (__launch_bounds__(BLOCK, 2): at most 64 registers at BLOCK 512).
 *   - blockDim.x == BLOCK, a multiple of 32, at most 1024, >= 16 (head/tail threads).
 *   - when gridDim.x > 1: partials holds rows * gridDim.x states and counters[row] == 0 on
 *     entry for every row (left 0 on exit); with one block per row neither is read or
 *     written. rows >= 1 and length >= 1.
 *   - in is aligned to sizeof(T).
 *
 * RESULT
 *   out[row] (moments) or out_value[row], out_index[row] (arg), written by thread 0 of the
 *   last block of the row.
 *
 * BARRIERS
 *   Every thread of a block reaches each __syncthreads(); the row loop ends in a barrier
 *   because the shared state slots are written again for the next row.
 ******************************************************************************/
#pragma once

#ifndef MULTIREDUCE_ONE_SOURCE_TEXT  // defined by read_source(), whose text holds reduce.cuh
#include "reduce.cuh"
#endif

namespace multireduce {

// ---------------------------------------------------------------------------------------
// Type helpers.

template <class T> struct IsFloatElement { static constexpr bool value = IsFloating<T>::value; };
template <> struct IsFloatElement<__half> { static constexpr bool value = true; };
template <class T> struct IsHalf { static constexpr bool value = false; };
template <> struct IsHalf<__half> { static constexpr bool value = true; };

// float16 extremes in packed 16-bit lanes: each element's bits as an order key, a signed
// 16-bit integer that orders as the values do with -0.0 below +0.0 (negative values get
// their magnitude bits flipped; the map is its own inverse). NaN lanes are replaced by the
// identity's key before the packed min/max.
// prmt.b32 of w and 0: a selector nibble with its top bit set replicates the sign of the
// byte its low bits select; nibble 4 selects a zero byte.
__device__ __forceinline__ unsigned int prmt_with_zero(unsigned int w, unsigned int selector) {
    unsigned int r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(w), "r"(0u), "r"(selector));
    return r;
}

struct HalfKeys {
    static constexpr unsigned int PINF = 0x7c007c00u;  // +inf in both lanes (its own key)
    static constexpr unsigned int NINF = 0x83ff83ffu;  // the key of -inf (0xfc00) in both lanes
    // Both lanes of w mapped to keys (or keys back to bits): prmt replicates each lane's sign.
    static __device__ __forceinline__ unsigned int keys(unsigned int w) {
        return w ^ (prmt_with_zero(w, 0xBB99u) & 0x7fff7fffu);
    }
    // Lane j of packed keys as the float value it stands for.
    static __device__ __forceinline__ float value(unsigned int packed_keys, int j) {
        const unsigned int bits = keys(packed_keys) >> (16 * j);
        return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xffffu)));
    }
};

// How the moments kernel sees an element: __half as float (exact), others as themselves.
template <class T> struct Seen { using type = T; };
template <> struct Seen<__half> { using type = float; };

template <class T>
__device__ __forceinline__ typename Seen<T>::type seen(T x) { return x; }
template <>
__device__ __forceinline__ float seen<__half>(__half x) { return __half2float(x); }

// An element narrower than a word rebuilt from its bits (the low sizeof(T) bytes of b).
template <class T> struct FromBits {
    static __device__ __forceinline__ T apply(unsigned int b) { return static_cast<T>(b); }
};
template <> struct FromBits<__half> {
    static __device__ __forceinline__ __half apply(unsigned int b) {
        return __ushort_as_half(static_cast<unsigned short>(b));
    }
};

// Whether vector_lane takes T out of the vector with shifts (see there).
template <class T> struct LaneByShifts { static constexpr bool value = sizeof(T) < 4; };
template <> struct LaneByShifts<bool> { static constexpr bool value = false; };

// Element j (a constant once unrolled) of the 16-byte vector v. 1- and 2-byte integers and
// __half are taken out of v's registers with shifts: reading them through a T pointer into v
// made NVRTC 13.5 keep v in local memory in arg_rows_kernel<uint8> (a 96-byte stack frame and
// 184 bytes of spill loads; 13.0 did not), and under 13.0 argmax of 4 GiB of int8 took 22-39%
// and of uint8 14-25% less time this way on the H200 (bench/results/h200_7f067d7 and the next
// run, the older code's host round trip taken off). bool (1.2-1.5x slower with shifts) and
// word-sized and larger elements are read through the pointer as before (with shifts, float64
// took 54 registers instead of 40).
template <class T>
__device__ __forceinline__ T vector_lane(const uint4& v, int j) {
    if constexpr (!LaneByShifts<T>::value) {
        return reinterpret_cast<const T*>(&v)[j];
    } else {
        constexpr int PER_WORD = 4 / static_cast<int>(sizeof(T));
        const int word = j / PER_WORD;
        const unsigned int w = word == 0 ? v.x : (word == 1 ? v.y : (word == 2 ? v.z : v.w));
        return FromBits<T>::apply(w >> (8 * static_cast<int>(sizeof(T)) * (j % PER_WORD)));
    }
}

template <class V>
__device__ __forceinline__ bool is_finite_value(V x) {
    if constexpr (IsFloating<V>::value) {
        return x - x == x - x;  // false for NaN and +-inf
    } else {
        return true;
    }
}

// Elements the thread `tid` of `nthreads` visits in thread_reduce's split of n elements.
__device__ __forceinline__ long long thread_count(long long tid, long long nthreads, long long head, long long nvec,
                                                  long long tail, int vec) {
    long long count = (tid < head ? 1 : 0) + (tid < tail ? 1 : 0);
    if (tid < nvec) count += static_cast<long long>(vec) * ((nvec - 1 - tid) / nthreads + 1);
    return count;
}

// ---------------------------------------------------------------------------------------
// Moments.

// One multireduce._stats.Moments element. S: the sum accumulator; E: the extreme
// accumulator. The host reads an array of these as a NumPy structured dtype with
// align=True (multireduce/_backend/_cupy_stats.py), which follows the same C layout rules.
template <class S, class E>
struct MomentState {
    long long n;
    long long nan;
    S total;
    double mean;
    double m2;
    E lo;
    E hi;
};

// Chan, Golub and LeVeque's pairwise update, with the rules of _stats.merge.
template <class S, class E>
__device__ __forceinline__ MomentState<S, E> merge_moments(const MomentState<S, E>& a, const MomentState<S, E>& b) {
    MomentState<S, E> r;
    r.n = a.n + b.n;
    r.nan = a.nan + b.nan;
    r.total = a.total + b.total;
    r.lo = Min::combine(a.lo, b.lo);  // lo/hi never hold NaN
    r.hi = Max::combine(a.hi, b.hi);
    if (b.n == 0) {
        r.mean = a.mean;
        r.m2 = a.m2;
    } else if (a.n == 0) {
        r.mean = b.mean;
        r.m2 = b.m2;
    } else {
        // One division (a subroutine in float64) per merge keeps the tree within the
        // registers of two blocks per SM; the weights are then within 2 ulp of wb / n.
        const double inv = 1.0 / static_cast<double>(r.n);
        const double wa = static_cast<double>(a.n);
        const double wb = static_cast<double>(b.n);
        if (is_finite_value(a.mean) && is_finite_value(b.mean)) {
            const double delta = b.mean - a.mean;
            r.mean = a.mean + delta * (wb * inv);
            // delta * (delta * w): delta**2 alone overflows where w < 1 (one side a single
            // element) and the term does not ([8e153, -8e153]: 1.28e308).
            r.m2 = a.m2 + b.m2 + delta * (delta * (wa * (wb * inv)));
            // delta overflowed (opposite signs near the float64 limit): the weighted mean,
            // which cannot overflow. M2 is inf already (delta**2).
            if (!is_finite_value(r.mean)) r.mean = a.mean * (wa * inv) + b.mean * (wb * inv);
        } else {
            // inf - inf in the update: the weighted mean (weights first: wa * a.mean of a finite
            // mean near the float64 limit overflowed, and inf - inf gave NaN). No variance where
            // an element was infinite; else a float64 sum of finite elements overflowed: M2 inf.
            r.mean = a.mean * (wa * inv) + b.mean * (wb * inv);
            r.m2 = is_finite_value(r.lo) && is_finite_value(r.hi) ? __longlong_as_double(0x7ff0000000000000LL)
                                                                   : __longlong_as_double(0x7ff8000000000000LL);
        }
    }
    return r;
}

template <class S, class E>
__device__ __forceinline__ MomentState<S, E> shfl_down_state(const MomentState<S, E>& v, int offset) {
    MomentState<S, E> r;
    r.n = shfl_down(v.n, offset);
    r.nan = shfl_down(v.nan, offset);
    r.total = shfl_down(v.total, offset);
    r.mean = shfl_down(v.mean, offset);
    r.m2 = shfl_down(v.m2, offset);
    r.lo = shfl_down(v.lo, offset);
    r.hi = shfl_down(v.hi, offset);
    return r;
}

template <class S, class E>
__device__ __forceinline__ MomentState<S, E> load_state(const MomentState<S, E>* p) {
    const volatile MomentState<S, E>* q = p;  // written by other blocks: read from L2
    MomentState<S, E> r;
    r.n = q->n;
    r.nan = q->nan;
    r.total = q->total;
    r.mean = q->mean;
    r.m2 = q->m2;
    r.lo = q->lo;
    r.hi = q->hi;
    return r;
}

// Thread 0 receives the merge of the block's states in a fixed order; one __syncthreads().
template <int BLOCK, class State>
__device__ __forceinline__ State block_merge(State v, const State& empty, State* warp_states) {
    static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "BLOCK must be a multiple of 32, at most 1024");
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = merge_moments(v, shfl_down_state(v, offset));
    if (lane == 0) warp_states[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = (lane < BLOCK / 32) ? warp_states[lane] : empty;
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) v = merge_moments(v, shfl_down_state(v, offset));
    }
    return v;
}

// Packed per-lane extremes and sums of 1- and 2-byte integers and bool: the moments kernel
// folds its 16-byte vectors a word at a time. The extremes are kept in two 16-bit lanes
// (1-byte elements are widened into them, even and odd bytes apart, with one prmt each) and
// folded with the three-input 16x2 min/max (one instruction per word and direction on
// sm_90); the lanes are combined once per thread. Signed lanes for signed T, unsigned for
// unsigned T and bool.
template <class T> struct PackedLanes {
    static constexpr bool SIGNED = static_cast<T>(-1) < static_cast<T>(0);
    static constexpr bool BYTES = sizeof(T) == 1;

    // The even and the odd bytes of w (1-byte T) in two 16-bit lanes, widened with sign or zero.
    static __device__ __forceinline__ unsigned int even(unsigned int w) {
        return prmt_with_zero(w, SIGNED ? 0xA280u : 0x4240u);
    }
    static __device__ __forceinline__ unsigned int odd(unsigned int w) {
        return prmt_with_zero(w, SIGNED ? 0xB391u : 0x4341u);
    }

    static __device__ __forceinline__ unsigned int lo3(unsigned int a, unsigned int b, unsigned int c) {
        return SIGNED ? __vimin3_s16x2(a, b, c) : __vimin3_u16x2(a, b, c);
    }
    static __device__ __forceinline__ unsigned int hi3(unsigned int a, unsigned int b, unsigned int c) {
        return SIGNED ? __vimax3_s16x2(a, b, c) : __vimax3_u16x2(a, b, c);
    }

    // The packed extremes lo and hi take in the elements of w.
    static __device__ __forceinline__ void extremes(unsigned int w, unsigned int& lo, unsigned int& hi) {
        if constexpr (BYTES) {
            const unsigned int e = even(w), o = odd(w);
            lo = lo3(lo, e, o);
            hi = hi3(hi, e, o);
        } else {
            lo = SIGNED ? __vmins2(lo, w) : __vminu2(lo, w);
            hi = SIGNED ? __vmaxs2(hi, w) : __vmaxu2(hi, w);
        }
    }

    // Both 16-bit lanes set to the element value v (widened as even() and odd() do).
    static __device__ __forceinline__ unsigned int splat(T v) {
        return (static_cast<unsigned int>(static_cast<int>(v)) & 0xffffu) * 0x00010001u;
    }
    // 16-bit lane j of w as an int (sign-extended for signed T).
    static __device__ __forceinline__ int lane(unsigned int w, int j) {
        const unsigned int b = w >> (16 * j);
        return SIGNED ? static_cast<int>(static_cast<short>(b)) : static_cast<int>(b & 0xffffu);
    }

    // Sum and sum of squares of the elements of w, added to s and q. 1-byte elements: two
    // dp4a; 2-byte: each square widened (a uint16 square needs all 32 bits).
    static __device__ __forceinline__ void sums(unsigned int w, int& s, unsigned long long& q) {
        if constexpr (BYTES) {
            if constexpr (SIGNED) {
                s = __dp4a(static_cast<int>(w), 0x01010101, s);
                q += static_cast<unsigned int>(__dp4a(static_cast<int>(w), static_cast<int>(w), 0));
            } else {
                s = static_cast<int>(__dp4a(w, 0x01010101u, static_cast<unsigned int>(s)));
                q += __dp4a(w, w, 0u);
            }
        } else {
            const int a = lane(w, 0), b = lane(w, 1);
            s += a + b;
            const unsigned int ua = static_cast<unsigned int>(a), ub = static_cast<unsigned int>(b);
            q += static_cast<unsigned long long>(ua * ua);
            q += static_cast<unsigned long long>(ub * ub);
        }
    }
};

// One thread's accumulators of the moments kernel. Three kinds of element:
//   floats: NaN count and float64 shifted sums (the sum is derived from them); float16 a
//     word (two elements) at a time, its NaN lanes from one packed compare and its extremes
//     as packed order keys (HalfKeys), the sums element by element in the same order;
//   integers of 1 or 2 bytes and bool: the exact raw sums of x and x**2 (int64 and uint64,
//     modulo 2**64), folded a 16-byte vector at a time with packed-lane instructions
//     (PackedLanes), and once per thread the exact shifted sums s1 = sum(x - c) and
//     s2 = sum((x - c)**2) from them (d*d < 2**32, so s2 holds 2**31 elements per thread;
//     the modular arithmetic is exact because s1 and s2 fit), and the exact sum;
//   integers of 4 and 8 bytes: float64 shifted sums of x converted to float64 (as the CPU's
//     astype(float64)) and the exact sum in the sum accumulator.
template <class T, class S, class E, int ACC>
struct MomentAcc {
    using V = typename Seen<T>::type;
    using Lanes = PackedLanes<T>;
    static constexpr bool FLOAT = IsFloatElement<T>::value;
    static constexpr bool SMALL = !FLOAT && sizeof(T) <= 2;
    static constexpr bool HALF = IsHalf<T>::value;

    V cv;                   // the shift, as an element value (finite)
    double c;               // the shift
    double s1[ACC];         // sum of (x - c) over non-NaN x (floats, wide integers)
    double s2[ACC];         // sum of (x - c)**2
    long long r1;           // sum of x (small integers)
    unsigned long long r2;  // sum of x**2, modulo 2**64 (small integers)
    unsigned int lo_w;      // packed lane extremes (small integers; float16: their keys, HalfKeys)
    unsigned int hi_w;
    unsigned int cv_w;      // the shift's float16 bits in both lanes (float16)
    unsigned int nan;       // NaN elements (floats)
    S total;                // exact sum (wide integers)
    E lo, hi;

    __device__ __forceinline__ void init(T first, bool has_first, E lo_init, E hi_init) {
        const V f = seen(first);
        cv = (has_first && is_finite_value(f)) ? f : V(0);
        c = static_cast<double>(cv);
#pragma unroll
        for (int k = 0; k < ACC; ++k) s1[k] = s2[k] = 0.0;
        r1 = 0;
        r2 = 0ull;
        nan = 0u;
        total = S(0);
        lo = lo_init;
        hi = hi_init;
        if constexpr (SMALL) {
            // The first element is one of the thread's own (a thread without one has no
            // elements, and state() ignores its lanes), so starting at it changes no extreme.
            lo_w = hi_w = Lanes::splat(first);
        } else if constexpr (HALF) {
            lo_w = HalfKeys::PINF;  // the identities: lo_init and hi_init are +inf and -inf
            hi_w = HalfKeys::NINF;
            cv_w = static_cast<unsigned int>(__half_as_ushort(__float2half_rn(cv))) * 0x00010001u;  // exact
        }
    }

    // An element's value (not NaN) into the float64 shifted sums of accumulator k.
    __device__ __forceinline__ void add_value(double x, int k) {
        const double d = x - c;
        s1[k] += d;
        s2[k] = fma(d, d, s2[k]);
    }

    __device__ __forceinline__ void add(T element, int k) {
        const V x = seen(element);
        if constexpr (FLOAT) {
            const bool is_nan = x != x;
            nan += is_nan ? 1u : 0u;
            add_value(static_cast<double>(is_nan ? cv : x), k);  // NaN as the shift: d = 0
            // NaN compares false both ways and is skipped; -0.0 orders below +0.0.
            const E e = static_cast<E>(x);
            lo = (e < lo || (e == lo && sign_bit(e))) ? e : lo;
            hi = (e > hi || (e == hi && !sign_bit(e))) ? e : hi;
        } else if constexpr (SMALL) {
            const int v = static_cast<int>(x);
            const unsigned int u = static_cast<unsigned int>(v);
            r1 += v;
            r2 += static_cast<unsigned long long>(u * u);
            lo = Min::combine(lo, static_cast<E>(x));
            hi = Max::combine(hi, static_cast<E>(x));
        } else {
            total += static_cast<S>(x);  // wraps modulo 2**64, as NumPy's int64/uint64 sum
            add_value(static_cast<double>(x), k);
            lo = Min::combine(lo, static_cast<E>(x));
            hi = Max::combine(hi, static_cast<E>(x));
        }
    }

    // The 16 / sizeof(T) elements of one loaded vector, in order.
    __device__ __forceinline__ void add_vector(const uint4& raw) {
        if constexpr (SMALL) {
            int s = 0;  // at most 16 * 255 or 8 * 65535 in magnitude
            unsigned long long q = 0ull;
            const unsigned int w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                Lanes::sums(w[k], s, q);
                Lanes::extremes(w[k], lo_w, hi_w);
            }
            r1 += s;
            r2 += q;
        } else if constexpr (HALF) {
            // A word (two elements) at a time: the NaN lanes from one packed compare, counted
            // and replaced by the shift in the sums (as add() does) and by the identities in
            // the extremes; the sums take the elements in add()'s order and accumulators.
            const unsigned int w[4] = {raw.x, raw.y, raw.z, raw.w};
            unsigned int nan_bits = 0u;
            unsigned int lo_in[4], hi_in[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const __half2 h = *reinterpret_cast<const __half2*>(&w[k]);
                const unsigned int m = __hneu2_mask(h, h);  // 0xffff in each NaN lane
                nan_bits += __popc(m);
                const unsigned int clean = (w[k] & ~m) | (cv_w & m);
                const __half2 hc = *reinterpret_cast<const __half2*>(&clean);
                add_value(static_cast<double>(__low2float(hc)), (2 * k) % ACC);
                add_value(static_cast<double>(__high2float(hc)), (2 * k + 1) % ACC);
                const unsigned int key = HalfKeys::keys(w[k]);
                lo_in[k] = (key & ~m) | (HalfKeys::PINF & m);
                hi_in[k] = (key & ~m) | (HalfKeys::NINF & m);
            }
            lo_w = __vimin3_s16x2(__vimin3_s16x2(lo_w, lo_in[0], lo_in[1]), lo_in[2], lo_in[3]);
            hi_w = __vimax3_s16x2(__vimax3_s16x2(hi_w, hi_in[0], hi_in[1]), hi_in[2], hi_in[3]);
            nan += nan_bits >> 4;  // 16 bits per NaN lane
        } else {
            constexpr int VEC = 16 / sizeof(T);
            const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
            for (int j = 0; j < VEC; ++j) add(e[j], j % ACC);
        }
    }

    // The thread's state, its mean less `base` (the row's shift_base: ALGORITHM 3).
    __device__ __forceinline__ MomentState<S, E> state(long long count, double base) const {
        double a, b;
        E lo_all = lo, hi_all = hi;
        if constexpr (SMALL) {
            // s1 = r1 - n*c and s2 = r2 - 2*c*r1 + n*c*c, modulo 2**64: exact, as both fit.
            const unsigned long long n = static_cast<unsigned long long>(count);
            const unsigned long long cu = static_cast<unsigned long long>(static_cast<long long>(static_cast<int>(cv)));
            const unsigned long long u1 = static_cast<unsigned long long>(r1);
            const long long i1 = static_cast<long long>(u1 - n * cu);
            const long long i2 = static_cast<long long>(r2 - 2ull * cu * u1 + n * cu * cu);
            a = static_cast<double>(i1);  // exact: |i1| < 2**47
            b = static_cast<double>(i2);
            if (count > 0) {  // else the lanes hold no element (and the state must be empty)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    lo_all = Min::combine(lo_all, static_cast<E>(Lanes::lane(lo_w, j)));
                    hi_all = Max::combine(hi_all, static_cast<E>(Lanes::lane(hi_w, j)));
                }
            }
        } else {
            a = s1[0];
            b = s2[0];
#pragma unroll
            for (int k = 1; k < ACC; ++k) {
                a += s1[k];
                b += s2[k];
            }
            if constexpr (HALF) {  // the lanes hold identities where they saw no element
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const E l = HalfKeys::value(lo_w, j), h = HalfKeys::value(hi_w, j);
                    lo_all = (l < lo_all || (l == lo_all && sign_bit(l))) ? l : lo_all;
                    hi_all = (h > hi_all || (h == hi_all && !sign_bit(h))) ? h : hi_all;
                }
            }
        }
        MomentState<S, E> r;
        r.nan = static_cast<long long>(nan);
        r.n = count - r.nan;
        r.lo = lo_all;
        r.hi = hi_all;
        if (r.n > 0) {
            const double nf = static_cast<double>(r.n);
            const double q = a / nf;
            r.mean = (c - base) + q;  // c - base: exact or rounded at the spread's magnitude
            const double m2 = b - a * q;
            r.m2 = m2 < 0.0 ? 0.0 : m2;  // rounding below zero; NaN stays NaN
        } else {
            r.mean = 0.0;
            r.m2 = 0.0;
        }
        if constexpr (FLOAT) {
            r.total = r.n > 0 ? static_cast<S>(fma(static_cast<double>(r.n), c, a)) : S(0);
        } else if constexpr (SMALL) {
            r.total = static_cast<S>(r1);  // exact; modulo 2**64 for the unsigned accumulator
        } else {
            r.total = total;
        }
        return r;
    }
};

// RESCAN (ALGORITHM 2b): the elements of a float64 row that thread `tid` visits in
// moments_rows_kernel, in its order (head, vectors of two, tail), NaN skipped, folded by
// f.add. Plain 8-byte loads: this runs only where a thread's shifted sums overflowed.
template <class F>
__device__ __forceinline__ void fold_thread_elements(const double* __restrict__ x, long long tid, long long nthreads,
                                                     long long head, long long nvec, long long tail_start,
                                                     long long tail, F& f) {
    if (tid < head) f.add(x[tid]);
    for (long long i = tid; i < nvec; i += nthreads) {
        f.add(x[head + 2 * i]);
        f.add(x[head + 2 * i + 1]);
    }
    if (tid < tail) f.add(x[tail_start + tid]);
}

struct PlainSum {
    double s;
    __device__ __forceinline__ void add(double e) {
        if (e == e) s += e;
    }
};

struct SquaredDeviations {
    double mean;
    double s;
    __device__ __forceinline__ void add(double e) {
        if (e == e) {
            const double d = e - mean;
            s = fma(d, d, s);
        }
    }
};

// Whether a float64 thread state needs the RESCAN: finite elements (n > 0, lo and hi finite)
// with a mean or M2 that is not finite. A finite mean with M2 not finite needs none where
// hi - lo > 1.9e154: M2 = sum((x - mean)**2) >= (hi - mean)**2 + (lo - mean)**2 >=
// (hi - lo)**2 / 2, above the largest float64 there (sqrt(2 * DBL_MAX) = 1.89615e154), so
// M2 is inf, as NumPy's sum of the squares (m2_overflowed). (Without this, one element
// near DBL_MAX among ordinary ones sent its thread through the RESCAN: about 0.35 ms of
// dependent loads at 4 GiB, `h200_61214fd`.)
template <class S, class E>
__device__ __forceinline__ bool shifted_sums_overflowed(const MomentState<S, E>& v) {
    if (!(v.n > 0 && is_finite_value(v.lo) && is_finite_value(v.hi))) return false;
    if (!is_finite_value(v.mean)) return true;
    return !is_finite_value(v.m2) && !(static_cast<double>(v.hi) - static_cast<double>(v.lo) > 1.9e154);
}

// The M2 of a float64 thread state with finite elements and a finite mean whose M2 is not
// finite although it needs no RESCAN (shifted_sums_overflowed): inf.
template <class S, class E>
__device__ __forceinline__ bool m2_overflowed(const MomentState<S, E>& v) {
    return v.n > 0 && !is_finite_value(v.m2) && is_finite_value(v.lo) && is_finite_value(v.hi) &&
           is_finite_value(v.mean);
}

// The thread state v (of float64 elements) formed again by the RESCAN; n, nan, lo, hi kept.
// Not inlined: inlined, it changed the register allocation of the main loop of
// moments_rows_kernel<double> (333 SASS instructions per trip of 8 vectors instead of 317,
// sm_90, nvcc 13.0); as a call, 319, and 60 registers instead of 56 (the bound is 64).
template <class S, class E>
__device__ __noinline__ MomentState<S, E> rescan_state(MomentState<S, E> v, const double* __restrict__ x,
                                                        long long tid, long long nthreads, long long head,
                                                        long long nvec, long long tail_start, long long tail) {
    PlainSum sum{0.0};
    fold_thread_elements(x, tid, nthreads, head, nvec, tail_start, tail, sum);
    SquaredDeviations sq{sum.s / static_cast<double>(v.n), 0.0};
    fold_thread_elements(x, tid, nthreads, head, nvec, tail_start, tail, sq);
    v.total = static_cast<S>(sum.s);
    v.mean = sq.mean;
    v.m2 = sq.s == sq.s ? sq.s : __longlong_as_double(0x7ff0000000000000LL);  // NaN: a NaN mean
    return v;
}

// A value that may be a base of means or a thread's shift: finite and at most 2**960 in
// magnitude (shift_base says why).
__device__ __forceinline__ bool base_candidate(double f) { return is_finite_value(f) && fabs(f) <= 0x1p960; }

// The base of a row's means (ALGORITHM 3): the first of its first 32 elements that is finite
// and at most 2**960 in magnitude (below half an ulp of the largest float64s, 2**970, so that
// no finite c - base or mean + base overflows: it rounds to at most the largest float64), as
// float64; `found` says whether there
// is one (else 0: the blocks then take their own, block_base). As _stats._shift_base, which
// looks through the whole slice. Every thread of the row finds the same; most read one
// element. (A base far from the mean rounds the means less it at the base's scale: harmless
// to M2; an integer mean past _stats.EXACT_TOTAL_BOUND comes from the exact total, by
// state_mean.)
template <class T>
__device__ __forceinline__ double shift_base(const T* __restrict__ x, long long length, bool& found) {
    const long long candidates = length < 32 ? length : 32;
    for (long long i = 0; i < candidates; ++i) {
        const double f = static_cast<double>(seen(x[i]));
        if (base_candidate(f)) {
            found = true;
            return f;
        }
    }
    found = false;
    return 0.0;
}

// The base of a block's means where its row has none among its first 32 elements
// (ALGORITHM 3): the shift of the block's first thread whose shift is one of its own
// elements and a base_candidate (`own`), else NaN (none: the block's means are then taken
// less 0). Every thread of the block calls it: it has barriers. `owner` and `value` are
// shared.
template <int BLOCK>
__device__ __forceinline__ double block_base(double shift, bool own, unsigned int& owner, double& value) {
    if (threadIdx.x == 0) owner = BLOCK;
    __syncthreads();
    if (own) atomicMin(&owner, threadIdx.x);
    __syncthreads();
    if (threadIdx.x == owner) value = shift;
    __syncthreads();
    return owner < BLOCK ? value : __longlong_as_double(0x7ff8000000000000LL);
}

// Whether the 16-byte vector `raw` of elements T holds only NaN.
template <class T>
__device__ __forceinline__ bool all_nan(const uint4& raw) {
    constexpr int VEC = 16 / sizeof(T);
    const T* e = reinterpret_cast<const T*>(&raw);
    bool all = true;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        const double f = static_cast<double>(seen(e[j]));
        all = all && f != f;
    }
    return all;
}

// The first of a thread's vectors (tid, tid + nthreads, ...) that holds an element other than
// NaN; past its last vector (an index >= nvec on the same stride) if none does. The vectors
// before it are a run of missing samples: the thread counts them as NaN and does not read
// them again. UNROLL loads in flight, as the main loop, and one branch per trip: with a
// branch per vector it ran at about 85% of the main loop's speed (4 GiB float32 of NaN:
// 1.40 ms against 1.20 for the old kernel's main loop, h200_0e10c82; one branch: 1.24,
// h200_ace0292). Not inlined, so that the main loop keeps its register allocation (see
// rescan_state). Only NaN-first threads call it.
template <class T, int UNROLL>
__device__ __noinline__ long long first_vector_with_a_value(const uint4* __restrict__ body, long long tid,
                                                            long long nthreads, long long nvec) {
    long long i = tid;
    for (; i + (UNROLL - 1) * nthreads < nvec; i += UNROLL * nthreads) {
        uint4 raw[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) raw[u] = load16<0>(body + i + u * nthreads);
        unsigned int values = 0u;  // bit u: vector u holds a value (one branch per trip)
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) values |= (all_nan<T>(raw[u]) ? 0u : 1u) << u;
        if (values != 0u) return i + static_cast<long long>(__ffs(values) - 1) * nthreads;
    }
    for (; i < nvec; i += nthreads) {
        if (!all_nan<T>(load16<0>(body + i))) return i;
    }
    return i;
}

// Whether an integer total of n elements from lo to hi cannot have wrapped:
// n * max(|lo|, |hi|) < 2**62 in float64 (_stats.total_cannot_wrap, EXACT_TOTAL_BOUND).
template <class E>
__device__ __forceinline__ bool total_cannot_wrap(long long n, E lo, E hi) {
    const double largest = fmax(fabs(static_cast<double>(lo)), fabs(static_cast<double>(hi)));
    return static_cast<double>(n) * largest < 0x1p62;
}

// A row's state as the kernel writes it (multireduce._stats.Moments): MomentState, then the
// low part of its mean. Thread, warp and block states (MomentState) hold means less the
// row's base and need none; only the row's state carries it, for merges across parts.
// (MomentState is a POD, so mean_lo follows its tail padding: the layout of the NumPy
// structured dtype with align=True and the same fields in this order.)
template <class S, class E>
struct MomentRecord : MomentState<S, E> {
    double mean_lo;
};

// A block's state in the row's partials: its means less `base`, the row's base, or without
// one the block's own (block_base; NaN: none, the means are less 0). The size of a
// MomentRecord, as the host allocates.
template <class S, class E>
struct BlockPartial : MomentState<S, E> {
    double base;
};

template <class S, class E>
__device__ __forceinline__ double load_base(const BlockPartial<S, E>* p) {
    const volatile double* q = &p->base;  // written by other blocks: read from L2
    return *q;
}

// In the last block of a row without a base of its own whose block 0 has none: the base of
// the first block that has one (BlockPartial::base not NaN), else 0. All threads of the block
// read the blocks' bases at once, not one thread in turn (a chain of dependent L2 loads, one
// per block; about 0.04 ms of 4 GiB of NaN, h200_fbf2901 against h200_0e10c82). Every thread
// of the block calls it: it has barriers. `owner` is shared. Not inlined: inlined, the
// float16 kernel needed a stack frame.
template <int BLOCK, class S, class E>
__device__ __noinline__ double first_block_base(const BlockPartial<S, E>* row_partials, unsigned int& owner) {
    if (threadIdx.x == 0) owner = gridDim.x;
    __syncthreads();
    for (unsigned int k = threadIdx.x; k < gridDim.x; k += BLOCK) {
        const double b = load_base(row_partials + k);
        if (b == b) {
            atomicMin(&owner, k);
            break;
        }
    }
    __syncthreads();
    return owner < gridDim.x ? load_base(row_partials + owner) : 0.0;
}

// A row's state as the kernel writes it: the mean back from the base, or, with a float64
// total (float32 and float64 input) that is finite, the total over n: NumPy's mean, whose
// error scales with the mean of |x| (base + mean is exact to the spread's scale: with an
// outlier for a base, far coarser); with an integer total that cannot have wrapped, that
// total over n (the mean rounded once). The low part, mean_lo, is the base-shifted mean's
// excess over that mean (TwoSum of the shifted mean and the base; 0 where not finite).
// As _stats._from_base on the CPU.
template <class S, class E>
__device__ __forceinline__ MomentRecord<S, E> from_base(const MomentState<S, E>& v, double base) {
    MomentRecord<S, E> r;
    static_cast<MomentState<S, E>&>(r) = v;
    r.mean_lo = 0.0;
    if (v.n > 0) {
        const double high = v.mean + base;
        const double back = high - v.mean;
        const double rounding = (v.mean - (high - back)) + (base - back);
        r.mean = high;
        if constexpr (IsFloating<S>::value && sizeof(S) == 8) {
            if (is_finite_value(v.total)) r.mean = v.total / static_cast<double>(v.n);
        } else if constexpr (!IsFloating<S>::value) {
            // The exact integer total over n where it cannot have wrapped (state_mean's
            // test): the mean itself, rounded once, where base + mean errs at the scale of
            // the elements' distance from the base (-9 first among zeros: 1.7e-14 relative).
            if (total_cannot_wrap(v.n, v.lo, v.hi)) r.mean = static_cast<double>(v.total) / static_cast<double>(v.n);
        }
        const double low = (high - r.mean) + rounding;
        if (is_finite_value(low)) r.mean_lo = low;
    }
    return r;
}

// The moments of each of `rows` contiguous rows of `length` elements (ALGORITHM above).
template <class T, class S, class E, int BLOCK, int UNROLL>
__global__ void __launch_bounds__(BLOCK, 2)
moments_rows_kernel(const T* __restrict__ in, long long rows, long long length, E lo_init, E hi_init,
                    BlockPartial<S, E>* __restrict__ partials, unsigned int* __restrict__ counters,
                    MomentRecord<S, E>* __restrict__ out) {
    using State = MomentState<S, E>;
    constexpr int VEC = 16 / sizeof(T);
    constexpr int ACC = VEC < 2 ? VEC : 2;
    static_assert(16 % sizeof(T) == 0, "element size must divide 16");
    static_assert(BLOCK >= 16 / sizeof(T), "head and tail are handled by the first threads");
    __shared__ State warp_states[BLOCK / 32];
    __shared__ bool is_last_block;
    __shared__ unsigned int base_owner;  // block_base, and the last block's first block with a base
    __shared__ double base_value;

    const long long tid = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;
    const long long nthreads = static_cast<long long>(gridDim.x) * BLOCK;
    State empty;
    empty.n = empty.nan = 0;
    empty.total = S(0);
    empty.mean = empty.m2 = 0.0;
    empty.lo = lo_init;
    empty.hi = hi_init;

    for (long long row = blockIdx.y; row < rows; row += gridDim.y) {
        const T* __restrict__ x = in + row * length;
        const VectorSplit<T> split(x, length);
        const long long head = split.head, nvec = split.nvec, tail_start = split.tail_start;
        const long long tail = length - tail_start;
        const uint4* __restrict__ body = split.body;

        // The shift: the thread's first element (head, else first vector, else tail).
        long long first = -1;
        if (tid < head) {
            first = tid;
        } else if (tid < nvec) {
            first = head + tid * VEC;
        } else if (tid < tail) {
            first = tail_start + tid;
        }
        T shift = first >= 0 ? x[first] : T(0);
        // Whether the shift is one of the thread's own elements and a base_candidate.
        bool own = first >= 0 && base_candidate(static_cast<double>(seen(shift)));
        long long i = tid;  // the thread's first vector that the main loop reads
        if constexpr (IsFloatElement<T>::value) {
            // A NaN or infinite first element: the thread skips its leading vectors that
            // hold only NaN (first_vector_with_a_value), then takes its first element among
            // the next four vectors that is finite and at most 2**960 in magnitude
            // (shift_base's test: x - c of finite elements cannot overflow, and [inf, 1e308,
            // -1e308] keeps NumPy's inf mean), else the row's base (an element of the row, so
            // exact in T; 0 without one). With c = 0, a thread's s2 of timestamps near 1.7e9
            // was n * 2.9e18 and its M2 = s2 - s1**2 / n lost every digit (GPU nanvar of such
            // data with 1% NaN: 200% off; with a run of NaN longer than a thread's first four
            // vectors, as a series that starts with missing samples, likewise); the row's
            // base alone would be far from a thread's own elements where it is an outlier.
            // Only such threads run this.
            if (first >= 0 && !is_finite_value(static_cast<double>(seen(shift)))) {
                i = first_vector_with_a_value<T, UNROLL>(body, tid, nthreads, nvec);
                bool found = false;
                for (long long v = i; v < nvec && v < i + 4 * nthreads && !found; v += nthreads) {
                    for (int j = 0; j < VEC && !found; ++j) {
                        const T e = x[head + v * VEC + j];
                        if (base_candidate(static_cast<double>(seen(e)))) {
                            shift = e;
                            found = true;
                        }
                    }
                }
                // Its vectors hold no such value: its tail element. (Shifted by 0, the one
                // element of a thread whose vectors held only NaN had an M2 of up to half
                // an ulp of x*x, 256 for timestamps: b - a * q contracts to an FMA, which
                // leaves x*x's rounding. One such thread made a variance of 100 timestamps
                // behind a run of NaN 3x too large.)
                if (!found && tid < tail) {
                    const T e = x[tail_start + tid];
                    if (base_candidate(static_cast<double>(seen(e)))) {
                        shift = e;
                        found = true;
                    }
                }
                own = found;
                if (!found) {
                    bool unused;
                    shift = convert<T>(shift_base(x, length, unused));
                }
            }
        }
        MomentAcc<T, S, E, ACC> acc;
        acc.init(shift, first >= 0, lo_init, hi_init);
        acc.nan += static_cast<unsigned int>((i - tid) / nthreads) * VEC;  // the skipped vectors, all NaN

        if (tid < head) acc.add(x[tid], 0);
        for (; i + (UNROLL - 1) * nthreads < nvec; i += UNROLL * nthreads) {
            uint4 raw[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) raw[u] = load16<0>(body + i + u * nthreads);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) acc.add_vector(raw[u]);
        }
        for (; i < nvec; i += nthreads) {
            acc.add_vector(load16<0>(body + i));
        }
        if (tid < tail) acc.add(x[tail_start + tid], ACC - 1);

        // Read after the main loop, so that it holds no registers there. A row without a
        // base among its first 32 elements (uniform over the row, so every thread of the
        // block takes this branch or none) takes each block's own.
        bool row_has_base;
        double base = shift_base(x, length, row_has_base);
        double partial_base = base;  // the base the block's partial records: NaN for none
        if constexpr (IsFloatElement<T>::value) {
            if (!row_has_base) {
                partial_base = block_base<BLOCK>(static_cast<double>(seen(shift)), own, base_owner, base_value);
                base = partial_base == partial_base ? partial_base : 0.0;
            }
        }
        State v = acc.state(thread_count(tid, nthreads, head, nvec, tail, VEC), base);
        if constexpr (IsFloating<T>::value && sizeof(T) == 8) {
            if (shifted_sums_overflowed(v)) {
                v = rescan_state(v, x, tid, nthreads, head, nvec, tail_start, tail);
                v.mean = v.mean - base;
            } else if (m2_overflowed(v)) {
                v.m2 = __longlong_as_double(0x7ff0000000000000LL);  // inf - inf gave NaN
            }
        }
        v = block_merge<BLOCK>(v, empty, warp_states);

        if (gridDim.x == 1) {
            if (threadIdx.x == 0) out[row] = from_base(v, base);
        } else {
            BlockPartial<S, E>* row_partials = partials + row * gridDim.x;
            if (threadIdx.x == 0) {
                static_cast<State&>(row_partials[blockIdx.x]) = v;
                row_partials[blockIdx.x].base = partial_base;
                __threadfence();  // publish the partial before the counter says it is there
                const unsigned int done = atomicAdd(counters + row, 1u);
                is_last_block = (done == gridDim.x - 1);
            }
            __syncthreads();
            if (is_last_block) {
                __threadfence();  // see every other block's partial
                // Each thread merges blocks k, k + BLOCK, ... in order; then the block tree.
                // In a row without a base of its own each block has its own (NaN for none:
                // its means are less 0): the blocks' means move to the first block's that
                // has one (the difference of two of the row's elements is exact or rounded
                // at the spread's magnitude). Block 0's, read first, is that base in every
                // other row.
                double row_base = load_base(row_partials);
                if (row_base != row_base) row_base = first_block_base<BLOCK>(row_partials, base_owner);  // uniform
                State w = empty;
                for (unsigned int k = threadIdx.x; k < gridDim.x; k += BLOCK) {
                    State b = load_state(row_partials + k);
                    double b_base = load_base(row_partials + k);
                    if (b_base != b_base) b_base = 0.0;
                    if (b_base != row_base && b.n > 0) b.mean += b_base - row_base;
                    w = merge_moments(w, b);
                }
                __syncthreads();  // warp_states is reused
                w = block_merge<BLOCK>(w, empty, warp_states);
                if (threadIdx.x == 0) {
                    out[row] = from_base(w, row_base);
                    counters[row] = 0u;
                }
            }
        }
        __syncthreads();  // warp_states and is_last_block are written again for the next row
    }
}

// ---------------------------------------------------------------------------------------
// argmin / argmax.

// Ordered keys: a larger key is a better candidate. KeyOf<T>::type is int for elements of
// up to 4 bytes, long long for 8-byte ones.
template <class T> struct KeyOf { using type = int; };
template <> struct KeyOf<long long> { using type = long long; };
template <> struct KeyOf<unsigned long long> { using type = long long; };
template <> struct KeyOf<double> { using type = long long; };

// NAN_WINS: NaN is the largest key (argmax, argmin: the first NaN wins), else the smallest
// (nanargmax, nanargmin: a NaN is found only where the row holds nothing else).
template <bool LARGEST, bool NAN_WINS, class T>
__device__ __forceinline__ typename KeyOf<T>::type arg_key(T x) {
    using K = typename KeyOf<T>::type;
    K k;
    if constexpr (IsFloatElement<T>::value) {
        constexpr K TOP = sizeof(K) == 8 ? static_cast<K>(0x7fffffffffffffffLL) : static_cast<K>(0x7fffffff);
        K bits;
        bool is_nan;
        if constexpr (sizeof(K) == 8) {
            bits = __double_as_longlong(x);
            is_nan = x != x;
        } else {
            const float f = seen(x);
            bits = __float_as_int(f);
            is_nan = f != f;
        }
        // Sign-magnitude to two's complement: integer order is the IEEE total order.
        k = bits ^ ((bits >> (8 * sizeof(K) - 1)) & TOP);
        if (!LARGEST) k = ~k;
        k = is_nan ? (NAN_WINS ? TOP : ~TOP) : k;  // ~TOP: below -inf's key (and +inf's complement)
    } else {
        if constexpr (sizeof(T) == 8 && static_cast<T>(-1) > T(0)) {
            k = static_cast<K>(x ^ 0x8000000000000000ull);
        } else if constexpr (sizeof(T) == 4 && static_cast<T>(-1) > T(0)) {
            k = static_cast<K>(x ^ 0x80000000u);
        } else {
            k = static_cast<K>(x);
        }
        if (!LARGEST) k = ~k;
    }
    return k;
}

struct ArgPartial {
    long long key;
    long long index;  // -1: no element
};

__device__ __forceinline__ ArgPartial merge_arg(const ArgPartial& a, const ArgPartial& b) {
    const bool b_wins = a.index < 0 || (b.index >= 0 && (b.key > a.key || (b.key == a.key && b.index < a.index)));
    return b_wins ? b : a;
}

// Lane 0 receives the merge of its warp's pairs (shuffle tree).
__device__ __forceinline__ ArgPartial warp_merge_arg(ArgPartial v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        ArgPartial o;
        o.key = shfl_down(v.key, offset);
        o.index = shfl_down(v.index, offset);
        v = merge_arg(v, o);
    }
    return v;
}

template <int BLOCK>
__device__ __forceinline__ ArgPartial block_merge_arg(ArgPartial v, ArgPartial* warp_values) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_merge_arg(v);
    if (lane == 0) warp_values[warp] = v;
    __syncthreads();
    if (warp == 0) {
        if (lane < BLOCK / 32) {
            v = warp_values[lane];
        } else {
            v.key = 0;
            v.index = -1;
        }
        v = warp_merge_arg(v);
    }
    return v;
}

// argmax (LARGEST) or argmin of each of `rows` contiguous rows of `length` elements:
// out_value[row] (in the extreme accumulator E) and out_index[row] (within the row).
// NAN_WINS false: nanargmax/nanargmin (out_value NaN where the row is all NaN).
template <class T, class E, int BLOCK, int UNROLL, bool LARGEST, bool NAN_WINS>
__global__ void __launch_bounds__(BLOCK, 2)
arg_rows_kernel(const T* __restrict__ in, long long rows, long long length, ArgPartial* __restrict__ partials,
                unsigned int* __restrict__ counters, E* __restrict__ out_value, long long* __restrict__ out_index) {
    using K = typename KeyOf<T>::type;
    constexpr int VEC = 16 / sizeof(T);
    static_assert(16 % sizeof(T) == 0, "element size must divide 16");
    static_assert(BLOCK >= 16 / sizeof(T), "head and tail are handled by the first threads");
    __shared__ ArgPartial warp_values[BLOCK / 32];
    __shared__ bool is_last_block;

    const long long tid = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;
    const long long nthreads = static_cast<long long>(gridDim.x) * BLOCK;

    for (long long row = blockIdx.y; row < rows; row += gridDim.y) {
        const T* __restrict__ x = in + row * length;
        const VectorSplit<T> split(x, length);
        const long long head = split.head, nvec = split.nvec, tail_start = split.tail_start;
        const uint4* __restrict__ body = split.body;

        // Visited in increasing index order (head < body < tail), so a strictly larger key
        // is needed to replace the best: the first occurrence stays.
        K best = 0;
        long long best_index = -1;
        if (tid < head) {
            best = arg_key<LARGEST, NAN_WINS>(x[tid]);
            best_index = tid;
        }
        long long i = tid;
        // The best-of-one-vector step below is written out twice (unrolled loop, remainder):
        // as a shared __forceinline__ helper it compiled to 56 registers instead of 55.
        for (; i + (UNROLL - 1) * nthreads < nvec; i += UNROLL * nthreads) {
            uint4 raw[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) raw[u] = load16<0>(body + i + u * nthreads);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                K vk = arg_key<LARGEST, NAN_WINS>(vector_lane<T>(raw[u], 0));
                int vj = 0;
#pragma unroll
                for (int j = 1; j < VEC; ++j) {
                    const K k = arg_key<LARGEST, NAN_WINS>(vector_lane<T>(raw[u], j));
                    if (k > vk) {
                        vk = k;
                        vj = j;
                    }
                }
                if (best_index < 0 || vk > best) {
                    best = vk;
                    best_index = head + (i + u * nthreads) * VEC + vj;
                }
            }
        }
        for (; i < nvec; i += nthreads) {
            const uint4 raw = load16<0>(body + i);
            K vk = arg_key<LARGEST, NAN_WINS>(vector_lane<T>(raw, 0));
            int vj = 0;
#pragma unroll
            for (int j = 1; j < VEC; ++j) {
                const K k = arg_key<LARGEST, NAN_WINS>(vector_lane<T>(raw, j));
                if (k > vk) {
                    vk = k;
                    vj = j;
                }
            }
            if (best_index < 0 || vk > best) {
                best = vk;
                best_index = head + i * VEC + vj;
            }
        }
        if (tid < length - tail_start) {
            const K k = arg_key<LARGEST, NAN_WINS>(x[tail_start + tid]);
            if (best_index < 0 || k > best) {
                best = k;
                best_index = tail_start + tid;
            }
        }

        ArgPartial v;
        v.key = static_cast<long long>(best);
        v.index = best_index;
        v = block_merge_arg<BLOCK>(v, warp_values);

        bool write = gridDim.x == 1 && threadIdx.x == 0;
        if (gridDim.x > 1) {
            ArgPartial* row_partials = partials + row * gridDim.x;
            if (threadIdx.x == 0) {
                row_partials[blockIdx.x] = v;
                __threadfence();  // publish the partial before the counter says it is there
                const unsigned int done = atomicAdd(counters + row, 1u);
                is_last_block = (done == gridDim.x - 1);
            }
            __syncthreads();
            if (is_last_block) {
                __threadfence();  // see every other block's partial
                const volatile ArgPartial* vpartials = row_partials;
                ArgPartial w;
                w.key = 0;
                w.index = -1;
                for (unsigned int k = threadIdx.x; k < gridDim.x; k += BLOCK) {
                    ArgPartial p;
                    p.key = vpartials[k].key;
                    p.index = vpartials[k].index;
                    w = merge_arg(w, p);
                }
                __syncthreads();  // warp_values is reused
                v = block_merge_arg<BLOCK>(w, warp_values);
                write = threadIdx.x == 0;
                if (write) counters[row] = 0u;
            }
        }
        if (write) {
            out_index[row] = v.index;
            out_value[row] = convert<E>(x[v.index]);  // length >= 1: some index was found
        }
        __syncthreads();  // warp_values and is_last_block are written again for the next row
    }
}

// ---------------------------------------------------------------------------------------
// Stats, finalized on the device: multireduce._stats.finalize_stats for `rows` states, so
// that multireduce.stats on a CuPy array neither waits for the moments kernel nor touches
// the host. T: the input element; SumOut and MeanOut: the result dtypes of sum and mean.
// The same rules as the host: NaN (any NaN element) propagates into sum, min, max, mean and
// var; a float sum of zeros is +0.0; mean needs n > 0, var needs n - correction > 0 (else
// NaN); the mean is state_mean's and the M2 state_m2's. Each result is rounded once from the
// float64 value, as NumPy's astype.

// The mean a state with n > 0 stands for: multireduce._stats.state_mean, with the same
// float64 operations. An integer total is exact unless it wrapped, which it cannot where
// n * max(|lo|, |hi|) < 2**62; there the mean is double(total) / double(n), so that it does
// not depend on how the elements were split into merged states. A float state whose mean or
// total is +-inf or NaN though lo and hi are finite (no infinite element) had a float64 sum
// overflow: double(total) / double(n), NumPy's mean (the total decides even where the merged
// parts' means are finite, so the mean does not depend on the split). Else the state's mean.
template <class S, class E>
__device__ __forceinline__ double state_mean(const MomentState<S, E>& st) {
    if constexpr (!IsFloating<S>::value) {
        const double n = static_cast<double>(st.n);
        if (total_cannot_wrap(st.n, st.lo, st.hi)) return static_cast<double>(st.total) / n;
        const double largest = fmax(fabs(static_cast<double>(st.lo)), fabs(static_cast<double>(st.hi)));
        // _stats._unwrapped_mean: the exact sum is the one near round(n * mean) with the
        // total's residue modulo 2**64, where n * mean is within n * largest * 2**-40 of it.
        const double approx = rint(n * st.mean);
        unsigned long long bits;
        if (fabs(approx) < 0x1p63) {
            bits = static_cast<unsigned long long>(static_cast<long long>(approx));
        } else {
            double residue = fmod(approx, 0x1p64);  // exact, and exact after the shift below
            if (residue < 0.0) residue += 0x1p64;
            bits = static_cast<unsigned long long>(residue);
        }
        const long long correction = static_cast<long long>(static_cast<unsigned long long>(st.total) - bits);
        const double c = static_cast<double>(correction);
        if (n * (largest * 0x1p-40 + 1.0) < 0x1p61 && fabs(c) < 0x1p62 && is_finite_value(approx))
            return (approx + c) / n;
    } else {
        const bool finite = is_finite_value(st.mean) && is_finite_value(static_cast<double>(st.total));
        if (!finite && is_finite_value(st.lo) && is_finite_value(st.hi))
            return static_cast<double>(st.total) / static_cast<double>(st.n);
    }
    return st.mean;
}

// The M2 a state stands for: multireduce._stats._overflowed_m2. A NaN M2 though lo and hi
// are finite (no infinite element) comes from float64 squares or sums that overflowed
// (inf - inf), and a float total that is not finite makes the mean inf (state_mean): inf
// either way, so that var and std are inf, as NumPy's. Else the state's M2.
template <class S, class E>
__device__ __forceinline__ double state_m2(const MomentState<S, E>& st) {
    bool overflowed = st.m2 != st.m2;
    if constexpr (IsFloating<S>::value) overflowed = overflowed || !is_finite_value(static_cast<double>(st.total));
    return overflowed && is_finite_value(st.lo) && is_finite_value(st.hi) ? __longlong_as_double(0x7ff0000000000000LL)
                                                                          : st.m2;
}

template <class T, class S, class E, class SumOut, class MeanOut>
__global__ void stats_finalize_kernel(const MomentRecord<S, E>* __restrict__ states, long long rows, double correction,
                                      long long* __restrict__ count, long long* __restrict__ nan_count,
                                      SumOut* __restrict__ sum, T* __restrict__ lo, T* __restrict__ hi,
                                      MeanOut* __restrict__ mean, MeanOut* __restrict__ var,
                                      MeanOut* __restrict__ std) {
    const double qnan = __longlong_as_double(0x7ff8000000000000LL);
    for (long long r = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
         r += static_cast<long long>(gridDim.x) * blockDim.x) {
        const MomentState<S, E> st = states[r];
        const bool has_nan = st.nan > 0;
        count[r] = st.n + st.nan;
        nan_count[r] = st.nan;
        if constexpr (IsFloating<S>::value) {
            const S total = has_nan ? static_cast<S>(qnan) : (st.total == S(0) ? S(0) : st.total);  // +0.0
            sum[r] = Convert<SumOut, S>::apply(total);
        } else {
            sum[r] = static_cast<SumOut>(st.total);
        }
        if constexpr (IsFloatElement<T>::value) {
            lo[r] = Convert<T, E>::apply(has_nan ? static_cast<E>(qnan) : st.lo);
            hi[r] = Convert<T, E>::apply(has_nan ? static_cast<E>(qnan) : st.hi);
        } else {
            lo[r] = static_cast<T>(st.lo);
            hi[r] = static_cast<T>(st.hi);
        }
        const double dof = static_cast<double>(st.n) - correction;
        mean[r] = Convert<MeanOut, double>::apply(st.n > 0 && !has_nan ? state_mean(st) : qnan);
        const double v = dof > 0.0 && !has_nan ? state_m2(st) / dof : qnan;
        var[r] = Convert<MeanOut, double>::apply(v);
        std[r] = Convert<MeanOut, double>::apply(sqrt(v));  // std's value: the float64 root, rounded once
    }
}

// ---------------------------------------------------------------------------------------
// var (OP 1) or std (OP 2) of `rows` moments states, finalized on the device so that
// multireduce.var/std of a CuPy array wait for nothing: the values of
// multireduce._stats.finalize_moments (the host decides only its warnings, from the shape).
// NaN where a NaN was read or where n - correction <= 0; else state_m2 / dof (inf where
// the squares of finite elements overflowed). The float64 value (std: its correctly rounded
// square root) is rounded once to Out. (The mean is mean_from_sum_kernel's.)

template <class S, class E, class Out, int OP>
__global__ void moments_finalize_kernel(const MomentRecord<S, E>* __restrict__ states, long long rows,
                                        double correction, Out* __restrict__ out) {
    static_assert(OP == 1 || OP == 2, "OP: 1 var, 2 std (the mean is mean_from_sum_kernel's)");
    const double qnan = __longlong_as_double(0x7ff8000000000000LL);
    for (long long r = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
         r += static_cast<long long>(gridDim.x) * blockDim.x) {
        const MomentState<S, E> st = states[r];
        const bool has_nan = st.nan > 0;
        const double dof = static_cast<double>(st.n) - correction;
        double value = dof > 0.0 && !has_nan ? state_m2(st) / dof : qnan;
        if constexpr (OP == 2) value = sqrt(value);
        out[r] = Convert<Out, double>::apply(value);
    }
}

// The mean on the GPU: the fold kernel's float64 sums (each element converted to float64,
// NaN and infinities propagating as in a sum), each divided by the count n >= 1 of the
// elements it reduced and rounded once to Out. The moments kernel also forms M2, which the
// mean does not need and which costs it bandwidth (0.95x cupy.mean for float32, 0.4-0.5x the
// sum for 1-byte elements, on the H200).
template <class Out>
__global__ void mean_from_sum_kernel(const double* __restrict__ sums, long long rows, double n, Out* __restrict__ out) {
    for (long long r = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
         r += static_cast<long long>(gridDim.x) * blockDim.x) {
        out[r] = Convert<Out, double>::apply(sums[r] / n);
    }
}

}  // namespace multireduce
