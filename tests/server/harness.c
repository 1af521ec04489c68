/* Raw NNG + protobuf-c calls to lnormd (see harness.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>

#include "harness.h"

/* NNG 1.5's lazy initialisation races when threads open their first
 * sockets at once (ThreadSanitizer, in libnng): the first open goes
 * through pthread_once, as in liblnorm. */
static pthread_once_t ts_nng_once = PTHREAD_ONCE_INIT;

static void ts_nng_first_use(void)
{
    nng_socket s;
    if (nng_req0_open(&s) == 0)
        nng_close(s);
}

int ts_dial(nng_socket *s, const char *url)
{
    pthread_once(&ts_nng_once, ts_nng_first_use);
    int rv = nng_req0_open(s);
    if (rv == 0)
        rv = nng_socket_set_ms(*s, NNG_OPT_RECVTIMEO, 20000);
    if (rv == 0)
        rv = nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    if (rv == 0)
        rv = nng_socket_set_size(*s, NNG_OPT_RECVMAXSZ, 0);
    if (rv == 0)
        rv = nng_dial(*s, url, NULL, 0);
    CHECK(rv == 0, "dial %s: %s", url, nng_strerror(rv));
    return rv ? -1 : 0;
}

int ts_dial_tls(nng_socket *s, const char *url, const char *ca, const char *cert, const char *key, int timeout_ms)
{
    nng_tls_config *tls = NULL;
    nng_dialer dl;
    int rv = nng_req0_open(s);
    if (rv == 0)
        rv = nng_socket_set_ms(*s, NNG_OPT_RECVTIMEO, timeout_ms);
    if (rv == 0)
        rv = nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    if (rv == 0)
        rv = nng_tls_config_alloc(&tls, NNG_TLS_MODE_CLIENT);
    if (rv == 0)
        rv = nng_tls_config_ca_file(tls, ca);
    if (rv == 0)
        rv = nng_tls_config_server_name(tls, "localhost");
    if (rv == 0)
        rv = nng_tls_config_auth_mode(tls, NNG_TLS_AUTH_MODE_REQUIRED);
    if (rv == 0 && cert) {
        /* NNG wants the certificate and the key in one file. */
        char both[512];
        snprintf(both, sizeof both, "%s.both.pem", cert);
        FILE *o = fopen(both, "w");
        const char *parts[2] = {cert, key};
        for (int i = 0; o && i < 2; i++) {
            FILE *in = fopen(parts[i], "r");
            char buf[4096];
            size_t n;
            while (in && (n = fread(buf, 1, sizeof buf, in)) > 0)
                fwrite(buf, 1, n, o);
            if (in)
                fclose(in);
        }
        if (o)
            fclose(o);
        rv = nng_tls_config_cert_key_file(tls, both, NULL);
        unlink(both);
    }
    if (rv == 0)
        rv = nng_dialer_create(&dl, *s, url);
    if (rv == 0)
        rv = nng_dialer_set_ptr(dl, NNG_OPT_TLS_CONFIG, tls);
    if (rv == 0)
        rv = nng_dialer_start(dl, 0);
    if (tls)
        nng_tls_config_free(tls);
    if (rv != 0)
        fprintf(stderr, "tls dial %s: %s\n", url, nng_strerror(rv));
    return rv ? -1 : 0;
}

Lnorm__V1__Response *ts_call_raw(nng_socket s, const void *buf, size_t len)
{
    nng_msg *m;
    if (nng_msg_alloc(&m, len) != 0)
        return NULL;
    if (len)
        memcpy(nng_msg_body(m), buf, len);
    int rv = nng_sendmsg(s, m, 0);
    if (rv != 0) {
        fprintf(stderr, "send: %s\n", nng_strerror(rv));
        nng_msg_free(m);
        return NULL;
    }
    if ((rv = nng_recvmsg(s, &m, 0)) != 0) {
        fprintf(stderr, "recv: %s\n", nng_strerror(rv));
        return NULL;
    }
    Lnorm__V1__Response *r = lnorm__v1__response__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
    nng_msg_free(m);
    if (!r)
        fprintf(stderr, "reply is not a valid lnorm.v1.Response\n");
    return r;
}

Lnorm__V1__Response *ts_call(nng_socket s, const Lnorm__V1__Request *req)
{
    size_t n = lnorm__v1__request__get_packed_size(req);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    lnorm__v1__request__pack(req, buf);
    Lnorm__V1__Response *r = ts_call_raw(s, buf, n);
    free(buf);
    return r;
}

int ts_code(const Lnorm__V1__Response *r)
{
    return r && r->status ? (int)r->status->code : (r ? 0 : -1);
}

const char *ts_msg(const Lnorm__V1__Response *r)
{
    return r && r->status && r->status->message ? r->status->message : "";
}

void ts_norm_from_case(ts_norm *m, const lnorm_test_case *tc, uint64_t id, int inline_params)
{
    const lnorm_segment *s = &tc->seg;
    lnorm__v1__request__init(&m->req);
    lnorm__v1__normalize_request__init(&m->n);
    lnorm__v1__affine__init(&m->aff);
    m->req.request_id = id;
    m->req.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE;
    m->req.normalize = &m->n;
    m->n.op = (Lnorm__V1__Op)s->op;
    m->n.x_dtype = (Lnorm__V1__DType)s->x_dtype;
    m->n.y_dtype = s->y_dtype == s->x_dtype ? LNORM__V1__DTYPE__DTYPE_UNSPECIFIED : (Lnorm__V1__DType)s->y_dtype;
    m->n.rows = (uint64_t)s->rows;
    m->n.hidden = (uint64_t)s->hidden;
    if (s->eps != LNORM_DEFAULT_EPS) {
        m->n.eps_present_case = LNORM__V1__NORMALIZE_REQUEST__EPS_PRESENT_EPS;
        m->n.eps = s->eps;
    }
    m->n.eps_mode = (Lnorm__V1__EpsMode)s->eps_mode;
    size_t xb = (size_t)(s->rows * s->hidden) * lnorm_dtype_size(s->x_dtype);
    m->n.x.data = (uint8_t *)s->x;
    m->n.x.len = xb;
    if (s->residual) {
        m->n.residual.data = (uint8_t *)s->residual;
        m->n.residual.len = xb;
    }
    m->n.want_stats = s->rstd != NULL;
    if (inline_params && (s->gamma || s->beta)) {
        size_t pb = (size_t)s->hidden * lnorm_dtype_size(s->param_dtype);
        m->aff.dtype = (Lnorm__V1__DType)s->param_dtype;
        if (s->gamma) {
            m->aff.gamma.data = (uint8_t *)s->gamma;
            m->aff.gamma.len = pb;
        }
        if (s->beta) {
            m->aff.beta.data = (uint8_t *)s->beta;
            m->aff.beta.len = pb;
        }
        m->n.affine = &m->aff;
    }
}

long ts_check_reply(const lnorm_test_case *tc, const Lnorm__V1__Response *r, const char *label)
{
    if (!r) {
        fprintf(stderr, "%s: no reply\n", label);
        return 1;
    }
    if (ts_code(r) != 0 || r->body_case != LNORM__V1__RESPONSE__BODY_NORMALIZE) {
        fprintf(stderr, "%s: status %d (%s), body %d\n", label, ts_code(r), ts_msg(r), (int)r->body_case);
        return 1;
    }
    const lnorm_segment *s = &tc->seg;
    const Lnorm__V1__NormalizeResponse *n = r->normalize;
    size_t elems = (size_t)(s->rows * s->hidden);
    size_t yb = elems * lnorm_dtype_size(s->y_dtype), xb = elems * lnorm_dtype_size(s->x_dtype);
    size_t sb = (size_t)s->rows * 4;
    long bad = 0;
    if (n->y.len != yb || (s->residual && n->residual_out.len != xb) || (!s->residual && n->residual_out.len) ||
        (s->rstd && n->rstd.len != sb) || (!s->rstd && n->rstd.len) || (s->mean && n->mean.len != sb) ||
        (!s->mean && n->mean.len)) {
        fprintf(stderr, "%s: reply sizes wrong (y %zu want %zu, res_out %zu, rstd %zu, mean %zu)\n", label, n->y.len,
                yb, n->residual_out.len, n->rstd.len, n->mean.len);
        return 1;
    }
    /* Against the float64 reference. */
    lnorm_segment got = *s;
    got.y = n->y.data;
    got.residual_out = s->residual ? n->residual_out.data : NULL;
    got.mean = s->mean ? (float *)n->mean.data : NULL;
    got.rstd = s->rstd ? (float *)n->rstd.data : NULL;
    long mism = lnorm_test_check_segment(&got, NULL, label);
    if (mism != 0) {
        fprintf(stderr, "%s: %ld elements differ from the float64 reference\n", label, mism);
        bad++;
    }
    /* Bit for bit against the CPU backend on the same inputs. */
    lnorm_segment loc = *s;
    const char *why = NULL;
    if (lnorm_cpu_run_segment(NULL, &loc, &why) != LNORM_OK) {
        fprintf(stderr, "%s: local cpu run failed: %s\n", label, why ? why : "?");
        return bad + 1;
    }
    if (memcmp(loc.y, n->y.data, yb) != 0 || (s->residual && memcmp(loc.residual_out, n->residual_out.data, xb)) ||
        (s->rstd && memcmp(loc.rstd, n->rstd.data, sb)) || (s->mean && memcmp(loc.mean, n->mean.data, sb))) {
        fprintf(stderr, "%s: reply differs bitwise from lnorm_cpu_run_segment\n", label);
        bad++;
    }
    return bad;
}
