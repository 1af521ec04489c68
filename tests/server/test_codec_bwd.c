/*
 * Codec unit tests of NormalizeBackward, no daemon: a valid request decodes
 * to a backward segment the core accepts (and runs); every bad field is
 * refused with INVALID_ARGUMENT or RESOURCE_EXHAUSTED and a message naming
 * it; every truncation of a valid message is either refused or decodes to
 * a segment the core accepts.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "codec.h"
#include "testutil.h"

static const lnorm__limits lim = {1 << 20, 1024, 8192};

enum { R = 4, H = 64 };

typedef struct req {
    Lnorm__V1__Request r;
    Lnorm__V1__NormalizeBackwardRequest b;
    Lnorm__V1__Affine a;
    Lnorm__V1__ShmRef ref;
    uint8_t x[R * H * 4], dy[R * H * 2], dres[R * H * 4], g[H * 4], mean[R * 4], rstd[R * 4];
} req;

static void mkreq(req *q, lnorm_rng *rng)
{
    lnorm__v1__request__init(&q->r);
    lnorm__v1__normalize_backward_request__init(&q->b);
    lnorm__v1__affine__init(&q->a);
    lnorm__v1__shm_ref__init(&q->ref);
    lnorm_test_fill(rng, q->x, LNORM_DTYPE_F32, R * H, 0, 1);
    lnorm_test_fill(rng, q->dy, LNORM_DTYPE_BF16, R * H, 0, 1);
    lnorm_test_fill(rng, q->dres, LNORM_DTYPE_F32, R * H, 0, 1);
    lnorm_test_fill(rng, q->g, LNORM_DTYPE_F32, H, 1, 0.1);
    lnorm_test_fill(rng, q->mean, LNORM_DTYPE_F32, R, 0, 0.1);
    lnorm_test_fill(rng, q->rstd, LNORM_DTYPE_F32, R, 1, 0.1);
    q->r.request_id = 777;
    q->r.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE_BACKWARD;
    q->r.normalize_backward = &q->b;
    Lnorm__V1__NormalizeBackwardRequest *b = &q->b;
    b->op = LNORM__V1__OP__OP_LAYER_NORM;
    b->x_dtype = LNORM__V1__DTYPE__DTYPE_F32;
    b->dy_dtype = LNORM__V1__DTYPE__DTYPE_BF16;
    b->dx_dtype = LNORM__V1__DTYPE__DTYPE_F16;
    b->rows = R;
    b->hidden = H;
    b->x.data = q->x;
    b->x.len = sizeof q->x;
    b->dy.data = q->dy;
    b->dy.len = sizeof q->dy;
    b->dres.data = q->dres;
    b->dres.len = sizeof q->dres;
    b->mean.data = q->mean;
    b->mean.len = sizeof q->mean;
    b->rstd.data = q->rstd;
    b->rstd.len = sizeof q->rstd;
    b->want_dgamma = 1;
    b->want_dbeta = 1;
    b->priority = 1;
    q->a.dtype = LNORM__V1__DTYPE__DTYPE_F32;
    q->a.gamma.data = q->g;
    q->a.gamma.len = sizeof q->g;
    b->affine = &q->a;
}

static int decode_buf(const uint8_t *buf, size_t n, lnorm__decoded *d, char *err, size_t errlen)
{
    return lnorm__codec_decode_request(buf, n, &lim, NULL, d, err, errlen);
}

static int decode(const req *q, lnorm__decoded *d, char *err, size_t errlen)
{
    size_t n = lnorm__v1__request__get_packed_size(&q->r);
    uint8_t *b = malloc(n + 1);
    lnorm__v1__request__pack(&q->r, b);
    int rc = decode_buf(b, n, d, err, errlen);
    free(b);
    return rc;
}

/* A decoded backward is a segment the core accepts and runs. */
static void check_runs(lnorm__decoded *d, const char *what)
{
    if (d->kind != LNORM__REQ_BACKWARD || d->params_id)
        return;
    static float dx[R * H * 2], dg[H], db[H];
    lnorm_bwd_segment s = d->bseg;
    CHECK((uint64_t)s.rows * (uint64_t)s.hidden * lnorm_dtype_size(s.dx_dtype) <= sizeof dx, "%s: shape", what);
    s.dx = dx;
    s.dgamma = d->want_dgamma ? dg : NULL;
    s.dbeta = d->want_dbeta ? db : NULL;
    const char *why = NULL;
    CHECK(lnorm_bwd_segment_validate(&s, &why) == LNORM_OK, "%s: decoded segment invalid: %s", what, why);
    lnorm_cpu *cpu = NULL;
    if (lnorm_cpu_create(&cpu, 1) == LNORM_OK) {
        lnorm_bwd_batch b = {&s, 1};
        CHECK(lnorm_cpu_run_bwd(cpu, &b, &why) == LNORM_OK, "%s: run: %s", what, why);
        lnorm_cpu_destroy(cpu);
    }
}

static void expect_err(const req *q, int want, const char *needle, const char *what)
{
    lnorm__decoded d;
    char err[512];
    int rc = decode(q, &d, err, sizeof err);
    CHECK(rc == want, "%s: rc %s, want %s (%s)", what, lnorm_errname(rc), lnorm_errname(want), err);
    CHECK(strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", what, err, needle);
    CHECK(d.request_id == 777, "%s: request_id %llu", what, (unsigned long long)d.request_id);
    lnorm__codec_decoded_free(&d);
}

int main(void)
{
    lnorm_rng rng;
    lnorm_rng_seed(&rng, lnorm_test_seed(31));
    req q;
    char err[512];
    lnorm__decoded d;

    /* Valid: every field set. */
    mkreq(&q, &rng);
    int rc = decode(&q, &d, err, sizeof err);
    CHECK(rc == LNORM_OK, "valid: %s", err);
    CHECK(d.kind == LNORM__REQ_BACKWARD, "kind %d", d.kind);
    CHECK(d.bseg.rows == R && d.bseg.hidden == H && d.bseg.dy_dtype == LNORM_DTYPE_BF16 &&
              d.bseg.dx_dtype == LNORM_DTYPE_F16 && d.bseg.param_dtype == LNORM_DTYPE_F32,
          "valid: shape or dtypes");
    CHECK(d.bseg.dres && d.bseg.mean && d.bseg.rstd && d.bseg.gamma, "valid: inputs");
    CHECK(!memcmp(d.bseg.x, q.x, sizeof q.x) && !memcmp(d.bseg.dy, q.dy, sizeof q.dy), "valid: payload");
    CHECK(d.want_dx && d.want_dgamma && d.want_dbeta, "valid: outputs");
    CHECK(d.dx_bytes == R * H * 2 && d.grad_bytes == H * 4, "valid: sizes %zu %zu", d.dx_bytes, d.grad_bytes);
    CHECK(d.in_bytes == sizeof q.x + sizeof q.dy + sizeof q.dres + sizeof q.mean + sizeof q.rstd + sizeof q.g,
          "valid: in_bytes %zu", d.in_bytes);
    CHECK(d.bseg.eps == LNORM_DEFAULT_EPS && d.priority == 1, "valid: eps default, priority");
    check_runs(&d, "valid");
    lnorm__codec_decoded_free(&d);

    /* Valid: the minimum (RMSNorm, no gamma, no stats, only dx), params by id. */
    mkreq(&q, &rng);
    q.b.op = LNORM__V1__OP__OP_RMS_NORM;
    q.b.mean.len = 0;
    q.b.rstd.len = 0;
    q.b.dres.len = 0;
    q.b.affine = NULL;
    q.b.want_dgamma = q.b.want_dbeta = 0;
    q.b.eps_present_case = LNORM__V1__NORMALIZE_BACKWARD_REQUEST__EPS_PRESENT_EPS;
    q.b.eps = 0.5f;
    q.b.eps_mode = LNORM__V1__EPS_MODE__EPS_OUTSIDE_SQRT;
    rc = decode(&q, &d, err, sizeof err);
    CHECK(rc == LNORM_OK && !d.bseg.gamma && !d.bseg.mean && !d.bseg.rstd && !d.bseg.dres, "minimal: %s", err);
    CHECK(d.bseg.eps == 0.5f && d.bseg.eps_mode == LNORM_EPS_OUTSIDE, "minimal: eps");
    check_runs(&d, "minimal");
    lnorm__codec_decoded_free(&d);
    mkreq(&q, &rng);
    q.a.gamma.len = 0;
    q.a.dtype = 0;
    q.a.params_id = "ln.layer-3";
    rc = decode(&q, &d, err, sizeof err);
    CHECK(rc == LNORM_OK && d.params_id && !strcmp(d.params_id, "ln.layer-3"), "params id: %s", err);
    lnorm__codec_decoded_free(&d);

    /* Every bad field. */
#define BAD(want, needle, stmt)     \
    do {                            \
        mkreq(&q, &rng);            \
        stmt;                       \
        expect_err(&q, want, needle, #stmt); \
    } while (0)
    const int E = LNORM_EINVAL, L = LNORM_ELIMIT;
    BAD(E, "normalize_backward.op", q.b.op = 0);
    BAD(E, "normalize_backward.op", q.b.op = 3);
    BAD(E, "normalize_backward.x_dtype", q.b.x_dtype = 0);
    BAD(E, "normalize_backward.x_dtype", q.b.x_dtype = 9);
    BAD(E, "normalize_backward.dy_dtype", q.b.dy_dtype = 4);
    BAD(E, "normalize_backward.dx_dtype", q.b.dx_dtype = 4);
    BAD(E, "normalize_backward.eps_mode", q.b.eps_mode = 2);
    BAD(E, "normalize_backward.eps", (q.b.eps_present_case = LNORM__V1__NORMALIZE_BACKWARD_REQUEST__EPS_PRESENT_EPS, q.b.eps = 0.0f));
    BAD(E, "normalize_backward.eps", (q.b.eps_present_case = LNORM__V1__NORMALIZE_BACKWARD_REQUEST__EPS_PRESENT_EPS, q.b.eps = NAN));
    BAD(E, "normalize_backward.eps", (q.b.eps_present_case = LNORM__V1__NORMALIZE_BACKWARD_REQUEST__EPS_PRESENT_EPS, q.b.eps = -INFINITY));
    BAD(E, "normalize_backward.eps", (q.b.eps_present_case = LNORM__V1__NORMALIZE_BACKWARD_REQUEST__EPS_PRESENT_EPS, q.b.eps = 1e-39f, q.b.eps_mode = 1));
    BAD(E, "normalize_backward.rows", q.b.rows = 0);
    BAD(E, "normalize_backward.hidden", q.b.hidden = 0);
    BAD(L, "normalize_backward.rows", q.b.rows = 1025);
    BAD(L, "normalize_backward.hidden", q.b.hidden = 8193);
    BAD(L, "max-message-bytes", (q.b.rows = 1024, q.b.hidden = 8192));
    BAD(E, "normalize_backward.x", q.b.x.len -= 4);
    BAD(E, "normalize_backward.x", q.b.x.len = 0);
    BAD(E, "normalize_backward.dy", q.b.dy.len -= 2);
    BAD(E, "normalize_backward.dy", q.b.dy_dtype = LNORM__V1__DTYPE__DTYPE_F32);
    BAD(E, "normalize_backward.dres", q.b.dres.len = 4);
    BAD(E, "normalize_backward.mean", q.b.mean.len = 4);
    BAD(E, "normalize_backward.rstd", q.b.rstd.len = 12);
    BAD(E, "normalize_backward.mean", q.b.op = LNORM__V1__OP__OP_RMS_NORM);
    BAD(E, "normalize_backward.mean", q.b.rstd.len = 0);
    BAD(E, "normalize_backward.mean", q.b.mean.len = 0);
    BAD(E, "normalize_backward.skip_dx", (q.b.skip_dx = 1, q.b.want_dgamma = 0, q.b.want_dbeta = 0));
    BAD(E, "normalize_backward.affine.beta", (q.a.beta.data = q.g, q.a.beta.len = sizeof q.g));
    BAD(E, "normalize_backward.affine", q.a.gamma_ref = &q.ref);
    BAD(E, "normalize_backward.affine", q.a.beta_ref = &q.ref);
    BAD(E, "normalize_backward.affine", q.a.params_id = "p1");
    BAD(E, "normalize_backward.affine.params_id", (q.a.params_id = "bad id", q.a.gamma.len = 0, q.a.dtype = 0));
    BAD(E, "normalize_backward.affine.dtype", q.a.dtype = LNORM__V1__DTYPE__DTYPE_BF16);
    BAD(E, "normalize_backward.affine.dtype", q.a.dtype = 7);
    BAD(E, "normalize_backward.affine.gamma", q.a.gamma.len -= 4);
#undef BAD

    /* Every truncation of a valid message: refused, or a valid segment. */
    mkreq(&q, &rng);
    size_t n = lnorm__v1__request__get_packed_size(&q.r);
    uint8_t *buf = malloc(n);
    lnorm__v1__request__pack(&q.r, buf);
    long accepted = 0;
    for (size_t k = 0; k < n; k++) {
        uint8_t *cut = malloc(k + 1);
        memcpy(cut, buf, k);
        rc = decode_buf(cut, k, &d, err, sizeof err);
        if (rc == LNORM_OK) {
            accepted++;
            check_runs(&d, "truncated");
        } else {
            CHECK(err[0] != 0, "truncation at %zu: error without a message", k);
        }
        lnorm__codec_decoded_free(&d);
        free(cut);
    }
    free(buf);
    printf("  %zu truncations, %ld decoded as valid requests\n", n, accepted);
    return check_finish("server.codec_backward");
}
