/*
 * lnorm_normalize_backward against a real lnormd (CPU backend):
 *
 *   backward_test LNORMD_PATH results|chunked|mixed|errors
 *
 * results: random requests (op, dtypes, gamma inline or by params id, dres,
 *   stats given or recomputed, eps placement, outputs asked for) against the
 *   float64 reference of tests/common/testbwd.h, outputs poisoned first; a
 *   one-message request gives the same bits as the CPU core run here.
 * chunked: requests split into many chunks: dx exact per chunk, dgamma and
 *   dbeta summed by the client within the reference's bounds, and the same
 *   bits on every repeat.
 * mixed: threads sending forward and backward requests at once, sync and
 *   async, on a daemon that batches them together: every result checked,
 *   and backward requests seen sharing batches.
 * errors: each bad field refused with its error (by liblnorm or lnormd).
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "lnorm/lnorm.h"
#include "testbwd.h"
#include "testcase.h"
#include "testdaemon.h"
#include "testutil.h"

static td_daemon daemon_;

static lnorm_client *open_client(void)
{
    lnorm_client *c = NULL;
    const char *url = daemon_.ipc_url;
    int rv = lnorm_client_open(&c, &url, 1, NULL);
    CHECK(rv == LNORM_OK, "open %s: %s", url, lnorm_strerror(rv));
    return c;
}

/* A request describing a case's buffers (outputs as the case has them). */
static void req_from(lnorm_normalize_backward_req *q, const lnorm_test_bwd_case *tc)
{
    const lnorm_bwd_segment *s = &tc->seg;
    lnorm_normalize_backward_req_init(q, (lnorm_op)s->op, (lnorm_dtype)s->x_dtype, (uint64_t)s->rows,
                                      (uint64_t)s->hidden);
    q->dy_dtype = (lnorm_dtype)s->dy_dtype;
    q->dx_dtype = (lnorm_dtype)s->dx_dtype;
    q->param_dtype = (lnorm_dtype)s->param_dtype;
    q->eps = s->eps;
    q->eps_mode = (lnorm_eps_mode)s->eps_mode;
    q->x = s->x;
    q->dy = s->dy;
    q->dres = s->dres;
    q->gamma = s->gamma;
    q->mean = s->mean;
    q->rstd = s->rstd;
    q->dx = s->dx;
    q->dgamma = s->dgamma;
    q->dbeta = s->dbeta;
}

static void random_cfg(lnorm_rng *g, lnorm_test_bwd_cfg *c)
{
    static const int64_t hs[] = {1, 7, 64, 333, 1024, 4096};
    memset(c, 0, sizeof *c);
    c->op = lnorm_rng_next(g) % 2 ? LNORM_OP_LAYERNORM : LNORM_OP_RMSNORM;
    c->x_dtype = 1 + (int)(lnorm_rng_next(g) % 3);
    c->dy_dtype = (int)(lnorm_rng_next(g) % 4); /* 0: x's */
    c->dx_dtype = (int)(lnorm_rng_next(g) % 4);
    c->param_dtype = lnorm_rng_next(g) % 2 ? LNORM_DTYPE_F32 : 0;
    c->eps_mode = (int)(lnorm_rng_next(g) % 2);
    c->eps = lnorm_rng_next(g) % 3 == 0 ? 1e-2f : 0.0f;
    c->rows = 1 + (int64_t)(lnorm_rng_next(g) % 40);
    c->hidden = hs[lnorm_rng_next(g) % 6];
    c->gamma = (int)(lnorm_rng_next(g) % 2);
    c->dres = lnorm_rng_next(g) % 3 == 0;
    c->stats = (int)(lnorm_rng_next(g) % 2);
    c->dgamma = (int)(lnorm_rng_next(g) % 2);
    c->dbeta = (int)(lnorm_rng_next(g) % 2);
    c->x_mean = (lnorm_rng_uniform(g) - 0.5) * 4;
    c->x_spread = 0.5 + lnorm_rng_uniform(g) * 2;
}

/* Send one case (gamma by params id when pid), check it against the
 * reference; returns the mismatches. */
static long run_case(lnorm_client *c, lnorm_test_bwd_case *tc, const char *pid, size_t chunk, const char *label,
                     lnorm_result *res)
{
    lnorm_normalize_backward_req q;
    req_from(&q, tc);
    if (pid) {
        q.gamma = NULL;
        q.params_id = pid;
    }
    q.chunk_bytes = chunk;
    lnorm_result r0;
    if (!res)
        res = &r0;
    int rv = lnorm_normalize_backward(c, &q, res);
    CHECK(rv == LNORM_OK, "%s: %s (%s)", label, lnorm_strerror(rv), res->message);
    if (rv)
        return 1;
    long bad = lnorm_test_bwd_check(&tc->seg, 0, label);
    CHECK(bad == 0, "%s: %ld mismatches (%s op %d, H %lld, rows %lld, %u chunks)", label, bad,
          lnorm_dtype_name(tc->seg.x_dtype), tc->seg.op, (long long)tc->seg.hidden, (long long)tc->seg.rows,
          res->chunks);
    return bad;
}

static int test_results(lnorm_rng *g)
{
    lnorm_client *c = open_client();
    if (!c)
        return 1;
    lnorm_cpu *cpu = NULL;
    CHECK(lnorm_cpu_create(&cpu, 1) == LNORM_OK, "cpu");
    long same = 0, compared = 0;
    for (int k = 0; k < 60; k++) {
        lnorm_test_bwd_cfg cfg;
        random_cfg(g, &cfg);
        if (!cfg.dgamma && !cfg.dbeta && k % 5 == 0)
            cfg.dgamma = 1;
        lnorm_test_bwd_case tc;
        if (lnorm_test_bwd_make(&tc, &cfg, g, NULL)) {
            CHECK_FAIL("make");
            break;
        }
        /* Every few cases gamma by a registered id. */
        char pid[32] = "";
        if (tc.gamma && k % 4 == 1) {
            snprintf(pid, sizeof pid, "bwd-%d", k);
            lnorm_params_desc p = {pid, (lnorm_dtype)tc.seg.param_dtype, (uint64_t)tc.seg.hidden, tc.gamma, NULL};
            CHECK(lnorm_register_params(c, &p, NULL) == LNORM_OK, "register %s", pid);
        }
        run_case(c, &tc, pid[0] ? pid : NULL, 0, "results", NULL);
        /* The same request on the core here: one message, the same bits. */
        size_t dxb = tc.dx_bytes, H = (size_t)tc.seg.hidden;
        void *dx = malloc(dxb);
        float *dg = malloc(H * 4), *db = malloc(H * 4);
        if (dx && dg && db) {
            memcpy(dx, tc.dx, dxb);
            if (tc.dgamma)
                memcpy(dg, tc.dgamma, H * 4);
            if (tc.dbeta)
                memcpy(db, tc.dbeta, H * 4);
            lnorm_test_bwd_repoison(&tc);
            lnorm_bwd_batch b = {&tc.seg, 1};
            CHECK(lnorm_cpu_run_bwd(cpu, &b, NULL) == LNORM_OK, "core run");
            int eq = !memcmp(dx, tc.dx, dxb) && (!tc.dgamma || !memcmp(dg, tc.dgamma, H * 4)) &&
                     (!tc.dbeta || !memcmp(db, tc.dbeta, H * 4));
            same += eq;
            compared++;
        }
        free(dx), free(dg), free(db);
        /* dx not asked for: only dgamma / dbeta come back. */
        if (tc.dgamma || tc.dbeta) {
            lnorm_test_bwd_repoison(&tc);
            lnorm_normalize_backward_req q;
            req_from(&q, &tc);
            q.dx = NULL;
            lnorm_result r;
            CHECK(lnorm_normalize_backward(c, &q, &r) == LNORM_OK, "no dx: %s", r.message);
            uint32_t u = 0;
            memcpy(&u, tc.dx, tc.seg.dx_dtype == LNORM_DTYPE_F32 ? 4 : 2);
            CHECK(u == 0xFFFFFFFFu || u == 0xFFFFu, "dx written although not asked for");
            lnorm_bwd_segment s = tc.seg;
            /* Check dgamma/dbeta with dx taken from the core (just checked). */
            lnorm_bwd_batch b = {&s, 1};
            float *g2 = malloc(H * 4), *b2 = malloc(H * 4);
            if (g2 && b2) {
                if (tc.dgamma)
                    memcpy(g2, tc.dgamma, H * 4);
                if (tc.dbeta)
                    memcpy(b2, tc.dbeta, H * 4);
                CHECK(lnorm_cpu_run_bwd(cpu, &b, NULL) == LNORM_OK, "core run");
                CHECK((!tc.dgamma || !memcmp(g2, tc.dgamma, H * 4)) && (!tc.dbeta || !memcmp(b2, tc.dbeta, H * 4)),
                      "skip_dx: dgamma/dbeta differ from the core's");
            }
            free(g2), free(b2);
        }
        if (pid[0])
            CHECK(lnorm_drop_params(c, pid, NULL) == LNORM_OK, "drop %s", pid);
        lnorm_test_bwd_free(&tc);
    }
    CHECK(same == compared && compared > 0, "%ld of %ld one-message requests have the core's bits", same, compared);
    printf("  %ld requests, worst error / bound %.3f\n", compared, lnorm_test_bwd_worst());
    lnorm_cpu_destroy(cpu);
    lnorm_client_close(c);
    return 0;
}

static int test_chunked(lnorm_rng *g)
{
    lnorm_client *c = open_client();
    if (!c)
        return 1;
    for (int k = 0; k < 6; k++) {
        lnorm_test_bwd_cfg cfg = {.op = k % 2 ? LNORM_OP_RMSNORM : LNORM_OP_LAYERNORM,
                                  .x_dtype = 1 + k % 3, .rows = 500 + 77 * k, .hidden = k < 3 ? 1024 : 4099,
                                  .gamma = 1, .dres = k == 2, .stats = k % 3 == 1, .dgamma = 1, .dbeta = 1};
        lnorm_test_bwd_case tc;
        if (lnorm_test_bwd_make(&tc, &cfg, g, NULL)) {
            CHECK_FAIL("make");
            break;
        }
        lnorm_result res;
        run_case(c, &tc, NULL, 64 * 1024, "chunked", &res);
        CHECK(res.chunks > 4, "only %u chunks", res.chunks);
        const size_t H = (size_t)tc.seg.hidden;
        float *dg = malloc(H * 4);
        if (dg) {
            memcpy(dg, tc.dgamma, H * 4);
            for (int rep = 0; rep < 2; rep++) {
                lnorm_test_bwd_repoison(&tc);
                run_case(c, &tc, NULL, 64 * 1024, "chunked again", NULL);
                CHECK(!memcmp(dg, tc.dgamma, H * 4), "chunked: dgamma bits differ between repeats");
            }
        }
        free(dg);
        lnorm_test_bwd_free(&tc);
    }
    lnorm_client_close(c);
    return 0;
}

/* ---- forward and backward at once ---- */

typedef struct mixed_arg {
    lnorm_client *c;
    uint64_t seed;
    long bad;
    atomic_int *shared; /* backward replies that rode in a batch of > 1 request */
} mixed_arg;

typedef struct async_wait {
    atomic_int done;
    int err;
    uint32_t batch_requests;
} async_wait;

static void on_done(void *arg, int err, const lnorm_result *res)
{
    async_wait *w = arg;
    w->err = err;
    w->batch_requests = res->batch_requests;
    atomic_store(&w->done, 1);
}

static void *mixed_main(void *p)
{
    mixed_arg *a = p;
    lnorm_rng g;
    lnorm_rng_seed(&g, a->seed);
    for (int k = 0; k < 30; k++) {
        /* A forward request (async) and a backward (async or sync) in flight together. */
        lnorm_test_case_cfg fc = {.op = 1 + k % 2, .x_dtype = 1 + k % 3, .rows = 1 + k % 5, .hidden = 256,
                                  .gamma = 1, .beta = 1, .stats = 1};
        lnorm_test_case ft;
        lnorm_test_bwd_cfg bc;
        random_cfg(&g, &bc);
        bc.hidden = 512;
        bc.dgamma = 1;
        lnorm_test_bwd_case bt;
        if (lnorm_test_case_make(&ft, &fc, &g))
            break;
        if (lnorm_test_bwd_make(&bt, &bc, &g, NULL)) {
            lnorm_test_case_free(&ft);
            break;
        }
        lnorm_normalize_req fq;
        lnorm_normalize_req_init(&fq, (lnorm_op)fc.op, (lnorm_dtype)fc.x_dtype, (uint64_t)fc.rows, 256);
        fq.x = ft.x;
        fq.y = ft.y;
        fq.gamma = ft.gamma;
        fq.beta = ft.beta;
        fq.want_stats = 1;
        fq.mean = ft.mean;
        fq.rstd = ft.rstd;
        async_wait wf = {0}, wb = {0};
        int rf = lnorm_normalize_async(a->c, &fq, on_done, &wf);
        lnorm_normalize_backward_req bq;
        req_from(&bq, &bt);
        int rb;
        if (k % 2) {
            rb = lnorm_normalize_backward_async(a->c, &bq, on_done, &wb);
        } else {
            lnorm_result r;
            rb = lnorm_normalize_backward(a->c, &bq, &r);
            wb.err = rb;
            wb.batch_requests = r.batch_requests;
            atomic_store(&wb.done, 1);
        }
        while ((rf == LNORM_OK && !atomic_load(&wf.done)) || (rb == LNORM_OK && !atomic_load(&wb.done)))
            usleep(1000);
        if (rf || wf.err || rb || wb.err) {
            a->bad++;
        } else {
            a->bad += lnorm_test_check_segment(&ft.seg, NULL, "mixed forward") != 0;
            a->bad += lnorm_test_bwd_check(&bt.seg, 0, "mixed backward") != 0;
            if (wb.batch_requests > 1)
                atomic_fetch_add(a->shared, 1);
        }
        lnorm_test_case_free(&ft);
        lnorm_test_bwd_free(&bt);
    }
    return NULL;
}

static int test_mixed(void)
{
    lnorm_client *c = open_client();
    if (!c)
        return 1;
    enum { NT = 6 };
    pthread_t th[NT];
    mixed_arg args[NT];
    atomic_int shared = 0;
    for (int t = 0; t < NT; t++) {
        args[t] = (mixed_arg){c, lnorm_test_seed(100 + (uint64_t)t), 0, &shared};
        CHECK(pthread_create(&th[t], NULL, mixed_main, &args[t]) == 0, "thread");
    }
    for (int t = 0; t < NT; t++) {
        pthread_join(th[t], NULL);
        CHECK(args[t].bad == 0, "thread %d: %ld bad results", t, args[t].bad);
    }
    int sh = atomic_load(&shared);
    CHECK(sh > 0, "no backward request shared a batch with another request");
    printf("  %d backward replies rode in batches of several requests\n", sh);
    lnorm_client_close(c);
    return 0;
}

/* ---- errors ---- */

static void expect(lnorm_client *c, const lnorm_normalize_backward_req *q, int want, const char *word, const char *what)
{
    lnorm_result r;
    int rv = lnorm_normalize_backward(c, q, &r);
    CHECK(rv == want, "%s: %s, want %s (%s)", what, lnorm_errname(rv), lnorm_errname(want), r.message);
    CHECK(strstr(r.message, word) != NULL, "%s: message '%s' does not name %s", what, r.message, word);
}

static int test_errors(lnorm_rng *g)
{
    lnorm_client *c = open_client();
    if (!c)
        return 1;
    lnorm_test_bwd_cfg cfg = {.op = LNORM_OP_LAYERNORM, .x_dtype = LNORM_DTYPE_F32, .rows = 3, .hidden = 16,
                              .gamma = 1, .stats = 1, .dgamma = 1, .dbeta = 1};
    lnorm_test_bwd_case tc;
    if (lnorm_test_bwd_make(&tc, &cfg, g, NULL)) {
        CHECK_FAIL("make");
        return 1;
    }
    lnorm_normalize_backward_req q0, q;
    req_from(&q0, &tc);
    CHECK(lnorm_normalize_backward(c, &q0, NULL) == LNORM_OK, "the good request");
    /* Refused by liblnorm before sending. */
    q = q0; q.op = 9; expect(c, &q, LNORM_EINVAL, "op", "op");
    q = q0; q.x_dtype = 0; expect(c, &q, LNORM_EINVAL, "x_dtype", "x_dtype");
    q = q0; q.dy_dtype = 7; expect(c, &q, LNORM_EINVAL, "dy_dtype", "dy_dtype");
    q = q0; q.dx_dtype = 7; expect(c, &q, LNORM_EINVAL, "dx_dtype", "dx_dtype");
    q = q0; q.param_dtype = LNORM_DTYPE_BF16; expect(c, &q, LNORM_EINVAL, "param_dtype", "param_dtype");
    q = q0; q.rows = 0; expect(c, &q, LNORM_EINVAL, "rows", "rows");
    q = q0; q.eps = NAN; expect(c, &q, LNORM_EINVAL, "eps", "eps");
    q = q0; q.eps_mode = 5; expect(c, &q, LNORM_EINVAL, "eps_mode", "eps_mode");
    q = q0; q.dy = NULL; expect(c, &q, LNORM_EINVAL, "dy", "dy");
    q = q0; q.dx = NULL; q.dgamma = NULL; q.dbeta = NULL; expect(c, &q, LNORM_EINVAL, "output", "no output");
    q = q0; q.rstd = NULL; expect(c, &q, LNORM_EINVAL, "rstd", "mean without rstd");
    q = q0; q.op = LNORM_OP_RMSNORM; expect(c, &q, LNORM_EINVAL, "mean", "RMSNorm with a mean");
    q = q0; q.params_id = "bad id!"; q.gamma = NULL; expect(c, &q, LNORM_EINVAL, "params_id", "params id");
    /* Refused by lnormd. */
    q = q0; q.gamma = NULL; q.params_id = "nobody"; expect(c, &q, LNORM_ENOTFOUND, "params_id", "unknown params");
    float pg[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    lnorm_params_desc p = {"bwd-h8", LNORM_DTYPE_F32, 8, pg, NULL};
    CHECK(lnorm_register_params(c, &p, NULL) == LNORM_OK, "register");
    q = q0; q.gamma = NULL; q.params_id = "bwd-h8"; expect(c, &q, LNORM_EINVAL, "hidden", "params of another hidden");
    q = q0; q.eps_mode = LNORM_EPS_OUTSIDE; q.eps = 1e-39f; expect(c, &q, LNORM_EINVAL, "eps", "eps outside < FLT_MIN");
    /* The daemon runs with max-hidden 4096. */
    float *big = calloc(2 * 4097, 4);
    if (big) {
        q = q0; q.hidden = 4097; q.rows = 1; q.mean = NULL; q.rstd = NULL; q.gamma = NULL;
        q.x = big; q.dy = big; q.dx = big + 4097; q.dgamma = NULL; q.dbeta = NULL;
        expect(c, &q, LNORM_ELIMIT, "hidden", "hidden past max-hidden");
    }
    free(big);
    /* Nothing was written by the refused requests' replies: outputs of the
     * last good call still check. */
    CHECK(lnorm_normalize_backward(c, &q0, NULL) == LNORM_OK, "good request after the errors");
    CHECK(lnorm_test_bwd_check(&tc.seg, 0, "after errors") == 0, "good request after the errors: results");
    lnorm_test_bwd_free(&tc);
    lnorm_client_close(c);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s LNORMD_PATH results|chunked|mixed|errors\n", argv[0]);
        return 2;
    }
    td_watchdog(170);
    const char *what = argv[2];
    const char *plain[] = {"--backend", "cpu", "--cpu-threads", "2", NULL};
    const char *batching[] = {"--backend", "cpu", "--cpu-threads", "2", "--max-queue-delay-us", "3000", NULL};
    const char *limited[] = {"--backend", "cpu", "--cpu-threads", "2", "--max-hidden", "4096", NULL};
    const char **args = !strcmp(what, "mixed") ? batching : !strcmp(what, "errors") ? limited : plain;
    if (td_start(&daemon_, argv[1], NULL, args, TD_ENDPOINTS) != 0)
        return 1;
    lnorm_rng g;
    lnorm_rng_seed(&g, lnorm_test_seed(0xBAC3u));
    int rv;
    if (!strcmp(what, "results"))
        rv = test_results(&g);
    else if (!strcmp(what, "chunked"))
        rv = test_chunked(&g);
    else if (!strcmp(what, "mixed"))
        rv = test_mixed();
    else if (!strcmp(what, "errors"))
        rv = test_errors(&g);
    else {
        fprintf(stderr, "unknown test %s\n", what);
        return 2;
    }
    CHECK(rv == 0, "%s ended early", what);
    td_stop_check(&daemon_, "on SIGTERM");
    char name[64];
    snprintf(name, sizeof name, "client.backward_%s", what);
    return check_finish(name);
}
