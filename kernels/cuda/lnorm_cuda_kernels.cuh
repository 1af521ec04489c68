/*
 * The CUDA kernels of the normalization core, as templates; each
 * lnorm_cuda_<dtype>.cu instantiates them for one x dtype. Numerics are
 * those of kernels/core/lnorm_core.h. The design (tiers, vectors, clusters)
 * is described in docs/gpu.md.
 *
 * Column mapping. x is read in chunks of VEC = 16 / sizeof(x) elements.
 * Chunk j of thread t of CTA rank k (of CL CTAs on one row) covers columns
 * [c * VEC, c * VEC + VEC) with c = (k * NCH + j) * TPR + t: CTA k of a
 * cluster owns one contiguous slice of NCH * TPR chunks (which a single
 * bulk copy can bring into its shared memory, see k_bulk). The mapping
 * depends on the tier only, never on pointer alignment or on the batch:
 * an aligned full chunk is one 16-byte access, any other chunk is read
 * element by element with the same mask, so a row gives the same bits
 * whatever its alignment, stride or batch companions.
 */
#ifndef LNORM_CUDA_KERNELS_CUH
#define LNORM_CUDA_KERNELS_CUH

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "lnorm/types.h"
#include "lnorm_cuda_impl.h"

namespace lnorm_cuda {

namespace cg = cooperative_groups;

/* fp32 <-> element conversions (round to nearest even). */
template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/* bf16 -> fp32 is exact: the 16 bits become the high half of the float.
 * With LNORM_CUDA_BF16_BITS (default) a 16-byte chunk of bf16 is unpacked
 * by bit operations, one instruction an element (w << 16, w & 0xffff0000);
 * the conversion through __nv_bfloat16 elements (0) took two for every
 * element in a high half (PRMT, then a shift: ncu source view of the
 * LayerNorm cluster kernel, 2026-11-30). Same values, same bits. */
#ifndef LNORM_CUDA_BF16_BITS
#define LNORM_CUDA_BF16_BITS 1
#endif
#ifndef LNORM_CUDA_BF16_BITS_MIN_TPR
#define LNORM_CUDA_BF16_BITS_MIN_TPR 256 /* the fast path's threshold (fast_row) */
#endif
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
            if constexpr (BITS && LNORM_CUDA_BF16_BITS && std::is_same<T, __nv_bfloat16>::value && S == 8) {
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

/* rstd from the variance (or mean square), with eps inside or outside. */
__device__ __forceinline__ float make_rstd(float var, float eps, int eps_mode)
{
    return eps_mode == LNORM_EPS_OUTSIDE ? 1.0f / (sqrtf(var) + eps) : 1.0f / sqrtf(var + eps);
}

/* ---- mbarrier helpers (sm_90) ---- */
__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(uint64_t *b, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count) : "memory");
}

/* Add bytes to the transaction count of the current phase. */
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, uint32_t bytes)
{
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}

/* Wait until the phase with this parity has completed (polling). (A
 * suspend-time hint, NANOSLEEP.SYNCS instead of polling, measured within
 * -1..+1% on every benchmark row: 6ece460, session 6; removed.) */
__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity)
{
    uint32_t done = 0;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(smem_addr(b)), "r"(parity)
                     : "memory");
    } while (!done);
}

/* Arrive on mbarrier b (count 1) and add bytes to its transaction count. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *b, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes)
                 : "memory");
}

/* rd, rb: the shared::cluster addresses of CTA `peer`'s copies of this CTA's
 * shared *dst and mbarrier *bar (same offsets in its shared memory). */
__device__ __forceinline__ void peer_map(const void *dst, const uint64_t *bar, uint32_t peer, uint32_t &rd,
                                         uint32_t &rb)
{
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rd) : "r"(smem_addr(dst)), "r"(peer));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(smem_addr(bar)), "r"(peer));
}

/* Store v into CTA `peer`'s copy of the shared float *dst (same offset in
 * its shared memory) and count 4 bytes on its copy of mbarrier *bar: an
 * asynchronous distributed shared memory store, visible to the peer once
 * it has waited for the barrier's phase. */
__device__ __forceinline__ void st_async_peer(float *dst, float v, uint64_t *bar, uint32_t peer)
{
    uint32_t rd, rb;
    peer_map(dst, bar, peer, rd, rb);
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(rd), "f"(v),
                 "r"(rb)
                 : "memory");
}

/* Cluster reduction state of one CTA (NW warps, cluster of CL CTAs). Each
 * reduction n takes buffer b = n % LNORM__CRB: warp w of CTA k stores its
 * partial into slot[b][k][w] of every CTA of the cluster (st_async_peer),
 * counted on that CTA's bar[b]. Every warp sends reduction n and then
 * reads it, so a peer sends n + 3 only after reduction n + 2 is complete,
 * which needs every warp of this CTA to have sent n + 2, which each does
 * after it read n + 1 and so n: a slot is rewritten only once every CTA
 * has read it, and a barrier receives the bytes of its next phase only
 * after its current phase completed (two buffers would do; three are the
 * measured build). (A pipelined variant that sent n + 1 before reading n,
 * measured slower in session 6 and removed, needed four.) Each warp reads
 * the slots lane by lane (lane l: slots l, l + 32, ... of slot[b] taken as
 * one array), consecutive addresses: the earlier layout, read by lane
 * k < CL as CTA k's warps in turn, had 8- to 16-way bank conflicts in the
 * 512-thread tiers (056e11f on the H200: bf16 RMSNorm H = 262144 at 1857
 * GB/s that way, 3277 lane by lane). (These declarations and index forms
 * are ones ptxas 13.0 compiles without spills at the 64-register budget of
 * the cluster bulk kernels; a separate array per buffer layout, or a flat
 * slot array, spilled.) */
#define LNORM__CRB 3
template <int CL, int NW> struct ClusterRed {
    uint64_t bar[LNORM__CRB];
    float slot[LNORM__CRB][CL][NW]; /* 4-byte slots (16-byte ones: f32 H = 262144 6% slower, session 6) */
};

/* Thread 0 initializes the cluster reduction state; the caller then syncs
 * the cluster (no CTA may store into a peer's barrier before its init). */
template <int CL, int NW> __device__ __forceinline__ void cluster_red_init(ClusterRed<CL, NW> *cr)
{
    if (threadIdx.x == 0) {
        for (int i = 0; i < LNORM__CRB; i++)
            mbar_init(&cr->bar[i], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
}

/* LNORM_CUDA_CLU_HIER: clusters of this many CTAs and more (default 8)
 * reduce in two levels. The warps' partials go to the CTA's shared memory, one
 * CTA barrier, warp w < CL sums the CTA's NW partials (lane l reads one,
 * a shuffle tree) and sends that CTA total to CTA w, and each
 * warp reads the CL totals (lane k: CTA k's) and sums them by a shuffle
 * tree. Each warp then reads 2 slots instead of CL x NW / 32 (which at
 * CL = 16 made the slot reads ~40% of the shared-memory wavefronts of f32
 * LayerNorm H = 262144, ncu 2026-11-30) and a CTA receives CL stores a
 * reduction instead of CL x NW. Buffers: warp w sends reduction n after
 * the CTA barrier of n, which every warp passes only once it has read
 * n - 1; so a peer's send of n + 2 (after its barrier of n + 2, hence
 * after reduction n + 1 completed there, which needed this CTA's send
 * of n + 1, made after this CTA's barrier of n + 1) comes after every
 * warp here read n: the three buffers of ClusterRed suffice, as does
 * red's double buffer. Same run on the H200 (bench/results/
 * kernels-2026-11-30-14b0b91-ab.log, build hier against the default):
 * f32 LayerNorm H = 131072 / 262144 (clusters of 8 / 16) 3364 / 2947 GB/s
 * against 3187 / 2503, bf16 LayerNorm H = 262144 (8) 2819 against 2688,
 * RMSNorm there +0.4..+1.8%; in clusters of 2 and 4 bf16 LayerNorm 2-3%
 * slower, the rest within 1%. */
#ifndef LNORM_CUDA_CLU_HIER
#define LNORM_CUDA_CLU_HIER 8 /* the smallest cluster that reduces in two levels (99: none) */
#endif
/* LNORM_CUDA_RED_TREE: from this many threads a row (default 1024: tier
 * 10, one row a CTA) the CTA level of a reduction is one shared-memory
 * read and a shuffle tree a warp, instead of every thread adding the
 * TPR / 32 warp partials in turn. Another order, so other bits (the same
 * in every kernel). Same run on the H200 (bench/results/
 * kernels-2026-11-30-0805d64-ab.log, default or nks against seq): 1024
 * threads: bf16 LayerNorm H = 32768 +3%, f32 H = 16384 +1%, RMSNorm
 * within 1%; 256-512 threads within -1..+1%; 64-128 threads a row bf16
 * 1% and f32 LayerNorm H = 512 / 1024 6-8% slower. */
#ifndef LNORM_CUDA_RED_TREE
#define LNORM_CUDA_RED_TREE 1024
#endif
/* Sum over the TPR threads of a row group, then over the CL CTAs of a
 * cluster. Deterministic (fixed trees); every thread of the group gets the
 * same value. par counts the reductions of the kernel (uniform over the
 * CTA and the cluster): red is double-buffered by its low bit, the cluster
 * slots take par % LNORM__CRB. In a cluster (one row per CTA, TPR == BLOCK)
 * of fewer than LNORM_CUDA_CLU_HIER CTAs (larger ones: two levels, above) the
 * warps' partials go straight to every CTA's slots, and each warp waits
 * only for its own CTA's barrier (no CTA or cluster barrier); lane l sums
 * slots l, l + 32, ... (ClusterRed), then a shuffle tree sums the lanes:
 * every warp of the cluster does the same operations in the same order. */
template <int TPR, int BLOCK, int CL>
__device__ __forceinline__ float group_sum(float x, float (*red)[BLOCK / 32], void *crv, int rank, int par)
{
#pragma unroll
    for (int m = (TPR < 32 ? TPR : 32) / 2; m > 0; m >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, m);
    if constexpr (CL > 1 && CL >= LNORM_CUDA_CLU_HIER) {
        static_assert(TPR == BLOCK, "a cluster tier holds one row per CTA");
        constexpr int NW = BLOCK / 32;
        static_assert(NW <= 32 && CL <= 32, "one slot a lane");
        ClusterRed<CL, NW> *cr = static_cast<ClusterRed<CL, NW> *>(crv);
        const int b = par % LNORM__CRB;
        const int lane = (int)(threadIdx.x & 31);
        const int w = (int)(threadIdx.x / 32);
        if (lane == 0)
            red[par & 1][w] = x;
        if (threadIdx.x == 0)
            mbar_arrive_expect_tx(&cr->bar[b], (uint32_t)(CL * sizeof(float)));
        __syncthreads();
        float *tot = &cr->slot[b][0][0]; /* tot[k]: CTA k's total */
        if (w < CL) { /* warp w sends the CTA's total to CTAs w, w + NW, ... */
            float c = lane < NW ? red[par & 1][lane] : 0.0f;
#pragma unroll
            for (int m = 16; m > 0; m >>= 1)
                c += __shfl_xor_sync(0xffffffffu, c, m);
            if (lane == 0)
                for (int k = w; k < CL; k += NW)
                    st_async_peer(tot + rank, c, &cr->bar[b], (uint32_t)k);
        }
        mbar_wait(&cr->bar[b], (uint32_t)((par / LNORM__CRB) & 1));
        float v = lane < CL ? tot[lane] : 0.0f;
#pragma unroll
        for (int m = 16; m > 0; m >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, m);
        x = v;
    } else if constexpr (CL > 1) {
        static_assert(TPR == BLOCK, "a cluster tier holds one row per CTA");
        constexpr int NW = BLOCK / 32;
        ClusterRed<CL, NW> *cr = static_cast<ClusterRed<CL, NW> *>(crv);
        const int b = par % LNORM__CRB;
        const int lane = (int)(threadIdx.x & 31);
        if (threadIdx.x == 0)
            mbar_arrive_expect_tx(&cr->bar[b], (uint32_t)(CL * NW * sizeof(float)));
        if (lane < CL)
            st_async_peer(&cr->slot[b][rank][threadIdx.x / 32], x, &cr->bar[b], (uint32_t)lane);
        mbar_wait(&cr->bar[b], (uint32_t)((par / LNORM__CRB) & 1));
        float v = 0.0f;
#pragma unroll
        for (int i = 0; i < (CL * NW + 31) / 32; i++)
            if (i * 32 + lane < CL * NW)
                v += (&cr->slot[0][0][0])[b * CL * NW + i * 32 + lane];
#pragma unroll
        for (int m = 16; m > 0; m >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, m);
        x = v;
    } else if constexpr (TPR > 32) {
        constexpr int WPG = TPR / 32;
        if ((threadIdx.x & 31) == 0)
            red[par & 1][threadIdx.x / 32] = x;
        __syncthreads();
        const int w0 = (int)(threadIdx.x / TPR) * WPG;
        if constexpr (TPR >= LNORM_CUDA_RED_TREE) {
            /* Lane l reads warp l % WPG's partial, a shuffle tree over each
             * group of WPG lanes sums them: every lane gets the same sum. */
            x = red[par & 1][w0 + (int)(threadIdx.x & (WPG - 1))];
#pragma unroll
            for (int m = WPG / 2; m > 0; m >>= 1)
                x += __shfl_xor_sync(0xffffffffu, x, m);
        } else {
            x = 0.0f;
#pragma unroll
            for (int i = 0; i < WPG; i++)
                x += red[par & 1][w0 + i];
        }
    }
    return x;
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
    if constexpr (BITS && LNORM_CUDA_BF16_BITS && std::is_same<TX, __nv_bfloat16>::value) {
        bf16x8_to_f(u, f);
    } else {
        Raw<TX> r;
        r.u = u;
#pragma unroll
        for (int k = 0; k < (int)(16 / sizeof(TX)); k++)
            f[k] = to_f<TX>(r.e[k]);
    }
}

/* LNORM_CUDA_PACK2 (default since session 15): 16-bit chunks are packed
 * two elements at a time (__floats2bfloat162_rn / __floats2half2_rn: one
 * F2FP a pair, each element rounded to nearest even as by
 * __float2bfloat16_rn / __float2half_rn, so the same bits) instead of one
 * conversion an element and a PRMT a pair (4 instructions a chunk against
 * 12). 0: element by element. With YH (fast_row) on the H200, same run,
 * every column bit-identical (bench/results/kernels-2026-12-01-9897ccd-pk-ab):
 * bf16 LayerNorm H = 32768 / 65536 / 131072 +0.9% / +2.5% / +1.8%, the
 * other rows within run-to-run spread; ncu: bf16 LayerNorm H = 131072
 * 4.3% fewer instructions (109.0 M against 113.9 M), bf16 RMSNorm 9%
 * fewer at the same time. */
#ifndef LNORM_CUDA_PACK2
#define LNORM_CUDA_PACK2 1
#endif
/* Two floats rounded to a 16-bit TX, a in the low half (the element at
 * the lower address), b in the high half: one conversion instruction. */
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
/* VEC floats -> raw chunk (each rounded to TX). */
template <typename TX> __device__ __forceinline__ uint4 pack(const float (&f)[16 / sizeof(TX)])
{
    if constexpr (LNORM_CUDA_PACK2 && sizeof(TX) == 2) {
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

/* Loads of x with the evict-first (streaming, .cs) hint: 0 (default) plain
 * loads. The hint cost every one-CTA kernel 3-11% (H200, same run,
 * bench/results/kernels-2026-11-30-4bb3898-ab.log, build cs = the hint on:
 * bf16 LayerNorm at H = 128-4096 3988-4028 GB/s without it against
 * 3617-3897 with it, f32 at H = 128-8192 4028-4171 against 3874-4034). */
#ifndef LNORM_CUDA_LDCS
#define LNORM_CUDA_LDCS 0
#endif
/* (A/B builds: 2 read-only loads, __ldg; 3 last-use loads, __ldlu.) */
template <typename T> __device__ __forceinline__ T load_x16(const T *p)
{
#if LNORM_CUDA_LDCS == 1
    return __ldcs(p);
#elif LNORM_CUDA_LDCS == 2
    return __ldg(p);
#elif LNORM_CUDA_LDCS == 3
    return __ldlu(p);
#else
    return *p;
#endif
}

/* Loads of the re-read form (RR, k_fast): x is read from global memory
 * in every pass; the statistics passes ask L1 to keep the lines
 * (L1::evict_last), the output pass to drop them first (L1::evict_first),
 * as they are not read again. LNORM_CUDA_RR_HINT 0: plain loads. Coherent
 * loads (not .nc): y may be x. */
#ifndef LNORM_CUDA_RR_HINT
#define LNORM_CUDA_RR_HINT 1
#endif
#ifndef LNORM_CUDA_RR_BATCH
#define LNORM_CUDA_RR_BATCH 1 /* fast_row: a pass's RR loads issued together (CTAs under 1024 threads) */
#endif
template <bool LAST> __device__ __forceinline__ uint4 load_rr16(const void *q)
{
    uint4 r;
#if LNORM_CUDA_RR_HINT
    if constexpr (LAST)
        asm volatile("ld.global.L1::evict_first.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(q));
    else
        asm volatile("ld.global.L1::evict_last.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(q));
#else
    r = *reinterpret_cast<const uint4 *>(q);
#endif
    return r;
}

/* Stores of y: 0 (default) plain; A/B builds: 1 evict-first (__stcs). */
#ifndef LNORM_CUDA_STCS
#define LNORM_CUDA_STCS 0
#endif
template <typename T> __device__ __forceinline__ void store_y16(T *p, T v)
{
#if LNORM_CUDA_STCS
    __stcs(p, v);
#else
    *p = v;
#endif
}

/* Store the 16 bytes v at the 16-byte aligned global address p if `on`:
 * one predicated store instruction, no branch around it (YH in fast_row;
 * a plain store: LNORM_CUDA_STCS does not apply to it). */
__device__ __forceinline__ void store16_if(void *p, uint4 v, bool on)
{
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %5, 0;\n\t"
                 "@q st.global.v4.u32 [%0], {%1, %2, %3, %4};\n\t}" ::"l"(p),
                 "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"((unsigned)on)
                 : "memory");
}

/* Load the x-dtype chunk at column c0 of row p as raw bits (columns >= H
 * read as +0). al: p is 16-byte aligned. */
template <typename TX> __device__ __forceinline__ uint4 load_raw(const TX *p, int c0, int H, bool al)
{
    constexpr int VEC = (int)(16 / sizeof(TX));
    if (al && c0 + VEC <= H)
        return load_x16(reinterpret_cast<const uint4 *>(p + c0));
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
        store_y16(reinterpret_cast<uint4 *>(p + c0), u);
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

/* Normalize the raw chunks of a row and store y (TY), gamma/beta of TP:
 * y = ((h - K) - d) * rstd * gamma + beta (K = d = 0 for RMSNorm). */
template <typename TX, typename TY, typename TP, int NCH, int TPR, int CL>
__device__ __forceinline__ void emit_row(const uint4 (&raw)[NCH], const lnorm__kseg *s, int64_t r, int H,
                                         int rank, int t, float K, float d, float rstd)
{
    constexpr int VEC = (int)(16 / sizeof(TX));
    TY *yr = (TY *)s->y + r * s->y_stride;
    const TP *gp = (const TP *)s->gamma;
    const TP *bp = (const TP *)s->beta;
    const bool yal = chunk_aligned<TY, VEC>(yr);
    const bool gal = gp && chunk_aligned<TP, VEC>(gp);
    const bool bal = bp && chunk_aligned<TP, VEC>(bp);
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
        if (c0 >= H)
            continue;
        float f[VEC], g[VEC], b[VEC];
        unpack<TX, false>(raw[j], f);
        if (gp)
            load_chunk<TP, VEC>(gp, c0, H, gal, g);
        if (bp)
            load_chunk<TP, VEC>(bp, c0, H, bal, b);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            /* Explicit roundings (no contraction left to the compiler), the
             * same operations as fast_row: n * g + b is one fma whether or
             * not gamma/beta exist (fma(n, 1, b) = n + b, fma(n, g, -0) =
             * n * g exactly), so every kernel gives the same bits. */
            float n = __fmul_rn((f[k] - K) - d, rstd);
            if (gp && bp)
                n = __fmaf_rn(n, g[k], b[k]);
            else if (gp)
                n = __fmul_rn(n, g[k]);
            else if (bp)
                n = __fadd_rn(n, b[k]);
            f[k] = n;
        }
        store_chunk<TY, VEC>(yr, c0, H, yal, f);
#if LNORM_CUDA_EMIT_BARRIER
        /* Keep the compiler from hoisting every chunk's gamma/beta loads
         * ahead (register pressure, spills); other warps hide the latency. */
        asm volatile("" ::: "memory");
#endif
    }
}

/* Dispatch emit_row on the run-time y and parameter dtypes. */
template <typename TX, int NCH, int TPR, int CL>
__device__ __forceinline__ void emit_any(const uint4 (&raw)[NCH], const lnorm__kseg *s, int64_t r, int H,
                                         int rank, int t, float K, float d, float rstd)
{
    const bool pf32 = s->param_dtype == LNORM_DTYPE_F32;
    switch (s->y_dtype) {
    case LNORM_DTYPE_F32:
        if (pf32)
            emit_row<TX, float, float, NCH, TPR, CL>(raw, s, r, H, rank, t, K, d, rstd);
        else
            emit_row<TX, float, TX, NCH, TPR, CL>(raw, s, r, H, rank, t, K, d, rstd);
        break;
    case LNORM_DTYPE_F16:
        if (pf32)
            emit_row<TX, __half, float, NCH, TPR, CL>(raw, s, r, H, rank, t, K, d, rstd);
        else
            emit_row<TX, __half, TX, NCH, TPR, CL>(raw, s, r, H, rank, t, K, d, rstd);
        break;
    default:
        if (pf32)
            emit_row<TX, __nv_bfloat16, float, NCH, TPR, CL>(raw, s, r, H, rank, t, K, d, rstd);
        else
            emit_row<TX, __nv_bfloat16, TX, NCH, TPR, CL>(raw, s, r, H, rank, t, K, d, rstd);
        break;
    }
}

/* Build-time tuning knobs (defaults chosen from bench/results/kernels-*):
 * prefetch of the next row, register budgets of the 4- and 8-chunk tiers. */
#ifndef LNORM_CUDA_PREFETCH
#define LNORM_CUDA_PREFETCH 0 /* on: slower in every row of the 2026-11-29 A/B run */
#endif
#ifndef LNORM_CUDA_REGS4
#define LNORM_CUDA_REGS4 80
#endif
#ifndef LNORM_CUDA_REGS8
#define LNORM_CUDA_REGS8 128
#endif
#ifndef LNORM_CUDA_EMIT_BARRIER
#define LNORM_CUDA_EMIT_BARRIER 1
#endif

/* CTA size and minimum resident CTAs of a register tier in the general
 * kernels (k_reg): CTAs of at least 128 threads, a register budget of 80 a
 * thread for 4 chunks, 128 for 8 (what they need without spills). */
template <int TPR, int NCH> struct RegShape {
    static constexpr int block = TPR > 128 ? TPR : 128;
    static constexpr int regs = NCH <= 4 ? LNORM_CUDA_REGS4 : LNORM_CUDA_REGS8;
    static constexpr int min_blocks = 65536 / (block * regs) > 0 ? 65536 / (block * regs) : 1;
};

/* A row of a register tier, as its group sees it. */
struct RowState {
    const lnorm__kseg *s;
    int64_t r;
    int H;      /* 0 when the group has no row (everything masked) */
    float K;    /* LayerNorm shift h[0]; 0 for RMSNorm */
    bool active;
};

/* Locate the row of this thread's group starting at base, load its chunks
 * of h (residual_out written) and its shift K. */
template <typename TX, int TPR, int NCH, int CL>
__device__ __forceinline__ RowState fetch_row(const lnorm__kparams &p, int64_t base, int rank, int t,
                                              uint4 (&raw)[NCH])
{
    constexpr int VEC = (int)(16 / sizeof(TX));
    RowState st;
    const int64_t row = base + threadIdx.x / TPR;
    st.active = row < p.total_rows;
    const int64_t rr = st.active ? row : (base < p.total_rows ? base : p.total_rows - 1);
    st.s = find_seg(p, rr);
    st.r = rr - st.s->row_begin;
    st.H = st.active ? (int)st.s->hidden : 0;
    const RowPtrs<TX> q = row_ptrs<TX>(st.s, st.r);
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
        raw[j] = load_h<TX>(q, c0, st.H);
    }
    st.K = (st.s->op != LNORM_OP_RMSNORM && st.H > 0) ? row_shift<TX>(q) : 0.0f;
    return st;
}

/* Register tiers: a row held in registers as raw x-dtype chunks by TPR
 * threads (NCH 16-byte chunks each), BLOCK / TPR rows per CTA, or one row
 * over a cluster of CL CTAs. Loops over rows (uniformly per CTA / cluster)
 * until the launch's rows are done; the next row's loads are issued before
 * the current row is reduced and written (software pipelining), so memory
 * stays busy through the reductions and cluster barriers. */
template <typename TX, int TPR, int NCH, int CL>
__global__ void __launch_bounds__(RegShape<TPR, NCH>::block, RegShape<TPR, NCH>::min_blocks)
    k_reg(const __grid_constant__ lnorm__kparams p)
{
    constexpr int BLOCK = RegShape<TPR, NCH>::block;
    constexpr int VEC = (int)(16 / sizeof(TX));
    constexpr int RPC = BLOCK / TPR;
    __shared__ float red[2][BLOCK / 32];
    __shared__ ClusterRed<CL, BLOCK / 32> cr;
    void *cred = &cr;
    const int t = (int)(threadIdx.x % TPR);
    int rank = 0;
    if constexpr (CL > 1) {
        rank = (int)cg::this_cluster().block_rank();
        cluster_red_init(&cr);
        cg::this_cluster().sync();
    }
    const int64_t cid = blockIdx.x / CL, ncl = gridDim.x / CL;
    int par = 0;
    uint4 raw[NCH];
    int64_t base = cid * RPC;
    RowState cur = fetch_row<TX, TPR, NCH, CL>(p, base, rank, t, raw);
    while (base < p.total_rows) {
        const int64_t nbase = base + ncl * RPC;
#if LNORM_CUDA_PREFETCH
        uint4 nraw[NCH];
        RowState nxt;
#endif
#if LNORM_CUDA_PREFETCH
        if (nbase < p.total_rows) /* uniform over the CTA and the cluster */
            nxt = fetch_row<TX, TPR, NCH, CL>(p, nbase, rank, t, nraw);
#endif

        const lnorm__kseg *s = cur.s;
        const int H = cur.H;
        const float K = cur.K;
        const bool rms = s->op == LNORM_OP_RMSNORM;
        float d = 0.0f;
        /* With one row per CTA the op is uniform and RMSNorm skips the sum;
         * with several rows per CTA every group reduces (shuffles are
         * warp-wide), and RMSNorm ignores the result. Masked columns
         * contribute 0; full chunks skip the mask. */
        if (RPC > 1 || !rms) {
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
                float f[VEC];
                unpack<TX, false>(raw[j], f);
                if (c0 + VEC <= H) {
#pragma unroll
                    for (int k = 0; k < VEC; k++)
                        sum += f[k] - K;
                } else {
#pragma unroll
                    for (int k = 0; k < VEC; k++)
                        sum += (c0 + k < H) ? f[k] - K : 0.0f;
                }
            }
            sum = group_sum<TPR, BLOCK, CL>(sum, red, cred, rank, par);
            par++;
            if (!rms)
                d = sum / (float)H;
        }
        float sq = 0.0f;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
            float f[VEC];
            unpack<TX, false>(raw[j], f);
            if (c0 + VEC <= H) {
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    const float e = (f[k] - K) - d;
                    sq = __fmaf_rn(e, e, sq);
                }
            } else {
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    const float e = (c0 + k < H) ? (f[k] - K) - d : 0.0f;
                    sq = __fmaf_rn(e, e, sq);
                }
            }
        }
        sq = group_sum<TPR, BLOCK, CL>(sq, red, cred, rank, par);
        par++;
        const float rstd = make_rstd(sq / (float)H, s->eps, s->eps_mode);
        if (cur.active && t == 0 && rank == 0) {
            if (s->mean)
                s->mean[cur.r] = K + d;
            if (s->rstd)
                s->rstd[cur.r] = rstd;
        }
        if (cur.active)
            emit_any<TX, NCH, TPR, CL>(raw, s, cur.r, H, rank, t, K, d, rstd);
        base = nbase;
        if (base < p.total_rows) {
#if LNORM_CUDA_PREFETCH
            cur = nxt;
#pragma unroll
            for (int j = 0; j < NCH; j++)
                raw[j] = nraw[j];
#else
            cur = fetch_row<TX, TPR, NCH, CL>(p, base, rank, t, raw);
#endif
        }
    }
    if constexpr (CL > 1)
        cg::this_cluster().sync(); /* no CTA leaves while its shared memory may be read */
}

/* Kahan addition of v into (*s, *c). */
__device__ __forceinline__ void kahan(float &s, float &c, float v)
{
    const float y = v - c;
    const float t = s + y;
    c = (t - s) - y;
    s = t;
}

/* Sum of one float per thread over a 1024-thread CTA (fixed tree); every
 * thread gets the result. buf: 33 floats of shared memory. */
__device__ __forceinline__ float block_sum_1024(float v, float *buf)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        buf[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = buf[threadIdx.x];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0)
            buf[32] = v;
    }
    __syncthreads();
    v = buf[32];
    __syncthreads(); /* buf reused by the next call */
    return v;
}

/* Streaming tier for rows too long to hold on chip (beyond the largest
 * cluster): one 1024-thread CTA per row, centred two-pass statistics over
 * the streamed row (pass 1: d = sum(h - K) / H; pass 2: sum(((h - K) - d)^2)),
 * per-thread sums Kahan-compensated, then pass 3 writes y. Pass 1 computes
 * h and writes residual_out; passes 2 and 3 re-read h from there (exactly
 * h) or from x. x is read three times (the later reads partly from L2). */
template <typename TX>
__global__ void __launch_bounds__(1024, 1) k_stream(const __grid_constant__ lnorm__kparams p)
{
    constexpr int BLOCK = 1024;
    constexpr int VEC = (int)(16 / sizeof(TX));
    __shared__ float buf[33];
    const int t = threadIdx.x;
    for (int64_t row = blockIdx.x; row < p.total_rows; row += gridDim.x) {
        const lnorm__kseg *s = find_seg(p, row);
        const int64_t r = row - s->row_begin;
        const int H = (int)s->hidden;
        const bool rms = s->op == LNORM_OP_RMSNORM;
        const RowPtrs<TX> q = row_ptrs<TX>(s, r);
        const TX *hr = q.res ? q.res_out : q.x;
        const bool hal = q.res ? q.oal : q.xal;
        const float K = rms ? 0.0f : row_shift<TX>(q);

        float s1 = 0.0f, c1 = 0.0f;
        for (int c0 = t * VEC; c0 < H; c0 += BLOCK * VEC) {
            float f[VEC];
            unpack<TX, false>(load_h<TX>(q, c0, H), f);
            float cs = 0.0f;
#pragma unroll
            for (int k = 0; k < VEC; k++)
                cs += (c0 + k < H) ? (rms ? f[k] * f[k] : f[k] - K) : 0.0f;
            kahan(s1, c1, cs);
        }
        const float S1 = block_sum_1024(s1, buf);
        float d = 0.0f, var;
        if (rms) {
            var = S1 / (float)H;
        } else {
            d = S1 / (float)H;
            float s2 = 0.0f, c2 = 0.0f;
            for (int c0 = t * VEC; c0 < H; c0 += BLOCK * VEC) {
                float f[VEC];
                unpack<TX, false>(load_raw<TX>(hr, c0, H, hal), f);
                float cs = 0.0f;
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    const float e = (c0 + k < H) ? (f[k] - K) - d : 0.0f;
                    cs += e * e;
                }
                kahan(s2, c2, cs);
            }
            var = block_sum_1024(s2, buf) / (float)H;
        }
        const float rstd = make_rstd(var, s->eps, s->eps_mode);
        if (t == 0) {
            if (s->mean)
                s->mean[r] = K + d;
            if (s->rstd)
                s->rstd[r] = rstd;
        }
        for (int c0 = t * VEC; c0 < H; c0 += BLOCK * VEC) {
            uint4 raw[1] = {load_raw<TX>(hr, c0, H, hal)};
            /* emit_any with NCH = 1, TPR = 1, CL = 1: "thread" c0 / VEC
             * maps to column c0. */
            emit_any<TX, 1, 1, 1>(raw, s, r, H, 0, c0 / VEC, K, d, rstd);
        }
    }
}

/* A launch configuration for clusters of cl CTAs of `block` threads on
 * stream st (cudaLaunchKernelEx); *at holds its one attribute, so it must
 * outlive the launch. Also used by the experiments in bench/gpu/. */
static inline cudaLaunchConfig_t cluster_config(int cl, dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                                cudaLaunchAttribute *at)
{
    cudaLaunchConfig_t cfg = {};
    at->id = cudaLaunchAttributeClusterDimension;
    at->val.clusterDim.x = (unsigned)cl;
    at->val.clusterDim.y = 1;
    at->val.clusterDim.z = 1;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cfg;
}

/* The current device and its number of SMs. */
static cudaError_t device_sms(int *dev, int *sms)
{
    cudaError_t e = cudaGetDevice(dev);
    if (e != cudaSuccess)
        return e;
    return cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, *dev);
}

/* Resident CTAs per SM of kern at block threads without dynamic shared
 * memory (at least 1), cached per device in cache[64] (one per kernel). */
template <typename K> static cudaError_t cached_occupancy(K kern, int block, int dev, int *cache, int *occ)
{
    *occ = dev < 64 ? cache[dev] : 0;
    if (*occ > 0)
        return cudaSuccess;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(occ, kern, block, 0);
    if (e != cudaSuccess)
        return e;
    if (*occ < 1)
        *occ = 1;
    if (dev < 64)
        cache[dev] = *occ;
    return cudaSuccess;
}

/* Launch one register tier; grid capped at a few waves of resident CTAs
 * (clusters: the number of co-resident clusters). Returns the CUDA error. */
template <typename TX, int TPR, int NCH, int CL>
static cudaError_t launch_reg(const lnorm__kparams *p, cudaStream_t st)
{
    constexpr int BLOCK = RegShape<TPR, NCH>::block;
    constexpr int RPC = BLOCK / TPR;
    static int cache[64]; /* per device: occupancy (CTAs/SM or clusters), 0 = unknown */
    int dev = 0, sms = 0;
    cudaError_t e = device_sms(&dev, &sms);
    if (e != cudaSuccess)
        return e;
    auto kern = k_reg<TX, TPR, NCH, CL>;
    if constexpr (CL == 1) {
        int occ = 0;
        e = cached_occupancy(kern, BLOCK, dev, cache, &occ);
        if (e != cudaSuccess)
            return e;
        const int64_t need = (p->total_rows + RPC - 1) / RPC;
        const int64_t cap = (int64_t)sms * occ * 4;
        const unsigned grid = (unsigned)(need < cap ? need : cap);
        kern<<<grid, BLOCK, 0, st>>>(*p);
        return cudaGetLastError();
    } else {
        cudaLaunchAttribute at;
        cudaLaunchConfig_t cfg = cluster_config(CL, dim3(CL * sms, 1, 1), dim3(BLOCK, 1, 1), 0, st, &at);
        int ncl = dev < 64 ? cache[dev] : 0;
        if (ncl <= 0) {
            if (CL > 8) {
                e = cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
                if (e != cudaSuccess)
                    return e;
            }
            e = cudaOccupancyMaxActiveClusters(&ncl, kern, &cfg);
            if (e != cudaSuccess)
                return e;
            if (ncl < 1)
                return cudaErrorInvalidConfiguration;
            if (dev < 64)
                cache[dev] = ncl;
        }
        const int64_t need = p->total_rows;
        const int64_t cl = need < ncl ? need : ncl;
        cfg.gridDim = dim3((unsigned)(cl * CL), 1, 1);
        return cudaLaunchKernelEx(&cfg, kern, *p);
    }
}

/* Launch the streaming tier: one CTA per row, at most 2 waves. */
template <typename TX> static cudaError_t launch_stream(const lnorm__kparams *p, cudaStream_t st)
{
    int dev = 0, sms = 0;
    cudaError_t e = device_sms(&dev, &sms);
    if (e != cudaSuccess)
        return e;
    const int64_t cap = (int64_t)sms * 2;
    const unsigned grid = (unsigned)(p->total_rows < cap ? p->total_rows : cap);
    k_stream<TX><<<grid, 1024, 0, st>>>(*p);
    return cudaGetLastError();
}

/* ---- Fast path --------------------------------------------------------
 * The common case with the run-time generality taken out of the inner
 * loops: y dtype = x dtype, parameters of x's dtype or f32 (TP), the op
 * (RMS) a template parameter, no residual, one CTA per row (tiers with
 * CL == 1). Gamma/beta presence, stats and eps mode are uniform per
 * segment and tested once per chunk or row, never per element. A launch
 * with a single segment reads it inline (no segment-table search); a
 * launch with several segments of the same fast variant searches the table
 * as the general kernel does, with the same arithmetic, so a row gives the
 * same bits alone or in any batch. The host (lnorm_cuda_run.c) chooses the
 * variant from the row's segment only (x/y/param dtype, op, residual,
 * tier). Same numerics as k_reg: fp32 statistics, the LayerNorm shift K,
 * centred second pass, division by H, masked tails. */
#ifndef LNORM_CUDA_FASTPATH
#define LNORM_CUDA_FASTPATH 1
#endif
/* Keep a thread's gamma/beta chunks in registers (raw bits) across the rows
 * it processes, reloaded only when its segment changes, where they are as
 * narrow as x and the tier has 4 chunks (8-chunk tiers would spill):
 * 0 never, 1 LayerNorm only, 2 LayerNorm and RMSNorm. Default 1, from the
 * 2026-11-29 A/B run (bench/results/kernels-2026-11-29-fastpath.*): with
 * the cache, bf16 LayerNorm was 2-5% faster at H = 256..4096 and bf16
 * RMSNorm 7-14% slower (its cache costs registers the RMS loop needs). */
#ifndef LNORM_CUDA_FAST_GCACHE
#define LNORM_CUDA_FAST_GCACHE 0 /* 2026-11-30: off; k_fast without register caps and the cache was faster */
#endif

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

/* N parameter values at column c0 as fp32 (any TP); absent -> fill. NC:
 * read-only 16-byte loads where aligned (else the plain loads of
 * load_chunk); the values are the same. */
template <typename TP, int N, bool NC = true, bool BITS = true>
__device__ __forceinline__ void load_param(const TP *p, int c0, int H, bool al, float fill, float (&v)[N])
{
    if (p == nullptr) {
#pragma unroll
        for (int k = 0; k < N; k++)
            v[k] = fill;
        return;
    }
    if constexpr (NC && Sub<TP, N>::value * sizeof(TP) == 16) {
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

/* Whether the fast path keeps a row's gamma/beta chunks in registers
 * (k_fast: LNORM_CUDA_FAST_GCACHE; the bulk kernels, BULK true, whose
 * 128-register budget holds them: LNORM_CUDA_BULK_GCACHE). */
#ifndef LNORM_CUDA_BULK_GCACHE
/* 2: LayerNorm and RMSNorm. LayerNorm: bf16 H = 4096 3518 GB/s with, 2773
 * without; RMSNorm in the 512x4 cluster tiers: bf16 H = 65536 3479 with,
 * 3122 without, f32 H = 65536 3727 against 3275 (H200, same run,
 * bench/results/kernels-2026-11-30-17df2e0-ab.json). Only 4-chunk tiers
 * (FastGC). */
#define LNORM_CUDA_BULK_GCACHE 2
#endif
/* SHIFTED (LayerNorm rows held as fp32, F32REG): the first pass stores
 * x - K in place of x, so the later passes subtract the mean only, from the
 * same rounded x - K (same bits, one addition less an element in each of
 * the two later passes). 0: recompute x - K in each pass. */
#ifndef LNORM_CUDA_FAST_KREUSE
#define LNORM_CUDA_FAST_KREUSE 1
#endif
/* LNORM_CUDA_BULK_TSTORE: RMSNorm rows in clusters of this many CTAs and
 * more (default 8; 99: none) have each thread write its y chunks over x
 * in the stage, and thread 0 copies the CTA's slice of y out with one bulk
 * copy (cp.async.bulk.global.shared::cta), waited on (.read) before the
 * stage is refilled; rows whose y slice is not 16-byte aligned store as
 * before. Same run on the H200 (bench/results/kernels-2026-11-30-dae39db-ab,
 * build ts: every SMR kernel that way, against the per-thread stores):
 * RMSNorm in clusters of 8 / 16 +3% (bf16 H = 262144 3593 against 3489
 * GB/s, f32 H = 131072 / 262144 3827 / 3714 against 3722 / 3610), in
 * clusters of 2 and 4 and in tier 10 -2.5..+0.4%; LayerNorm 6-11% slower
 * everywhere (its stage is refilled later). */
#ifndef LNORM_CUDA_BULK_TSTORE
#define LNORM_CUDA_BULK_TSTORE 8
#endif
template <bool RMS, int CL> struct TStore {
    static constexpr bool value = RMS && CL > 1 && CL >= LNORM_CUDA_BULK_TSTORE;
};
/* The output pass specialized on which of gamma and beta the segment has
 * (one branch a row), so that absent parameters cost no fill values and
 * the identities fold (n * 1 + b, n * g + -0: same bits). 0: one generic
 * loop that tests for absent parameters chunk by chunk. */
#ifndef LNORM_CUDA_FAST_PSPEC
#define LNORM_CUDA_FAST_PSPEC 1
#endif
template <typename TX, typename TP, bool RMS, int NCH, bool BULK = false> struct FastGC {
    static constexpr int mode = BULK ? LNORM_CUDA_BULK_GCACHE : LNORM_CUDA_FAST_GCACHE;
    static constexpr bool value = (mode >= 2 || (mode == 1 && !RMS)) && sizeof(TP) == sizeof(TX) && NCH <= 4;
};

#ifndef LNORM_CUDA_YAL_HOIST
#define LNORM_CUDA_YAL_HOIST 1 /* fast_row: YH (default since session 15; measured with LNORM_CUDA_PACK2) */
#endif
#ifndef LNORM_CUDA_SMR_SEL
#define LNORM_CUDA_SMR_SEL 1 /* cluster kernels' passes without a branch a chunk (fast_row: SEL) */
#endif
/* The fast path's arithmetic for one row, shared by k_fast (rows loaded
 * from global memory) and k_bulk (rows staged in shared memory), so a row
 * gives the same bits through either: raw holds the row's chunks of this
 * thread (column mapping of the file header), K is the LayerNorm shift
 * (h[0], 0 if not finite; 0 for RMSNorm), H = 0 for a group without a row.
 * Reduces over the group (and the cluster), writes mean/rstd and y.
 * gcache/bcache/cs: the thread's cached parameter chunks and the segment
 * they belong to (used when GC). Every thread of the CTA calls it (the
 * reductions synchronize). */
template <typename TX, typename TP, bool RMS, int TPR, int NCH, int CL, int BLOCK, bool GC, bool F32REG = false,
          bool AL = false, bool SMR = false, bool XW = false, bool RR = false>
__device__ __forceinline__ void fast_row(const uint4 (&raw)[NCH], const lnorm__kseg *s, int64_t r, int H, bool active,
                                         float K, int rank, int t, float (*red)[BLOCK / 32], void *cred, int &par,
                                         uint4 (&gcache)[GC ? NCH : 1], uint4 (&bcache)[GC ? NCH : 1],
                                         const lnorm__kseg *&cs, const unsigned char *srow = nullptr, bool ts = false)
{
    constexpr int VEC = (int)(16 / sizeof(TX));
    /* The 8-chunk kernels (tier 14; every cluster tier of tier set 0) read
     * gamma/beta with plain loads, one chunk at a time behind a compiler
     * barrier, as measured at ef6a1bd (H200, 2026-11-30 00:55): read-only
     * loads without the barrier let the compiler hoist them, and bf16
     * RMSNorm in the bulk cluster kernels spilled more and ran 15-17% slower
     * (e2e430e, 02:39). 4-chunk tiers: read-only loads, no barrier (k_fast's
     * measured form). */
    constexpr bool NC4 = NCH <= 4; /* read-only parameter loads */
    /* bf16 unpacked by bit operations (bf16x8_to_f) from 256 threads a row
     * up (LNORM_CUDA_BF16_BITS_MIN_TPR): there bf16 LayerNorm ran 3-7%
     * faster that way (H = 16384-262144; H = 8192 +0.5%), in the tiers of
     * up to 128 threads 1-3% slower for both ops, though with fewer
     * instructions (H200, same run, bench/results/
     * kernels-2026-11-30-14b0b91-ab.log: default column against bits0). */
    constexpr bool BB = TPR >= LNORM_CUDA_BF16_BITS_MIN_TPR;
    /* F32REG: the row's chunks converted to fp32 once, kept in registers
     * for the three passes (the bulk kernels, where registers are not
     * what holds bytes in flight; the conversions were a measurable part
     * of the instructions of 16-bit LayerNorm, ncu 2026-11-30: SM 69% busy
     * at 50% of DRAM). The values, hence the bits, are the same. */
    float fv[F32REG ? NCH : 1][F32REG ? VEC : 1];
    if constexpr (F32REG) {
#pragma unroll
        for (int j = 0; j < NCH; j++)
            unpack<TX, BB>(raw[j], fv[j]);
    }
    /* XW (the bulk kernels): every row of the launch is a whole number of
     * 16-byte units, so a chunk is either inside the row or past its end:
     * the statistics passes need no element masks and a chunk's store no
     * test of its end. Same operations, same bits. */
    constexpr bool WH = AL || XW; /* chunks are whole or past the end */
    /* SEL (LNORM_CUDA_SMR_SEL): the cluster kernels (SMR, CL > 1) compute
     * every chunk of the slice (its stage holds the whole slice, so every
     * read is inside it) and drop a chunk past the row's end by a select of
     * the running sum (the sum before the chunk) and a predicated store,
     * instead of a branch around each chunk: no divergent-branch
     * bookkeeping a chunk, and the passes are straight-line code. A chunk
     * inside the row adds the same values in the same order: same bits.
     * Measured on the H200 (three runs, 2026-12-01): f32 LayerNorm
     * H = 262144 (clusters of 16) +1.6..+1.8%, the other cluster rows
     * within -0.3..+1.1%; bf16 LayerNorm in the one-CTA tier 10 1.5%
     * slower each time, so tier 10 keeps the branches. */
    constexpr bool SEL = SMR && XW && CL > 1 && LNORM_CUDA_SMR_SEL;
    constexpr bool SHIFTED = F32REG && !RMS && LNORM_CUDA_FAST_KREUSE;
    /* The centred value of element k of chunk f (x - K - mean; x for RMSNorm). */
    auto cen = [&](const float (&f)[VEC], int k, float d) -> float {
        if constexpr (RMS)
            return f[k];
        else if constexpr (SHIFTED)
            return f[k] - d;
        else
            return (f[k] - K) - d;
    };
    /* RR (k_fast's re-read form, AL rows, one CTA a row): nothing of the
     * row is held between passes; each pass reads its chunks again from
     * global memory (srow: the row), where the first pass left them in
     * the L1 cache (load_rr16). Chunks past the row's end are not read
     * (+0, as AL's loads leave them). Same values, same bits. */
    static_assert(!RR || (AL && !F32REG && !SMR && CL == 1), "RR: the AL form of k_fast");
    /* RR: a pass's loads, all issued before its arithmetic (rr_fill), in
     * CTAs of fewer than 1024 threads (LNORM_CUDA_RR_BATCH; at the
     * 32-register budget of the 1024-thread CTAs it spills, and each chunk
     * is loaded where it is used). */
    constexpr bool RRB = RR && BLOCK < 1024 && LNORM_CUDA_RR_BATCH;
    uint4 rb[RRB ? NCH : 1];
    auto rr_fill = [&](bool last) {
        if constexpr (RRB) {
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                rb[j] = make_uint4(0u, 0u, 0u, 0u);
                if ((j * TPR + t) * VEC < H)
                    rb[j] = last ? load_rr16<true>(srow + (j * TPR + t) * 16) : load_rr16<false>(srow + (j * TPR + t) * 16);
            }
        }
    };
    /* Chunk j of the row as fp32 (last: the output pass). */
    auto chunk = [&](int j, float (&f)[VEC], bool last = false) {
        if constexpr (RRB) {
            unpack<TX, BB>(rb[RRB ? j : 0], f);
        } else if constexpr (RR) {
            /* (The same load as rr_fill's, here where the chunk is used:
             * written out, as a shared helper changed ptxas's schedule.) */
            uint4 u = make_uint4(0u, 0u, 0u, 0u);
            if ((j * TPR + t) * VEC < H)
                u = last ? load_rr16<true>(srow + (j * TPR + t) * 16) : load_rr16<false>(srow + (j * TPR + t) * 16);
            unpack<TX, BB>(u, f);
        } else if constexpr (F32REG) {
#pragma unroll
            for (int k = 0; k < VEC; k++)
                f[k] = fv[j][k];
        } else if constexpr (SMR) {
            /* Every stage of an SMR kernel holds the whole slice capacity
             * (bulk_row_bytes), so a chunk past the row's end reads stale
             * (or never written) bytes inside the stage, which the c0 < H
             * tests of the passes then leave out. */
            unpack<TX, BB>(*reinterpret_cast<const uint4 *>(srow + (j * TPR + t) * 16), f);
        } else {
            unpack<TX, BB>(raw[j], f);
        }
    };
    float d = 0.0f;
    if constexpr (!RMS) {
        float sum = 0.0f;
        rr_fill(false);
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
            float f[VEC];
            chunk(j, f);
            if constexpr (SHIFTED) {
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    fv[j][k] = f[k] = f[k] - K;
            } else if constexpr (!RMS) {
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    f[k] = f[k] - K;
            }
            if (SEL || (WH ? c0 < H : c0 + VEC <= H)) {
                float s2 = sum;
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    s2 += f[k];
                sum = (!SEL || c0 < H) ? s2 : sum; /* SEL: a chunk past the end adds nothing */
            } else if (!WH) {
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    sum += (c0 + k < H) ? f[k] : 0.0f;
            }
        }
        sum = group_sum<TPR, BLOCK, CL>(sum, red, cred, rank, par);
        par++;
        d = H > 0 ? sum / (float)H : 0.0f;
    }
    float sq = 0.0f;
    rr_fill(false);
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
        float f[VEC];
        chunk(j, f);
        if (SEL || (WH ? c0 < H : c0 + VEC <= H)) {
            float q2 = sq;
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                const float e = cen(f, k, d);
                q2 = __fmaf_rn(e, e, q2);
            }
            sq = (!SEL || c0 < H) ? q2 : sq;
        } else if (!WH) {
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                const float e = (c0 + k < H) ? cen(f, k, d) : 0.0f;
                sq = __fmaf_rn(e, e, sq);
            }
        }
    }
    sq = group_sum<TPR, BLOCK, CL>(sq, red, cred, rank, par);
    par++;
    if (!active)
        return; /* nothing below synchronizes */
    const float rstd = make_rstd(sq / (float)H, s->eps, s->eps_mode);
    if (t == 0 && rank == 0) {
        if (s->mean)
            s->mean[r] = K + d;
        if (s->rstd)
            s->rstd[r] = rstd;
    }
    const TP *gp = (const TP *)s->gamma;
    const TP *bp = (const TP *)s->beta;
    const bool gal = ((uintptr_t)gp & 15) == 0;
    const bool bal = ((uintptr_t)bp & 15) == 0;
    if constexpr (GC) {
        if (s != cs) {
            cs = s;
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
                gcache[j] = load_param_raw<TP>(gp, c0, H, gal, 1.0f);
                bcache[j] = load_param_raw<TP>(bp, c0, H, bal, -0.0f);
            }
        }
    }
    TX *yr = (TX *)s->y + r * s->y_stride;
    const bool yal = ((uintptr_t)yr & 15) == 0;
    /* The output pass; g_ / b_: gamma / beta, or a null constant where the
     * caller knows the parameter is absent (so its fills fold away). */
    /* ya: whether y's row is 16-byte aligned, 0 tested chunk by chunk,
     * 1 known aligned, 2 known unaligned (YH below). */
    auto emit = [&](const TP *g_, const TP *b_, auto ya) {
        [[maybe_unused]] constexpr int YA = decltype(ya)::value;
        rr_fill(true);
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
            if (!SEL && c0 >= H)
                continue;
            float f[VEC], g[VEC], b[VEC];
            chunk(j, f, true);
            if constexpr (GC) {
                unpack<TP, BB>(gcache[j], g);
                unpack<TP, BB>(bcache[j], b);
            } else if constexpr (AL) {
                load_param_full<TP, VEC, BB>(g_, c0, 1.0f, g);
                load_param_full<TP, VEC, BB>(b_, c0, -0.0f, b);
            } else {
                load_param<TP, VEC, NC4, BB>(g_, c0, H, gal, 1.0f, g);
                load_param<TP, VEC, NC4, BB>(b_, c0, H, bal, -0.0f, b);
            }
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                const float n = __fmul_rn(cen(f, k, d), rstd);
                f[k] = __fmaf_rn(n, g[k], b[k]); /* as emit_row: explicit roundings */
            }
            if constexpr (SMR && TStore<RMS, CL>::value) {
                if (ts) { /* y goes over x in the stage; k_bulk copies it out */
                    *reinterpret_cast<uint4 *>(const_cast<unsigned char *>(srow) + (j * TPR + t) * 16) = pack<TX>(f);
#if LNORM_CUDA_EMIT_BARRIER
                    if constexpr (!NC4)
                        asm volatile("" ::: "memory"); /* as below: one chunk's parameters at a time */
#endif
                    continue;
                }
            }
            if constexpr (AL)
                store_y16(reinterpret_cast<uint4 *>(yr + c0), pack<TX>(f));
            else if constexpr (XW) {
                if constexpr (YA == 1 && SEL) {
                    store16_if(yr + c0, pack<TX>(f), c0 < H); /* SEL: computed past the row's end, not stored */
                } else if (!SEL || c0 < H) { /* the chunk is whole */
                    if constexpr (YA == 1)
                        store_y16(reinterpret_cast<uint4 *>(yr + c0), pack<TX>(f));
                    else
                        store_raw<TX>(yr, c0, c0 + VEC, YA == 0 && yal, pack<TX>(f));
                }
            }
            else
                store_raw<TX>(yr, c0, H, yal, pack<TX>(f));
#if LNORM_CUDA_EMIT_BARRIER
            if constexpr (!NC4)
                asm volatile("" ::: "memory"); /* one chunk's parameters at a time */
#endif
        }
    };
    /* YH (LNORM_CUDA_YAL_HOIST, session 15): the bulk kernels (XW), whose
     * y rows may or may not be 16-byte aligned, test that once a row and
     * run an output pass for each case, instead of a test and a branch
     * around the element-by-element store in every chunk. Same stores,
     * same bits. */
    constexpr bool YH = XW && !AL && LNORM_CUDA_YAL_HOIST;
    auto emit_y = [&](const TP *g_, const TP *b_) {
        if constexpr (YH) {
            if (yal)
                emit(g_, b_, std::integral_constant<int, 1>{});
            else
                emit(g_, b_, std::integral_constant<int, 2>{});
        } else {
            emit(g_, b_, std::integral_constant<int, 0>{});
        }
    };
    if constexpr (LNORM_CUDA_FAST_PSPEC && !GC) {
        if (gp != nullptr && bp != nullptr)
            emit_y(gp, bp);
        else if (gp != nullptr)
            emit_y(gp, nullptr);
        else
            emit_y(nullptr, bp);
    } else {
        emit_y(gp, bp);
    }
}

/* The LayerNorm shift of a row from its first element (0 if not finite). */
template <typename TX> __device__ __forceinline__ float shift_of(TX v0)
{
    const float k = to_f<TX>(v0);
    return isfinite(k) ? k : 0.0f;
}

/* k_fast: 64 registers a thread (2048 resident threads an SM), the row
 * converted to fp32 once (F32REG), gamma/beta through read-only loads
 * (load_param) with no ordering barrier. The design was measured before it
 * was written here (bench/gpu/kexp.cu, H200, 2026-11-30, round 2): at 64
 * registers and 8 CTAs an SM the same arithmetic ran bf16 LayerNorm at
 * 3781-3860 GB/s for H = 1024-4096, against 3000-3650 at 80-90 registers
 * (5 CTAs) and 2000-3100 where the gamma cache or the caps of k_reg made
 * it spill. */
#ifndef LNORM_CUDA_FAST_REGS
#define LNORM_CUDA_FAST_REGS 72 /* register budget of k_fast in CTAs of up to 128 threads (larger: LNORM_CUDA_FAST_REGS_BIG) */
#endif
#ifndef LNORM_CUDA_FAST_REGS_BIG
#define LNORM_CUDA_FAST_REGS_BIG 64 /* register budget of k_fast in CTAs of 256 threads and more */
#endif
#ifndef LNORM_CUDA_FAST_F32REG
#define LNORM_CUDA_FAST_F32REG 1 /* k_fast converts the row to fp32 once (0: unpacks it in each pass) */
#endif
/* LNORM_CUDA_MIN_BLOCK (lnorm_cuda_impl.h): 32, 64 or 128. */
static_assert(LNORM_CUDA_MIN_BLOCK >= 32 && LNORM_CUDA_MIN_BLOCK <= 128 &&
                  (LNORM_CUDA_MIN_BLOCK & (LNORM_CUDA_MIN_BLOCK - 1)) == 0,
              "LNORM_CUDA_MIN_BLOCK: 32, 64 or 128");
/* CTA size of the fast and bulk kernels of a tier of TPR threads a row. */
template <int TPR> struct FastBlock {
    static constexpr int value = TPR > LNORM_CUDA_MIN_BLOCK ? TPR : LNORM_CUDA_MIN_BLOCK;
};
/* LNORM_CUDA_RR_REGS: register budget of k_fast's re-read form (RR),
 * which holds no row between passes, in CTAs of up to 512 threads (40:
 * 1536 resident threads an SM, no spills with a pass's loads batched);
 * 1024-thread CTAs get 32 (two CTAs an SM). LNORM_CUDA_RR_MIN_TPR
 * (lnorm_cuda_impl.h): the RR form exists in the tiers of at least this
 * many threads a row (fewer kernels to compile). */
#ifndef LNORM_CUDA_RR_REGS
#define LNORM_CUDA_RR_REGS 40
#endif
template <int TPR, int NCH, bool RR = false> struct FastShape {
    static constexpr int block = FastBlock<TPR>::value;
    static constexpr int regs = RR ? (block >= 1024 ? 32 : LNORM_CUDA_RR_REGS)
                                   : block <= 128 ? LNORM_CUDA_FAST_REGS : LNORM_CUDA_FAST_REGS_BIG;
    static constexpr int min_blocks = 65536 / (block * regs) > 0 ? 65536 / (block * regs) : 1;
};

/* MULTI: the launch has a segment table (else the one inline segment,
 * whose fields the compiler then reads from the parameter bank when it
 * needs them instead of holding them in registers). AL (LNORM__FAST_AL,
 * set by the host per segment, lnorm__al_ok; lnorm_cuda_set_tuning
 * "fast_aligned" 0 turns it off): x, y, gamma and beta 16-byte aligned,
 * strides and H whole 16-byte units, so every chunk is either inside the
 * row (one vector access) or outside it (skipped): straight-line vector
 * code without the element-by-element fallbacks. Same operations, same
 * bits. */
template <typename TX, typename TP, bool RMS, int TPR, int NCH, bool MULTI, bool AL = false, bool RR = false>
__global__ void __launch_bounds__(FastShape<TPR, NCH, RR>::block, FastShape<TPR, NCH, RR>::min_blocks)
    k_fast(const __grid_constant__ lnorm__kparams p)
{
    constexpr int BLOCK = FastShape<TPR, NCH>::block;
    constexpr int VEC = (int)(16 / sizeof(TX));
    constexpr int RPC = BLOCK / TPR;
    constexpr bool GC = FastGC<TX, TP, RMS, NCH>::value;
    constexpr int NGC = GC ? NCH : 1;
    __shared__ float red[2][BLOCK / 32];
    const int t = (int)(threadIdx.x % TPR);
    int par = 0;
    uint4 gcache[NGC], bcache[NGC];
    const lnorm__kseg *cs = nullptr; /* segment whose parameters are cached */
    for (int64_t base = (int64_t)blockIdx.x * RPC; base < p.total_rows; base += (int64_t)gridDim.x * RPC) {
        const int64_t row = base + threadIdx.x / TPR;
        const bool active = row < p.total_rows;
        const int64_t rr = active ? row : p.total_rows - 1;
        const lnorm__kseg *s = MULTI ? find_seg(p, rr) : &p.one;
        const int64_t r = rr - s->row_begin;
        const int H = active ? (int)s->hidden : 0;
        const TX *xr = (const TX *)s->x + r * s->x_stride;
        const bool xal = ((uintptr_t)xr & 15) == 0;
        uint4 raw[NCH];
        if constexpr (!RR) {
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                const int c0 = (j * TPR + t) * VEC;
                if constexpr (AL)
                    raw[j] = c0 < H ? load_x16(reinterpret_cast<const uint4 *>(xr + c0)) : make_uint4(0u, 0u, 0u, 0u);
                else
                    raw[j] = load_raw<TX>(xr, c0, H, xal);
            }
        }
        const float K = (!RMS && H > 0) ? shift_of<TX>(xr[0]) : 0.0f;
        fast_row<TX, TP, RMS, TPR, NCH, 1, BLOCK, GC, !RR && LNORM_CUDA_FAST_F32REG != 0, AL, false, false, RR>(
            raw, s, r, H, active, K, 0, t, red, nullptr, par, gcache, bcache, cs,
            reinterpret_cast<const unsigned char *>(xr));
    }
}

/* ---- Bulk-copy path (sm_90) ---------------------------------------------
 * The fast path with the rows staged through shared memory by the copy
 * engine (cp.async.bulk, completion on an mbarrier), in a ring of `stages`
 * tiles per CTA: while a CTA reduces and writes one tile, the next
 * stages - 1 tiles are already on their way, so the bytes in flight no
 * longer depend on registers or on where the warps are in their
 * reductions. A tile is the RPC rows one iteration of k_fast covers (one
 * row for the cluster tiers, where each CTA of the cluster copies its own
 * contiguous slice of the row). Rows are read from shared memory into the
 * same registers, in the same column mapping, and fast_row does the same
 * arithmetic: a row gives the same bits as through k_fast / k_reg.
 * Used for fast-path segments whose rows start 16-byte aligned and are a
 * multiple of 16 bytes long (the host checks; see lnorm__bulk_ok). */
#ifndef LNORM_CUDA_BULK
#define LNORM_CUDA_BULK 1
#endif
#define LNORM__BULK_MAXST 8

/* CTA size and register budget of a bulk kernel: the bytes in flight come
 * from the stages, not from registers, so a thread may use more registers
 * than in k_fast (no spills): up to 128 a thread, and at least two
 * 256-thread CTAs per SM in the one-CTA tiers that hold the row in
 * registers (one CTA alone left its reductions and stores unoverlapped:
 * measured 2026-11-29, bf16 H = 16384 fell to 0.33 of copy). 4-chunk
 * cluster kernels (rows in shared memory, SMR): 64 a thread, which with the
 * 1024-thread CTAs of tier set 7 is one CTA an SM (as for the one-CTA
 * 1024-thread tier, whose launch bounds give it 64 too). */
#ifndef LNORM_CUDA_BULK_XW
#define LNORM_CUDA_BULK_XW 1 /* k_bulk's statistics without element masks (its rows are whole 16-byte units) */
#endif
#ifndef LNORM_CUDA_BULK_F32REG
#define LNORM_CUDA_BULK_F32REG 32 /* k_bulk keeps the row as fp32 in registers up to this many elements a thread */
#endif
#ifndef LNORM_CUDA_CLU_REGS
#define LNORM_CUDA_CLU_REGS 64 /* register budget of the 4-chunk cluster bulk kernels */
#endif
/* LNORM_CUDA_CLU_REGS8 (A/B builds): register budget of the 8-chunk SMR
 * kernels (the cluster tiers of tier sets 0 and 9, tier 14 as 512 x 8 with
 * LNORM_CUDA_T14_1024=0), default 128. */
#ifndef LNORM_CUDA_CLU_REGS8
#define LNORM_CUDA_CLU_REGS8 128
#endif
template <int TPR, int NCH, int CL = 1> struct BulkShape {
    static constexpr int block = FastBlock<TPR>::value;
    /* The row read from its stage in each pass (SMR): the cluster tiers
     * and a one-CTA tier of 1024 threads a row (one CTA an SM, whose
     * registers cannot hold the row). */
    static constexpr bool smr = LNORM__SMR(TPR, CL);
    static constexpr int regs = !smr ? 128 : NCH <= 4 ? LNORM_CUDA_CLU_REGS : LNORM_CUDA_CLU_REGS8;
    static constexpr int min_blocks = 65536 / (block * regs) > 1 ? 65536 / (block * regs) : 1;
};

/* Copy bytes (a multiple of 16, both addresses 16-byte aligned) from global
 * to this CTA's shared memory; completion is counted on mbarrier b. */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *b)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(b))
                 : "memory");
}

/* Copy bytes (a multiple of 16, both addresses 16-byte aligned) from this
 * CTA's shared memory to global memory as one bulk-copy group of the
 * calling thread; bulk_store_wait_read: that thread waits until its groups
 * have read their shared memory (which may then be written again),
 * bulk_store_wait: until their writes are done. */
__device__ __forceinline__ void bulk_store(void *dst, const void *src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_addr(src)),
                 "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
__device__ __forceinline__ void bulk_store_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void bulk_store_wait()
{
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

/* Bytes of a row of rowb bytes in the slice (slice bytes long) that starts
 * at byte off; <= 0 when the row ends before the slice. */
__device__ __forceinline__ int64_t slice_bytes(int64_t rowb, int64_t off, int64_t slice)
{
    const int64_t b = rowb - off;
    return b > slice ? slice : b;
}

/* Shared-memory bytes of one staged row (rs) for a launch: the row itself
 * when every row has the launch's single segment, else the tier's slice
 * capacity (rows of a table launch may differ in length). Kernels that
 * read the row from its stage in every pass (smr: the cluster tiers and a
 * 1024-thread one-CTA tier) always take the capacity: their passes read
 * every chunk of the slice before the masks drop those past the row's end,
 * and those reads must stay inside the stage. Host and device compute it
 * alike. */
__host__ __device__ __forceinline__ int64_t bulk_row_bytes(const lnorm__kparams &p, int64_t slice_cap, int xsz,
                                                          int CL, bool smr)
{
    if (p.table == nullptr && CL == 1 && !smr)
        return p.one.hidden * xsz;
    return slice_cap;
}

/* Warp 0 starts the copies of tile `tile` (rows row0 .. row0 + RPC - 1 of
 * the launch; this CTA's slice of them) into stage buffer dst, counted on
 * bar. Lanes take rows in turn; lane 0 arrives once every lane has added
 * its bytes. A row (or slice) past the end copies nothing. */
template <typename TX, int TPR, int NCH, int CL, int RPC>
__device__ __forceinline__ void bulk_issue(const lnorm__kparams &p, int64_t tile, int rank, unsigned char *dst,
                                           int64_t rs, uint64_t *bar)
{
    constexpr int64_t SLICE = (int64_t)TPR * NCH * 16;
    const int lane = (int)(threadIdx.x & 31);
    const int64_t row0 = tile * RPC;
    if (p.table == nullptr && CL == 1 && !BulkShape<TPR, NCH, CL>::smr && p.one.x_stride == p.one.hidden) {
        /* Contiguous rows of one segment, staged back to back (rs = row
         * bytes): one copy for the tile. */
        if (lane == 0) {
            const int64_t n = (p.total_rows - row0) < RPC ? (p.total_rows - row0) : RPC;
            const uint32_t bytes = (uint32_t)(n * rs);
            mbar_expect_tx(bar, bytes);
            bulk_load(dst, (const TX *)p.one.x + row0 * p.one.hidden, bytes, bar);
        }
    } else {
        for (int g = lane; g < RPC; g += 32) {
            const int64_t row = row0 + g;
            if (row >= p.total_rows)
                break;
            const lnorm__kseg *s = p.table ? find_seg(p, row) : &p.one;
            const int64_t r = row - s->row_begin;
            const int64_t off = (int64_t)rank * SLICE;
            const int64_t bytes = slice_bytes(s->hidden * (int64_t)sizeof(TX), off, SLICE);
            if (bytes <= 0)
                continue;
            mbar_expect_tx(bar, (uint32_t)bytes);
            bulk_load(dst + g * rs, (const unsigned char *)((const TX *)s->x + r * s->x_stride) + off,
                      (uint32_t)bytes, bar);
        }
        __syncwarp();
    }
    if (lane == 0)
        mbar_arrive(bar);
}

/* Dynamic tiles (kparams.sched; the SMR kernels, launches with a
 * workspace). With a fixed share of the tiles (CTA or cluster c takes
 * tiles c, c + grid, ...) the kernel ends with its slowest SM: ncu on the
 * H200 (2026-11-30, a1fc6a0) showed SMs 8-18% of the kernel's time idle
 * at its end (f32 RMSNorm H = 32768: active cycles 21% below the average
 * on the least busy SM, 92% of the elapsed cycles on average). Instead,
 * the tile of each stage fill is a ticket from the global counter
 * sched[0]: warp 0's lane 0 takes one (the first fills take one block of
 * `stages`), and a CTA stops at its first ticket past the last tile. The
 * atomic's result is first needed one fill later (`ahead`), so no warp
 * waits for it. In a cluster, rank 0 alone takes tickets and mails each to
 * its peers (st.async into mail[u % LNORM__TMAIL], counted on that slot's
 * mbarrier) one fill before they need it, so peers' warp 0 does not wait
 * either (two tickets ahead: the one mailed at fill u is the one taken at
 * fill u - 1). A peer of a LayerNorm cluster also bulk-copies the first 16
 * bytes of each of its rows (h[0], the shift) into x0[stage]. Every CTA
 * counts itself in sched[1] at its end; the last puts both counters back
 * to 0 for the next launch on the stream. The tiles a CTA takes change,
 * the rows' results do not (same bits). */
#define LNORM__TMAIL 16 /* mail slots: a peer has at most stages + 1 tickets unread */
/* LNORM_CUDA_DYN_TB_SMEM (A/B builds; default 0): a cluster's rank 0 keeps
 * the ticket it takes ahead in shared memory instead of a register, so its
 * lane 0 waits for the atomic at every fill. With it and dynamic tiles in
 * every cluster (LNORM_CUDA_DYN_LN_CL=16 LNORM_CUDA_DYN_RMS_CL=16) the f32
 * kernels compile without spills and 4 of the bf16 ones spill 8 bytes
 * (ptxas 13.0; without it 6 f32 and 6 bf16 kernels spill 8-16 bytes).
 * Not measured yet. */
#ifndef LNORM_CUDA_DYN_TB_SMEM
#define LNORM_CUDA_DYN_TB_SMEM 0
#endif
/* LNORM_CUDA_X0_BULK (session 15, A/B): the LayerNorm cluster kernels with
 * fixed shares stage h[0] of each row (the shift) in every CTA but rank 0
 * by a 16-byte bulk copy into dt.x0, counted on the row's stage barrier,
 * as with dynamic tiles, instead of a load from global memory at the start
 * of the row (its wait was 1.7% / 3.7% of the stall samples of bf16
 * H = 131072 / f32 H = 262144, bench/results/ncu-src-2026-12-01-f39be75).
 * Same value, same bits. Measured on the H200, two runs (bench/results/
 * kernels-2026-12-01-659281f-x0b-ab{,2}): f32 LayerNorm H = 262144 +0.9% /
 * +1.2%, the other LayerNorm cluster rows -0.7..+0.7%: within about 1%
 * either way, so off. */
#ifndef LNORM_CUDA_X0_BULK
#define LNORM_CUDA_X0_BULK 0
#endif
struct DynTiles {
    int64_t tile[LNORM__BULK_MAXST]; /* the tile in each stage, -1: none (the CTA stops there) */
    int64_t mail[LNORM__TMAIL];      /* cluster peers: tickets from rank 0 */
    uint64_t mbar[LNORM__TMAIL];
    int64_t base;                    /* lane 0 of a fetcher: the first of the tickets of fills 0 .. stages - 1 */
    int64_t ta;                      /* rank 0 of a cluster: the ticket of the next fill u (mailed) */
    int fin;                         /* lane 0 of warp 0: a ticket past the end was seen */
    __align__(16) unsigned char x0[LNORM__BULK_MAXST][16]; /* LayerNorm cluster peers: h[0] */
    int64_t tb; /* LNORM_CUDA_DYN_TB_SMEM: rank 0's ticket of fill u + 2, taken (below) */
};

/* Take n tickets from counter *c (the first one's number). ptxas gathers a
 * warp's atomic additions and broadcasts the result with a shuffle right
 * after the atomic, so the warp waits for it there (also for atom.inc with
 * a wrap of 2^32 - 1, which it turns into an addition). A single ticket is
 * taken by atom.inc with a wrap `lim` known only at run time (the caller's
 * ~0u that the compiler cannot see), which it leaves alone: the result is
 * waited for where it is first used, a fill later. */
__device__ __forceinline__ unsigned ticket_take(unsigned *c, unsigned n, unsigned lim = 0xffffffffu)
{
    unsigned v;
    if (n == 1)
        asm volatile("atom.global.inc.u32 %0, [%1], %2;" : "=r"(v) : "l"(c), "r"(lim) : "memory");
    else
        asm volatile("atom.global.add.u32 %0, [%1], %2;" : "=r"(v) : "l"(c), "r"(n) : "memory");
    return v;
}

/* Store the 8-byte v into CTA `peer`'s copy of *dst and count 8 bytes on its
 * copy of mbarrier *bar (st_async_peer for a ticket). */
__device__ __forceinline__ void st_async_peer_s64(int64_t *dst, int64_t v, uint64_t *bar, uint32_t peer)
{
    uint32_t rd, rb;
    peer_map(dst, bar, peer, rd, rb);
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.s64 [%0], %1, [%2];" ::"r"(rd), "l"(v),
                 "r"(rb)
                 : "memory");
}

template <typename TX, typename TP, bool RMS, int TPR, int NCH, int CL>
__global__ void __launch_bounds__(BulkShape<TPR, NCH, CL>::block, BulkShape<TPR, NCH, CL>::min_blocks)
    k_bulk(const __grid_constant__ lnorm__kparams p, int stages)
{
    constexpr int BLOCK = BulkShape<TPR, NCH>::block;
    constexpr int VEC = (int)(16 / sizeof(TX));
    constexpr int RPC = BLOCK / TPR;
    static_assert(CL == 1 || RPC == 1, "a cluster tier holds one row per CTA");
    /* SMR (BulkShape::smr): every pass reads the row from its stage in
     * shared memory instead of holding it in registers, and the stage is
     * refilled once the row is written (the launcher gives these kernels
     * LNORM_CUDA_SMR_STAGES, two; more can be forced). */
    constexpr bool SMR = BulkShape<TPR, NCH, CL>::smr;
    constexpr bool GC = FastGC<TX, TP, RMS, NCH, true>::value;
    constexpr int NGC = GC ? NCH : 1;
    extern __shared__ __align__(128) unsigned char stage_mem[];
    __shared__ uint64_t bar[LNORM__BULK_MAXST];
    __shared__ float red[2][BLOCK / 32];
    __shared__ ClusterRed<CL, BLOCK / 32> cr;
    __shared__ DynTiles dt;
    void *cred = &cr;
    const int t = (int)(threadIdx.x % TPR);
    const int g = (int)(threadIdx.x / TPR);
    const int lane = (int)(threadIdx.x & 31);
    int rank = 0;
    if constexpr (CL > 1)
        rank = (int)cg::this_cluster().block_rank();
    const int64_t cid = blockIdx.x / CL, ncl = gridDim.x / CL;
    const int64_t rs = bulk_row_bytes(p, (int64_t)TPR * NCH * 16, (int)sizeof(TX), CL, BulkShape<TPR, NCH, CL>::smr);
    const int64_t stage_bytes = rs * RPC;
    const int64_t ntiles = (p.total_rows + RPC - 1) / RPC;
    const bool multi = p.table != nullptr;
    /* Dynamic tiles (DynTiles above): uniform over the grid; compiled in
     * where LNORM__DYN says. */
    constexpr bool DYN = LNORM__DYN(RMS, TPR, CL);
    const bool dyn = DYN && p.sched != nullptr;
    const bool fetcher = CL == 1 || rank == 0; /* takes the tickets */
    if (threadIdx.x == 0) {
        for (int i = 0; i < stages; i++)
            mbar_init(&bar[i], 1);
        if constexpr (DYN) {
            if (dyn && !fetcher)
                for (int i = 0; i < LNORM__TMAIL; i++)
                    mbar_init(&dt.mbar[i], 1);
            dt.fin = 0;
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (CL > 1) {
        cluster_red_init(&cr);
        cg::this_cluster().sync(); /* peers store into cr (and dt.mail) only after its init */
    } else {
        __syncthreads();
    }
    /* dyn, lane 0 of warp 0 of a fetcher: the ticket taken one fill ahead
     * (CL == 1: of fill u + 1; a cluster's rank 0: of fill u + 2), whose
     * value is first needed at the next fill. */
    unsigned ahead = 0;
    /* 2^32 - 1 (total_rows >= 0), the wrap of ticket_take's atom.inc. */
    const unsigned lim = ~(unsigned)(p.total_rows >> 63);
    /* A cluster's rank 0: take the ticket two fills ahead, into `ahead` or
     * (LNORM_CUDA_DYN_TB_SMEM) dt.tb. */
    auto take_ahead = [&]() {
        if constexpr (LNORM_CUDA_DYN_TB_SMEM)
            dt.tb = ticket_take(p.sched, 1u, lim);
        else
            ahead = ticket_take(p.sched, 1u, lim);
    };
    /* dyn, lane 0 of warp 0: the tile of fill u (the u-th row this CTA or
     * cluster takes), -1 if none is left. Fills 0 .. stages - 1 are issued
     * at the start, fill u + stages after fill u's row. */
    auto ticket = [&](int64_t u) -> int64_t {
        if (dt.fin)
            return -1;
        int64_t tk;
        if (fetcher) {
            if (u < stages) {
                tk = dt.base + u;
            } else if constexpr (CL == 1) {
                tk = ahead;
                ahead = ticket_take(p.sched, 1u, lim);
            } else {
                tk = dt.ta;
                dt.ta = LNORM_CUDA_DYN_TB_SMEM ? dt.tb : ahead; /* fill u + 1's, taken at fill u - 1: mail it */
                if (tk < ntiles)
                    for (int k = 1; k < CL; k++)
                        st_async_peer_s64(&dt.mail[(u + 1) % LNORM__TMAIL], dt.ta,
                                          &dt.mbar[(u + 1) % LNORM__TMAIL], (uint32_t)k);
                take_ahead();
            }
        } else {
            const int m = (int)(u % LNORM__TMAIL);
            mbar_arrive_expect_tx(&dt.mbar[m], 8u);
            mbar_wait(&dt.mbar[m], (uint32_t)((u / LNORM__TMAIL) & 1));
            tk = dt.mail[m];
        }
        if (tk >= ntiles) {
            dt.fin = 1;
            tk = -1;
        }
        return tk;
    };
    /* X0B (LNORM_CUDA_X0_BULK) or dyn: a LayerNorm cluster CTA other than
     * rank 0 gets h[0] of the row of tile nt (RPC == 1) into dt.x0[sx] by a
     * bulk copy counted on the stage's barrier (warp 0's lane 0, before
     * bulk_issue's arrive). */
    constexpr bool X0B = CL > 1 && !RMS && LNORM_CUDA_X0_BULK;
    auto x0_issue = [&](int64_t nt, int sx) {
        if constexpr (CL > 1 && !RMS) {
            if (rank != 0 && lane == 0) {
                const lnorm__kseg *s0 = find_seg(p, nt);
                mbar_expect_tx(&bar[sx], 16u);
                bulk_load(dt.x0[sx], (const TX *)s0->x + (nt - s0->row_begin) * s0->x_stride, 16u, &bar[sx]);
            }
        }
    };
    /* Warp 0: stage sx gets fill u's tile (static: tile cid + u * ncl). */
    auto issue = [&](int64_t u, int sx) {
        unsigned char *dst = stage_mem + sx * stage_bytes;
        int64_t nt;
        if (dyn) {
            nt = -1;
            if (lane == 0) {
                nt = ticket(u);
                dt.tile[sx] = nt;
            }
            nt = __shfl_sync(0xffffffffu, nt, 0);
        } else {
            nt = cid + u * ncl;
            if (nt >= ntiles)
                return;
        }
        if (nt < 0) {
            if (lane == 0)
                mbar_arrive(&bar[sx]); /* the stage's "no tile" */
            return;
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        if (dyn || X0B)
            x0_issue(nt, sx);
        bulk_issue<TX, TPR, NCH, CL, RPC>(p, nt, rank, dst, rs, &bar[sx]);
    };
    if constexpr (!DYN) { /* the fixed shares alone */
        if (threadIdx.x < 32)
            for (int i = 0; i < stages; i++)
                if (cid + i * ncl < ntiles) {
                    if constexpr (X0B)
                        x0_issue(cid + i * ncl, i);
                    bulk_issue<TX, TPR, NCH, CL, RPC>(p, cid + i * ncl, rank, stage_mem + i * stage_bytes, rs,
                                                      &bar[i]);
                }
    } else if (threadIdx.x < 32) {
        if (dyn && fetcher && lane == 0) {
            dt.base = ticket_take(p.sched, (unsigned)stages);
            ahead = ticket_take(p.sched, 1u, lim);
            if constexpr (CL > 1) {
                /* Mail fills 0 .. stages (the first past the end last). */
                dt.ta = ahead;
                take_ahead();
                for (int u = 0; u <= stages; u++) {
                    const int64_t tk = u < stages ? dt.base + u : dt.ta;
                    for (int k = 1; k < CL; k++)
                        st_async_peer_s64(&dt.mail[u], tk, &dt.mbar[u], (uint32_t)k);
                    if (tk >= ntiles)
                        break;
                }
            }
        }
        for (int i = 0; i < stages; i++)
            issue(i, i);
    }
    int par = 0;
    uint4 gcache[NGC], bcache[NGC];
    const lnorm__kseg *cs = nullptr;
    int st = 0;
    uint32_t phase = 0;
    for (int64_t k = 0;; k++) {
        int64_t tile;
        if (dyn) {
            mbar_wait(&bar[st], phase);
            tile = dt.tile[st];
            if (tile < 0)
                break;
        } else {
            tile = cid + k * ncl;
            if (tile >= ntiles)
                break;
        }
        const int64_t row = tile * RPC + g;
        const bool active = row < p.total_rows;
        const int64_t rr = active ? row : p.total_rows - 1;
        const lnorm__kseg *s = multi ? find_seg(p, rr) : &p.one;
        const int64_t r = rr - s->row_begin;
        const int H = active ? (int)s->hidden : 0;
        /* A cluster CTA other than rank 0 has not staged h[0]: read it
         * from global memory before waiting, so the load overlaps the wait
         * (dyn or X0B: its 16 bytes were copied into dt.x0 with the slice,
         * read once the stage is complete). */
        TX x0 = TX(0.0f);
        if constexpr (CL > 1 && !RMS && !X0B) {
            if (H > 0 && !dyn)
                x0 = ((const TX *)s->x + r * s->x_stride)[0];
        }
        if (!dyn)
            mbar_wait(&bar[st], phase);
        if constexpr (CL > 1 && !RMS) {
            if (H > 0 && (dyn || X0B))
                x0 = rank == 0 ? *reinterpret_cast<const TX *>(stage_mem + st * stage_bytes)
                               : *reinterpret_cast<const TX *>(dt.x0[st]);
        }
        const unsigned char *src = stage_mem + st * stage_bytes + g * rs;
        uint4 raw[NCH];
        if constexpr (!SMR) {
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
                raw[j] = c0 < H ? *reinterpret_cast<const uint4 *>(src + (int64_t)(j * TPR + t) * 16)
                                : make_uint4(0u, 0u, 0u, 0u);
            }
        }
        float K = 0.0f;
        if (!RMS && H > 0) {
            if constexpr (CL == 1)
                K = shift_of<TX>(*reinterpret_cast<const TX *>(src));
            else
                K = shift_of<TX>(x0);
        }
        /* Stage st is read (SMR: once the row is done): refill it with
         * fill k + stages. */
        auto refill = [&]() {
            __syncthreads();
            if (threadIdx.x < 32) {
                if constexpr (DYN) {
                    if constexpr (SMR && TStore<RMS, CL>::value) /* y's copy has read the stage */
                        if (threadIdx.x == 0)
                            bulk_store_wait_read();
                    issue(k + stages, st);
                } else {
                    /* (The wait above is repeated here rather than hoisted:
                     * hoisted, ptxas 13.0 schedules the RMSNorm kernels of
                     * clusters of 8 and 16 differently.) */
                    const int64_t nt = cid + (k + stages) * ncl;
                    if constexpr (SMR && TStore<RMS, CL>::value) /* y's copy has read the stage */
                        if (threadIdx.x == 0)
                            bulk_store_wait_read();
                    if (nt < ntiles) {
                        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                        if constexpr (X0B)
                            x0_issue(nt, st);
                        bulk_issue<TX, TPR, NCH, CL, RPC>(p, nt, rank, stage_mem + st * stage_bytes, rs, &bar[st]);
                    }
                }
            }
            if (++st == stages) {
                st = 0;
                phase ^= 1u;
            }
        };
        if constexpr (!SMR)
            refill();
        /* TSTORE: this CTA's slice of y (its bytes, 16-byte aligned) is
         * written into the stage and copied out by one bulk copy. */
        constexpr int64_t SLICE = (int64_t)TPR * NCH * 16;
        const int64_t yoff = (int64_t)rank * SLICE;
        TX *yrow = nullptr;
        int64_t ybytes = 0;
        if constexpr (SMR && TStore<RMS, CL>::value) {
            yrow = (TX *)s->y + r * s->y_stride;
            ybytes = slice_bytes(H * (int64_t)sizeof(TX), yoff, SLICE);
        }
        /* The bulk store's group belongs to thread 0, which waits on it in
         * refill() before it issues the stage's reload (bulk_issue: lane 0
         * copies the row when RPC == 1). */
        static_assert(!TStore<RMS, CL>::value || RPC == 1, "bulk y stores: one row a CTA");
        const bool ts = SMR && TStore<RMS, CL>::value && active && ybytes > 0 &&
                        (((uintptr_t)yrow + (uintptr_t)yoff) & 15) == 0;
        fast_row<TX, TP, RMS, TPR, NCH, CL, BLOCK, GC, !SMR && NCH * VEC <= LNORM_CUDA_BULK_F32REG, false, SMR,
                 LNORM_CUDA_BULK_XW != 0>(raw, s, r, H, active, K, rank, t, red, cred, par, gcache, bcache, cs, src,
                                           ts);
        if constexpr (SMR && TStore<RMS, CL>::value) {
            if (ts) { /* uniform over the CTA (one row a CTA) */
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                __syncthreads();
                if (threadIdx.x == 0)
                    bulk_store((unsigned char *)yrow + yoff, src, (uint32_t)ybytes);
            }
        }
        if constexpr (SMR)
            refill();
    }
    if constexpr (SMR && TStore<RMS, CL>::value)
        if (threadIdx.x == 0)
            bulk_store_wait(); /* y's copies done */
    if (dyn && threadIdx.x == 0) {
        /* Every ticket this CTA took is performed before it counts itself;
         * the last CTA puts the counters back for the next launch. */
        __threadfence();
        if (atomicAdd(p.sched + 1, 1u) == gridDim.x - 1) {
            __threadfence();
            atomicExch(p.sched, 0u);
            atomicExch(p.sched + 1, 0u);
        }
    }
    if constexpr (CL > 1)
        cg::this_cluster().sync(); /* no CTA leaves while its shared memory may be read */
}

/* Largest dynamic shared memory of one bulk CTA (dynamic + static must stay
 * under the 227 KiB opt-in of sm_90). The per-SM budget the launcher plans
 * with is lnorm__bulk_smem_kb (lnorm_cuda_set_tuning "bulk_smem_kb") for
 * kernels that hold the row in registers, the whole SM for SMR kernels. */
#define LNORM__BULK_SMEM_CTA (200 * 1024)
/* LNORM_CUDA_SMR_STAGES: the most stages an SMR kernel (the 1024-thread
 * tiers, rows read from shared memory) gets (default 2; at least 2). Until
 * session 11 they took three 64 KiB stages, all the SM's shared memory.
 * Same kernels, same bits, same run on the H200 (bench/results/
 * kernels-2026-11-30-6c1832e-ab.log, run-time variant st2 = two stages
 * against the launcher's three): LayerNorm in clusters +3..+13% (bf16
 * H = 65536 / 131072 / 262144 3505 / 3208 / 3105 against 3304 / 3093 /
 * 2793 GB/s, f32 H = 65536 / 131072 / 262144 3842 / 3783 / 3336 against
 * 3678 / 3362 / 2957), one-CTA tier 10 LayerNorm +1..+3%, RMSNorm
 * +0.3..+2.7%. One row in flight behind the one being normalized is
 * enough for these kernels; a second one made them slower, the more so
 * the larger the cluster (docs/gpu-log.md, session 11). */
#ifndef LNORM_CUDA_SMR_STAGES
#define LNORM_CUDA_SMR_STAGES 2
#endif
static_assert(LNORM_CUDA_SMR_STAGES >= 2 && LNORM_CUDA_SMR_STAGES <= LNORM__BULK_MAXST, "LNORM_CUDA_SMR_STAGES: 2-8");
/* LNORM_CUDA_SMR_MIN_STAGES (A/B builds, default 2): the fewest stages an
 * SMR CTA may take when that lets more CTAs share an SM; 1 lets two
 * 512-thread CTAs of 64 KiB slices (tier set 10) run an SM with one stage
 * each, the other CTA's row in flight instead of a second stage. */
#ifndef LNORM_CUDA_SMR_MIN_STAGES
#define LNORM_CUDA_SMR_MIN_STAGES 2
#endif
static_assert(LNORM_CUDA_SMR_MIN_STAGES >= 1 && LNORM_CUDA_SMR_MIN_STAGES <= 2, "LNORM_CUDA_SMR_MIN_STAGES: 1 or 2");
#define LNORM__BULK_SMEM_SM (227 * 1024) /* shared memory of an sm_90 SM that CTAs may use */


/* Launch the bulk kernel of one tier: choose the number of resident CTAs
 * per SM (register occupancy first) and the stages that fit their shared
 * memory (at least 2, at most LNORM__BULK_MAXST; 3 or more preferred),
 * one wave of persistent CTAs (clusters). Returns the CUDA error;
 * cudaErrorInvalidValue when even two stages do not fit. */
template <typename TX, typename TP, bool RMS, int TPR, int NCH, int CL>
static cudaError_t launch_bulk(const lnorm__kparams *p, cudaStream_t st)
{
    constexpr int BLOCK = BulkShape<TPR, NCH>::block;
    constexpr int RPC = BLOCK / TPR;
    static int occ_cache[64];
    static int attr_set[64];
    int dev = 0, sms = 0;
    cudaError_t e = device_sms(&dev, &sms);
    if (e != cudaSuccess)
        return e;
    auto kern = k_bulk<TX, TP, RMS, TPR, NCH, CL>;
    /* A set-up call that fails leaves nothing launched: clear the error it
     * recorded and let the caller run the kernel without bulk copies. */
    if (dev >= 64 || !attr_set[dev]) {
        e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, LNORM__BULK_SMEM_CTA);
        if (e == cudaSuccess && CL > 8)
            e = cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return cudaErrorInvalidValue;
        }
        if (dev < 64)
            attr_set[dev] = 1;
    }
    int occ = 0;
    if (cached_occupancy(kern, BLOCK, dev, occ_cache, &occ) != cudaSuccess) {
        (void)cudaGetLastError();
        return cudaErrorInvalidValue;
    }
    if (lnorm__bulk_ctas_override > 0 && lnorm__bulk_ctas_override < occ)
        occ = lnorm__bulk_ctas_override;
    const int64_t rs = bulk_row_bytes(*p, (int64_t)TPR * NCH * 16, (int)sizeof(TX), CL, BulkShape<TPR, NCH, CL>::smr);
    const int64_t stage_bytes = rs * RPC;
    /* Every CTA the registers allow, and as many stages as the per-SM
     * budget gives each (at least 2): shared memory beyond the budget is
     * left to the L1 cache, where gamma/beta are read from by every row
     * (measured 2026-11-29: more stages at the cost of L1 were slower). */
    /* SMR kernels (BulkShape::smr): the CTAs the registers allow (one of
     * 1024 threads in tier set 7) share the SM's shared memory, less each
     * CTA's static shared memory and the 1 KiB the SM reserves per CTA,
     * for at most LNORM_CUDA_SMR_STAGES stages each (SMR holds a stage
     * through the whole row); "bulk_smem_kb" does not apply to them. */
    constexpr int64_t static_cta = (int64_t)sizeof(ClusterRed<CL, BLOCK / 32>) + (int64_t)sizeof(DynTiles) +
                                   8 * LNORM__BULK_MAXST +
                                   2 * 4 * (BLOCK / 32) + 1024;
    constexpr bool SMR = BulkShape<TPR, NCH, CL>::smr;
    constexpr int64_t max_st = SMR ? LNORM_CUDA_SMR_STAGES : LNORM__BULK_MAXST;
    int n = occ, stages = 0;
    for (; n >= 1; n--) {
        int64_t per = SMR ? ((int64_t)LNORM__BULK_SMEM_SM - n * static_cta) / n
                          : (int64_t)lnorm__bulk_smem_kb * 1024 / n;
        if (per > LNORM__BULK_SMEM_CTA)
            per = LNORM__BULK_SMEM_CTA;
        int64_t s = per / stage_bytes;
        if (s > max_st)
            s = max_st;
        if (s >= (SMR && n > 1 ? LNORM_CUDA_SMR_MIN_STAGES : 2)) {
            stages = (int)s;
            break;
        }
    }
    if (stages == 0 && 2 * stage_bytes <= LNORM__BULK_SMEM_CTA) {
        n = 1;
        stages = 2;
    }
    if (stages == 0)
        return cudaErrorInvalidValue;
    if (lnorm__bulk_stages_override >= 2 && lnorm__bulk_stages_override <= LNORM__BULK_MAXST &&
        lnorm__bulk_stages_override * stage_bytes <= LNORM__BULK_SMEM_CTA)
        stages = lnorm__bulk_stages_override;
    const size_t smem = (size_t)(stages * stage_bytes);
    const int64_t tiles = (p->total_rows + RPC - 1) / RPC;
    if constexpr (CL == 1) {
        const int64_t cap = (int64_t)sms * n;
        const unsigned grid = (unsigned)(tiles < cap ? tiles : cap);
        kern<<<grid, BLOCK, smem, st>>>(*p, stages);
        return cudaGetLastError();
    } else {
        cudaLaunchAttribute at;
        cudaLaunchConfig_t cfg = cluster_config(CL, dim3(CL * sms, 1, 1), dim3(BLOCK, 1, 1), smem, st, &at);
        int ncl = 0;
        e = cudaOccupancyMaxActiveClusters(&ncl, kern, &cfg);
        if (e != cudaSuccess || ncl < 1) {
            (void)cudaGetLastError();
            return cudaErrorInvalidValue;
        }
        const int64_t cl = tiles < ncl ? tiles : ncl;
        cfg.gridDim = dim3((unsigned)(cl * CL), 1, 1);
        return cudaLaunchKernelEx(&cfg, kern, *p, stages);
    }
}

/* Launch the fast kernel of one CL == 1 tier. Grid (lnorm__fast_grid):
 * one tile per CTA (the block scheduler starts a new CTA, with its loads,
 * as soon as one finishes: 3-10% faster than 4 waves of persistent CTAs
 * at most sizes, bench/results/kernels-2026-11-30-6730fed.json, H200),
 * persistent CTAs for the 1024-thread tier (2-4% faster there). The grid
 * never changes the bits. */
template <typename TX, typename TP, bool RMS, int TPR, int NCH>
static cudaError_t launch_fast(const lnorm__kparams *p, cudaStream_t st)
{
    constexpr int BLOCK = FastShape<TPR, NCH>::block;
    constexpr int RPC = BLOCK / TPR;
    static int cache[6][64]; /* occupancy of each form: table or one segment, general, AL or RR */
    int dev = 0, sms = 0;
    cudaError_t e = device_sms(&dev, &sms);
    if (e != cudaSuccess)
        return e;
    const bool al = (p->fast & LNORM__FAST_AL) != 0; /* set by the host (lnorm__al_ok) */
    /* The re-read form (RR) of the AL form, where compiled and chosen
     * (lnorm__rr_use: "fast_reread"). */
    constexpr bool RRC = TPR >= LNORM_CUDA_RR_MIN_TPR;
    const bool rr = RRC && al && lnorm__rr_use(RMS ? 1 : 0, TPR);
    const int form = (p->table ? 0 : 1) + (al ? 2 : 0) + (rr ? 2 : 0);
    static void (*const kerns[4])(const lnorm__kparams) = {
        k_fast<TX, TP, RMS, TPR, NCH, true>, k_fast<TX, TP, RMS, TPR, NCH, false>,
        k_fast<TX, TP, RMS, TPR, NCH, true, true>, k_fast<TX, TP, RMS, TPR, NCH, false, true>};
    void (*kern)(const lnorm__kparams) = nullptr;
    if constexpr (RRC) {
        if (rr)
            kern = p->table ? k_fast<TX, TP, RMS, TPR, NCH, true, true, true> : k_fast<TX, TP, RMS, TPR, NCH, false, true, true>;
    }
    if (!rr)
        kern = kerns[form];
    int occ = 0;
    e = cached_occupancy(kern, BLOCK, dev, cache[form], &occ);
    if (e != cudaSuccess)
        return e;
    const int64_t need = (p->total_rows + RPC - 1) / RPC;
    const bool all = lnorm__fast_grid == 2 || (lnorm__fast_grid == 0 && (BLOCK < 1024 || rr));
    const int64_t cap = all ? (int64_t)0x7fffffff : (int64_t)sms * occ * 4;
    const unsigned grid = (unsigned)(need < cap ? need : cap);
    kern<<<grid, BLOCK, 0, st>>>(*p);
    e = cudaGetLastError();
    if (e == cudaSuccess && al)
        __atomic_fetch_add(&lnorm__al_launches, 1L, __ATOMIC_RELAXED);
    if (e == cudaSuccess && rr)
        __atomic_fetch_add(&lnorm__rr_launches, 1L, __ATOMIC_RELAXED);
    return e;
}

/* The fast variant p->fast (LNORM__FAST_* plus LNORM__FAST_BULK) of a
 * tier: the bulk-copy kernel when the host marked the launch for it and its
 * stages fit, else k_fast (one CTA per row). *handled = false: the tier has
 * no fast kernel (a cluster tier whose bulk launch does not fit) and the
 * general kernels run it, with the same bits. */
template <typename TX, int TPR, int NCH, int CL>
static cudaError_t launch_fast_tier(const lnorm__kparams *p, cudaStream_t st, bool *handled)
{
    const int v = p->fast & LNORM__FAST_VMASK;
    const bool rms = v == LNORM__FAST_RMS || v == LNORM__FAST_RMS_PF32;
    const bool pf32 = (v == LNORM__FAST_LN_PF32 || v == LNORM__FAST_RMS_PF32) && !std::is_same<TX, float>::value;
    *handled = true;
#if LNORM_CUDA_BULK
    if (p->fast & LNORM__FAST_BULK) { /* set by the host only while bulk is enabled */
        cudaError_t e;
        if (pf32)
            e = rms ? launch_bulk<TX, float, true, TPR, NCH, CL>(p, st) : launch_bulk<TX, float, false, TPR, NCH, CL>(p, st);
        else
            e = rms ? launch_bulk<TX, TX, true, TPR, NCH, CL>(p, st) : launch_bulk<TX, TX, false, TPR, NCH, CL>(p, st);
        if (e != cudaErrorInvalidValue) { /* InvalidValue: the stages do not fit, nothing was launched */
            if (e == cudaSuccess) {
                __atomic_fetch_add(&lnorm__bulk_launches, 1L, __ATOMIC_RELAXED);
                if (p->sched != nullptr && LNORM__DYN(rms, TPR, CL))
                    __atomic_fetch_add(&lnorm__dyn_launches, 1L, __ATOMIC_RELAXED);
            }
            return e;
        }
        __atomic_fetch_add(&lnorm__bulk_fallbacks, 1L, __ATOMIC_RELAXED);
    }
#endif
    if constexpr (CL != 1) {
        *handled = false;
        return cudaSuccess;
    } else {
        if (pf32)
            return rms ? launch_fast<TX, float, true, TPR, NCH>(p, st) : launch_fast<TX, float, false, TPR, NCH>(p, st);
        return rms ? launch_fast<TX, TX, true, TPR, NCH>(p, st) : launch_fast<TX, TX, false, TPR, NCH>(p, st);
    }
}

/* The tier switches of launch_tier, for a tier table T (LNORM__TIERS or,
 * for f32 x, LNORM__TIERS_F32). */
#define LNORM__FAST_SWITCH(T)                                       \
    switch (tier) {                                                 \
        T(LNORM__FCASE)                                             \
    default:                                                        \
        return (int)cudaErrorInvalidValue;                          \
    }
#define LNORM__FCASE(i, tpr, nch, cl)                               \
    case i:                                                         \
        e = launch_fast_tier<TX, tpr, nch, cl>(p, st, &handled);    \
        break;
#define LNORM__REG_SWITCH(T)                                        \
    switch (tier) {                                                 \
        T(LNORM__CASE)                                              \
    case LNORM__NREG_TIERS:                                         \
        return (int)launch_stream<TX>(p, st);                       \
    default:                                                        \
        return (int)cudaErrorInvalidValue;                          \
    }
#define LNORM__CASE(i, tpr, nch, cl)                 \
    case i:                                          \
        e = launch_reg<TX, tpr, nch, cl>(p, st);     \
        break;

/* Launch tier `tier` for x of type TX. The 16-CTA cluster tier needs a
 * non-portable cluster size; where the device refuses it, the streaming
 * tier runs instead. */
template <typename TX> static int launch_tier(int tier, const lnorm__kparams *p, void *stream)
{
    constexpr bool F32 = std::is_same<TX, float>::value;
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e;
#if LNORM_CUDA_FASTPATH
    if (p->fast != LNORM__FAST_NONE && tier < LNORM__NREG_TIERS) {
        bool handled = true;
        if constexpr (F32) {
            LNORM__FAST_SWITCH(LNORM__TIERS_F32)
        } else {
            LNORM__FAST_SWITCH(LNORM__TIERS)
        }
        if (handled)
            return (int)e;
    }
#endif
    if constexpr (F32) {
        LNORM__REG_SWITCH(LNORM__TIERS_F32)
    } else {
        LNORM__REG_SWITCH(LNORM__TIERS)
    }
    if (e != cudaSuccess && tier == LNORM__NREG_TIERS - 1) {
        (void)cudaGetLastError();
        return (int)launch_stream<TX>(p, st);
    }
    return (int)e;
}
#undef LNORM__FAST_SWITCH
#undef LNORM__FCASE
#undef LNORM__REG_SWITCH
#undef LNORM__CASE

} // namespace lnorm_cuda

#endif /* LNORM_CUDA_KERNELS_CUH */
