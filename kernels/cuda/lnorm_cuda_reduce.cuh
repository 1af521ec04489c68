/*
 * Reductions of the CUDA kernels: over the threads of a row (warp shuffles,
 * the CTA's shared memory) and over the CTAs of a cluster (distributed
 * shared memory, mbarriers). Every reduction is a fixed tree: the same
 * operations in the same order whatever the kernel, so a row gives the same
 * bits through every kernel of its tier.
 */
#ifndef LNORM_CUDA_REDUCE_CUH
#define LNORM_CUDA_REDUCE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

namespace lnorm_cuda {

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

/* Wait until the phase with this parity has completed (polling; a
 * suspend-time hint measured no faster). */
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

/* The same for an 8-byte value (a dynamic-tile ticket). */
__device__ __forceinline__ void st_async_peer_s64(int64_t *dst, int64_t v, uint64_t *bar, uint32_t peer)
{
    uint32_t rd, rb;
    peer_map(dst, bar, peer, rd, rb);
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.s64 [%0], %1, [%2];" ::"r"(rd), "l"(v),
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
 * measured form). Each warp reads the slots lane by lane (lane l: slots l,
 * l + 32, ... of slot[b] taken as one array), consecutive addresses (read
 * CTA by CTA they had 8- to 16-way bank conflicts). (These declarations and
 * index forms are ones ptxas compiles without spills at the 64-register
 * budget of the cluster bulk kernels; a separate array per buffer, or a
 * flat slot array, spilled.) */
#define LNORM__CRB 3
template <int CL, int NW> struct ClusterRed {
    uint64_t bar[LNORM__CRB];
    float slot[LNORM__CRB][CL][NW]; /* 4-byte slots (16-byte ones: f32 H = 262144 6% slower) */
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

/* Sum over the TPR threads of a row group, then over the CL CTAs of a
 * cluster. Deterministic (fixed trees); every thread of the group gets the
 * same value. par counts the reductions of the kernel (uniform over the
 * CTA and the cluster): red is double-buffered by its low bit, the cluster
 * slots take par % LNORM__CRB.
 *
 * Clusters of 8 CTAs and more reduce in two levels (f32 LayerNorm
 * H = 131072 / 262144 +6% / +18%, in clusters of 2 and 4 2-3% slower, so
 * not there; H200): the warps' partials go to the CTA's shared memory, one
 * CTA barrier, warp w < CL sums the CTA's NW partials (lane l reads one, a
 * shuffle tree) and sends that CTA total to CTA w, and each warp reads the
 * CL totals (lane k: CTA k's) and sums them by a shuffle tree. Buffers:
 * warp w sends reduction n after the CTA barrier of n, which every warp
 * passes only once it has read n - 1; so a peer's send of n + 2 (after its
 * barrier of n + 2, hence after reduction n + 1 completed there, which
 * needed this CTA's send of n + 1, made after this CTA's barrier of n + 1)
 * comes after every warp here read n: the three buffers of ClusterRed
 * suffice, as does red's double buffer.
 *
 * Smaller clusters (one row per CTA, TPR == BLOCK): the warps' partials go
 * straight to every CTA's slots, and each warp waits only for its own
 * CTA's barrier (no CTA or cluster barrier); lane l sums slots l, l + 32,
 * ... (ClusterRed), then a shuffle tree sums the lanes: every warp of the
 * cluster does the same operations in the same order.
 *
 * One CTA a row of 1024 threads: the CTA level is one shared-memory read
 * and a shuffle tree a warp (bf16 LayerNorm H = 32768 +3%; in CTAs of
 * 64-512 threads up to 8% slower, so there every thread adds the warp
 * partials in turn). Another order, so other bits, the same in every
 * kernel. */
template <int TPR, int BLOCK, int CL>
__device__ __forceinline__ float group_sum(float x, float (*red)[BLOCK / 32], void *crv, int rank, int par)
{
#pragma unroll
    for (int m = (TPR < 32 ? TPR : 32) / 2; m > 0; m >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, m);
    if constexpr (CL >= 8) {
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
        if constexpr (TPR >= 1024) {
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

/* Several sums at once (group_sumv): V = float2 or float4, each of its
 * values summed as group_sum sums one, the same operations in the same
 * order (so the same bits), with the barriers and the cluster exchanges of
 * one. Why: the backward pass's row sums are independent (a and b of a
 * row, or of two rows), and each CTA or cluster barrier is time the rows'
 * bytes are not streaming. */
template <typename V> struct VecOps;
template <> struct VecOps<float2> {
    static __device__ __forceinline__ float2 zero() { return make_float2(0.0f, 0.0f); }
    static __device__ __forceinline__ float2 add(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
    static __device__ __forceinline__ float2 shfl_xor(float2 v, int m)
    {
        return make_float2(__shfl_xor_sync(0xffffffffu, v.x, m), __shfl_xor_sync(0xffffffffu, v.y, m));
    }
    /* st_async_peer of the pair */
    static __device__ __forceinline__ void st_async(float2 *dst, float2 v, uint64_t *bar, uint32_t peer)
    {
        uint32_t rd, rb;
        peer_map(dst, bar, peer, rd, rb);
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(rd),
                     "f"(v.x), "f"(v.y), "r"(rb)
                     : "memory");
    }
};
template <> struct VecOps<float4> {
    static __device__ __forceinline__ float4 zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    static __device__ __forceinline__ float4 add(float4 a, float4 b)
    {
        return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
    static __device__ __forceinline__ float4 shfl_xor(float4 v, int m)
    {
        return make_float4(__shfl_xor_sync(0xffffffffu, v.x, m), __shfl_xor_sync(0xffffffffu, v.y, m),
                           __shfl_xor_sync(0xffffffffu, v.z, m), __shfl_xor_sync(0xffffffffu, v.w, m));
    }
    static __device__ __forceinline__ void st_async(float4 *dst, float4 v, uint64_t *bar, uint32_t peer)
    {
        uint32_t rd, rb;
        peer_map(dst, bar, peer, rd, rb);
        asm volatile(
            "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(rd),
            "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(rb)
            : "memory");
    }
};

/* Cluster reduction state of group_sumv: ClusterRed's buffers with slots
 * of V, and its own barriers, so each kind's reductions count on their own
 * (parv) beside group_sum's. */
template <int CL, int NW, typename V> struct ClusterRedV {
    uint64_t bar[LNORM__CRB];
    V slot[LNORM__CRB][CL][NW];
};
template <int CL, int NW> using ClusterRed2 = ClusterRedV<CL, NW, float2>;
template <int CL, int NW> using ClusterRed4 = ClusterRedV<CL, NW, float4>;

template <int CL, int NW, typename V> __device__ __forceinline__ void cluster_red_init(ClusterRedV<CL, NW, V> *cr)
{
    if (threadIdx.x == 0) {
        for (int i = 0; i < LNORM__CRB; i++)
            mbar_init(&cr->bar[i], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
}

/* group_sum of each value of x. redv: [2][BLOCK / 32] of V; crv:
 * ClusterRedV<CL, BLOCK / 32, V>; parv: this kind's own count. */
template <int TPR, int BLOCK, int CL, typename V>
__device__ __forceinline__ V group_sumv(V x, V (*redv)[BLOCK / 32], void *crv, int rank, int parv)
{
    using O = VecOps<V>;
#pragma unroll
    for (int m = (TPR < 32 ? TPR : 32) / 2; m > 0; m >>= 1)
        x = O::add(x, O::shfl_xor(x, m));
    if constexpr (CL >= 8) {
        static_assert(TPR == BLOCK, "a cluster tier holds one row per CTA");
        constexpr int NW = BLOCK / 32;
        static_assert(NW <= 32 && CL <= 32, "one slot a lane");
        ClusterRedV<CL, NW, V> *cr = static_cast<ClusterRedV<CL, NW, V> *>(crv);
        const int b = parv % LNORM__CRB;
        const int lane = (int)(threadIdx.x & 31);
        const int w = (int)(threadIdx.x / 32);
        if (lane == 0)
            redv[parv & 1][w] = x;
        if (threadIdx.x == 0)
            mbar_arrive_expect_tx(&cr->bar[b], (uint32_t)(CL * sizeof(V)));
        __syncthreads();
        V *tot = &cr->slot[b][0][0];
        if (w < CL) {
            V c = lane < NW ? redv[parv & 1][lane] : O::zero();
#pragma unroll
            for (int m = 16; m > 0; m >>= 1)
                c = O::add(c, O::shfl_xor(c, m));
            if (lane == 0)
                for (int k = w; k < CL; k += NW)
                    O::st_async(tot + rank, c, &cr->bar[b], (uint32_t)k);
        }
        mbar_wait(&cr->bar[b], (uint32_t)((parv / LNORM__CRB) & 1));
        V v = lane < CL ? tot[lane] : O::zero();
#pragma unroll
        for (int m = 16; m > 0; m >>= 1)
            v = O::add(v, O::shfl_xor(v, m));
        x = v;
    } else if constexpr (CL > 1) {
        static_assert(TPR == BLOCK, "a cluster tier holds one row per CTA");
        constexpr int NW = BLOCK / 32;
        ClusterRedV<CL, NW, V> *cr = static_cast<ClusterRedV<CL, NW, V> *>(crv);
        const int b = parv % LNORM__CRB;
        const int lane = (int)(threadIdx.x & 31);
        if (threadIdx.x == 0)
            mbar_arrive_expect_tx(&cr->bar[b], (uint32_t)(CL * NW * sizeof(V)));
        if (lane < CL)
            O::st_async(&cr->slot[b][rank][threadIdx.x / 32], x, &cr->bar[b], (uint32_t)lane);
        mbar_wait(&cr->bar[b], (uint32_t)((parv / LNORM__CRB) & 1));
        V v = O::zero();
#pragma unroll
        for (int i = 0; i < (CL * NW + 31) / 32; i++)
            if (i * 32 + lane < CL * NW)
                v = O::add(v, (&cr->slot[0][0][0])[b * CL * NW + i * 32 + lane]);
#pragma unroll
        for (int m = 16; m > 0; m >>= 1)
            v = O::add(v, O::shfl_xor(v, m));
        x = v;
    } else if constexpr (TPR > 32) {
        constexpr int WPG = TPR / 32;
        if ((threadIdx.x & 31) == 0)
            redv[parv & 1][threadIdx.x / 32] = x;
        __syncthreads();
        const int w0 = (int)(threadIdx.x / TPR) * WPG;
        if constexpr (TPR >= 1024) {
            x = redv[parv & 1][w0 + (int)(threadIdx.x & (WPG - 1))];
#pragma unroll
            for (int m = WPG / 2; m > 0; m >>= 1)
                x = O::add(x, O::shfl_xor(x, m));
        } else {
            x = O::zero();
#pragma unroll
            for (int i = 0; i < WPG; i++)
                x = O::add(x, redv[parv & 1][w0 + i]);
        }
    }
    return x;
}

/* Whether v holds for any row of the threads that reduce together (every
 * thread calls it, as group_sum): the rows of a warp (TPR <= 32, whose
 * shuffles take the whole warp), of the CTA (32 < TPR < BLOCK, whose
 * reductions take the CTA's barrier), or the one row of a CTA or cluster,
 * for which v is the same in every thread already. */
template <int TPR, int BLOCK> __device__ __forceinline__ bool group_any(bool v)
{
    if constexpr (TPR >= BLOCK)
        return v;
    else if constexpr (TPR <= 32)
        return __any_sync(0xffffffffu, v);
    else
        return __syncthreads_or(v) != 0;
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

} // namespace lnorm_cuda

#endif /* LNORM_CUDA_REDUCE_CUH */
