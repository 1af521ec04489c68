/*
 * The backward pass's kernels (kernels/core/lnorm_core.h, "Backward"):
 * dx of a row, and per row group the partial sums of dgamma and dbeta,
 * which k_bwd_reduce then sums over the groups of a segment. No float
 * atomics: every sum is a fixed tree or a fixed sequence.
 *
 * Work. A segment's rows are cut into row groups of G rows (the host's
 * rule, lnorm_cuda_bwd_run.c: a function of the segment's rows, hidden and
 * x dtype only). One CTA (one cluster in the cluster tiers) takes one group
 * at a time (grid: one per group, or fewer looping over them, "bwd_grid"),
 * runs its rows in order, and writes the group's partial sums of dy * xhat
 * and dy for its columns. So the bits of dx, dgamma and dbeta depend on the
 * segment alone: never on the grid, the SM count or the batch.
 *
 * Column mapping (as the forward's, lnorm_cuda_io.cuh): chunk j of thread
 * t of CTA rank k covers columns [c * VEC, c * VEC + VEC),
 * c = (k * NCH + j) * TPR + t; NCH * VEC = 16 columns a thread (two
 * 16-byte chunks of 16-bit x, four of f32), whose dgamma and dbeta
 * accumulators stay in registers over the group's rows. Small tiers hold
 * RPC = BLOCK / TPR rows a CTA at once (row slot = thread / TPR, the
 * group's rows r0 + slot, r0 + slot + RPC, ...); the slots' accumulators
 * are added in slot order at the end of the group.
 *
 * A row: x and dy are read once (the next rows of the slot are loaded while
 * this one is reduced), converted to fp32; statistics are recomputed where
 * not given (and always with eps outside the sqrt, for sigma) with the
 * forward's formulas (shift K = x[0], centred variance, the rescue of
 * rescale.h); then a = sum(g), b = sum(g * xhat) over the row (fixed
 * trees, group_sum), and dx = rstd * (g - a / H - xhat * b / H * cfac)
 * (+ dres), cfac = 1 with eps inside, 1 / (sigma * rstd) outside. (A
 * row's two sums reduced while the next row is read and summed, on
 * mbarriers, its dx then from the stage read again, ran 0.76-0.98 as fast:
 * its registers spilled accumulators; H200.)
 */
#ifndef LNORM_CUDA_BWD_CUH
#define LNORM_CUDA_BWD_CUH

#include <cooperative_groups.h>

#include "lnorm_cuda_bwd_impl.h"
#include "lnorm_cuda_launch.cuh"

namespace lnorm_cuda {

namespace cg = cooperative_groups;

/* Threads of a backward CTA: TPR, at least 128 (several rows a CTA); 512
 * threads an SM at most 128 registers each, which hold a thread's x and dy
 * chunks and its 2 * LNORM__BWD_COLS dgamma/dbeta accumulators. smem:
 * bytes of dynamic shared memory; the accumulators of every thread at the
 * end of a group (to add the row slots of a CTA), and for FAST the stages,
 * LNORM__BWD_STAGE_BYTES a thread (which the accumulators then reuse). */
template <int TPR> struct BwdShape {
    static constexpr int block = TPR < 128 ? 128 : TPR;
    static constexpr int min_blocks = LNORM__BWD_SM_THREADS / block;
    static constexpr int acc_bytes = 2 * LNORM__BWD_COLS * 4 * block;
    static constexpr int smem = block > TPR ? acc_bytes : 0;
    static constexpr int smem_fast = LNORM__BWD_STAGE_BYTES * block;
    static_assert(smem_fast >= acc_bytes, "the accumulators fit in the stages");
};

template <typename T> struct DtypeOf;
template <> struct DtypeOf<float> {
    static constexpr int value = LNORM_DTYPE_F32;
};
template <> struct DtypeOf<__half> {
    static constexpr int value = LNORM_DTYPE_F16;
};
template <> struct DtypeOf<__nv_bfloat16> {
    static constexpr int value = LNORM_DTYPE_BF16;
};

/* Element i of p, of run-time dtype dt, as fp32. */
__device__ __forceinline__ float ld_any(const void *p, int dt, int64_t i)
{
    if (dt == LNORM_DTYPE_F32)
        return ((const float *)p)[i];
    if (dt == LNORM_DTYPE_F16)
        return __half2float(((const __half *)p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

/* Store v rounded to run-time dtype dt at element i of p. */
__device__ __forceinline__ void st_any(void *p, int dt, int64_t i, float v)
{
    if (dt == LNORM_DTYPE_F32)
        ((float *)p)[i] = v;
    else if (dt == LNORM_DTYPE_F16)
        ((__half *)p)[i] = __float2half_rn(v);
    else
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
}

/* The segment that launch item idx (a row group, or with cblk a column
 * block of the reduction) belongs to: the last table entry whose first
 * item is <= idx (binary search), or the inline one. */
__device__ __forceinline__ const lnorm__bseg *find_bseg(const lnorm__bparams &p, int64_t idx, bool cblk)
{
    if (p.table == nullptr)
        return &p.one;
    int lo = 0, hi = p.nsegs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if ((cblk ? p.table[mid].cblk_begin : p.table[mid].group_begin) <= idx)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &p.table[lo];
}

/* cp.async of 16 bytes (src_bytes of them read, the rest zero-filled)
 * from global memory into this thread's shared memory, through L2 only. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}
/* Wait for every group but the N newest. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* The partial sums' last step: dx of one element from its g = dy * gamma
 * and xhat, the row's means ma = a / H and mb = b / H * cfac. */
__device__ __forceinline__ float bwd_dx(float g, float xh, float ma, float mb, float rstd)
{
    return __fmul_rn(rstd, __fsub_rn(__fsub_rn(g, ma), __fmul_rn(xh, mb)));
}

/* The register tiers: TPR threads a row, CL CTAs a row (a cluster). */
template <typename TX, int TPR, int CL, bool FAST>
__global__ void __launch_bounds__(BwdShape<TPR>::block, BwdShape<TPR>::min_blocks)
    k_bwd(const __grid_constant__ lnorm__bparams p)
{
    constexpr int BLOCK = BwdShape<TPR>::block;
    constexpr int RPC = BLOCK / TPR;
    constexpr int VEC = (int)(16 / sizeof(TX));
    constexpr int NC = LNORM__BWD_COLS;
    constexpr int NCH = NC / VEC;
    constexpr int XDT = DtypeOf<TX>::value;
    /* FAST: stages of the pipeline, NST - 1 rows of a slot in flight while
     * one is reduced: as many as LNORM__BWD_STAGE_BYTES holds (16-bit x 6,
     * f32 3). */
    constexpr int NST = LNORM__BWD_STAGE_BYTES / (2 * NCH * 16);
    static_assert(NST >= 2, "two stages at least");
    __shared__ float red[2][BLOCK / 32];
    __shared__ float2 red2[2][BLOCK / 32];
    __shared__ ClusterRed<CL, BLOCK / 32> cr;
    __shared__ ClusterRed2<CL, BLOCK / 32> cr2;
    __shared__ float4 red4[FAST ? 2 : 1][BLOCK / 32];
    __shared__ ClusterRed4<CL, FAST ? BLOCK / 32 : 1> cr4;
    /* The accumulators of dgamma (quads 0 .. NC/4 - 1) and dbeta (the next
     * NC/4) of this thread, in registers over the group's rows; at the end
     * of a group of a CTA of several row slots, quad q of thread tid goes
     * to dump[q * BLOCK + tid] (16-byte accesses, consecutive threads
     * consecutive addresses) for slot 0 to add. */
    extern __shared__ uint4 dsm[];
    constexpr int NQ = NC / 4;
    float4 acc[2 * NQ];
    float4 *dump = reinterpret_cast<float4 *>(dsm);
    /* FAST: the stages of x and dy, [NST][2][NCH] 16-byte slots a thread at
     * stg[((st * 2 + tensor) * NCH + j) * BLOCK + tid], each filled and
     * read by its own thread (cp.async). (The rows' given rstd and mean
     * staged the same way, 4-byte copies a thread, ran 5-20% slower than
     * loading them into registers a row ahead; H200.) */
    uint4 *stg = dsm;
    void *cred = &cr, *cred2 = &cr2, *cred4 = &cr4;
    const int tid = (int)threadIdx.x;
    const int slot = tid / TPR, t = tid % TPR;
    int rank = 0;
    if constexpr (CL > 1) {
        rank = (int)cg::this_cluster().block_rank();
        cluster_red_init(&cr);
        cluster_red_init(&cr2);
        cluster_red_init(&cr4);
        cg::this_cluster().sync();
    }
    int par = 0, par2 = 0, par4 = 0; /* group_sum's and group_sumv's counts */
    const int64_t ncl = gridDim.x / CL;
    for (int64_t gi = blockIdx.x / CL; gi < p.total; gi += ncl) {
        const lnorm__bseg *s = find_bseg(p, gi, false);
        const int H = (int)s->hidden;
        const int64_t g = gi - s->group_begin;
        const int64_t r0 = g * s->grows;
        const int64_t r1 = r0 + s->grows < s->rows ? r0 + s->grows : s->rows;
        const int nit = (int)((r1 - r0 + RPC - 1) / RPC);
        const bool rms = s->op == LNORM_OP_RMSNORM;
        const bool dyx = FAST || s->dy_dtype == XDT, dxx = FAST || s->dx_dtype == XDT;
        const bool outside = s->eps_mode == LNORM_EPS_OUTSIDE;
        const bool stats = s->rstd == nullptr || (!rms && s->mean == nullptr) || outside;
        const bool use_mean = !rms && s->mean != nullptr;
        const float eps = s->eps;
        const float fH = (float)H;
        int c0s[NCH];
#pragma unroll
        for (int j = 0; j < NCH; j++)
            c0s[j] = ((rank * NCH + j) * TPR + t) * VEC;
        const bool gal = ((uintptr_t)s->gamma & 15) == 0;
        const bool pf32 = sizeof(TX) != 4 && s->param_dtype == LNORM_DTYPE_F32;
        auto gamma_of = [&](int j, float (&gm)[VEC]) {
            if (pf32)
                load_param<float, VEC>((const float *)s->gamma, c0s[j], H, gal, 1.0f, gm);
            else
                load_param<TX, VEC>((const TX *)s->gamma, c0s[j], H, gal, 1.0f, gm);
        };
        /* FAST: gamma of this thread's columns in registers for the group's
         * rows. Why: loaded a row at a time it missed L1 (the stages take
         * the shared memory) and every row waited on L2 for it; held, the
         * fast form ran 1.07-1.43x faster (H200). The general form, at its
         * register limit, loads it a row at a time. */
        float gmr[FAST ? NCH : 1][VEC];
        if constexpr (FAST) {
#pragma unroll
            for (int j = 0; j < NCH; j++)
                gamma_of(j, gmr[j]);
        }
#pragma unroll
        for (int q = 0; q < 2 * NQ; q++)
            acc[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        /* chunk j's dgamma and dbeta terms, dy * xhat and dy, into the
         * accumulators */
        auto add_terms = [&](int j, const float (&xh)[VEC], const float (&dy)[VEC]) {
#pragma unroll
            for (int k4 = 0; k4 < VEC; k4 += 4) {
                const int q = (j * VEC + k4) / 4;
                float4 vg = acc[q], vb = acc[NQ + q];
                vg.x = __fmaf_rn(dy[k4], xh[k4], vg.x);
                vg.y = __fmaf_rn(dy[k4 + 1], xh[k4 + 1], vg.y);
                vg.z = __fmaf_rn(dy[k4 + 2], xh[k4 + 2], vg.z);
                vg.w = __fmaf_rn(dy[k4 + 3], xh[k4 + 3], vg.w);
                vb.x = __fadd_rn(vb.x, dy[k4]);
                vb.y = __fadd_rn(vb.y, dy[k4 + 1]);
                vb.z = __fadd_rn(vb.z, dy[k4 + 2]);
                vb.w = __fadd_rn(vb.w, dy[k4 + 3]);
                acc[q] = vg;
                acc[NQ + q] = vb;
            }
        };
        uint4 xn[NCH], dn[NCH];
        /* The row's chunks: FAST, copied into the stage st by cp.async
         * (whole aligned chunks, those past H zero-filled), else loaded
         * into xn/dn. */
        auto fetch = [&](int64_t r, int st) {
            if (r >= r1)
                return;
            const TX *xp = (const TX *)s->x + r * s->x_stride;
            const TX *dp = (const TX *)s->dy + r * s->dy_stride;
            if constexpr (FAST) {
#pragma unroll
                for (int j = 0; j < NCH; j++) {
                    const bool in = c0s[j] < H;
                    cp_async16(&stg[((st * 2 + 0) * NCH + j) * BLOCK + tid], in ? xp + c0s[j] : xp, in ? 16 : 0);
                    cp_async16(&stg[((st * 2 + 1) * NCH + j) * BLOCK + tid], in ? dp + c0s[j] : dp, in ? 16 : 0);
                }
            } else {
                const bool xal = ((uintptr_t)xp & 15) == 0;
#pragma unroll
                for (int j = 0; j < NCH; j++)
                    xn[j] = load_raw<TX>(xp, c0s[j], H, xal);
                if (dyx) {
                    const bool dal = ((uintptr_t)dp & 15) == 0;
#pragma unroll
                    for (int j = 0; j < NCH; j++)
                        dn[j] = load_raw<TX>(dp, c0s[j], H, dal);
                }
            }
        };
        /* the given statistics of the next row, loaded a row ahead too */
        float rs_n = 0.0f, mn_n = 0.0f;
        auto fetch_stats = [&](int64_t r) {
            if (r < r1) {
                if (s->rstd)
                    rs_n = s->rstd[r];
                if (use_mean)
                    mn_n = s->mean[r];
            }
        };
        /* Rows two at a time (s->pair, the host's rule: the fast form, the
         * statistics given and eps inside): each row of the slot's pair is
         * read from its stage, its dgamma/dbeta terms added and its two
         * sums taken; both rows' sums are then reduced at once (one
         * barrier or cluster exchange for two rows), and each row is read
         * again from its stage for dx. The same operations a row as the
         * loop below, so the same bits. */
        const bool pair = FAST && s->pair;
        if constexpr (FAST) {
            if (pair) {
                static_assert(NST >= 3, "two rows held while the next is in flight");
                /* x (centred and scaled: xhat) and dy of the slot's row in
                 * stage st, as fp32 */
                auto row_of = [&](int st, float c1, float rs, float (&xf)[NCH][VEC], float (&dyf)[NCH][VEC]) {
#pragma unroll
                    for (int j = 0; j < NCH; j++) {
                        unpack<TX>(stg[((st * 2 + 0) * NCH + j) * BLOCK + tid], xf[j]);
                        unpack<TX>(stg[((st * 2 + 1) * NCH + j) * BLOCK + tid], dyf[j]);
#pragma unroll
                        for (int k = 0; k < VEC; k++)
                            xf[j][k] = __fmul_rn(__fsub_rn(xf[j][k], c1), rs);
                    }
                };
                float rsn[2] = {0.0f, 0.0f}, mnn[2] = {0.0f, 0.0f};
                auto pair_stats = [&](int it) {
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        const int64_t r = r0 + (int64_t)(it + u) * RPC + slot;
                        if (r < r1) {
                            rsn[u] = s->rstd[r];
                            mnn[u] = use_mean ? s->mean[r] : 0.0f;
                        }
                    }
                };
                pair_stats(0);
#pragma unroll
                for (int st = 0; st < NST - 2; st++) {
                    fetch(r0 + (int64_t)st * RPC + slot, st);
                    cp_async_commit();
                }
                for (int it = 0; it < nit; it += 2) {
                    const float rs2[2] = {rsn[0], rsn[1]}, c12[2] = {rms ? 0.0f : mnn[0], rms ? 0.0f : mnn[1]};
                    if (it + 2 < nit)
                        pair_stats(it + 2);
                    /* rows it + NST - 2 and it + NST - 1 into the previous
                     * pair's stages, then wait for this pair's */
                    fetch(r0 + (int64_t)(it + NST - 2) * RPC + slot, (it + NST - 2) % NST);
                    cp_async_commit();
                    fetch(r0 + (int64_t)(it + NST - 1) * RPC + slot, (it + NST - 1) % NST);
                    cp_async_commit();
                    cp_async_wait<NST - 2>();
                    float sa[2], sb[2];
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        const bool active = r0 + (int64_t)(it + u) * RPC + slot < r1;
                        const int Hr = active ? H : 0;
                        float xf[NCH][VEC], dyf[NCH][VEC];
                        row_of((it + u) % NST, c12[u], rs2[u], xf, dyf);
                        if (active) {
#pragma unroll
                            for (int j = 0; j < NCH; j++)
                                add_terms(j, xf[j], dyf[j]);
                        }
                        float a = 0.0f, b = 0.0f;
#pragma unroll
                        for (int j = 0; j < NCH; j++)
#pragma unroll
                            for (int k = 0; k < VEC; k++) {
                                const float g = __fmul_rn(dyf[j][k], gmr[j][k]);
                                const bool in = c0s[j] < Hr; /* whole chunks */
                                a = in ? __fadd_rn(a, g) : a;
                                b = in ? __fmaf_rn(g, xf[j][k], b) : b;
                            }
                        sa[u] = a;
                        sb[u] = b;
                    }
                    if (!rms) {
                        const float4 v = group_sumv<TPR, BLOCK, CL>(make_float4(sa[0], sb[0], sa[1], sb[1]), red4,
                                                                    cred4, rank, par4);
                        par4++;
                        sa[0] = v.x;
                        sb[0] = v.y;
                        sa[1] = v.z;
                        sb[1] = v.w;
                    } else {
                        const float2 v = group_sumv<TPR, BLOCK, CL>(make_float2(sb[0], sb[1]), red2, cred2, rank, par2);
                        par2++;
                        sb[0] = v.x;
                        sb[1] = v.y;
                    }
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        const int64_t r = r0 + (int64_t)(it + u) * RPC + slot;
                        if (r >= r1)
                            continue;
                        const float ma = rms ? 0.0f : sa[u] / fH, mb = sb[u] / fH;
                        float xf[NCH][VEC], dyf[NCH][VEC];
                        row_of((it + u) % NST, c12[u], rs2[u], xf, dyf);
                        TX *dxp = (TX *)s->dx + r * s->dx_stride;
                        const bool dxal = ((uintptr_t)dxp & 15) == 0;
#pragma unroll
                        for (int j = 0; j < NCH; j++) {
                            float o[VEC];
#pragma unroll
                            for (int k = 0; k < VEC; k++)
                                o[k] = bwd_dx(__fmul_rn(dyf[j][k], gmr[j][k]), xf[j][k], ma, mb, rs2[u]);
                            store_raw<TX>(dxp, c0s[j], H, dxal, pack<TX>(o));
                        }
                    }
                }
            }
        }
        if (!pair)
            fetch_stats(r0 + slot);
        if constexpr (FAST) {
            if (!pair) {
#pragma unroll
                for (int st = 0; st < NST - 1; st++) {
                    fetch(r0 + (int64_t)st * RPC + slot, st);
                    cp_async_commit();
                }
            }
        }
        for (int it = 0; it < (pair ? 0 : nit); it++) {
            const int64_t r = r0 + (int64_t)it * RPC + slot;
            const bool active = r < r1;
            const int Hr = active ? H : 0;
            const float rs_g = rs_n, mn_g = mn_n;
            if (it + 1 < nit)
                fetch_stats(r + RPC);
            if constexpr (FAST) {
                /* the row NST - 1 ahead into the stage read last time
                 * (fetch skips rows past the group; the empty commit keeps
                 * the count), then wait for this row's */
                fetch(r + (int64_t)(NST - 1) * RPC, (it + NST - 1) % NST);
                cp_async_commit();
                cp_async_wait<NST - 1>();
                const int st = it % NST;
#pragma unroll
                for (int j = 0; j < NCH; j++) {
                    xn[j] = stg[((st * 2 + 0) * NCH + j) * BLOCK + tid];
                    dn[j] = stg[((st * 2 + 1) * NCH + j) * BLOCK + tid];
                }
            } else {
#pragma unroll
                for (int j = 0; j < NCH; j++)
                    xn[j] = dn[j] = make_uint4(0u, 0u, 0u, 0u);
                fetch(r, 0);
            }
            /* Column k of chunk j in the row: the fast form's chunks are
             * whole (H a multiple of VEC), so one test a chunk gives the same
             * answer as one an element (in the general form). */
            auto inrow = [&](int j, int k) { return FAST ? c0s[j] < Hr : c0s[j] + k < Hr; };
            float xf[NCH][VEC], dyf[NCH][VEC];
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                unpack<TX>(xn[j], xf[j]);
                unpack<TX>(dn[j], dyf[j]);
            }
            if (!dyx) {
#pragma unroll
                for (int j = 0; j < NCH; j++)
#pragma unroll
                    for (int k = 0; k < VEC; k++)
                        dyf[j][k] = c0s[j] + k < Hr ? ld_any(s->dy, s->dy_dtype, r * s->dy_stride + c0s[j] + k) : 0.0f;
            }
            /* Statistics where not given (and sigma with eps outside). */
            float K = 0.0f, d = 0.0f, rs = 0.0f, sigma = 0.0f;
            if (stats) {
                if (!rms) {
                    K = active ? shift_of<TX>(((const TX *)s->x)[r * s->x_stride]) : 0.0f;
                    float sum = 0.0f;
#pragma unroll
                    for (int j = 0; j < NCH; j++)
#pragma unroll
                        for (int k = 0; k < VEC; k++)
                            sum += inrow(j, k) ? xf[j][k] - K : 0.0f;
                    sum = group_sum<TPR, BLOCK, CL>(sum, red, cred, rank, par);
                    par++;
                    d = Hr > 0 ? sum / fH : 0.0f;
                }
                float sq = 0.0f;
#pragma unroll
                for (int j = 0; j < NCH; j++)
#pragma unroll
                    for (int k = 0; k < VEC; k++) {
                        const float e = inrow(j, k) ? (rms ? xf[j][k] : (xf[j][k] - K) - d) : 0.0f;
                        sq = __fmaf_rn(e, e, sq);
                    }
                sq = group_sum<TPR, BLOCK, CL>(sq, red, cred, rank, par);
                par++;
                const float var = Hr > 0 ? sq / fH : 1.0f;
                rs = make_rstd(var, eps, s->eps_mode);
                sigma = sqrtf(var);
                const bool need = active && lnorm__rescale_needed(var, eps);
                if (group_any<TPR, BLOCK>(need)) {
                    /* rescale.h: both sums again over t = (x - K) * sc */
                    const float sc = lnorm__rescale_factor(var);
                    float ds = 0.0f;
                    if (!rms) {
                        float a = 0.0f;
#pragma unroll
                        for (int j = 0; j < NCH; j++)
#pragma unroll
                            for (int k = 0; k < VEC; k++)
                                a = __fadd_rn(a, inrow(j, k) ? __fmul_rn(xf[j][k] - K, sc) : 0.0f);
                        a = group_sum<TPR, BLOCK, CL>(a, red, cred, rank, par);
                        par++;
                        ds = Hr > 0 ? a / fH : 0.0f;
                    }
                    float b = 0.0f;
#pragma unroll
                    for (int j = 0; j < NCH; j++)
#pragma unroll
                        for (int k = 0; k < VEC; k++) {
                            const float tv = __fmul_rn(rms ? xf[j][k] : xf[j][k] - K, sc);
                            const float e = inrow(j, k) ? (rms ? tv : __fsub_rn(tv, ds)) : 0.0f;
                            b = __fmaf_rn(e, e, b);
                        }
                    b = group_sum<TPR, BLOCK, CL>(b, red, cred, rank, par);
                    par++;
                    const float vs = Hr > 0 ? b / fH : 1.0f;
                    if (need) {
                        lnorm__rescaled(ds, vs, sc, eps, s->eps_mode, &d, &rs);
                        if (vs <= FLT_MAX)
                            sigma = sqrtf(vs) / sc;
                    }
                }
            }
            const float rstd = s->rstd ? rs_g : rs;
            /* x centred as (x - c1) - c2: x (RMSNorm: 0, 0), x - mean (given:
             * mean, 0) or (x - K) - d (recomputed: K, d), the same bits as
             * each (subtracting +0 changes no value, -0 included), with no
             * branch an element (selected an element, the three forms cost
             * about 5 instructions an element, sm_90). */
            const float c1 = rms ? 0.0f : use_mean ? mn_g : K;
            const float c2 = rms || use_mean ? 0.0f : d;
            /* xhat and g = dy * gamma in place of x and dy's fp32 values,
             * dgamma's and dbeta's terms into the accumulators. */
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                float gm[VEC];
                if constexpr (FAST) {
#pragma unroll
                    for (int k = 0; k < VEC; k++)
                        gm[k] = gmr[j][k];
                } else {
                    gamma_of(j, gm);
                }
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    xf[j][k] = __fmul_rn(__fsub_rn(__fsub_rn(xf[j][k], c1), c2), rstd);
                }
                if (active)
                    add_terms(j, xf[j], dyf[j]);
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    dyf[j][k] = __fmul_rn(dyf[j][k], gm[k]);
            }
            float a = 0.0f, b = 0.0f;
#pragma unroll
            for (int j = 0; j < NCH; j++)
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    const bool in = inrow(j, k);
                    a = in ? __fadd_rn(a, dyf[j][k]) : a;
                    b = in ? __fmaf_rn(dyf[j][k], xf[j][k], b) : b;
                }
            if (!rms) {
                const float2 ab = group_sumv<TPR, BLOCK, CL>(make_float2(a, b), red2, cred2, rank, par2);
                par2++;
                a = ab.x;
                b = ab.y;
            } else {
                b = group_sum<TPR, BLOCK, CL>(b, red, cred, rank, par);
                par++;
            }
            if (!active)
                continue; /* nothing below synchronizes */
            const float ma = rms ? 0.0f : a / fH;
            float mb = b / fH;
            if (outside)
                mb = sigma == 0.0f ? 0.0f : mb / __fmul_rn(sigma, rstd);
            TX *dxp = (TX *)s->dx + r * s->dx_stride;
            const bool dxal = ((uintptr_t)dxp & 15) == 0;
            const TX *drp = !FAST && s->dres ? (const TX *)s->dres + r * s->dres_stride : nullptr;
            const bool dral = ((uintptr_t)drp & 15) == 0;
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                float o[VEC], dr[VEC];
                if (drp)
                    unpack<TX>(load_raw<TX>(drp, c0s[j], H, dral), dr);
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    o[k] = bwd_dx(dyf[j][k], xf[j][k], ma, mb, rstd);
                    if (drp)
                        o[k] = __fadd_rn(o[k], dr[k]);
                }
                if (dxx) {
                    store_raw<TX>(dxp, c0s[j], H, dxal, pack<TX>(o));
                } else {
#pragma unroll
                    for (int k = 0; k < VEC; k++)
                        if (c0s[j] + k < H)
                            st_any(s->dx, s->dx_dtype, r * s->dx_stride + c0s[j] + k, o[k]);
                }
            }
        }
        /* The group's partial sums: the row slots' accumulators in slot
         * order (through dump, over the stages: every thread's copies have
         * landed and been read by now), then one store a column. */
        if constexpr (RPC > 1) {
            __syncthreads();
#pragma unroll
            for (int q = 0; q < 2 * NQ; q++)
                dump[q * BLOCK + tid] = acc[q];
            __syncthreads();
        }
        if (slot == 0) {
            float *pg = s->pdg ? s->pdg + g * H : nullptr;
            float *pb = s->pdb ? s->pdb + g * H : nullptr;
#pragma unroll
            for (int q = 0; q < 2 * NQ; q++) {
                float4 v = acc[q];
                for (int sl = 1; sl < RPC; sl++) {
                    const float4 u = dump[q * BLOCK + sl * TPR + t];
                    v.x = __fadd_rn(v.x, u.x);
                    v.y = __fadd_rn(v.y, u.y);
                    v.z = __fadd_rn(v.z, u.z);
                    v.w = __fadd_rn(v.w, u.w);
                }
                float *pp = q < NQ ? pg : pb;
                const int qq = q < NQ ? q : q - NQ;
                const int c = c0s[qq * 4 / VEC] + qq * 4 % VEC;
                if (pp) {
                    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        if (c + k < H)
                            pp[c + k] = e[k];
                }
            }
        }
        if constexpr (RPC > 1)
            __syncthreads(); /* dump read before the next group's stages fill */
    }
    if constexpr (CL > 1)
        cg::this_cluster().sync(); /* no CTA leaves while a peer may still store into it */
}

/* The wide tier (rows longer than the cluster tiers hold, of any length):
 * a cluster of CL = LNORM__BWD_WIDE_CL CTAs of BLOCK = LNORM__BWD_WIDE_BLOCK
 * threads takes a row group, the row's columns in passes of W = CL * BLOCK
 * * LNORM__BWD_WIDE_COLS: chunk j of thread t of rank k in pass q covers
 * columns q * W + ((k * NCH + j) * BLOCK + t) * VEC, + VEC. Nothing of a
 * row stays in registers. The group is swept row by row for its sums (the
 * statistics where not given, then a and b): each thread adds its columns
 * of a row, a warp tree puts the warp's sum into shared memory, and at the
 * sweep's end the group's rows are reduced together (warps in order, then
 * the cluster's CTAs in rank order): one cluster barrier a sweep instead
 * of one a row. Then, pass by pass, the group's rows again for dx, with
 * the pass's dgamma and dbeta accumulators in registers. x and dy are read
 * twice (five tensors' bytes moved for three); what it saves is the
 * per-row barrier that bounds the register tiers' clusters. Rows, their
 * sums and their order depend on the segment alone, as in the register
 * tiers. The fast form's cp.async ring starts again at each pass. (One
 * ring over all of a sweep's (pass, row) iterations, gamma loaded a pass
 * ahead, ran 0.89-0.97 as fast at H = 262144, side by side, and 0.81-0.96
 * at 16384-131072 against an earlier run, H200.) */
template <typename TX, bool FAST>
__global__ void __launch_bounds__(LNORM__BWD_WIDE_BLOCK, 2) k_bwd_wide(const __grid_constant__ lnorm__bparams p)
{
    constexpr int BLOCK = LNORM__BWD_WIDE_BLOCK, CL = LNORM__BWD_WIDE_CL, NW = BLOCK / 32;
    constexpr int GM = LNORM__BWD_GROWS_MAX;
    constexpr int VEC = (int)(16 / sizeof(TX));
    constexpr int NC = LNORM__BWD_WIDE_COLS, NCH = NC / VEC, NQ = NC / 4;
    constexpr int XDT = DtypeOf<TX>::value;
    constexpr int W = CL * BLOCK * NC;
    static_assert(2 * GM <= BLOCK, "a thread per row and value in the group's reduction");
    /* wsum: the warps' sums of a sweep (value, row, warp); xs: the CTAs'
     * (parity, value, rank, row), written by every CTA of the cluster into
     * every other's; the group's rows: shift and mean offset (x - K) - d,
     * rstd, sigma, the mean terms of dx, and the statistics sweeps' state. */
    __shared__ float wsum[2][GM][NW];
    __shared__ float xs[2][2][CL][GM];
    __shared__ float rK[GM], rd[GM], rrs[GM], rsig[GM], rma[GM], rmb[GM], rvar[GM], rds[GM], ro[2][GM];
    /* FAST: NST stages of x and dy chunks, [NST][2][NCH] 16-byte slots a
     * thread at wst[((st * 2 + tensor) * NCH + j) * BLOCK + tid], NST - 1
     * iterations in flight while one is computed (16-bit x 8, f32 4) */
    constexpr int NST = LNORM__BWD_WIDE_STAGE_BYTES / (2 * NCH * 16);
    static_assert(NST >= 2, "two stages at least");
    extern __shared__ uint4 wst[];
    cg::cluster_group clu = cg::this_cluster();
    const int rank = (int)clu.block_rank();
    const int tid = (int)threadIdx.x, lane = tid & 31, wp = tid >> 5;
    int par = 0;
    /* A thread's part of value v of row i: the warp's sum to wsum, or
     * added to it (add: a later pass of the row). */
    auto warp_put = [&](int v, int i, float x, bool add) {
#pragma unroll
        for (int m = 16; m > 0; m >>= 1)
            x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, m));
        if (lane == 0)
            wsum[v][i][wp] = add ? __fadd_rn(wsum[v][i][wp], x) : x;
    };
    /* The sweep's n rows x nv values summed over the cluster into ro. */
    auto reduce_rows = [&](int n, int nv) {
        __syncthreads();
        const int b = par & 1;
        if (tid < n * nv) {
            const int v = tid / n, i = tid - v * n;
            float x = 0.0f;
            for (int k = 0; k < NW; k++)
                x = __fadd_rn(x, wsum[v][i][k]);
            for (int k = 0; k < CL; k++)
                *clu.map_shared_rank(&xs[b][v][rank][i], (unsigned)k) = x;
        }
        /* xs[b] is written again two sweeps on, after the next barrier,
         * which no CTA passes before it has read this sweep's. */
        clu.sync();
        if (tid < n * nv) {
            const int v = tid / n, i = tid - v * n;
            float x = 0.0f;
            for (int k = 0; k < CL; k++)
                x = __fadd_rn(x, xs[b][v][k][i]);
            ro[v][i] = x;
        }
        __syncthreads();
        par++;
    };
    const int64_t ncl = gridDim.x / CL;
    for (int64_t gi = blockIdx.x / CL; gi < p.total; gi += ncl) {
        const lnorm__bseg *s = find_bseg(p, gi, false);
        const int H = (int)s->hidden;
        const float fH = (float)H;
        const int64_t g = gi - s->group_begin;
        const int64_t r0 = g * s->grows;
        const int n = (int)((r0 + s->grows < s->rows ? r0 + s->grows : s->rows) - r0);
        const int npass = (int)((s->hidden + W - 1) / W);
        const bool rms = s->op == LNORM_OP_RMSNORM;
        const bool dyx = FAST || s->dy_dtype == XDT, dxx = FAST || s->dx_dtype == XDT;
        const bool outside = s->eps_mode == LNORM_EPS_OUTSIDE;
        const bool stats = s->rstd == nullptr || (!rms && s->mean == nullptr) || outside;
        const bool use_mean = !rms && s->mean != nullptr;
        const float eps = s->eps;
        const bool gal = ((uintptr_t)s->gamma & 15) == 0;
        const bool pf32 = sizeof(TX) != 4 && s->param_dtype == LNORM_DTYPE_F32;
        auto col = [&](int q, int j) { return q * W + ((rank * NCH + j) * BLOCK + tid) * VEC; };
        auto gamma_at = [&](int c, float (&gm)[VEC]) {
            if (pf32)
                load_param<float, VEC>((const float *)s->gamma, c, H, gal, 1.0f, gm);
            else
                load_param<TX, VEC>((const TX *)s->gamma, c, H, gal, 1.0f, gm);
        };
        /* Chunk c of row i of the group: x's raw bits, dy's (x's dtype). */
        auto raw_x = [&](int i, int c) {
            const TX *xp = (const TX *)s->x + (r0 + i) * s->x_stride;
            return load_raw<TX>(xp, c, H, ((uintptr_t)xp & 15) == 0);
        };
        auto raw_dy = [&](int i, int c) {
            const TX *dp = (const TX *)s->dy + (r0 + i) * s->dy_stride;
            return dyx ? load_raw<TX>(dp, c, H, ((uintptr_t)dp & 15) == 0) : make_uint4(0u, 0u, 0u, 0u);
        };
        auto dy_of = [&](int i, int c, const uint4 &raw, float (&f)[VEC]) {
            if (dyx) {
                unpack<TX>(raw, f);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    f[k] = c + k < H ? ld_any(s->dy, s->dy_dtype, (r0 + i) * s->dy_stride + c + k) : 0.0f;
            }
        };
        /* The chunks of (row i, pass q) into registers (the general form). */
        auto fetch = [&](int i, int q, uint4 (&xr)[NCH], uint4 (&dr)[NCH]) {
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                const int c = col(q, j);
                xr[j] = c < H ? raw_x(i, c) : make_uint4(0u, 0u, 0u, 0u);
                dr[j] = c < H ? raw_dy(i, c) : make_uint4(0u, 0u, 0u, 0u);
            }
        };
        /* FAST: the chunks of (row i, pass q) copied by cp.async into stage
         * st (whole chunks: rows aligned and whole 16-byte units; those past
         * H zero-filled), and read back by the same thread. */
        auto stage = [&](int i, int q, int st) {
            const TX *xp = (const TX *)s->x + (r0 + i) * s->x_stride;
            const TX *dp = (const TX *)s->dy + (r0 + i) * s->dy_stride;
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                const int c = col(q, j);
                const bool in = c < H;
                cp_async16(&wst[((st * 2 + 0) * NCH + j) * BLOCK + tid], in ? xp + c : xp, in ? 16 : 0);
                cp_async16(&wst[((st * 2 + 1) * NCH + j) * BLOCK + tid], in ? dp + c : dp, in ? 16 : 0);
            }
        };
        auto unstage = [&](int st, uint4 (&xr)[NCH], uint4 (&dr)[NCH]) {
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                xr[j] = wst[((st * 2 + 0) * NCH + j) * BLOCK + tid];
                dr[j] = wst[((st * 2 + 1) * NCH + j) * BLOCK + tid];
            }
        };
        /* A pass's rows in order: FAST, through the stage ring (NST - 1
         * rows ahead, started again at each pass); else loaded in place. */
        auto ring_start = [&](int q) {
            if constexpr (FAST) {
                for (int k = 0; k < NST - 1; k++) {
                    if (k < n)
                        stage(k, q, k);
                    cp_async_commit();
                }
            }
        };
        auto ring_next = [&](int i, int q, uint4 (&xr)[NCH], uint4 (&dr)[NCH]) {
            if constexpr (FAST) {
                if (i + NST - 1 < n)
                    stage(i + NST - 1, q, (i + NST - 1) % NST);
                cp_async_commit();
                cp_async_wait<NST - 1>();
                unstage(i % NST, xr, dr);
            } else {
                fetch(i, q, xr, dr);
            }
        };
        /* One sweep of x over the group's rows: fn(i, c, k, x) adds element
         * k of chunk c (inside the row) into the thread's sum of row i. */
        auto sweep_x = [&](auto fn) {
            for (int i = 0; i < n; i++) {
                float acc = 0.0f;
                for (int q = 0; q < npass; q++) {
#pragma unroll
                    for (int j = 0; j < NCH; j++) {
                        const int c = col(q, j);
                        if (c < H) {
                            float f[VEC];
                            unpack<TX>(raw_x(i, c), f);
#pragma unroll
                            for (int k = 0; k < VEC; k++)
                                if (c + k < H)
                                    acc = fn(i, acc, f[k]);
                        }
                    }
                }
                warp_put(0, i, acc, false);
            }
            reduce_rows(n, 1);
        };
        /* Statistics where not given (and sigma with eps outside): the
         * forward's formulas, sweep by sweep, the rescue of rescale.h for
         * the rows that need it. */
        if (stats) {
            if (!rms) {
                for (int i = tid; i < n; i += BLOCK)
                    rK[i] = shift_of<TX>(((const TX *)s->x)[(r0 + i) * s->x_stride]);
                __syncthreads();
                sweep_x([&](int i, float a, float x) { return a + (x - rK[i]); });
                for (int i = tid; i < n; i += BLOCK)
                    rd[i] = ro[0][i] / fH;
            } else {
                for (int i = tid; i < n; i += BLOCK)
                    rK[i] = rd[i] = 0.0f;
            }
            __syncthreads();
            sweep_x([&](int i, float a, float x) {
                const float e = rms ? x : (x - rK[i]) - rd[i];
                return __fmaf_rn(e, e, a);
            });
            bool any = false;
            for (int i = 0; i < n; i++) {
                const float var = ro[0][i] / fH;
                any = any || lnorm__rescale_needed(var, eps);
                if (tid == 0) {
                    rvar[i] = var;
                    rrs[i] = make_rstd(var, eps, s->eps_mode);
                    rsig[i] = sqrtf(var);
                }
            }
            __syncthreads();
            if (any) {
                /* rescale.h: both sums again over t = (x - K) * sc; every
                 * row of the group swept, those that need it take them */
                if (!rms) {
                    sweep_x([&](int i, float a, float x) {
                        return __fadd_rn(a, __fmul_rn(x - rK[i], lnorm__rescale_factor(rvar[i])));
                    });
                    for (int i = tid; i < n; i += BLOCK)
                        rds[i] = ro[0][i] / fH;
                } else {
                    for (int i = tid; i < n; i += BLOCK)
                        rds[i] = 0.0f;
                }
                __syncthreads();
                sweep_x([&](int i, float a, float x) {
                    const float tv = __fmul_rn(rms ? x : x - rK[i], lnorm__rescale_factor(rvar[i]));
                    const float e = rms ? tv : __fsub_rn(tv, rds[i]);
                    return __fmaf_rn(e, e, a);
                });
                for (int i = tid; i < n; i += BLOCK) {
                    const float var = rvar[i];
                    if (lnorm__rescale_needed(var, eps)) {
                        const float sc = lnorm__rescale_factor(var), vs = ro[0][i] / fH;
                        lnorm__rescaled(rds[i], vs, sc, eps, s->eps_mode, &rd[i], &rrs[i]);
                        if (vs <= FLT_MAX)
                            rsig[i] = sqrtf(vs) / sc;
                    }
                }
                __syncthreads();
            }
        }
        /* Each row's centring, (x - K) - d (exact for K = mean, d = 0 and
         * for RMSNorm's K = d = 0), and rstd. */
        for (int i = tid; i < n; i += BLOCK) {
            const int64_t r = r0 + i;
            if (rms || use_mean) {
                rK[i] = use_mean ? s->mean[r] : 0.0f;
                rd[i] = 0.0f;
            }
            if (s->rstd)
                rrs[i] = s->rstd[r];
        }
        __syncthreads();
        /* a = sum(g), b = sum(g * xhat), g = dy * gamma (RMSNorm: b only):
         * a pass at a time, gamma's chunks of the pass in registers, the
         * group's rows; a warp's sums of (row, pass) added into wsum in
         * pass order */
        for (int q = 0; q < npass; q++) {
            float gm[NCH][VEC];
#pragma unroll
            for (int j = 0; j < NCH; j++)
                gamma_at(col(q, j), gm[j]);
            uint4 xc[NCH], dc[NCH];
            ring_start(q);
            for (int i = 0; i < n; i++) {
                ring_next(i, q, xc, dc);
                const float K = rK[i], d = rd[i], rs = rrs[i];
                float a = 0.0f, b = 0.0f;
#pragma unroll
                for (int j = 0; j < NCH; j++) {
                    const int c = col(q, j);
                    if (c < H) {
                        float f[VEC], dyf[VEC];
                        unpack<TX>(xc[j], f);
                        dy_of(i, c, dc[j], dyf);
#pragma unroll
                        for (int k = 0; k < VEC; k++) {
                            const bool in = FAST || c + k < H; /* FAST: whole chunks */
                            const float xh = __fmul_rn(__fsub_rn(f[k] - K, d), rs);
                            const float gv = __fmul_rn(dyf[k], gm[j][k]);
                            a = in ? __fadd_rn(a, gv) : a;
                            b = in ? __fmaf_rn(gv, xh, b) : b;
                        }
                    }
                }
                if (!rms)
                    warp_put(1, i, a, q > 0);
                warp_put(0, i, b, q > 0);
            }
        }
        reduce_rows(n, rms ? 1 : 2);
        for (int i = tid; i < n; i += BLOCK) {
            const float rs = rrs[i];
            rma[i] = rms ? 0.0f : ro[1][i] / fH;
            float mb = ro[0][i] / fH;
            if (outside)
                mb = rsig[i] == 0.0f ? 0.0f : mb / __fmul_rn(rsig[i], rs);
            rmb[i] = mb;
        }
        __syncthreads();
        /* dx, and the group's dgamma/dbeta partials, a pass at a time */
        for (int q = 0; q < npass; q++) {
            if (col(q, 0) >= H)
                continue; /* no column of this thread in the pass */
            float gm[NCH][VEC];
#pragma unroll
            for (int j = 0; j < NCH; j++)
                gamma_at(col(q, j), gm[j]);
            float4 acc[2 * NQ];
#pragma unroll
            for (int k = 0; k < 2 * NQ; k++)
                acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            uint4 xc[NCH], dc[NCH];
            ring_start(q);
            for (int i = 0; i < n; i++) {
                ring_next(i, q, xc, dc);
                const int64_t r = r0 + i;
                const float K = rK[i], d = rd[i], rs = rrs[i], ma = rma[i], mb = rmb[i];
                TX *dxp = (TX *)s->dx + r * s->dx_stride;
                const bool dxal = ((uintptr_t)dxp & 15) == 0;
                const TX *drp = !FAST && s->dres ? (const TX *)s->dres + r * s->dres_stride : nullptr;
                const bool dral = ((uintptr_t)drp & 15) == 0;
#pragma unroll
                for (int j = 0; j < NCH; j++) {
                    const int c = col(q, j);
                    if (c >= H)
                        continue;
                    float f[VEC], dyf[VEC], o[VEC], dr[VEC];
                    unpack<TX>(xc[j], f);
                    dy_of(i, c, dc[j], dyf);
                    if (drp)
                        unpack<TX>(load_raw<TX>(drp, c, H, dral), dr);
#pragma unroll
                    for (int k = 0; k < VEC; k++) {
                        const float xh = __fmul_rn(__fsub_rn(f[k] - K, d), rs);
                        float4 &vg = acc[(j * VEC + k) / 4];
                        float4 &vb = acc[NQ + (j * VEC + k) / 4];
                        float &eg = k % 4 == 0 ? vg.x : k % 4 == 1 ? vg.y : k % 4 == 2 ? vg.z : vg.w;
                        float &eb = k % 4 == 0 ? vb.x : k % 4 == 1 ? vb.y : k % 4 == 2 ? vb.z : vb.w;
                        eg = __fmaf_rn(dyf[k], xh, eg);
                        eb = __fadd_rn(eb, dyf[k]);
                        o[k] = bwd_dx(__fmul_rn(dyf[k], gm[j][k]), xh, ma, mb, rs);
                        if (drp)
                            o[k] = __fadd_rn(o[k], dr[k]);
                    }
                    if (dxx) {
                        store_raw<TX>(dxp, c, H, dxal, pack<TX>(o));
                    } else {
#pragma unroll
                        for (int k = 0; k < VEC; k++)
                            if (c + k < H)
                                st_any(s->dx, s->dx_dtype, r * s->dx_stride + c + k, o[k]);
                    }
                }
            }
            float *pg = s->pdg ? s->pdg + g * H : nullptr;
            float *pb = s->pdb ? s->pdb + g * H : nullptr;
#pragma unroll
            for (int k = 0; k < 2 * NQ; k++) {
                float *pp = k < NQ ? pg : pb;
                const int kk = k < NQ ? k : k - NQ;
                const int c = col(q, kk * 4 / VEC) + kk * 4 % VEC;
                if (pp) {
                    const float e[4] = {acc[k].x, acc[k].y, acc[k].z, acc[k].w};
#pragma unroll
                    for (int m = 0; m < 4; m++)
                        if (c + m < H)
                            pp[c + m] = e[m];
                }
            }
        }
        /* the group's row state is read above; the next group's after this */
        __syncthreads();
    }
    clu.sync(); /* no CTA leaves while a peer may still store into it */
}

/* dgamma/dbeta: the sum over a segment's row groups of their partials, a
 * block of LNORM__BWD_RCOLS columns a CTA: lane l of warp w sums groups w,
 * w + 32, ... of column l in order, then lane l of warp 0 adds the 32
 * warps' sums in order. The tree depends on the number of groups only. */
template <int RCOLS>
__global__ void __launch_bounds__(1024) k_bwd_reduce(const __grid_constant__ lnorm__bparams p)
{
    static_assert(RCOLS == 32, "a lane a column");
    __shared__ float sg[32][RCOLS + 1], sb[32][RCOLS + 1];
    const int lane = (int)(threadIdx.x & 31), w = (int)(threadIdx.x >> 5);
    for (int64_t bi = blockIdx.x; bi < p.total; bi += gridDim.x) {
        const lnorm__bseg *s = find_bseg(p, bi, true);
        const int64_t H = s->hidden;
        const int64_t c = (bi - s->cblk_begin) * RCOLS + lane;
        float vg = 0.0f, vb = 0.0f;
        if (c < H) {
            if (s->pdg) {
#pragma unroll 4
                for (int64_t q = w; q < s->ngroups; q += 32)
                    vg = __fadd_rn(vg, s->pdg[q * H + c]);
            }
            if (s->pdb) {
#pragma unroll 4
                for (int64_t q = w; q < s->ngroups; q += 32)
                    vb = __fadd_rn(vb, s->pdb[q * H + c]);
            }
        }
        sg[w][lane] = vg;
        sb[w][lane] = vb;
        __syncthreads();
        if (w == 0 && c < H) {
            float tg = 0.0f, tb = 0.0f;
            for (int i = 0; i < 32; i++) {
                tg = __fadd_rn(tg, sg[i][lane]);
                tb = __fadd_rn(tb, sb[i][lane]);
            }
            if (s->dgamma)
                s->dgamma[c] = tg;
            if (s->dbeta)
                s->dbeta[c] = tb;
        }
        __syncthreads();
    }
}

/* Launch one register tier: one CTA (cluster) a row group, at most
 * lnorm__bwd_grid of them when set (they then loop over the groups). */
template <typename TX, int TPR, int CL, bool FAST>
static cudaError_t launch_bwd_reg(const lnorm__bparams *p, cudaStream_t st)
{
    constexpr int BLOCK = BwdShape<TPR>::block;
    auto kern = k_bwd<TX, TPR, CL, FAST>;
    int64_t n = p->total;
    if (lnorm__bwd_grid > 0 && lnorm__bwd_grid < n)
        n = lnorm__bwd_grid;
    if (n > (1 << 26))
        n = 1 << 26;
    constexpr int SMEM = FAST ? BwdShape<TPR>::smem_fast : BwdShape<TPR>::smem;
    static int attr_set[64]; /* per device: the shared-memory opt-in made */
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    /* The opt-in whenever the dynamic memory is large: with the static
     * (reductions) it may pass 48 KiB even when the dynamic part does not. */
    if (SMEM >= 32 * 1024 && (dev >= 64 || !attr_set[dev])) {
        e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
        if (e != cudaSuccess)
            return e;
        if (dev < 64)
            attr_set[dev] = 1;
    }
    if constexpr (CL == 1) {
        kern<<<(unsigned)n, BLOCK, SMEM, st>>>(*p);
        return cudaGetLastError();
    } else {
        if (CL > 8) {
            e = cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
            if (e != cudaSuccess)
                return e;
        }
        cudaLaunchAttribute at;
        cudaLaunchConfig_t cfg = cluster_config(CL, dim3((unsigned)(n * CL), 1, 1), dim3(BLOCK, 1, 1), SMEM, st, &at);
        return cudaLaunchKernelEx(&cfg, kern, *p);
    }
}

template <typename TX> static cudaError_t launch_bwd_wide(bool fast, const lnorm__bparams *p, cudaStream_t st)
{
    constexpr int CL = LNORM__BWD_WIDE_CL;
    int64_t n = p->total;
    if (lnorm__bwd_grid > 0 && lnorm__bwd_grid < n)
        n = lnorm__bwd_grid;
    if (n > (1 << 26))
        n = 1 << 26;
    constexpr int SMEM = LNORM__BWD_WIDE_STAGE_BYTES * LNORM__BWD_WIDE_BLOCK;
    static int attr_set[64]; /* per device: the fast form's shared-memory opt-in made */
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    if (fast && (dev >= 64 || !attr_set[dev])) {
        e = cudaFuncSetAttribute(k_bwd_wide<TX, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
        if (e != cudaSuccess)
            return e;
        if (dev < 64)
            attr_set[dev] = 1;
    }
    cudaLaunchAttribute at;
    cudaLaunchConfig_t cfg = cluster_config(CL, dim3((unsigned)(n * CL), 1, 1), dim3(LNORM__BWD_WIDE_BLOCK, 1, 1),
                                            fast ? SMEM : 0, st, &at);
    if (fast)
        return cudaLaunchKernelEx(&cfg, k_bwd_wide<TX, true>, *p);
    return cudaLaunchKernelEx(&cfg, k_bwd_wide<TX, false>, *p);
}

/* Launch backward tier `tier` (lnorm_cuda_bwd_impl.h) for x of type TX.
 * The 16-CTA cluster tier needs a non-portable cluster size; where the
 * device refuses it, the wide tier runs the same groups. */
template <typename TX> static int launch_bwd_tier(int tier, bool fast, const lnorm__bparams *p, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e;
    switch (tier) {
#define LNORM__BCASE(i, tpr, cl)                        \
    case i:                                             \
        e = fast ? launch_bwd_reg<TX, tpr, cl, true>(p, st) : launch_bwd_reg<TX, tpr, cl, false>(p, st); \
        break;
        LNORM__BCASE(0, 1, 1)
        LNORM__BCASE(1, 2, 1)
        LNORM__BCASE(2, 4, 1)
        LNORM__BCASE(3, 8, 1)
        LNORM__BCASE(4, 16, 1)
        LNORM__BCASE(5, 32, 1)
        LNORM__BCASE(6, 64, 1)
        LNORM__BCASE(7, 128, 1)
        LNORM__BCASE(8, 256, 1)
        LNORM__BCASE(9, 512, 1)
        LNORM__BCASE(10, 512, 2)
        LNORM__BCASE(11, 512, 4)
        LNORM__BCASE(12, 512, 8)
        LNORM__BCASE(13, 512, 16)
#undef LNORM__BCASE
    case LNORM__BWD_NTIERS:
        return (int)launch_bwd_wide<TX>(fast, p, st);
    default:
        return (int)cudaErrorInvalidValue;
    }
    if (e != cudaSuccess && tier == LNORM__BWD_NTIERS - 1) {
        (void)cudaGetLastError();
        return (int)launch_bwd_wide<TX>(fast, p, st);
    }
    return (int)e;
}

} // namespace lnorm_cuda

#endif /* LNORM_CUDA_BWD_CUH */
