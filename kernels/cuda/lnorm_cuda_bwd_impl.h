/*
 * Internal to the CUDA backend's backward pass (lnorm_cuda_bwd.cuh): the
 * segment table as its kernels read it, its tiers, and the launchers.
 */
#ifndef LNORM_CUDA_BWD_IMPL_H
#define LNORM_CUDA_BWD_IMPL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One backward segment as the kernels read it (device pointers). Its rows
 * are cut into row groups of grows rows (the last one shorter): one CTA
 * (cluster) takes a group at a time and writes the group's dgamma/dbeta
 * partial sums to pdg/pdb ([ngroups][hidden] floats, NULL when not asked
 * for); k_bwd_reduce then sums the partials over the groups. group_begin:
 * the segment's first group in its launch; cblk_begin: its first block of
 * LNORM__BWD_RCOLS columns in the reduction launch. */
typedef struct lnorm__bseg {
    const void *x;
    const void *dy;
    void *dx;
    const void *dres;
    const void *gamma;
    const float *mean;
    const float *rstd;
    float *dgamma;
    float *dbeta;
    float *pdg;
    float *pdb;
    int64_t x_stride;
    int64_t dy_stride;
    int64_t dx_stride;
    int64_t dres_stride;
    int64_t hidden;
    int64_t rows;
    int64_t group_begin;
    int64_t cblk_begin;
    int64_t grows;
    int64_t ngroups;
    float eps;
    int32_t op;
    int32_t dy_dtype;
    int32_t dx_dtype;
    int32_t param_dtype;
    int32_t eps_mode;
    int32_t pair; /* the fast form's rows two at a time (lnorm__bwd_pair_ok) */
} lnorm__bseg;

/* A launch: a device table of nsegs segments sorted by group_begin (main
 * kernels) or cblk_begin (k_bwd_reduce), or (table NULL) the single
 * segment `one` inline; total: the launch's groups or column blocks. */
typedef struct lnorm__bparams {
    const lnorm__bseg *table;
    int64_t total;
    int32_t nsegs;
    int32_t pad_;
    lnorm__bseg one;
} lnorm__bparams;

/* Columns a CTA of k_bwd_reduce sums (one a lane of each of its warps). */
#define LNORM__BWD_RCOLS 32

/* The backward tiers, by hidden size: every thread holds 16 columns of a
 * row (two 16-byte chunks of 16-bit x, four of f32 x) and its 16 dgamma
 * and 16 dbeta accumulators in registers; TPR threads a row, CL CTAs a row
 * (a thread-block cluster). Tier i < 10: TPR = 2^i, CL = 1 (H <= 8192);
 * tiers 10-13: TPR = 512, CL = 2, 4, 8, 16 (H <= 131072); tier 14, the
 * wide tier, any H: a cluster of LNORM__BWD_WIDE_CL CTAs a row group, the
 * row in passes of 16 columns a thread, its sums for all the group's rows
 * reduced at once, x and dy read twice. Why 16 columns: every row costs
 * its CTA (cluster) a reduction, whose barriers stall the row's threads;
 * with 8 columns a thread (1024 threads a row of 8192) bf16 ran at 0.4-0.6
 * of copy whatever the bytes in flight (2 or 4 stages alike, H200). */
#define LNORM__BWD_NTIERS 14   /* register tiers; tier 14 is the wide tier */
#define LNORM__BWD_COLS 16     /* columns a thread */
#define LNORM__BWD_CTA_TIERS 10 /* tiers of one CTA a row: TPR = 1 .. 512 */
#define LNORM__BWD_TPR_MAX 512 /* threads a CTA in the cluster tiers */
/* Threads an SM (128 registers each) and shared-memory stage bytes a
 * thread of the fast form (16-bit x: 6 stages, f32: 3; 192 KiB an SM). */
#define LNORM__BWD_SM_THREADS 512
#define LNORM__BWD_STAGE_BYTES 384
/* The wide tier: threads a CTA (two CTAs an SM, 128 registers a thread),
 * CTAs a cluster (portable; 32 clusters of 8 fit an H200 at once), columns
 * a thread a pass (8: with 16, its accumulators and the next row's chunks
 * spilled), and the most rows a row group has (the host's rule). */
#define LNORM__BWD_WIDE_BLOCK 256
#define LNORM__BWD_WIDE_CL 8
#define LNORM__BWD_WIDE_COLS 8
/* Shared-memory stage bytes a thread of the wide tier's fast form (64 KiB
 * a CTA, two CTAs an SM). */
#define LNORM__BWD_WIDE_STAGE_BYTES 256
#define LNORM__BWD_GROWS_MAX 64

/* Cap on the CTAs (clusters) of a main backward launch, 0 = one a row
 * group (lnorm_cuda_set_tuning "bwd_grid"); never changes the bits. */
extern int lnorm__bwd_grid;
/* Hidden sizes from which the wide tier runs, 0 = past the register tiers
 * only (lnorm_cuda_set_tuning "bwd_wide"): for tests and benchmarks of the
 * wide tier at sizes the register tiers hold. */
extern int64_t lnorm__bwd_wide_min;
/* Where the register tiers' fast form takes rows two at a time when the
 * statistics are given (lnorm_cuda_set_tuning "bwd_pair"): 0 never, 1
 * where it pays (default: 16-bit x), 2 for every dtype. */
#define LNORM__INIT_BWD_PAIR 1
extern int lnorm__bwd_pair;

/* Launch backward tier `tier` for x of dtype F32 / F16 / BF16 (fast: every
 * segment of the launch qualifies for the fast form, lnorm__bwd_fast_ok),
 * and the dgamma/dbeta reduction, on a cudaStream_t; return the
 * cudaError_t. */
int lnorm__cuda_bwd_launch_f32(int tier, int fast, const lnorm__bparams *p, void *stream);
int lnorm__cuda_bwd_launch_f16(int tier, int fast, const lnorm__bparams *p, void *stream);
int lnorm__cuda_bwd_launch_bf16(int tier, int fast, const lnorm__bparams *p, void *stream);
int lnorm__cuda_bwd_reduce(const lnorm__bparams *p, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_CUDA_BWD_IMPL_H */
