/*
 * Loads, stores and conversions of the CUDA kernels: x-dtype chunks as raw
 * 16-byte units, their fp32 values, a row's pointers, the segment of a row
 * and the parameters.
 *
 * Column mapping (every kernel). x is read in chunks of VEC = 16 /
 * sizeof(x) elements. Chunk j of thread t of CTA rank k (of CL CTAs on one
 * row) covers columns [c * VEC, c * VEC + VEC) with
 * c = (k * NCH + j) * TPR + t: CTA k of a cluster owns one contiguous slice
 * of NCH * TPR chunks (which a single bulk copy can bring into its shared
 * memory, lnorm_cuda_bulk.cuh). The mapping depends on the tier only, never
 * on pointer alignment or on the batch: an aligned full chunk is one
 * 16-byte access, any other chunk is read element by element with the same
 * mask, so a row gives the same bits whatever its alignment, stride or
 * batch companions.
 */
#ifndef LNORM_CUDA_IO_CUH
#define LNORM_CUDA_IO_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "lnorm/types.h"
#include "lnorm_cuda_impl.h"
#include "rescale.h"

namespace lnorm_cuda {

/* Wait for the kernels this one depends on and for their writes, when it
 * was launched as a programmatic dependent (launch_drain, sm_90 and up); at
 * once otherwise. */
__device__ __forceinline__ void grid_dep_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* fp32 <-> element conversions (round to nearest even). */
template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/* bf16 -> fp32 is exact: the 16 bits become the high half of the float, so
 * a 16-byte chunk of bf16 unpacks by bit operations, one instruction an
 * element (through __nv_bfloat16, an element in a high half took two). */
__device__ __forceinline__ void bf16x8_to_f(const uint4 &u, float (&f)[8])
{
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

/* N elements of T as one aligned aggregate (one vector access). */
template <typename T, int N> struct alignas(sizeof(T) * N) Pack {
    T e[N];
};

/* Elements per 16-byte access for T, capped at N. */
template <typename T, int N> struct Sub {
    static constexpr int value = (int)(N * sizeof(T) > 16 ? 16 / sizeof(T) : N);
};

/* Whether p is aligned for the vector accesses of an N-element chunk of T. */
template <typename T, int N> __device__ __forceinline__ bool chunk_aligned(const void *p)
{
    return ((uintptr_t)p % (Sub<T, N>::value * sizeof(T))) == 0;
}

/* Load the N-element chunk starting at column c0 of row p as fp32; columns
 * >= H read as 0. al: p is chunk_aligned. BITS: as unpack (below). */
template <typename T, int N, bool BITS = false>
__device__ __forceinline__ void load_chunk(const T *p, int c0, int H, bool al, float (&v)[N])
{
    constexpr int S = Sub<T, N>::value;
    if (al && c0 + N <= H) {
#pragma unroll
        for (int s = 0; s < N; s += S) {
            if constexpr (BITS && std::is_same<T, __nv_bfloat16>::value && S == 8) {
                float e[8];
                bf16x8_to_f(*reinterpret_cast<const uint4 *>(p + c0 + s), e);
#pragma unroll
                for (int k = 0; k < 8; k++)
                    v[s + k] = e[k];
            } else {
                const Pack<T, S> pk = *reinterpret_cast<const Pack<T, S> *>(p + c0 + s);
#pragma unroll
                for (int k = 0; k < S; k++)
                    v[s + k] = to_f<T>(pk.e[k]);
            }
        }
    } else {
#pragma unroll
        for (int k = 0; k < N; k++)
            v[k] = (c0 + k < H) ? to_f<T>(p[c0 + k]) : 0.0f;
    }
}

/* Store the N-element chunk at column c0 of row p (columns >= H untouched). */
template <typename T, int N>
__device__ __forceinline__ void store_chunk(T *p, int c0, int H, bool al, const float (&v)[N])
{
    constexpr int S = Sub<T, N>::value;
    if (al && c0 + N <= H) {
#pragma unroll
        for (int s = 0; s < N; s += S) {
            Pack<T, S> pk;
#pragma unroll
            for (int k = 0; k < S; k++)
                pk.e[k] = from_f<T>(v[s + k]);
            *reinterpret_cast<Pack<T, S> *>(p + c0 + s) = pk;
        }
    } else {
#pragma unroll
        for (int k = 0; k < N; k++)
            if (c0 + k < H)
                p[c0 + k] = from_f<T>(v[k]);
    }
}

/* The segment that global row `row` belongs to (binary search on
 * row_begin), or the inline one. */
__device__ __forceinline__ const lnorm__kseg *find_seg(const lnorm__kparams &p, int64_t row)
{
    if (p.table == nullptr)
        return &p.one;
    int lo = 0, hi = p.nsegs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (p.table[mid].row_begin <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &p.table[lo];
}

/* rstd from the variance (or mean square), with eps inside or outside
 * (the formula every backend shares, rescale.h). */
__device__ __forceinline__ float make_rstd(float var, float eps, int eps_mode)
{
    return lnorm__rstd(var, eps, eps_mode);
}

/* The 16 bytes of one x chunk, as raw bits or as VEC elements. */
template <typename TX> union Raw {
    uint4 u;
    TX e[16 / sizeof(TX)];
};

/* Raw chunk -> VEC floats. BITS: bf16 by bit operations (bf16x8_to_f);
 * the general kernels (k_reg, the streaming tier) convert element by
 * element, with which their 1024-thread forms compile with fewer spills
 * (96 against 616 bytes). Same values either way. */
template <typename TX, bool BITS = true>
__device__ __forceinline__ void unpack(const uint4 &u, float (&f)[16 / sizeof(TX)])
{
    if constexpr (BITS && std::is_same<TX, __nv_bfloat16>::value) {
        bf16x8_to_f(u, f);
    } else {
        Raw<TX> r;
        r.u = u;
#pragma unroll
        for (int k = 0; k < (int)(16 / sizeof(TX)); k++)
            f[k] = to_f<TX>(r.e[k]);
    }
}

/* Two floats rounded to a 16-bit TX, a in the low half (the element at
 * the lower address), b in the high half: one conversion instruction (each
 * element rounded as by __float2bfloat16_rn / __float2half_rn). */
__device__ __forceinline__ uint32_t pack_pair(float a, float b, __nv_bfloat16)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&h);
}
__device__ __forceinline__ uint32_t pack_pair(float a, float b, __half)
{
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&h);
}
/* VEC floats -> raw chunk (each rounded to TX); 16-bit chunks a pair at a
 * time (4 instructions a chunk against 12 element by element). */
template <typename TX> __device__ __forceinline__ uint4 pack(const float (&f)[16 / sizeof(TX)])
{
    if constexpr (sizeof(TX) == 2) {
        return make_uint4(pack_pair(f[0], f[1], TX()), pack_pair(f[2], f[3], TX()), pack_pair(f[4], f[5], TX()),
                          pack_pair(f[6], f[7], TX()));
    } else {
        Raw<TX> r;
#pragma unroll
        for (int k = 0; k < (int)(16 / sizeof(TX)); k++)
            r.e[k] = from_f<TX>(f[k]);
        return r.u;
    }
}

/* Loads of the re-read form (RR, k_fast): x is read from global memory
 * in every pass; the statistics passes ask L1 to keep the lines
 * (L1::evict_last), the output pass to drop them first (L1::evict_first),
 * as they are not read again. Coherent loads (not .nc): y may be x. */
template <bool LAST> __device__ __forceinline__ uint4 load_rr16(const void *q)
{
    uint4 r;
    if constexpr (LAST)
        asm volatile("ld.global.L1::evict_first.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(q));
    else
        asm volatile("ld.global.L1::evict_last.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(q));
    return r;
}

/* Store the 16 bytes v at the 16-byte aligned global address p if `on`:
 * one predicated store instruction, no branch around it. */
__device__ __forceinline__ void store16_if(void *p, uint4 v, bool on)
{
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %5, 0;\n\t"
                 "@q st.global.v4.u32 [%0], {%1, %2, %3, %4};\n\t}" ::"l"(p),
                 "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"((unsigned)on)
                 : "memory");
}

/* Load the x-dtype chunk at column c0 of row p as raw bits (columns >= H
 * read as +0). al: p is 16-byte aligned. (Plain loads: the evict-first
 * hint cost the one-CTA kernels 3-11% on the H200.) */
template <typename TX> __device__ __forceinline__ uint4 load_raw(const TX *p, int c0, int H, bool al)
{
    constexpr int VEC = (int)(16 / sizeof(TX));
    if (al && c0 + VEC <= H)
        return *reinterpret_cast<const uint4 *>(p + c0);
    Raw<TX> r;
    r.u = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int k = 0; k < VEC; k++)
        if (c0 + k < H)
            r.e[k] = p[c0 + k];
    return r.u;
}

/* Store a raw x-dtype chunk at column c0 of row p (columns >= H untouched). */
template <typename TX> __device__ __forceinline__ void store_raw(TX *p, int c0, int H, bool al, uint4 u)
{
    constexpr int VEC = (int)(16 / sizeof(TX));
    if (al && c0 + VEC <= H) {
        *reinterpret_cast<uint4 *>(p + c0) = u;
        return;
    }
    Raw<TX> r;
    r.u = u;
#pragma unroll
    for (int k = 0; k < VEC; k++)
        if (c0 + k < H)
            p[c0 + k] = r.e[k];
}

/* One row's pointers and alignment flags. */
template <typename TX> struct RowPtrs {
    const TX *x;
    const TX *res;
    TX *res_out;
    bool xal, ral, oal;
};

template <typename TX> __device__ __forceinline__ RowPtrs<TX> row_ptrs(const lnorm__kseg *s, int64_t r)
{
    RowPtrs<TX> q;
    q.x = (const TX *)s->x + r * s->x_stride;
    q.res = s->res ? (const TX *)s->res + r * s->res_stride : nullptr;
    q.res_out = s->res ? (TX *)s->res_out + r * s->res_out_stride : nullptr;
    q.xal = ((uintptr_t)q.x & 15) == 0;
    q.ral = ((uintptr_t)q.res & 15) == 0;
    q.oal = ((uintptr_t)q.res_out & 15) == 0;
    return q;
}

/* Load the chunk of h at c0: x, or round_to_x(x + residual) with
 * residual_out written. Returns raw bits of h (h is exact in x's dtype). */
template <typename TX>
__device__ __forceinline__ uint4 load_h(const RowPtrs<TX> &q, int c0, int H)
{
    constexpr int VEC = (int)(16 / sizeof(TX));
    uint4 u = load_raw<TX>(q.x, c0, H, q.xal);
    if (q.res) {
        float a[VEC], b[VEC];
        unpack<TX, false>(u, a);
        unpack<TX, false>(load_raw<TX>(q.res, c0, H, q.ral), b);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            a[k] = a[k] + b[k];
        u = pack<TX>(a);
        store_raw<TX>(q.res_out, c0, H, q.oal, u);
    }
    return u;
}

/* The shift K of LayerNorm: h[0] (0 if not finite), as the CPU backend
 * does, so that the sums see h - K (no cancellation when mean >> spread). */
template <typename TX> __device__ __forceinline__ float row_shift(const RowPtrs<TX> &q)
{
    float k = to_f<TX>(q.x[0]);
    if (q.res)
        k = to_f<TX>(from_f<TX>(k + to_f<TX>(q.res[0])));
    return isfinite(k) ? k : 0.0f;
}

/* The LayerNorm shift of a row from its first element (0 if not finite). */
template <typename TX> __device__ __forceinline__ float shift_of(TX v0)
{
    const float k = to_f<TX>(v0);
    return isfinite(k) ? k : 0.0f;
}

/* The raw 16-byte parameter chunk at column c0 (TP as wide as x), through
 * the read-only cache (parameters are reused by every row); columns >= H
 * read as `fill` (1 for gamma, -0 for beta: exact identities). */
template <typename TP>
__device__ __forceinline__ uint4 load_param_raw(const TP *p, int c0, int H, bool al, float fill)
{
    constexpr int VEC = (int)(16 / sizeof(TP));
    Raw<TP> r;
    if (p == nullptr) {
#pragma unroll
        for (int k = 0; k < VEC; k++)
            r.e[k] = from_f<TP>(fill);
        return r.u;
    }
    if (al && c0 + VEC <= H)
        return __ldg(reinterpret_cast<const uint4 *>(p + c0));
#pragma unroll
    for (int k = 0; k < VEC; k++)
        r.e[k] = (c0 + k < H) ? p[c0 + k] : from_f<TP>(fill);
    return r.u;
}

/* N parameter values at an aligned column c0 whose chunk lies inside the
 * row (the AL form of k_fast): 16-byte read-only loads, no masks; absent
 * -> fill. */
template <typename TP, int N, bool BITS = true>
__device__ __forceinline__ void load_param_full(const TP *p, int c0, float fill, float (&v)[N])
{
    constexpr int S = Sub<TP, N>::value;
    static_assert(S * sizeof(TP) == 16, "16-byte parameter chunks");
    if (p == nullptr) {
#pragma unroll
        for (int k = 0; k < N; k++)
            v[k] = fill;
        return;
    }
#pragma unroll
    for (int s = 0; s < N; s += S) {
        float e[S];
        unpack<TP, BITS>(__ldg(reinterpret_cast<const uint4 *>(p + c0 + s)), e);
#pragma unroll
        for (int k = 0; k < S; k++)
            v[s + k] = e[k];
    }
}

/* N parameter values at column c0 as fp32 (any TP); absent -> fill.
 * Read-only 16-byte loads where aligned (else the plain loads of
 * load_chunk); the values are the same. */
template <typename TP, int N, bool BITS = true>
__device__ __forceinline__ void load_param(const TP *p, int c0, int H, bool al, float fill, float (&v)[N])
{
    if (p == nullptr) {
#pragma unroll
        for (int k = 0; k < N; k++)
            v[k] = fill;
        return;
    }
    if constexpr (Sub<TP, N>::value * sizeof(TP) == 16) {
        /* Read-only (non-coherent) 16-byte loads: gamma/beta are not
         * written during a launch, so the compiler may issue them early,
         * ahead of the stores of y. */
        if (al && c0 + N <= H) {
            load_param_full<TP, N, BITS>(p, c0, fill, v);
            return;
        }
    }
    load_chunk<TP, N, BITS>(p, c0, H, al, v);
}

} // namespace lnorm_cuda

#endif /* LNORM_CUDA_IO_CUH */
