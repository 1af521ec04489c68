/*
 * kernels.checker: negative self-test of the float64 reference checker.
 * Proves the tolerance is tight enough to catch real bugs (dividing by a
 * padded count, missing eps, eps outside instead of inside, fp16
 * accumulation, perturbed or unwritten outputs) yet passes a plain,
 * correct fp32 two-pass implementation.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "half.h"
#include "lnorm_core.h"
#include "testcase.h"
#include "testutil.h"


enum bug { OK_NAIVE, PADDED_COUNT, NO_EPS, EPS_OUTSIDE, F16_ACCUM, NBUGS };
static const char *const bug_names[] = {"correct naive fp32", "divide by padded count", "eps missing",
                                        "eps outside sqrt", "fp16 accumulation"};

/* fp32 value rounded through f16, emulating an f16 accumulator. */
static float via_f16(float v)
{
    return lnorm_f16_to_f32(lnorm_f32_to_f16(v));
}

/* A simple fp32 LayerNorm of an f32 segment (no residual), with one bug. */
static void mutant(const lnorm_segment *s, enum bug bug)
{
    const int64_t H = s->hidden;
    const float n = bug == PADDED_COUNT ? (float)((H + 15) / 16 * 16) : (float)H;
    for (int64_t r = 0; r < s->rows; r++) {
        const float *x = (const float *)s->x + r * s->x_stride;
        float *y = (float *)s->y + r * s->y_stride;
        float sum = 0.0f, sq = 0.0f;
        for (int64_t c = 0; c < H; c++)
            sum = bug == F16_ACCUM ? via_f16(sum + x[c]) : sum + x[c];
        float mean = sum / n;
        for (int64_t c = 0; c < H; c++) {
            float d = x[c] - mean;
            sq = bug == F16_ACCUM ? via_f16(sq + d * d) : sq + d * d;
        }
        float var = sq / n;
        float rstd = bug == NO_EPS ? 1.0f / sqrtf(var)
                   : bug == EPS_OUTSIDE ? 1.0f / (sqrtf(var) + s->eps)
                                        : 1.0f / sqrtf(var + s->eps);
        for (int64_t c = 0; c < H; c++) {
            float v = (x[c] - mean) * rstd;
            if (s->gamma)
                v *= ((const float *)s->gamma)[c];
            if (s->beta)
                v += ((const float *)s->beta)[c];
            y[c] = v;
        }
        if (s->mean)
            s->mean[r] = mean;
        if (s->rstd)
            s->rstd[r] = rstd;
    }
}

static long quiet_check(const lnorm_segment *s)
{
    lnorm_test_tol tol;
    lnorm_test_tol_default(&tol);
    tol.max_report = 1;
    return lnorm_test_check_segment(s, &tol, "self-test");
}

int main(void)
{
    lnorm_rng g;
    lnorm_rng_seed(&g, 42);
    lnorm_cpu *cpu = NULL;
    if (lnorm_cpu_create(&cpu, 1)) {
        CHECK_FAIL("lnorm_cpu_create");
        return check_finish("kernels.checker_selftest");
    }
    /* Mutants on typical data: x ~ 0.3 + N(0,1), gamma ~ 1 +- 0.5, beta ~ +-0.5. */
    for (int64_t H = 1000; H <= 4100; H += 3100) {
        lnorm_test_case_cfg c = {.op = LNORM_OP_LAYERNORM, .x_dtype = LNORM_DTYPE_F32, .rows = 8, .hidden = H,
                                 .gamma = 1, .beta = 1, .stats = 1, .x_mean = 0.3};
        lnorm_test_case tc;
        if (lnorm_test_case_make(&tc, &c, &g)) {
            CHECK_FAIL("out of memory");
            return check_finish("kernels.checker_selftest");
        }
        for (int b = 0; b < NBUGS; b++) {
            lnorm_test_case_repoison(&tc);
            mutant(&tc.seg, (enum bug)b);
            long f = quiet_check(&tc.seg);
            if (b == OK_NAIVE)
                CHECK(f == 0, "H=%lld: %s rejected (%ld mismatches): tolerance too tight", (long long)H,
                      bug_names[b], f);
            else
                CHECK(f > 0, "H=%lld: %s passed the checker: tolerance too loose", (long long)H, bug_names[b]);
            printf("H=%lld %-24s -> %ld mismatches\n", (long long)H, bug_names[b], f);
        }
        /* The backend's own output passes; then single perturbations fail. */
        lnorm_test_case_repoison(&tc);
        CHECK(lnorm_cpu_run_segment(cpu, &tc.seg, NULL) == LNORM_OK, "run");
        CHECK(quiet_check(&tc.seg) == 0, "backend output rejected");
        float *y = tc.y;
        size_t k = (size_t)(3 * H + H / 2);
        float keep = y[k];
        /* 3e-6 of the row's scale (R ~ 4, gamma ~ 1): just over 2x the bound. */
        y[k] = keep + 1.2e-5f;
        CHECK(quiet_check(&tc.seg) == 1, "a y element off by 1.2e-5 was not caught");
        y[k] = lnorm__u2f(0xFFFFFFFFu);
        CHECK(quiet_check(&tc.seg) == 1, "a still-poisoned y element was not caught");
        y[k] = keep;
        float m = tc.mean[2];
        tc.mean[2] = m + 3e-6f * (fabsf(m) + 1.0f);
        CHECK(quiet_check(&tc.seg) == 1, "a mean off by 3e-6 was not caught");
        tc.mean[2] = NAN;
        CHECK(quiet_check(&tc.seg) == 1, "a NaN mean was not caught");
        tc.mean[2] = m;
        float rs = tc.rstd[5];
        tc.rstd[5] = rs * (1.0f + 3e-6f);
        CHECK(quiet_check(&tc.seg) == 1, "an rstd off by 3e-6 relative was not caught");
        tc.rstd[5] = rs;
        CHECK(quiet_check(&tc.seg) == 0, "restored output rejected");
        lnorm_test_case_free(&tc);
    }
    /* f16 and bf16 outputs: one ulp off passes, two ulps fail. */
    const int hdts[] = {LNORM_DTYPE_F16, LNORM_DTYPE_BF16};
    for (int i = 0; i < 2; i++) {
        lnorm_test_case_cfg c = {.op = LNORM_OP_LAYERNORM, .x_dtype = LNORM_DTYPE_F32, .y_dtype = hdts[i],
                                 .rows = 4, .hidden = 512, .gamma = 1, .beta = 1, .residual = 1};
        lnorm_test_case tc;
        if (lnorm_test_case_make(&tc, &c, &g))
            return 1;
        CHECK(lnorm_cpu_run_segment(cpu, &tc.seg, NULL) == LNORM_OK, "run");
        CHECK(quiet_check(&tc.seg) == 0, "%s output rejected", lnorm_dtype_name(hdts[i]));
        uint16_t *y = tc.y;
        size_t k = 700;
        uint16_t keep = y[k];
        /* pick a value well away from zero so "1 ulp" is not swamped by the f32 floor */
        while (fabs(lnorm_test_get(y, hdts[i], k)) < 0.5)
            keep = y[++k];
        y[k] = (uint16_t)(keep + 1);
        y[k] = (uint16_t)(keep + 3);
        long three = quiet_check(&tc.seg);
        CHECK(three == 1, "%s: an output 3 ulps off was not caught", lnorm_dtype_name(hdts[i]));
        /* One ulp from the correctly rounded reference passes, two fail. */
        double want = 0;
        {
            double yref[512 * 4], mr[4], rr[4], ro[512 * 4];
            lnorm_ref_segment(&tc.seg, yref, mr, rr, ro);
            want = yref[k];
        }
        uint16_t rn = hdts[i] == LNORM_DTYPE_F16 ? lnorm_f32_to_f16((float)lnorm_test_round(want, hdts[i]))
                                                 : lnorm_f32_to_bf16((float)lnorm_test_round(want, hdts[i]));
        y[k] = (uint16_t)(rn + 1);
        CHECK(quiet_check(&tc.seg) == 0, "%s: 1 ulp from the correct rounding rejected", lnorm_dtype_name(hdts[i]));
        y[k] = (uint16_t)(rn + 2);
        CHECK(quiet_check(&tc.seg) == 1, "%s: 2 ulps from the correct rounding not caught", lnorm_dtype_name(hdts[i]));
        y[k] = keep;
        /* residual_out must be bit-exact: flip its lowest bit. */
        float *ro = tc.residual_out;
        ro[9] = lnorm__u2f(lnorm__f2u(ro[9]) ^ 1u);
        CHECK(quiet_check(&tc.seg) == 1, "residual_out 1 ulp off not caught");
        lnorm_test_case_free(&tc);
    }
    /* NaN in the reference demands NaN in the output. */
    {
        lnorm_test_case_cfg c = {.op = LNORM_OP_LAYERNORM, .x_dtype = LNORM_DTYPE_F32, .rows = 2, .hidden = 64};
        lnorm_test_case tc;
        if (lnorm_test_case_make(&tc, &c, &g))
            return 1;
        ((float *)tc.x)[70] = NAN;
        CHECK(lnorm_cpu_run_segment(cpu, &tc.seg, NULL) == LNORM_OK, "run");
        CHECK(quiet_check(&tc.seg) == 0, "NaN row rejected");
        ((float *)tc.y)[80] = 0.0f;
        CHECK(quiet_check(&tc.seg) == 1, "a finite output where the reference is NaN not caught");
        lnorm_test_case_free(&tc);
    }
    lnorm_cpu_destroy(cpu);
    return check_finish("kernels.checker_selftest");
}
