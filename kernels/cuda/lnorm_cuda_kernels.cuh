/*
 * The CUDA kernels of the normalization core, as templates; each
 * lnorm_cuda_<dtype>.cu instantiates them for one x dtype. Numerics are
 * those of kernels/core/lnorm_core.h. The design (tiers, vectors, clusters)
 * is described in docs/gpu.md.
 *
 * Column mapping. x is read in chunks of VEC = 16 / sizeof(x) elements.
 * Chunk j of thread t of CTA rank k (of CL CTAs on one row) covers columns
 * [c * VEC, c * VEC + VEC) with c = (j * CL + k) * TPR + t. The mapping
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
 * >= H read as 0. al: p is chunk_aligned. */
template <typename T, int N>
__device__ __forceinline__ void load_chunk(const T *p, int64_t c0, int64_t H, bool al, float (&v)[N])
{
    constexpr int S = Sub<T, N>::value;
    if (al && c0 + N <= H) {
#pragma unroll
        for (int s = 0; s < N; s += S) {
            const Pack<T, S> pk = *reinterpret_cast<const Pack<T, S> *>(p + c0 + s);
#pragma unroll
            for (int k = 0; k < S; k++)
                v[s + k] = to_f<T>(pk.e[k]);
        }
    } else {
#pragma unroll
        for (int k = 0; k < N; k++)
            v[k] = (c0 + k < H) ? to_f<T>(p[c0 + k]) : 0.0f;
    }
}

/* Store the N-element chunk at column c0 of row p (columns >= H untouched). */
template <typename T, int N>
__device__ __forceinline__ void store_chunk(T *p, int64_t c0, int64_t H, bool al, const float (&v)[N])
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

/* Sum over the TPR threads of a row group, then over the CL CTAs of a
 * cluster. Deterministic (fixed trees); every thread of the group gets the
 * same value. red/cred are double-buffered by the reduction counter. */
template <int TPR, int BLOCK, int CL>
__device__ __forceinline__ float group_sum(float x, float (*red)[BLOCK / 32], float *cred, int par)
{
#pragma unroll
    for (int m = (TPR < 32 ? TPR : 32) / 2; m > 0; m >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, m);
    if constexpr (TPR > 32) {
        constexpr int WPG = TPR / 32;
        if ((threadIdx.x & 31) == 0)
            red[par][threadIdx.x / 32] = x;
        __syncthreads();
        const int w0 = (int)(threadIdx.x / TPR) * WPG;
        x = 0.0f;
#pragma unroll
        for (int i = 0; i < WPG; i++)
            x += red[par][w0 + i];
    }
    if constexpr (CL > 1) {
        cg::cluster_group cl = cg::this_cluster();
        if (threadIdx.x == 0)
            cred[par] = x;
        cl.sync();
        x = 0.0f;
#pragma unroll
        for (int k = 0; k < CL; k++)
            x += *cl.map_shared_rank(&cred[par], k);
    }
    return x;
}

/* Normalize the row held in v and store y (TY) with gamma/beta of TP. */
template <typename TY, typename TP, int NCH, int VEC, int TPR, int CL>
__device__ __forceinline__ void emit_row(const float (&v)[NCH][VEC], const lnorm__kseg *s, int64_t r,
                                         int64_t H, int rank, int t, float mean, float rstd)
{
    TY *yr = (TY *)s->y + r * s->y_stride;
    const TP *gp = (const TP *)s->gamma;
    const TP *bp = (const TP *)s->beta;
    const bool yal = chunk_aligned<TY, VEC>(yr);
    const bool gal = gp && chunk_aligned<TP, VEC>(gp);
    const bool bal = bp && chunk_aligned<TP, VEC>(bp);
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        const int64_t c0 = ((int64_t)(j * CL + rank) * TPR + t) * VEC;
        if (c0 >= H)
            continue;
        float g[VEC], b[VEC], o[VEC];
        if (gp)
            load_chunk<TP, VEC>(gp, c0, H, gal, g);
        if (bp)
            load_chunk<TP, VEC>(bp, c0, H, bal, b);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            float n = (v[j][k] - mean) * rstd;
            if (gp)
                n = n * g[k];
            if (bp)
                n = n + b[k];
            o[k] = n;
        }
        store_chunk<TY, VEC>(yr, c0, H, yal, o);
    }
}

/* Dispatch emit_row on the run-time y and parameter dtypes. */
template <typename TX, int NCH, int VEC, int TPR, int CL>
__device__ __forceinline__ void emit_any(const float (&v)[NCH][VEC], const lnorm__kseg *s, int64_t r,
                                         int64_t H, int rank, int t, float mean, float rstd)
{
    const bool pf32 = s->param_dtype == LNORM_DTYPE_F32;
    switch (s->y_dtype) {
    case LNORM_DTYPE_F32:
        if (pf32)
            emit_row<float, float, NCH, VEC, TPR, CL>(v, s, r, H, rank, t, mean, rstd);
        else
            emit_row<float, TX, NCH, VEC, TPR, CL>(v, s, r, H, rank, t, mean, rstd);
        break;
    case LNORM_DTYPE_F16:
        if (pf32)
            emit_row<__half, float, NCH, VEC, TPR, CL>(v, s, r, H, rank, t, mean, rstd);
        else
            emit_row<__half, TX, NCH, VEC, TPR, CL>(v, s, r, H, rank, t, mean, rstd);
        break;
    default:
        if (pf32)
            emit_row<__nv_bfloat16, float, NCH, VEC, TPR, CL>(v, s, r, H, rank, t, mean, rstd);
        else
            emit_row<__nv_bfloat16, TX, NCH, VEC, TPR, CL>(v, s, r, H, rank, t, mean, rstd);
        break;
    }
}

/* Load one chunk of h: x, or round_to_x(x + residual) with residual_out
 * written. */
template <typename TX, int VEC>
__device__ __forceinline__ void load_h(const TX *xr, bool xal, const TX *rr, bool ral, TX *ror, bool oal,
                                       int64_t c0, int64_t H, float (&v)[VEC])
{
    load_chunk<TX, VEC>(xr, c0, H, xal, v);
    if (rr) {
        float a[VEC];
        load_chunk<TX, VEC>(rr, c0, H, ral, a);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            v[k] = to_f<TX>(from_f<TX>(v[k] + a[k]));
        store_chunk<TX, VEC>(ror, c0, H, oal, v);
    }
}

/* Register tiers: a row held in registers by TPR threads (x E elements),
 * BLOCK / TPR rows per CTA, or one row over a cluster of CL CTAs. Loops
 * over rows (uniformly per CTA / cluster) until the launch's rows are done. */
template <typename TX, int TPR, int E, int CL>
__global__ void __launch_bounds__(TPR > 128 ? TPR : 128, 1)
    k_reg(const __grid_constant__ lnorm__kparams p)
{
    constexpr int BLOCK = TPR > 128 ? TPR : 128;
    constexpr int VEC = (int)(16 / sizeof(TX));
    constexpr int NCH = E / VEC;
    constexpr int RPC = BLOCK / TPR;
    static_assert(E % VEC == 0, "E must be a multiple of the vector width");
    __shared__ float red[2][BLOCK / 32];
    __shared__ float cred[2];
    const int t = (int)(threadIdx.x % TPR);
    int rank = 0;
    if constexpr (CL > 1)
        rank = (int)cg::this_cluster().block_rank();
    const int64_t cid = blockIdx.x / CL, ncl = gridDim.x / CL;
    int par = 0;
    for (int64_t base = cid * RPC; base < p.total_rows; base += ncl * RPC) {
        const int64_t row = base + threadIdx.x / TPR;
        const bool active = row < p.total_rows;
        const lnorm__kseg *s = find_seg(p, active ? row : base);
        const int64_t r = (active ? row : base) - s->row_begin;
        const int64_t H = active ? s->hidden : 0;
        const bool rms = s->op == LNORM_OP_RMSNORM;

        const TX *xr = (const TX *)s->x + r * s->x_stride;
        const TX *rr = s->res ? (const TX *)s->res + r * s->res_stride : nullptr;
        TX *ror = s->res ? (TX *)s->res_out + r * s->res_out_stride : nullptr;
        const bool xal = chunk_aligned<TX, VEC>(xr);
        const bool ral = rr && chunk_aligned<TX, VEC>(rr);
        const bool oal = ror && chunk_aligned<TX, VEC>(ror);

        float v[NCH][VEC];
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int64_t c0 = ((int64_t)(j * CL + rank) * TPR + t) * VEC;
            load_h<TX, VEC>(xr, xal, rr, ral, ror, oal, c0, H, v[j]);
        }

        float mean = 0.0f;
        /* With one row per CTA the op is uniform and RMSNorm skips the sum;
         * with several rows per CTA every group reduces (shuffles are
         * warp-wide), and RMSNorm ignores the result. */
        if (RPC > 1 || !rms) {
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < NCH; j++)
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    sum += v[j][k];
            sum = group_sum<TPR, BLOCK, CL>(sum, red, cred, par);
            par ^= 1;
            if (!rms)
                mean = sum / (float)H;
        }
        float sq = 0.0f;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int64_t c0 = ((int64_t)(j * CL + rank) * TPR + t) * VEC;
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                const float d = (c0 + k < H) ? v[j][k] - mean : 0.0f;
                sq += d * d;
            }
        }
        sq = group_sum<TPR, BLOCK, CL>(sq, red, cred, par);
        par ^= 1;
        const float rstd = make_rstd(sq / (float)H, s->eps, s->eps_mode);
        if (active && t == 0 && rank == 0) {
            if (s->mean)
                s->mean[r] = mean;
            if (s->rstd)
                s->rstd[r] = rstd;
        }
        if (active)
            emit_any<TX, NCH, VEC, TPR, CL>(v, s, r, H, rank, t, mean, rstd);
    }
    if constexpr (CL > 1)
        cg::this_cluster().sync(); /* no CTA leaves while its shared memory may be read */
}

/* (count, mean, M2) merge of Chan et al.; b may be empty. */
__device__ __forceinline__ void chan_merge(float &n, float &m, float &M2, float nb, float mb, float M2b)
{
    const float nn = n + nb;
    if (nb == 0.0f)
        return;
    const float d = mb - m;
    const float w = nb / nn;
    m = m + d * w;
    M2 = M2 + M2b + d * d * n * w;
    n = nn;
}

/* Streaming tier for rows too long to hold on chip: one 1024-thread CTA per
 * row; pass 1 computes h (writing residual_out) and per-chunk statistics
 * merged with Chan's formula; pass 2 re-reads h (x, or residual_out which
 * holds exactly h) and writes y. x is read twice. */
template <typename TX>
__global__ void __launch_bounds__(1024, 1) k_stream(const __grid_constant__ lnorm__kparams p)
{
    constexpr int BLOCK = 1024;
    constexpr int VEC = (int)(16 / sizeof(TX));
    __shared__ float sn[32], sm[32], sM2[32];
    __shared__ float res_mean, res_var;
    const int t = threadIdx.x;
    for (int64_t row = blockIdx.x; row < p.total_rows; row += gridDim.x) {
        const lnorm__kseg *s = find_seg(p, row);
        const int64_t r = row - s->row_begin;
        const int64_t H = s->hidden;
        const bool rms = s->op == LNORM_OP_RMSNORM;
        const TX *xr = (const TX *)s->x + r * s->x_stride;
        const TX *rr = s->res ? (const TX *)s->res + r * s->res_stride : nullptr;
        TX *ror = s->res ? (TX *)s->res_out + r * s->res_out_stride : nullptr;
        const bool xal = chunk_aligned<TX, VEC>(xr);
        const bool ral = rr && chunk_aligned<TX, VEC>(rr);
        const bool oal = ror && chunk_aligned<TX, VEC>(ror);

        float n = 0.0f, m = 0.0f, M2 = 0.0f;
        for (int64_t c0 = (int64_t)t * VEC; c0 < H; c0 += (int64_t)BLOCK * VEC) {
            float v[VEC];
            load_h<TX, VEC>(xr, xal, rr, ral, ror, oal, c0, H, v);
            const int cnt = (int)(H - c0 < VEC ? H - c0 : VEC);
            if (rms) {
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    M2 += v[k] * v[k]; /* masked columns are 0 */
            } else {
                float cs = 0.0f;
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    cs += v[k];
                const float cm = cs / (float)cnt;
                float c2 = 0.0f;
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    const float d = (k < cnt) ? v[k] - cm : 0.0f;
                    c2 += d * d;
                }
                chan_merge(n, m, M2, (float)cnt, cm, c2);
            }
        }
        /* Merge over the warp, then over the 32 warps (fixed trees). */
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float nb = __shfl_xor_sync(0xffffffffu, n, o);
            const float mb = __shfl_xor_sync(0xffffffffu, m, o);
            const float M2b = __shfl_xor_sync(0xffffffffu, M2, o);
            if (rms)
                M2 += M2b;
            else
                chan_merge(n, m, M2, nb, mb, M2b);
        }
        if ((t & 31) == 0) {
            sn[t / 32] = n;
            sm[t / 32] = m;
            sM2[t / 32] = M2;
        }
        __syncthreads();
        if (t < 32) {
            n = sn[t];
            m = sm[t];
            M2 = sM2[t];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float nb = __shfl_xor_sync(0xffffffffu, n, o);
                const float mb = __shfl_xor_sync(0xffffffffu, m, o);
                const float M2b = __shfl_xor_sync(0xffffffffu, M2, o);
                if (rms)
                    M2 += M2b;
                else
                    chan_merge(n, m, M2, nb, mb, M2b);
            }
            if (t == 0) {
                res_mean = rms ? 0.0f : m;
                res_var = M2 / (float)H;
            }
        }
        __syncthreads();
        const float mean = res_mean;
        const float rstd = make_rstd(res_var, s->eps, s->eps_mode);
        if (t == 0) {
            if (s->mean)
                s->mean[r] = mean;
            if (s->rstd)
                s->rstd[r] = rstd;
        }
        /* Pass 2: h again (each thread re-reads the chunks it wrote). */
        const TX *hr = ror ? ror : xr;
        const bool hal = ror ? oal : xal;
        for (int64_t c0 = (int64_t)t * VEC; c0 < H; c0 += (int64_t)BLOCK * VEC) {
            float v[1][VEC];
            load_chunk<TX, VEC>(hr, c0, H, hal, v[0]);
            /* emit_any with NCH = 1, TPR = 1, CL = 1 maps chunk 0 of
             * "thread" c0 / VEC to column c0. */
            emit_any<TX, 1, VEC, 1, 1>(v, s, r, H, 0, (int)(c0 / VEC), mean, rstd);
        }
        __syncthreads(); /* res_mean/res_var reused by the next row */
    }
}

/* Launch one register tier; grid capped at a few waves of resident CTAs
 * (clusters: the number of co-resident clusters). Returns the CUDA error. */
template <typename TX, int TPR, int E, int CL>
static cudaError_t launch_reg(const lnorm__kparams *p, cudaStream_t st)
{
    constexpr int BLOCK = TPR > 128 ? TPR : 128;
    constexpr int RPC = BLOCK / TPR;
    static int cache[64]; /* per device: occupancy (CTAs/SM or clusters), 0 = unknown */
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return e;
    auto kern = k_reg<TX, TPR, E, CL>;
    if constexpr (CL == 1) {
        int occ = dev < 64 ? cache[dev] : 0;
        if (occ <= 0) {
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, BLOCK, 0);
            if (e != cudaSuccess)
                return e;
            if (occ < 1)
                occ = 1;
            if (dev < 64)
                cache[dev] = occ;
        }
        const int64_t need = (p->total_rows + RPC - 1) / RPC;
        const int64_t cap = (int64_t)sms * occ * 4;
        const unsigned grid = (unsigned)(need < cap ? need : cap);
        kern<<<grid, BLOCK, 0, st>>>(*p);
        return cudaGetLastError();
    } else {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = CL;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.blockDim = dim3(BLOCK, 1, 1);
        cfg.dynamicSmemBytes = 0;
        cfg.stream = st;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        int ncl = dev < 64 ? cache[dev] : 0;
        if (ncl <= 0) {
            cfg.gridDim = dim3(CL * sms, 1, 1);
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
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return e;
    const int64_t cap = (int64_t)sms * 2;
    const unsigned grid = (unsigned)(p->total_rows < cap ? p->total_rows : cap);
    k_stream<TX><<<grid, 1024, 0, st>>>(*p);
    return cudaGetLastError();
}

/* Launch tier `tier` for x of type TX. */
template <typename TX> static int launch_tier(int tier, const lnorm__kparams *p, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    switch (tier) {
#define LNORM__CASE(i, tpr, e, cl) \
    case i:                        \
        return (int)launch_reg<TX, tpr, e, cl>(p, st);
        LNORM__TIERS(LNORM__CASE)
#undef LNORM__CASE
    case LNORM__NREG_TIERS:
        return (int)launch_stream<TX>(p, st);
    default:
        return (int)cudaErrorInvalidValue;
    }
}

} // namespace lnorm_cuda

#endif /* LNORM_CUDA_KERNELS_CUH */
