/*
 * Test utilities shared by every test of lnormd: a seeded PRNG, random
 * fills of any dtype, output poisoning, a float64 reference of the core's
 * numerics (kernels/core/lnorm_core.h) and a checker that compares a
 * backend's outputs with that reference.
 *
 * Tolerances (see lnorm_test_check and docs/cpu-backend.md):
 *  - f32 y: |y - ref| <= rtol * (|gamma_c| * R + |beta_c|), where R is the
 *    row's normalized range max_c |(h_c - mean) * rstd| from the reference.
 *    The default rtol is 1e-6 (about 17 units of fp32 rounding, u = 2^-24).
 *    A backend that keeps its statistics accurate to a few u makes about
 *    6 roundings of that scale per element (h - mean, * rstd, * gamma,
 *    + beta, and the relative errors of mean and rstd), i.e. ~4e-7; a real
 *    bug (dividing by the count of loaded elements, eps missing or placed
 *    outside the sqrt, an f16 accumulation) costs far more (see the
 *    checker's negative self-test in tests/kernels).
 *  - f16/bf16 y: the output must be within one ulp of the reference
 *    correctly rounded to that dtype, or (for values tiny next to the row's
 *    scale, where one ulp is smaller than any fp32 computation can resolve)
 *    within the f32 bound above plus half an ulp.
 *  - residual_out must be bit-exact: it is defined as one rounding.
 *  - mean: |mean - ref| <= stat_rtol * (|ref| + 1 / rstd_ref); rstd:
 *    |rstd - ref| <= stat_rtol * ref; stat_rtol defaults to 1e-6.
 *  - NaN in the reference must be NaN in the output, an infinity must be
 *    the same infinity; a NaN in the output where the reference is finite
 *    (e.g. a still-poisoned element) always fails.
 */
#ifndef LNORM_TESTUTIL_H
#define LNORM_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "lnorm_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A small, fast, seeded PRNG (xoshiro256**). */
typedef struct lnorm_rng {
    uint64_t s[4];
} lnorm_rng;

/* The seed of a test's random data: LNORM_TEST_SEED from the environment
 * when set, else fallback (fixed, so every run is the same). Printed on
 * stderr, so a failing run can be repeated. */
uint64_t lnorm_test_seed(uint64_t fallback);

/* Seed a PRNG; equal seeds give equal sequences. */
void lnorm_rng_seed(lnorm_rng *g, uint64_t seed);

/* The next 64 random bits. */
uint64_t lnorm_rng_next(lnorm_rng *g);

/* A uniform double in [0, 1). */
double lnorm_rng_uniform(lnorm_rng *g);

/* A standard-normal-ish double (sum of uniforms; bounded, |v| < 6). */
double lnorm_rng_normal(lnorm_rng *g);

/* Fill n elements of dtype at buf with mean + spread * normal(), each
 * rounded to the dtype (to nearest even). */
void lnorm_test_fill(lnorm_rng *g, void *buf, int dtype, size_t n,
                     double mean, double spread);

/* Set every byte of buf to 0xFF (a NaN in f32, f16 and bf16). */
void lnorm_test_poison(void *buf, size_t bytes);

/* Element i of a buffer of dtype, exactly, as a double. */
double lnorm_test_get(const void *buf, int dtype, size_t i);

/* Store v (rounded to nearest even) as element i of a buffer of dtype. */
void lnorm_test_set(void *buf, int dtype, size_t i, double v);

/* Round a double to dtype correctly (to nearest even), returned as double. */
double lnorm_test_round(double v, int dtype);

/* The float64 reference of one segment. Outputs are contiguous
 * (rows x hidden for y_ref and res_out_ref; rows for mean_ref and
 * rstd_ref); any of them may be NULL. mean_ref is filled for LayerNorm
 * (and 0 for RMSNorm); res_out_ref only when the segment has a residual.
 * Returns LNORM_OK, or the error of lnorm_segment_validate. */
int lnorm_ref_segment(const lnorm_segment *s, double *y_ref, double *mean_ref,
                      double *rstd_ref, double *res_out_ref);

/* Tolerances of lnorm_test_check; lnorm_test_tol_default fills the
 * documented defaults. */
typedef struct lnorm_test_tol {
    double y_rtol;    /* f32 y, and the floor for f16/bf16 (default 1e-6) */
    int y_ulps;       /* f16/bf16 y: allowed distance in ulps (default 1) */
    double stat_rtol; /* mean and rstd (default 1e-6) */
    int max_report;   /* mismatches printed (default 5) */
} lnorm_test_tol;

/* Fill *t with the default tolerances. */
void lnorm_test_tol_default(lnorm_test_tol *t);

/* Compare a segment's outputs (y, mean, rstd, residual_out as pointed to by
 * s, with its strides and dtypes) with the reference computed by
 * lnorm_ref_segment on the same inputs. tol may be NULL (defaults). Prints
 * the first mismatches (label, row, col, got, want) to stderr and returns
 * the number of mismatching elements (0: all good). mean_ref and rstd_ref
 * must not be NULL (they define the row's scale), nor res_out_ref when the
 * segment has a residual. */
long lnorm_test_check(const lnorm_segment *s, const double *y_ref,
                      const double *mean_ref, const double *rstd_ref,
                      const double *res_out_ref, const lnorm_test_tol *tol,
                      const char *label);

/* The largest |got - want| / bound among the f32 y elements (and of mean
 * and rstd) seen by lnorm_test_check since the last reset: how close a
 * backend comes to the tolerance. Not thread-safe (tests check on one
 * thread). */
double lnorm_test_worst_ratio(void);

/* Which output and case gave lnorm_test_worst_ratio ("" if none). */
const char *lnorm_test_worst_where(void);

/* Reset lnorm_test_worst_ratio to 0. */
void lnorm_test_worst_reset(void);

/* Convenience: compute the reference for s (allocating it), check s's
 * outputs against it and free it. Returns the mismatch count, or -1 if the
 * segment is invalid or memory ran out. */
long lnorm_test_check_segment(const lnorm_segment *s, const lnorm_test_tol *tol,
                              const char *label);

/* Compare the outputs of g with those of c, another backend's on the same
 * inputs (same dtypes and strides): y within 4e-6 of the row's largest |y|
 * or, f16/bf16, within 2 ulps; residual_out bit-exact; rstd within 4e-6,
 * mean within 4e-6 of |mean| + 1/rstd. Prints the first disagreements to
 * stderr and returns their number. */
long lnorm_test_cmp_outputs(const lnorm_segment *g, const lnorm_segment *c, const char *label);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_TESTUTIL_H */
