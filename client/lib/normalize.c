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

static int norm_make(lnorm__call *call, uint64_t i, uint64_t id, nng_msg **out)
{
    norm_state *st = call->data;
    const lnorm_normalize_req *r = &st->r;
    uint64_t r0 = i * st->rows_per_chunk;
    uint64_t nr = r->rows - r0 < st->rows_per_chunk ? r->rows - r0 : st->rows_per_chunk;
    size_t xrow = (size_t)r->hidden * st->xs;

    Lnorm__V1__NormalizeRequest n = LNORM__V1__NORMALIZE_REQUEST__INIT;
    n.op = (Lnorm__V1__Op)r->op;
    n.x_dtype = (Lnorm__V1__DType)r->x_dtype;
    n.y_dtype = (Lnorm__V1__DType)r->y_dtype;
    n.rows = nr;
    n.hidden = r->hidden;
    n.eps_present_case = LNORM__V1__NORMALIZE_REQUEST__EPS_PRESENT_EPS;
    n.eps = r->eps;
    n.eps_mode = (Lnorm__V1__EpsMode)r->eps_mode;
    n.x.data = (uint8_t *)r->x + r0 * xrow;
    n.x.len = nr * xrow;
    if (r->residual) {
        n.residual.data = (uint8_t *)r->residual + r0 * xrow;
        n.residual.len = nr * xrow;
    }
    Lnorm__V1__Affine aff = LNORM__V1__AFFINE__INIT;
    if (st->params_id[0]) {
        aff.params_id = st->params_id;
        n.affine = &aff;
    } else if (r->gamma || r->beta) {
        aff.dtype = (Lnorm__V1__DType)r->param_dtype;
        if (r->gamma) {
            aff.gamma.data = (uint8_t *)r->gamma;
            aff.gamma.len = r->hidden * st->ps;
        }
        if (r->beta) {
            aff.beta.data = (uint8_t *)r->beta;
            aff.beta.len = r->hidden * st->ps;
        }
        n.affine = &aff;
    }
    n.want_stats = st->stats;

    Lnorm__V1__Request req = LNORM__V1__REQUEST__INIT;
    req.request_id = id;
    req.deadline_us = call->deadline_us;
    req.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE;
    req.normalize = &n;
    return lnorm__pack(&req, out);
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

    lnorm__call *call;
    if ((rv = lnorm__call_new(c, &norm_ops, &call)) != LNORM_OK) {
        free(st);
        return rv;
    }
    call->data = st;
    call->cleanup = norm_cleanup;
    call->nchunks = (req->rows + st->rows_per_chunk - 1) / st->rows_per_chunk;
    call->depth = c->opts.pipeline_depth;
    if (req->timeout_ms != 0)
        call->recv_timeout = req->timeout_ms < 0 ? NNG_DURATION_INFINITE : req->timeout_ms;
    *out = call;
    return LNORM_OK;
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
    int rv = norm_prepare(c, req, &call, &why);
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
    call->cb = cb;
    call->cb_arg = arg;
    return lnorm__call_start(call);
}
