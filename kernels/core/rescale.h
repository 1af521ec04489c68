/*
 * The rescue of a row's statistics at the edges of fp32, shared by every
 * backend (C for the CPU rows, C++ for the CUDA kernels).
 *
 * A backend first computes d (LayerNorm's mean shift) and var (or RMSNorm's
 * mean square) with plain fp32 sums, as in lnorm_core.h. Those sums fail in
 * two ranges: a square or a sum past FLT_MAX (an element of 3e19, a row of
 * N(0, 1e19)) makes var Inf, and squares below FLT_MIN (a row of
 * N(0, 1e-22)) are subnormal, each rounded to a multiple of 2^-149. Then,
 * and only then (lnorm__rescale_needed: one test a row, so the common case
 * costs nothing), the backend sums again over t = (h - K) * sc, sc a power
 * of two (lnorm__rescale_factor), exactly as before but on t:
 *   ds = sum(t) / H (LayerNorm; 0 for RMSNorm, whose K is 0),
 *   vs = sum((t - ds)^2) / H,
 * and lnorm__rescaled turns (ds, vs) back into d = ds / sc and rstd. A
 * scaling by a power of two is exact and commutes with every rounding
 * outside the subnormal and overflow ranges, which sc keeps the sums out of:
 *  - var not finite: sc = 2^-90. Elements up to FLT_MAX become < 2^39, their
 *    squares < 2^78, sums < 2^102; var >= 2^104 there (its sum overflowed
 *    or an element did), so vs >= 2^-76 and no subnormal matters.
 *  - var < 2^-100 and eps < 2^-40: sc = 2^64. Every |h - K| is then below
 *    2^-37 (the sum of squares bounds each one), so t < 2^27; vs stays
 *    normal down to var = 2^-228 (a spread of 2^-114 = 5e-35). With
 *    eps >= 2^-40, or var >= 2^-100, the subnormal roundings (at most a
 *    few 2^-149 in var) are below 2^-33 of var + eps and of
 *    sqrt(var) + eps, so the plain result stands.
 * A row with an Inf or NaN element gives a non-finite vs too; then the
 * plain d and rstd stand (NaN/Inf propagate exactly as without rescue).
 */
#ifndef LNORM_RESCALE_H
#define LNORM_RESCALE_H

#include <float.h>
#include <math.h>

#include "lnorm/types.h"

#ifdef __CUDACC__
#define LNORM__HD static __host__ __device__ __forceinline__
#else
#define LNORM__HD static inline
#endif

#define LNORM__TINY_VAR 0x1p-100f /* var below this ... */
#define LNORM__TINY_EPS 0x1p-40f  /* ... with eps below this: rescue */
#define LNORM__SC_UP 0x1p64f      /* the factor for tiny rows */
#define LNORM__SC_DOWN 0x1p-90f   /* the factor for rows whose sums overflowed */

/* rstd from var (or the mean square): eps inside or outside the sqrt. */
LNORM__HD float lnorm__rstd(float var, float eps, int eps_mode)
{
    return eps_mode == LNORM_EPS_OUTSIDE ? 1.0f / (sqrtf(var) + eps) : 1.0f / sqrtf(var + eps);
}

/* Whether var from the plain fp32 sums must be computed again, scaled. */
LNORM__HD int lnorm__rescale_needed(float var, float eps)
{
    return !(var <= FLT_MAX) || (var < LNORM__TINY_VAR && eps < LNORM__TINY_EPS);
}

/* The power of two the rescued sums scale h - K by. */
LNORM__HD float lnorm__rescale_factor(float var)
{
    return var < LNORM__TINY_VAR ? LNORM__SC_UP : LNORM__SC_DOWN;
}

/* d and rstd from the scaled sums ds = d * sc and vs = var * sc^2
 * (rstd = sc / sqrt(vs + eps sc^2), or sc / (sqrt(vs) + eps sc)); left as
 * they are when vs is not finite (an Inf/NaN element). */
LNORM__HD void lnorm__rescaled(float ds, float vs, float sc, float eps, int eps_mode, float *d, float *rstd)
{
    if (!(vs <= FLT_MAX))
        return;
    const float es = eps * sc;
    *d = ds * (1.0f / sc);
    *rstd = sc * (eps_mode == LNORM_EPS_OUTSIDE ? 1.0f / (sqrtf(vs) + es) : 1.0f / sqrtf(vs + es * sc));
}

#endif /* LNORM_RESCALE_H */
