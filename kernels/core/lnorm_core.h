/*
 * The normalization core: the one description of work that every backend
 * (CPU, CUDA) executes. Internal to lnormd and its tests; not installed.
 *
 * A batch is a list of segments. A segment is one request's tensor (or a
 * part of it): rows x hidden elements with its own pointers, strides,
 * dtypes, op, eps and options. Backends run a whole batch at once: the CPU
 * runner (kernels/cpu) over a worker pool, the CUDA kernels (kernels/cuda)
 * in one launch from the same table (with device pointers).
 *
 * Numerics (every backend, to the letter; see docs/ARCHITECTURE.md):
 *  - x (and residual) are loaded and converted to fp32 at once; all
 *    statistics in fp32.
 *  - With a residual: h = round_to_x_dtype(float(x) + float(residual)) is
 *    written to residual_out and h is what gets normalized (exactly what an
 *    unfused `h = x + r; y = norm(h)` computes in PyTorch).
 *  - LayerNorm: mean = sum(h) / H; var = sum((h - mean)^2) / H (centred);
 *    RMSNorm: no mean at all, ms = sum(h^2) / H.
 *  - rstd = 1 / sqrt(var + eps) (LNORM_EPS_INSIDE) or 1 / (sqrt(var) + eps).
 *  - y = (h - mean) * rstd * gamma[c] + beta[c]; gamma/beta are 1-D,
 *    indexed by column only; absent gamma = 1, absent beta = 0.
 *  - mean and rstd go to separate fp32 buffers (RMSNorm writes no mean).
 *  - At the edges of fp32 (kernels/core/rescale.h): where those fp32 sums
 *    overflow (var not finite: elements past about 1.8e19, or rows whose
 *    squares add up past FLT_MAX) or are too small for fp32's subnormals
 *    to carry (var < 2^-100 with eps < 2^-40), the row's sums are taken
 *    again over (h - K) scaled by a power of two (2^-90, 2^64), which is
 *    exact, and mean, rstd and y come from those. Results are then as
 *    accurate as in the common case for finite elements whose differences
 *    |h - h[0]| stay below FLT_MAX and for a spread (LayerNorm: the
 *    standard deviation; RMSNorm: the RMS) from 2^-114 (5e-35) to 2^126
 *    (where rstd leaves fp32's normal range); outside, the outputs carry
 *    fp32's subnormal rounding. An Inf or NaN element keeps its IEEE
 *    propagation (LayerNorm: a NaN row; RMSNorm with +-Inf: rstd = 0).
 *  - LayerNorm's mean is K + d with K = h[0], so its error is about
 *    2^-24 |h[0] - mean| (2e-6 of the spread for an outlier in the first
 *    column of a row of 1000); y keeps its bound.
 *  - eps outside the sqrt must be >= FLT_MIN (1.17549435e-38): below, a
 *    constant row's rstd = 1 / eps is not a finite fp32 (validation
 *    refuses it, LNORM_CORE_MIN_EPS_OUTSIDE); inside the sqrt any eps > 0.
 */
#ifndef LNORM_CORE_H
#define LNORM_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "lnorm/errors.h"
#include "lnorm/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Hard upper bound on hidden accepted by the core (2^24 elements). */
#define LNORM_CORE_MAX_HIDDEN (1u << 24)

/* The smallest eps accepted with LNORM_EPS_OUTSIDE: FLT_MIN (2^-126), so
 * that 1 / eps, a constant row's rstd, is a finite fp32. */
#define LNORM_CORE_MIN_EPS_OUTSIDE 0x1p-126f

/* One request's tensor, or a slice of one. Strides are in elements and are
 * the distance between the first elements of consecutive rows; they must be
 * >= hidden. All pointers refer to memory of the backend that runs it. */
typedef struct lnorm_segment {
    int32_t op;          /* lnorm_op */
    int32_t x_dtype;     /* lnorm_dtype of x, residual and residual_out */
    int32_t y_dtype;     /* lnorm_dtype of y (never NONE here) */
    int32_t param_dtype; /* lnorm_dtype of gamma/beta: F32 or x_dtype */
    int32_t eps_mode;    /* lnorm_eps_mode */
    float eps;           /* > 0 and finite */
    int64_t rows;        /* >= 1 */
    int64_t hidden;      /* >= 1 */
    int64_t x_stride;
    int64_t y_stride;
    int64_t res_stride;     /* stride of residual */
    int64_t res_out_stride; /* stride of residual_out */
    const void *x;
    void *y;
    const void *residual; /* optional; then residual_out is required */
    void *residual_out;
    const void *gamma;    /* optional, hidden elements of param_dtype */
    const void *beta;     /* optional, hidden elements of param_dtype */
    float *mean;          /* optional, rows floats; must be NULL for RMSNorm */
    float *rstd;          /* optional, rows floats */
} lnorm_segment;

/* A batch: segments run together. */
typedef struct lnorm_batch {
    const lnorm_segment *segs;
    size_t nsegs;
} lnorm_batch;

/* Fill a segment with defaults for a contiguous rows x hidden tensor:
 * op, dtypes (y and params = x), eps = LNORM_DEFAULT_EPS, strides = hidden,
 * every pointer NULL. */
void lnorm_segment_init(lnorm_segment *s, lnorm_op op, lnorm_dtype x_dtype,
                        int64_t rows, int64_t hidden);

/* Check an eps and its placement (lnorm_eps_mode) as lnorm_segment_validate
 * does: LNORM_OK or LNORM_EINVAL with *why (if why is not NULL) a static
 * message; for codecs that check a request's fields before any work. */
int lnorm_eps_validate(float eps, int eps_mode, const char **why);

/* Check a segment's description (not the memory behind it). Returns
 * LNORM_OK or LNORM_EINVAL; on error, if why is not NULL, *why is set to a
 * static message naming the offending field. */
int lnorm_segment_validate(const lnorm_segment *s, const char **why);

/* ---- CPU runner (kernels/cpu) ------------------------------------------ */

/* An opaque CPU runner: a worker pool plus the vector-ISA choice. */
typedef struct lnorm_cpu lnorm_cpu;

/* Create a CPU runner with nthreads workers (0: the number of online
 * cores). Returns LNORM_OK and sets *out, or an error code. */
int lnorm_cpu_create(lnorm_cpu **out, int nthreads);

/* Destroy a CPU runner created by lnorm_cpu_create (NULL is a no-op). */
void lnorm_cpu_destroy(lnorm_cpu *cpu);

/* The number of worker threads of a CPU runner. */
int lnorm_cpu_threads(const lnorm_cpu *cpu);

/* The name of the vector code path in use ("avx512", "avx2", "scalar"). */
const char *lnorm_cpu_isa(const lnorm_cpu *cpu);

/* Run a batch on the CPU, splitting rows over the workers when the batch is
 * large enough. Validates every segment first and runs nothing if any is
 * invalid (LNORM_EINVAL, *why set as in lnorm_segment_validate). Safe to
 * call from several threads at once on one runner. */
int lnorm_cpu_run(lnorm_cpu *cpu, const lnorm_batch *b, const char **why);

/* Run one segment on the calling thread, with no pool (cpu may be NULL:
 * then the best ISA of this machine is used). */
int lnorm_cpu_run_segment(const lnorm_cpu *cpu, const lnorm_segment *s, const char **why);

/* Force the ISA ("avx512", "avx2", "scalar") for tests and benchmarks;
 * LNORM_ENOTSUP if this machine lacks it. */
int lnorm_cpu_set_isa(lnorm_cpu *cpu, const char *isa);

/* ---- Backward -----------------------------------------------------------
 *
 * Given the tensor the forward normalized (x: h when a residual was fused),
 * the gradient of its output dy, gamma (optional) and the forward's
 * statistics (optional: recomputed from x with the forward's numerics, eps
 * and eps_mode, when not given), compute
 *   LayerNorm: xhat = (x - mean) * rstd, g = dy * gamma (dy if no gamma),
 *     dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))      [eps inside]
 *   RMSNorm:   xhat = x * rstd,
 *     dx = rstd * (g - xhat * mean_c(g * xhat))                  [eps inside]
 *   with mean_c the mean over the row's H columns. With eps outside the
 *   sqrt (rstd = 1 / (sigma + eps), sigma = sqrt(var) or the RMS), the
 *   xhat term is divided by sigma * rstd = sigma / (sigma + eps):
 *   dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat) / (sigma * rstd))
 *   (RMSNorm without mean_c(g)); sigma * rstd is recomputed from x (e.g.
 *   as the RMS of xhat over the row), and the term is 0 for a row with
 *   sigma = 0 (every xhat is 0 there).
 *   A given mean carries fp32's rounding (ulp(mean), a large part of the
 *   spread when mean >> spread); a backend may re-centre xhat by its row
 *   mean (0 in exact arithmetic) so that this rounding does not reach dx
 *   and dgamma (the CPU backend does).
 *   dx += dres when dres (the gradient that reached residual_out from
 *   later layers) is given: the fused residual add passes the gradient
 *   through, so dx is the gradient of both x and the residual.
 *   dgamma[c] = sum over rows of dy * xhat; dbeta[c] = sum over rows of dy
 *   (both ops: lnormd's RMSNorm takes a beta too).
 * fp32 everywhere: x, dy, gamma, dres are converted on load; dx is rounded
 * to dx_dtype once at the end; dgamma/dbeta are fp32.
 * dgamma/dbeta are reduced over rows deterministically: for a given segment
 * (its rows, hidden, dtypes and data) the bits are the same whatever batch
 * it runs in, whatever the device, its SM count or the number of GPUs; the
 * reduction order is a function of (rows, hidden) only, written down by
 * each backend. The backends need not agree with each other bit for bit.
 * A row whose statistics are not finite gives a NaN/Inf dx row and adds
 * its non-finite terms to dgamma/dbeta, as the unfused formula does; a
 * NaN/Inf in dy or gamma makes its row's dx (and its column's sums)
 * non-finite; other rows are unaffected. Constant rows: xhat = 0, so
 * dx = rstd * (g - mean_c(g)) (+ dres), finite.
 * No output may overlap an input (dgamma/dbeta read x and dy after dx is
 * written).
 */

/* One request's backward (or a part of one, split by rows: then the caller
 * sums the parts' dgamma/dbeta itself). Strides in elements, >= hidden. */
typedef struct lnorm_bwd_segment {
    int32_t op;          /* lnorm_op */
    int32_t x_dtype;     /* lnorm_dtype of x and dres */
    int32_t dy_dtype;    /* lnorm_dtype of dy */
    int32_t dx_dtype;    /* lnorm_dtype of dx (never NONE here) */
    int32_t param_dtype; /* lnorm_dtype of gamma: F32 or x_dtype */
    int32_t eps_mode;    /* lnorm_eps_mode of the forward */
    float eps;           /* the forward's eps */
    int64_t rows;
    int64_t hidden;
    int64_t x_stride;
    int64_t dy_stride;
    int64_t dx_stride;
    int64_t dres_stride;
    const void *x;
    const void *dy;
    void *dx;
    const void *dres;     /* optional */
    const void *gamma;    /* optional, hidden elements of param_dtype */
    const float *mean;    /* optional; LayerNorm: with rstd or not at all; RMSNorm: NULL */
    const float *rstd;    /* optional; recomputed when NULL */
    float *dgamma;        /* optional, hidden floats */
    float *dbeta;         /* optional, hidden floats */
} lnorm_bwd_segment;

typedef struct lnorm_bwd_batch {
    const lnorm_bwd_segment *segs;
    size_t nsegs;
} lnorm_bwd_batch;

/* Defaults for a contiguous rows x hidden backward: op, every dtype = x's
 * (param too), eps = LNORM_DEFAULT_EPS inside, strides = hidden, pointers
 * NULL. */
void lnorm_bwd_segment_init(lnorm_bwd_segment *s, lnorm_op op, lnorm_dtype x_dtype,
                            int64_t rows, int64_t hidden);

/* Check a backward segment's description, as lnorm_segment_validate. */
int lnorm_bwd_segment_validate(const lnorm_bwd_segment *s, const char **why);

/* Run a backward batch on the CPU (validates every segment first, as
 * lnorm_cpu_run). Safe from several threads at once on one runner. */
int lnorm_cpu_run_bwd(lnorm_cpu *cpu, const lnorm_bwd_batch *b, const char **why);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_CORE_H */
