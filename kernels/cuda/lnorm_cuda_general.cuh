/*
 * The general kernels: every segment the fast kernels do not take (a
 * residual, y of another dtype, parameters of a third dtype), in every
 * tier. k_reg holds a row in registers (one CTA or one cluster a row, or
 * several rows a CTA); k_stream streams rows longer than the largest
 * cluster holds.
 */
#ifndef LNORM_CUDA_GENERAL_CUH
#define LNORM_CUDA_GENERAL_CUH

#include <cooperative_groups.h>

#include "lnorm_cuda_io.cuh"
#include "lnorm_cuda_reduce.cuh"

namespace lnorm_cuda {

namespace cg = cooperative_groups;

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

/* CTA size and minimum resident CTAs of a register tier in the general
 * kernels (k_reg): CTAs of at least 128 threads, a register budget of 80 a
 * thread (what 4 chunks need without spills). */
template <int TPR, int NCH> struct RegShape {
    static_assert(NCH <= 4, "the register budget is that of 4 chunks a thread");
    static constexpr int block = TPR > 128 ? TPR : 128;
    static constexpr int regs = 80;
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

/* Locate the row of this thread's group starting at item base, load its
 * chunks of h (residual_out written) and its shift K. Item i is row i, or
 * in the list form (LIST, the drain) row list[i] of the launch's rescue
 * list when list is not NULL, for i < items. */
template <typename TX, int TPR, int NCH, int CL, bool LIST = false>
__device__ __forceinline__ RowState fetch_row(const lnorm__kparams &p, int64_t base, int rank, int t,
                                              uint4 (&raw)[NCH], const int64_t *list = nullptr, int64_t items = 0)
{
    constexpr int VEC = (int)(16 / sizeof(TX));
    RowState st;
    int64_t row = base + threadIdx.x / TPR;
    if constexpr (LIST)
        row = row >= items ? p.total_rows : list ? list[row] : row;
    st.active = row >= 0 && row < p.total_rows;
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
 * until the launch's rows are done. (Loading the next row before reducing
 * this one was slower in every case measured.)
 * LIST: the drain of a fast or bulk launch of the same parameters
 * (lnorm__rescue): the rows on its rescue list, or every row once the
 * count passed the list's capacity; nothing when the list is empty. Its
 * last CTA empties the list for the next launch on the stream. */
template <typename TX, int TPR, int NCH, int CL, bool LIST = false>
__global__ void __launch_bounds__(RegShape<TPR, NCH>::block, RegShape<TPR, NCH>::min_blocks)
    k_reg(const __grid_constant__ lnorm__kparams p)
{
    constexpr int BLOCK = RegShape<TPR, NCH>::block;
    constexpr int VEC = (int)(16 / sizeof(TX));
    constexpr int RPC = BLOCK / TPR;
    const int64_t *list = nullptr;
    int64_t items = p.total_rows;
    if constexpr (LIST) {
        grid_dep_wait();
        const unsigned n = *(volatile const unsigned *)&p.rescue->count;
        if (n == 0)
            return; /* every CTA (of a cluster too) reads the same count */
        if (n <= LNORM__RESCUE_CAP) {
            list = p.rescue->rows;
            items = n;
        }
    }
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
    RowState cur = fetch_row<TX, TPR, NCH, CL, LIST>(p, base, rank, t, raw, list, items);
    while (base < items) {
        const int64_t nbase = base + ncl * RPC;

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
        float rstd = make_rstd(sq / (float)H, s->eps, s->eps_mode);
        /* The rescue (rescale.h). The fast kernels leave the rows that need
         * it to this kernel (its list form), so they are computed here
         * whichever kernel the launch took. */
        const bool need = cur.active && lnorm__rescale_needed(sq / (float)H, s->eps);
        if (group_any<TPR, BLOCK>(need)) {
            const float sc = lnorm__rescale_factor(sq / (float)H);
            float ds = 0.0f;
            if (RPC > 1 || !rms) {
                float a = 0.0f;
#pragma unroll
                for (int j = 0; j < NCH; j++) {
                    const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
                    float f[VEC];
                    unpack<TX, false>(raw[j], f);
#pragma unroll
                    for (int k = 0; k < VEC; k++)
                        a = __fadd_rn(a, (c0 + k < H) ? __fmul_rn(f[k] - K, sc) : 0.0f);
                }
                a = group_sum<TPR, BLOCK, CL>(a, red, cred, rank, par);
                par++;
                if (!rms)
                    ds = a / (float)H;
            }
            float b = 0.0f;
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                const int c0 = ((rank * NCH + j) * TPR + t) * VEC;
                float f[VEC];
                unpack<TX, false>(raw[j], f);
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    const float e = (c0 + k < H) ? __fsub_rn(__fmul_rn(f[k] - K, sc), ds) : 0.0f;
                    b = __fmaf_rn(e, e, b);
                }
            }
            b = group_sum<TPR, BLOCK, CL>(b, red, cred, rank, par);
            par++;
            if (need)
                lnorm__rescaled(ds, b / (float)H, sc, s->eps, s->eps_mode, &d, &rstd);
        }
        if (cur.active && t == 0 && rank == 0) {
            if (s->mean)
                s->mean[cur.r] = K + d;
            if (s->rstd)
                s->rstd[cur.r] = rstd;
        }
        if (cur.active)
            emit_any<TX, NCH, TPR, CL>(raw, s, cur.r, H, rank, t, K, d, rstd);
        base = nbase;
        if (base < items)
            cur = fetch_row<TX, TPR, NCH, CL, LIST>(p, base, rank, t, raw, list, items);
    }
    if constexpr (CL > 1)
        cg::this_cluster().sync(); /* no CTA leaves while its shared memory may be read */
    if constexpr (LIST) {
        __syncthreads(); /* every thread of the CTA has read the count and its rows */
        if (threadIdx.x == 0) {
            __threadfence();
            if (atomicAdd(&p.rescue->done, 1u) == gridDim.x - 1) {
                atomicExch(&p.rescue->count, 0u);
                atomicExch(&p.rescue->done, 0u);
            }
        }
    }
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
        float rstd = make_rstd(var, s->eps, s->eps_mode);
        if (lnorm__rescale_needed(var, s->eps)) { /* the rescue (rescale.h); one row a CTA: uniform */
            const float sc = lnorm__rescale_factor(var);
            float ds = 0.0f;
            if (!rms) {
                float sa = 0.0f, ca = 0.0f;
                for (int c0 = t * VEC; c0 < H; c0 += BLOCK * VEC) {
                    float f[VEC];
                    unpack<TX, false>(load_raw<TX>(hr, c0, H, hal), f);
                    float cs = 0.0f;
#pragma unroll
                    for (int k = 0; k < VEC; k++)
                        cs = __fadd_rn(cs, (c0 + k < H) ? __fmul_rn(f[k] - K, sc) : 0.0f);
                    kahan(sa, ca, cs);
                }
                ds = block_sum_1024(sa, buf) / (float)H;
            }
            float sb = 0.0f, cb = 0.0f;
            for (int c0 = t * VEC; c0 < H; c0 += BLOCK * VEC) {
                float f[VEC];
                unpack<TX, false>(load_raw<TX>(hr, c0, H, hal), f);
                float cs = 0.0f;
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    const float e = (c0 + k < H) ? __fsub_rn(__fmul_rn(f[k] - K, sc), ds) : 0.0f;
                    cs = __fmaf_rn(e, e, cs);
                }
                kahan(sb, cb, cs);
            }
            lnorm__rescaled(ds, block_sum_1024(sb, buf) / (float)H, sc, s->eps, s->eps_mode, &d, &rstd);
        }
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

} // namespace lnorm_cuda

#endif /* LNORM_CUDA_GENERAL_CUH */
