/*
 * gpu.matrix: the CUDA backend on a GPU.
 *  1. The CPU backend's matrix (op x x-dtype x y-dtype x affine x param
 *     dtype x residual x stats x H, padded rows) on the GPU against the
 *     float64 reference, outputs poisoned (padding writes fail too), plus
 *     one hidden size inside every tier (clusters and the streaming tier),
 *     and LayerNorm with |mean| >> spread in every tier.
 *  2. GPU against the CPU backend on the same inputs (residual_out and
 *     y within a bound of each other, residual_out bit-exact).
 *  3. Alignment invariance: every third case again with every tensor
 *     shifted by one element (scalar paths): bit-identical outputs.
 *  4. Batch invariance: segments run alone and inside mixed batches (one
 *     launch from a device table, and several groups): bit-identical.
 *  5. The bulk-copy pipeline in its steady state (many rows, forced stage
 *     counts) against float64 and bit-identical to the kernels without it;
 *     k_fast bit-identical to the general kernel (gamma/beta in every
 *     combination, masked tails).
 *  6. Bad input: clear error codes, nothing run.
 *  7. Dynamic tiles (long-row kernels with a workspace): in the bulk
 *     pipeline runs, and over many fills a cluster (dyn_wrap) against
 *     float64 and bit-identical to the fixed-share runs.
 *  8. Rows at the edges of fp32 (overflowing and subnormal sums) in every
 *     tier against float64 and the CPU backend, bit-identical through
 *     every kernel of the tier (edges); the rows the fast kernels defer
 *     to the rescue list, within and past its capacity, on small grids and
 *     in place (deferred_lists).
 * Usage: test_gpu [--quick | --dyn | --edges | --defer]  (--quick: a
 * reduced set for compute-sanitizer; --dyn: part 7's many-fill runs alone;
 * --edges: part 8 alone; --defer: the reduced deferred_lists alone, each
 * run named as it starts, for racecheck, which takes minutes over --quick)
 * Needs a GPU: exits 1 (never "passes") when none is usable.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "check.h"
#include "gpu_case.h"
#include "lnorm_core.h"
#include "lnorm_cuda.h"
#include "lnorm_cuda_impl.h" /* LNORM__DYN: which kernels take dynamic tiles */
#include "testcase.h"
#include "testutil.h"

static const int64_t small_h[] = {1, 2, 3, 63, 64, 65, 127, 1000, 4096, 4097};
static const int64_t quick_h[] = {1, 65, 1000, 4097};
/* One size inside every tier, the clusters and the streaming tier. */
static const int64_t tier_h[] = {30, 100, 200, 300, 1500, 3000, 8000, 12000, 20000, 40000, 100000, 131072, 300000, 500000, 1048577};
static const int64_t big_h[] = {65536, 262144};
static const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16, LNORM_DTYPE_BF16};

static long g_cases, g_cmp_cpu, g_cmp_align;
static lnorm_cpu *g_cpu;

/* Snapshot of a case's output buffers. */
typedef struct outs {
    void *y, *ro;
    float *mean, *rstd;
} outs;

static int outs_take(outs *o, const lnorm_test_case *tc)
{
    size_t rows = (size_t)tc->seg.rows;
    memset(o, 0, sizeof *o);
    o->y = malloc(tc->y_bytes);
    if (!o->y)
        return -1;
    memcpy(o->y, tc->y, tc->y_bytes);
    if (tc->residual_out && (o->ro = malloc(tc->res_bytes)))
        memcpy(o->ro, tc->residual_out, tc->res_bytes);
    if (tc->mean && (o->mean = malloc(rows * 4)))
        memcpy(o->mean, tc->mean, rows * 4);
    if (tc->rstd && (o->rstd = malloc(rows * 4)))
        memcpy(o->rstd, tc->rstd, rows * 4);
    return 0;
}

static void outs_free(outs *o)
{
    free(o->y);
    free(o->ro);
    free(o->mean);
    free(o->rstd);
}

/* Bitwise equality of a case's outputs with a snapshot (1: equal). */
static int outs_same(const outs *o, const lnorm_test_case *tc)
{
    size_t rows = (size_t)tc->seg.rows;
    if (memcmp(o->y, tc->y, tc->y_bytes))
        return 0;
    if (tc->residual_out && (!o->ro || memcmp(o->ro, tc->residual_out, tc->res_bytes)))
        return 0;
    if (tc->mean && (!o->mean || memcmp(o->mean, tc->mean, rows * 4)))
        return 0;
    if (tc->rstd && (!o->rstd || memcmp(o->rstd, tc->rstd, rows * 4)))
        return 0;
    return 1;
}

/* Run tc on the GPU (every tensor shifted by one element if misalign is 1,
 * y alone if 2: lnorm_gpu_case_make); outputs land in
 * tc's host buffers. With a workspace ws, through lnorm_cuda_run (a batch of
 * one segment: the long-row kernels take dynamic tiles), else through
 * lnorm_cuda_run_segment. */
static int gpu_run_ws(lnorm_test_case *tc, int misalign, lnorm_cuda_ws *ws, const char **why)
{
    lnorm_gpu_case gc;
    lnorm_test_case_repoison(tc);
    int err = lnorm_gpu_case_make(&gc, tc, misalign);
    if (err) {
        *why = "device allocation/upload";
        return err;
    }
    if (ws) {
        lnorm_batch b = {&gc.seg, 1};
        err = lnorm_cuda_run(&b, NULL, ws, why);
    } else {
        err = lnorm_cuda_run_segment(&gc.seg, NULL, why);
    }
    if (err == LNORM_OK && lnorm_gpu_case_fetch(&gc, tc) != LNORM_OK) {
        *why = cudaGetErrorString(cudaGetLastError());
        err = LNORM_ECUDA;
    }
    lnorm_gpu_case_free(&gc);
    return err;
}

static int gpu_run(lnorm_test_case *tc, int misalign, const char **why)
{
    return gpu_run_ws(tc, misalign, NULL, why);
}

/* The CTAs a row of tier description tdesc ("reg<TPR>x<NCH>cl<CL>"; 0 for
 * the streaming tier), and in *dyn whether its bulk kernel for op takes
 * dynamic tiles given a workspace (LNORM__DYN). */
static int tier_ctas(const char *tdesc, int op, int *dyn, int *tpr_out)
{
    int tpr = 0, nch = 0, cl = 0;
    if (sscanf(tdesc, "reg%dx%dcl%d", &tpr, &nch, &cl) != 3)
        cl = tpr = 0;
    *dyn = cl > 0 && LNORM__DYN(op == LNORM_OP_RMSNORM, tpr, cl);
    if (tpr_out)
        *tpr_out = tpr; /* threads a row (0 for the streaming tier) */
    return cl;
}

static void run_case(const lnorm_test_case_cfg *cfg, lnorm_rng *g, int check_align)
{
    lnorm_test_case tc;
    char label[220];
    const char *tdesc = "?";
    lnorm_cuda_tier(cfg->x_dtype, cfg->hidden, &tdesc);
    snprintf(label, sizeof label, "gpu op=%s x=%s y=%s p=%s aff=%d%d res=%d stats=%d H=%lld rows=%lld pad=%lld tier=%s",
             cfg->op == LNORM_OP_LAYERNORM ? "ln" : "rms", lnorm_dtype_name(cfg->x_dtype),
             lnorm_dtype_name(cfg->y_dtype ? cfg->y_dtype : cfg->x_dtype),
             lnorm_dtype_name(cfg->param_dtype ? cfg->param_dtype : cfg->x_dtype), cfg->gamma, cfg->beta,
             cfg->residual, cfg->stats, (long long)cfg->hidden, (long long)cfg->rows, (long long)cfg->pad, tdesc);
    g_cases++;
    if (lnorm_test_case_make(&tc, cfg, g) != LNORM_OK) {
        CHECK_FAIL("%s: out of memory", label);
        return;
    }
    long bad = 0;
    const char *why = NULL;
    int err = gpu_run(&tc, 0, &why);
    if (err != LNORM_OK) {
        CHECK_FAIL("%s: run returned %s (%s)", label, lnorm_errname(err), why ? why : "");
        bad = 1;
    } else {
        bad = lnorm_test_check_segment(&tc.seg, NULL, label);
        long pads = lnorm_test_case_pad_writes(&tc);
        if (pads) {
            CHECK_FAIL("%s: %ld bytes written in row padding", label, pads);
            bad += pads;
        }
        /* GPU vs CPU on the same inputs. */
        outs gpu;
        if (outs_take(&gpu, &tc) == 0) {
            lnorm_test_case_repoison(&tc);
            int e2 = lnorm_cpu_run_segment(g_cpu, &tc.seg, &why);
            if (e2) {
                CHECK_FAIL("%s: cpu run %s", label, lnorm_errname(e2));
                bad++;
            } else {
                lnorm_segment gs = tc.seg; /* CPU outputs now in tc's buffers */
                gs.y = gpu.y;
                gs.residual_out = gpu.ro;
                gs.mean = gpu.mean;
                gs.rstd = gpu.rstd;
                long d = lnorm_test_cmp_outputs(&gs, &tc.seg, label);
                g_cmp_cpu++;
                if (d) {
                    CHECK_FAIL("%s: %ld gpu/cpu disagreements", label, d);
                    bad += d;
                }
            }
            /* Alignment invariance. */
            if (check_align) {
                err = gpu_run(&tc, 1, &why);
                g_cmp_align++;
                if (err) {
                    CHECK_FAIL("%s misaligned: %s (%s)", label, lnorm_errname(err), why ? why : "");
                    bad++;
                } else if (!outs_same(&gpu, &tc)) {
                    CHECK_FAIL("%s: misaligned run differs from the aligned one", label);
                    bad++;
                }
            }
            outs_free(&gpu);
        } else {
            CHECK_FAIL("%s: out of memory", label);
        }
        if (bad)
            CHECK_FAIL("%s: %ld mismatches", label, bad);
    }
    lnorm_test_case_free(&tc);
}

typedef struct sweep_arg {
    lnorm_rng *g;
    int quick;
} sweep_arg;

/* A case of lnorm_test_matrix (every fifth one in quick mode). */
static void matrix_case(const lnorm_test_case_cfg *c, long idx, size_t hi, void *arg)
{
    sweep_arg *a = arg;
    if (!a->quick || idx % 5 == 0)
        run_case(c, a->g, (idx + (long)hi) % 3 == 0);
}

static void sweep(lnorm_rng *g, int quick)
{
    sweep_arg a = {g, quick};
    if (quick)
        lnorm_test_matrix(quick_h, sizeof quick_h / sizeof *quick_h, matrix_case, &a);
    else
        lnorm_test_matrix(small_h, sizeof small_h / sizeof *small_h, matrix_case, &a);
    /* Every tier and the big rows: op x x-dtype x residual, gamma+beta,
     * stats, a cross y dtype with the residual. */
    for (int part = 0; part < 2; part++) {
        const int64_t *list = part ? big_h : tier_h;
        size_t n = part ? sizeof big_h / sizeof *big_h : sizeof tier_h / sizeof *tier_h;
        for (size_t hi = 0; hi < n; hi++)
            for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++)
                for (int xi = 0; xi < 3; xi++)
                    for (int res = 0; res < 2; res++) {
                        lnorm_test_case_cfg c = {.op = op, .x_dtype = dts[xi],
                                                 .y_dtype = res ? LNORM_DTYPE_F32 : dts[xi],
                                                 .param_dtype = res ? dts[xi] : LNORM_DTYPE_F32, .gamma = 1,
                                                 .beta = 1, .residual = res, .stats = 1, .x_mean = 0.5,
                                                 .x_spread = 2.0, .hidden = list[hi], .pad = res ? 5 : 0};
                        c.rows = c.hidden > 300000 ? 1 : c.hidden > 4096 ? 2 : 7;
                        if (!(quick && (xi != 2 || hi % 3)))
                            run_case(&c, g, res == 0 && op == LNORM_OP_LAYERNORM);
                        /* f32 LayerNorm again with |mean| >> spread (x ~ 1000 +
                         * N(0, 1)): the shift K must keep the sums small in
                         * every kernel (a plain fp32 sum fails the float64
                         * checks here). */
                        if (op == LNORM_OP_LAYERNORM && xi == 0 && res == 0 && !(quick && hi % 3)) {
                            c.x_mean = 1000.0;
                            c.x_spread = 1.0;
                            run_case(&c, g, 1);
                        }
                    }
    }
}

/* k_fast (no residual) against the general kernel (the same rows with an
 * all-zero residual, so h = x + 0 = x): bit-identical y, mean and rstd for
 * every combination of gamma and beta (beta alone too), both ops, f32, bf16
 * and f16 x, parameters of x's dtype and f32, H
 * with and without a masked tail, aligned rows (the straight-line form
 * where the policy takes it) and padded ones (the general form). */
static void fast_vs_general(lnorm_rng *g, int quick)
{
    static const int64_t hs[] = {100, 1003, 1024, 4096};
    /* f16 too: k_fast packs 16-bit chunks a pair at a time
     * (pack), the general kernel element by element. */
    static const int xdts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_BF16, LNORM_DTYPE_F16};
    long n = 0;
    for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++)
        for (int xi = 0; xi < (int)(sizeof xdts / sizeof *xdts); xi++)
            for (int aff = 0; aff < 4; aff++)
                for (int pi = 0; pi < 2; pi++)
                    for (size_t hi = 0; hi < sizeof hs / sizeof *hs; hi++) {
                        if (quick && (n++ % 3))
                            continue;
                        lnorm_test_case_cfg c = {0};
                        c.op = op;
                        c.x_dtype = xdts[xi];
                        c.param_dtype = pi ? xdts[xi] : LNORM_DTYPE_F32;
                        c.gamma = aff & 1;
                        c.beta = aff >> 1;
                        c.residual = 1;
                        c.stats = 1;
                        c.x_mean = 0.5 + hi;
                        c.x_spread = 1.5;
                        c.hidden = hs[hi];
                        c.rows = 37;
                        c.pad = (hi + aff) % 2 ? 3 : 0;
                        char label[160];
                        snprintf(label, sizeof label, "fast-vs-general op=%s x=%s p=%s gamma=%d beta=%d H=%lld pad=%lld",
                                 op == LNORM_OP_LAYERNORM ? "ln" : "rms", lnorm_dtype_name(c.x_dtype),
                                 lnorm_dtype_name(c.param_dtype), c.gamma, c.beta, (long long)c.hidden,
                                 (long long)c.pad);
                        g_cases++;
                        lnorm_test_case tc;
                        if (lnorm_test_case_make(&tc, &c, g) != LNORM_OK) {
                            CHECK_FAIL("%s: out of memory", label);
                            continue;
                        }
                        memset(tc.residual, 0, tc.res_bytes);
                        const char *why = NULL;
                        int err = gpu_run(&tc, 0, &why); /* residual: the general kernel */
                        if (err != LNORM_OK)
                            CHECK_FAIL("%s: general kernel run %s (%s)", label, lnorm_errname(err),
                                       why ? why : "");
                        long bad = err != LNORM_OK || lnorm_test_check_segment(&tc.seg, NULL, label);
                        CHECK(bad == 0, "%s: the general kernel is wrong", label);
                        outs general;
                        if (!bad && outs_take(&general, &tc) == 0) {
                            lnorm_test_case tf = tc; /* the same buffers, no residual: k_fast */
                            tf.seg.residual = NULL;
                            tf.seg.residual_out = NULL;
                            tf.residual = NULL;
                            tf.residual_out = NULL;
                            err = gpu_run(&tf, 0, &why);
                            if (err != LNORM_OK || !outs_same(&general, &tf)) {
                                CHECK_FAIL("%s: k_fast and the general kernel differ (%s)", label,
                                           err ? lnorm_errname(err) : "bits");
                            }
                            outs_free(&general);
                        } else if (!bad) {
                            CHECK_FAIL("%s: out of memory", label);
                        }
                        lnorm_test_case_free(&tc);
                    }
}

/* The end of a test of n segments (batch invariance, bulk table): the
 * verdict, then the workspace and every case freed. */
static void segs_end(const char *what, int ok, int f0, lnorm_cuda_ws *ws, int n, lnorm_test_case *tc,
                     lnorm_gpu_case *gc, outs *alone)
{
    if (!ok) {
        CHECK_FAIL("%s: setup or CUDA failure", what);
    }
    g_cases++;
    printf("%s: %s\n", what, check_failures() > f0 ? "FAIL" : "ok");
    lnorm_cuda_ws_destroy(ws);
    for (int i = 0; i < n; i++) {
        outs_free(&alone[i]);
        lnorm_gpu_case_free(&gc[i]);
        lnorm_test_case_free(&tc[i]);
    }
}

/* Batch invariance: NS segments (mixed dtypes, tiers, ops) run alone, then
 * together in one lnorm_cuda_run (same-tier groups share one launch through
 * the device table), then in the reverse order: outputs bit-identical. */
static void batch_invariance(lnorm_rng *g)
{
    /* Segments 0 and 12 (bf16 LayerNorm, f32 parameters, no residual, one
     * tier, whole aligned 16-byte units) share a launch of k_fast's
     * straight-line form through the device table; 10 (the same tier,
     * misaligned) takes the general fast kernel; 2 and 4 take fast-path
     * launches of their own; 6 and 8 (cluster tiers) and the odd ones
     * (residual) take the general kernels. */
    enum { NS = 13 };
    static const int64_t hs[NS] = {1000, 700, 1024, 513, 4097, 40000, 33000, 64, 300000, 2000, 900, 5000, 960};
    static const int xs[NS] = {LNORM_DTYPE_BF16, LNORM_DTYPE_BF16, LNORM_DTYPE_BF16, LNORM_DTYPE_BF16,
                               LNORM_DTYPE_F16, LNORM_DTYPE_F32, LNORM_DTYPE_F32, LNORM_DTYPE_F16,
                               LNORM_DTYPE_BF16, LNORM_DTYPE_F16, LNORM_DTYPE_BF16, LNORM_DTYPE_F16,
                               LNORM_DTYPE_BF16};
    lnorm_test_case tc[NS];
    lnorm_gpu_case gc[NS];
    outs alone[NS];
    int ok = 1;
    const int f0 = check_failures();
    memset(tc, 0, sizeof tc);
    memset(gc, 0, sizeof gc);
    memset(alone, 0, sizeof alone);
    for (int i = 0; i < NS && ok; i++) {
        lnorm_test_case_cfg c = {0};
        c.op = i % 3 == 2 ? LNORM_OP_RMSNORM : LNORM_OP_LAYERNORM;
        c.x_dtype = xs[i];
        c.param_dtype = LNORM_DTYPE_F32;
        c.gamma = c.beta = c.op == LNORM_OP_LAYERNORM;
        c.residual = i % 2;
        c.stats = 1;
        c.x_mean = 0.25 * i;
        c.x_spread = 1.5;
        c.hidden = hs[i];
        c.rows = hs[i] > 100000 ? 1 : 3 + i;
        c.pad = i % 4;
        ok = lnorm_test_case_make(&tc[i], &c, g) == LNORM_OK && lnorm_gpu_case_make(&gc[i], &tc[i], i % 3 == 1) == LNORM_OK;
    }
    lnorm_cuda_ws *ws = NULL;
    if (ok)
        ok = lnorm_cuda_ws_create(&ws, 4) == LNORM_OK; /* small: forces several uploads */
    const char *why = NULL;
    for (int i = 0; i < NS && ok; i++) {
        ok = lnorm_cuda_run_segment(&gc[i].seg, NULL, &why) == LNORM_OK && lnorm_gpu_case_fetch(&gc[i], &tc[i]) == LNORM_OK &&
             outs_take(&alone[i], &tc[i]) == 0;
        if (ok && lnorm_test_check_segment(&tc[i].seg, NULL, "batch: alone"))
            CHECK_FAIL("batch invariance: segment %d alone is wrong", i);
    }
    lnorm_segment segs[NS];
    for (int order = 0; order < 2 && ok; order++) {
        for (int i = 0; i < NS; i++) {
            lnorm_gpu_case_free(&gc[i]);
            lnorm_test_case_repoison(&tc[i]);
            if (lnorm_gpu_case_make(&gc[i], &tc[i], i % 3 == 1)) {
                ok = 0;
                break;
            }
            segs[order ? NS - 1 - i : i] = gc[i].seg;
        }
        if (!ok)
            break;
        lnorm_batch b = {segs, NS};
        printf("batch of %d segments: %d launches\n", NS, lnorm_cuda_launch_count(&b));
        const long al0 = lnorm_cuda_stat("aligned_launches");
        int err = lnorm_cuda_run(&b, NULL, ws, &why);
        if (err) {
            CHECK_FAIL("batch run: %s (%s)", lnorm_errname(err), why ? why : "");
            break;
        }
        if (lnorm_cuda_stat("aligned_launches") - al0 < 1) { /* segments 0 and 12 */
            CHECK_FAIL("batch run: no launch of the aligned fast form");
        }
        for (int i = 0; i < NS; i++) {
            if (lnorm_gpu_case_fetch(&gc[i], &tc[i])) {
                ok = 0;
                break;
            }
            if (!outs_same(&alone[i], &tc[i])) {
                CHECK_FAIL("batch invariance: segment %d (H=%lld) differs in batch order %d", i,
                           (long long)hs[i], order);
            }
        }
    }
    segs_end("batch invariance", ok, f0, ws, NS, tc, gc, alone);
}

/* Rows of different lengths in one bulk launch of the 1024-thread one-CTA
 * tier (tier 10: its stages hold the slice capacity and every pass reads
 * the row from shared memory) and of the 2-CTA cluster tier, through the
 * device table: bf16 and f32 segments shorter than and as long as the
 * tier's capacity, contiguous and padded. Each segment is checked against
 * the float64 reference alone (a launch of one segment), and must give the
 * same bits in the batch (two bulk launches, one a dtype). */
static void bulk_table(lnorm_rng *g)
{
    enum { NS = 6 };
    static const int64_t hs[NS] = {20000, 32768, 24576, 12000, 16384, 40000};
    static const int xs[NS] = {LNORM_DTYPE_BF16, LNORM_DTYPE_BF16, LNORM_DTYPE_BF16,
                               LNORM_DTYPE_F32,  LNORM_DTYPE_F32,  LNORM_DTYPE_F32};
    lnorm_test_case tc[NS];
    lnorm_gpu_case gc[NS];
    outs alone[NS];
    const int f0 = check_failures();
    int ok = 1;
    memset(tc, 0, sizeof tc);
    memset(gc, 0, sizeof gc);
    memset(alone, 0, sizeof alone);
    for (int i = 0; i < NS && ok; i++) {
        lnorm_test_case_cfg c = {0};
        c.op = LNORM_OP_LAYERNORM;
        c.x_dtype = xs[i];
        c.param_dtype = xs[i];
        c.gamma = c.beta = 1;
        c.stats = 1;
        c.x_mean = 0.5 + i;
        c.x_spread = 1.5;
        c.hidden = hs[i];
        c.rows = 3 + i;
        c.pad = i % 2 ? (int64_t)(32 / lnorm_dtype_size(xs[i])) : 0; /* aligned padded stride */
        ok = lnorm_test_case_make(&tc[i], &c, g) == LNORM_OK && lnorm_gpu_case_make(&gc[i], &tc[i], 0) == LNORM_OK;
    }
    lnorm_cuda_ws *ws = NULL;
    if (ok)
        ok = lnorm_cuda_ws_create(&ws, 8) == LNORM_OK;
    const char *why = NULL;
    char label[128];
    for (int i = 0; i < NS && ok; i++) {
        snprintf(label, sizeof label, "bulk table: alone, x=%s H=%lld", lnorm_dtype_name(xs[i]), (long long)hs[i]);
        ok = lnorm_cuda_run_segment(&gc[i].seg, NULL, &why) == LNORM_OK && lnorm_gpu_case_fetch(&gc[i], &tc[i]) == LNORM_OK &&
             outs_take(&alone[i], &tc[i]) == 0;
        if (ok && (lnorm_test_check_segment(&tc[i].seg, NULL, label) || lnorm_test_case_pad_writes(&tc[i])))
            CHECK_FAIL("%s: wrong", label);
    }
    lnorm_segment segs[NS];
    for (int i = 0; i < NS && ok; i++) {
        lnorm_gpu_case_free(&gc[i]);
        lnorm_test_case_repoison(&tc[i]);
        ok = lnorm_gpu_case_make(&gc[i], &tc[i], 0) == LNORM_OK;
        segs[i] = gc[i].seg;
    }
    if (ok) {
        lnorm_batch b = {segs, NS};
        const int nl = lnorm_cuda_launch_count(&b);
        const long nb = lnorm_cuda_stat("bulk_launches");
        int err = lnorm_cuda_run(&b, NULL, ws, &why);
        const long ran = lnorm_cuda_stat("bulk_launches") - nb;
        if (err) {
            CHECK_FAIL("bulk table: %s (%s)", lnorm_errname(err), why ? why : "");
        } else if (nl != 3 || ran != 3) {
            /* bf16 H <= 32768 (tier 10), f32 H <= 16384 (tier 10), f32 H = 40000 (a cluster tier) */
            CHECK_FAIL("bulk table: %d launches, %ld of them bulk; expected 3 bulk launches", nl, ran);
        }
        for (int i = 0; i < NS && !err; i++) {
            if (lnorm_gpu_case_fetch(&gc[i], &tc[i])) {
                ok = 0;
                break;
            }
            if (!outs_same(&alone[i], &tc[i]) || lnorm_test_case_pad_writes(&tc[i])) {
                CHECK_FAIL("bulk table: segment %d (x=%s H=%lld) differs in the batch", i,
                           lnorm_dtype_name(xs[i]), (long long)hs[i]);
            }
        }
    }
    segs_end("bulk table", ok, f0, ws, NS, tc, gc, alone);
}

/* The bulk-copy pipeline (k_bulk) in its steady state: enough rows that
 * every CTA wraps around its ring of stages several times (few CTAs per SM
 * and two stages forced through lnorm_cuda_set_tuning, then the launcher's
 * own choice), contiguous and padded (16-byte aligned) rows, every x dtype,
 * both ops, parameters of x's dtype and f32, one-CTA and cluster tiers
 * (clusters of 2 to 8 CTAs). Each result is checked against the float64
 * reference (outputs poisoned first) and must be bit-identical to the
 * k_fast / k_reg result (bulk off). The runs with a workspace take dynamic
 * tiles in the kernels that read rows from shared memory (tiers of 1024
 * threads a row): each must have run such a launch there (counter
 * "dynamic_launches"), and they run one after another on one workspace, so
 * a counter the kernel failed to put back would leave rows unwritten. The
 * runs with "fast_reread" 2 must take k_fast's re-read form in every
 * one-CTA tier of at least LNORM__RR_MIN_TPR threads a row (counter
 * "reread_launches"; these rows all qualify for the aligned form), those
 * with 0 nowhere. The runs marked ymis put every row of y one element off
 * 16-byte alignment with x aligned, so the bulk kernels still run and store
 * y element by element (in the cluster tiers of RMSNorm from 8 CTAs, instead
 * of the bulk copy of y). */
static void bulk_pipeline(lnorm_rng *g, int quick)
{
    static const int64_t hs[] = {64, 256, 1000, 2000, 4096, 12000, 20000, 40000, 100000};
    static const struct {
        const char *name;
        int bulk, stages, ctas, grid, aligned, dyn, reread, ymis; /* ymis: y rows misaligned, x aligned */
    } runs[] = {{"bulk off", 0, 0, 0, 0, 0, 0, 0, 0},
                {"bulk off, persistent fast grid", 0, 0, 0, 1, 0, 0, 0, 0},
                {"bulk off, one tile per CTA", 0, 0, 0, 2, 0, 0, 0, 0},
                {"bulk off, aligned fast form wherever rows allow", 0, 0, 0, 0, 2, 0, 0, 0},
                {"bulk off, aligned fast form, re-read form wherever it exists", 0, 0, 0, 0, 2, 0, 2, 0},
                {"bulk forced, 2 stages, 1 CTA/SM", 2, 2, 1, 0, 0, 0, 1, 0},
                {"bulk forced, 3 stages", 2, 3, 0, 0, 0, 0, 1, 0},
                {"bulk forced, launcher's choice", 2, 0, 0, 0, 0, 0, 1, 0},
                {"default policy (aligned fast form where it pays)", 1, 0, 0, 0, 1, 0, 1, 0},
                {"default policy, re-read form wherever rows allow", 1, 0, 0, 0, 2, 0, 2, 0},
                {"bulk forced, 2 stages, dynamic tiles", 2, 2, 0, 0, 0, 1, 1, 0},
                {"default policy, dynamic tiles", 1, 0, 0, 0, 1, 1, 1, 0},
                {"default policy, dynamic tiles again", 1, 0, 0, 0, 1, 1, 1, 0},
                {"bulk forced, y misaligned", 2, 0, 0, 0, 0, 0, 1, 1},
                {"default policy, y misaligned", 1, 0, 0, 0, 1, 0, 1, 1}};
    lnorm_cuda_ws *ws = NULL;
    if (lnorm_cuda_ws_create(&ws, 1) != LNORM_OK) {
        CHECK_FAIL("bulk pipeline: lnorm_cuda_ws_create");
        return;
    }
    int sms = 132;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int f0 = check_failures();
    long cases = 0, nruns = 0;
    for (size_t hi = 0; hi < sizeof hs / sizeof *hs; hi++)
        for (int xi = 0; xi < 3; xi++)
            for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++)
                for (int variant = 0; variant < 2; variant++) {
                    if (quick && (xi != 2 || variant))
                        continue;
                    lnorm_test_case_cfg c = {0};
                    c.op = op;
                    c.x_dtype = dts[xi];
                    c.param_dtype = variant ? dts[xi] : LNORM_DTYPE_F32;
                    c.gamma = 1;
                    c.beta = op == LNORM_OP_LAYERNORM;
                    c.stats = 1;
                    c.x_mean = 0.5 + variant;
                    c.x_spread = 1.5;
                    c.hidden = hs[hi];
                    c.pad = variant ? (int64_t)(32 / lnorm_dtype_size(dts[xi])) : 0; /* aligned stride */
                    /* Rows per tile of the tier (CTAs of LNORM__MIN_BLOCK
                     * threads below that many threads a row); about 5 tiles
                     * per CTA at 1 CTA/SM. */
                    const int64_t vec = 16 / (int64_t)lnorm_dtype_size(dts[xi]);
                    const int64_t chunks = (c.hidden + vec - 1) / vec;
                    int64_t tpr = 1;
                    while (tpr * 4 < chunks && tpr < 1024)
                        tpr *= 2;
                    const int64_t rpc = tpr >= LNORM__MIN_BLOCK ? 1 : LNORM__MIN_BLOCK / tpr;
                    c.rows = (int64_t)sms * rpc * (quick ? 3 : 5) + 3;
                    if (c.rows * c.hidden > ((int64_t)1 << 23))
                        c.rows = ((int64_t)1 << 23) / c.hidden + 1;
                    char label[200];
                    const char *tdesc = "?";
                    lnorm_cuda_tier(c.x_dtype, c.hidden, &tdesc);
                    int tdyn = 0, ttpr = 0;
                    const int tcl = tier_ctas(tdesc, op, &tdyn, &ttpr);
                    snprintf(label, sizeof label, "bulk op=%s x=%s p=%s H=%lld rows=%lld pad=%lld tier=%s",
                             op == LNORM_OP_LAYERNORM ? "ln" : "rms", lnorm_dtype_name(c.x_dtype),
                             lnorm_dtype_name(c.param_dtype), (long long)c.hidden, (long long)c.rows,
                             (long long)c.pad, tdesc);
                    lnorm_test_case tc;
                    if (lnorm_test_case_make(&tc, &c, g) != LNORM_OK) {
                        CHECK_FAIL("%s: out of memory", label);
                        continue;
                    }
                    cases++;
                    outs first;
                    int have_first = 0;
                    for (size_t ri = 0; ri < sizeof runs / sizeof *runs; ri++) {
                        /* Runs that would repeat another one: dynamic tiles
                         * where the kernel has none (LNORM__DYN), k_fast's
                         * grid and form in the cluster tiers (no k_fast
                         * there). */
                        if ((runs[ri].dyn && !tdyn) ||
                            (tcl > 1 && (runs[ri].grid || runs[ri].aligned == 2)))
                            continue;
                        /* Tiers with the re-read form: one CTA a row, enough threads. */
                        const int trr = tcl == 1 && ttpr >= LNORM__RR_MIN_TPR;
                        if (lnorm_cuda_set_tuning("bulk", runs[ri].bulk) || lnorm_cuda_set_tuning("bulk_stages", runs[ri].stages) ||
                            lnorm_cuda_set_tuning("bulk_ctas", runs[ri].ctas) ||
                            lnorm_cuda_set_tuning("fast_grid", runs[ri].grid) ||
                            lnorm_cuda_set_tuning("fast_aligned", runs[ri].aligned) ||
                            lnorm_cuda_set_tuning("fast_reread", runs[ri].reread)) {
                            CHECK_FAIL("%s: lnorm_cuda_set_tuning refused", label);
                            break;
                        }
                        nruns++;
                        const char *why = NULL;
                        const long nb = lnorm_cuda_stat("bulk_launches");
                        const long nd = lnorm_cuda_stat("dynamic_launches");
                        const long nrr = lnorm_cuda_stat("reread_launches");
                        int err = gpu_run_ws(&tc, runs[ri].ymis ? 2 : 0, runs[ri].dyn ? ws : NULL, &why);
                        if (err) {
                            CHECK_FAIL("%s (%s): %s (%s)", label, runs[ri].name, lnorm_errname(err),
                                       why ? why : "");
                            break;
                        }
                        const long ran = lnorm_cuda_stat("bulk_launches") - nb;
                        const long want = runs[ri].bulk == 2 ? 1 : 0; /* the policy's choice is not checked */
                        const long rran = lnorm_cuda_stat("reread_launches") - nrr;
                        if (runs[ri].reread != 1 && rran != (runs[ri].reread == 2 && trr ? 1 : 0)) {
                            CHECK_FAIL("%s (%s): %ld launches of the re-read form, expected %d", label,
                                       runs[ri].name, rran, runs[ri].reread == 2 && trr ? 1 : 0);
                        }
                        if (runs[ri].bulk != 1 && ran != want) {
                            CHECK_FAIL("%s (%s): %ld bulk launches, expected %ld", label, runs[ri].name,
                                       ran, want);
                        }
                        /* Tiers of 1024 threads a row (10 and up, not the
                         * streaming one) run the bulk kernel under every
                         * policy, with dynamic tiles given a workspace
                         * where LNORM__DYN says (the other runs with one
                         * were skipped above). */
                        const long dyn = lnorm_cuda_stat("dynamic_launches") - nd;
                        /* (Where the re-read form is chosen, tier 10 runs
                         * k_fast instead, unless bulk is forced.) */
                        const int rr_sel = runs[ri].reread == 2 ||
                                           (runs[ri].reread == 1 &&
                                            lnorm__rr_use(op == LNORM_OP_RMSNORM, ttpr));
                        const long want_dyn = runs[ri].dyn && runs[ri].bulk &&
                                              !(runs[ri].bulk != 2 && trr && runs[ri].aligned && rr_sel);
                        if (dyn != want_dyn) {
                            CHECK_FAIL("%s (%s): %ld launches with dynamic tiles, expected %ld", label,
                                       runs[ri].name, dyn, want_dyn);
                        }
                        if (lnorm_test_check_segment(&tc.seg, NULL, label) || lnorm_test_case_pad_writes(&tc)) {
                            CHECK_FAIL("%s (%s): wrong against the float64 reference", label, runs[ri].name);
                        }
                        if (!have_first) {
                            have_first = outs_take(&first, &tc) == 0;
                        } else if (!outs_same(&first, &tc)) {
                            CHECK_FAIL("%s: %s differs from %s", label, runs[ri].name, runs[0].name);
                        }
                    }
                    if (have_first)
                        outs_free(&first);
                    lnorm_test_case_free(&tc);
                }
    lnorm_cuda_set_tuning("bulk", 1);
    lnorm_cuda_set_tuning("bulk_stages", 0);
    lnorm_cuda_set_tuning("bulk_ctas", 0);
    lnorm_cuda_set_tuning("fast_grid", 0);
    lnorm_cuda_set_tuning("fast_aligned", 1);
    lnorm_cuda_set_tuning("fast_reread", 1);
    lnorm_cuda_ws_destroy(ws);
    g_cases += cases;
    printf("bulk pipeline: %ld shapes, %ld runs: %s\n", cases, nruns, check_failures() > f0 ? "FAIL" : "ok");
}

/* Dynamic tiles over many fills: RMSNorm in clusters of 2 (f32 H = 20000,
 * bf16 H = 40000) and 4 (f32 H = 40000) with about 20 rows a cluster, so
 * the 16 mail slots of every peer wrap into their second phase (bulk_pipeline
 * has at most 6 rows a cluster). Each against the float64 reference (outputs
 * poisoned first) and bit for bit against the same kernel taking fixed
 * shares (no workspace); the dynamic run must have been one. */
static void dyn_wrap(lnorm_rng *g)
{
    static const struct {
        int x;
        int64_t h;
        int cl;
    } cs[] = {{LNORM_DTYPE_F32, 20000, 2}, {LNORM_DTYPE_F32, 40000, 4}, {LNORM_DTYPE_BF16, 40000, 2}};
    int sms = 132;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    lnorm_cuda_ws *ws = NULL;
    const int f0 = check_failures();
    if (lnorm_cuda_ws_create(&ws, 1) != LNORM_OK) {
        CHECK_FAIL("dynamic tiles: lnorm_cuda_ws_create");
        return;
    }
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        lnorm_test_case_cfg c = {0};
        c.op = LNORM_OP_RMSNORM;
        c.x_dtype = cs[i].x;
        c.param_dtype = cs[i].x;
        c.gamma = 1;
        c.stats = 1;
        c.x_mean = 0.25;
        c.x_spread = 1.5;
        c.hidden = cs[i].h;
        c.rows = (int64_t)(sms / cs[i].cl) * 20 + 5;
        const char *tdesc = "?";
        lnorm_cuda_tier(c.x_dtype, c.hidden, &tdesc);
        char label[160];
        snprintf(label, sizeof label, "dynamic tiles: rms x=%s H=%lld rows=%lld tier=%s", lnorm_dtype_name(c.x_dtype),
                 (long long)c.hidden, (long long)c.rows, tdesc);
        int tdyn = 0;
        if (tier_ctas(tdesc, c.op, &tdyn, NULL) != cs[i].cl || !tdyn) {
            CHECK_FAIL("%s: not a cluster of %d with dynamic tiles", label, cs[i].cl);
            continue;
        }
        lnorm_test_case tc;
        if (lnorm_test_case_make(&tc, &c, g) != LNORM_OK) {
            CHECK_FAIL("%s: out of memory", label);
            continue;
        }
        g_cases++;
        const char *why = NULL;
        const long nd = lnorm_cuda_stat("dynamic_launches");
        int err = gpu_run_ws(&tc, 0, ws, &why);
        outs dyn;
        if (err) {
            CHECK_FAIL("%s: %s (%s)", label, lnorm_errname(err), why ? why : "");
        } else if (lnorm_cuda_stat("dynamic_launches") - nd != 1) {
            CHECK_FAIL("%s: the run took no dynamic tiles", label);
        } else if (lnorm_test_check_segment(&tc.seg, NULL, label) || lnorm_test_case_pad_writes(&tc)) {
            CHECK_FAIL("%s: wrong against the float64 reference", label);
        } else if (outs_take(&dyn, &tc) == 0) {
            err = gpu_run(&tc, 0, &why);
            if (err || !outs_same(&dyn, &tc)) {
                CHECK_FAIL("%s: the fixed-share run differs (%s)", label, err ? lnorm_errname(err) : "bits");
            }
            outs_free(&dyn);
        } else {
            CHECK_FAIL("%s: out of memory", label);
        }
        lnorm_test_case_free(&tc);
    }
    lnorm_cuda_ws_destroy(ws);
    printf("dynamic tiles, many fills a cluster: %s\n", check_failures() > f0 ? "FAIL" : "ok");
}

/* Rows at the edges of fp32 (kernels/core/rescale.h) in every tier: kind
 * 0: one element of 1e30; 1: one element of 3e19; 2: a row of N(0, 1e19);
 * 3: a row of N(0, 1e-22) with eps = 1e-45. Every other row is such a row,
 * the rows between ordinary, so that rows that reduce together (a warp, a
 * CTA) need the rescue or not. Each case against float64 (outputs
 * poisoned) and the CPU backend, then bit-identical through every kernel
 * of its tier: the general kernel (a zero residual), k_fast's aligned and
 * re-read forms, the bulk kernels (forced, and with dynamic tiles). */
static void edges(lnorm_rng *g, int quick)
{
    static const int64_t hs[] = {30, 100, 200, 300, 1000, 1500, 3000, 4096, 8000, 12000, 20000, 40000, 100000, 131072, 300000, 1048577};
    static const struct {
        const char *name;
        int res, bulk, aligned, reread, dyn;
    } runs[] = {{"default", 0, 1, 1, 1, 0},          {"general kernel (zero residual)", 1, 1, 1, 1, 0},
                {"bulk off", 0, 0, 0, 0, 0},         {"aligned form, re-read form", 0, 0, 2, 2, 0},
                {"bulk forced", 0, 2, 1, 1, 0},      {"bulk forced, dynamic tiles", 0, 2, 1, 1, 1}};
    lnorm_cuda_ws *ws = NULL;
    if (lnorm_cuda_ws_create(&ws, 1) != LNORM_OK) {
        CHECK_FAIL("edges: lnorm_cuda_ws_create");
        return;
    }
    const int f0 = check_failures();
    long cases = 0, nruns = 0;
    for (int kind = 0; kind < 4; kind++)
        for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++)
            for (int xi = 0; xi < 2; xi++)
                for (size_t hi = 0; hi < sizeof hs / sizeof *hs; hi++) {
                    if (quick && (hi + (size_t)kind) % 3)
                        continue;
                    const int xdt = xi ? LNORM_DTYPE_BF16 : LNORM_DTYPE_F32;
                    lnorm_test_case_cfg c = {.op = op, .x_dtype = xdt, .param_dtype = xdt, .rows = 6,
                                             .hidden = hs[hi], .gamma = 1, .beta = op == LNORM_OP_LAYERNORM,
                                             .residual = 1, .stats = 1, .eps = kind == 3 ? 1e-45f : 0.0f};
                    if (c.hidden > 100000)
                        c.rows = 3;
                    const char *tdesc = "?";
                    lnorm_cuda_tier(xdt, c.hidden, &tdesc);
                    char label[200];
                    snprintf(label, sizeof label, "edges kind=%d op=%s x=%s H=%lld tier=%s", kind,
                             op == LNORM_OP_LAYERNORM ? "ln" : "rms", lnorm_dtype_name(xdt), (long long)c.hidden,
                             tdesc);
                    lnorm_test_case tc;
                    if (lnorm_test_case_make(&tc, &c, g) != LNORM_OK) {
                        CHECK_FAIL("%s: out of memory", label);
                        continue;
                    }
                    cases++;
                    memset(tc.residual, 0, tc.res_bytes); /* h = x + 0 = x */
                    for (int64_t r = 0; r < c.rows; r += 2) {
                        size_t row = (size_t)(r * tc.seg.x_stride);
                        if (kind <= 1) {
                            int64_t col = 1 + (r * 37 + 5) % (c.hidden - 1); /* never x[0] (lnorm_core.h) */
                            lnorm_test_set(tc.x, xdt, row + (size_t)col, (r & 2 ? -1.0 : 1.0) * (kind ? 3e19 : 1e30));
                        } else {
                            for (int64_t k = 0; k < c.hidden; k++)
                                lnorm_test_set(tc.x, xdt, row + (size_t)k,
                                               (kind == 2 ? 1e19 : 1e-22) * lnorm_rng_normal(g));
                        }
                    }
                    outs first;
                    int have_first = 0;
                    for (size_t ri = 0; ri < sizeof runs / sizeof *runs; ri++) {
                        if (lnorm_cuda_set_tuning("bulk", runs[ri].bulk) ||
                            lnorm_cuda_set_tuning("fast_aligned", runs[ri].aligned) ||
                            lnorm_cuda_set_tuning("fast_reread", runs[ri].reread)) {
                            CHECK_FAIL("%s: lnorm_cuda_set_tuning refused", label);
                            break;
                        }
                        lnorm_test_case t2 = tc;
                        if (!runs[ri].res) {
                            t2.seg.residual = NULL;
                            t2.seg.residual_out = NULL;
                            t2.residual = NULL;
                            t2.residual_out = NULL;
                        }
                        const char *why = NULL;
                        int err = gpu_run_ws(&t2, 0, runs[ri].dyn ? ws : NULL, &why);
                        nruns++;
                        if (err) {
                            CHECK_FAIL("%s (%s): %s (%s)", label, runs[ri].name, lnorm_errname(err), why ? why : "");
                            break;
                        }
                        if (lnorm_test_check_segment(&t2.seg, NULL, label))
                            CHECK_FAIL("%s (%s): wrong against the float64 reference", label, runs[ri].name);
                        if (!have_first) {
                            have_first = outs_take(&first, &t2) == 0;
                            /* The CPU backend on the same inputs. */
                            lnorm_test_case_repoison(&t2);
                            if (have_first && lnorm_cpu_run_segment(g_cpu, &t2.seg, &why) == LNORM_OK) {
                                lnorm_segment gs = t2.seg;
                                gs.y = first.y;
                                gs.residual_out = first.ro;
                                gs.mean = first.mean;
                                gs.rstd = first.rstd;
                                if (lnorm_test_cmp_outputs(&gs, &t2.seg, label))
                                    CHECK_FAIL("%s: GPU and CPU disagree", label);
                            }
                        } else {
                            lnorm_test_case y_only = t2; /* (the first run wrote no residual_out) */
                            y_only.residual_out = NULL;
                            if (!outs_same(&first, &y_only))
                                CHECK_FAIL("%s: %s differs from %s", label, runs[ri].name, runs[0].name);
                        }
                    }
                    if (have_first)
                        outs_free(&first);
                    lnorm_test_case_free(&tc);
                }
    lnorm_cuda_set_tuning("bulk", 1);
    lnorm_cuda_set_tuning("fast_aligned", 1);
    lnorm_cuda_set_tuning("fast_reread", 1);
    lnorm_cuda_ws_destroy(ws);
    g_cases += cases;
    printf("edges of fp32: %ld cases, %ld runs: %s\n", cases, nruns, check_failures() > f0 ? "FAIL" : "ok");
}

/* Rows the fast kernels leave to the general kernel's rescue (the rescue
 * list, lnorm__rescue; its drain, k_reg's list form): every third row a
 * row of N(0, 1e19) (whose sums overflow), the others ordinary. At H = 30,
 * 4096 and 8000 and in the cluster tiers the list holds them (100 rows, or
 * 8, with the rows of their warps at H = 30); at H = 200 and 1000, 3300
 * rows put more than the list's LNORM__RESCUE_CAP = 1024 on it, and the
 * drain takes every row. Grids capped at 1 and 2 CTAs (clusters)
 * ("fwd_grid"), in every form (aligned, re-read, bulk forced, dynamic
 * tiles), with and without a workspace, each against float64 and
 * bit-identical to the general kernel; then in place (y = x), which the
 * host gives to the general kernel (the drain reads x again): the same
 * bits again. */
_Static_assert(3300 / 3 > LNORM__RESCUE_CAP, "the long lists must pass the rescue list's capacity");
static void deferred_lists(lnorm_rng *g, int quick, int verbose)
{
    static const int64_t hs[] = {30, 200, 1000, 4096, 8000, 20000, 40000, 131072};
    static const struct {
        const char *name;
        int res, grid, bulk, aligned, reread, dyn;
    } runs[] = {{"general kernel (zero residual)", 1, 0, 1, 1, 1, 0},
                {"default", 0, 0, 1, 1, 1, 0},
                {"grid 1", 0, 1, 1, 1, 1, 0},
                {"grid 2, aligned form", 0, 2, 0, 2, 0, 0},
                {"grid 1, re-read form", 0, 1, 0, 2, 2, 0},
                {"grid 1, bulk forced", 0, 1, 2, 1, 1, 0},
                {"grid 2, bulk forced, dynamic tiles", 0, 2, 2, 1, 1, 1}};
    lnorm_cuda_ws *ws = NULL;
    if (lnorm_cuda_ws_create(&ws, 1) != LNORM_OK) {
        CHECK_FAIL("deferred: lnorm_cuda_ws_create");
        return;
    }
    const int f0 = check_failures();
    long cases = 0;
    for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++)
        for (int xi = 0; xi < 2; xi++)
            for (size_t hi = 0; hi < sizeof hs / sizeof *hs; hi++) {
                if (quick && (hi + (size_t)op + (size_t)xi) % 3)
                    continue;
                const int xdt = xi ? LNORM_DTYPE_BF16 : LNORM_DTYPE_F32;
                lnorm_test_case_cfg c = {.op = op, .x_dtype = xdt, .param_dtype = xdt,
                                         .rows = hs[hi] == 200 || hs[hi] == 1000 ? 3300 : hs[hi] <= 8000 ? 300 : 24,
                                         .hidden = hs[hi], .gamma = 1,
                                         .beta = op == LNORM_OP_LAYERNORM, .residual = 1, .stats = 1};
                const char *tdesc = "?";
                lnorm_cuda_tier(xdt, c.hidden, &tdesc);
                char label[200];
                snprintf(label, sizeof label, "deferred op=%s x=%s H=%lld tier=%s",
                         op == LNORM_OP_LAYERNORM ? "ln" : "rms", lnorm_dtype_name(xdt), (long long)c.hidden, tdesc);
                lnorm_test_case tc;
                if (lnorm_test_case_make(&tc, &c, g) != LNORM_OK) {
                    CHECK_FAIL("%s: out of memory", label);
                    continue;
                }
                cases++;
                memset(tc.residual, 0, tc.res_bytes);
                for (int64_t r = 0; r < c.rows; r += 3)
                    for (int64_t k = 0; k < c.hidden; k++)
                        lnorm_test_set(tc.x, xdt, (size_t)(r * tc.seg.x_stride + k), 1e19 * lnorm_rng_normal(g));
                outs first;
                int have_first = 0;
                for (size_t ri = 0; ri < sizeof runs / sizeof *runs; ri++) {
                    if (lnorm_cuda_set_tuning("bulk", runs[ri].bulk) ||
                        lnorm_cuda_set_tuning("fast_aligned", runs[ri].aligned) ||
                        lnorm_cuda_set_tuning("fast_reread", runs[ri].reread) ||
                        lnorm_cuda_set_tuning("fwd_grid", runs[ri].grid)) {
                        CHECK_FAIL("%s: lnorm_cuda_set_tuning refused", label);
                        break;
                    }
                    if (verbose)
                        printf("%s (%s)\n", label, runs[ri].name);
                    lnorm_test_case t2 = tc;
                    if (!runs[ri].res) {
                        t2.seg.residual = NULL;
                        t2.seg.residual_out = NULL;
                        t2.residual = NULL;
                        t2.residual_out = NULL;
                    }
                        const char *why = NULL;
                    int err = gpu_run_ws(&t2, 0, runs[ri].dyn ? ws : NULL, &why);
                    if (err) {
                        CHECK_FAIL("%s (%s): %s (%s)", label, runs[ri].name, lnorm_errname(err), why ? why : "");
                        break;
                    }
                    if (lnorm_test_check_segment(&t2.seg, NULL, label))
                        CHECK_FAIL("%s (%s): wrong against the float64 reference", label, runs[ri].name);
                    lnorm_test_case y_only = t2;
                    y_only.residual_out = NULL;
                    if (!have_first)
                        have_first = outs_take(&first, &y_only) == 0;
                    else if (!outs_same(&first, &y_only))
                        CHECK_FAIL("%s: %s differs from %s", label, runs[ri].name, runs[0].name);
                }
                lnorm_cuda_set_tuning("defaults", 0);
                /* In place: y = x on the device. */
                if (have_first) {
                    lnorm_test_case t2 = tc;
                    t2.seg.residual = t2.seg.residual_out = NULL;
                    t2.residual = t2.residual_out = NULL;
                    lnorm_test_case_repoison(&t2);
                    lnorm_gpu_case gc;
                    const char *why = NULL;
                    int err = lnorm_gpu_case_make(&gc, &t2, 0);
                    if (err == LNORM_OK) {
                        gc.seg.y = (void *)gc.seg.x;
                        gc.seg.y_stride = gc.seg.x_stride;
                        err = lnorm_cuda_run_segment(&gc.seg, NULL, &why);
                        if (err == LNORM_OK && (lnorm_gpu_case_fetch(&gc, &t2) != LNORM_OK ||
                                                cudaMemcpy(t2.y, gc.seg.x, t2.y_bytes, cudaMemcpyDeviceToHost) !=
                                                    cudaSuccess))
                            err = LNORM_ECUDA;
                        lnorm_gpu_case_free(&gc);
                    }
                    if (err)
                        CHECK_FAIL("%s (in place): %s (%s)", label, lnorm_errname(err), why ? why : "");
                    else if (!outs_same(&first, &t2))
                        CHECK_FAIL("%s: in place differs from %s", label, runs[0].name);
                }
                if (have_first)
                    outs_free(&first);
                lnorm_test_case_free(&tc);
            }
    lnorm_cuda_set_tuning("defaults", 0);
    lnorm_cuda_ws_destroy(ws);
    g_cases += cases;
    printf("deferred rows, long lists: %ld cases: %s\n", cases, check_failures() > f0 ? "FAIL" : "ok");
}

/* Bad input gets LNORM_EINVAL and runs nothing. */
static void bad_input(void)
{
    void *d = NULL;
    if (cudaMalloc(&d, 4096) != cudaSuccess) {
        CHECK_FAIL("bad input: cudaMalloc");
        return;
    }
    lnorm_segment s;
    const char *why = NULL;
    const int f0 = check_failures();
#define REJECTED(setup)                                                                       \
    do {                                                                                      \
        lnorm_segment_init(&s, LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, 4, 64);                   \
        s.x = d;                                                                              \
        s.y = (char *)d + 1024;                                                               \
        setup;                                                                                \
        why = NULL;                                                                           \
        int e_ = lnorm_cuda_run_segment(&s, NULL, &why);                                      \
        if (e_ != LNORM_EINVAL || !why) {                                                     \
            CHECK_FAIL("bad input (%s): got %s", #setup, lnorm_errname(e_));                  \
        }                                                                                     \
    } while (0)
    REJECTED(s.eps = 0.0f);
    REJECTED(s.eps = -1.0f);
    REJECTED(s.eps = NAN);
    REJECTED(s.hidden = 0);
    REJECTED(s.rows = 0);
    REJECTED(s.x = NULL);
    REJECTED(s.y = NULL);
    REJECTED(s.x_stride = 10);
    REJECTED(s.op = 7);
    REJECTED(s.x_dtype = 9);
    REJECTED(s.param_dtype = LNORM_DTYPE_BF16);
    REJECTED((s.op = LNORM_OP_RMSNORM, s.mean = (float *)d));
    REJECTED(s.residual = d);
    REJECTED(s.hidden = (int64_t)LNORM_CORE_MAX_HIDDEN + 1);
#undef REJECTED
    /* Two segments without a workspace. */
    lnorm_segment two[2];
    lnorm_segment_init(&two[0], LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, 1, 16);
    two[0].x = d;
    two[0].y = (char *)d + 1024;
    two[1] = two[0];
    lnorm_batch b = {two, 2};
    if (lnorm_cuda_run(&b, NULL, NULL, &why) != LNORM_EINVAL) {
        CHECK_FAIL("bad input: two segments without a workspace accepted");
    }
    two[1].eps = -1.0f;
    lnorm_cuda_ws *ws = NULL;
    if (lnorm_cuda_ws_create(&ws, 8) == LNORM_OK) {
        if (lnorm_cuda_run(&b, NULL, ws, &why) != LNORM_EINVAL) {
            CHECK_FAIL("bad input: a batch with one bad segment accepted");
        }
        lnorm_cuda_ws_destroy(ws);
    } else {
        CHECK_FAIL("bad input: lnorm_cuda_ws_create");
    }
    if (cudaDeviceSynchronize() != cudaSuccess) {
        CHECK_FAIL("bad input: device error after rejected inputs");
    }
    cudaFree(d);
    g_cases++;
    printf("bad input: %s\n", check_failures() > f0 ? "FAIL" : "ok");
}

/* The end of a run of one part alone: its count and exit status. */
static int finish_part(const char *what)
{
    lnorm_cpu_destroy(g_cpu);
    printf("%ld cases\n", g_cases);
    return check_finish(what);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress in a log even when a sanitizer's time limit stops it */
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    if (argc > 2 || (argc > 1 && !quick && strcmp(argv[1], "--edges") && strcmp(argv[1], "--dyn") &&
                     strcmp(argv[1], "--defer"))) {
        fprintf(stderr, "usage: test_gpu [--quick | --dyn | --edges | --defer]\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        CHECK_FAIL("no usable GPU (this test needs one; it never passes by skipping)");
        return check_finish("test_gpu");
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    if (lnorm_cpu_create(&g_cpu, 0) != LNORM_OK) {
        CHECK_FAIL("lnorm_cpu_create");
        return check_finish("test_gpu");
    }
    lnorm_rng g;
    lnorm_rng_seed(&g, 0x6e7d5eedu);
    if (argc > 1 && !strcmp(argv[1], "--edges")) { /* this part alone */
        edges(&g, 0);
        deferred_lists(&g, 0, 0);
        return finish_part("test_gpu --edges");
    }
    if (argc > 1 && !strcmp(argv[1], "--defer")) { /* this part alone, reduced */
        deferred_lists(&g, 1, 1);
        return finish_part("test_gpu --defer");
    }
    if (argc > 1 && !strcmp(argv[1], "--dyn")) { /* this part alone */
        dyn_wrap(&g);
        return finish_part("test_gpu --dyn");
    }
    bad_input();
    batch_invariance(&g);
    fast_vs_general(&g, quick);
    bulk_pipeline(&g, quick);
    bulk_table(&g);
    edges(&g, quick);
    deferred_lists(&g, quick, 0);
    if (!quick)
        dyn_wrap(&g);
    sweep(&g, quick);
    lnorm_cpu_destroy(g_cpu);
    printf("%ld cases (%ld also against the CPU backend, %ld also misaligned)\n", g_cases, g_cmp_cpu, g_cmp_align);
    return check_finish("test_gpu");
}
