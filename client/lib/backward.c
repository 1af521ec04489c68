/*
 * lnorm_normalize_backward and its async variant: validation, the split by
 * rows into chunks (x and dy together up to chunk_bytes), the encoding of
 * each chunk (protobuf-c), the copy of each reply's dx, and the sum of the
 * chunks' dgamma / dbeta once the last chunk is in.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void lnorm_normalize_backward_req_init(lnorm_normalize_backward_req *r, lnorm_op op, lnorm_dtype x_dtype,
                                       uint64_t rows, uint64_t hidden)
{
    memset(r, 0, sizeof *r);
    r->op = op;
    r->x_dtype = x_dtype;
    r->rows = rows;
    r->hidden = hidden;
    r->eps = LNORM_DEFAULT_EPS;
    r->eps_mode = LNORM_EPS_INSIDE;
}

static int dt_ok(int dt)
{
    return dt == LNORM_DTYPE_F32 || dt == LNORM_DTYPE_F16 || dt == LNORM_DTYPE_BF16;
}

int lnorm_normalize_backward_req_check(const lnorm_normalize_backward_req *r, const char **why)
{
    const char *w = NULL;
    if (!r)
        w = "request is NULL";
    else if (r->op != LNORM_OP_LAYERNORM && r->op != LNORM_OP_RMSNORM)
        w = "op must be LNORM_OP_LAYERNORM or LNORM_OP_RMSNORM";
    else if (!dt_ok(r->x_dtype))
        w = "x_dtype must be f32, f16 or bf16";
    else if (r->dy_dtype != LNORM_DTYPE_NONE && !dt_ok(r->dy_dtype))
        w = "dy_dtype must be NONE, f32, f16 or bf16";
    else if (r->dx_dtype != LNORM_DTYPE_NONE && !dt_ok(r->dx_dtype))
        w = "dx_dtype must be NONE, f32, f16 or bf16";
    else if (r->param_dtype != LNORM_DTYPE_NONE && r->param_dtype != LNORM_DTYPE_F32 &&
             r->param_dtype != r->x_dtype)
        w = "param_dtype must be NONE, f32 or x_dtype";
    else if (r->rows < 1 || r->hidden < 1)
        w = "rows and hidden must be >= 1";
    else if (r->hidden > (1ull << 40) || r->rows > (1ull << 40))
        w = "rows or hidden too large";
    else if (!(r->eps > 0.0f) || !isfinite(r->eps))
        w = "eps must be finite and > 0";
    else if (r->eps_mode != LNORM_EPS_INSIDE && r->eps_mode != LNORM_EPS_OUTSIDE)
        w = "eps_mode must be LNORM_EPS_INSIDE or LNORM_EPS_OUTSIDE";
    else if (!r->x || !r->dy)
        w = "x and dy are required";
    else if (!r->dx && !r->dgamma && !r->dbeta)
        w = "no output: give dx, dgamma or dbeta";
    else if (r->gamma && r->params_id && r->params_id[0])
        w = "gamma and params_id are exclusive";
    else if (r->params_id && r->params_id[0] && !lnorm__valid_params_id(r->params_id))
        w = "params_id must be 1..128 bytes of [A-Za-z0-9_.:-]";
    else if (r->op == LNORM_OP_RMSNORM && r->mean)
        w = "mean: RMSNorm has no mean";
    else if (r->op == LNORM_OP_LAYERNORM && !r->mean != !r->rstd)
        w = "mean and rstd: LayerNorm takes both or neither";
    if (why)
        *why = w;
    return w ? LNORM_EINVAL : LNORM_OK;
}

typedef struct bwd_state {
    lnorm_normalize_backward_req r; /* dtypes resolved */
    char params_id[129];
    size_t xs, dys, dxs, ps;
    uint64_t rows_per_chunk;
    float *parts;             /* nchunks x hidden dgamma parts, then as many dbeta */
    atomic_uint_fast64_t taken;
} bwd_state;

static int bwd_make(lnorm__call *call, uint64_t i, uint64_t id, nng_msg **out)
{
    bwd_state *st = call->data;
    const lnorm_normalize_backward_req *r = &st->r;
    const uint64_t r0 = i * st->rows_per_chunk;
    const uint64_t nr = r->rows - r0 < st->rows_per_chunk ? r->rows - r0 : st->rows_per_chunk;
    const size_t H = (size_t)r->hidden;
    Lnorm__V1__NormalizeBackwardRequest b = LNORM__V1__NORMALIZE_BACKWARD_REQUEST__INIT;
    Lnorm__V1__Affine a = LNORM__V1__AFFINE__INIT;
    b.op = (Lnorm__V1__Op)r->op;
    b.x_dtype = (Lnorm__V1__DType)r->x_dtype;
    b.dy_dtype = (Lnorm__V1__DType)r->dy_dtype;
    b.dx_dtype = (Lnorm__V1__DType)r->dx_dtype;
    b.rows = nr;
    b.hidden = r->hidden;
    b.eps_present_case = LNORM__V1__NORMALIZE_BACKWARD_REQUEST__EPS_PRESENT_EPS;
    b.eps = r->eps;
    b.eps_mode = (Lnorm__V1__EpsMode)r->eps_mode;
    b.x.data = (uint8_t *)r->x + r0 * H * st->xs;
    b.x.len = nr * H * st->xs;
    b.dy.data = (uint8_t *)r->dy + r0 * H * st->dys;
    b.dy.len = nr * H * st->dys;
    if (r->dres) {
        b.dres.data = (uint8_t *)r->dres + r0 * H * st->xs;
        b.dres.len = b.x.len;
    }
    if (r->mean) {
        b.mean.data = (uint8_t *)(r->mean + r0);
        b.mean.len = nr * 4;
    }
    if (r->rstd) {
        b.rstd.data = (uint8_t *)(r->rstd + r0);
        b.rstd.len = nr * 4;
    }
    if (st->params_id[0]) {
        a.params_id = st->params_id;
        b.affine = &a;
    } else if (r->gamma) {
        a.dtype = (Lnorm__V1__DType)r->param_dtype;
        a.gamma.data = (uint8_t *)r->gamma;
        a.gamma.len = H * st->ps;
        b.affine = &a;
    }
    b.skip_dx = r->dx == NULL;
    b.want_dgamma = r->dgamma != NULL;
    b.want_dbeta = r->dbeta != NULL;
    b.priority = r->priority;
    b.max_queue_us = r->max_queue_us;
    Lnorm__V1__Request q = LNORM__V1__REQUEST__INIT;
    q.request_id = id;
    q.deadline_us = call->deadline_us;
    q.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE_BACKWARD;
    q.normalize_backward = &b;
    return lnorm__pack(&q, out);
}

static int bwd_take(lnorm__call *call, uint64_t i, const lnorm__resp_view *resp)
{
    bwd_state *st = call->data;
    const lnorm_normalize_backward_req *r = &st->r;
    if (resp->body != LNORM__V1__RESPONSE__BODY_NORMALIZE_BACKWARD)
        return LNORM_EPROTO;
    Lnorm__V1__NormalizeBackwardResponse *b =
        lnorm__v1__normalize_backward_response__unpack(NULL, resp->body_bytes.n, resp->body_bytes.p);
    if (!b)
        return LNORM_EPROTO;
    const uint64_t r0 = i * st->rows_per_chunk;
    const uint64_t nr = r->rows - r0 < st->rows_per_chunk ? r->rows - r0 : st->rows_per_chunk;
    const size_t H = (size_t)r->hidden, dxb = nr * H * st->dxs;
    int rc = LNORM_OK;
    if ((r->dx && b->dx.len != dxb) || (r->dgamma && b->dgamma.len != H * 4) || (r->dbeta && b->dbeta.len != H * 4))
        rc = LNORM_EPROTO;
    if (rc == LNORM_OK) {
        if (r->dx)
            memcpy((uint8_t *)r->dx + r0 * H * st->dxs, b->dx.data, dxb);
        if (r->dgamma)
            memcpy(st->parts + i * H, b->dgamma.data, H * 4);
        if (r->dbeta)
            memcpy(st->parts + (call->nchunks + i) * H, b->dbeta.data, H * 4);
    }
    lnorm__v1__normalize_backward_response__free_unpacked(b, NULL);
    /* The last chunk in sums every chunk's part, in chunk order. */
    if (rc == LNORM_OK && atomic_fetch_add(&st->taken, 1) + 1 == call->nchunks && (r->dgamma || r->dbeta)) {
        if (call->nchunks == 1) {
            if (r->dgamma)
                memcpy(r->dgamma, st->parts, H * 4);
            if (r->dbeta)
                memcpy(r->dbeta, st->parts + H, H * 4);
        } else {
            for (size_t c = 0; c < H; c++) {
                double g = 0.0, be = 0.0;
                for (uint64_t k = 0; k < call->nchunks; k++) {
                    g += st->parts[k * H + c];
                    be += st->parts[(call->nchunks + k) * H + c];
                }
                if (r->dgamma)
                    r->dgamma[c] = (float)g;
                if (r->dbeta)
                    r->dbeta[c] = (float)be;
            }
        }
    }
    return rc;
}

static void bwd_cleanup(lnorm__call *call)
{
    bwd_state *st = call->data;
    if (st)
        free(st->parts);
    free(st);
}

static const lnorm__call_ops bwd_ops = {bwd_make, bwd_take};

static int bwd_prepare(lnorm_client *c, const lnorm_normalize_backward_req *req, lnorm__call **out, const char **why)
{
    *why = NULL;
    if (!c) {
        *why = "client is NULL";
        return LNORM_EINVAL;
    }
    int rv = lnorm_normalize_backward_req_check(req, why);
    if (rv != LNORM_OK)
        return rv;
    bwd_state *st = calloc(1, sizeof *st);
    if (!st)
        return LNORM_ENOMEM;
    st->r = *req;
    if (st->r.dy_dtype == LNORM_DTYPE_NONE)
        st->r.dy_dtype = st->r.x_dtype;
    if (st->r.dx_dtype == LNORM_DTYPE_NONE)
        st->r.dx_dtype = st->r.x_dtype;
    if (st->r.param_dtype == LNORM_DTYPE_NONE)
        st->r.param_dtype = st->r.x_dtype;
    if (req->params_id && req->params_id[0])
        memcpy(st->params_id, req->params_id, strlen(req->params_id) + 1);
    st->r.params_id = NULL;
    st->xs = lnorm_dtype_size(st->r.x_dtype);
    st->dys = lnorm_dtype_size(st->r.dy_dtype);
    st->dxs = lnorm_dtype_size(st->r.dx_dtype);
    st->ps = lnorm_dtype_size(st->r.param_dtype);
    size_t chunk = req->chunk_bytes ? req->chunk_bytes : c->opts.chunk_bytes;
    size_t row_bytes = (size_t)req->hidden * (st->xs + st->dys);
    uint64_t rpc = chunk / row_bytes;
    st->rows_per_chunk = rpc < 1 ? 1 : rpc > req->rows ? req->rows : rpc;
    uint64_t nchunks = (req->rows + st->rows_per_chunk - 1) / st->rows_per_chunk;
    if ((req->dgamma || req->dbeta) && !(st->parts = calloc(2 * nchunks * (size_t)req->hidden, sizeof(float)))) {
        free(st);
        return LNORM_ENOMEM;
    }
    lnorm__call *call;
    if ((rv = lnorm__call_new(c, &bwd_ops, &call)) != LNORM_OK) {
        free(st->parts);
        free(st);
        return rv;
    }
    call->data = st;
    call->cleanup = bwd_cleanup;
    call->nchunks = nchunks;
    call->depth = c->opts.pipeline_depth;
    if (req->timeout_ms != 0) {
        call->recv_timeout = req->timeout_ms < 0 ? NNG_DURATION_INFINITE : req->timeout_ms;
        if (c->opts.send_deadline)
            call->deadline_us = req->timeout_ms < 0 ? 0 : (uint64_t)req->timeout_ms * 1000u;
    }
    *out = call;
    return LNORM_OK;
}

int lnorm_normalize_backward(lnorm_client *c, const lnorm_normalize_backward_req *req, lnorm_result *res)
{
    lnorm__call *call;
    const char *why;
    int rv = bwd_prepare(c, req, &call, &why);
    if (rv != LNORM_OK) {
        if (res) {
            memset(res, 0, sizeof *res);
            lnorm__result_fail(res, rv, -1, "%s", why ? why : lnorm_strerror(rv));
        }
        return rv;
    }
    return lnorm__call_sync(call, res);
}

int lnorm_normalize_backward_async(lnorm_client *c, const lnorm_normalize_backward_req *req, lnorm_callback cb,
                                   void *arg)
{
    if (!cb)
        return LNORM_EINVAL;
    lnorm__call *call;
    const char *why;
    int rv = bwd_prepare(c, req, &call, &why);
    if (rv != LNORM_OK)
        return rv;
    call->cb = cb;
    call->cb_arg = arg;
    return lnorm__call_start(call, NULL);
}
