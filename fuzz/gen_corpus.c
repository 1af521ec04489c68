/*
 * Seed-corpus generator for lnormd's fuzz targets.
 *
 *   lnorm_fuzz_gen_corpus OUTDIR
 *
 * Serializes, with protobuf-c and the real schema (proto/lnorm.proto),
 * valid and edge-case messages of both directions:
 *   OUTDIR/server_request/<name>.pb   lnorm.v1.Request   (what lnormd decodes)
 *   OUTDIR/client_response/<name>.pb  6-byte call header + lnorm.v1.Response
 *                                     (fuzz_client_response.c: the whole client)
 *   OUTDIR/client_wire/<name>.pb      lnorm.v1.Response (fuzz_client_wire.c)
 * Output is deterministic (fixed payloads, no clock), so regenerating the
 * committed seeds gives identical files. The directories must exist.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lnorm.pb-c.h"

static const char *g_outdir;
static int g_count;

/* Deterministic bytes: a small LCG, enough to make payloads non-constant. */
static void fill_bytes(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = (uint8_t)(s >> 24);
    }
}

/* f32 values in [-2, 2): real-looking activations. */
static void fill_f32(uint8_t *p, size_t n_elems, uint32_t seed)
{
    uint32_t s = seed * 2246822519u + 7u;
    for (size_t i = 0; i < n_elems; i++) {
        s = s * 1664525u + 1013904223u;
        float v = ((float)(s >> 8) / 16777216.0f) * 4.0f - 2.0f;
        memcpy(p + 4 * i, &v, 4);
    }
}

static void write_msg(const char *sub, const char *name, const ProtobufCMessage *m,
                      const uint8_t *prefix, size_t plen)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        perror("malloc");
        exit(1);
    }
    size_t got = protobuf_c_message_pack(m, buf);
    if (got != n) {
        fprintf(stderr, "gen_corpus: %s: packed %zu of %zu bytes\n", name, got, n);
        exit(1);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/%s.pb", g_outdir, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || (plen && fwrite(prefix, 1, plen, f) != plen) || (n && fwrite(buf, 1, n, f) != n) ||
        fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    free(buf);
    g_count++;
}

/* ---- requests ----------------------------------------------------------- */

typedef struct req_box {
    Lnorm__V1__Request req;
    Lnorm__V1__NormalizeRequest norm;
    Lnorm__V1__Affine affine;
    uint8_t x[4096];
    uint8_t res[4096];
    uint8_t gamma[1024];
    uint8_t beta[1024];
} req_box;

static size_t dtsize(int dt)
{
    return dt == LNORM__V1__DTYPE__DTYPE_F32 ? 4 : dt == 0 ? 0 : 2;
}

/* A valid normalize request of rows x hidden of dtype (rows*hidden*size <= 4096). */
static void norm_init(req_box *b, int op, int dtype, uint64_t rows, uint64_t hidden, uint32_t seed)
{
    memset(b, 0, sizeof *b);
    lnorm__v1__request__init(&b->req);
    lnorm__v1__normalize_request__init(&b->norm);
    lnorm__v1__affine__init(&b->affine);
    b->req.request_id = 1000 + seed;
    b->req.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE;
    b->req.normalize = &b->norm;
    b->norm.op = op;
    b->norm.x_dtype = dtype;
    b->norm.rows = rows;
    b->norm.hidden = hidden;
    size_t n = (size_t)(rows * hidden);
    if (dtype == LNORM__V1__DTYPE__DTYPE_F32)
        fill_f32(b->x, n, seed);
    else
        fill_bytes(b->x, n * dtsize(dtype), seed);
    b->norm.x.data = b->x;
    b->norm.x.len = n * dtsize(dtype);
}

static void norm_eps(req_box *b, float eps)
{
    b->norm.eps_present_case = LNORM__V1__NORMALIZE_REQUEST__EPS_PRESENT_EPS;
    b->norm.eps = eps;
}

static void norm_residual(req_box *b)
{
    fill_bytes(b->res, b->norm.x.len, 99);
    b->norm.residual.data = b->res;
    b->norm.residual.len = b->norm.x.len;
}

static void norm_affine(req_box *b, int pdtype, int with_gamma, int with_beta)
{
    size_t bytes = (size_t)b->norm.hidden * dtsize(pdtype ? pdtype : (int)b->norm.x_dtype);
    b->affine.dtype = pdtype;
    if (with_gamma) {
        fill_bytes(b->gamma, bytes, 5);
        b->affine.gamma.data = b->gamma;
        b->affine.gamma.len = bytes;
    }
    if (with_beta) {
        fill_bytes(b->beta, bytes, 6);
        b->affine.beta.data = b->beta;
        b->affine.beta.len = bytes;
    }
    b->norm.affine = &b->affine;
}

static void put_req(const char *name, const Lnorm__V1__Request *r)
{
    write_msg("server_request", name, &r->base, NULL, 0);
}

static void gen_normalize_requests(void)
{
    const Lnorm__V1__DType F32 = LNORM__V1__DTYPE__DTYPE_F32, F16 = LNORM__V1__DTYPE__DTYPE_F16,
                           BF16 = LNORM__V1__DTYPE__DTYPE_BF16;
    const Lnorm__V1__Op LN = LNORM__V1__OP__OP_LAYER_NORM, RMS = LNORM__V1__OP__OP_RMS_NORM;
    static req_box b;

    /* Valid requests: every op x dtype, options one at a time and together. */
    norm_init(&b, LN, F32, 2, 8, 1);
    norm_eps(&b, 1e-5f);
    b.norm.want_stats = 1;
    put_req("norm-ln-f32-2x8-stats", &b.req);

    norm_init(&b, RMS, F32, 4, 16, 2);
    put_req("norm-rms-f32-4x16-default-eps", &b.req);

    norm_init(&b, LN, F16, 3, 32, 3);
    b.norm.y_dtype = F32;
    put_req("norm-ln-f16-to-f32", &b.req);

    norm_init(&b, RMS, BF16, 2, 64, 4);
    norm_eps(&b, 1e-6f);
    b.norm.eps_mode = LNORM__V1__EPS_MODE__EPS_OUTSIDE_SQRT;
    put_req("norm-rms-bf16-eps-outside", &b.req);

    norm_init(&b, LN, F32, 4, 8, 5);
    norm_residual(&b);
    norm_affine(&b, 0, 1, 1);
    b.norm.want_stats = 1;
    put_req("norm-ln-f32-residual-affine", &b.req);

    norm_init(&b, LN, BF16, 4, 16, 6);
    norm_residual(&b);
    norm_affine(&b, F32, 1, 1);
    put_req("norm-ln-bf16-residual-affine-f32", &b.req);

    norm_init(&b, RMS, F16, 8, 8, 7);
    norm_affine(&b, 0, 1, 0);
    b.norm.want_stats = 1;
    put_req("norm-rms-f16-gamma-only", &b.req);

    norm_init(&b, LN, F32, 2, 8, 8);
    norm_affine(&b, 0, 0, 1);
    put_req("norm-ln-f32-beta-only", &b.req);

    norm_init(&b, LN, F32, 2, 8, 9);
    b.affine.params_id = "gpt2.ln_f:v1";
    b.norm.affine = &b.affine;
    put_req("norm-ln-f32-params-id", &b.req);

    norm_init(&b, LN, F32, 1, 1, 10);
    b.req.deadline_us = 5000;
    put_req("norm-ln-f32-1x1-deadline", &b.req);

    norm_init(&b, LN, F32, 1, 1024, 11);
    put_req("norm-ln-f32-1x1024", &b.req);

    /* Edge cases the decoder must reject (or handle) without harm. */
    norm_init(&b, LN, F32, 2, 8, 20);
    b.norm.rows = 0;
    put_req("bad-rows-zero", &b.req);

    norm_init(&b, LN, F32, 2, 8, 21);
    b.norm.hidden = 0;
    put_req("bad-hidden-zero", &b.req);

    norm_init(&b, LN, F32, 2, 8, 22);
    b.norm.rows = UINT64_C(1) << 32;
    b.norm.hidden = UINT64_C(1) << 32; /* rows*hidden overflows 64 bits */
    put_req("bad-rows-hidden-overflow", &b.req);

    norm_init(&b, LN, F32, 2, 8, 23);
    b.norm.rows = UINT64_C(1) << 40;
    put_req("bad-rows-huge", &b.req);

    norm_init(&b, LN, F32, 2, 8, 24);
    b.norm.hidden = 9; /* x is 2x8 */
    put_req("bad-x-size-mismatch", &b.req);

    norm_init(&b, LN, F32, 2, 8, 25);
    b.norm.x.len -= 1;
    put_req("bad-x-short-by-one", &b.req);

    norm_init(&b, LN, F32, 2, 8, 26);
    norm_eps(&b, 0.0f);
    put_req("bad-eps-zero", &b.req);

    norm_init(&b, LN, F32, 2, 8, 27);
    norm_eps(&b, -1.0f);
    put_req("bad-eps-negative", &b.req);

    norm_init(&b, LN, F32, 2, 8, 28);
    norm_eps(&b, NAN);
    put_req("bad-eps-nan", &b.req);

    norm_init(&b, LN, F32, 2, 8, 29);
    norm_eps(&b, INFINITY);
    put_req("bad-eps-inf", &b.req);

    norm_init(&b, 0, F32, 2, 8, 30);
    put_req("bad-op-unspecified", &b.req);

    norm_init(&b, 99, F32, 2, 8, 31);
    put_req("bad-op-unknown", &b.req);

    norm_init(&b, LN, F32, 2, 8, 32);
    b.norm.x_dtype = 0;
    put_req("bad-x-dtype-unspecified", &b.req);

    norm_init(&b, LN, F32, 2, 8, 33);
    b.norm.y_dtype = 7;
    put_req("bad-y-dtype-unknown", &b.req);

    norm_init(&b, LN, F32, 2, 8, 34);
    b.norm.eps_mode = 5;
    put_req("bad-eps-mode-unknown", &b.req);

    norm_init(&b, LN, F32, 2, 8, 35);
    norm_residual(&b);
    b.norm.residual.len = 8;
    put_req("bad-residual-size", &b.req);

    norm_init(&b, LN, F32, 2, 8, 36);
    norm_affine(&b, 0, 1, 1);
    b.affine.gamma.len = 4;
    put_req("bad-gamma-size", &b.req);

    norm_init(&b, LN, F16, 2, 8, 37);
    norm_affine(&b, BF16, 1, 0); /* params must be f32 or x's dtype */
    put_req("bad-affine-dtype", &b.req);

    norm_init(&b, LN, F32, 2, 8, 38);
    norm_affine(&b, 0, 1, 0);
    b.affine.params_id = "both-inline-and-id";
    put_req("bad-affine-id-and-inline", &b.req);

    norm_init(&b, LN, F32, 2, 8, 39);
    b.affine.params_id = "bad id with spaces/and\xff";
    b.norm.affine = &b.affine;
    put_req("bad-affine-id-chars", &b.req);

    norm_init(&b, RMS, F32, 2, 8, 40);
    b.norm.want_stats = 1;
    b.norm.x.len = 0;
    b.norm.x.data = NULL;
    put_req("bad-x-empty", &b.req);
}

/* NormalizeBackward requests: valid ones of each op and option, and a few
 * with one field wrong. */
static void gen_backward_requests(void)
{
    static uint8_t x[4 * 8 * 4], dy[4 * 8 * 4], dres[4 * 8 * 4], g[8 * 4], mean[16], rstd[16];
    fill_f32(x, 4 * 8, 101);
    fill_f32(dy, 4 * 8, 102);
    fill_f32(dres, 4 * 8, 103);
    fill_f32(g, 8, 104);
    fill_f32(mean, 4, 105);
    for (int i = 0; i < 4; i++) {
        float one = 1.0f + 0.25f * (float)i;
        memcpy(rstd + 4 * i, &one, 4);
    }
    for (int k = 0; k < 8; k++) {
        Lnorm__V1__Request r;
        Lnorm__V1__NormalizeBackwardRequest b;
        Lnorm__V1__Affine a;
        lnorm__v1__request__init(&r);
        lnorm__v1__normalize_backward_request__init(&b);
        lnorm__v1__affine__init(&a);
        r.request_id = 500 + (uint64_t)k;
        r.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE_BACKWARD;
        r.normalize_backward = &b;
        b.op = k % 2 ? LNORM__V1__OP__OP_RMS_NORM : LNORM__V1__OP__OP_LAYER_NORM;
        b.x_dtype = LNORM__V1__DTYPE__DTYPE_F32;
        b.rows = 4;
        b.hidden = 8;
        b.x.data = x;
        b.x.len = sizeof x;
        b.dy.data = dy;
        b.dy.len = sizeof dy;
        b.want_dgamma = k != 1;
        b.want_dbeta = k >= 2;
        const char *name = k % 2 ? "bwd-rms-f32-4x8" : "bwd-ln-f32-4x8";
        if (k == 2) {
            b.dres.data = dres;
            b.dres.len = sizeof dres;
            a.gamma.data = g;
            a.gamma.len = sizeof g;
            a.dtype = LNORM__V1__DTYPE__DTYPE_F32;
            b.affine = &a;
            b.mean.data = mean;
            b.mean.len = sizeof mean;
            b.rstd.data = rstd;
            b.rstd.len = sizeof rstd;
            name = "bwd-ln-all-inputs";
        } else if (k == 3) {
            b.eps_present_case = LNORM__V1__NORMALIZE_BACKWARD_REQUEST__EPS_PRESENT_EPS;
            b.eps = 0.5f;
            b.eps_mode = LNORM__V1__EPS_MODE__EPS_OUTSIDE_SQRT;
            b.skip_dx = 1;
            b.rstd.data = rstd;
            b.rstd.len = sizeof rstd;
            name = "bwd-rms-eps-outside-no-dx";
        } else if (k == 4) {
            b.dy.len -= 4;
            name = "bwd-bad-dy-size";
        } else if (k == 5) {
            b.mean.data = mean;
            b.mean.len = sizeof mean;
            name = "bwd-bad-rms-mean";
        } else if (k == 6) {
            a.params_id = "bwd-params";
            b.affine = &a;
            name = "bwd-ln-params-id";
        } else if (k == 7) {
            b.skip_dx = 1;
            b.want_dgamma = b.want_dbeta = 0;
            name = "bwd-bad-no-output";
        }
        put_req(name, &r);
    }
}

static void gen_other_requests(void)
{
    Lnorm__V1__Request r;

    Lnorm__V1__HealthRequest h;
    lnorm__v1__request__init(&r);
    lnorm__v1__health_request__init(&h);
    r.request_id = 1;
    r.body_case = LNORM__V1__REQUEST__BODY_HEALTH;
    r.health = &h;
    put_req("health", &r);

    Lnorm__V1__InfoRequest in;
    lnorm__v1__request__init(&r);
    lnorm__v1__info_request__init(&in);
    r.request_id = UINT64_MAX;
    r.body_case = LNORM__V1__REQUEST__BODY_INFO;
    r.info = &in;
    put_req("info", &r);

    lnorm__v1__request__init(&r);
    r.request_id = 7;
    put_req("bad-no-body", &r);

    static uint8_t g[256], bt[256];
    Lnorm__V1__RegisterParamsRequest rp;
    lnorm__v1__request__init(&r);
    lnorm__v1__register_params_request__init(&rp);
    r.request_id = 2;
    r.body_case = LNORM__V1__REQUEST__BODY_REGISTER_PARAMS;
    r.register_params = &rp;
    rp.params_id = "gpt2.ln_f:v1";
    rp.dtype = LNORM__V1__DTYPE__DTYPE_F32;
    rp.hidden = 8;
    fill_f32(g, 8, 1);
    fill_f32(bt, 8, 2);
    rp.gamma.data = g;
    rp.gamma.len = 32;
    rp.beta.data = bt;
    rp.beta.len = 32;
    put_req("register-f32-gamma-beta", &r);

    rp.params_id = "llama-rms_0";
    rp.dtype = LNORM__V1__DTYPE__DTYPE_BF16;
    rp.hidden = 64;
    rp.gamma.len = 128;
    rp.beta.len = 0;
    put_req("register-bf16-gamma", &r);

    rp.params_id = "";
    put_req("bad-register-empty-id", &r);

    static char longid[130];
    memset(longid, 'a', 129);
    longid[129] = 0;
    rp.params_id = longid;
    put_req("bad-register-id-129", &r);

    rp.params_id = "ok";
    rp.dtype = 0;
    put_req("bad-register-dtype", &r);

    rp.dtype = LNORM__V1__DTYPE__DTYPE_F16;
    rp.hidden = 0;
    put_req("bad-register-hidden-zero", &r);

    rp.hidden = 65; /* gamma is 128 bytes = 64 f16 */
    put_req("bad-register-size", &r);

    Lnorm__V1__DropParamsRequest dp;
    lnorm__v1__request__init(&r);
    lnorm__v1__drop_params_request__init(&dp);
    r.request_id = 3;
    r.body_case = LNORM__V1__REQUEST__BODY_DROP_PARAMS;
    r.drop_params = &dp;
    dp.params_id = "gpt2.ln_f:v1";
    put_req("drop", &r);
}

/* ---- responses ---------------------------------------------------------- */

/* Client-response seeds start with the 6-byte header of
 * fuzz/fuzz_client_response.c choosing the call the reply answers:
 * kind (0 normalize, 1 health, 2 info, 3 register, 4 drop), flags (bit 0
 * RMSNorm, 1 stats, 2 residual, 3 y f32, 4 one row per chunk), x dtype
 * index (0 f32, 1 f16, 2 bf16), rows - 1, hidden - 1, reserved. */
static uint8_t g_hdr[6];

static void hdr(int kind, int flags, int xdt, int rows, int hidden)
{
    g_hdr[0] = (uint8_t)kind;
    g_hdr[1] = (uint8_t)flags;
    g_hdr[2] = (uint8_t)xdt;
    g_hdr[3] = (uint8_t)(rows - 1);
    g_hdr[4] = (uint8_t)(hidden - 1);
    g_hdr[5] = 0;
}

static void put_resp(const char *name, const Lnorm__V1__Response *r)
{
    write_msg("client_response", name, &r->base, g_hdr, sizeof g_hdr);
    write_msg("client_wire", name, &r->base, NULL, 0);
}

static void gen_responses(void)
{
    static uint8_t y[4096], mean[64], rstd[64], ro[4096];
    Lnorm__V1__Response r;
    Lnorm__V1__Status st;
    Lnorm__V1__Timings tm;
    Lnorm__V1__NormalizeResponse nr;

    lnorm__v1__response__init(&r);
    lnorm__v1__status__init(&st);
    lnorm__v1__timings__init(&tm);
    lnorm__v1__normalize_response__init(&nr);
    r.request_id = 1001;
    r.status = &st;
    r.timings = &tm;
    tm.queue_us = 12;
    tm.compute_us = 3;
    tm.batch_rows = 2;
    tm.batch_requests = 1;
    r.body_case = LNORM__V1__RESPONSE__BODY_NORMALIZE;
    r.normalize = &nr;
    fill_f32(y, 16, 1);
    fill_f32(mean, 2, 2);
    fill_f32(rstd, 2, 3);
    nr.y.data = y;
    nr.y.len = 64;
    nr.mean.data = mean;
    nr.mean.len = 8;
    nr.rstd.data = rstd;
    nr.rstd.len = 8;
    hdr(0, 2, 0, 2, 8);
    put_resp("norm-ok-f32-2x8-stats", &r);

    nr.mean.len = 0;
    nr.rstd.len = 0;
    fill_bytes(ro, 64, 4);
    nr.residual_out.data = ro;
    nr.residual_out.len = 64;
    hdr(0, 4, 0, 2, 8);
    put_resp("norm-ok-f32-2x8-residual-out", &r);

    nr.residual_out.len = 0;
    nr.y.len = 32;
    hdr(0, 0x10, 0, 2, 8);
    put_resp("norm-ok-f32-chunked-2x8", &r);

    nr.residual_out.len = 0;
    nr.y.len = 2 * 64 * 2;
    fill_bytes(y, nr.y.len, 5);
    hdr(0, 0, 2, 2, 64);
    put_resp("norm-ok-bf16-2x64", &r);

    r.timings = NULL;
    nr.y.len = 0;
    hdr(0, 1, 0, 1, 1);
    put_resp("norm-ok-empty-y", &r);

    nr.y.len = 63;
    hdr(0, 0, 0, 2, 8);
    put_resp("bad-norm-y-odd-size", &r);

    /* Errors: a status, no body. */
    lnorm__v1__response__init(&r);
    r.request_id = 1002;
    r.status = &st;
    st.code = LNORM__V1__CODE__INVALID_ARGUMENT;
    st.message = "normalize.x: 63 bytes, expected 64 (rows 2 x hidden 8 x f32)";
    hdr(0, 2, 0, 2, 8);
    put_resp("err-invalid-argument", &r);

    st.code = LNORM__V1__CODE__RESOURCE_EXHAUSTED;
    st.message = "queue full";
    put_resp("err-resource-exhausted", &r);

    st.code = LNORM__V1__CODE__UNAVAILABLE;
    st.message = "shutting down";
    put_resp("err-unavailable", &r);

    st.code = 1234;
    st.message = "";
    put_resp("bad-status-code-unknown", &r);

    st.code = LNORM__V1__CODE__OK;
    put_resp("bad-ok-without-body", &r);

    lnorm__v1__response__init(&r);
    r.request_id = 1003;
    put_resp("bad-no-status", &r);

    /* Health, register, drop, info. */
    Lnorm__V1__HealthResponse hr;
    lnorm__v1__response__init(&r);
    lnorm__v1__status__init(&st);
    lnorm__v1__health_response__init(&hr);
    r.request_id = 1;
    r.status = &st;
    r.body_case = LNORM__V1__RESPONSE__BODY_HEALTH;
    r.health = &hr;
    hr.serving = 1;
    hdr(1, 0, 0, 1, 1);
    put_resp("health-serving", &r);

    Lnorm__V1__RegisterParamsResponse rr;
    lnorm__v1__register_params_response__init(&rr);
    r.body_case = LNORM__V1__RESPONSE__BODY_REGISTER_PARAMS;
    r.register_params = &rr;
    hdr(3, 0, 0, 1, 1);
    put_resp("register-ok", &r);

    Lnorm__V1__DropParamsResponse dr;
    lnorm__v1__drop_params_response__init(&dr);
    r.body_case = LNORM__V1__RESPONSE__BODY_DROP_PARAMS;
    r.drop_params = &dr;
    hdr(4, 0, 0, 1, 1);
    put_resp("drop-ok", &r);

    Lnorm__V1__InfoResponse ir;
    Lnorm__V1__Device dev0, dev1;
    Lnorm__V1__Device *devs[2] = {&dev0, &dev1};
    Lnorm__V1__Limits lim;
    char *backends[2] = {"cpu", "cuda"};
    lnorm__v1__info_response__init(&ir);
    lnorm__v1__device__init(&dev0);
    lnorm__v1__device__init(&dev1);
    lnorm__v1__limits__init(&lim);
    dev0.backend = "cpu";
    dev0.name = "x86_64 avx2";
    dev0.memory_bytes = UINT64_C(25769803776);
    dev1.backend = "cuda";
    dev1.name = "NVIDIA H200";
    dev1.memory_bytes = UINT64_C(150000000000);
    dev1.index = 0;
    lim.max_message_bytes = 64u << 20;
    lim.max_rows = 1u << 20;
    lim.max_hidden = 1u << 16;
    lim.max_batch_rows = 4096;
    lim.max_batch_bytes = 32u << 20;
    lim.max_queue_requests = 1024;
    lim.max_params_bytes = 256u << 20;
    ir.version = "0.1.0";
    ir.n_backends = 2;
    ir.backends = backends;
    ir.n_devices = 2;
    ir.devices = devs;
    ir.limits = &lim;
    r.body_case = LNORM__V1__RESPONSE__BODY_INFO;
    r.info = &ir;
    hdr(2, 0, 0, 1, 1);
    put_resp("info-cpu-cuda", &r);

    ir.limits = NULL;
    ir.n_devices = 0;
    put_resp("info-no-limits", &r);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUTDIR (with server_request, client_response, client_wire in it)\n",
                argv[0]);
        return 2;
    }
    g_outdir = argv[1];
    gen_normalize_requests();
    gen_backward_requests();
    gen_other_requests();
    gen_responses();
    printf("gen_corpus: wrote %d seeds under %s\n", g_count, g_outdir);
    return 0;
}
