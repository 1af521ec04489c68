/*
 * kernels.matrix: the CPU backend against the float64 reference over every
 * op x x-dtype x y-dtype x affine x param dtype x residual x stats, over
 * hidden sizes from 1 to 262144, with padded (non-contiguous) rows, on
 * every ISA path this machine has. Fresh random inputs, poisoned outputs.
 * Usage: test_matrix [isa]   (default: every available ISA; exit 77, "skipped",
 * when the one asked for is not available; $LNORM_TEST_SEED changes the
 * random inputs)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lnorm_core.h"
#include "check.h"
#include "testcase.h"
#include "testutil.h"

static const int64_t small_h[] = {1, 2, 3, 63, 64, 65, 127, 1000, 4096, 4097};
static const int64_t big_h[] = {65536, 262144};
static const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16, LNORM_DTYPE_BF16};

static long g_cases;

/* Build, run (through the pool or on the caller) and check one case. */
static void run_case(lnorm_cpu *cpu, const lnorm_test_case_cfg *cfg, lnorm_rng *g, int via_pool)
{
    lnorm_test_case tc;
    char label[200];
    snprintf(label, sizeof label,
             "isa=%s op=%s x=%s y=%s p=%s aff=%d%d res=%d stats=%d H=%lld rows=%lld pad=%lld",
             lnorm_cpu_isa(cpu), cfg->op == LNORM_OP_LAYERNORM ? "ln" : "rms",
             lnorm_dtype_name(cfg->x_dtype), lnorm_dtype_name(cfg->y_dtype ? cfg->y_dtype : cfg->x_dtype),
             lnorm_dtype_name(cfg->param_dtype ? cfg->param_dtype : cfg->x_dtype), cfg->gamma, cfg->beta,
             cfg->residual, cfg->stats, (long long)cfg->hidden, (long long)cfg->rows, (long long)cfg->pad);
    g_cases++;
    if (lnorm_test_case_make(&tc, cfg, g) != LNORM_OK) {
        CHECK_FAIL("%s: out of memory", label);
        return;
    }
    const char *why = NULL;
    int err;
    if (via_pool) {
        lnorm_batch b = {&tc.seg, 1};
        err = lnorm_cpu_run(cpu, &b, &why);
    } else {
        err = lnorm_cpu_run_segment(cpu, &tc.seg, &why);
    }
    if (err != LNORM_OK) {
        CHECK_FAIL("%s: run returned %s (%s)", label, lnorm_errname(err), why ? why : "");
    } else {
        long bad = lnorm_test_check_segment(&tc.seg, NULL, label);
        long pads = lnorm_test_case_pad_writes(&tc);
        CHECK(bad == 0, "%s: %ld mismatches", label, bad);
        CHECK(pads == 0, "%s: %ld bytes written in row padding", label, pads);
    }
    lnorm_test_case_free(&tc);
}

typedef struct sweep_arg {
    lnorm_cpu *cpu;
    lnorm_rng *g;
} sweep_arg;

static void matrix_case(const lnorm_test_case_cfg *c, long idx, size_t hi, void *arg)
{
    sweep_arg *a = arg;
    run_case(a->cpu, c, a->g, (idx + (long)hi) % 2);
}

static void sweep(lnorm_cpu *cpu, lnorm_rng *g)
{
    sweep_arg a = {cpu, g};
    lnorm_test_matrix(small_h, sizeof small_h / sizeof *small_h, matrix_case, &a);
    /* Huge rows: every op x x-dtype x residual with gamma+beta and stats,
     * plus the cross y dtype, each H, two rows. */
    for (size_t hi = 0; hi < sizeof big_h / sizeof *big_h; hi++)
        for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++)
            for (int xi = 0; xi < 3; xi++)
                for (int res = 0; res < 2; res++) {
                    lnorm_test_case_cfg c = {.op = op, .x_dtype = dts[xi], .y_dtype = res ? LNORM_DTYPE_F32 : dts[xi],
                                             .gamma = 1, .beta = 1, .residual = res, .stats = 1, .x_mean = 0.5,
                                             .x_spread = 2.0, .hidden = big_h[hi], .rows = 2, .pad = res ? 5 : 0};
                    run_case(cpu, &c, g, res);
                }
    /* Outputs of 4 MiB and more: y goes out through non-temporal stores
     * (aligned rows) and plain ones (odd padding), over the pool. */
    for (int xi = 0; xi < 3; xi++)
        for (int pad = 0; pad < 2; pad++) {
            lnorm_test_case_cfg c = {0};
            c.op = xi == 1 ? LNORM_OP_RMSNORM : LNORM_OP_LAYERNORM;
            c.x_dtype = dts[xi];
            c.y_dtype = xi == 2 ? LNORM_DTYPE_F32 : dts[xi];
            c.gamma = c.beta = 1;
            c.stats = 1;
            c.residual = pad;
            c.hidden = 4096;
            c.rows = 520;
            c.pad = pad ? 3 : 0;
            run_case(cpu, &c, g, 1);
        }
}

int main(int argc, char **argv)
{
    const char *isas[] = {"scalar", "avx2", "avx512"};
    if (argc > 1 && strcmp(argv[1], "scalar") && strcmp(argv[1], "avx2") && strcmp(argv[1], "avx512")) {
        fprintf(stderr, "usage: %s [scalar|avx2|avx512]\n", argv[0]);
        return 2;
    }
    lnorm_cpu *cpu;
    if (lnorm_cpu_create(&cpu, 2) != LNORM_OK) {
        CHECK_FAIL("lnorm_cpu_create");
        return check_finish("kernels.matrix");
    }
    lnorm_rng g;
    lnorm_rng_seed(&g, lnorm_test_seed(0x5eed1234u));
    int ran = 0;
    for (int i = 0; i < 3; i++) {
        if (argc > 1 && strcmp(argv[1], isas[i]))
            continue;
        int err = lnorm_cpu_set_isa(cpu, isas[i]);
        if (err == LNORM_ENOTSUP) {
            printf("isa %s: not available on this machine/build, not checked\n", isas[i]);
            continue;
        }
        if (err) {
            CHECK_FAIL("set_isa(%s) = %s", isas[i], lnorm_errname(err));
            continue;
        }
        long f0 = check_failures(), c0 = g_cases;
        lnorm_test_worst_reset();
        sweep(cpu, &g);
        printf("isa %s: %ld cases, %ld failed; worst f32 error / bound = %.3f (%s)\n", isas[i], g_cases - c0,
               check_failures() - f0, lnorm_test_worst_ratio(), lnorm_test_worst_where());
        ran++;
    }
    lnorm_cpu_destroy(cpu);
    if (!ran && argc > 1 && !check_failures()) {
        printf("SKIP: isa %s not available here\n", argv[1]);
        return 77; /* ctest SKIP_RETURN_CODE: reported as skipped, not passed */
    }
    CHECK(ran > 0, "no ISA was checked");
    printf("%ld cases\n", g_cases);
    return check_finish("kernels.matrix");
}
