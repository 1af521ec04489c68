/*
 * Named tests of the classic failure modes of a normalization kernel, run
 * on every ISA path this machine has. Usage: test_named NAME
 * (one ctest entry per NAME, see CMakeLists.txt).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lnorm_core.h"
#include "testcase.h"
#include "testutil.h"

static const char *const isas[] = {"scalar", "avx2", "avx512"};

/* A backend set to isa, or NULL when this machine lacks it. */
static lnorm_cpu *cpu_for(const char *isa, int threads)
{
    lnorm_cpu *cpu;
    if (lnorm_cpu_create(&cpu, threads) != LNORM_OK) {
        CHECK_FAIL("lnorm_cpu_create");
        return NULL;
    }
    int err = lnorm_cpu_set_isa(cpu, isa);
    if (err) {
        CHECK(err == LNORM_ENOTSUP, "set_isa(%s) = %s", isa, lnorm_errname(err));
        printf("  isa %s: not available, not checked\n", isa);
        lnorm_cpu_destroy(cpu);
        return NULL;
    }
    return cpu;
}

/* Build cfg, run it on cpu, check against the reference; returns mismatches. */
static long run_check(lnorm_cpu *cpu, const lnorm_test_case_cfg *cfg, lnorm_rng *g, const char *label)
{
    lnorm_test_case tc;
    if (lnorm_test_case_make(&tc, cfg, g)) {
        CHECK_FAIL("%s: out of memory", label);
        return 1;
    }
    const char *why = NULL;
    int err = lnorm_cpu_run_segment(cpu, &tc.seg, &why);
    long bad = err ? 1 : lnorm_test_check_segment(&tc.seg, NULL, label);
    CHECK(err == LNORM_OK, "%s: run = %s (%s)", label, lnorm_errname(err), why ? why : "");
    CHECK(bad == 0, "%s: %ld mismatches", label, bad);
    lnorm_test_case_free(&tc);
    return bad;
}

/* f16 activations of magnitude 1e-3..1e-4: x*x underflows in f16. */
static void t_f16_tiny(lnorm_cpu *cpu, lnorm_rng *g)
{
    for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++)
        for (int k = 0; k < 2; k++) {
            lnorm_test_case_cfg c = {.op = op, .x_dtype = LNORM_DTYPE_F16, .rows = 6, .hidden = 1000 + k * 3096,
                                     .gamma = 1, .beta = 1, .stats = 1, .x_mean = k ? 1e-4 : 1e-3,
                                     .x_spread = k ? 2e-4 : 1e-3, .eps = 1e-12f};
            run_check(cpu, &c, g, op == LNORM_OP_LAYERNORM ? "f16 tiny ln" : "f16 tiny rms");
        }
}

/* Rows with mean 1e4 and spread 1: catastrophic cancellation in naive sums. */
static void t_cancellation(lnorm_cpu *cpu, lnorm_rng *g)
{
    const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_BF16, LNORM_DTYPE_F16};
    for (int i = 0; i < 3; i++)
        for (int64_t H = 1000; H <= 65536; H *= 8) {
            lnorm_test_case_cfg c = {.op = LNORM_OP_LAYERNORM, .x_dtype = dts[i], .y_dtype = LNORM_DTYPE_F32,
                                     .rows = 4, .hidden = H, .gamma = 1, .beta = 1, .stats = 1,
                                     .x_mean = 1e4, .x_spread = 1.0};
            /* f16 near 1e4 has a spacing of 8: spread 1 would be constant rows;
             * use a spread the dtype can carry. */
            if (dts[i] == LNORM_DTYPE_F16)
                c.x_spread = 40.0;
            if (dts[i] == LNORM_DTYPE_BF16)
                c.x_spread = 300.0;
            run_check(cpu, &c, g, "cancellation");
        }
    /* The hardest case for fp32 sums: H = 262144 and mean 3e3 >> spread 1. */
    for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++) {
        lnorm_test_case_cfg c = {.op = op, .x_dtype = LNORM_DTYPE_F32, .rows = 2, .hidden = 262144, .gamma = 1,
                                 .beta = 1, .stats = 1, .x_mean = 3e3, .x_spread = 1.0};
        run_check(cpu, &c, g, "cancellation, H = 262144");
    }
}

/* Constant rows: var = 0, so y = beta exactly and nothing is NaN/Inf. */
static void t_constant(lnorm_cpu *cpu, lnorm_rng *g)
{
    const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16, LNORM_DTYPE_BF16};
    const double vals[] = {0.0, 3.25, -1e4, 1e-3};
    for (int i = 0; i < 3; i++)
        for (int v = 0; v < 4; v++) {
            lnorm_test_case_cfg c = {.op = LNORM_OP_LAYERNORM, .x_dtype = dts[i], .rows = 3, .hidden = 777,
                                     .gamma = 1, .beta = 1, .stats = 1};
            lnorm_test_case tc;
            if (lnorm_test_case_make(&tc, &c, g)) {
                CHECK_FAIL("oom");
                return;
            }
            for (size_t k = 0; k < (size_t)(c.rows * c.hidden); k++)
                lnorm_test_set(tc.x, dts[i], k, vals[v]);
            CHECK(lnorm_cpu_run_segment(cpu, &tc.seg, NULL) == LNORM_OK, "run");
            long bad = 0;
            for (int64_t r = 0; r < c.rows; r++) {
                for (int64_t k = 0; k < c.hidden; k++) {
                    double y = lnorm_test_get(tc.y, dts[i], (size_t)(r * c.hidden + k));
                    double b = lnorm_test_get(tc.beta, dts[i], (size_t)k);
                    bad += !(y == b);
                }
                bad += !isfinite(tc.rstd[r]) || !(tc.mean[r] == (float)lnorm_test_round(vals[v], dts[i]));
                bad += !(fabs(tc.rstd[r] - 1.0 / sqrt((double)tc.seg.eps)) <= 1e-6 / sqrt((double)tc.seg.eps));
            }
            CHECK(bad == 0, "constant rows (%s, value %g): %ld wrong elements", lnorm_dtype_name(dts[i]), vals[v], bad);
            CHECK(lnorm_test_check_segment(&tc.seg, NULL, "constant") == 0, "constant rows vs reference");
            lnorm_test_case_free(&tc);
        }
}

/* eps inside vs outside the sqrt: each matches its own reference, they differ. */
static void t_eps_placement(lnorm_cpu *cpu, lnorm_rng *g)
{
    for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++) {
        lnorm_test_case_cfg c = {.op = op, .x_dtype = LNORM_DTYPE_F32, .rows = 4, .hidden = 513,
                                 .gamma = 1, .stats = 1, .x_spread = 0.01, .eps = 1e-3f};
        lnorm_test_case a, b;
        lnorm_rng g2 = *g;
        if (lnorm_test_case_make(&a, &c, g)) {
            CHECK_FAIL("oom");
            return;
        }
        c.eps_mode = LNORM_EPS_OUTSIDE;
        if (lnorm_test_case_make(&b, &c, &g2)) { /* same seed: same inputs */
            CHECK_FAIL("oom");
            lnorm_test_case_free(&a);
            return;
        }
        CHECK(lnorm_cpu_run_segment(cpu, &a.seg, NULL) == LNORM_OK, "run inside");
        CHECK(lnorm_cpu_run_segment(cpu, &b.seg, NULL) == LNORM_OK, "run outside");
        CHECK(lnorm_test_check_segment(&a.seg, NULL, "eps inside") == 0, "eps inside vs its reference");
        CHECK(lnorm_test_check_segment(&b.seg, NULL, "eps outside") == 0, "eps outside vs its reference");
        CHECK(memcmp(a.x, b.x, a.x_bytes) == 0, "inputs differ");
        long differ = 0;
        for (int64_t k = 0; k < c.rows * c.hidden; k++)
            differ += fabsf(((float *)a.y)[k] - ((float *)b.y)[k]) > 1e-3f * fabsf(((float *)a.y)[k]);
        CHECK(differ > c.rows * c.hidden / 2, "eps inside and outside give the same output (%ld differ)", differ);
        /* Swapped: inside's output must NOT pass outside's reference. */
        lnorm_segment swapped = a.seg;
        swapped.eps_mode = LNORM_EPS_OUTSIDE;
        lnorm_test_tol tol;
        lnorm_test_tol_default(&tol);
        tol.max_report = 0;
        CHECK(lnorm_test_check_segment(&swapped, &tol, "swapped") > 0, "inside's output passes outside's reference");
        lnorm_test_case_free(&a);
        lnorm_test_case_free(&b);
    }
}

/* Distinct per-row data with shared gamma/beta held in buffers of exactly
 * hidden elements, rows padded: catches gamma indexed by row offset. */
static void t_shared_params(lnorm_cpu *cpu, lnorm_rng *g)
{
    const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16, LNORM_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        lnorm_test_case_cfg c = {.op = LNORM_OP_LAYERNORM, .x_dtype = dts[i], .rows = 9, .hidden = 100, .pad = 28,
                                 .gamma = 1, .beta = 1, .stats = 1};
        lnorm_test_case tc;
        if (lnorm_test_case_make(&tc, &c, g)) {
            CHECK_FAIL("oom");
            return;
        }
        /* Each row its own mean and scale. */
        for (int64_t r = 0; r < c.rows; r++)
            for (int64_t k = 0; k < c.hidden; k++)
                lnorm_test_set(tc.x, dts[i], (size_t)(r * tc.seg.x_stride + k),
                               (double)r * 3.0 + (1.0 + r) * lnorm_rng_normal(g));
        /* gamma distinct per column, far from 1, so a wrong index shows. */
        for (int64_t k = 0; k < c.hidden; k++) {
            lnorm_test_set(tc.gamma, tc.seg.param_dtype, (size_t)k, 0.5 + (double)k / 16.0);
            lnorm_test_set(tc.beta, tc.seg.param_dtype, (size_t)k, -(double)k / 32.0);
        }
        CHECK(lnorm_cpu_run_segment(cpu, &tc.seg, NULL) == LNORM_OK, "run");
        CHECK(lnorm_test_check_segment(&tc.seg, NULL, "shared params") == 0, "shared gamma/beta (%s)",
              lnorm_dtype_name(dts[i]));
        lnorm_test_case_free(&tc);
    }
}

/* NaN/Inf inputs propagate as PyTorch does; other rows unaffected. */
static void t_nan_inf(lnorm_cpu *cpu, lnorm_rng *g)
{
    const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16, LNORM_DTYPE_BF16};
    for (int i = 0; i < 3; i++)
        for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++) {
            lnorm_test_case_cfg c = {.op = op, .x_dtype = dts[i], .rows = 6, .hidden = 300,
                                     .gamma = 1, .beta = 1, .stats = 1};
            lnorm_test_case tc;
            if (lnorm_test_case_make(&tc, &c, g)) {
                CHECK_FAIL("oom");
                return;
            }
            /* Finite poison (0x7B7B...: 1.3e36 f32, 60768 f16, 1.3e36 bf16)
             * so that an unwritten element of a NaN row cannot look right. */
            memset(tc.y, 0x7B, tc.y_bytes);
            const int64_t H = c.hidden;
            lnorm_test_set(tc.x, dts[i], (size_t)(1 * H + 7), NAN);
            lnorm_test_set(tc.x, dts[i], (size_t)(3 * H + 0), INFINITY);
            lnorm_test_set(tc.x, dts[i], (size_t)(4 * H + H - 1), -INFINITY);
            CHECK(lnorm_cpu_run_segment(cpu, &tc.seg, NULL) == LNORM_OK, "run");
            CHECK(lnorm_test_check_segment(&tc.seg, NULL, "nan/inf") == 0, "NaN/Inf rows vs reference (%s, op %d)",
                  lnorm_dtype_name(dts[i]), op);
            for (int64_t r = 0; r < c.rows; r++) {
                long nans = 0;
                for (int64_t k = 0; k < H; k++)
                    nans += isnan(lnorm_test_get(tc.y, dts[i], (size_t)(r * H + k)));
                int bad_row = r == 1 || r == 3 || r == 4;
                if (!bad_row)
                    CHECK(nans == 0, "row %lld has %ld NaN but no bad input", (long long)r, nans);
                else if (op == LNORM_OP_LAYERNORM || r == 1)
                    CHECK(nans == H, "row %lld: %ld of %lld NaN", (long long)r, nans, (long long)H);
                else /* RMSNorm with +-Inf: rstd = 0, finite elements give 0 (beta), the Inf one NaN */
                    CHECK(nans == 1 && tc.rstd[r] == 0.0f, "rms inf row %lld: %ld NaN, rstd %g", (long long)r,
                          nans, tc.rstd[r]);
            }
            lnorm_test_case_free(&tc);
        }
}

/* The worst errors of a run case against float64, printed for the record:
 * rstd and mean relative, y relative to the row's normalized range. */
static void edge_errors(const lnorm_test_case *tc, const char *label)
{
    const lnorm_segment *s = &tc->seg;
    const int64_t H = s->hidden;
    size_t n = (size_t)(s->rows * H);
    double *y = malloc(n * sizeof *y), *m = malloc((size_t)s->rows * sizeof *m), *rs = malloc((size_t)s->rows * sizeof *rs);
    if (y && m && rs && lnorm_ref_segment(s, y, m, rs, NULL) == LNORM_OK) {
        double ey = 0, er = 0, em = 0;
        for (int64_t r = 0; r < s->rows; r++) {
            double R = 0;
            for (int64_t k = 0; k < H; k++)
                R = fmax(R, fabs(y[r * H + k]));
            for (int64_t k = 0; k < H; k++) {
                double e = fabs(lnorm_test_get(s->y, s->y_dtype, (size_t)(r * s->y_stride + k)) - y[r * H + k]) / R;
                ey = isnan(e) ? INFINITY : fmax(ey, e);
            }
            double e = fabs(s->rstd[r] - rs[r]) / rs[r];
            er = isnan(e) ? INFINITY : fmax(er, e);
            if (s->mean) {
                e = fabs(s->mean[r] - m[r]) / (fabs(m[r]) + 1.0 / rs[r]);
                em = isnan(e) ? INFINITY : fmax(em, e);
            }
        }
        printf("    %-44s max error vs float64: y %.2g (of the row's range), rstd %.2g, mean %.2g\n", label, ey,
               er, em);
    }
    free(y);
    free(m);
    free(rs);
}

/* Rows at the edges of fp32 (kernels/core/rescale.h), every other row of a
 * case (the rows between stay ordinary, so a row's rescue must not touch
 * its neighbours): kind 0: one element of 1e30 (never x[0]: the mean's error
 * grows with |x[0] - mean| / spread, lnorm_core.h); 1: one element of 3e19;
 * 2: a whole row of N(0, 1e19);
 * 3: a row of N(0, 1e-22) with eps = 1e-45 (squares in the subnormals). */
static void edge_fill(lnorm_test_case *tc, int kind, lnorm_rng *g)
{
    const lnorm_segment *s = &tc->seg;
    for (int64_t r = 0; r < s->rows; r += 2) {
        size_t row = (size_t)(r * s->x_stride);
        if (kind <= 1) {
            int64_t c = 1 + (r * 37 + 5) % (s->hidden - 1);
            lnorm_test_set(tc->x, s->x_dtype, row + (size_t)c, (r & 2 ? -1.0 : 1.0) * (kind ? 3e19 : 1e30));
        } else {
            for (int64_t k = 0; k < s->hidden; k++)
                lnorm_test_set(tc->x, s->x_dtype, row + (size_t)k, (kind == 2 ? 1e19 : 1e-22) * lnorm_rng_normal(g));
        }
    }
}

/* The edge rows of fp32 for LayerNorm and RMSNorm, f32 and bf16 x (fp32's
 * exponent range), with a residual (a zero one, so h = x) and without,
 * gamma, beta and stats: y, mean and rstd against float64. kinds: the
 * edge_fill kinds to run. */
static void edge_cases(lnorm_cpu *cpu, lnorm_rng *g, int k0, int k1)
{
    static const char *const names[] = {"one element 1e30", "one element 3e19", "row N(0, 1e19)",
                                        "row N(0, 1e-22), eps 1e-45"};
    for (int kind = k0; kind <= k1; kind++)
        for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++)
            for (int xi = 0; xi < 2; xi++)
                for (int64_t H = 1000; H <= 4097; H += 3097) {
                    const int xdt = xi ? LNORM_DTYPE_BF16 : LNORM_DTYPE_F32;
                    lnorm_test_case_cfg c = {.op = op, .x_dtype = xdt, .y_dtype = LNORM_DTYPE_F32,
                                             .param_dtype = LNORM_DTYPE_F32, .rows = 6, .hidden = H,
                                             .pad = H & 1, .gamma = 1, .beta = 1, .stats = 1,
                                             .residual = H & 1, .eps = kind == 3 ? 1e-45f : 0.0f};
                    lnorm_test_case tc;
                    if (lnorm_test_case_make(&tc, &c, g)) {
                        CHECK_FAIL("oom");
                        return;
                    }
                    if (tc.residual)
                        for (int64_t r = 0; r < c.rows; r++)
                            for (int64_t k = 0; k < H; k++)
                                lnorm_test_set(tc.residual, xdt, (size_t)(r * tc.seg.res_stride + k), 0.0);
                    edge_fill(&tc, kind, g);
                    char label[128];
                    snprintf(label, sizeof label, "%s %s %s H=%lld%s", names[kind],
                             op == LNORM_OP_LAYERNORM ? "ln" : "rms", lnorm_dtype_name(xdt), (long long)H,
                             tc.residual ? " res" : "");
                    const char *why = NULL;
                    int err = lnorm_cpu_run_segment(cpu, &tc.seg, &why);
                    CHECK(err == LNORM_OK, "%s: run = %s (%s)", label, lnorm_errname(err), why ? why : "");
                    if (err == LNORM_OK) {
                        edge_errors(&tc, label);
                        CHECK(lnorm_test_check_segment(&tc.seg, NULL, label) == 0, "%s vs float64", label);
                    }
                    lnorm_test_case_free(&tc);
                }
}

/* Squares and sums past FLT_MAX: an element of 1e30 or 3e19, rows of
 * N(0, 1e19) (a plain fp32 sum of squares is Inf: rstd 0, y 0). */
static void t_fp32_overflow(lnorm_cpu *cpu, lnorm_rng *g)
{
    edge_cases(cpu, g, 0, 2);
}

/* Rows of N(0, 1e-22) with eps = 1e-45: squares in fp32's subnormals (a
 * plain sum puts rstd 0.3-1% off). */
static void t_fp32_subnormal(lnorm_cpu *cpu, lnorm_rng *g)
{
    edge_cases(cpu, g, 3, 3);
}

/* eps outside the sqrt below FLT_MIN (1 / eps not a finite fp32: a
 * constant row gave rstd Inf and a NaN row) is refused, the message naming
 * the smallest accepted value; FLT_MIN itself runs, and a constant row
 * then gives y = beta and rstd = 1 / FLT_MIN. */
static void t_eps_outside_min(lnorm_cpu *cpu, lnorm_rng *g)
{
    const float bad[] = {1e-45f, 1e-39f, 0x1.fffffcp-127f};
    for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++) {
        lnorm_test_case_cfg c = {.op = op, .x_dtype = LNORM_DTYPE_F32, .rows = 3, .hidden = 300, .gamma = 1,
                                 .beta = 1, .stats = 1, .eps_mode = LNORM_EPS_OUTSIDE, .eps = 0x1p-126f};
        lnorm_test_case tc;
        if (lnorm_test_case_make(&tc, &c, g)) {
            CHECK_FAIL("oom");
            return;
        }
        for (int64_t k = 0; k < c.hidden; k++) /* row 0 constant (0 for RMSNorm), rows 1, 2 random */
            lnorm_test_set(tc.x, LNORM_DTYPE_F32, (size_t)k, op == LNORM_OP_LAYERNORM ? 3.25 : 0.0);
        for (int i = 0; i < 3; i++) {
            lnorm_segment s = tc.seg;
            s.eps = bad[i];
            const char *why = NULL;
            int err = lnorm_cpu_run_segment(cpu, &s, &why);
            CHECK(err == LNORM_EINVAL && why && strstr(why, "1.17549435e-38"),
                  "eps %g outside: run = %s (%s)", (double)bad[i], lnorm_errname(err), why ? why : "");
            why = NULL;
            CHECK(lnorm_eps_validate(bad[i], LNORM_EPS_OUTSIDE, &why) == LNORM_EINVAL && why,
                  "lnorm_eps_validate(%g, outside) accepts it", (double)bad[i]);
            CHECK(lnorm_eps_validate(bad[i], LNORM_EPS_INSIDE, NULL) == LNORM_OK,
                  "lnorm_eps_validate(%g, inside) refuses it", (double)bad[i]);
        }
        lnorm_test_case_repoison(&tc);
        int err = lnorm_cpu_run_segment(cpu, &tc.seg, NULL);
        CHECK(err == LNORM_OK, "eps FLT_MIN outside: run = %s", lnorm_errname(err));
        long wrong = 0;
        for (int64_t k = 0; k < c.hidden; k++)
            wrong += !(((float *)tc.y)[k] == ((float *)tc.beta)[k]);
        CHECK(wrong == 0 && tc.rstd[0] == 0x1p126f, "constant row, eps FLT_MIN outside: %ld y != beta, rstd %g",
              wrong, (double)tc.rstd[0]);
        CHECK(lnorm_test_check_segment(&tc.seg, NULL, "eps FLT_MIN outside") == 0, "eps FLT_MIN outside vs float64");
        lnorm_test_case_free(&tc);
    }
}

/* Invalid descriptions are rejected with LNORM_EINVAL and nothing written. */
static void t_reject(lnorm_cpu *cpu, lnorm_rng *g)
{
    lnorm_test_case_cfg c = {.op = LNORM_OP_LAYERNORM, .x_dtype = LNORM_DTYPE_F32, .rows = 2, .hidden = 8,
                             .stats = 1, .residual = 1};
    lnorm_test_case tc;
    if (lnorm_test_case_make(&tc, &c, g)) {
        CHECK_FAIL("oom");
        return;
    }
    struct {
        const char *what;
        void *unused;
    } cases[] = {
        {"eps 0", NULL}, {"eps -1", NULL}, {"eps NaN", NULL}, {"eps Inf", NULL}, {"hidden 0", NULL},
        {"rows 0", NULL}, {"x_stride < hidden", NULL}, {"y_stride < hidden", NULL}, {"res_stride < hidden", NULL},
        {"op 0", NULL}, {"x dtype 0", NULL}, {"y dtype 9", NULL}, {"param dtype f16 for f32 x", NULL},
        {"eps_mode 2", NULL}, {"mean with RMSNorm", NULL}, {"x NULL", NULL}, {"residual_out NULL", NULL},
        {"hidden too large", NULL}, {"rows x stride overflows", NULL}, {"rows -1", NULL}, {"stride negative", NULL},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        lnorm_segment s = tc.seg;
        switch (i) {
        case 0: s.eps = 0.0f; break;
        case 1: s.eps = -1.0f; break;
        case 2: s.eps = NAN; break;
        case 3: s.eps = INFINITY; break;
        case 4: s.hidden = 0; break;
        case 5: s.rows = 0; break;
        case 6: s.x_stride = 7; break;
        case 7: s.y_stride = 7; break;
        case 8: s.res_stride = 7; break;
        case 9: s.op = 0; break;
        case 10: s.x_dtype = 0; break;
        case 11: s.y_dtype = 9; break;
        case 12: s.param_dtype = LNORM_DTYPE_F16; break;
        case 13: s.eps_mode = 2; break;
        case 14: s.op = LNORM_OP_RMSNORM; break; /* mean still set */
        case 15: s.x = NULL; break;
        case 16: s.residual_out = NULL; break;
        case 17: s.hidden = (int64_t)LNORM_CORE_MAX_HIDDEN + 1; s.x_stride = s.y_stride = s.res_stride = s.res_out_stride = s.hidden; break;
        case 18: s.rows = INT64_MAX / 2; break;
        case 19: s.rows = -1; break;
        case 20: s.x_stride = -8; break;
        }
        const char *why = NULL;
        lnorm_test_case_repoison(&tc);
        int e1 = lnorm_cpu_run_segment(cpu, &s, &why);
        CHECK(e1 == LNORM_EINVAL && why && *why, "%s: run_segment = %s", cases[i].what, lnorm_errname(e1));
        lnorm_segment two[2] = {tc.seg, s};
        lnorm_batch b = {two, 2};
        why = NULL;
        int e2 = lnorm_cpu_run(cpu, &b, &why);
        CHECK(e2 == LNORM_EINVAL && why && *why, "%s: run = %s", cases[i].what, lnorm_errname(e2));
        /* Nothing ran: the valid first segment's outputs are still poisoned. */
        const unsigned char *y = tc.y;
        long written = 0;
        for (size_t k = 0; k < tc.y_bytes; k++)
            written += y[k] != 0xFF;
        CHECK(written == 0, "%s: %ld output bytes written by a rejected batch", cases[i].what, written);
    }
    lnorm_test_case_free(&tc);
}

/* RMSNorm never subtracts a mean: rows with a large mean would give a very
 * different (and wrong) answer if it did. */
static void t_rms_no_mean(lnorm_cpu *cpu, lnorm_rng *g)
{
    lnorm_test_case_cfg c = {.op = LNORM_OP_RMSNORM, .x_dtype = LNORM_DTYPE_F32, .rows = 4, .hidden = 256,
                             .stats = 1, .x_mean = 5.0, .x_spread = 1.0};
    lnorm_test_case tc;
    if (lnorm_test_case_make(&tc, &c, g)) {
        CHECK_FAIL("oom");
        return;
    }
    CHECK(lnorm_cpu_run_segment(cpu, &tc.seg, NULL) == LNORM_OK, "run");
    CHECK(lnorm_test_check_segment(&tc.seg, NULL, "rms") == 0, "rmsnorm vs reference");
    /* y * ||x||_rms / x == 1 per element, and all y share x's sign (mean 5). */
    long bad = 0;
    for (int64_t k = 0; k < c.rows * c.hidden; k++) {
        float x = ((float *)tc.x)[k], y = ((float *)tc.y)[k];
        bad += (x > 0) != (y > 0);
    }
    CHECK(bad == 0, "rmsnorm output changed sign for %ld elements (mean subtracted?)", bad);
    /* The LayerNorm of the same data must not pass the RMSNorm reference. */
    tc.seg.op = LNORM_OP_LAYERNORM;
    lnorm_test_case_repoison(&tc);
    CHECK(lnorm_cpu_run_segment(cpu, &tc.seg, NULL) == LNORM_OK, "run ln");
    tc.seg.op = LNORM_OP_RMSNORM;
    lnorm_test_tol tol;
    lnorm_test_tol_default(&tol);
    tol.max_report = 0;
    CHECK(lnorm_test_check_segment(&tc.seg, &tol, "rms") > 0, "a mean-subtracting output passes RMSNorm's reference");
    lnorm_test_case_free(&tc);
}

/* Batch invariance: rows computed alone, in a big mixed batch over the
 * pool, on another thread count: bit-identical outputs. */
static void t_batch_invariance(const char *isa, lnorm_rng *g)
{
    lnorm_cpu *c1 = cpu_for(isa, 1), *c4 = cpu_for(isa, 4);
    if (!c1 || !c4) {
        lnorm_cpu_destroy(c1);
        lnorm_cpu_destroy(c4);
        return;
    }
    const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16, LNORM_DTYPE_BF16};
    enum { NSEG = 6 };
    lnorm_test_case tcs[NSEG];
    lnorm_segment segs[NSEG];
    for (int i = 0; i < NSEG; i++) {
        lnorm_test_case_cfg c = {.op = i % 2 ? LNORM_OP_RMSNORM : LNORM_OP_LAYERNORM, .x_dtype = dts[i % 3],
                                 .rows = 64 + 37 * i, .hidden = i == 5 ? 4097 : 768 + 5 * i, .gamma = 1,
                                 .beta = i % 2, .residual = i % 3 == 1, .stats = 1, .pad = i};
        if (lnorm_test_case_make(&tcs[i], &c, g)) {
            CHECK_FAIL("oom");
            for (int k = 0; k < i; k++)
                lnorm_test_case_free(&tcs[k]);
            lnorm_cpu_destroy(c1);
            lnorm_cpu_destroy(c4);
            return;
        }
        segs[i] = tcs[i].seg;
    }
    lnorm_batch b = {segs, NSEG};
    CHECK(lnorm_cpu_run(c4, &b, NULL) == LNORM_OK, "batch run");
    for (int i = 0; i < NSEG; i++)
        CHECK(lnorm_test_check_segment(&segs[i], NULL, "batch") == 0, "batch seg %d vs reference", i);
    /* Every row again, alone (single-row segment at a fresh address), on the
     * caller's thread and on the 1-thread backend: same bits. */
    long diff = 0;
    for (int i = 0; i < NSEG; i++) {
        const lnorm_segment *s = &segs[i];
        size_t xs = lnorm_dtype_size(s->x_dtype), ys = lnorm_dtype_size(s->y_dtype);
        size_t H = (size_t)s->hidden;
        char *x = malloc(H * xs + 64), *y = malloc(H * ys + 64), *r = malloc(H * xs + 64), *ro = malloc(H * xs + 64);
        for (int64_t row = 0; row < s->rows && x && y && r && ro; row += 1 + row % 5) {
            size_t off = (size_t)(row % 7) * 4; /* another alignment than in the batch (elements stay naturally aligned) */
            lnorm_segment one = *s;
            one.rows = 1;
            memcpy(x + off, (const char *)s->x + (size_t)(row * s->x_stride) * xs, H * xs);
            one.x = x + off;
            one.y = y + off;
            if (s->residual) {
                memcpy(r + off, (const char *)s->residual + (size_t)(row * s->res_stride) * xs, H * xs);
                one.residual = r + off;
                one.residual_out = ro + off;
            }
            float m = NAN, rs = NAN;
            one.mean = s->mean ? &m : NULL;
            one.rstd = &rs;
            memset(y, 0xFF, H * ys + 64);
            CHECK(lnorm_cpu_run_segment(c1, &one, NULL) == LNORM_OK, "single run");
            diff += memcmp(y + off, (const char *)s->y + (size_t)(row * s->y_stride) * ys, H * ys) != 0;
            diff += memcmp(&rs, &s->rstd[row], 4) != 0;
            if (s->mean)
                diff += memcmp(&m, &s->mean[row], 4) != 0;
            if (s->residual)
                diff += memcmp(ro + off, (const char *)s->residual_out + (size_t)(row * s->res_out_stride) * xs,
                               H * xs) != 0;
        }
        free(x);
        free(y);
        free(r);
        free(ro);
    }
    CHECK(diff == 0, "isa %s: %ld rows differ between a big multi-threaded batch and alone", isa, diff);
    /* The whole batch once more on 1 thread: bit-identical to the 4-thread run. */
    for (int i = 0; i < NSEG; i++) {
        void *copy = malloc(tcs[i].y_bytes);
        if (!copy)
            continue;
        memcpy(copy, tcs[i].y, tcs[i].y_bytes);
        lnorm_test_case_repoison(&tcs[i]);
        lnorm_batch one = {&segs[i], 1};
        CHECK(lnorm_cpu_run(c1, &one, NULL) == LNORM_OK, "1-thread run");
        CHECK(memcmp(copy, tcs[i].y, tcs[i].y_bytes) == 0, "isa %s seg %d: 1 thread != 4 threads", isa, i);
        free(copy);
    }
    for (int i = 0; i < NSEG; i++)
        lnorm_test_case_free(&tcs[i]);
    lnorm_cpu_destroy(c1);
    lnorm_cpu_destroy(c4);
}

/* A batch of many small segments of every kind (more than the backend's
 * on-stack task index holds), split over the pool: each one correct. */
static void t_many_segments(lnorm_cpu *cpu, lnorm_rng *g)
{
    enum { NSEG = 40 };
    lnorm_test_case tcs[NSEG];
    lnorm_segment segs[NSEG];
    int made = 0;
    for (int i = 0; i < NSEG; i++, made++) {
        lnorm_test_case_cfg c = {.op = 1 + i % 2, .x_dtype = 1 + i % 3, .y_dtype = 1 + (i / 3) % 3,
                                 .rows = 7 + i % 23, .hidden = 100 + 37 * i, .pad = i % 4, .gamma = i % 5 != 0,
                                 .beta = i % 3 == 0, .residual = i % 4 == 1, .stats = i % 2 == 0};
        if (lnorm_test_case_make(&tcs[i], &c, g)) {
            CHECK_FAIL("oom");
            break;
        }
        segs[i] = tcs[i].seg;
    }
    if (made == NSEG) {
        lnorm_batch b = {segs, NSEG};
        CHECK(lnorm_cpu_run(cpu, &b, NULL) == LNORM_OK, "run");
        long bad = 0;
        for (int i = 0; i < NSEG; i++)
            bad += lnorm_test_check_segment(&segs[i], NULL, "many segments") != 0;
        CHECK(bad == 0, "%ld of %d segments wrong", bad, NSEG);
    }
    for (int i = 0; i < made; i++)
        lnorm_test_case_free(&tcs[i]);
}

/* In place: y over x (same dtype and stride) and residual_out over
 * residual, as a caller updating its residual stream would do; results
 * equal the reference computed on the original inputs. */
static void t_in_place(lnorm_cpu *cpu, lnorm_rng *g)
{
    const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16, LNORM_DTYPE_BF16};
    for (int i = 0; i < 3; i++)
        for (int res = 0; res < 2; res++) {
            lnorm_test_case_cfg c = {.op = res ? LNORM_OP_RMSNORM : LNORM_OP_LAYERNORM, .x_dtype = dts[i],
                                     .rows = 300, .hidden = 1031, .pad = 5, .gamma = 1, .beta = 1, .stats = 1,
                                     .residual = res};
            lnorm_test_case tc;
            if (lnorm_test_case_make(&tc, &c, g)) {
                CHECK_FAIL("oom");
                return;
            }
            size_t n = (size_t)(c.rows * c.hidden);
            double *yref = malloc(n * sizeof *yref), *ro = malloc(n * sizeof *ro);
            double *mr = malloc((size_t)c.rows * sizeof *mr), *rr = malloc((size_t)c.rows * sizeof *rr);
            if (!yref || !ro || !mr || !rr || lnorm_ref_segment(&tc.seg, yref, mr, rr, ro) != LNORM_OK) {
                CHECK_FAIL("reference");
            } else {
                /* Aliased description; the check reads outputs through it,
                 * and the original x (for the row scale) from a copy. */
                void *xcopy = malloc(tc.x_bytes);
                lnorm_segment s = tc.seg;
                s.y = (void *)s.x;
                if (res)
                    s.residual_out = (void *)s.residual;
                if (xcopy) {
                    memcpy(xcopy, tc.x, tc.x_bytes);
                    lnorm_batch b = {&s, 1};
                    CHECK(lnorm_cpu_run(cpu, &b, NULL) == LNORM_OK, "run");
                    lnorm_segment chk = s;
                    chk.x = xcopy;
                    CHECK(lnorm_test_check(&chk, yref, mr, rr, ro, NULL, "in place") == 0,
                          "in-place %s residual=%d", lnorm_dtype_name(dts[i]), res);
                }
                free(xcopy);
            }
            free(yref);
            free(ro);
            free(mr);
            free(rr);
            lnorm_test_case_free(&tc);
        }
}

/* lnorm_cpu_run from several threads at once on one backend: every
 * result correct, and equal to the same batch run alone. */
typedef struct conc_arg {
    lnorm_cpu *cpu;
    lnorm_test_case tc[3];
    int iters;
    long bad;
} conc_arg;

static void *conc_main(void *p)
{
    conc_arg *a = p;
    lnorm_segment segs[3] = {a->tc[0].seg, a->tc[1].seg, a->tc[2].seg};
    lnorm_batch b = {segs, 3};
    for (int it = 0; it < a->iters; it++) {
        for (int i = 0; i < 3; i++)
            lnorm_test_case_repoison(&a->tc[i]);
        if (lnorm_cpu_run(a->cpu, &b, NULL) != LNORM_OK) {
            a->bad++;
            continue;
        }
        if (it == 0 || it == a->iters - 1)
            for (int i = 0; i < 3; i++)
                a->bad += lnorm_test_check_segment(&segs[i], NULL, "concurrent") != 0;
    }
    return NULL;
}

static void t_concurrent(lnorm_cpu *cpu, lnorm_rng *g)
{
    enum { NT = 4 };
    conc_arg args[NT];
    pthread_t th[NT];
    int made = 0;
    for (int t = 0; t < NT; t++) {
        args[t].cpu = cpu;
        args[t].iters = 20;
        args[t].bad = 0;
        for (int i = 0; i < 3; i++) {
            lnorm_test_case_cfg c = {.op = (t + i) % 2 ? LNORM_OP_RMSNORM : LNORM_OP_LAYERNORM,
                                     .x_dtype = 1 + (t + i) % 3, .rows = 40 + 13 * i + t, .hidden = 1024 + 64 * t + i,
                                     .gamma = 1, .beta = 1, .stats = 1, .residual = i == 1};
            if (lnorm_test_case_make(&args[t].tc[i], &c, g)) {
                CHECK_FAIL("oom");
                return;
            }
        }
        made++;
    }
    for (int t = 0; t < NT; t++)
        CHECK(pthread_create(&th[t], NULL, conc_main, &args[t]) == 0, "pthread_create");
    for (int t = 0; t < NT; t++) {
        pthread_join(th[t], NULL);
        CHECK(args[t].bad == 0, "isa %s thread %d: %ld bad runs", lnorm_cpu_isa(cpu), t, args[t].bad);
        for (int i = 0; i < 3; i++)
            lnorm_test_case_free(&args[t].tc[i]);
    }
    (void)made;
}

typedef void per_isa_fn(lnorm_cpu *cpu, lnorm_rng *g);

static const struct {
    const char *name;
    per_isa_fn *fn;
} tests[] = {
    {"f16_tiny", t_f16_tiny},     {"cancellation", t_cancellation}, {"constant_rows", t_constant},
    {"eps_placement", t_eps_placement}, {"shared_params", t_shared_params}, {"nan_inf", t_nan_inf},
    {"reject", t_reject},         {"rms_no_mean", t_rms_no_mean}, {"concurrent_run", t_concurrent},
    {"in_place", t_in_place},     {"many_segments", t_many_segments},
    {"fp32_overflow", t_fp32_overflow}, {"fp32_subnormal", t_fp32_subnormal},
    {"eps_outside_min", t_eps_outside_min},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s NAME\n", argv[0]);
        return 2;
    }
    lnorm_rng g;
    lnorm_rng_seed(&g, 0xC0FFEEu ^ (uint64_t)strlen(argv[1]));
    int found = 0, ran = 0;
    for (int k = 0; k < 3; k++) {
        if (!strcmp(argv[1], "batch_invariance")) {
            found = 1;
            t_batch_invariance(isas[k], &g);
            ran++;
            continue;
        }
        for (size_t t = 0; t < sizeof tests / sizeof tests[0]; t++) {
            if (strcmp(argv[1], tests[t].name))
                continue;
            found = 1;
            lnorm_cpu *cpu = cpu_for(isas[k], 2);
            if (!cpu)
                continue;
            lnorm_test_worst_reset();
            tests[t].fn(cpu, &g);
            printf("  isa %s: worst f32 error / bound = %.3f\n", isas[k], lnorm_test_worst_ratio());
            lnorm_cpu_destroy(cpu);
            ran++;
        }
    }
    if (!found) {
        fprintf(stderr, "unknown test %s\n", argv[1]);
        return 2;
    }
    CHECK(ran > 0, "%s: no ISA ran", argv[1]);
    char name[64];
    snprintf(name, sizeof name, "kernels.%s", argv[1]);
    return check_finish(name);
}
