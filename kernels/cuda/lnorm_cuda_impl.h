/*
 * Internal to the CUDA backend: the segment table as the kernels read it,
 * the tier table, and the per-x-dtype launchers (one .cu file each).
 */
#ifndef LNORM_CUDA_IMPL_H
#define LNORM_CUDA_IMPL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One segment as a kernel reads it (device pointers). row_begin is the
 * first row of the segment in its launch's global row numbering. */
typedef struct lnorm__kseg {
    const void *x;
    const void *res;
    void *y;
    void *res_out;
    const void *gamma;
    const void *beta;
    float *mean;
    float *rstd;
    int64_t x_stride;
    int64_t y_stride;
    int64_t res_stride;
    int64_t res_out_stride;
    int64_t hidden;
    int64_t row_begin;
    float eps;
    int32_t op;
    int32_t y_dtype;
    int32_t param_dtype;
    int32_t eps_mode;
    int32_t pad_;
} lnorm__kseg;

/* Fast-path variants (kernels/cuda/lnorm_cuda_kernels.cuh, k_fast): a
 * segment with y dtype = x dtype, no residual, parameters of x's dtype or
 * f32, in a tier of one CTA per row. Chosen from the segment alone. */
enum {
    LNORM__FAST_NONE = 0,     /* the general kernels */
    LNORM__FAST_LN = 1,       /* parameters of x's dtype (or f32 x) */
    LNORM__FAST_RMS = 2,
    LNORM__FAST_LN_PF32 = 3,  /* f16/bf16 x, f32 parameters */
    LNORM__FAST_RMS_PF32 = 4,
    LNORM__NFAST = 5,
    LNORM__FAST_VMASK = 7,    /* the variant bits of kparams.fast */
    LNORM__FAST_BULK = 8,     /* flag: rows staged by bulk copies (k_bulk) */
    LNORM__FAST_AL = 16       /* flag: k_fast's straight-line form (whole aligned 16-byte units) */
};

/* Run-time tuning of the bulk path (lnorm_cuda_set_tuning): on/off, stage
 * count (0 = chosen by the launcher), a cap on resident CTAs per SM
 * (0 = chosen) and the shared memory per SM the stages may take (KiB).
 * Defined in lnorm_cuda_run.c. */
extern int lnorm__bulk_enabled;
extern int lnorm__bulk_stages_override;
extern int lnorm__bulk_ctas_override;
extern int lnorm__bulk_smem_kb;
/* Grid of the one-CTA fast kernels (k_fast): 0 chosen by tier (one tile
 * per CTA, persistent CTAs for 1024-thread CTAs), 1 persistent (a few
 * waves of resident CTAs looping over the tiles), 2 one tile per CTA. */
extern int lnorm__fast_grid;
/* k_fast's straight-line form (AL: vector accesses only, half the
 * instructions of the general form, same bits) for segments whose x, y,
 * gamma, beta, strides and H are whole 16-byte units: 0 never, 1 (default)
 * where it measured faster (lnorm__al_pays), 2 wherever rows allow. */
extern int lnorm__fast_aligned;
extern long lnorm__al_launches;
/* k_fast's re-read form (RR: the AL form holding nothing of the row
 * between passes, each pass reading it again through the L1 cache; same
 * bits), in the one-CTA tiers of at least LNORM_CUDA_RR_MIN_TPR threads a
 * row: 0 never, 1 (default) where lnorm__rr_use's policy says, 2 wherever
 * a segment takes the AL form (and, in the 1024-thread tier 10, instead
 * of the bulk kernel for AL rows). */
extern int lnorm__fast_reread;
extern long lnorm__rr_launches;
#ifndef LNORM_CUDA_RR_MIN_TPR
#define LNORM_CUDA_RR_MIN_TPR 128
#endif
/* LNORM_CUDA_RR_POLICY: where "fast_reread" 1 takes the RR form (rms:
 * 0/1; tpr: threads a row of the tier; the same for every x dtype). 1 (default):
 * RMSNorm in the 1024-thread one-CTA tier 10 (H200, 2026-12-01, two runs,
 * same tensors, bit-identical: f32 H = 16384 +2.0% / +1.6%, bf16
 * H = 32768 +1.0% / +1.3% over the bulk kernel, bench/results/
 * kernels-2026-12-01-{2c0ff2c-rr,b63a275-rr}-ab.log); LayerNorm there was
 * 6-25% slower (three passes over the row), and in tiers 7-9 (CTAs of
 * 128-512 threads) RR was within -14..+1.6% of the register form, no
 * consistent gain. 2: wherever it exists (as "fast_reread" 2). 0: nowhere. */
#ifndef LNORM_CUDA_RR_POLICY
#define LNORM_CUDA_RR_POLICY 1
#endif
static inline int lnorm__rr_use(int rms, int tpr)
{
    if (tpr < LNORM_CUDA_RR_MIN_TPR || lnorm__fast_reread == 0)
        return 0;
    if (lnorm__fast_reread == 2 || LNORM_CUDA_RR_POLICY == 2)
        return 1;
    return LNORM_CUDA_RR_POLICY == 1 && rms && tpr >= 1024;
}
/* Launches that ran the bulk kernels, and bulk launches that fell back to
 * the kernels without bulk copies (lnorm_cuda_stat). */
extern long lnorm__bulk_launches;
extern long lnorm__bulk_fallbacks;
/* Dynamic tiles (kparams.sched) for launches that have a workspace: 1
 * (default) on, 0 off (every CTA takes a fixed share of the tiles). */
extern int lnorm__bulk_dynamic;
extern long lnorm__dyn_launches; /* bulk launches that took dynamic tiles */

/* The parameters of one launch: either a device table of nsegs segments
 * sorted by row_begin, or (table NULL) the single segment `one` inline.
 * fast: the LNORM__FAST_* variant every segment of the launch shares, with
 * LNORM__FAST_BULK when every row of the launch may be bulk-copied. */
typedef struct lnorm__kparams {
    const lnorm__kseg *table;
    int64_t total_rows;
    int32_t nsegs;
    int32_t fast;
    lnorm__kseg one;
    /* Dynamic tiles of the bulk kernels that read rows from shared memory
     * (tiers 10 and up): sched[0] hands out tiles, sched[1] counts the CTAs
     * that finished; the last one puts both back to 0. Device memory of the
     * launch's workspace (one per stream, lnorm_cuda_ws), zero before the
     * launch; NULL: each CTA takes every gridDim-th tile. */
    unsigned int *sched;
} lnorm__kparams;

/* The tiers, by hidden size. A register tier holds the row in registers
 * as raw x-dtype bits: TPR threads per row, NCH 16-byte chunks per thread,
 * CL CTAs per row (a thread block cluster when CL > 1); it holds
 * TPR * NCH * CL * (16 / sizeof(x)) elements. The tier after the last
 * register tier streams the row. */
/* Tiers 0-9, the same in every tier set: one CTA per row. */
#define LNORM__TIERS_CTA(X) \
    X(0, 1, 4, 1)           \
    X(1, 2, 4, 1)           \
    X(2, 4, 4, 1)           \
    X(3, 8, 4, 1)           \
    X(4, 16, 4, 1)          \
    X(5, 32, 4, 1)          \
    X(6, 64, 4, 1)          \
    LNORM__TIERS_CTA_HI(X)
#define LNORM__TIERS_CTA_HI(X) \
    X(7, 128, 4, 1)            \
    X(8, 256, 4, 1)            \
    X(9, 512, 4, 1)

/* f32 x (LNORM_CUDA_F32_NCH2, default 1): tiers 0-6 (H <= 1024) with two
 * chunks a thread and twice the threads a row, the same capacities (so the
 * same tier numbers). Against four chunks, same run on the H200
 * (bench/results/kernels-2026-11-30-4bb3898-ab.log, build t4): f32 H =
 * 128-1024 4169-4205 GB/s against 4066-4101; from H = 2048 up two chunks
 * were slower (and for 16-bit x at every size), so the other tiers and
 * dtypes keep four. */
#ifndef LNORM_CUDA_F32_NCH2
#define LNORM_CUDA_F32_NCH2 1
#endif
/* Threads of the fast and bulk kernels' CTAs of the tiers of up to this
 * many threads a row (several rows a CTA, warp-shuffle reductions; tier 6
 * in 16-bit, one row of two warps; the general kernels keep 128). 64 since
 * 2026-11-30 session 10: a CTA of two warps retires, and the next one
 * starts its loads, as soon as its own rows are written. Same run on the H200 (bench/results/
 * kernels-2026-11-30-83b2fc3-ab.log, build b64 against the default of
 * 128, bit-identical): bf16 H = 128-2048 +1.0..+2.2% for LayerNorm (4029-4076
 * against 3978-4010 GB/s) and +0.0..+1.4% for RMSNorm, f32 within +-0.4%;
 * 32 (b32) was the same for bf16 and 20% slower for f32 at H = 128 / 256.
 * (Applied to k_reg too, ptxas 13.0 made its bf16 kernel of 64 threads a
 * row spill 8 bytes; it is not measured there, so k_reg keeps 128.) */
#ifndef LNORM_CUDA_MIN_BLOCK
#define LNORM_CUDA_MIN_BLOCK 64
#endif
/* LNORM_CUDA_F32_NCH2_HI (A/B builds, default 0): f32 tiers 7 and 8
 * (H <= 2048, 4096) with two chunks a thread too (256 and 512 threads a
 * row). */
#ifndef LNORM_CUDA_F32_NCH2_HI
#define LNORM_CUDA_F32_NCH2_HI 0
#endif
#if LNORM_CUDA_F32_NCH2_HI && !LNORM_CUDA_F32_NCH2
#error "LNORM_CUDA_F32_NCH2_HI needs LNORM_CUDA_F32_NCH2"
#endif
#if LNORM_CUDA_F32_NCH2_HI
#define LNORM__TIERS_CTA_HI_F32(X) \
    X(7, 256, 2, 1)                \
    X(8, 512, 2, 1)                \
    X(9, 512, 4, 1)
#else
#define LNORM__TIERS_CTA_HI_F32(X) LNORM__TIERS_CTA_HI(X)
#endif
#if LNORM_CUDA_F32_NCH2
#define LNORM__TIERS_CTA_F32(X) \
    X(0, 2, 2, 1)               \
    X(1, 4, 2, 1)               \
    X(2, 8, 2, 1)               \
    X(3, 16, 2, 1)              \
    X(4, 32, 2, 1)              \
    X(5, 64, 2, 1)              \
    X(6, 128, 2, 1)             \
    LNORM__TIERS_CTA_HI_F32(X)
#else
#define LNORM__TIERS_CTA_F32(X) LNORM__TIERS_CTA(X)
#endif

#ifndef LNORM_CUDA_TIERSET
#define LNORM_CUDA_TIERSET 7
#endif
/* Tier 14 of tier sets 3, 5, 6 and 7 (f32 H = 262144, 16-bit H = 524288): 1024 x 4
 * over 16 CTAs (LNORM_CUDA_T14_1024, default since session 7), or 512 x 8:
 * the same 64 KiB slice a CTA (one CTA an SM either way: three stages of
 * it fill the SM's shared memory), with twice the warps and the gamma/beta
 * register cache of the 4-chunk kernels. Same run on the H200
 * (bench/results/kernels-2026-11-30-ed37161-ab.log): f32 LayerNorm
 * H = 262144 2507 GB/s against 2169, RMSNorm 3485 against 2792. */
#ifndef LNORM_CUDA_T14_1024
#define LNORM_CUDA_T14_1024 1
#endif
#if LNORM_CUDA_T14_1024
#define LNORM__TIER14(X) X(14, 1024, 4, 16)
#else
#define LNORM__TIER14(X) X(14, 512, 8, 16)
#endif
#if LNORM_CUDA_TIERSET == 5
/* Tier set 5 (A/B builds only since set 7 became the default, later in
 * session 7 of 2026-11-30): one 1024 x 4 CTA an SM
 * from tier 12 up (clusters of 4, 8 and 16: a CTA's slice of a row is
 * 64 KiB of shared memory, three stages of it fill the SM), so an SM has
 * half as many cluster reductions per byte as with two 512 x 4 CTAs.
 * Against set 3 (same run on the H200, bench/results/
 * kernels-2026-11-30-3a24394-ab.log): bf16 LayerNorm H = 131072 / 262144
 * 2900 / 2582 GB/s against 2692 / 2314, bf16 RMSNorm 3633 / 3441 against
 * 3523 / 3386, f32 LayerNorm H = 65536 / 131072 3672 / 3187 against
 * 3508 / 2955, f32 RMSNorm 3750 / 3674 against 3767 / 3602. Set 3 (the
 * default of session 5) was set 1 with set 2's tier 11 (256x4 CTAs,
 * clusters of 8: bf16 LayerNorm H = 65536 2350 against 2177 GB/s,
 * bench/results/kernels-2026-11-30-2f1a128-ab). */
#define LNORM__TIERS_CLU(X)  \
    X(10, 512, 4, 2)     \
    X(11, 256, 4, 8)     \
    X(12, 1024, 4, 4)    \
    X(13, 1024, 4, 8)    \
    LNORM__TIER14(X)
#elif LNORM_CUDA_TIERSET == 6
/* Tier set 6 (A/B builds only): set 5 with tier 11 as 1024 x 4 over 2. */
#define LNORM__TIERS_CLU(X)  \
    X(10, 512, 4, 2)     \
    X(11, 1024, 4, 2)    \
    X(12, 1024, 4, 4)    \
    X(13, 1024, 4, 8)    \
    LNORM__TIER14(X)
#elif LNORM_CUDA_TIERSET == 7
/* Tier set 7 (the default since 2026-11-30, session 7): set 6 with tier 10
 * as one 1024 x 4 CTA (the bulk kernel with the row in shared memory, CTA
 * reductions). Against set 5, same run on the H200 (bench/results/
 * kernels-2026-11-30-56652bc-ab.log): bf16 LayerNorm H = 32768 / 65536
 * 3333 / 3128 GB/s against 3071 / 2745, bf16 RMSNorm 3674 / 3628 against
 * 3542 / 3536, f32 LayerNorm H = 16384 / 32768 3710 / 3719 against
 * 3645 / 3560, f32 RMSNorm +1%. So every tier from 10 up is one
 * 1024-thread CTA an SM with a 64 KiB slice of the row. */
#define LNORM__TIERS_CLU(X)  \
    X(10, 1024, 4, 1)    \
    X(11, 1024, 4, 2)    \
    X(12, 1024, 4, 4)    \
    X(13, 1024, 4, 8)    \
    LNORM__TIER14(X)
#elif LNORM_CUDA_TIERSET == 8
/* Tier set 8 (A/B builds only, session 11): set 7 with two chunks a
 * thread in the cluster tiers 11-13, over twice as many CTAs (a 32 KiB
 * slice a CTA, so six stages fill the SM instead of three). Same run on
 * the H200 (bench/results/kernels-2026-11-30-6c1832e-ab.log, build set8;
 * other reduction trees, so other bits): 19-40% slower in every row it
 * changes (bf16 LayerNorm H = 262144 1753 against 2793 GB/s). */
#define LNORM__TIERS_CLU(X)  \
    X(10, 1024, 4, 1)    \
    X(11, 1024, 2, 4)    \
    X(12, 1024, 2, 8)    \
    X(13, 1024, 2, 16)   \
    LNORM__TIER14(X)
#elif LNORM_CUDA_TIERSET == 9
/* Tier set 9 (A/B builds only, session 15): set 7 with the cluster tiers
 * 11-13 as 256 x 8 over 4, 8 and 16 CTAs (a 32 KiB slice a CTA, several
 * CTAs an SM, so one CTA's reduction waits overlap another's passes: the
 * shape Quack uses on the H100). Same run on the H200 (bench/results/
 * kernels-2026-12-01-6e1d713-sets-ab.log, build set9r64: 64 registers,
 * LNORM_CUDA_CLU_REGS8): 14-29% slower in every row it changes (bf16
 * LayerNorm H = 131072 2466 against 3194 GB/s); set 3 in the same run
 * 3-19% slower. */
#define LNORM__TIERS_CLU(X)  \
    X(10, 1024, 4, 1)    \
    X(11, 256, 8, 4)     \
    X(12, 256, 8, 8)     \
    X(13, 256, 8, 16)    \
    LNORM__TIER14(X)
#elif LNORM_CUDA_TIERSET == 10
/* Tier set 10 (A/B builds only, session 16): set 7 with the cluster tiers
 * 11-14 as 512 x 8 over 2, 4, 8 and 16 CTAs: the same 64 KiB slice a CTA
 * (so the same reductions per byte as set 7, unlike sets 3, 8 and 9), but
 * half the threads, so that with LNORM_CUDA_CLU_REGS8=64 two CTAs, each
 * with one stage (LNORM_CUDA_SMR_MIN_STAGES=1), share an SM and one
 * CTA's reduction waits can overlap the other's passes. */
#define LNORM__TIERS_CLU(X)  \
    X(10, 1024, 4, 1)    \
    X(11, 512, 8, 2)     \
    X(12, 512, 8, 4)     \
    X(13, 512, 8, 8)     \
    X(14, 512, 8, 16)
#elif LNORM_CUDA_TIERSET == 3
/* Tier set 3 (the default of session 5): 512 x 4 CTAs in tiers 12-13. */
#define LNORM__TIERS_CLU(X)  \
    X(10, 512, 4, 2)     \
    X(11, 256, 4, 8)     \
    X(12, 512, 4, 8)     \
    X(13, 512, 4, 16)    \
    LNORM__TIER14(X)
#elif LNORM_CUDA_TIERSET == 2
/* Tier set 2 (A/B builds only): clusters of 256x4 CTAs, four an SM, up to
 * H = 131072 bf16 / 65536 f32. Against set 1 on the H200 (same run,
 * bench/results/kernels-2026-11-30-36c81d5-ab.log): bf16 LayerNorm H = 65536
 * +7%, f32 H = 65536 (16-CTA clusters) -3 to -5%, the rest within 2%. */
#define LNORM__TIERS_CLU(X)  \
    X(10, 256, 4, 4)     \
    X(11, 256, 4, 8)     \
    X(12, 256, 4, 16)    \
    X(13, 512, 4, 16)    \
    X(14, 512, 8, 16)
#elif LNORM_CUDA_TIERSET == 1 /* default until set 3: clusters of 512x4 CTAs from H = 32768 (bf16) / 16384 (f32) */
#define LNORM__TIERS_CLU(X)  \
    X(10, 512, 4, 2)     \
    X(11, 512, 4, 4)     \
    X(12, 512, 4, 8)     \
    X(13, 512, 4, 16)    \
    X(14, 512, 8, 16)
#elif LNORM_CUDA_TIERSET == 0 /* before 2026-11-30: one 1024x4 CTA, then clusters of 256x8 CTAs */
#define LNORM__TIERS_CLU(X)  \
    X(10, 1024, 4, 1)    \
    X(11, 256, 8, 4)     \
    X(12, 256, 8, 8)     \
    X(13, 256, 8, 16)    \
    X(14, 512, 8, 16)
#else
#error "LNORM_CUDA_TIERSET: tier sets 0-3, 5-10"
#endif

/* The register tiers of 16-bit x and of f32 x: the same capacities (tier
 * numbers), shapes that differ where LNORM__TIERS_CTA_F32 says so. */
#define LNORM__TIERS(X) LNORM__TIERS_CTA(X) LNORM__TIERS_CLU(X)
#define LNORM__TIERS_F32(X) LNORM__TIERS_CTA_F32(X) LNORM__TIERS_CLU(X)

/* The bulk kernels of a tier read the row from its shared-memory stage in
 * every pass instead of holding it in registers (SMR) in the cluster tiers
 * and in a one-CTA tier of 1024 threads a row (one CTA an SM, whose
 * registers cannot hold the row): host (policy) and kernels decide alike.
 * LNORM_CUDA_CLU_SMEM 0 (A/B builds): never. (The 512-thread tier 9 in
 * this form, two CTAs an SM at 64 registers, was 8-10% slower than k_fast:
 * bf16 LayerNorm H = 16384 3308 against 3648 GB/s, f32 H = 8192 3663
 * against 3984; H200, bench/results/kernels-2026-11-30-f651a5c-ab.log.) */
#ifndef LNORM_CUDA_CLU_SMEM
#define LNORM_CUDA_CLU_SMEM 1
#endif
#define LNORM__SMR(tpr, cl) (((cl) > 1 || (tpr) >= 1024) && LNORM_CUDA_CLU_SMEM)

/* Which SMR kernels take dynamic tiles (kparams.sched) when the launch has
 * a workspace: LayerNorm / RMSNorm ones of up to this many CTAs a row (0:
 * none; the others compile to the fixed-share form alone, whose opcode
 * sequence is the one before dynamic tiles). Same run on the H200
 * (bench/results/kernels-2026-11-30-e9a99a0-ab.log: dynamic tiles in every
 * SMR kernel against build `old`, 0 / 0): one CTA a row (tier 10) f32
 * LayerNorm / RMSNorm H = 16384 3960 / 3964 GB/s against 3739 / 3797, bf16
 * RMSNorm H = 32768 +2%, bf16 LayerNorm H = 32768 equal; RMSNorm in
 * clusters of 2 and 4 +3..+6%; in clusters of 8 and 16 RMSNorm 7-11%
 * slower and LayerNorm in every cluster 2-8% slower (those kernels spill
 * 8-16 bytes with the ticket code compiled in and run slower even with
 * bulk_dynamic 0). */
#ifndef LNORM_CUDA_DYN_LN_CL
#define LNORM_CUDA_DYN_LN_CL 1
#endif
#ifndef LNORM_CUDA_DYN_RMS_CL
#define LNORM_CUDA_DYN_RMS_CL 4
#endif
#define LNORM__DYN(rms, tpr, cl) \
    (LNORM__SMR(tpr, cl) && (cl) <= ((rms) ? LNORM_CUDA_DYN_RMS_CL : LNORM_CUDA_DYN_LN_CL))

/* Number of register tiers; tier LNORM__NREG_TIERS is the streaming one. */
#define LNORM__NREG_TIERS 15

/* Launch tier `tier` for x of dtype F32 / F16 / BF16 on a cudaStream_t;
 * returns the cudaError_t of the launch (0 on success). */
int lnorm__cuda_launch_f32(int tier, const lnorm__kparams *p, void *stream);
int lnorm__cuda_launch_f16(int tier, const lnorm__kparams *p, void *stream);
int lnorm__cuda_launch_bf16(int tier, const lnorm__kparams *p, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_CUDA_IMPL_H */
