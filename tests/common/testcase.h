/*
 * A test case builder: allocates and fills every buffer of one segment
 * (random inputs, poisoned outputs, optional padding between rows) from a
 * small configuration, so tests of any backend can sweep configurations.
 */
#ifndef LNORM_TESTCASE_H
#define LNORM_TESTCASE_H

#include <stddef.h>
#include <stdint.h>

#include "lnorm_core.h"
#include "testutil.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What to build. Zero-initialise, then set what matters; dtypes left 0
 * (NONE) mean "x's dtype", eps 0 means LNORM_DEFAULT_EPS. */
typedef struct lnorm_test_case_cfg {
    int op, x_dtype, y_dtype, param_dtype, eps_mode;
    float eps;
    int64_t rows, hidden;
    int64_t pad;          /* extra elements between rows of every tensor */
    int gamma, beta;      /* with gamma / beta */
    int residual;         /* with residual and residual_out */
    int stats;            /* with rstd (and mean for LayerNorm) */
    double x_mean, x_spread;   /* x ~ x_mean + x_spread * normal (spread 0: 1) */
    double r_spread;           /* residual ~ r_spread * normal (0: 1) */
} lnorm_test_case_cfg;

/* One built case: seg points into the buffers below (all malloc'ed). */
typedef struct lnorm_test_case {
    lnorm_segment seg;
    void *x, *y, *residual, *residual_out, *gamma, *beta;
    float *mean, *rstd;
    size_t x_bytes, y_bytes, res_bytes; /* whole buffers, padding included */
} lnorm_test_case;

/* Build a case: inputs random from g, outputs (padding included) poisoned
 * with 0xFF. Returns LNORM_OK, or LNORM_ENOMEM (nothing left allocated). */
int lnorm_test_case_make(lnorm_test_case *tc, const lnorm_test_case_cfg *cfg, lnorm_rng *g);

/* Free every buffer of a case (a zeroed case is fine). */
void lnorm_test_case_free(lnorm_test_case *tc);

/* Poison the outputs of a case again (before re-running it). */
void lnorm_test_case_repoison(lnorm_test_case *tc);

/* The number of output bytes in the padding between rows (and after the
 * last row) that are no longer 0xFF, i.e. written where nothing belongs. */
long lnorm_test_case_pad_writes(const lnorm_test_case *tc);

/* The matrix every backend is checked on (tests/kernels, tests/gpu): each
 * op x x dtype x y dtype (x's, then a cross one) x affine (none, gamma,
 * gamma + beta) x param dtype (f32, x's; only with affine) x residual x
 * stats, at each hidden size of hs; mean, spread, eps placement, rows and
 * padding vary with the case's index idx. fn gets every configuration,
 * with idx and the index hi of its hidden size in hs. */
typedef void (*lnorm_test_matrix_fn)(const lnorm_test_case_cfg *c, long idx, size_t hi, void *arg);
void lnorm_test_matrix(const int64_t *hs, size_t nh, lnorm_test_matrix_fn fn, void *arg);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_TESTCASE_H */
