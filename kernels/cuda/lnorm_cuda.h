/*
 * The CUDA backend of the normalization core: LayerNorm and RMSNorm over a
 * batch of segments (kernels/core/lnorm_core.h) whose pointers are DEVICE
 * pointers. Numerics are the core's, to the letter; docs/gpu.md describes
 * the kernels (hidden-size tiers, vector widths, clusters).
 *
 * One launch runs every segment of a batch that falls in the same
 * (x dtype, hidden-size tier, fast-path variant) group; a batch mixing
 * groups takes one launch per group, all on the same stream
 * (lnorm_cuda_launch_count says how many).
 */
#ifndef LNORM_CUDA_H
#define LNORM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "lnorm_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A workspace for batches of more than one segment: a pinned host staging
 * table and a device copy of it, bound to whatever stream runs it, the
 * counters through which the CTAs of the long-row kernels (tiers of 1024
 * threads a row and up) take their rows as they go (dynamic tiles; without
 * a workspace each CTA takes a fixed share), and the rescue list on which
 * the fast kernels leave the rows whose sums leave fp32's range to the
 * general kernel (without a workspace each fast launch takes one from the
 * stream's memory pool). Not thread-safe: one workspace per stream (per
 * backend slot); launches with one workspace must not run concurrently. */
typedef struct lnorm_cuda_ws lnorm_cuda_ws;

/* Create a workspace that holds up to max_segs segments per upload on the
 * current CUDA device. Returns LNORM_OK, LNORM_ENOMEM or LNORM_ECUDA. */
int lnorm_cuda_ws_create(lnorm_cuda_ws **out, size_t max_segs);

/* Free a workspace (NULL is a no-op); waits for its last upload first. */
void lnorm_cuda_ws_destroy(lnorm_cuda_ws *ws);

/* Validate every segment of b (nothing runs if one is invalid: LNORM_EINVAL
 * and *why set), then enqueue the batch on stream (a cudaStream_t, NULL for
 * the default stream) on the current device. ws may be NULL only when the
 * batch has a single segment (the long-row kernels then take fixed shares
 * of the rows; same results). Returns LNORM_OK once everything is enqueued,
 * or LNORM_ECUDA (*why names the failing call) if a CUDA call failed. */
int lnorm_cuda_run(const lnorm_batch *b, void *stream, lnorm_cuda_ws *ws, const char **why);

/* Run one segment (device pointers) on stream, with no workspace: a fast
 * launch allocates its rescue list from the stream's memory pool
 * (cudaMallocAsync) and frees it after the launch, or where the pool has
 * none to give runs the general kernel (same results). lnorm_cuda_run with
 * a workspace saves those calls. */
int lnorm_cuda_run_segment(const lnorm_segment *s, void *stream, const char **why);

/* The number of kernels lnorm_cuda_run launches for batch b (the number
 * of distinct (x dtype, tier, fast-path variant) groups; each fast kernel
 * is followed by its rescue list's drain, a launch that returns at once
 * unless rows need the rescue), or -1 if b is invalid. */
int lnorm_cuda_launch_count(const lnorm_batch *b);

/* The tier a segment with this x dtype and hidden size runs in (0 = the
 * smallest), and a short description of it in *desc if desc is not NULL:
 * "reg<threads per row>x<16-byte chunks per thread>cl<CTAs per row>" or
 * "stream1024". -1 for an invalid dtype or hidden < 1. */
int lnorm_cuda_tier(int x_dtype, int64_t hidden, const char **desc);

/* Whether the kernels read x and residual and write y, residual_out, mean
 * and rstd of segment s (device pointers, or host pointers of the same
 * alignment) with plain loads and stores only, no bulk copies: then those
 * tensors may lie in host memory mapped for the device
 * (cudaHostRegisterMapped) and the kernel itself moves them over PCIe.
 * A function of the segment alone (its tier, form and alignment); 0 for an
 * invalid segment. Conservative when gamma/beta are host pointers that
 * the caller places elsewhere. */
int lnorm_cuda_plain_io(const lnorm_segment *s);

/* Simple entry point for ctypes harnesses: one contiguous-or-strided
 * segment given by plain arguments (device pointers, optional ones NULL;
 * dtypes as lnorm_dtype, y_dtype/param_dtype 0 = same as x). Runs on
 * stream, with the workspace ws of that stream if not NULL (as
 * lnorm_cuda_run), and returns an lnorm error code. */
int lnorm_cuda_norm(int op, int x_dtype, int y_dtype, int param_dtype, int64_t rows, int64_t hidden,
                    int64_t x_stride, int64_t y_stride, const void *x, void *y, const void *residual,
                    void *residual_out, const void *gamma, const void *beta, float *mean, float *rstd,
                    float eps, int eps_mode, void *stream, lnorm_cuda_ws *ws);

/* The kernel form a segment takes, for tests and profiling that run a row
 * through every form and compare the bits (process-wide, not thread-safe
 * against concurrent launches; every setting gives the same output bits):
 * "fast" 0/1 (the fast and bulk kernels where a segment allows (default),
 * or the general kernels for every segment), "bulk" 0/1/2 (the bulk-copy kernels: off, where they pay (default),
 * wherever rows allow), "bulk_stages" 0 or 2..8 (stages a CTA, 0 = chosen
 * per launch), "bulk_ctas" 0..64 (cap on resident CTAs per SM, 0 = none),
 * "fast_grid" 0/1/2 (grid of the fast kernel: by tier (default),
 * persistent CTAs, one tile per CTA), "fast_aligned" 0/1/2 (the
 * straight-line form of the fast kernel for segments whose x, y, gamma and
 * beta are 16-byte aligned and whose H and strides are whole 16-byte
 * units: off, where it pays (default), wherever rows allow), "fast_reread"
 * 0/1/2 (the fast kernel's re-read form, which reads the row again in each
 * pass instead of holding it in registers, in the tiers of 128 threads a
 * row and more: off, where it pays (default), wherever the straight-line
 * form runs, and in the 1024-thread one-CTA tier instead of the bulk
 * kernel); "fwd_grid" N >= 0 (the fast and bulk kernels use at most N
 * CTAs (clusters), each then taking many rows; 0 = no cap); "bwd_grid" N >= 0 (the backward's main launches use at most N
 * CTAs (clusters), which then loop over the row groups; 0 = one a group);
 * "bwd_wide" N >= 0 (the backward's wide tier for every hidden size >= N;
 * 0 = only where the register tiers end); "bwd_pair" 0/1/2 (the backward
 * register tiers' fast form, statistics given, eps inside, takes a CTA's
 * rows two at a time, one reduction for both: never, where it pays
 * (default: 16-bit x), for every dtype); "defaults" 0 puts every setting back. Returns LNORM_EINVAL for an
 * unknown name or value. */
int lnorm_cuda_set_tuning(const char *name, int value);

/* Process-wide counters, for tests and benchmarks: "bulk_launches" (launches
 * that ran the bulk-copy kernels), "bulk_fallbacks" (launches marked for
 * them that ran the kernels without bulk copies because the stages did not
 * fit or the device refused the set-up), "aligned_launches" (launches of
 * the fast kernel's straight-line form), "reread_launches" (those of its
 * re-read form) and "dynamic_launches" (bulk launches whose CTAs took
 * dynamic tiles). -1 for an unknown name. */
long lnorm_cuda_stat(const char *name);

/* ---- Backward (kernels/core/lnorm_core.h, lnorm_bwd_segment) ---------- */

/* Bytes of device scratch lnorm_cuda_run_bwd needs for batch b (the
 * per-row-group dgamma/dbeta partials), 0 if none, or SIZE_MAX if b is
 * invalid. */
size_t lnorm_cuda_bwd_scratch_bytes(const lnorm_bwd_batch *b);

/* Validate, then enqueue backward batch b (device pointers) on stream,
 * using scratch (device memory of at least lnorm_cuda_bwd_scratch_bytes)
 * for the dgamma/dbeta partials. Returns as lnorm_cuda_run. */
int lnorm_cuda_run_bwd(const lnorm_bwd_batch *b, void *stream, void *scratch, size_t scratch_bytes,
                       const char **why);

/* The backward tier of a segment with this x dtype and hidden size, and a
 * short description in *desc if not NULL ("bwd<threads a row>cl<CTAs a
 * row>" or "bwdwide256cl8"); -1 for an invalid dtype or hidden < 1. */
int lnorm_cuda_bwd_tier(int x_dtype, int64_t hidden, const char **desc);

/* Kernel launches lnorm_cuda_run_bwd makes for batch b (one per (x dtype,
 * backward tier, kernel form) group, plus one dgamma/dbeta reduction when a
 * segment asks for either), or -1 if b is invalid. */
int lnorm_cuda_bwd_launch_count(const lnorm_bwd_batch *b);

/* ctypes entry points of the backward (bench/kernels.py --bwd): the scratch
 * bytes of one contiguous segment (-1 if invalid), and one segment given by
 * plain arguments (device pointers, optional ones NULL; dtypes as
 * lnorm_dtype, 0 = x's; strides 0 = hidden; dres has x's stride) run on
 * stream with scratch. Return an lnorm error code. */
int64_t lnorm_cuda_norm_bwd_scratch(int op, int x_dtype, int64_t rows, int64_t hidden, int dgamma, int dbeta);
int lnorm_cuda_norm_bwd(int op, int x_dtype, int dy_dtype, int dx_dtype, int param_dtype, int64_t rows,
                        int64_t hidden, int64_t x_stride, int64_t dy_stride, int64_t dx_stride, const void *x,
                        const void *dy, void *dx, const void *dres, const void *gamma, const float *mean,
                        const float *rstd, float *dgamma, float *dbeta, float eps, int eps_mode, void *stream,
                        void *scratch, size_t scratch_bytes);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_CUDA_H */
