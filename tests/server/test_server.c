/*
 * Integration tests of lnormd: test_server LNORMD TEST. Each TEST starts its
 * own daemon(s) on private addresses and stops them; a watchdog bounds it.
 */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static const char *lnormd;

/* lnormd on the test endpoints (ipc, tcp, http) with 2 CPU threads and
 * extra (NULL-terminated, may be NULL); 0, or -1 with the failure counted. */
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

/* ------------------------------------------------------------------ */
/* Mixed ops, dtypes, shapes, options: every reply checked.            */

static void make_case(lnorm_test_case *tc, lnorm_rng *g, int op, int xdt, int ydt, int pdt, int64_t rows,
                      int64_t hidden, int gamma, int beta, int residual, int stats, int eps_mode, float eps)
{
    lnorm_test_case_cfg c = {.op = op, .x_dtype = xdt, .y_dtype = ydt, .param_dtype = pdt, .rows = rows,
                             .hidden = hidden, .gamma = gamma, .beta = beta, .residual = residual, .stats = stats,
                             .eps_mode = eps_mode, .eps = eps, .x_mean = 0.5, .x_spread = 2.0};
    if (lnorm_test_case_make(tc, &c, g) != LNORM_OK) {
        fprintf(stderr, "out of memory building a case\n");
        exit(1);
    }
}

static void random_case(lnorm_test_case *tc, lnorm_rng *g)
{
    static const int64_t hiddens[] = {1, 3, 8, 64, 127, 256, 768, 1000, 4096};
    int op = 1 + (int)(lnorm_rng_next(g) % 2);
    int xdt = 1 + (int)(lnorm_rng_next(g) % 3);
    int ydt = 1 + (int)(lnorm_rng_next(g) % 3);
    int pdt = (lnorm_rng_next(g) % 2) ? LNORM_DTYPE_F32 : xdt;
    int64_t hidden = hiddens[lnorm_rng_next(g) % (sizeof hiddens / sizeof hiddens[0])];
    int64_t rows = 1 + (int64_t)(lnorm_rng_next(g) % 9);
    unsigned f = (unsigned)lnorm_rng_next(g);
    float eps = (f & 32) ? 1e-3f : 0.0f;
    make_case(tc, g, op, xdt, ydt, pdt, rows, hidden, f & 1, (f >> 1) & 1, (f >> 2) & 1, (f >> 3) & 1, (f >> 4) & 1,
              eps);
}

static void test_normalize(td_daemon *d, lnorm_rng *g)
{
    const char *urls[2] = {d->ipc_url, d->tcp_url};
    for (int u = 0; u < 2; u++) {
        nng_socket s;
        if (ts_dial(&s, urls[u]) != 0)
            continue;
        /* Every op x x_dtype x y_dtype with every option on, then random mixes. */
        int n = 0;
        for (int op = 1; op <= 2; op++)
            for (int xdt = 1; xdt <= 3; xdt++)
                for (int ydt = 1; ydt <= 3; ydt++) {
                    lnorm_test_case tc;
                    make_case(&tc, g, op, xdt, ydt, (xdt + ydt) % 2 ? LNORM_DTYPE_F32 : xdt, 3, 320, 1, 1, 1, 1, 0, 0);
                    ts_norm m;
                    ts_norm_from_case(&m, &tc, (uint64_t)(1000 + n), 1);
                    Lnorm__V1__Response *r = ts_call(s, &m.req);
                    char label[96];
                    snprintf(label, sizeof label, "%s op %d x %s y %s", urls[u], op, lnorm_dtype_name(xdt),
                             lnorm_dtype_name(ydt));
                    CHECK(ts_check_reply(&tc, r, label) == 0, "%s", label);
                    CHECK(r && r->request_id == (uint64_t)(1000 + n), "request_id echoed");
                    CHECK(r && r->timings && r->timings->batch_rows >= 3 && r->timings->batch_requests >= 1,
                          "timings filled");
                    if (r)
                        lnorm__v1__response__free_unpacked(r, NULL);
                    lnorm_test_case_free(&tc);
                    n++;
                }
        for (int i = 0; i < 60; i++, n++) {
            lnorm_test_case tc;
            random_case(&tc, g);
            ts_norm m;
            ts_norm_from_case(&m, &tc, (uint64_t)(1000 + n), 1);
            Lnorm__V1__Response *r = ts_call(s, &m.req);
            char label[64];
            snprintf(label, sizeof label, "%s random case %d", urls[u], i);
            CHECK(ts_check_reply(&tc, r, label) == 0, "%s", label);
            if (r)
                lnorm__v1__response__free_unpacked(r, NULL);
            lnorm_test_case_free(&tc);
        }
        nng_close(s);
    }
    double ok = td_metric(d, "lnormd_requests_total{status=\"OK\"}");
    CHECK(ok == 2 * (18 + 60), "OK count in /metrics is %g", ok);
}

/* ------------------------------------------------------------------ */
/* Concurrency helpers: N threads, each with its own socket, one call.  */

typedef struct worker {
    pthread_t t;
    const char *url;
    lnorm_test_case tc;
    ts_norm m;
    Lnorm__V1__Response *resp;
    int started;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    nng_socket s;
    if (ts_dial(&s, w->url) != 0)
        return NULL;
    w->resp = ts_call(s, &w->m.req);
    nng_close(s);
    return NULL;
}

/* Worker i sends its case as request i + 1 to url. */
static void worker_set(worker *w, int i, const char *url)
{
    w->url = url;
    ts_norm_from_case(&w->m, &w->tc, (uint64_t)i + 1, 1);
}

static void start_workers(worker *ws, int n)
{
    for (int i = 0; i < n; i++)
        ws[i].started = pthread_create(&ws[i].t, NULL, worker_main, &ws[i]) == 0;
}

/* n workers with random cases, alternately on d's ipc and tcp URLs, started. */
static void start_random_workers(worker *ws, int n, const td_daemon *d, lnorm_rng *g)
{
    for (int i = 0; i < n; i++) {
        random_case(&ws[i].tc, g);
        worker_set(&ws[i], i, i % 2 ? d->tcp_url : d->ipc_url);
    }
    start_workers(ws, n);
}

static void join_workers(worker *ws, int n)
{
    for (int i = 0; i < n; i++)
        if (ws[i].started)
            pthread_join(ws[i].t, NULL);
}

static void run_workers(worker *ws, int n)
{
    start_workers(ws, n);
    join_workers(ws, n);
}

/* Check each worker's reply against its case ("what i" on failure);
 * returns how many were right. */
static int check_workers(const worker *ws, int n, const char *what)
{
    int good = 0;
    for (int i = 0; i < n; i++) {
        char label[96];
        snprintf(label, sizeof label, "%s %d", what, i);
        long bad = ts_check_reply(&ws[i].tc, ws[i].resp, label);
        CHECK(bad == 0, "%s", label);
        good += bad == 0;
    }
    return good;
}

static void free_workers(worker *ws, int n)
{
    for (int i = 0; i < n; i++) {
        if (ws[i].resp)
            lnorm__v1__response__free_unpacked(ws[i].resp, NULL);
        lnorm_test_case_free(&ws[i].tc);
    }
}

/* 64 concurrent one-row requests ride in far fewer than 64 batches. */
static const char *const batching_args[] = {"--max-queue-delay-us", "200000", NULL};

static void test_batching(td_daemon *d, lnorm_rng *g)
{
    enum { N = 64 };
    static worker ws[N];
    for (int i = 0; i < N; i++) {
        /* Mixed ops / dtypes share batches. */
        make_case(&ws[i].tc, g, 1 + i % 2, 1 + i % 3, 1 + (i / 3) % 3, LNORM_DTYPE_F32, 1, 512, 1, i % 4 == 0, i % 5 == 0,
                  1, 0, 0);
        worker_set(&ws[i], i, i % 2 ? d->ipc_url : d->tcp_url);
    }
    run_workers(ws, N);
    check_workers(ws, N, "batched request");
    int max_req = 0;
    for (int i = 0; i < N; i++)
        if (ws[i].resp && ws[i].resp->timings && (int)ws[i].resp->timings->batch_requests > max_req)
            max_req = (int)ws[i].resp->timings->batch_requests;
    double batches = td_metric(d, "lnormd_batches_total");
    double hist_n = td_metric(d, "lnormd_batch_requests_count");
    double hist_sum = td_metric(d, "lnormd_batch_requests_sum");
    fprintf(stderr, "64 requests rode in %g batches (largest %d requests)\n", batches, max_req);
    CHECK(batches >= 1 && batches <= 16, "64 one-row requests took %g batches", batches);
    CHECK(max_req >= 8, "largest batch had only %d requests", max_req);
    CHECK(hist_n == batches && hist_sum == N, "batch_requests histogram: count %g sum %g", hist_n, hist_sum);
    free_workers(ws, N);
}

/* A row's result is bit-identical whichever batch it rides in. */
static void test_invariance(td_daemon *none, lnorm_rng *g)
{
    (void)none;
    static const char *const args_alone[] = {"--max-queue-delay-us", "0", "--cpu-jobs", "1", NULL};
    static const char *const args_batched[] = {"--max-queue-delay-us", "300000", NULL};
    enum { N = 24 };
    static worker a[N], b[N];
    for (int i = 0; i < N; i++) {
        random_case(&a[i].tc, g);
        worker_set(&a[i], i, NULL);
    }
    /* Alone: one request at a time. */
    td_daemon d;
    if (start(&d, args_alone) != 0)
        return;
    nng_socket s;
    if (ts_dial(&s, d.tcp_url) == 0) {
        for (int i = 0; i < N; i++) {
            a[i].resp = ts_call(s, &a[i].m.req);
            CHECK(a[i].resp && a[i].resp->timings && a[i].resp->timings->batch_requests == 1, "alone in its batch");
        }
        nng_close(s);
    }
    td_stop_check(&d, "on SIGTERM");
    /* Together: the same requests, concurrently, batched with each other. */
    if (start(&d, args_batched) != 0)
        return;
    for (int i = 0; i < N; i++) {
        b[i].url = d.ipc_url;
        b[i].m = a[i].m;
        b[i].m.req.normalize = &b[i].m.n;
        if (b[i].m.n.affine)
            b[i].m.n.affine = &b[i].m.aff;
    }
    run_workers(b, N);
    int shared = 0;
    for (int i = 0; i < N; i++) {
        char label[48];
        snprintf(label, sizeof label, "invariance case %d", i);
        CHECK(ts_check_reply(&a[i].tc, b[i].resp, label) == 0, "%s", label);
        if (!a[i].resp || !b[i].resp || ts_code(a[i].resp) || ts_code(b[i].resp)) {
            CHECK_FAIL("case %d: missing reply", i);
            continue;
        }
        if (b[i].resp->timings && b[i].resp->timings->batch_requests > 1)
            shared++;
        const Lnorm__V1__NormalizeResponse *x = a[i].resp->normalize, *y = b[i].resp->normalize;
        CHECK(x->y.len == y->y.len && !memcmp(x->y.data, y->y.data, x->y.len), "case %d: y differs", i);
        CHECK(x->rstd.len == y->rstd.len && (!x->rstd.len || !memcmp(x->rstd.data, y->rstd.data, x->rstd.len)),
              "case %d: rstd differs", i);
        CHECK(x->mean.len == y->mean.len && (!x->mean.len || !memcmp(x->mean.data, y->mean.data, x->mean.len)),
              "case %d: mean differs", i);
        CHECK(x->residual_out.len == y->residual_out.len &&
                  (!x->residual_out.len || !memcmp(x->residual_out.data, y->residual_out.data, x->residual_out.len)),
              "case %d: residual_out differs", i);
    }
    CHECK(shared >= N / 2, "only %d of %d requests shared a batch", shared, N);
    for (int i = 0; i < N; i++)
        if (b[i].resp)
            lnorm__v1__response__free_unpacked(b[i].resp, NULL);
    free_workers(a, N);
    td_stop_check(&d, "on SIGTERM");
}

/* ------------------------------------------------------------------ */
/* Malformed requests get the right status; valid traffic goes on.      */

static void expect(nng_socket s, const Lnorm__V1__Request *req, int code, const char *needle, const char *what)
{
    Lnorm__V1__Response *r = ts_call(s, req);
    CHECK(r != NULL, "%s: no reply", what);
    if (!r)
        return;
    CHECK(ts_code(r) == code, "%s: status %d (%s), want %d", what, ts_code(r), ts_msg(r), code);
    CHECK(!needle || strstr(ts_msg(r), needle), "%s: message '%s' does not name '%s'", what, ts_msg(r), needle);
    CHECK(r->request_id == req->request_id, "%s: request_id %llu", what, (unsigned long long)r->request_id);
    lnorm__v1__response__free_unpacked(r, NULL);
}

static void valid_roundtrip(nng_socket s, lnorm_rng *g, const char *after)
{
    lnorm_test_case tc;
    /* Small enough for every daemon of these tests (max-message-bytes 64 KiB). */
    unsigned f = (unsigned)lnorm_rng_next(g);
    make_case(&tc, g, 1 + (f & 1), 1 + (int)((f >> 1) % 3), 1 + (int)((f >> 3) % 3), LNORM_DTYPE_F32,
              1 + (int64_t)((f >> 5) % 4), 1 + (int64_t)((f >> 8) % 1024), (f >> 18) & 1, (f >> 19) & 1, (f >> 20) & 1,
              (f >> 21) & 1, (f >> 22) & 1, 0);
    ts_norm m;
    ts_norm_from_case(&m, &tc, 99, 1);
    Lnorm__V1__Response *r = ts_call(s, &m.req);
    char label[96];
    snprintf(label, sizeof label, "valid request after %s", after);
    CHECK(ts_check_reply(&tc, r, label) == 0, "%s", label);
    if (r)
        lnorm__v1__response__free_unpacked(r, NULL);
    lnorm_test_case_free(&tc);
}

static const char *const malformed_args[] = {"--max-message-bytes", "65536", "--max-rows", "64", "--max-hidden", "4096", NULL};

/* A field of a Normalize request set to v (F_EPS: v indexes bad_eps). */
enum { F_NONE, F_X_LEN, F_ROWS, F_HIDDEN, F_RESIDUAL_LEN, F_GAMMA_LEN, F_PARAM_DTYPE, F_EPS, F_OP, F_X_DTYPE,
       F_Y_DTYPE, F_EPS_MODE };

static void set_field(ts_norm *m, int field, uint64_t v)
{
    static const float bad_eps[] = {0.0f, -1e-5f, NAN, INFINITY, -0.0f};
    switch (field) {
    case F_X_LEN: m->n.x.len = v; break;
    case F_ROWS: m->n.rows = v; break;
    case F_HIDDEN: m->n.hidden = v; break;
    case F_RESIDUAL_LEN: m->n.residual.len = v; break;
    case F_GAMMA_LEN: m->aff.gamma.len = v; break;
    case F_PARAM_DTYPE: m->aff.dtype = (Lnorm__V1__DType)v; break; /* neither f32 nor x's dtype */
    case F_EPS:
        m->n.eps_present_case = LNORM__V1__NORMALIZE_REQUEST__EPS_PRESENT_EPS;
        m->n.eps = bad_eps[v];
        break;
    case F_OP: m->n.op = (Lnorm__V1__Op)v; break;
    case F_X_DTYPE: m->n.x_dtype = (Lnorm__V1__DType)v; break;
    case F_Y_DTYPE: m->n.y_dtype = (Lnorm__V1__DType)v; break;
    case F_EPS_MODE: m->n.eps_mode = (Lnorm__V1__EpsMode)v; break;
    default: break;
    }
}

static void test_malformed(td_daemon *d, lnorm_rng *g)
{
    nng_socket s, s2;
    if (ts_dial(&s, d->tcp_url) != 0 || ts_dial(&s2, d->ipc_url) != 0)
        return;
    lnorm_test_case tc;
    make_case(&tc, g, LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, LNORM_DTYPE_F32, LNORM_DTYPE_F32, 4, 32, 1, 1, 1, 1, 0, 0);
    ts_norm m;

    /* Truncated protobuf: a valid request cut short. */
    ts_norm_from_case(&m, &tc, 501, 1);
    size_t n = lnorm__v1__request__get_packed_size(&m.req);
    uint8_t *buf = malloc(n);
    lnorm__v1__request__pack(&m.req, buf);
    Lnorm__V1__Response *r = ts_call_raw(s, buf, n - 7);
    CHECK(r && ts_code(r) == 3 && strstr(ts_msg(r), "message"), "truncated: %d %s", ts_code(r), ts_msg(r));
    CHECK(r && r->request_id == 501, "truncated: request_id recovered");
    if (r)
        lnorm__v1__response__free_unpacked(r, NULL);
    free(buf);
    valid_roundtrip(s2, g, "truncated");
    /* Garbage bytes. */
    uint8_t junk[300];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)lnorm_rng_next(g);
    junk[0] = 0xff;
    r = ts_call_raw(s, junk, sizeof junk);
    CHECK(r && ts_code(r) == 3, "garbage: %d %s", ts_code(r), ts_msg(r));
    if (r)
        lnorm__v1__response__free_unpacked(r, NULL);
    /* Empty message: no body. */
    r = ts_call_raw(s, junk, 0);
    CHECK(r && ts_code(r) == 3 && strstr(ts_msg(r), "body"), "empty: %d %s", ts_code(r), ts_msg(r));
    if (r)
        lnorm__v1__response__free_unpacked(r, NULL);

    /* One or two fields of a valid request set wrong (sizes that disagree,
     * huge shapes: overflow-safe, limits; eps; unknown enum values), a
     * valid request on the other connection after each group. */
    static const struct {
        int f1;
        uint64_t v1;
        int f2;
        uint64_t v2;
        int code;
        const char *needle, *what;
    } bad[] = {
        {F_X_LEN, 4 * 32 * 4 - 4, F_NONE, 0, 3, "normalize.x", "x too short"},
        {F_ROWS, 5, F_NONE, 0, 3, "normalize.x", "rows disagree"},
        {F_RESIDUAL_LEN, 8, F_NONE, 0, 3, "normalize.residual", "residual shape"},
        {F_GAMMA_LEN, 12, F_NONE, 0, 3, "normalize.affine.gamma", "gamma size"},
        {F_PARAM_DTYPE, LNORM__V1__DTYPE__DTYPE_BF16, F_NONE, 0, 3, "normalize.affine.dtype", "params dtype"},
        {F_NONE, 0, F_NONE, 0, -1, NULL, "size errors"},
        {F_ROWS, 1ull << 62, F_HIDDEN, 1ull << 62, 8, "normalize.rows", "rows over the limit"},
        {F_ROWS, 4, F_HIDDEN, 1ull << 40, 8, "normalize.hidden", "hidden over the limit"},
        {F_ROWS, 0, F_NONE, 0, 3, "normalize.rows", "rows 0"},
        {F_HIDDEN, 0, F_NONE, 0, 3, "normalize.hidden", "hidden 0"},
        {F_EPS, 0, F_NONE, 0, 3, "normalize.eps", "eps 0"},
        {F_EPS, 1, F_NONE, 0, 3, "normalize.eps", "eps -1e-5"},
        {F_EPS, 2, F_NONE, 0, 3, "normalize.eps", "eps NaN"},
        {F_EPS, 3, F_NONE, 0, 3, "normalize.eps", "eps Inf"},
        {F_EPS, 4, F_NONE, 0, 3, "normalize.eps", "eps -0"},
        {F_OP, 7, F_NONE, 0, 3, "normalize.op", "unknown op"},
        {F_OP, LNORM__V1__OP__OP_UNSPECIFIED, F_NONE, 0, 3, "normalize.op", "unspecified op"},
        {F_X_DTYPE, 9, F_NONE, 0, 3, "normalize.x_dtype", "unknown x dtype"},
        {F_X_DTYPE, LNORM__V1__DTYPE__DTYPE_UNSPECIFIED, F_NONE, 0, 3, "normalize.x_dtype", "unspecified x dtype"},
        {F_Y_DTYPE, 4, F_NONE, 0, 3, "normalize.y_dtype", "unknown y dtype"},
        {F_EPS_MODE, 2, F_NONE, 0, 3, "normalize.eps_mode", "unknown eps mode"},
        {F_NONE, 0, F_NONE, 0, -1, NULL, "enum errors"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (bad[i].code < 0) {
            valid_roundtrip(s2, g, bad[i].what);
            continue;
        }
        ts_norm_from_case(&m, &tc, 502 + i, 1);
        set_field(&m, bad[i].f1, bad[i].v1);
        set_field(&m, bad[i].f2, bad[i].v2);
        expect(s, &m.req, bad[i].code, bad[i].needle, bad[i].what);
    }
    /* Affine rules. */
    ts_norm_from_case(&m, &tc, 540, 1);
    m.aff.params_id = "p1";
    expect(s, &m.req, 3, "normalize.affine", "params id and inline");
    ts_norm_from_case(&m, &tc, 541, 0);
    m.aff.params_id = "nope";
    m.n.affine = &m.aff;
    expect(s, &m.req, 5, "normalize.affine.params_id", "unknown params id");
    ts_norm_from_case(&m, &tc, 542, 0);
    m.aff.params_id = "bad id!";
    m.n.affine = &m.aff;
    expect(s, &m.req, 3, "params_id", "invalid params id");
    /* Oversize message: over max-message-bytes, within NNG's grace. */
    lnorm_test_case big;
    make_case(&big, g, LNORM_OP_RMSNORM, LNORM_DTYPE_F32, LNORM_DTYPE_F32, LNORM_DTYPE_F32, 20, 1024, 0, 0, 0, 0, 0, 0);
    ts_norm_from_case(&m, &big, 550, 1); /* 80 KiB of x */
    expect(s, &m.req, 8, "max-message-bytes", "oversize message");
    lnorm_test_case_free(&big);
    /* A request with no body. */
    Lnorm__V1__Request empty = LNORM__V1__REQUEST__INIT;
    empty.request_id = 560;
    expect(s, &empty, 3, "body", "no body");
    /* Valid traffic still flows on both connections. */
    valid_roundtrip(s, g, "all errors (same connection)");
    valid_roundtrip(s2, g, "all errors (other connection)");
    double inv = td_metric(d, "lnormd_requests_total{status=\"INVALID_ARGUMENT\"}");
    double res = td_metric(d, "lnormd_requests_total{status=\"RESOURCE_EXHAUSTED\"}");
    double nf = td_metric(d, "lnormd_requests_total{status=\"NOT_FOUND\"}");
    CHECK(inv == 24 && res == 3 && nf == 1, "status counters: invalid %g, exhausted %g, not found %g", inv, res, nf);
    lnorm_test_case_free(&tc);
    nng_close(s);
    nng_close(s2);
}

/* ------------------------------------------------------------------ */

static const char *const deadline_args[] = {"--max-queue-delay-us", "300000", NULL};

static void test_deadline(td_daemon *d, lnorm_rng *g)
{
    enum { N = 4 };
    static worker ws[N];
    for (int i = 0; i < N; i++) {
        make_case(&ws[i].tc, g, LNORM_OP_LAYERNORM, LNORM_DTYPE_F16, LNORM_DTYPE_F16, LNORM_DTYPE_F16, 2, 256, 1, 1, 0, 0, 0, 0);
        worker_set(&ws[i], i, d->tcp_url);
        /* Two expire while waiting for the 300 ms batch; two have time. */
        ws[i].m.req.deadline_us = i < 2 ? 20000 : 20000000;
    }
    run_workers(ws, N);
    for (int i = 0; i < N; i++) {
        if (i < 2) {
            CHECK(ws[i].resp && ts_code(ws[i].resp) == 4 && ws[i].resp->body_case == 0,
                  "request %d: status %d (%s), want DEADLINE_EXCEEDED", i, ts_code(ws[i].resp), ts_msg(ws[i].resp));
        } else {
            check_workers(&ws[i], 1, "request with time left");
        }
    }
    double de = td_metric(d, "lnormd_requests_total{status=\"DEADLINE_EXCEEDED\"}");
    double rows = td_metric(d, "lnormd_rows_total");
    CHECK(de == 2, "DEADLINE_EXCEEDED count %g", de);
    CHECK(rows == 4, "rows computed %g: expired requests must not be computed", rows);
    free_workers(ws, N);
}

static const char *const queue_full_args[] = {"--max-queue", "3", "--max-queue-delay-us", "700000", NULL};

/* n concurrent requests of the case c on url: each reply must be a right
 * result or RESOURCE_EXHAUSTED naming limit. Returns how many were the
 * latter, *ok how many the former. */
static int limited_wave(int n, const char *url, lnorm_rng *g, const lnorm_test_case_cfg *c, const char *limit, int *ok)
{
    static worker ws[16];
    int limited = 0;
    *ok = 0;
    for (int i = 0; i < n; i++) {
        if (lnorm_test_case_make(&ws[i].tc, c, g) != LNORM_OK)
            CHECK_FAIL("out of memory building a case");
        worker_set(&ws[i], i, url);
    }
    run_workers(ws, n);
    for (int i = 0; i < n; i++) {
        int code = ts_code(ws[i].resp);
        if (code == LNORM__V1__CODE__RESOURCE_EXHAUSTED && strstr(ts_msg(ws[i].resp), limit))
            limited++;
        else if (code == 0)
            *ok += check_workers(&ws[i], 1, "request within the limit");
        else
            CHECK_FAIL("request %d: status %d (%s), want OK or RESOURCE_EXHAUSTED naming %s", i, code,
                       ts_msg(ws[i].resp), limit);
    }
    free_workers(ws, n);
    return limited;
}

static void test_queue_full(td_daemon *d, lnorm_rng *g)
{
    enum { N = 10 };
    const lnorm_test_case_cfg c = {.op = LNORM_OP_RMSNORM, .x_dtype = LNORM_DTYPE_BF16, .y_dtype = LNORM_DTYPE_F32,
                                   .param_dtype = LNORM_DTYPE_F32, .rows = 1, .hidden = 128, .gamma = 1, .stats = 1};
    int ok, full = limited_wave(N, d->ipc_url, g, &c, "queue full", &ok);
    CHECK(ok == 3 && full == N - 3, "%d OK, %d RESOURCE_EXHAUSTED (want 3, %d)", ok, full, N - 3);
}

/* Fewer contexts than concurrent clients: NNG holds the rest back, and
 * every request is still answered correctly. */
static const char *const contexts_args[] = {"--contexts", "2", NULL};

static void test_contexts(td_daemon *d, lnorm_rng *g)
{
    enum { N = 24 };
    static worker ws[N];
    start_random_workers(ws, N, d, g);
    join_workers(ws, N);
    check_workers(ws, N, "request through 2 contexts");
    free_workers(ws, N);
}

/* Memory held by requests in flight is bounded. */
static const char *const inflight_bytes_args[] = {"--max-inflight-bytes", "1048576", "--max-queue-delay-us", "500000", NULL};

static void test_inflight_bytes(td_daemon *d, lnorm_rng *g)
{
    /* 64 x 1024 f32 in + out, no stats: 512 KiB each; two fit in 1 MiB. */
    const lnorm_test_case_cfg c = {.op = LNORM_OP_LAYERNORM, .x_dtype = LNORM_DTYPE_F32, .rows = 64, .hidden = 1024};
    int ok, limited = limited_wave(3, d->tcp_url, g, &c, "max-inflight-bytes", &ok);
    CHECK(ok == 2 && limited == 1, "%d OK, %d over the byte budget (want 2, 1)", ok, limited);
    double held = td_wait_metric(d, "lnormd_in_flight_bytes", 0, 5000);
    CHECK(held == 0, "in-flight bytes back to 0: %g", held);
}

/* SIGTERM with requests in flight: every request answered, exit 0. */
static const char *const sigterm_args[] = {"--max-queue-delay-us", "400000", NULL};

static void test_sigterm(td_daemon *d, lnorm_rng *g)
{
    enum { N = 32 };
    static worker ws[N];
    start_random_workers(ws, N, d, g);
    /* Wait until every request is inside the daemon, then SIGTERM. */
    double q = td_wait_metric(d, "lnormd_requests_in_flight", N, 5000);
    CHECK(q == N, "in flight before SIGTERM: %g", q);
    td_signal(d, SIGTERM);
    join_workers(ws, N);
    int answered = check_workers(ws, N, "in-flight request");
    CHECK(answered == N, "%d of %d in-flight requests answered correctly", answered, N);
    td_check_exit0(d, td_stop(d, 0, 20000), "on SIGTERM with requests in flight");
    free_workers(ws, N);
}

/* ------------------------------------------------------------------ */

static Lnorm__V1__Response *reg(nng_socket s, const char *id, int dtype, uint64_t hidden, const void *g, size_t glen,
                                const void *b, size_t blen)
{
    Lnorm__V1__Request req = LNORM__V1__REQUEST__INIT;
    Lnorm__V1__RegisterParamsRequest rp = LNORM__V1__REGISTER_PARAMS_REQUEST__INIT;
    rp.params_id = (char *)id;
    rp.dtype = (Lnorm__V1__DType)dtype;
    rp.hidden = hidden;
    rp.gamma.data = (uint8_t *)g;
    rp.gamma.len = glen;
    rp.beta.data = (uint8_t *)b;
    rp.beta.len = blen;
    req.request_id = 77;
    req.body_case = LNORM__V1__REQUEST__BODY_REGISTER_PARAMS;
    req.register_params = &rp;
    return ts_call(s, &req);
}

static int drop(nng_socket s, const char *id)
{
    Lnorm__V1__Request req = LNORM__V1__REQUEST__INIT;
    Lnorm__V1__DropParamsRequest dp = LNORM__V1__DROP_PARAMS_REQUEST__INIT;
    dp.params_id = (char *)id;
    req.body_case = LNORM__V1__REQUEST__BODY_DROP_PARAMS;
    req.drop_params = &dp;
    Lnorm__V1__Response *r = ts_call(s, &req);
    int c = ts_code(r);
    if (r)
        lnorm__v1__response__free_unpacked(r, NULL);
    return c;
}

static int code_free(Lnorm__V1__Response *r)
{
    int c = ts_code(r);
    if (r)
        lnorm__v1__response__free_unpacked(r, NULL);
    return c;
}

static const char *const params_args[] = {"--max-params-bytes", "20000", NULL};

static void test_params(td_daemon *d, lnorm_rng *g)
{
    nng_socket s;
    if (ts_dial(&s, d->tcp_url) != 0)
        return;
    lnorm_test_case tc;
    make_case(&tc, g, LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16, LNORM_DTYPE_BF16, LNORM_DTYPE_F32, 5, 1000, 1, 1, 1, 1, 0, 0);
    size_t pb = 1000 * 4;
    CHECK(code_free(reg(s, "layer.0:ln-1", LNORM_DTYPE_F32, 1000, tc.gamma, pb, tc.beta, pb)) == 0, "register");
    CHECK(code_free(reg(s, "layer.0:ln-1", LNORM_DTYPE_F32, 1000, tc.gamma, pb, tc.beta, pb)) == 6,
          "re-register: ALREADY_EXISTS");
    static uint8_t big[8000];
    lnorm_test_fill(g, big, LNORM_DTYPE_F32, 2000, 1, 0.1);
    CHECK(code_free(reg(s, "big", LNORM_DTYPE_F32, 2000, big, 8000, big, 8000)) == 8,
          "over max-params-bytes: RESOURCE_EXHAUSTED");
    CHECK(code_free(reg(s, "bad", LNORM_DTYPE_F32, 1000, tc.gamma, 12, NULL, 0)) == 3, "bad gamma size");
    CHECK(code_free(reg(s, "", LNORM_DTYPE_F32, 1000, tc.gamma, pb, NULL, 0)) == 3, "empty id");
    CHECK(code_free(reg(s, "x", 5, 1000, tc.gamma, pb, NULL, 0)) == 3, "unknown dtype");
    /* gamma + beta of 4000 bytes each, and 256 bytes of bookkeeping (docs/protocol.md) */
    CHECK(td_metric(d, "lnormd_params_bytes") == 8000 + 256, "params bytes gauge");

    /* By id == inline, bit for bit, and both right. */
    ts_norm byid, inl;
    ts_norm_from_case(&byid, &tc, 1, 0);
    byid.aff.params_id = "layer.0:ln-1";
    byid.n.affine = &byid.aff;
    ts_norm_from_case(&inl, &tc, 2, 1);
    Lnorm__V1__Response *r1 = ts_call(s, &byid.req), *r2 = ts_call(s, &inl.req);
    CHECK(ts_check_reply(&tc, r1, "by params id") == 0, "by id");
    CHECK(ts_check_reply(&tc, r2, "inline params") == 0, "inline");
    CHECK(r1 && r2 && r1->normalize && r2->normalize && r1->normalize->y.len == r2->normalize->y.len &&
              !memcmp(r1->normalize->y.data, r2->normalize->y.data, r1->normalize->y.len),
          "by id and inline agree");
    code_free(r1);
    code_free(r2);
    /* Wrong hidden for the id. */
    lnorm_test_case other;
    make_case(&other, g, LNORM_OP_RMSNORM, LNORM_DTYPE_F32, LNORM_DTYPE_F32, LNORM_DTYPE_F32, 2, 64, 0, 0, 0, 0, 0, 0);
    ts_norm wrong;
    ts_norm_from_case(&wrong, &other, 3, 0);
    wrong.aff.params_id = "layer.0:ln-1";
    wrong.n.affine = &wrong.aff;
    expect(s, &wrong.req, 3, "hidden", "params hidden mismatch");
    lnorm_test_case_free(&other);

    CHECK(drop(s, "layer.0:ln-1") == 0, "drop");
    CHECK(drop(s, "layer.0:ln-1") == 5, "drop again: NOT_FOUND");
    expect(s, &byid.req, 5, "not registered", "normalize with a dropped id");
    /* A request that used the id releases it just after its reply: poll. */
    double pb0 = td_wait_metric(d, "lnormd_params_bytes", 0, 5000);
    CHECK(pb0 == 0, "params memory freed after drop: %g", pb0);
    /* Re-register after drop works (replace = drop + register). */
    CHECK(code_free(reg(s, "layer.0:ln-1", LNORM_DTYPE_F32, 1000, tc.gamma, pb, tc.beta, pb)) == 0, "register again");
    lnorm_test_case_free(&tc);
    nng_close(s);
}

/* A drop while requests using the id wait in the queue: they still compute right. */
typedef struct drop_ctx {
    const char *url;
} drop_ctx;

static const char *const params_drop_inflight_args[] = {"--max-queue-delay-us", "300000", NULL};

static void test_params_drop_inflight(td_daemon *d, lnorm_rng *g)
{
    nng_socket s;
    if (ts_dial(&s, d->ipc_url) != 0)
        return;
    enum { N = 8 };
    static worker ws[N];
    for (int i = 0; i < N; i++) {
        make_case(&ws[i].tc, g, LNORM_OP_RMSNORM, LNORM_DTYPE_F16, LNORM_DTYPE_F32, LNORM_DTYPE_F16, 3, 200, 1, 1, 0, 0, 0, 0);
        if (i > 0) { /* same params for every request */
            memcpy(ws[i].tc.gamma, ws[0].tc.gamma, 400);
            memcpy(ws[i].tc.beta, ws[0].tc.beta, 400);
        }
        ws[i].url = d->tcp_url;
        ts_norm_from_case(&ws[i].m, &ws[i].tc, (uint64_t)i + 1, 0);
        ws[i].m.aff.params_id = "shared";
        ws[i].m.n.affine = &ws[i].m.aff;
    }
    CHECK(code_free(reg(s, "shared", LNORM_DTYPE_F16, 200, ws[0].tc.gamma, 400, ws[0].tc.beta, 400)) == 0, "register");
    start_workers(ws, N);
    double q = td_wait_metric(d, "lnormd_queue_depth", N, 5000);
    CHECK(q == N, "queued before the drop: %g", q);
    CHECK(drop(s, "shared") == 0, "drop while queued");
    join_workers(ws, N);
    check_workers(ws, N, "request after the drop");
    /* Replies go out just before the requests release the params: poll. */
    double pbytes = td_wait_metric(d, "lnormd_params_bytes", 0, 5000);
    CHECK(pbytes == 0, "memory freed once the batch finished: %g", pbytes);
    free_workers(ws, N);
    nng_close(s);
}

static const char *const health_info_args[] = {"--max-rows",  "777", "--max-batch-rows",     "333", "--max-queue", "55",  "--max-inflight-bytes", "123456789", NULL};

static void test_health_info(td_daemon *d, lnorm_rng *g)
{
    (void)g;
    nng_socket s;
    if (ts_dial(&s, d->ipc_url) != 0)
        return;
    Lnorm__V1__Request req = LNORM__V1__REQUEST__INIT;
    Lnorm__V1__HealthRequest hr = LNORM__V1__HEALTH_REQUEST__INIT;
    req.request_id = 5;
    req.body_case = LNORM__V1__REQUEST__BODY_HEALTH;
    req.health = &hr;
    Lnorm__V1__Response *r = ts_call(s, &req);
    CHECK(r && ts_code(r) == 0 && r->body_case == LNORM__V1__RESPONSE__BODY_HEALTH && r->health->serving &&
              r->request_id == 5,
          "health");
    code_free(r);
    Lnorm__V1__InfoRequest ir = LNORM__V1__INFO_REQUEST__INIT;
    req.request_id = 6;
    req.body_case = LNORM__V1__REQUEST__BODY_INFO;
    req.info = &ir;
    r = ts_call(s, &req);
    CHECK(r && ts_code(r) == 0 && r->body_case == LNORM__V1__RESPONSE__BODY_INFO, "info");
    if (r && r->body_case == LNORM__V1__RESPONSE__BODY_INFO) {
        Lnorm__V1__InfoResponse *in = r->info;
        CHECK(in->version && strlen(in->version) > 0, "version");
        CHECK(in->n_backends >= 1 && !strcmp(in->backends[0], "cpu"), "backends (no GPU here: cpu)");
        CHECK(in->n_devices >= 1 && !strcmp(in->devices[0]->backend, "cpu"), "devices");
        CHECK(in->limits && in->limits->max_rows == 777 && in->limits->max_batch_rows == 333 &&
                  in->limits->max_queue_requests == 55 && in->limits->max_inflight_bytes == 123456789,
              "limits as configured");
    }
    code_free(r);
    /* The ipc socket is not world-writable. */
    struct stat sb;
    CHECK(stat(d->ipc_url + 6, &sb) == 0 && S_ISSOCK(sb.st_mode) && !(sb.st_mode & 0002),
          "ipc socket mode %o", (unsigned)sb.st_mode);
    /* HTTP endpoints. */
    int st = 0;
    char *b = td_http_get(d, "/healthz", &st);
    CHECK(b && st == 200, "/healthz %d", st);
    free(b);
    b = td_http_get(d, "/readyz", &st);
    CHECK(b && st == 200, "/readyz %d", st);
    free(b);
    b = td_http_get(d, "/metrics", &st);
    CHECK(b && st == 200 && strstr(b, "# TYPE lnormd_batch_requests histogram") && strstr(b, "lnormd_batches_total ") &&
              strstr(b, "lnormd_requests_total{status=\"OK\"} 2"),
          "/metrics content");
    free(b);
    b = td_http_get(d, "/nope", &st);
    CHECK(st == 404, "unknown path: %d", st);
    free(b);
    nng_close(s);
}

/* ------------------------------------------------------------------ */

static void test_config(td_daemon *none, lnorm_rng *g)
{
    (void)none;
    (void)g;
    char out[16384];
    static const char *const help[] = {"--help", NULL};
    CHECK(td_run(lnormd, help, out, sizeof out) == 0 && strstr(out, "--max-batch-rows") && strstr(out, "--tls-cert"),
          "--help");
    static const char *const ver[] = {"--version", NULL};
    CHECK(td_run(lnormd, ver, out, sizeof out) == 0 && strstr(out, "lnormd "), "--version");
    static const char *const bad[][6] = {
        {"--no-such-flag", NULL},
        {"--max-rows", "0", NULL},
        {"--max-rows", "abc", NULL},
        {"--max-rows", "-5", NULL},
        {"--max-rows", "0x10", NULL}, /* numbers are decimal */
        {"--log-level", "loud", NULL},
        {"--backend", "tpu", NULL},
        {"--max-rows", NULL},
        {"--listen", "udp://127.0.0.1:1", NULL},
        {"--listen", "tls+tcp://127.0.0.1:0", NULL},
        {"--config", "/nonexistent/lnormd.conf", NULL},
        {"--http", "nonsense", "--ready-file", "/dev/null", NULL},
        {"stray", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = td_run(lnormd, bad[i], out, sizeof out);
        CHECK(rc == 2 && strlen(out) > 0, "bad config %zu (%s %s): exit %d, output '%s'", i, bad[i][0],
              bad[i][1] ? bad[i][1] : "", rc, out);
    }
    /* A config file: bad key / bad value exit 2; a good one is used, flags win. */
    char path[300];
    if (td_tmpfile(path, sizeof path, "cfg", "lnormd.conf") != 0)
        return;
    FILE *f = fopen(path, "w");
    fprintf(f, "# comment\nmax-rows = 10\nbogus-key = 1\n");
    fclose(f);
    const char *a1[] = {"--config", path, NULL};
    CHECK(td_run(lnormd, a1, out, sizeof out) == 2 && strstr(out, "bogus-key"), "unknown key: %s", out);
    f = fopen(path, "w");
    fprintf(f, "max-rows = many\n");
    fclose(f);
    CHECK(td_run(lnormd, a1, out, sizeof out) == 2 && strstr(out, "max-rows"), "bad value: %s", out);
    /* A line too long for the reader is an error, never read in two parts
     * (the tail here would be a valid setting). */
    f = fopen(path, "w");
    fputc('#', f);
    for (int i = 0; i < 5000; i++)
        fputc('x', f);
    fprintf(f, " max-rows = 7\n");
    fclose(f);
    CHECK(td_run(lnormd, a1, out, sizeof out) == 2 && strstr(out, "line longer than"), "long line: %s", out);
    f = fopen(path, "w");
    fprintf(f, "# lnormd test config\nmax-rows = 10\nmax-hidden = 2048\n\nlog-level = warn\n");
    fclose(f);
    const char *a2[] = {"--config", path, "--max-rows", "020", "--max-batch-rows", "16", NULL};
    td_daemon d;
    if (start(&d, a2) == 0) {
        nng_socket s;
        if (ts_dial(&s, d.tcp_url) == 0) {
            Lnorm__V1__Request req = LNORM__V1__REQUEST__INIT;
            Lnorm__V1__InfoRequest ir = LNORM__V1__INFO_REQUEST__INIT;
            req.body_case = LNORM__V1__REQUEST__BODY_INFO;
            req.info = &ir;
            Lnorm__V1__Response *r = ts_call(s, &req);
            CHECK(r && r->body_case == LNORM__V1__RESPONSE__BODY_INFO && r->info->limits->max_rows == 20 &&
                      r->info->limits->max_hidden == 2048 && r->info->limits->max_batch_rows == 16,
                  "file + flag override (020 read as twenty)");
            code_free(r);
            /* SIGHUP with the file changed: the daemon keeps serving. */
            f = fopen(path, "w");
            fprintf(f, "max-rows = 10\nmax-queue-delay-us = 1000\n");
            fclose(f);
            td_signal(&d, SIGHUP);
            CHECK(td_wait_log(&d, "SIGHUP: reloaded", 5000) && td_wait_log(&d, "max-queue-delay-us 1000", 5000), "SIGHUP reload logged");
            /* the flag --max-batch-rows 16 still overrides the file's default */
            CHECK(td_wait_log(&d, "max-queue-delay-us 1000, max-batch-rows 16,", 5000), "SIGHUP keeps the command line's flags");
            r = ts_call(s, &req);
            CHECK(r && ts_code(r) == 0, "serving after SIGHUP");
            code_free(r);
            /* A broken file on SIGHUP: logged, the running configuration kept. */
            f = fopen(path, "w");
            fprintf(f, "max-rows = -3\n");
            fclose(f);
            td_signal(&d, SIGHUP);
            CHECK(td_wait_log(&d, "reload failed", 5000), "failed reload logged");
            r = ts_call(s, &req);
            CHECK(r && ts_code(r) == 0, "serving after a failed reload");
            code_free(r);
            nng_close(s);
        }
        td_stop_check(&d, "on SIGTERM");
    }
}

/* tls+tcp:// with a server certificate, then with client verification. */
static const char *gen_certs;

static void test_tls(td_daemon *none, lnorm_rng *g)
{
    (void)none;
    char dir[256];
    if (!gen_certs || td_tmpdir(dir, sizeof dir, "tls") != 0) {
        CHECK_FAIL("no certificate script or no temporary folder");
        return;
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "bash '%s' '%s'", gen_certs, dir);
    if (system(cmd) != 0) {
        CHECK_FAIL("%s failed", cmd);
        return;
    }
    char ca[300], scrt[300], skey[300], ccrt[300], ckey[300], rcrt[300], rkey[300];
    snprintf(ca, sizeof ca, "%s/ca.crt", dir);
    snprintf(scrt, sizeof scrt, "%s/server.crt", dir);
    snprintf(skey, sizeof skey, "%s/server.key", dir);
    snprintf(ccrt, sizeof ccrt, "%s/client.crt", dir);
    snprintf(ckey, sizeof ckey, "%s/client.key", dir);
    snprintf(rcrt, sizeof rcrt, "%s/rogue.crt", dir);
    snprintf(rkey, sizeof rkey, "%s/rogue.key", dir);
    for (int verify = 0; verify <= 1; verify++) {
        const char *args[] = {"--listen", "tls+tcp://127.0.0.1:0", "--tls-cert", scrt, "--tls-key", skey,
                              verify ? "--tls-ca" : NULL, ca, "--tls-verify-peer", NULL};
        td_daemon d;
        if (start(&d, args) != 0)
            continue;
        CHECK(d.tls_url[0], "no tls+tcp:// listener in the ready file");
        nng_socket s;
        if (ts_dial_tls(&s, d.tls_url, ca, verify ? ccrt : NULL, verify ? ckey : NULL, 20000) == 0) {
            valid_roundtrip(s, g, verify ? "tls with client cert" : "tls");
            nng_close(s);
        } else {
            CHECK_FAIL("tls dial (verify %d)", verify);
        }
        if (verify) {
            /* No client certificate, or one from a CA nobody trusts: no service. */
            for (int k = 0; k < 2; k++) {
                nng_socket bad;
                if (ts_dial_tls(&bad, d.tls_url, ca, k ? rcrt : NULL, k ? rkey : NULL, 1500) == 0) {
                    lnorm_test_case tc;
                    random_case(&tc, g);
                    ts_norm m;
                    ts_norm_from_case(&m, &tc, 1, 1);
                    Lnorm__V1__Response *r = ts_call(bad, &m.req);
                    CHECK(r == NULL, "served a client %s", k ? "with a rogue certificate" : "without a certificate");
                    if (r)
                        lnorm__v1__response__free_unpacked(r, NULL);
                    lnorm_test_case_free(&tc);
                    nng_close(bad);
                }
            }
        }
        td_stop_check(&d, "on SIGTERM");
    }
}

/* deploy/lnormd.conf documents every key of --help, and with every
 * documented default uncommented it is a valid config file. */
static const char *deploy_conf;

static void test_deploy_conf(td_daemon *none, lnorm_rng *g)
{
    (void)none;
    (void)g;
    char help[16384];
    static const char *const hargs[] = {"--help", NULL};
    FILE *f = deploy_conf ? fopen(deploy_conf, "r") : NULL;
    if (!f || td_run(lnormd, hargs, help, sizeof help) != 0) {
        CHECK_FAIL("no deploy/lnormd.conf, or lnormd --help failed");
        if (f)
            fclose(f);
        return;
    }
    static char conf[65536];
    size_t n = fread(conf, 1, sizeof conf - 1, f);
    conf[n] = 0;
    fclose(f);
    /* Every "--key" of --help appears as "# key =" in the file. */
    int keys = 0;
    for (char *p = strstr(help, "\n  --"); p; p = strstr(p + 1, "\n  --")) {
        char key[64];
        if (sscanf(p + 5, "%63[a-z0-9-]", key) != 1 || !strcmp(key, "help") || !strcmp(key, "version") ||
            !strcmp(key, "config"))
            continue;
        char needle[80];
        snprintf(needle, sizeof needle, "# %s =", key);
        CHECK(strstr(conf, needle) != NULL, "deploy/lnormd.conf does not document '%s'", key);
        keys++;
    }
    CHECK(keys >= 20, "only %d keys found in --help", keys);
    /* Uncomment every default (not listen: the harness gives its own). */
    char path[300];
    if (td_tmpfile(path, sizeof path, "conf", "all.conf") != 0)
        return;
    FILE *o = fopen(path, "w");
    int lines = 0;
    for (char *line = strtok(conf, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strncmp(line, "# ", 2) && strstr(line, " = ") && strncmp(line, "# listen", 8) &&
            strspn(line + 2, "abcdefghijklmnopqrstuvwxyz-") == (size_t)(strstr(line, " = ") - line - 2)) {
            fprintf(o, "%s\n", line + 2);
            lines++;
        }
    }
    fclose(o);
    CHECK(lines >= 15, "only %d defaults uncommented", lines);
    const char *args[] = {"--config", path, NULL};
    td_daemon d;
    if (start(&d, args) == 0)
        td_stop_check(&d, "with every documented default, on SIGTERM");
}

/* --workers 2: both workers listen (ipc PATH and PATH.1) and answer; a
 * worker killed with SIGKILL is started again by the supervisor and
 * serves; SIGTERM (main) drains both and the supervisor exits 0. */
static const char *const workers_args[] = {"--workers", "2", "--backend", "cpu", NULL};

/* The processes whose parent is pid (at most max). */
static int children_of(pid_t pid, pid_t *out, int max)
{
    int n = 0;
    DIR *dir = opendir("/proc");
    struct dirent *e;
    while (dir && (e = readdir(dir)) && n < max) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%.20s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = '\0';
        char *p = strrchr(buf, ')');
        int ppid;
        if (p && sscanf(p + 2, "%*c %d", &ppid) == 1 && ppid == (int)pid)
            out[n++] = (pid_t)atoi(e->d_name);
    }
    if (dir)
        closedir(dir);
    return n;
}

/* A valid round trip on url, dialing again for up to 10 s while it is not
 * listening yet. */
static void workers_roundtrip(const char *url, lnorm_rng *g, const char *after)
{
    nng_socket s;
    int rv = -1;
    for (int i = 0; i < 200 && (rv = ts_dial(&s, url)) != 0; i++)
        td_sleep_ms(50);
    CHECK(rv == 0, "%s: cannot dial %s", after, url);
    if (rv != 0)
        return;
    valid_roundtrip(s, g, after);
    nng_close(s);
}

static void test_workers(td_daemon *d, lnorm_rng *g)
{
    char ipc1[340];
    snprintf(ipc1, sizeof ipc1, "%s.1", d->ipc_url);
    int has1 = 0;
    for (int i = 0; i < d->nlisten; i++)
        has1 |= !strcmp(d->listen[i], ipc1);
    CHECK(d->nlisten == 4 && has1, "ready file: %d listen lines, %s %s (want ipc and tcp of 2 workers)", d->nlisten,
          ipc1, has1 ? "listed" : "missing");
    workers_roundtrip(d->ipc_url, g, "worker 0");
    workers_roundtrip(ipc1, g, "worker 1");
    pid_t kids[8];
    int n = children_of(d->pid, kids, 8);
    CHECK_EQ_INT(n, 2, "worker processes under the supervisor");
    if (n < 1)
        return;
    kill(kids[0], SIGKILL);
    int back = 0;
    for (int i = 0; i < 200 && !back; i++) {
        td_sleep_ms(50);
        pid_t now[8];
        int m = children_of(d->pid, now, 8);
        for (int k = 0; k < m; k++)
            back |= m == 2 && now[k] != kids[0] && (n < 2 || now[k] != kids[1]);
    }
    CHECK(back, "the killed worker was not started again within 10 s");
    workers_roundtrip(d->ipc_url, g, "a worker restarted");
    workers_roundtrip(ipc1, g, "a worker restarted");
}

int main(int argc, char **argv)
{
    if (argc == 4)
        gen_certs = deploy_conf = argv[3];
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s LNORMD TEST\n", argv[0]);
        return 2;
    }
    lnormd = argv[1];
    td_watchdog(120);
    /* daemon 1: main starts lnormd with args before the test and stops it
     * after (exit status 0 checked); 0: the test runs its own. seed: its
     * data's (0: none). */
    static const struct {
        const char *name;
        void (*fn)(td_daemon *d, lnorm_rng *g);
        const char *const *args;
        int daemon;
        uint64_t seed;
    } tests[] = {
        {"normalize", test_normalize, NULL, 1, 1},
        {"batching", test_batching, batching_args, 1, 42},
        {"invariance", test_invariance, NULL, 0, 7},
        {"malformed", test_malformed, malformed_args, 1, 3},
        {"deadline", test_deadline, deadline_args, 1, 11},
        {"queue_full", test_queue_full, queue_full_args, 1, 13},
        {"contexts", test_contexts, contexts_args, 1, 37},
        {"inflight_bytes", test_inflight_bytes, inflight_bytes_args, 1, 31},
        {"sigterm", test_sigterm, sigterm_args, 1, 17},
        {"params", test_params, params_args, 1, 19},
        {"params_drop_inflight", test_params_drop_inflight, params_drop_inflight_args, 1, 23},
        {"health_info", test_health_info, health_info_args, 1, 0},
        {"config", test_config, NULL, 0, 0},
        {"tls", test_tls, NULL, 0, 29},
        {"deploy_conf", test_deploy_conf, NULL, 0, 0},
        {"workers", test_workers, workers_args, 1, 43},
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (strcmp(argv[2], tests[i].name))
            continue;
        lnorm_rng g;
        lnorm_rng_seed(&g, tests[i].seed ? lnorm_test_seed(tests[i].seed) : 0);
        td_daemon d;
        if (!tests[i].daemon) {
            tests[i].fn(NULL, &g);
        } else if (start(&d, tests[i].args) == 0) {
            tests[i].fn(&d, &g);
            td_stop_check(&d, "on SIGTERM");
        }
        char name[64];
        snprintf(name, sizeof name, "server.%s", argv[2]);
        return check_finish(name);
    }
    fprintf(stderr, "unknown test %s\n", argv[2]);
    return 2;
}
