/*
 * The backward's test vocabulary (lnorm_bwd_segment, lnorm_core.h): a case
 * builder (random x and dy, poisoned outputs, optional padding between
 * rows, the forward's mean/rstd when stats are given), an independent
 * float64 reference of the analytic gradient, and its checker.
 *
 * The reference takes mean, var and rstd of x in double (never the given
 * statistics), xhat = (x - mean) * rstd, g = dy * gamma and
 *   dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat) / f) + dres
 * (RMSNorm without mean_c(g) and mean; f = 1 with eps inside the sqrt,
 * sigma * rstd outside, the term 0 where sigma = 0),
 * dgamma[c] = sum_r dy * xhat, dbeta[c] = sum_r dy.
 * Tolerances (lnorm_test_bwd_check):
 *  - f32 dx: |dx - ref| <= rtol * (rstd * (|g_c| + mean_c|g| +
 *    (|xhat_c| + 1) * mean_c|g * xhat| / f) + |dres_c|), the scale of the
 *    terms an fp32 computation rounds (the + 1: fp32 statistics shift xhat
 *    by a few u absolute); rtol default 4e-6, about 67 u. f16/bf16 dx: that
 *    bound plus one ulp of the dtype at the reference; an infinity only
 *    where the reference plus the bound rounds to it.
 *  - dgamma: rtol * sum_r |dy| (|xhat| + 1) (+ 1e-30); dbeta:
 *    rtol * sum_r |dy|.
 *  - Where the reference is NaN or infinite the output must be NaN or
 *    infinite (the contract's "NaN/Inf"); a NaN or an infinity where the
 *    reference is finite (a poisoned element) fails.
 */
#ifndef LNORM_TESTBWD_H
#define LNORM_TESTBWD_H

#include <stddef.h>
#include <stdint.h>

#include "lnorm_core.h"
#include "testutil.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What to build. Zero-initialise, then set what matters; dtypes 0 mean
 * x's dtype, eps 0 means LNORM_DEFAULT_EPS. */
typedef struct lnorm_test_bwd_cfg {
    int op, x_dtype, dy_dtype, dx_dtype, param_dtype, eps_mode;
    float eps;
    int64_t rows, hidden;
    int64_t pad;           /* extra elements between rows of x, dy, dx, dres */
    int gamma;             /* with gamma */
    int dres;              /* with dres */
    int stats;             /* mean/rstd given (the forward's, CPU runner) */
    int dgamma, dbeta;     /* wanted */
    double x_mean, x_spread;   /* x ~ x_mean + x_spread * normal (spread 0: 1) */
    double dy_spread;          /* dy ~ dy_spread * normal (0: 1) */
} lnorm_test_bwd_cfg;

typedef struct lnorm_test_bwd_case {
    lnorm_bwd_segment seg;
    void *x, *dy, *dx, *dres, *gamma;
    float *mean, *rstd, *dgamma, *dbeta;
    size_t dx_bytes;
} lnorm_test_bwd_case;

/* Build a case (inputs from g, outputs poisoned); with cfg->stats the
 * forward is run on the CPU (cpu may be NULL: the calling thread, best ISA)
 * for mean and rstd. LNORM_OK or LNORM_ENOMEM (nothing left allocated). */
int lnorm_test_bwd_make(lnorm_test_bwd_case *tc, const lnorm_test_bwd_cfg *cfg, lnorm_rng *g,
                        const lnorm_cpu *cpu);
void lnorm_test_bwd_free(lnorm_test_bwd_case *tc);
/* Poison dx (padding included), dgamma and dbeta again. */
void lnorm_test_bwd_repoison(lnorm_test_bwd_case *tc);
/* Output bytes of dx's padding that are no longer 0xFF. */
long lnorm_test_bwd_pad_writes(const lnorm_test_bwd_case *tc);

/* The float64 reference of s's inputs: dx_ref (rows x hidden, contiguous),
 * dgamma_ref and dbeta_ref (hidden); any may be NULL. Returns LNORM_OK, the
 * error of lnorm_bwd_segment_validate, or LNORM_ENOMEM. */
int lnorm_ref_bwd(const lnorm_bwd_segment *s, double *dx_ref, double *dgamma_ref, double *dbeta_ref);

/* Compare s's outputs (dx, and dgamma/dbeta where s has them) with the
 * reference; rtol 0 means the default. Prints the first mismatches under
 * label and returns their number (-1: invalid segment or no memory). */
long lnorm_test_bwd_check(const lnorm_bwd_segment *s, double rtol, const char *label);

/* The largest |got - want| / bound seen by lnorm_test_bwd_check since the
 * last call (then reset): how close a backend comes to the tolerance. */
double lnorm_test_bwd_worst(void);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_TESTBWD_H */
