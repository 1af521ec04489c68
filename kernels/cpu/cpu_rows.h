/*
 * Internal to the CPU runner: the per-ISA row kernels. Each one computes
 * rows [r0, r1) of a validated segment on the calling thread, one row at a
 * time in a fixed order (so a row's result never depends on the batch, its
 * position or the thread). Numerics, shared by every path:
 *  - h is loaded and converted to fp32 at once (with a residual,
 *    h = round_to_x_dtype(float(x) + float(r)) is written to residual_out
 *    first and read back from there by the later passes);
 *  - LayerNorm: the row is shifted by K = h[0] (exact for nearby values),
 *    d = sum(h - K) / H, mean = K + d; var = sum(((h - K) - d)^2) / H, a
 *    centred second pass; this keeps cancellation (mean >> spread) out of
 *    the result. RMSNorm: ms = sum(h^2) / H, no mean at all;
 *  - sums run in blocks of a fixed number of columns (several fp32 lanes
 *    each), block sums combined by compensated (Kahan) fp32 addition, so
 *    the error stays a few units of fp32 rounding even for H = 2^18 (a
 *    plain running sum of the block sums is kept too and used when it is
 *    not finite, so Inf/NaN propagate as in an uncompensated sum);
 *  - a row whose var overflowed or is too small for fp32's subnormals
 *    (lnorm__rescale_needed) gets d and rstd again from the same sums over
 *    (h - K) scaled by a power of two (kernels/core/rescale.h), out of line;
 *  - y = ((h - K) - d) * rstd * gamma[c] + beta[c].
 */
#ifndef LNORM_CPU_ROWS_H
#define LNORM_CPU_ROWS_H

#include <stdint.h>

#include "lnorm_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Compute rows [r0, r1) of the validated segment s on the calling thread.
 * With s->y NULL (never from a validated segment) only mean and rstd are
 * written: the backward's recomputation of the forward's statistics. */
typedef void lnorm__cpu_rows_fn(const lnorm_segment *s, int64_t r0, int64_t r1);

/* Portable C path. */
void lnorm__cpu_rows_scalar(const lnorm_segment *s, int64_t r0, int64_t r1);
/* AVX2 + FMA + F16C path (compiled with those flags; call only if present). */
void lnorm__cpu_rows_avx2(const lnorm_segment *s, int64_t r0, int64_t r1);
/* AVX-512 F/BW/VL path (compiled with those flags; call only if present). */
void lnorm__cpu_rows_avx512(const lnorm_segment *s, int64_t r0, int64_t r1);

struct lnorm__pool;
/* The row kernel and the pool of a runner (for the backward, cpu_bwd.c). */
lnorm__cpu_rows_fn *lnorm__cpu_rows_of(const lnorm_cpu *cpu);
struct lnorm__pool *lnorm__cpu_pool_of(lnorm_cpu *cpu);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_CPU_ROWS_H */
