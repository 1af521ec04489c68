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

/* Fast-path variants (lnorm_cuda_fast.cuh, lnorm_cuda_bulk.cuh): a
 * segment with y dtype = x dtype, no residual, parameters of x's dtype or
 * f32 (k_fast in the tiers of one CTA a row, k_bulk in every tier).
 * Chosen from the segment alone. */
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

/* Run-time choice of kernel form (lnorm_cuda_set_tuning), so that the tests
 * can run every form of a row and compare their bits. Defined in
 * lnorm_cuda_run.c.
 * lnorm__bulk_enabled: the bulk kernels off, where they pay (1), wherever
 * rows allow (2). lnorm__bulk_stages_override / lnorm__bulk_ctas_override:
 * stages a CTA and resident CTAs an SM of a bulk launch (0: the
 * launcher's choice). */
extern int lnorm__fast_enabled; /* the fast and bulk kernels (1), or the general kernels for every segment (0) */
extern int lnorm__bulk_enabled;
extern int lnorm__bulk_stages_override;
extern int lnorm__bulk_ctas_override;
/* Grid of k_fast: 0 by tier (one tile a CTA; persistent CTAs for
 * 1024-thread CTAs), 1 persistent (a few waves of resident CTAs looping
 * over the tiles), 2 one tile a CTA. */
extern int lnorm__fast_grid;
/* Cap on the CTAs (clusters) of a k_fast or k_bulk launch, 0 = none
 * (lnorm_cuda_set_tuning "fwd_grid"; the tests' many rows a CTA put on
 * the rescue list); never changes the bits. */
extern int lnorm__fwd_grid;
/* k_fast's straight-line form (AL: vector accesses only, for segments
 * whose x, y, gamma, beta, strides and H are whole 16-byte units): 0
 * never, 1 where it pays (lnorm__al_pays), 2 wherever rows allow. */
extern int lnorm__fast_aligned;
/* k_fast's re-read form (RR: the AL form holding nothing of the row
 * between passes, each pass reading it again through L1), in the one-CTA
 * tiers of at least LNORM__RR_MIN_TPR threads a row: 0 never, 1 where
 * lnorm__rr_use says, 2 wherever a segment takes the AL form (in the
 * 1024-thread tier 10 instead of the bulk kernel). */
extern int lnorm__fast_reread;
#define LNORM__RR_MIN_TPR 128 /* (fewer kernels to compile) */
static inline int lnorm__rr_use(int rms, int tpr)
{
    if (tpr < LNORM__RR_MIN_TPR || lnorm__fast_reread == 0)
        return 0;
    if (lnorm__fast_reread == 2)
        return 1;
    /* RMSNorm in tier 10: 1-2% over the bulk kernel; LayerNorm 6-25% slower, tiers 7-9 no gain (H200) */
    return rms && tpr >= 1024;
}
/* Launches of each form (lnorm_cuda_stat): the straight-line and re-read
 * forms of k_fast, the bulk kernels, bulk launches that fell back to the
 * kernels without bulk copies, and bulk launches with dynamic tiles. */
extern long lnorm__al_launches;
extern long lnorm__rr_launches;
extern long lnorm__bulk_launches;
extern long lnorm__bulk_fallbacks;
extern long lnorm__dyn_launches;

/* The rows of a fast or bulk launch that need the rescue (rescale.h),
 * which those kernels leave to the general kernel: each such row (with the
 * rows that reduce with it) is counted in `count` and, among the first
 * LNORM__RESCUE_CAP, listed in `rows` (the launch's row numbering). The
 * drain (k_reg's list form, launched right after on the same stream) takes
 * the listed rows, or every row of the launch once the count passes the
 * cap, and its last CTA puts count and done (its CTAs that finished) back
 * to 0. Device memory of the launch's workspace (one per stream), zero
 * between launches. */
#define LNORM__RESCUE_CAP 1024
typedef struct lnorm__rescue {
    unsigned int count;
    unsigned int done;
    int64_t rows[LNORM__RESCUE_CAP];
} lnorm__rescue;

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
    /* The rescue list of a fast or bulk launch (lnorm__rescue); never NULL
     * when fast is not LNORM__FAST_NONE. */
    lnorm__rescue *rescue;
} lnorm__kparams;

/* The tiers, by hidden size. A register tier holds the row in registers
 * as raw x-dtype bits: TPR threads per row, NCH 16-byte chunks per thread,
 * CL CTAs per row (a thread block cluster when CL > 1); it holds
 * TPR * NCH * CL * (16 / sizeof(x)) elements. The tier after the last
 * register tier streams the row. X(tier, TPR, NCH, CL). */
#define LNORM__TIERS_CTA_HI(X) \
    X(7, 128, 4, 1)            \
    X(8, 256, 4, 1)            \
    X(9, 512, 4, 1)
/* 16-bit x: one CTA a row up to tier 9. */
#define LNORM__TIERS_CTA(X) \
    X(0, 1, 4, 1)           \
    X(1, 2, 4, 1)           \
    X(2, 4, 4, 1)           \
    X(3, 8, 4, 1)           \
    X(4, 16, 4, 1)          \
    X(5, 32, 4, 1)          \
    X(6, 64, 4, 1)          \
    LNORM__TIERS_CTA_HI(X)
/* f32 x: tiers 0-6 with two chunks a thread and twice the threads, the
 * same capacities (so the same tier numbers): f32 H = 128-1024 2-3% faster
 * than four chunks; from H = 2048 up, and for 16-bit x, slower (H200). */
#define LNORM__TIERS_CTA_F32(X) \
    X(0, 2, 2, 1)               \
    X(1, 4, 2, 1)               \
    X(2, 8, 2, 1)               \
    X(3, 16, 2, 1)              \
    X(4, 32, 2, 1)              \
    X(5, 64, 2, 1)              \
    X(6, 128, 2, 1)             \
    LNORM__TIERS_CTA_HI(X)
/* From tier 10 up, one 1024 x 4 CTA an SM with a 64 KiB slice of the row:
 * 3-10% faster than 512 x 4 CTAs over twice the clusters, 1024 x 4 over 2
 * CTAs or 256 x 8 / 512 x 8 over more (H200). */
#define LNORM__TIERS_CLU(X) \
    X(10, 1024, 4, 1)       \
    X(11, 1024, 4, 2)       \
    X(12, 1024, 4, 4)       \
    X(13, 1024, 4, 8)       \
    X(14, 1024, 4, 16)
#define LNORM__TIERS(X) LNORM__TIERS_CTA(X) LNORM__TIERS_CLU(X)
#define LNORM__TIERS_F32(X) LNORM__TIERS_CTA_F32(X) LNORM__TIERS_CLU(X)

/* Threads of the fast and bulk kernels' CTAs in the tiers of fewer threads
 * a row (several rows a CTA): a CTA of two warps starts the next one's
 * loads as soon as its rows are written (bf16 +1-2% against 128; 32 was
 * 20% slower for f32 H <= 256, H200). */
#define LNORM__MIN_BLOCK 64

/* The bulk kernels of a tier read the row from its shared-memory stage in
 * every pass instead of holding it in registers (SMR) in the cluster tiers
 * and in a one-CTA tier of 1024 threads a row (one CTA an SM, whose
 * registers cannot hold the row): host (policy) and kernels decide alike. */
#define LNORM__SMR(tpr, cl) ((cl) > 1 || (tpr) >= 1024)

/* Which SMR kernels take dynamic tiles (kparams.sched) when the launch has
 * a workspace: LayerNorm in one CTA a row, RMSNorm in up to 4 CTAs a row
 * (+2-6% there; larger clusters spilled and ran 2-11% slower, H200). The
 * others compile to the fixed-share form alone. */
#define LNORM__DYN(rms, tpr, cl) (LNORM__SMR(tpr, cl) && (cl) <= ((rms) ? 4 : 1))

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
