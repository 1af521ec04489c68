/*
 * lnormd's NormalizeBackward over raw NNG + protobuf-c (no client library):
 *   test_server_bwd LNORMD roundtrip|mixed|errors
 * roundtrip: replies checked against the float64 reference and bit for
 *   bit against lnorm_cpu_run_bwd on the same inputs (CPU backend), only
 *   the outputs asked for present.
 * mixed: forward and backward requests sent at once to a daemon that waits
 *   for batches to fill: both kinds ride in shared batches, every reply
 *   checked.
 * errors: bad fields answered INVALID_ARGUMENT / RESOURCE_EXHAUSTED /
 *   NOT_FOUND naming the field; the daemon serves on.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "testbwd.h"

static const char *lnormd;

typedef struct ts_bwd {
    Lnorm__V1__Request req;
    Lnorm__V1__NormalizeBackwardRequest b;
    Lnorm__V1__Affine aff;
} ts_bwd;

/* A NormalizeBackward for a case (contiguous buffers). */
static void bwd_from_case(ts_bwd *m, const lnorm_test_bwd_case *tc, uint64_t id)
{
    const lnorm_bwd_segment *s = &tc->seg;
    lnorm__v1__request__init(&m->req);
    lnorm__v1__normalize_backward_request__init(&m->b);
    lnorm__v1__affine__init(&m->aff);
    m->req.request_id = id;
    m->req.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE_BACKWARD;
    m->req.normalize_backward = &m->b;
    m->b.op = (Lnorm__V1__Op)s->op;
    m->b.x_dtype = (Lnorm__V1__DType)s->x_dtype;
    m->b.dy_dtype = (Lnorm__V1__DType)s->dy_dtype;
    m->b.dx_dtype = (Lnorm__V1__DType)s->dx_dtype;
    m->b.rows = (uint64_t)s->rows;
    m->b.hidden = (uint64_t)s->hidden;
    m->b.eps_present_case = LNORM__V1__NORMALIZE_BACKWARD_REQUEST__EPS_PRESENT_EPS;
    m->b.eps = s->eps;
    m->b.eps_mode = (Lnorm__V1__EpsMode)s->eps_mode;
    const size_t n = (size_t)(s->rows * s->hidden);
    m->b.x.data = (uint8_t *)s->x;
    m->b.x.len = n * lnorm_dtype_size(s->x_dtype);
    m->b.dy.data = (uint8_t *)s->dy;
    m->b.dy.len = n * lnorm_dtype_size(s->dy_dtype);
    if (s->dres) {
        m->b.dres.data = (uint8_t *)s->dres;
        m->b.dres.len = m->b.x.len;
    }
    if (s->mean) {
        m->b.mean.data = (uint8_t *)s->mean;
        m->b.mean.len = (size_t)s->rows * 4;
    }
    if (s->rstd) {
        m->b.rstd.data = (uint8_t *)s->rstd;
        m->b.rstd.len = (size_t)s->rows * 4;
    }
    if (s->gamma) {
        m->aff.dtype = (Lnorm__V1__DType)s->param_dtype;
        m->aff.gamma.data = (uint8_t *)s->gamma;
        m->aff.gamma.len = (size_t)s->hidden * lnorm_dtype_size(s->param_dtype);
        m->b.affine = &m->aff;
    }
    m->b.want_dgamma = s->dgamma != NULL;
    m->b.want_dbeta = s->dbeta != NULL;
}

/* Check a reply: sizes, the float64 reference, the CPU core's bits. */
static long check_bwd_reply(lnorm_test_bwd_case *tc, const Lnorm__V1__Response *r, int want_dx, const char *label)
{
    if (!r || ts_code(r) != 0 || r->body_case != LNORM__V1__RESPONSE__BODY_NORMALIZE_BACKWARD) {
        fprintf(stderr, "%s: status %d (%s), body %d\n", label, r ? ts_code(r) : -1, r ? ts_msg(r) : "no reply",
                r ? (int)r->body_case : -1);
        return 1;
    }
    const Lnorm__V1__NormalizeBackwardResponse *b = r->normalize_backward;
    lnorm_bwd_segment *s = &tc->seg;
    const size_t H = (size_t)s->hidden;
    long bad = 0;
    bad += want_dx ? b->dx.len != tc->dx_bytes : b->dx.len != 0;
    bad += s->dgamma ? b->dgamma.len != H * 4 : b->dgamma.len != 0;
    bad += s->dbeta ? b->dbeta.len != H * 4 : b->dbeta.len != 0;
    if (bad) {
        fprintf(stderr, "%s: sizes dx %zu dgamma %zu dbeta %zu\n", label, b->dx.len, b->dgamma.len, b->dbeta.len);
        return bad;
    }
    /* The core here, on the same inputs. */
    lnorm_test_bwd_repoison(tc);
    lnorm_cpu *cpu = NULL;
    lnorm_bwd_batch bb = {s, 1};
    if (lnorm_cpu_create(&cpu, 1) != LNORM_OK || lnorm_cpu_run_bwd(cpu, &bb, NULL) != LNORM_OK)
        bad++;
    lnorm_cpu_destroy(cpu);
    if (want_dx && memcmp(b->dx.data, tc->dx, tc->dx_bytes))
        bad++, fprintf(stderr, "%s: dx differs from the core's bits\n", label);
    if (s->dgamma && memcmp(b->dgamma.data, s->dgamma, H * 4))
        bad++, fprintf(stderr, "%s: dgamma differs from the core's bits\n", label);
    if (s->dbeta && memcmp(b->dbeta.data, s->dbeta, H * 4))
        bad++, fprintf(stderr, "%s: dbeta differs from the core's bits\n", label);
    /* And the reply's values against the reference. */
    if (want_dx)
        memcpy(tc->dx, b->dx.data, tc->dx_bytes);
    if (s->dgamma)
        memcpy(s->dgamma, b->dgamma.data, H * 4);
    if (s->dbeta)
        memcpy(s->dbeta, b->dbeta.data, H * 4);
    bad += lnorm_test_bwd_check(s, 0, label) != 0;
    return bad;
}

static int start(td_daemon *d, const char *const *extra)
{
    const char *args[TD_MAX_ARGS] = {"--cpu-threads", "2"};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < TD_MAX_ARGS - 1; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    if (td_start(d, lnormd, NULL, args, TD_ENDPOINTS) != 0) {
        CHECK_FAIL("lnormd did not start");
        return -1;
    }
    return 0;
}

static void random_cfg(lnorm_rng *g, lnorm_test_bwd_cfg *c)
{
    static const int64_t hs[] = {1, 5, 64, 300, 1024, 4096};
    memset(c, 0, sizeof *c);
    c->op = 1 + (int)(lnorm_rng_next(g) % 2);
    c->x_dtype = 1 + (int)(lnorm_rng_next(g) % 3);
    c->dy_dtype = (int)(lnorm_rng_next(g) % 4);
    c->dx_dtype = (int)(lnorm_rng_next(g) % 4);
    c->rows = 1 + (int64_t)(lnorm_rng_next(g) % 20);
    c->hidden = hs[lnorm_rng_next(g) % 6];
    c->gamma = (int)(lnorm_rng_next(g) % 2);
    c->param_dtype = lnorm_rng_next(g) % 2 ? LNORM_DTYPE_F32 : 0;
    c->dres = lnorm_rng_next(g) % 3 == 0;
    c->stats = (int)(lnorm_rng_next(g) % 2);
    c->dgamma = (int)(lnorm_rng_next(g) % 2);
    c->dbeta = (int)(lnorm_rng_next(g) % 2);
    c->eps_mode = (int)(lnorm_rng_next(g) % 2);
    c->x_mean = lnorm_rng_uniform(g) - 0.5;
}

static void test_roundtrip(const td_daemon *d, lnorm_rng *g)
{
    nng_socket s;
    if (ts_dial(&s, d->ipc_url)) {
        CHECK_FAIL("dial");
        return;
    }
    for (int k = 0; k < 40; k++) {
        lnorm_test_bwd_cfg c;
        random_cfg(g, &c);
        lnorm_test_bwd_case tc;
        if (lnorm_test_bwd_make(&tc, &c, g, NULL)) {
            CHECK_FAIL("make");
            break;
        }
        ts_bwd m;
        bwd_from_case(&m, &tc, 1000 + (uint64_t)k);
        int skip = (c.dgamma || c.dbeta) && k % 3 == 0;
        m.b.skip_dx = skip;
        Lnorm__V1__Response *r = ts_call(s, &m.req);
        CHECK(r && r->request_id == 1000 + (uint64_t)k, "request id");
        CHECK(check_bwd_reply(&tc, r, !skip, "roundtrip") == 0, "roundtrip case %d", k);
        if (r)
            lnorm__v1__response__free_unpacked(r, NULL);
        lnorm_test_bwd_free(&tc);
    }
    nng_close(s);
}

/* ---- forward and backward at once ---- */

typedef struct mix_arg {
    const char *url;
    uint64_t seed;
    int bwd;
    long bad;
    uint32_t max_batch;
} mix_arg;

static void *mix_main(void *p)
{
    mix_arg *a = p;
    lnorm_rng g;
    lnorm_rng_seed(&g, a->seed);
    nng_socket s;
    if (ts_dial(&s, a->url)) {
        a->bad++;
        return NULL;
    }
    for (int k = 0; k < 6; k++) {
        Lnorm__V1__Response *r;
        if (a->bwd) {
            lnorm_test_bwd_cfg c;
            random_cfg(&g, &c);
            c.dgamma = 1;
            lnorm_test_bwd_case tc;
            if (lnorm_test_bwd_make(&tc, &c, &g, NULL)) {
                a->bad++;
                break;
            }
            ts_bwd m;
            bwd_from_case(&m, &tc, (uint64_t)k + 1);
            r = ts_call(s, &m.req);
            a->bad += check_bwd_reply(&tc, r, 1, "mixed backward") != 0;
            lnorm_test_bwd_free(&tc);
        } else {
            lnorm_test_case_cfg c = {.op = 1 + k % 2, .x_dtype = 1 + k % 3, .rows = 1 + k, .hidden = 512,
                                     .gamma = 1, .beta = 1, .stats = 1};
            lnorm_test_case tc;
            if (lnorm_test_case_make(&tc, &c, &g)) {
                a->bad++;
                break;
            }
            ts_norm m;
            ts_norm_from_case(&m, &tc, (uint64_t)k + 1, 1);
            r = ts_call(s, &m.req);
            a->bad += ts_check_reply(&tc, r, "mixed forward") != 0;
            lnorm_test_case_free(&tc);
        }
        if (r && r->timings && r->timings->batch_requests > a->max_batch)
            a->max_batch = r->timings->batch_requests;
        if (r)
            lnorm__v1__response__free_unpacked(r, NULL);
    }
    nng_close(s);
    return NULL;
}

static void test_mixed(const td_daemon *d, lnorm_rng *g)
{
    enum { NT = 8 };
    pthread_t th[NT];
    mix_arg a[NT];
    for (int t = 0; t < NT; t++) {
        a[t] = (mix_arg){d->ipc_url, lnorm_rng_next(g), t % 2, 0, 0};
        CHECK(pthread_create(&th[t], NULL, mix_main, &a[t]) == 0, "thread");
    }
    uint32_t fwd_max = 0, bwd_max = 0;
    for (int t = 0; t < NT; t++) {
        pthread_join(th[t], NULL);
        CHECK(a[t].bad == 0, "thread %d (%s): %ld bad replies", t, a[t].bwd ? "backward" : "forward", a[t].bad);
        if (a[t].bwd && a[t].max_batch > bwd_max)
            bwd_max = a[t].max_batch;
        if (!a[t].bwd && a[t].max_batch > fwd_max)
            fwd_max = a[t].max_batch;
    }
    printf("  largest batch seen: %u requests (backward replies), %u (forward)\n", bwd_max, fwd_max);
    CHECK(bwd_max > 1 && fwd_max > 1, "requests did not share batches (%u, %u)", bwd_max, fwd_max);
}

/* ---- errors ---- */

static void expect(nng_socket s, const ts_bwd *m, int code, const char *needle, const char *what)
{
    Lnorm__V1__Response *r = ts_call(s, &m->req);
    CHECK(r != NULL, "%s: no reply", what);
    if (!r)
        return;
    CHECK(ts_code(r) == code, "%s: code %d, want %d (%s)", what, ts_code(r), code, ts_msg(r));
    CHECK(strstr(ts_msg(r), needle) != NULL, "%s: message '%s' lacks '%s'", what, ts_msg(r), needle);
    CHECK(r->request_id == m->req.request_id, "%s: request id %llu", what, (unsigned long long)r->request_id);
    lnorm__v1__response__free_unpacked(r, NULL);
}

static void test_errors(const td_daemon *d, lnorm_rng *g)
{
    nng_socket s;
    if (ts_dial(&s, d->ipc_url)) {
        CHECK_FAIL("dial");
        return;
    }
    lnorm_test_bwd_cfg c = {.op = LNORM_OP_LAYERNORM, .x_dtype = LNORM_DTYPE_F32, .rows = 4, .hidden = 32,
                            .gamma = 1, .stats = 1, .dgamma = 1, .dbeta = 1};
    lnorm_test_bwd_case tc;
    if (lnorm_test_bwd_make(&tc, &c, g, NULL)) {
        CHECK_FAIL("make");
        nng_close(s);
        return;
    }
    const int INV = LNORM__V1__CODE__INVALID_ARGUMENT, RES = LNORM__V1__CODE__RESOURCE_EXHAUSTED;
    ts_bwd m;
#define BAD(code, needle, stmt)           \
    do {                                  \
        bwd_from_case(&m, &tc, 77);       \
        stmt;                             \
        expect(s, &m, code, needle, #stmt); \
    } while (0)
    BAD(INV, "normalize_backward.op", m.b.op = 5);
    BAD(INV, "normalize_backward.x_dtype", m.b.x_dtype = 0);
    BAD(INV, "normalize_backward.dy", m.b.dy.len -= 4);
    BAD(INV, "normalize_backward.mean", m.b.rstd.len = 0);
    BAD(INV, "normalize_backward.skip_dx", (m.b.skip_dx = 1, m.b.want_dgamma = 0, m.b.want_dbeta = 0));
    BAD(INV, "normalize_backward.affine.beta", (m.aff.beta.data = m.aff.gamma.data, m.aff.beta.len = m.aff.gamma.len));
    BAD(RES, "normalize_backward.hidden", m.b.hidden = 1u << 20);
    BAD(LNORM__V1__CODE__NOT_FOUND, "normalize_backward.affine.params_id",
        (m.aff.gamma.len = 0, m.aff.dtype = 0, m.aff.params_id = "none-such"));
#undef BAD
    /* The daemon serves on. */
    bwd_from_case(&m, &tc, 78);
    Lnorm__V1__Response *r = ts_call(s, &m.req);
    CHECK(check_bwd_reply(&tc, r, 1, "after the errors") == 0, "a good request after the errors");
    if (r)
        lnorm__v1__response__free_unpacked(r, NULL);
    lnorm_test_bwd_free(&tc);
    nng_close(s);
}

static const char *const mixed_args[] = {"--max-queue-delay-us", "200000", NULL};

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s LNORMD roundtrip|mixed|errors\n", argv[0]);
        return 2;
    }
    lnormd = argv[1];
    td_watchdog(140);
    lnorm_rng g;
    lnorm_rng_seed(&g, lnorm_test_seed(0xB0D));
    td_daemon d;
    const char *what = argv[2];
    if (strcmp(what, "roundtrip") && strcmp(what, "mixed") && strcmp(what, "errors")) {
        fprintf(stderr, "unknown test %s\n", what);
        return 2;
    }
    if (start(&d, strcmp(what, "mixed") ? NULL : mixed_args) == 0) {
        if (!strcmp(what, "roundtrip"))
            test_roundtrip(&d, &g);
        else if (!strcmp(what, "mixed"))
            test_mixed(&d, &g);
        else
            test_errors(&d, &g);
        td_stop_check(&d, "on SIGTERM");
    }
    char name[64];
    snprintf(name, sizeof name, "server.backward_%s", what);
    return check_finish(name);
}
