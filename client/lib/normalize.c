/*
 * lnorm_normalize and lnorm_normalize_async: validation of a request, its
 * split by rows into chunks, the encoding of each chunk and the copy of
 * each chunk's reply into the caller's buffers.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void lnorm_normalize_req_init(lnorm_normalize_req *r, lnorm_op op, lnorm_dtype x_dtype,
                              uint64_t rows, uint64_t hidden)
{
    memset(r, 0, sizeof *r);
    r->op = op;
    r->x_dtype = x_dtype;
    r->y_dtype = LNORM_DTYPE_NONE;
    r->param_dtype = LNORM_DTYPE_NONE;
    r->rows = rows;
    r->hidden = hidden;
    r->eps = LNORM_DEFAULT_EPS;
    r->eps_mode = LNORM_EPS_INSIDE;
}

static int valid_dtype(int dt)
{
    return dt == LNORM_DTYPE_F32 || dt == LNORM_DTYPE_F16 || dt == LNORM_DTYPE_BF16;
}

/* 1..128 bytes of [A-Za-z0-9_.:-]. */
static int valid_params_id(const char *id)
{
    size_t n = strlen(id);
    if (n < 1 || n > 128)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = id[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '_' || ch == '.' || ch == ':' || ch == '-';
        if (!ok)
            return 0;
    }
    return 1;
}

int lnorm__valid_params_id(const char *id)
{
    return id && valid_params_id(id);
}

int lnorm_normalize_req_check(const lnorm_normalize_req *r, const char **why)
{
    const char *w = NULL;
    if (!r)
        w = "request is NULL";
    else if (r->op != LNORM_OP_LAYERNORM && r->op != LNORM_OP_RMSNORM)
        w = "op must be LNORM_OP_LAYERNORM or LNORM_OP_RMSNORM";
    else if (!valid_dtype(r->x_dtype))
        w = "x_dtype must be f32, f16 or bf16";
    else if (r->y_dtype != LNORM_DTYPE_NONE && !valid_dtype(r->y_dtype))
        w = "y_dtype must be NONE, f32, f16 or bf16";
    else if (r->param_dtype != LNORM_DTYPE_NONE && r->param_dtype != LNORM_DTYPE_F32 &&
             r->param_dtype != r->x_dtype)
        w = "param_dtype must be f32 or x_dtype";
    else if (r->rows < 1)
        w = "rows must be >= 1";
    else if (r->hidden < 1)
        w = "hidden must be >= 1";
    else if (r->hidden > ((uint64_t)1 << 40) || r->rows > (((uint64_t)1 << 60) / r->hidden))
        w = "rows * hidden is too large";
    else if (!(r->eps > 0.0f) || !isfinite(r->eps))
        w = "eps must be finite and > 0";
    else if (r->eps_mode != LNORM_EPS_INSIDE && r->eps_mode != LNORM_EPS_OUTSIDE)
        w = "eps_mode must be LNORM_EPS_INSIDE or LNORM_EPS_OUTSIDE";
    else if (!r->x)
        w = "x is NULL";
    else if (!r->y)
        w = "y is NULL";
    else if (r->residual && !r->residual_out)
        w = "residual given without residual_out";
    else if (!r->residual && r->residual_out)
        w = "residual_out given without residual";
    else if (r->params_id && r->params_id[0] && (r->gamma || r->beta))
        w = "params_id and inline gamma/beta are exclusive";
    else if (r->params_id && r->params_id[0] && !valid_params_id(r->params_id))
        w = "params_id must be 1..128 bytes of [A-Za-z0-9_.:-]";
    else if (r->op == LNORM_OP_RMSNORM && r->mean)
        w = "mean is not defined for RMSNorm (pass mean = NULL)";
    if (why)
        *why = w;
    return w ? LNORM_EINVAL : LNORM_OK;
}

/* The state of one normalize call. */
typedef struct norm_state {
    lnorm_normalize_req r;
    char params_id[129];
    int stats;
    size_t xs, ys, ps;        /* element sizes of x, y, params */
    uint64_t rows_per_chunk;
} norm_state;

/* ---- the chunk request, encoded by hand ------------------------------------
 * The same bytes protobuf-c would write (fields in number order, proto3
 * zero scalars left out), plus one thing: an unknown field of NormalizeRequest
 * (number LNORM__PAD_FIELD, bytes) right before x, of the length that puts
 * x's first byte at LNORM__X_PHASE mod 16 in the message body, at least
 * LNORM__X_MIN_OFFSET bytes in. lnormd's NNG
 * 1.5 receive buffer body starts 4 bytes past a 16-byte boundary (32 bytes of
 * headroom in a malloc block, then the 4-byte REQ header moved out of the
 * body), so x then lies 16-byte aligned in the server's memory and lnormd
 * (CPU backend) computes y over x in the message and sends it back without
 * copying either. Any protobuf reader skips the unknown field; if the phase is
 * wrong for another server, nothing breaks (lnormd then copies). */
#define LNORM__PAD_FIELD 2047u
#define LNORM__X_PHASE 12u
/* ... and at least this far into the body, so that lnormd has room to write
 * the reply's other fields (request id, status, timings: at most ~61 bytes)
 * in front of y without moving it. */
#define LNORM__X_MIN_OFFSET 64u

static size_t vlen(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_v(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static uint8_t *put_key(uint8_t *p, uint32_t field, int wt)
{
    return put_v(p, ((uint64_t)field << 3) | (uint64_t)wt);
}

/* A varint field, left out when 0 (proto3). */
static size_t len_u(uint64_t v)
{
    return v ? 1 + vlen(v) : 0;
}

static uint8_t *put_u(uint8_t *p, uint32_t field, uint64_t v)
{
    if (!v)
        return p;
    p = put_key(p, field, 0);
    return put_v(p, v);
}

/* A bytes field, left out when empty. */
static size_t len_b(size_t n)
{
    return n ? 1 + vlen(n) + n : 0;
}

static uint8_t *put_b(uint8_t *p, uint32_t field, const void *data, size_t n)
{
    if (!n)
        return p;
    p = put_key(p, field, 2);
    p = put_v(p, n);
    memcpy(p, data, n);
    return p + n;
}

static int norm_make(lnorm__call *call, uint64_t i, uint64_t id, nng_msg **out)
{
    norm_state *st = call->data;
    const lnorm_normalize_req *r = &st->r;
    uint64_t r0 = i * st->rows_per_chunk;
    uint64_t nr = r->rows - r0 < st->rows_per_chunk ? r->rows - r0 : st->rows_per_chunk;
    size_t xrow = (size_t)r->hidden * st->xs;
    size_t xn = nr * xrow, rn = r->residual ? xn : 0;
    const uint8_t *x = (const uint8_t *)r->x + r0 * xrow;
    const uint8_t *res = r->residual ? (const uint8_t *)r->residual + r0 * xrow : NULL;
    size_t pn = (size_t)r->hidden * st->ps;
    size_t gn = r->gamma && !st->params_id[0] ? pn : 0, bn = r->beta && !st->params_id[0] ? pn : 0;
    size_t idn = strlen(st->params_id);
    int has_aff = idn || gn || bn;
    size_t aff = idn ? len_b(idn) : len_u((uint64_t)r->param_dtype) + len_b(gn) + len_b(bn);

    /* NormalizeRequest fields 1..7, then pad, x, residual, affine, want_stats,
     * priority, max_queue_us */
    size_t head = len_u((uint64_t)r->op) + len_u((uint64_t)r->x_dtype) + len_u((uint64_t)r->y_dtype) +
                  len_u(nr) + len_u(r->hidden) + 5 /* eps: key + fixed32 */ + len_u((uint64_t)r->eps_mode);
    size_t tail = len_b(xn) + len_b(rn) + (has_aff ? 1 + vlen(aff) + aff : 0) + (st->stats ? 2 : 0) +
                  len_u(r->priority) + len_u(r->max_queue_us);
    size_t pre = len_u(id) + len_u(call->deadline_us);
    size_t pad = 0, inner = 0;
    for (int k = 0; k < 8; k++) { /* the length of normalize depends on the pad */
        inner = head + pad + tail;
        size_t xoff = pre + 1 + vlen(inner) + head + pad + 1 + vlen(xn);
        size_t want = (LNORM__X_PHASE + 16 - xoff % 16) % 16;
        if (want == 0 && xoff >= LNORM__X_MIN_OFFSET)
            break;
        pad += want ? want : 16;
        while (pad < 3)
            pad += 16;
    }
    if (pad > 130) /* the pad's length must fit one byte: no alignment then */
        pad = 0;
    inner = head + pad + tail;
    size_t total = pre + 1 + vlen(inner) + inner;

    nng_msg *m = lnorm__msg_get(call->c, total);
    if (!m)
        return LNORM_ENOMEM;
    uint8_t *p0 = nng_msg_body(m), *p = p0;
    p = put_u(p, 1, id);
    p = put_u(p, 2, call->deadline_us);
    p = put_key(p, 10, 2);
    p = put_v(p, inner);
    p = put_u(p, 1, (uint64_t)r->op);
    p = put_u(p, 2, (uint64_t)r->x_dtype);
    p = put_u(p, 3, (uint64_t)r->y_dtype);
    p = put_u(p, 4, nr);
    p = put_u(p, 5, r->hidden);
    p = put_key(p, 6, 5);
    memcpy(p, &r->eps, 4); /* little-endian hosts only (as the payloads) */
    p += 4;
    p = put_u(p, 7, (uint64_t)r->eps_mode);
    if (pad) {
        p = put_key(p, LNORM__PAD_FIELD, 2);
        p = put_v(p, pad - 3);
        memset(p, 0, pad - 3);
        p += pad - 3;
    }
    p = put_b(p, 8, x, xn);
    p = put_b(p, 9, res, rn);
    if (has_aff) {
        p = put_key(p, 10, 2);
        p = put_v(p, aff);
        if (idn) {
            p = put_b(p, 4, st->params_id, idn);
        } else {
            p = put_u(p, 1, (uint64_t)r->param_dtype);
            p = put_b(p, 2, r->gamma, gn);
            p = put_b(p, 3, r->beta, bn);
        }
    }
    if (st->stats) {
        p = put_key(p, 11, 0);
        *p++ = 1;
    }
    p = put_u(p, 12, r->priority);
    p = put_u(p, 13, r->max_queue_us);
    if ((size_t)(p - p0) != total) {
        nng_msg_free(m);
        return LNORM_EINTERNAL;
    }
    *out = m;
    return LNORM_OK;
}

static int norm_take(lnorm__call *call, uint64_t i, const lnorm__resp_view *resp)
{
    norm_state *st = call->data;
    const lnorm_normalize_req *r = &st->r;
    lnorm__span f[5];
    if (resp->body != LNORM__V1__RESPONSE__BODY_NORMALIZE ||
        lnorm__norm_parse(resp->body_bytes, f) != LNORM_OK)
        return LNORM_EPROTO;
    uint64_t r0 = i * st->rows_per_chunk;
    uint64_t rows = r->rows - r0 < st->rows_per_chunk ? r->rows - r0 : st->rows_per_chunk;
    size_t yb = rows * r->hidden * st->ys, xb = rows * r->hidden * st->xs;
    if (f[1].n != yb)
        return LNORM_EPROTO;
    if (st->stats && f[3].n != rows * 4)
        return LNORM_EPROTO;
    if (st->stats && r->op == LNORM_OP_LAYERNORM && f[2].n != rows * 4)
        return LNORM_EPROTO;
    if (r->residual && f[4].n != xb)
        return LNORM_EPROTO;
    memcpy((uint8_t *)r->y + r0 * r->hidden * st->ys, f[1].p, yb);
    if (r->mean && st->stats)
        memcpy(r->mean + r0, f[2].p, rows * 4);
    if (r->rstd && st->stats)
        memcpy(r->rstd + r0, f[3].p, rows * 4);
    if (r->residual)
        memcpy((uint8_t *)r->residual_out + r0 * r->hidden * st->xs, f[4].p, xb);
    return LNORM_OK;
}

static void norm_cleanup(lnorm__call *call)
{
    free(call->data);
}

static const lnorm__call_ops norm_ops = {norm_make, norm_take};

/* Build (but do not start) the call of a normalize request. */
static int norm_prepare(lnorm_client *c, const lnorm_normalize_req *req, lnorm__call **out,
                        const char **why)
{
    *why = NULL;
    if (!c) {
        *why = "client is NULL";
        return LNORM_EINVAL;
    }
    int rv = lnorm_normalize_req_check(req, why);
    if (rv != LNORM_OK)
        return rv;
    norm_state *st = calloc(1, sizeof *st);
    if (!st)
        return LNORM_ENOMEM;
    st->r = *req;
    if (st->r.y_dtype == LNORM_DTYPE_NONE)
        st->r.y_dtype = st->r.x_dtype;
    if (st->r.param_dtype == LNORM_DTYPE_NONE)
        st->r.param_dtype = st->r.x_dtype;
    if (req->params_id && req->params_id[0])
        memcpy(st->params_id, req->params_id, strlen(req->params_id) + 1);
    st->r.params_id = NULL;
    st->stats = req->want_stats || req->mean || req->rstd;
    st->xs = lnorm_dtype_size(st->r.x_dtype);
    st->ys = lnorm_dtype_size(st->r.y_dtype);
    st->ps = lnorm_dtype_size(st->r.param_dtype);
    size_t chunk = req->chunk_bytes ? req->chunk_bytes : c->opts.chunk_bytes;
    size_t row_bytes = (size_t)req->hidden * st->xs;
    uint64_t rpc = chunk / row_bytes;
    st->rows_per_chunk = rpc < 1 ? 1 : rpc > req->rows ? req->rows : rpc;
    /* within the servers' max-message-bytes and max_recv_bytes (limits.c) */
    size_t fixed = 512 + (st->params_id[0] ? 0 : (req->gamma != NULL) + (req->beta != NULL)) * req->hidden * st->ps;
    size_t reply_row = (size_t)req->hidden * st->ys + (req->residual ? row_bytes : 0) + (st->stats ? 8 : 0);
    if ((rv = lnorm__fit_rows(c, row_bytes * (req->residual ? 2 : 1), fixed, reply_row, &st->rows_per_chunk, why)) !=
        LNORM_OK) {
        free(st);
        return rv;
    }

    lnorm__call *call;
    if ((rv = lnorm__call_new(c, &norm_ops, &call)) != LNORM_OK) {
        free(st);
        return rv;
    }
    call->data = st;
    call->cleanup = norm_cleanup;
    call->nchunks = (req->rows + st->rows_per_chunk - 1) / st->rows_per_chunk;
    call->depth = c->opts.pipeline_depth;
    if (req->timeout_ms != 0) {
        call->recv_timeout = req->timeout_ms < 0 ? NNG_DURATION_INFINITE : req->timeout_ms;
        /* send_deadline: the server's deadline is this call's timeout
         * (none when it waits forever), as the client's is otherwise */
        if (c->opts.send_deadline)
            call->deadline_us = req->timeout_ms < 0 ? 0 : (uint64_t)req->timeout_ms * 1000u;
    }
    *out = call;
    return LNORM_OK;
}

int lnorm__normalize_chunk_msg(lnorm_client *c, const lnorm_normalize_req *req, uint64_t i, uint64_t id,
                               uint64_t *nchunks, nng_msg **out)
{
    lnorm__call *call;
    const char *why;
    int rv = norm_prepare(c, req, &call, &why);
    if (rv != LNORM_OK)
        return rv;
    *nchunks = call->nchunks;
    rv = i < call->nchunks ? norm_make(call, i, id, out) : LNORM_EINVAL;
    call->cleanup(call);
    free(call);
    return rv;
}

static void fail_result(lnorm_result *res, int rv, const char *why)
{
    if (!res)
        return;
    memset(res, 0, sizeof *res);
    lnorm__result_fail(res, rv, -1, "%s", why ? why : lnorm_strerror(rv));
}

int lnorm_normalize(lnorm_client *c, const lnorm_normalize_req *req, lnorm_result *res)
{
    lnorm__call *call;
    const char *why;
    if (c && req && c->opts.auto_shm_bytes) {
        int arv = lnorm__auto_normalize(c, req, res);
        if (arv != LNORM__AUTO_NO)
            return arv;
    }
    /* the servers' limits first, once per new connection (limits.c) */
    int rv = c && lnorm_normalize_req_check(req, NULL) == LNORM_OK ? lnorm__limits_refresh(c, req->timeout_ms, res)
                                                                  : LNORM_OK;
    if (rv != LNORM_OK)
        return rv;
    rv = norm_prepare(c, req, &call, &why);
    if (rv != LNORM_OK) {
        fail_result(res, rv, why);
        return rv;
    }
    return lnorm__call_sync(call, res);
}

int lnorm_normalize_async(lnorm_client *c, const lnorm_normalize_req *req, lnorm_callback cb,
                          void *arg)
{
    if (!cb)
        return LNORM_EINVAL;
    lnorm__call *call;
    const char *why;
    int rv = norm_prepare(c, req, &call, &why);
    if (rv != LNORM_OK)
        return rv;
    lnorm__limits_kick(c); /* (for later calls: this one does not wait) */
    call->cb = cb;
    call->cb_arg = arg;
    return lnorm__call_start(call, NULL);
}
