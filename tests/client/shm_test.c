/*
 * Shared memory between liblnorm and a real lnormd (CPU backend, started
 * with --allow-shm): regions, requests by reference, submission rings, and
 * what a client may not do (docs/shm.md).
 *
 *   shm_test LNORMD_PATH regions|ring|faults
 *
 * regions  every op / dtype / option by reference against float64, outputs
 *          poisoned first; a request large enough to be split into chunks;
 *          unregister; errors of offsets and sizes.
 * ring     many descriptors through a ring, each reply checked against
 *          float64; bad descriptors answered with an error while the ring
 *          goes on; a full ring refuses more; four processes with a ring
 *          each at once.
 * faults   refused: without allow-shm, over tcp://, an unsealed memfd, a
 *          size that is not the memfd's, another process's region; a sealed
 *          region cannot shrink; a ring whose tail is garbage stops alone; a
 *          client killed with requests in its ring costs the others nothing
 *          and its regions go.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "check.h"
#include "lnorm.pb-c.h"
#include "lnorm/lnorm.h"
#include "lnorm/ring.h"
#include "testcase.h"
#include "testdaemon.h"
#include "testutil.h"

static td_daemon daemon_;
static const char *lnormd_path;
static const char *self_path; /* this test, for child processes (NNG is not fork-safe: they exec) */

/* Run this test again as a child: shm_test - CHILD ARGS... */
static pid_t spawn_child(const char *const *args)
{
    const char *argv[12] = {self_path, "-"};
    int n = 2;
    for (int i = 0; args[i] && n < 11; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        execv(self_path, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static lnorm_client *open_client_auto(const char *url, size_t auto_shm_bytes)
{
    lnorm_client *c = NULL;
    lnorm_client_opts o;
    lnorm_client_opts_init(&o);
    o.recv_timeout_ms = 20000;
    o.auto_shm_bytes = auto_shm_bytes;
    int rv = lnorm_client_open(&c, &url, 1, &o);
    CHECK(rv == LNORM_OK, "open %s: %s", url, lnorm_strerror(rv));
    return c;
}

static lnorm_client *open_client(const char *url)
{
    return open_client_auto(url, 0);
}

/* ---- a test case laid out in a region ----------------------------------------- */

typedef struct placed {
    lnorm_test_case tc;      /* the inputs (malloc'ed) */
    lnorm_segment seg;       /* the same tensors inside the region */
} placed;

static void *put(unsigned char *base, size_t *off, size_t cap, const void *src, size_t n, int poison)
{
    if (!n)
        return NULL;
    size_t o = (*off + 63) & ~(size_t)63;
    if (o + n > cap)
        return NULL;
    *off = o + n;
    if (poison)
        lnorm_test_poison(base + o, n);
    else
        memcpy(base + o, src, n);
    return base + o;
}

/* Build case cfg and copy it into the region at *off (outputs poisoned). */
static int place(placed *p, const lnorm_test_case_cfg *cfg, lnorm_rng *g, lnorm_shm *s, size_t *off)
{
    if (lnorm_test_case_make(&p->tc, cfg, g) != LNORM_OK)
        return -1;
    unsigned char *b = lnorm_shm_data(s);
    size_t cap = lnorm_shm_size(s);
    const lnorm_segment *t = &p->tc.seg;
    size_t pb = (size_t)t->hidden * lnorm_dtype_size(t->param_dtype), sb = (size_t)t->rows * 4;
    p->seg = *t;
    p->seg.x = put(b, off, cap, p->tc.x, p->tc.x_bytes, 0);
    p->seg.y = put(b, off, cap, NULL, p->tc.y_bytes, 1);
    p->seg.residual = t->residual ? put(b, off, cap, p->tc.residual, p->tc.res_bytes, 0) : NULL;
    p->seg.residual_out = t->residual ? put(b, off, cap, NULL, p->tc.res_bytes, 1) : NULL;
    p->seg.gamma = t->gamma ? put(b, off, cap, t->gamma, pb, 0) : NULL;
    p->seg.beta = t->beta ? put(b, off, cap, t->beta, pb, 0) : NULL;
    p->seg.mean = t->mean ? put(b, off, cap, NULL, sb, 1) : NULL;
    p->seg.rstd = t->rstd ? put(b, off, cap, NULL, sb, 1) : NULL;
    if (!p->seg.x || !p->seg.y || (t->residual && !p->seg.residual_out) || (t->rstd && !p->seg.rstd)) {
        lnorm_test_case_free(&p->tc);
        return -1;
    }
    return 0;
}

static void req_of(lnorm_normalize_req *q, const lnorm_segment *s)
{
    lnorm_normalize_req_init(q, (lnorm_op)s->op, (lnorm_dtype)s->x_dtype, (uint64_t)s->rows, (uint64_t)s->hidden);
    q->y_dtype = (lnorm_dtype)s->y_dtype;
    q->param_dtype = (lnorm_dtype)s->param_dtype;
    q->eps = s->eps;
    q->eps_mode = (lnorm_eps_mode)s->eps_mode;
    q->x = s->x;
    q->residual = s->residual;
    q->residual_out = s->residual_out;
    q->gamma = s->gamma;
    q->beta = s->beta;
    q->y = s->y;
    q->mean = s->mean;
    q->rstd = s->rstd;
    q->want_stats = s->rstd != NULL;
}

static void random_cfg(lnorm_rng *g, lnorm_test_case_cfg *c, int64_t max_rows)
{
    static const int64_t hs[] = {1, 7, 64, 100, 1024, 3000, 4096};
    memset(c, 0, sizeof *c);
    c->op = lnorm_rng_next(g) % 2 ? LNORM_OP_LAYERNORM : LNORM_OP_RMSNORM;
    c->x_dtype = 1 + (int)(lnorm_rng_next(g) % 3);
    c->y_dtype = lnorm_rng_next(g) % 3 ? 0 : LNORM_DTYPE_F32;
    c->param_dtype = lnorm_rng_next(g) % 2 ? LNORM_DTYPE_F32 : 0;
    c->eps_mode = (int)(lnorm_rng_next(g) % 2);
    c->rows = 1 + (int64_t)(lnorm_rng_next(g) % (uint64_t)max_rows);
    c->hidden = hs[lnorm_rng_next(g) % (sizeof hs / sizeof hs[0])];
    c->gamma = (int)(lnorm_rng_next(g) % 2);
    c->beta = (int)(lnorm_rng_next(g) % 2);
    c->residual = lnorm_rng_next(g) % 3 == 0;
    c->stats = (int)(lnorm_rng_next(g) % 2);
    c->x_mean = lnorm_rng_next(g) % 4 == 0 ? 100.0 : 0.0;
}

/* ---- regions --------------------------------------------------------------------- */

static int test_regions(void)
{
    lnorm_client *c = open_client(daemon_.ipc_url);
    if (!c)
        return 1;
    lnorm_server_info info;
    CHECK(lnorm_info(c, &info, NULL) == LNORM_OK && info.shm == 1, "Info says shm is allowed over ipc");
    lnorm_result res;
    lnorm_shm *s = NULL;
    int rv = lnorm_shm_create(c, (size_t)160 << 20, &s, &res);
    CHECK(rv == LNORM_OK, "shm_create: %s: %s", lnorm_strerror(rv), res.message);
    if (rv != LNORM_OK) {
        lnorm_client_close(c);
        return 1;
    }
    lnorm_rng g;
    lnorm_rng_seed(&g, lnorm_test_seed(11));
    /* Every option, by reference. */
    for (int i = 0; i < 60; i++) {
        lnorm_test_case_cfg cfg;
        random_cfg(&g, &cfg, 40);
        placed p;
        size_t off = 0;
        if (place(&p, &cfg, &g, s, &off) != 0) {
            CHECK_FAIL("case %d: could not build", i);
            continue;
        }
        lnorm_normalize_req q;
        req_of(&q, &p.seg);
        rv = lnorm_normalize_shm(c, &q, &res);
        CHECK(rv == LNORM_OK, "case %d: %s: %s", i, lnorm_strerror(rv), res.message);
        if (rv == LNORM_OK) {
            /* The reference is of the region's tensors (the inputs copied there). */
            long bad = lnorm_test_check_segment(&p.seg, NULL, "shm");
            CHECK(bad == 0, "case %d: %ld elements off float64 (op %d x %d y %d rows %lld hidden %lld)", i, bad,
                  cfg.op, cfg.x_dtype, cfg.y_dtype, (long long)cfg.rows, (long long)cfg.hidden);
        }
        lnorm_test_case_free(&p.tc);
    }
    /* Large enough (64 MiB of x + y) for lnormd to split it into chunks. */
    {
        lnorm_test_case_cfg cfg = {0};
        cfg.op = LNORM_OP_LAYERNORM;
        cfg.x_dtype = LNORM_DTYPE_F32;
        cfg.rows = 4099;
        cfg.hidden = 4096;
        cfg.gamma = cfg.beta = cfg.stats = 1;
        placed p;
        size_t off = 0;
        CHECK(place(&p, &cfg, &g, s, &off) == 0, "large case built");
        lnorm_normalize_req q;
        req_of(&q, &p.seg);
        rv = lnorm_normalize_shm(c, &q, &res);
        CHECK(rv == LNORM_OK, "large: %s: %s", lnorm_strerror(rv), res.message);
        CHECK(lnorm_test_check_segment(&p.seg, NULL, "shm large") == 0, "large request vs float64");
        lnorm_test_case_free(&p.tc);
    }
    /* Errors the client sees before sending. */
    {
        float outside[64];
        lnorm_normalize_req q;
        lnorm_normalize_req_init(&q, LNORM_OP_RMSNORM, LNORM_DTYPE_F32, 1, 64);
        q.x = lnorm_shm_data(s);
        q.y = outside;
        rv = lnorm_normalize_shm(c, &q, &res);
        CHECK(rv == LNORM_EINVAL && strstr(res.message, "y is not inside"), "y outside every region: %s: %s",
              lnorm_strerror(rv), res.message);
    }
    rv = lnorm_shm_destroy(s, &res);
    CHECK(rv == LNORM_OK, "shm_destroy: %s", res.message);
    lnorm_client_close(c);
    return 0;
}

/* ---- raw exchanges (a request liblnorm would never build) ---------------------- */

static int raw_exchange(nng_socket sk, const Lnorm__V1__Request *req, char *msg, size_t msglen,
                        Lnorm__V1__Response **out)
{
    size_t n = lnorm__v1__request__get_packed_size(req);
    uint8_t *buf = malloc(n ? n : 1);
    lnorm__v1__request__pack(req, buf);
    int rv = nng_send(sk, buf, n, 0);
    free(buf);
    if (rv != 0)
        return -1;
    char *rb;
    size_t rn;
    if (nng_recv(sk, &rb, &rn, NNG_FLAG_ALLOC) != 0)
        return -1;
    Lnorm__V1__Response *resp = lnorm__v1__response__unpack(NULL, rn, (uint8_t *)rb);
    nng_free(rb, rn);
    if (!resp)
        return -1;
    int code = resp->status ? (int)resp->status->code : 0;
    snprintf(msg, msglen, "%s", resp->status && resp->status->message ? resp->status->message : "");
    if (out)
        *out = resp;
    else
        lnorm__v1__response__free_unpacked(resp, NULL);
    return code;
}

static int raw_open(nng_socket *sk, const char *url)
{
    if (nng_req0_open(sk) != 0)
        return -1;
    nng_socket_set_ms(*sk, NNG_OPT_RECVTIMEO, 10000);
    nng_socket_set_ms(*sk, NNG_OPT_SENDTIMEO, 10000);
    if (nng_dial(*sk, url, NULL, 0) != 0) {
        nng_close(*sk);
        return -1;
    }
    return 0;
}

/* Register memfd fd of `bytes` over sk: the status code; *id on success. */
static int raw_register(nng_socket sk, int fd, uint64_t bytes, uint64_t *id, char *msg, size_t n)
{
    Lnorm__V1__Request req = LNORM__V1__REQUEST__INIT;
    Lnorm__V1__RegisterRegionRequest reg = LNORM__V1__REGISTER_REGION_REQUEST__INIT;
    reg.fd = (uint32_t)fd;
    reg.bytes = bytes;
    req.request_id = 7;
    req.body_case = LNORM__V1__REQUEST__BODY_REGISTER_REGION;
    req.register_region = &reg;
    Lnorm__V1__Response *resp = NULL;
    int code = raw_exchange(sk, &req, msg, n, &resp);
    if (resp) {
        if (code == 0 && resp->body_case == LNORM__V1__RESPONSE__BODY_REGISTER_REGION && id)
            *id = resp->register_region->region;
        lnorm__v1__response__free_unpacked(resp, NULL);
    }
    return code;
}

/* A normalize of 1 x 64 f32 with x and y by reference to region id. */
static int raw_norm_ref(nng_socket sk, uint64_t id, uint64_t xoff, uint64_t yoff, char *msg, size_t n)
{
    Lnorm__V1__Request req = LNORM__V1__REQUEST__INIT;
    Lnorm__V1__NormalizeRequest nr = LNORM__V1__NORMALIZE_REQUEST__INIT;
    Lnorm__V1__ShmRef xr = LNORM__V1__SHM_REF__INIT, yr = LNORM__V1__SHM_REF__INIT;
    nr.op = LNORM__V1__OP__OP_RMS_NORM;
    nr.x_dtype = LNORM__V1__DTYPE__DTYPE_F32;
    nr.rows = 1;
    nr.hidden = 64;
    xr.region = yr.region = id;
    xr.offset = xoff;
    yr.offset = yoff;
    xr.bytes = yr.bytes = 256;
    nr.x_ref = &xr;
    nr.y_ref = &yr;
    req.request_id = 9;
    req.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE;
    req.normalize = &nr;
    return raw_exchange(sk, &req, msg, n, NULL);
}

static int sealed_memfd(size_t bytes, int seal)
{
    int fd = (int)syscall(SYS_memfd_create, "shm-test", 0x0001U | 0x0002U);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0)
        return -1;
    if (seal && fcntl(fd, 1033 /* F_ADD_SEALS */, 0x0002 /* F_SEAL_SHRINK */) != 0)
        return -1;
    return fd;
}

/* ---- ring -------------------------------------------------------------------------- */

static uint64_t off_of(const lnorm_shm *s, const void *p)
{
    return p ? (uint64_t)((const unsigned char *)p - (const unsigned char *)lnorm_shm_data(s)) : LNORM_RING_NONE;
}

static void sqe_of(lnorm_ring_sqe *q, const lnorm_shm *s, const lnorm_segment *g, uint64_t tag)
{
    memset(q, 0, sizeof *q);
    q->tag = tag;
    q->op = (uint8_t)g->op;
    q->x_dtype = (uint8_t)g->x_dtype;
    q->y_dtype = (uint8_t)g->y_dtype;
    q->param_dtype = (uint8_t)g->param_dtype;
    q->eps_mode = (uint8_t)g->eps_mode;
    q->eps = g->eps;
    q->want_stats = g->rstd != NULL;
    q->rows = (uint64_t)g->rows;
    q->hidden = (uint64_t)g->hidden;
    q->x = off_of(s, g->x);
    q->y = off_of(s, g->y);
    q->residual = off_of(s, g->residual);
    q->residual_out = off_of(s, g->residual_out);
    q->gamma = off_of(s, g->gamma);
    q->beta = off_of(s, g->beta);
    q->mean = off_of(s, g->mean);
    q->rstd = off_of(s, g->rstd);
}

/* One process's ring run: n random requests, up to depth in flight, each
 * in its own slot of the region; every completion is checked against
 * float64. Every 7th request is made invalid in one way (answered with an
 * error, the ring going on). Returns the failed checks. */
static int ring_run(const char *url, uint64_t seed, int n, int depth)
{
    int before = check_failures();
    lnorm_client *c = open_client(url);
    if (!c)
        return 1;
    lnorm_result res;
    lnorm_shm *s = NULL;
    const size_t slot_bytes = (size_t)1 << 20, first = (size_t)1 << 20;
    int rv = lnorm_shm_create(c, first + (size_t)depth * slot_bytes, &s, &res);
    CHECK(rv == LNORM_OK, "shm_create: %s", res.message);
    lnorm_ring *r = NULL;
    if (rv == LNORM_OK) {
        rv = lnorm_ring_attach(s, 0, 16, &r, &res);
        CHECK(rv == LNORM_OK, "ring_attach: %s", res.message);
    }
    if (rv != LNORM_OK) {
        lnorm_client_close(c);
        return 1;
    }
    lnorm_ring *r2;
    CHECK(lnorm_ring_attach(s, 0, 16, &r2, &res) == LNORM_EEXIST, "a second ring on the region is refused");
    lnorm_rng g;
    lnorm_rng_seed(&g, seed);
    placed *pl = calloc((size_t)depth, sizeof *pl);
    int *kind = calloc((size_t)depth, sizeof *kind); /* 0 free, 1 valid, 2 invalid */
    int sent = 0, done = 0, errors_seen = 0;
    while (done < n) {
        for (int k = 0; k < depth && sent < n; k++) {
            if (kind[k])
                continue;
            lnorm_test_case_cfg cfg;
            random_cfg(&g, &cfg, 8);
            if (cfg.rows * cfg.hidden > 8 * 4096)
                cfg.rows = 2;
            size_t off = first + (size_t)k * slot_bytes;
            if (place(&pl[k], &cfg, &g, s, &off) != 0) {
                CHECK_FAIL("request %d: could not build", sent);
                sent++, done++;
                continue;
            }
            lnorm_ring_sqe q;
            sqe_of(&q, s, &pl[k].seg, (uint64_t)k);
            kind[k] = 1;
            if (sent % 7 == 3) {
                switch ((sent / 7) % 4) {
                case 0: q.x = lnorm_shm_size(s) - 4; break;       /* past the region's end */
                case 1: q.reserved1 = 1; break;                    /* reserved not 0 */
                case 2: q.x_dtype = 9; break;                      /* no such dtype */
                default: q.y = LNORM_RING_NONE; break;             /* y missing */
                }
                kind[k] = 2;
            }
            CHECK(lnorm_ring_submit(r, &q, 1) == 1, "submit %d", sent);
            sent++;
        }
        lnorm_ring_cqe cq[16];
        int got = lnorm_ring_reap(r, cq, 16, 20000);
        CHECK(got > 0, "reap: a completion within 20 s (%d of %d done)", done, n);
        if (got <= 0)
            break;
        for (int i = 0; i < got; i++) {
            uint64_t k = cq[i].tag;
            if (k >= (uint64_t)depth || !kind[k]) {
                CHECK_FAIL("completion with unknown tag %llu", (unsigned long long)k);
                continue;
            }
            if (kind[k] == 2) {
                CHECK(cq[i].err == LNORM_EINVAL || cq[i].err == LNORM_ELIMIT,
                      "an invalid descriptor is answered INVALID_ARGUMENT: %d %s", cq[i].err, cq[i].message);
                CHECK(cq[i].message[0] != 0, "its message says why");
                errors_seen++;
            } else {
                CHECK(cq[i].err == LNORM_OK, "tag %llu: %s", (unsigned long long)k, cq[i].message);
                if (cq[i].err == LNORM_OK)
                    CHECK(lnorm_test_check_segment(&pl[k].seg, NULL, "ring") == 0, "ring reply vs float64");
                CHECK(cq[i].batch_rows >= (uint32_t)pl[k].seg.rows, "batch_rows %u covers the request",
                      cq[i].batch_rows);
            }
            lnorm_test_case_free(&pl[k].tc);
            kind[k] = 0;
            done++;
        }
    }
    CHECK(errors_seen > 0 || n < 7, "invalid descriptors were answered");
    CHECK_EQ_INT(lnorm_ring_outstanding(r), 0, "nothing left outstanding");
    for (int k = 0; k < depth; k++)
        if (kind[k])
            lnorm_test_case_free(&pl[k].tc);
    free(pl);
    free(kind);
    lnorm_shm_destroy(s, NULL);
    lnorm_client_close(c);
    return check_failures() - before;
}

/* A full ring takes no more; reaping makes room; then four processes with
 * a ring each at once. */
static int test_ring(void)
{
    ring_run(daemon_.ipc_url, lnorm_test_seed(5), 300, 12);
    {
        lnorm_client *c = open_client(daemon_.ipc_url);
        lnorm_shm *s = NULL;
        lnorm_ring *r = NULL;
        lnorm_result res;
        if (c && lnorm_shm_create(c, (size_t)1 << 20, &s, &res) == LNORM_OK &&
            lnorm_ring_attach(s, 0, 4, &r, &res) == LNORM_OK) {
            float *x = (float *)(void *)((unsigned char *)lnorm_shm_data(s) + 65536);
            for (int i = 0; i < 64; i++)
                x[i] = (float)i;
            lnorm_ring_sqe q[6];
            for (int i = 0; i < 6; i++) {
                memset(&q[i], 0, sizeof q[i]);
                q[i].tag = (uint64_t)i;
                q[i].op = LNORM_OP_RMSNORM;
                q[i].x_dtype = LNORM_DTYPE_F32;
                q[i].rows = 1;
                q[i].hidden = 64;
                q[i].x = 65536;
                q[i].y = 65536 + 4096 * (uint64_t)(i + 1);
                q[i].residual = q[i].residual_out = q[i].mean = q[i].rstd = q[i].gamma = q[i].beta = LNORM_RING_NONE;
            }
            CHECK_EQ_INT(lnorm_ring_submit(r, q, 6), 4, "a ring of 4 takes 4 of 6");
            lnorm_ring_cqe cq[4];
            int got = 0;
            for (int t = 0; t < 50 && got < 4; t++)
                got += lnorm_ring_reap(r, cq + got, 4 - got, 1000);
            CHECK_EQ_INT(got, 4, "four completions");
            CHECK_EQ_INT(lnorm_ring_submit(r, q + 4, 2), 2, "room again after reaping");
            got = 0;
            for (int t = 0; t < 50 && got < 2; t++)
                got += lnorm_ring_reap(r, cq + got, 2 - got, 1000);
            CHECK_EQ_INT(got, 2, "two more completions");
        } else {
            CHECK_FAIL("small ring: %s", res.message);
        }
        lnorm_shm_destroy(s, NULL);
        lnorm_client_close(c);
    }
    pid_t kids[4];
    for (int i = 0; i < 4; i++) {
        char seed[32];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)(lnorm_test_seed(5) + 100 + (uint64_t)i));
        const char *a[] = {"ring", daemon_.ipc_url, seed, NULL};
        kids[i] = spawn_child(a);
    }
    for (int i = 0; i < 4; i++) {
        int st = 0;
        waitpid(kids[i], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "ring process %d: status %d", i, st);
    }
    return 0;
}

/* ---- faults ------------------------------------------------------------------------- */

/* lnormd's gauge of registered regions (from /metrics), -1 if absent. */
static long metric_regions_of(const td_daemon *d)
{
    return (long)td_metric(d, "lnormd_shm_regions");
}

static long metric_regions(void)
{
    return metric_regions_of(&daemon_);
}

/* lnorm_normalize with auto_shm_bytes against daemon d (*on: whether d
 * allows shared memory): n random calls, every one checked against float64
 * on the caller's own buffers; regions registered by the client while it
 * is open only where allowed, none once it is closed. */
static void auto_calls(td_daemon *d, int on, int n, lnorm_rng *g)
{
    lnorm_client *c = open_client_auto(d->ipc_url, 1);
    if (!c)
        return;
    for (int i = 0; i < n; i++) {
        lnorm_test_case_cfg cfg;
        random_cfg(g, &cfg, 40);
        lnorm_test_case tc;
        if (lnorm_test_case_make(&tc, &cfg, g) != LNORM_OK) {
            CHECK_FAIL("auto case %d: could not build", i);
            continue;
        }
        lnorm_normalize_req q;
        req_of(&q, &tc.seg);
        lnorm_result res;
        int rv = lnorm_normalize(c, &q, &res);
        CHECK(rv == LNORM_OK, "auto case %d (shm %s): %s: %s", i, on ? "on" : "off", lnorm_strerror(rv),
              res.message);
        if (rv == LNORM_OK) {
            long bad = lnorm_test_check_segment(&tc.seg, NULL, "auto shm");
            CHECK(bad == 0, "auto case %d: %ld elements off float64 (op %d x %d rows %lld hidden %lld)", i, bad,
                  cfg.op, cfg.x_dtype, (long long)cfg.rows, (long long)cfg.hidden);
        }
        lnorm_test_case_free(&tc);
    }
    long held = metric_regions_of(d);
    if (on)
        CHECK(held >= 1 && held <= 4, "the client keeps 1..4 regions between calls (lnormd_shm_regions %ld)", held);
    else
        CHECK_EQ_INT(held, 0, "no region without allow-shm (lnormd_shm_regions)");
    lnorm_client_close(c);
    long left = -1;
    for (int k = 0; k < 100 && left != 0; k++) {
        left = metric_regions_of(d);
        if (left != 0)
            usleep(20000);
    }
    CHECK_EQ_INT(left, 0, "the client's regions dropped with its connection (lnormd_shm_regions)");
}

static int test_auto(const char *lnormd)
{
    lnorm_rng g;
    lnorm_rng_seed(&g, lnorm_test_seed(17));
    auto_calls(&daemon_, 1, 60, &g);
    /* Over the socket when the daemon does not allow shared memory. */
    td_daemon off;
    const char *args[] = {"--backend", "cpu", "--cpu-threads", "1", NULL};
    if (td_start(&off, lnormd, NULL, args, TD_ENDPOINTS) == 0) {
        auto_calls(&off, 0, 10, &g);
        td_stop_check(&off, "without allow-shm");
    }
    return 0;
}

static int test_faults(const char *lnormd)
{
    char msg[512];
    nng_socket sk;
    /* Over tcp:// there are no peer credentials: refused. */
    CHECK(raw_open(&sk, daemon_.tcp_url) == 0, "dial tcp");
    int fd = sealed_memfd(1 << 16, 1);
    CHECK(raw_register(sk, fd, 1 << 16, NULL, msg, sizeof msg) == 7 && strstr(msg, "ipc"),
          "register over tcp: PERMISSION_DENIED naming ipc: %s", msg);
    nng_close(sk);
    CHECK(raw_open(&sk, daemon_.ipc_url) == 0, "dial ipc");
    /* Not sealed against shrinking: refused (it could SIGBUS lnormd). */
    int ufd = sealed_memfd(1 << 16, 0);
    CHECK(raw_register(sk, ufd, 1 << 16, NULL, msg, sizeof msg) == 3 && strstr(msg, "F_SEAL_SHRINK"),
          "unsealed memfd: INVALID_ARGUMENT naming the seal: %s", msg);
    /* Not a memfd at all (a pipe), and a descriptor that does not exist. */
    int pf[2];
    CHECK(pipe(pf) == 0, "pipe");
    CHECK(raw_register(sk, pf[0], 1 << 16, NULL, msg, sizeof msg) == 3, "a pipe: INVALID_ARGUMENT: %s", msg);
    CHECK(raw_register(sk, 1000, 1 << 16, NULL, msg, sizeof msg) == 3, "no such descriptor: %s", msg);
    /* The size must be the memfd's. */
    CHECK(raw_register(sk, fd, 1 << 17, NULL, msg, sizeof msg) == 3 && strstr(msg, "bytes"),
          "size mismatch: INVALID_ARGUMENT: %s", msg);
    /* GPU memory (CUDA IPC) on a backend without GPU memory: refused. */
    {
        lnorm_client *c = open_client(daemon_.ipc_url);
        char handle[64] = {1};
        lnorm_shm *gs = NULL;
        lnorm_result res;
        int rv = lnorm_shm_register_cuda(c, handle, sizeof handle, 0, handle, 4096, &gs, &res);
        CHECK(rv == LNORM_ENOTSUP && strstr(res.message, "cpu"), "CUDA IPC on the cpu backend: ENOTSUP: %s: %s",
              lnorm_strerror(rv), res.message);
        rv = lnorm_shm_register_cuda(c, handle, 63, 0, handle, 4096, &gs, &res);
        CHECK(rv == LNORM_EINVAL, "a 63-byte handle is refused by the library");
        lnorm_client_close(c);
    }
    uint64_t id = 0;
    CHECK(raw_register(sk, fd, 1 << 16, &id, msg, sizeof msg) == 0 && id, "sealed memfd registered: %s", msg);
    CHECK(ftruncate(fd, 4096) != 0, "a sealed region cannot shrink under lnormd");
    /* Offsets and sizes checked against the region. */
    CHECK(raw_norm_ref(sk, id, 0, 4096, msg, sizeof msg) == 0, "in range: OK: %s", msg);
    CHECK(raw_norm_ref(sk, id, (1 << 16) - 128, 0, msg, sizeof msg) == 3 && strstr(msg, "outside"),
          "x past the end: INVALID_ARGUMENT: %s", msg);
    CHECK(raw_norm_ref(sk, id, 0, UINT64_MAX - 100, msg, sizeof msg) == 3, "y offset overflowing: %s", msg);
    CHECK(raw_norm_ref(sk, id, 2, 4096, msg, sizeof msg) == 3 && strstr(msg, "multiple"),
          "misaligned x: INVALID_ARGUMENT: %s", msg);
    CHECK(raw_norm_ref(sk, id + 1, 0, 4096, msg, sizeof msg) == 5, "unknown region: NOT_FOUND: %s", msg);
    /* Another process's region: its id is useless here. */
    int pp[2], cp[2]; /* parent to child, child to parent */
    CHECK(pipe(pp) == 0 && pipe(cp) == 0, "pipes");
    char fds[2][16];
    snprintf(fds[0], sizeof fds[0], "%d", pp[0]);
    snprintf(fds[1], sizeof fds[1], "%d", cp[1]);
    const char *oa[] = {"other", daemon_.ipc_url, fds[0], fds[1], NULL};
    pid_t kid = spawn_child(oa);
    uint64_t other = 0;
    CHECK(read(cp[0], &other, sizeof other) == (ssize_t)sizeof other && other, "the other process registered");
    CHECK(raw_norm_ref(sk, other, 0, 4096, msg, sizeof msg) == 5, "another process's region: NOT_FOUND: %s", msg);
    {
        Lnorm__V1__Request req = LNORM__V1__REQUEST__INIT;
        Lnorm__V1__UnregisterRegionRequest u = LNORM__V1__UNREGISTER_REGION_REQUEST__INIT;
        u.region = other;
        req.body_case = LNORM__V1__REQUEST__BODY_UNREGISTER_REGION;
        req.unregister_region = &u;
        CHECK(raw_exchange(sk, &req, msg, sizeof msg, NULL) == 5, "nor may it unregister it: %s", msg);
    }
    CHECK(write(pp[1], "x", 1) == 1, "release the other process");
    int st = 0;
    waitpid(kid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "other process: %d", st);
    nng_close(sk);
    close(fd);
    close(ufd);

    /* A ring whose tail the client wrote wrong stops, alone. A client
     * killed with requests in its ring costs the others nothing. */
    const char *ka[] = {"killed", daemon_.ipc_url, NULL};
    kid = spawn_child(ka);
    waitpid(kid, &st, 0);
    CHECK(WIFSIGNALED(st), "the ring client was killed");
    {
        lnorm_client *c = open_client(daemon_.ipc_url);
        lnorm_shm *s = NULL;
        lnorm_ring *r = NULL;
        lnorm_result res;
        if (c && lnorm_shm_create(c, (size_t)1 << 20, &s, &res) == LNORM_OK &&
            lnorm_ring_attach(s, 0, 8, &r, &res) == LNORM_OK) {
            lnorm_ring_hdr *h = lnorm_shm_data(s);
            __atomic_store_n(&h->sq_tail, 1000u, __ATOMIC_RELEASE); /* 1000 entries in a ring of 8 */
            syscall(SYS_futex, &h->sq_tail, 1 /* FUTEX_WAKE */, 1, NULL, NULL, 0);
            lnorm_ring_cqe cq;
            CHECK(lnorm_ring_reap(r, &cq, 1, 300) == 0, "a garbage tail gets nothing taken");
        } else {
            CHECK_FAIL("second ring: %s", res.message);
        }
        lnorm_shm_destroy(s, NULL);
        lnorm_client_close(c);
    }
    /* Others are served as before: a whole ring run. */
    CHECK(ring_run(daemon_.ipc_url, lnorm_test_seed(9), 60, 6) == 0, "a ring run after the faults");
    /* The killed and closed clients' regions went with their connections. */
    long left = -1;
    for (int t = 0; t < 100 && left != 0; t++) {
        left = metric_regions();
        if (left != 0)
            usleep(50000);
    }
    CHECK_EQ_INT(left, 0, "no region left registered (lnormd_shm_regions)");

    /* Without allow-shm (the default) nothing is accepted. */
    td_daemon off;
    const char *args[] = {"--backend", "cpu", "--cpu-threads", "1", NULL};
    if (td_start(&off, lnormd, NULL, args, TD_ENDPOINTS) == 0) {
        lnorm_client *c = open_client(off.ipc_url);
        lnorm_shm *s = NULL;
        lnorm_result res;
        lnorm_server_info info;
        CHECK(c && lnorm_info(c, &info, NULL) == LNORM_OK && info.shm == 0, "Info: shm not allowed");
        int rv = lnorm_shm_create(c, 1 << 16, &s, &res);
        CHECK(rv == LNORM_EPERM && strstr(res.message, "allow-shm"), "allow-shm off: EPERM naming it: %s: %s",
              lnorm_strerror(rv), res.message);
        lnorm_client_close(c);
        td_stop_check(&off, "without allow-shm");
    }
    return 0;
}

/* Child: registers a region, tells the parent its id on fd w, waits for
 * a byte on fd r. */
static int child_other(const char *url, int r, int w)
{
    char msg[256];
    nng_socket k2;
    uint64_t kid_id = 0;
    int kfd = sealed_memfd(1 << 16, 1);
    int code = -2;
    if (raw_open(&k2, url) != 0 || (code = raw_register(k2, kfd, 1 << 16, &kid_id, msg, sizeof msg)) != 0) {
        fprintf(stderr, "other process: register: %d %s\n", code, msg);
        return 1;
    }
    if (write(w, &kid_id, sizeof kid_id) != (ssize_t)sizeof kid_id)
        return 1;
    char b;
    return read(r, &b, 1) == 1 ? 0 : 1;
}

/* Child: fills its ring with large requests and dies with them in flight. */
static int child_killed(const char *url)
{
    lnorm_client *c = open_client(url);
    lnorm_shm *s = NULL;
    lnorm_ring *r = NULL;
    if (!c || lnorm_shm_create(c, (size_t)8 << 20, &s, NULL) != LNORM_OK ||
        lnorm_ring_attach(s, 0, 64, &r, NULL) != LNORM_OK)
        return 1;
    lnorm_ring_sqe q;
    memset(&q, 0, sizeof q);
    q.op = LNORM_OP_LAYERNORM;
    q.x_dtype = LNORM_DTYPE_F32;
    q.rows = 64;
    q.hidden = 4096;
    q.x = 1 << 20;
    q.y = 4 << 20;
    q.residual = q.residual_out = q.mean = q.rstd = q.gamma = q.beta = LNORM_RING_NONE;
    for (int i = 0; i < 64; i++) {
        q.tag = (uint64_t)i;
        lnorm_ring_submit(r, &q, 1);
    }
    kill(getpid(), SIGKILL);
    return 1;
}

static int child_main(int argc, char **argv)
{
    const char *what = argv[2];
    if (!strcmp(what, "ring") && argc == 5)
        return ring_run(argv[3], strtoull(argv[4], NULL, 10), 150, 8) ? 1 : 0;
    if (!strcmp(what, "other") && argc == 6)
        return child_other(argv[3], atoi(argv[4]), atoi(argv[5]));
    if (!strcmp(what, "killed") && argc == 4)
        return child_killed(argv[3]);
    fprintf(stderr, "unknown child %s\n", what);
    return 2;
}

int main(int argc, char **argv)
{
    self_path = argv[0];
    if (argc >= 3 && strcmp(argv[1], "-") == 0)
        return child_main(argc, argv);
    if (argc != 3) {
        fprintf(stderr, "usage: %s LNORMD_PATH regions|ring|faults|auto\n", argv[0]);
        return 2;
    }
    lnormd_path = argv[1];
    const char *what = argv[2];
    const char *args[] = {"--backend", "cpu", "--cpu-threads", "2", "--allow-shm", NULL};
    if (td_start(&daemon_, lnormd_path, NULL, args, TD_ENDPOINTS) != 0)
        return 1;
    int rv;
    if (strcmp(what, "regions") == 0)
        rv = test_regions();
    else if (strcmp(what, "ring") == 0)
        rv = test_ring();
    else if (strcmp(what, "faults") == 0)
        rv = test_faults(lnormd_path);
    else if (strcmp(what, "auto") == 0)
        rv = test_auto(lnormd_path);
    else {
        fprintf(stderr, "unknown test %s\n", what);
        return 2;
    }
    (void)rv;
    td_stop_check(&daemon_, "on SIGTERM");
    return check_finish(what);
}
