/*
 * The backward (lnorm_cpu_run_bwd) against the float64 reference of
 * tests/common/testbwd.h, on every ISA path this machine has (the ISA only
 * matters where mean/rstd are recomputed). Usage: test_bwd NAME (one ctest
 * entry per NAME, see CMakeLists.txt).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lnorm_core.h"
#include "testbwd.h"
#include "testutil.h"

static const char *const isas[] = {"scalar", "avx2", "avx512"};
static const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16, LNORM_DTYPE_BF16};

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

static long run1(lnorm_cpu *cpu, lnorm_test_bwd_case *tc, const char *label)
{
    lnorm_bwd_batch b = {&tc->seg, 1};
    const char *why = NULL;
    int err = lnorm_cpu_run_bwd(cpu, &b, &why);
    CHECK(err == LNORM_OK, "%s: run = %s (%s)", label, lnorm_errname(err), why ? why : "");
    return err;
}

/* Build, run, check against the reference and that no padding was written. */
static long run_check(lnorm_cpu *cpu, const lnorm_test_bwd_cfg *c, lnorm_rng *g, double rtol, const char *label)
{
    lnorm_test_bwd_case tc;
    if (lnorm_test_bwd_make(&tc, c, g, cpu)) {
        CHECK_FAIL("%s: make", label);
        return 1;
    }
    long bad = 1;
    if (!run1(cpu, &tc, label)) {
        bad = lnorm_test_bwd_check(&tc.seg, rtol, label);
        long pw = lnorm_test_bwd_pad_writes(&tc);
        CHECK(pw == 0, "%s: %ld bytes of dx padding written", label, pw);
    }
    CHECK(bad == 0, "%s (%s x/%s dy/%s dx, H %lld, gamma %d, dres %d, stats %d, eps %s): %ld mismatches", label,
          lnorm_dtype_name(tc.seg.x_dtype), lnorm_dtype_name(tc.seg.dy_dtype), lnorm_dtype_name(tc.seg.dx_dtype),
          (long long)c->hidden, c->gamma, c->dres, c->stats, c->eps_mode ? "outside" : "inside", bad);
    lnorm_test_bwd_free(&tc);
    return bad;
}

/* Every op x dtypes (x, dy, dx) x gamma x dres x stats x eps placement, at
 * odd and even hiddens, some with row padding (strides > hidden). */
static void t_matrix(lnorm_cpu *cpu, lnorm_rng *g)
{
    static const int combos[][3] = {
        {LNORM_DTYPE_F32, LNORM_DTYPE_F32, LNORM_DTYPE_F32},    {LNORM_DTYPE_F16, LNORM_DTYPE_F16, LNORM_DTYPE_F16},
        {LNORM_DTYPE_BF16, LNORM_DTYPE_BF16, LNORM_DTYPE_BF16}, {LNORM_DTYPE_BF16, LNORM_DTYPE_F32, LNORM_DTYPE_F32},
        {LNORM_DTYPE_F16, LNORM_DTYPE_BF16, LNORM_DTYPE_F32},   {LNORM_DTYPE_F32, LNORM_DTYPE_BF16, LNORM_DTYPE_F16},
    };
    static const int64_t hs[] = {1, 7, 64, 333, 1024, 4099};
    long idx = 0, cases = 0;
    for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++)
        for (size_t d = 0; d < sizeof combos / sizeof combos[0]; d++)
            for (int bits = 0; bits < 16; bits++)
                for (size_t h = 0; h < sizeof hs / sizeof hs[0]; h++, idx++) {
                    lnorm_test_bwd_cfg c = {.op = op, .x_dtype = combos[d][0], .dy_dtype = combos[d][1],
                                            .dx_dtype = combos[d][2], .rows = 1 + idx % 9, .hidden = hs[h],
                                            .gamma = bits & 1, .dres = (bits >> 1) & 1, .stats = (bits >> 2) & 1,
                                            .eps_mode = (bits >> 3) & 1, .dgamma = 1, .dbeta = idx % 3 != 0,
                                            .pad = idx % 4 == 1 ? 3 : 0, .x_mean = op == LNORM_OP_LAYERNORM ? 0.5 : 0.0,
                                            .x_spread = idx % 5 == 2 ? 1e-2 : 1.0};
                    /* Odd param dtype: f32 every other case (else x's). */
                    c.param_dtype = idx % 2 ? LNORM_DTYPE_F32 : 0;
                    /* A large eps next to the spread: the eps-outside term matters. */
                    if (idx % 7 == 3)
                        c.eps = 1e-2f;
                    run_check(cpu, &c, g, 0, "matrix");
                    cases++;
                }
    printf("  isa %s: %ld cases\n", lnorm_cpu_isa(cpu), cases);
}

/* Mean >> spread (cancellation), with the forward's mean given (its fp32
 * rounding is ulp(mean), 3% of the spread here) and recomputed. */
static void t_large_mean(lnorm_cpu *cpu, lnorm_rng *g)
{
    for (int d = 0; d < 3; d++)
        for (int stats = 0; stats < 2; stats++)
            for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++) {
                lnorm_test_bwd_cfg c = {.op = op, .x_dtype = dts[d], .dx_dtype = LNORM_DTYPE_F32,
                                        .rows = 5, .hidden = 4096 + 3, .gamma = 1, .stats = stats, .dgamma = 1,
                                        .dbeta = 1, .x_mean = 1e6, .x_spread = 1.0};
                if (dts[d] == LNORM_DTYPE_F16) {
                    c.x_mean = 1e4;
                    c.x_spread = 40.0;
                }
                if (dts[d] == LNORM_DTYPE_BF16)
                    c.x_spread = 3e4;
                run_check(cpu, &c, g, 0, "large mean");
            }
}

/* Tiny and huge rows at the edges of fp32 (the forward's rescue ranges). */
static void t_fp32_edges(lnorm_cpu *cpu, lnorm_rng *g)
{
    const double spreads[] = {1e-30, 1e-20, 1e18, 1e30};
    for (int s = 0; s < 4; s++)
        for (int mode = 0; mode < 2; mode++)
            for (int stats = 0; stats < 2; stats++)
                for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++) {
                    lnorm_test_bwd_cfg c = {.op = op, .x_dtype = LNORM_DTYPE_F32, .rows = 3, .hidden = 1000,
                                            .gamma = 1, .dres = 1, .stats = stats, .dgamma = 1, .dbeta = 1,
                                            .eps_mode = mode, .eps = 0x1p-126f, .x_spread = spreads[s]};
                    run_check(cpu, &c, g, 0, "fp32 edges");
                }
}

/* Constant rows: xhat = 0, dx = rstd * (g - mean(g)) (LayerNorm). */
static void t_constant(lnorm_cpu *cpu, lnorm_rng *g)
{
    const double vals[] = {0.0, 3.25, -1e4};
    for (int d = 0; d < 3; d++)
        for (int v = 0; v < 3; v++)
            for (int mode = 0; mode < 2; mode++)
                for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++) {
                    if (op == LNORM_OP_RMSNORM && vals[v] == 0.0 && mode == 0)
                        continue; /* RMSNorm of zeros is fine too: covered with eps outside */
                    /* eps outside: rstd = 1 / eps (1e3 here, f16 dx stays finite). */
                    lnorm_test_bwd_cfg c = {.op = op, .x_dtype = dts[d], .rows = 3, .hidden = 777, .gamma = 1,
                                            .dgamma = 1, .dbeta = 1, .eps_mode = mode, .eps = mode ? 1e-3f : 0.0f};
                    lnorm_test_bwd_case tc;
                    if (lnorm_test_bwd_make(&tc, &c, g, cpu)) {
                        CHECK_FAIL("make");
                        return;
                    }
                    for (size_t k = 0; k < (size_t)(c.rows * c.hidden); k++)
                        lnorm_test_set(tc.x, dts[d], k, vals[v]);
                    if (!run1(cpu, &tc, "constant")) {
                        long bad = lnorm_test_bwd_check(&tc.seg, 0, "constant");
                        long nonfinite = 0;
                        for (size_t k = 0; k < (size_t)(c.rows * c.hidden); k++)
                            nonfinite += !isfinite(lnorm_test_get(tc.dx, dts[d], k));
                        CHECK(bad == 0 && nonfinite == 0, "constant rows (%s, %g, eps %s): %ld mismatches, %ld non-finite",
                              lnorm_dtype_name(dts[d]), vals[v], mode ? "outside" : "inside", bad, nonfinite);
                    }
                    lnorm_test_bwd_free(&tc);
                }
}

/* NaN / Inf in x, dy and gamma: they propagate as the reference's. */
static void t_nan_inf(lnorm_cpu *cpu, lnorm_rng *g)
{
    const double bad_vals[] = {NAN, INFINITY, -INFINITY};
    for (int where = 0; where < 3; where++)
        for (int b = 0; b < 3; b++)
            for (int stats = 0; stats < 2; stats++)
                for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++) {
                    lnorm_test_bwd_cfg c = {.op = op, .x_dtype = dts[b], .rows = 4, .hidden = 300, .gamma = 1,
                                            .dgamma = 1, .dbeta = 1, .stats = stats};
                    lnorm_test_bwd_case tc;
                    if (lnorm_test_bwd_make(&tc, &c, g, NULL)) {
                        CHECK_FAIL("make");
                        return;
                    }
                    /* Row 1 gets the bad value at column 17 (x or dy) or gamma[17]. */
                    if (where == 0)
                        lnorm_test_set(tc.x, dts[b], 300 + 17, bad_vals[b]);
                    else if (where == 1)
                        lnorm_test_set(tc.dy, dts[b], 300 + 17, bad_vals[b]);
                    else
                        lnorm_test_set(tc.gamma, dts[b], 17, bad_vals[b]);
                    if (stats && where == 0) {
                        /* The forward's statistics of the changed row. */
                        lnorm_segment f;
                        lnorm_segment_init(&f, (lnorm_op)op, (lnorm_dtype)dts[b], 4, 300);
                        void *y = malloc(4 * 300 * 4);
                        f.x = tc.x;
                        f.y = y;
                        f.mean = tc.mean;
                        f.rstd = tc.rstd;
                        CHECK(lnorm_cpu_run_segment(cpu, &f, NULL) == LNORM_OK, "forward");
                        free(y);
                    }
                    if (!run1(cpu, &tc, "nan_inf")) {
                        long bad = lnorm_test_bwd_check(&tc.seg, 0, "nan_inf");
                        /* Rows 0, 2, 3 stay finite whatever row 1 holds (gamma is every row's). */
                        long nf = 0;
                        for (int r = 0; r < 4 && where != 2; r++)
                            for (int k = 0; k < 300 && r != 1; k++)
                                nf += !isfinite(lnorm_test_get(tc.dx, dts[b], (size_t)(r * 300 + k)));
                        CHECK(bad == 0 && nf == 0, "nan_inf (op %d, in %s, %g): %ld mismatches, %ld non-finite in clean rows",
                              op, where == 0 ? "x" : where == 1 ? "dy" : "gamma", bad_vals[b], bad, nf);
                    }
                    lnorm_test_bwd_free(&tc);
                }
}

/* dgamma/dbeta (and dx) the same bits: alone, in a batch of other
 * segments, on 1 thread and on 4; recomputed statistics the same as the
 * forward's own (stats given from the same ISA). */
static void t_batch_invariance(lnorm_cpu *cpu, lnorm_rng *g)
{
    lnorm_cpu *c1 = cpu_for(lnorm_cpu_isa(cpu), 1), *c4 = cpu_for(lnorm_cpu_isa(cpu), 4);
    enum { NSEG = 5 };
    lnorm_test_bwd_case tcs[NSEG];
    lnorm_bwd_segment segs[NSEG];
    int made = 0;
    for (int i = 0; c1 && c4 && i < NSEG; i++, made++) {
        lnorm_test_bwd_cfg c = {.op = i % 2 ? LNORM_OP_RMSNORM : LNORM_OP_LAYERNORM, .x_dtype = dts[i % 3],
                                .rows = 300 + 97 * i, .hidden = i == 4 ? 4097 : 256 + 5 * i, .gamma = 1,
                                .dres = i % 3 == 1, .dgamma = 1, .dbeta = 1, .pad = i, .eps_mode = i == 2};
        if (lnorm_test_bwd_make(&tcs[i], &c, g, c4)) {
            CHECK_FAIL("make");
            break;
        }
        segs[i] = tcs[i].seg;
    }
    if (made == NSEG) {
        lnorm_bwd_batch b = {segs, NSEG};
        CHECK(lnorm_cpu_run_bwd(c4, &b, NULL) == LNORM_OK, "batch run");
        for (int i = 0; i < NSEG; i++)
            CHECK(lnorm_test_bwd_check(&segs[i], 0, "batch") == 0, "batch seg %d vs reference", i);
        for (int i = 0; i < NSEG; i++) {
            const lnorm_bwd_segment *s = &segs[i];
            const size_t H = (size_t)s->hidden, dxb = tcs[i].dx_bytes;
            float *dg = malloc(H * 4), *db = malloc(H * 4);
            void *dx = malloc(dxb);
            if (!dg || !db || !dx) {
                CHECK_FAIL("oom");
                free(dg), free(db), free(dx);
                continue;
            }
            memcpy(dg, s->dgamma, H * 4);
            memcpy(db, s->dbeta, H * 4);
            memcpy(dx, s->dx, dxb);
            /* Alone, on 1 thread, then 4 threads. */
            for (int k = 0; k < 2; k++) {
                lnorm_test_bwd_repoison(&tcs[i]);
                lnorm_bwd_batch one = {s, 1};
                CHECK(lnorm_cpu_run_bwd(k ? c4 : c1, &one, NULL) == LNORM_OK, "alone");
                CHECK(!memcmp(dg, s->dgamma, H * 4) && !memcmp(db, s->dbeta, H * 4),
                      "seg %d: dgamma/dbeta bits differ alone on %d thread(s)", i, k ? 4 : 1);
                CHECK(!memcmp(dx, s->dx, dxb), "seg %d: dx bits differ alone on %d thread(s)", i, k ? 4 : 1);
            }
            /* With the forward's statistics given: same bits as recomputed. */
            lnorm_segment f;
            lnorm_segment_init(&f, (lnorm_op)s->op, (lnorm_dtype)s->x_dtype, s->rows, s->hidden);
            f.eps = s->eps;
            f.eps_mode = s->eps_mode;
            f.x = s->x;
            f.x_stride = s->x_stride;
            void *y = malloc((size_t)(s->rows * s->x_stride) * 4);
            float *mean = malloc((size_t)s->rows * 4), *rstd = malloc((size_t)s->rows * 4);
            f.y = y;
            f.y_stride = s->x_stride;
            f.mean = s->op == LNORM_OP_LAYERNORM ? mean : NULL;
            f.rstd = rstd;
            if (y && mean && rstd && lnorm_cpu_run_segment(c4, &f, NULL) == LNORM_OK) {
                lnorm_bwd_segment gs = *s;
                gs.mean = f.mean;
                gs.rstd = rstd;
                lnorm_test_bwd_repoison(&tcs[i]);
                lnorm_bwd_batch one = {&gs, 1};
                CHECK(lnorm_cpu_run_bwd(c4, &one, NULL) == LNORM_OK, "given stats");
                CHECK(!memcmp(dg, s->dgamma, H * 4) && !memcmp(dx, s->dx, dxb),
                      "seg %d: given statistics give other bits than recomputed ones", i);
            } else {
                CHECK_FAIL("forward for stats");
            }
            free(y), free(mean), free(rstd);
            free(dg), free(db), free(dx);
        }
    }
    for (int i = 0; i < made; i++)
        lnorm_test_bwd_free(&tcs[i]);
    lnorm_cpu_destroy(c1);
    lnorm_cpu_destroy(c4);
}

/* Only what is asked for is written: dgamma without dbeta and the other
 * way round; big rows (H = 65536, pool tasks of one row), every output
 * poisoned first. */
static void t_outputs(lnorm_cpu *cpu, lnorm_rng *g)
{
    for (int k = 0; k < 3; k++) {
        lnorm_test_bwd_cfg c = {.op = LNORM_OP_LAYERNORM, .x_dtype = LNORM_DTYPE_BF16, .rows = 9,
                                .hidden = k == 2 ? 65536 + 1 : 513, .gamma = 1, .dgamma = k != 1, .dbeta = k != 0,
                                .pad = 5, .stats = k == 2};
        run_check(cpu, &c, g, 0, "outputs");
    }
    /* A long column reduction: 20000 rows. */
    lnorm_test_bwd_cfg c = {.op = LNORM_OP_RMSNORM, .x_dtype = LNORM_DTYPE_F32, .rows = 20000, .hidden = 96,
                            .gamma = 1, .dgamma = 1, .dbeta = 1};
    run_check(cpu, &c, g, 0, "20000 rows");
}

/* Invalid segments: named errors, nothing written. */
static void t_reject(lnorm_cpu *cpu, lnorm_rng *g)
{
    lnorm_test_bwd_cfg c = {.op = LNORM_OP_LAYERNORM, .x_dtype = LNORM_DTYPE_F32, .rows = 2, .hidden = 8,
                            .gamma = 1, .dgamma = 1, .stats = 1};
    lnorm_test_bwd_case tc;
    if (lnorm_test_bwd_make(&tc, &c, g, cpu)) {
        CHECK_FAIL("make");
        return;
    }
    static const char *const names[] = {"op",        "x_dtype", "dy_dtype",  "dx_dtype", "param_dtype", "eps",
                                        "eps_mode",  "rows",    "hidden",    "hidden",   "x",           "dy",
                                        "dx",        "x_stride", "dy_stride", "dx_stride", "dres_stride", "mean",
                                        "mean",      "eps"};
    for (int k = 0; k < (int)(sizeof names / sizeof names[0]); k++) {
        lnorm_bwd_segment s = tc.seg;
        switch (k) {
        case 0: s.op = 7; break;
        case 1: s.x_dtype = 0; break;
        case 2: s.dy_dtype = 9; break;
        case 3: s.dx_dtype = 0; break;
        case 4: s.param_dtype = LNORM_DTYPE_BF16; break;
        case 5: s.eps = NAN; break;
        case 6: s.eps_mode = 2; break;
        case 7: s.rows = 0; break;
        case 8: s.hidden = 0; break;
        case 9: s.hidden = (int64_t)LNORM_CORE_MAX_HIDDEN + 1; break;
        case 10: s.x = NULL; break;
        case 11: s.dy = NULL; break;
        case 12: s.dx = NULL; break;
        case 13: s.x_stride = 7; break;
        case 14: s.dy_stride = 7; break;
        case 15: s.dx_stride = 7; break;
        case 16: s.dres = tc.x; s.dres_stride = 3; break;
        case 17: s.rstd = NULL; break; /* LayerNorm mean without rstd */
        case 18: s.op = LNORM_OP_RMSNORM; break; /* RMSNorm with a mean */
        case 19: s.eps_mode = LNORM_EPS_OUTSIDE; s.eps = 1e-39f; break;
        }
        lnorm_bwd_segment segs[2] = {tc.seg, s};
        lnorm_bwd_batch b = {segs, 2};
        const char *why = NULL;
        lnorm_test_bwd_repoison(&tc);
        int err = lnorm_cpu_run_bwd(cpu, &b, &why);
        CHECK(err == LNORM_EINVAL, "case %d (%s): %s", k, names[k], lnorm_errname(err));
        CHECK(why && !strncmp(why, names[k], strlen(names[k])), "case %d: why = %s, want it to name %s", k,
              why ? why : "(null)", names[k]);
        /* Nothing ran: the valid first segment's outputs are still poisoned. */
        uint32_t u;
        memcpy(&u, tc.dgamma, 4);
        CHECK(u == 0xFFFFFFFFu, "case %d: the batch ran in part", k);
    }
    const char *why = NULL;
    CHECK(lnorm_cpu_run_bwd(NULL, NULL, &why) == LNORM_EINVAL, "NULL runner");
    lnorm_bwd_batch empty = {NULL, 0};
    CHECK(lnorm_cpu_run_bwd(cpu, &empty, NULL) == LNORM_OK, "empty batch");
    lnorm_test_bwd_free(&tc);
}

typedef void per_isa_fn(lnorm_cpu *cpu, lnorm_rng *g);

static const struct {
    const char *name;
    per_isa_fn *fn;
} tests[] = {
    {"matrix", t_matrix},     {"large_mean", t_large_mean}, {"fp32_edges", t_fp32_edges},
    {"constant_rows", t_constant}, {"nan_inf", t_nan_inf}, {"batch_invariance", t_batch_invariance},
    {"outputs", t_outputs},   {"reject", t_reject},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s NAME\n", argv[0]);
        return 2;
    }
    lnorm_rng g;
    lnorm_rng_seed(&g, lnorm_test_seed(0xB4C3u ^ (uint64_t)strlen(argv[1])));
    int found = 0, ran = 0;
    for (size_t t = 0; t < sizeof tests / sizeof tests[0]; t++) {
        if (strcmp(argv[1], tests[t].name))
            continue;
        found = 1;
        for (int k = 0; k < 3; k++) {
            lnorm_cpu *cpu = cpu_for(isas[k], 2);
            if (!cpu)
                continue;
            (void)lnorm_test_bwd_worst();
            tests[t].fn(cpu, &g);
            printf("  isa %s: worst error / bound = %.3f\n", isas[k], lnorm_test_bwd_worst());
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
    snprintf(name, sizeof name, "kernels.bwd_%s", argv[1]);
    return check_finish(name);
}
