/* Decoding + validation of lnorm.v1.Request, packing of lnorm.v1.Response. */
#include <math.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "lnorm/errors.h"
#include "lnorm/ring.h"
#include "lnorm_scan.h"
#include "lnorm_wire.h"

static int lnorm__fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int lnorm__fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* a * b, or 0 with *ovf set when it does not fit in size_t. */
static size_t lnorm__mul(uint64_t a, uint64_t b, int *ovf)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r) || r > (uint64_t)SIZE_MAX) {
        *ovf = 1;
        return 0;
    }
    return (size_t)r;
}

/* Peek request_id (field 1, varint) when it is the first field. */
static uint64_t lnorm__peek_request_id(const uint8_t *buf, size_t len)
{
    if (len < 2 || buf[0] != 0x08)
        return 0;
    uint64_t v = 0;
    for (size_t i = 1; i < len && i < 11; i++) {
        v |= (uint64_t)(buf[i] & 0x7f) << (7 * (i - 1));
        if (!(buf[i] & 0x80))
            return v;
    }
    return 0;
}

static int lnorm__dtype_ok(int dt)
{
    return dt == LNORM_DTYPE_F32 || dt == LNORM_DTYPE_F16 || dt == LNORM_DTYPE_BF16;
}

int lnorm__codec_params_id_ok(const char *id)
{
    size_t n = id ? strlen(id) : 0;
    if (n < 1 || n > 128)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
              c == '.' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

static uint64_t lnorm__max_hidden(const lnorm__limits *lim)
{
    return lim->max_hidden < LNORM_CORE_MAX_HIDDEN ? lim->max_hidden : LNORM_CORE_MAX_HIDDEN;
}

/* Record tensor t given by reference: bytes must be want, the offset
 * aligned to align. */
static int lnorm__take_ref(lnorm__decoded *d, int t, const char *what, uint64_t region, uint64_t offset,
                           uint64_t bytes, size_t want, size_t align, char *err, size_t errlen)
{
    if (!region)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "%s.region: 0 is not a region id", what);
    if (bytes != want)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "%s.bytes: %llu, but the shape and dtype give %zu", what,
                           (unsigned long long)bytes, want);
    if (offset % align)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "%s.offset: %llu is not a multiple of %zu (the element size)",
                           what, (unsigned long long)offset, align);
    lnorm__tref *r = &d->ref[t];
    r->set = 1;
    r->region = region;
    r->offset = offset;
    r->bytes = bytes;
    r->align = align;
    d->nrefs++;
    return LNORM_OK;
}

static int lnorm__msg_ref(lnorm__decoded *d, int t, const char *what, const Lnorm__V1__ShmRef *r, size_t want,
                          size_t align, char *err, size_t errlen)
{
    return lnorm__take_ref(d, t, what, r->region, r->offset, r->bytes, want, align, err, errlen);
}

static int lnorm__check_normalize(const Lnorm__V1__NormalizeRequest *n, const lnorm__limits *lim,
                                  lnorm__decoded *d, char *err, size_t errlen)
{
    if (n->op != LNORM__V1__OP__OP_LAYER_NORM && n->op != LNORM__V1__OP__OP_RMS_NORM)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.op: %d is not OP_LAYER_NORM or OP_RMS_NORM", (int)n->op);
    if (!lnorm__dtype_ok(n->x_dtype))
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.x_dtype: %d is not F32, F16 or BF16", (int)n->x_dtype);
    int ydt = n->y_dtype == LNORM__V1__DTYPE__DTYPE_UNSPECIFIED ? (int)n->x_dtype : (int)n->y_dtype;
    if (!lnorm__dtype_ok(ydt))
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.y_dtype: unknown dtype %d", (int)n->y_dtype);
    if (n->eps_mode != LNORM__V1__EPS_MODE__EPS_INSIDE_SQRT && n->eps_mode != LNORM__V1__EPS_MODE__EPS_OUTSIDE_SQRT)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.eps_mode: unknown value %d", (int)n->eps_mode);
    float eps = LNORM_DEFAULT_EPS;
    if (n->eps_present_case == LNORM__V1__NORMALIZE_REQUEST__EPS_PRESENT_EPS) {
        eps = n->eps;
        if (!isfinite(eps) || !(eps > 0.0f))
            return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.eps: %g is not finite and > 0", (double)eps);
    }
    const char *ewhy = NULL;
    if (lnorm_eps_validate(eps, (int)n->eps_mode, &ewhy) != LNORM_OK)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.%s", ewhy);
    if (n->rows < 1)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.rows: must be >= 1");
    if (n->hidden < 1)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.hidden: must be >= 1");
    if (n->rows > lim->max_rows)
        return lnorm__fail(err, errlen, LNORM_ELIMIT, "normalize.rows: %llu exceeds max-rows %llu",
                           (unsigned long long)n->rows, (unsigned long long)lim->max_rows);
    if (n->hidden > lnorm__max_hidden(lim))
        return lnorm__fail(err, errlen, LNORM_ELIMIT, "normalize.hidden: %llu exceeds max-hidden %llu",
                           (unsigned long long)n->hidden, (unsigned long long)lnorm__max_hidden(lim));
    int ovf = 0;
    size_t elems = lnorm__mul(n->rows, n->hidden, &ovf);
    size_t xbytes = lnorm__mul(elems, lnorm_dtype_size(n->x_dtype), &ovf);
    size_t ybytes = lnorm__mul(elems, lnorm_dtype_size(ydt), &ovf);
    size_t sbytes = lnorm__mul(n->rows, 4, &ovf);
    /* A tensor in shared memory is not bounded by the message size. */
    if (ovf || (!n->x_ref && xbytes > lim->max_message_bytes))
        return lnorm__fail(err, errlen, LNORM_ELIMIT,
                           "normalize.rows x hidden: %llu x %llu %s elements exceed max-message-bytes",
                           (unsigned long long)n->rows, (unsigned long long)n->hidden, lnorm_dtype_name(n->x_dtype));
    size_t xs = lnorm_dtype_size(n->x_dtype), ys = lnorm_dtype_size(ydt);
    int rc;
    if (n->x_ref) {
        if (n->x.len)
            return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.x: inline bytes and x_ref are exclusive");
        if ((rc = lnorm__msg_ref(d, LNORM__T_X, "normalize.x_ref", n->x_ref, xbytes, xs, err, errlen)))
            return rc;
    } else if (n->x.len != xbytes) {
        return lnorm__fail(err, errlen, LNORM_EINVAL,
                           "normalize.x: %zu bytes, but rows x hidden x %s = %llu x %llu x %zu = %zu",
                           n->x.len, lnorm_dtype_name(n->x_dtype), (unsigned long long)n->rows,
                           (unsigned long long)n->hidden, lnorm_dtype_size(n->x_dtype), xbytes);
    }
    if (n->residual.len != 0 && n->residual.len != xbytes)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.residual: %zu bytes, expected 0 or %zu (the shape and dtype of x)",
                           n->residual.len, xbytes);
    if (n->residual_ref) {
        if (n->residual.len)
            return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.residual: inline bytes and residual_ref are exclusive");
        if ((rc = lnorm__msg_ref(d, LNORM__T_RESIDUAL, "normalize.residual_ref", n->residual_ref, xbytes, xs, err, errlen)))
            return rc;
    }
    int has_res = n->residual.len || n->residual_ref;
    if (n->y_ref && (rc = lnorm__msg_ref(d, LNORM__T_Y, "normalize.y_ref", n->y_ref, ybytes, ys, err, errlen)))
        return rc;
    if (n->residual_out_ref) {
        if (!has_res)
            return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.residual_out_ref: given without a residual");
        if ((rc = lnorm__msg_ref(d, LNORM__T_RES_OUT, "normalize.residual_out_ref", n->residual_out_ref, xbytes, xs,
                                 err, errlen)))
            return rc;
    }
    if (n->mean_ref) {
        if (!(n->want_stats && n->op == LNORM__V1__OP__OP_LAYER_NORM))
            return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.mean_ref: given without want_stats on a LayerNorm");
        if ((rc = lnorm__msg_ref(d, LNORM__T_MEAN, "normalize.mean_ref", n->mean_ref, sbytes, 4, err, errlen)))
            return rc;
    }
    if (n->rstd_ref) {
        if (!n->want_stats)
            return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.rstd_ref: given without want_stats");
        if ((rc = lnorm__msg_ref(d, LNORM__T_RSTD, "normalize.rstd_ref", n->rstd_ref, sbytes, 4, err, errlen)))
            return rc;
    }

    lnorm_segment *s = &d->seg;
    lnorm_segment_init(s, (lnorm_op)n->op, (lnorm_dtype)n->x_dtype, (int64_t)n->rows, (int64_t)n->hidden);
    s->y_dtype = ydt;
    s->eps = eps;
    s->eps_mode = (int32_t)n->eps_mode;
    s->x = n->x_ref ? NULL : n->x.data;
    d->in_bytes = n->x_ref ? 0 : xbytes;
    if (has_res) {
        s->residual = n->residual.len ? n->residual.data : NULL;
        d->res_out_bytes = xbytes;
        d->in_bytes += n->residual.len;
    }
    d->priority = n->priority;
    d->max_queue_us = n->max_queue_us;
    const Lnorm__V1__Affine *a = n->affine;
    if (a) {
        int has_id = a->params_id && a->params_id[0];
        if (has_id) {
            if (a->gamma.len || a->beta.len || a->gamma_ref || a->beta_ref ||
                a->dtype != LNORM__V1__DTYPE__DTYPE_UNSPECIFIED)
                return lnorm__fail(err, errlen, LNORM_EINVAL,
                                   "normalize.affine: params_id and inline gamma/beta/dtype are exclusive");
            if (!lnorm__codec_params_id_ok(a->params_id))
                return lnorm__fail(err, errlen, LNORM_EINVAL,
                                   "normalize.affine.params_id: must be 1..128 bytes of [A-Za-z0-9_.:-]");
            d->params_id = a->params_id;
        } else {
            int pdt = a->dtype == LNORM__V1__DTYPE__DTYPE_UNSPECIFIED ? (int)n->x_dtype : (int)a->dtype;
            if (pdt != LNORM_DTYPE_F32 && pdt != (int)n->x_dtype)
                return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.affine.dtype: %d must be F32 or x_dtype",
                                   (int)a->dtype);
            size_t pbytes = lnorm__mul(n->hidden, lnorm_dtype_size(pdt), &ovf);
            if (a->gamma.len != 0 && a->gamma.len != pbytes)
                return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.affine.gamma: %zu bytes, expected 0 or hidden x %s = %zu",
                                   a->gamma.len, lnorm_dtype_name(pdt), pbytes);
            if (a->beta.len != 0 && a->beta.len != pbytes)
                return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.affine.beta: %zu bytes, expected 0 or hidden x %s = %zu",
                                   a->beta.len, lnorm_dtype_name(pdt), pbytes);
            if (a->gamma_ref) {
                if (a->gamma.len)
                    return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.affine.gamma: inline bytes and gamma_ref are exclusive");
                if ((rc = lnorm__msg_ref(d, LNORM__T_GAMMA, "normalize.affine.gamma_ref", a->gamma_ref, pbytes,
                                         lnorm_dtype_size(pdt), err, errlen)))
                    return rc;
            }
            if (a->beta_ref) {
                if (a->beta.len)
                    return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize.affine.beta: inline bytes and beta_ref are exclusive");
                if ((rc = lnorm__msg_ref(d, LNORM__T_BETA, "normalize.affine.beta_ref", a->beta_ref, pbytes,
                                         lnorm_dtype_size(pdt), err, errlen)))
                    return rc;
            }
            s->param_dtype = pdt;
            s->gamma = a->gamma.len ? a->gamma.data : NULL;
            s->beta = a->beta.len ? a->beta.data : NULL;
            d->in_bytes += a->gamma.len + a->beta.len;
        }
    }
    d->y_bytes = ybytes;
    d->stat_bytes = sbytes;
    d->want_rstd = n->want_stats ? 1 : 0;
    d->want_mean = n->want_stats && n->op == LNORM__V1__OP__OP_LAYER_NORM;
    return LNORM_OK;
}

/* ---- ring descriptors ------------------------------------------------------ */

/* A NormalizeBackward body: every field checked, d->bseg filled. */
static int lnorm__check_backward(const Lnorm__V1__NormalizeBackwardRequest *n, const lnorm__limits *lim,
                                 lnorm__decoded *d, char *err, size_t errlen)
{
    if (n->op != LNORM__V1__OP__OP_LAYER_NORM && n->op != LNORM__V1__OP__OP_RMS_NORM)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize_backward.op: %d is not OP_LAYER_NORM or OP_RMS_NORM",
                           (int)n->op);
    if (!lnorm__dtype_ok(n->x_dtype))
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize_backward.x_dtype: %d is not F32, F16 or BF16",
                           (int)n->x_dtype);
    int dydt = n->dy_dtype == LNORM__V1__DTYPE__DTYPE_UNSPECIFIED ? (int)n->x_dtype : (int)n->dy_dtype;
    if (!lnorm__dtype_ok(dydt))
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize_backward.dy_dtype: unknown dtype %d", (int)n->dy_dtype);
    int dxdt = n->dx_dtype == LNORM__V1__DTYPE__DTYPE_UNSPECIFIED ? (int)n->x_dtype : (int)n->dx_dtype;
    if (!lnorm__dtype_ok(dxdt))
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize_backward.dx_dtype: unknown dtype %d", (int)n->dx_dtype);
    if (n->eps_mode != LNORM__V1__EPS_MODE__EPS_INSIDE_SQRT && n->eps_mode != LNORM__V1__EPS_MODE__EPS_OUTSIDE_SQRT)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize_backward.eps_mode: unknown value %d", (int)n->eps_mode);
    float eps = LNORM_DEFAULT_EPS;
    if (n->eps_present_case == LNORM__V1__NORMALIZE_BACKWARD_REQUEST__EPS_PRESENT_EPS)
        eps = n->eps;
    const char *ewhy = NULL;
    if (lnorm_eps_validate(eps, (int)n->eps_mode, &ewhy) != LNORM_OK)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize_backward.%s (%g)", ewhy, (double)eps);
    if (n->rows < 1)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize_backward.rows: must be >= 1");
    if (n->hidden < 1)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize_backward.hidden: must be >= 1");
    if (n->rows > lim->max_rows)
        return lnorm__fail(err, errlen, LNORM_ELIMIT, "normalize_backward.rows: %llu exceeds max-rows %llu",
                           (unsigned long long)n->rows, (unsigned long long)lim->max_rows);
    if (n->hidden > lnorm__max_hidden(lim))
        return lnorm__fail(err, errlen, LNORM_ELIMIT, "normalize_backward.hidden: %llu exceeds max-hidden %llu",
                           (unsigned long long)n->hidden, (unsigned long long)lnorm__max_hidden(lim));
    int ovf = 0;
    size_t elems = lnorm__mul(n->rows, n->hidden, &ovf);
    size_t xbytes = lnorm__mul(elems, lnorm_dtype_size(n->x_dtype), &ovf);
    size_t dybytes = lnorm__mul(elems, lnorm_dtype_size(dydt), &ovf);
    size_t dxbytes = lnorm__mul(elems, lnorm_dtype_size(dxdt), &ovf);
    size_t sbytes = lnorm__mul(n->rows, 4, &ovf);
    size_t gbytes = lnorm__mul(n->hidden, 4, &ovf);
    if (ovf || xbytes > lim->max_message_bytes || dybytes > lim->max_message_bytes)
        return lnorm__fail(err, errlen, LNORM_ELIMIT,
                           "normalize_backward.rows x hidden: %llu x %llu elements exceed max-message-bytes",
                           (unsigned long long)n->rows, (unsigned long long)n->hidden);
    if (n->x.len != xbytes)
        return lnorm__fail(err, errlen, LNORM_EINVAL,
                           "normalize_backward.x: %zu bytes, but rows x hidden x %s = %llu x %llu x %zu = %zu",
                           n->x.len, lnorm_dtype_name(n->x_dtype), (unsigned long long)n->rows,
                           (unsigned long long)n->hidden, lnorm_dtype_size(n->x_dtype), xbytes);
    if (n->dy.len != dybytes)
        return lnorm__fail(err, errlen, LNORM_EINVAL,
                           "normalize_backward.dy: %zu bytes, but rows x hidden x %s = %llu x %llu x %zu = %zu",
                           n->dy.len, lnorm_dtype_name(dydt), (unsigned long long)n->rows,
                           (unsigned long long)n->hidden, lnorm_dtype_size(dydt), dybytes);
    if (n->dres.len != 0 && n->dres.len != xbytes)
        return lnorm__fail(err, errlen, LNORM_EINVAL,
                           "normalize_backward.dres: %zu bytes, expected 0 or %zu (the shape and dtype of x)",
                           n->dres.len, xbytes);
    if (n->mean.len != 0 && n->mean.len != sbytes)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize_backward.mean: %zu bytes, expected 0 or rows x 4 = %zu",
                           n->mean.len, sbytes);
    if (n->rstd.len != 0 && n->rstd.len != sbytes)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize_backward.rstd: %zu bytes, expected 0 or rows x 4 = %zu",
                           n->rstd.len, sbytes);
    if (n->op == LNORM__V1__OP__OP_RMS_NORM && n->mean.len)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "normalize_backward.mean: RMSNorm has no mean");
    if (n->op == LNORM__V1__OP__OP_LAYER_NORM && !n->mean.len != !n->rstd.len)
        return lnorm__fail(err, errlen, LNORM_EINVAL,
                           "normalize_backward.mean: LayerNorm takes mean and rstd together or neither");
    if (n->skip_dx && !n->want_dgamma && !n->want_dbeta)
        return lnorm__fail(err, errlen, LNORM_EINVAL,
                           "normalize_backward.skip_dx: no output wanted (skip_dx without want_dgamma or want_dbeta)");
    lnorm_bwd_segment *s = &d->bseg;
    lnorm_bwd_segment_init(s, (lnorm_op)n->op, (lnorm_dtype)n->x_dtype, (int64_t)n->rows, (int64_t)n->hidden);
    s->dy_dtype = dydt;
    s->dx_dtype = dxdt;
    s->eps = eps;
    s->eps_mode = (int32_t)n->eps_mode;
    s->x = n->x.data;
    s->dy = n->dy.data;
    s->dres = n->dres.len ? n->dres.data : NULL;
    s->mean = n->mean.len ? (const float *)(const void *)n->mean.data : NULL;
    s->rstd = n->rstd.len ? (const float *)(const void *)n->rstd.data : NULL;
    d->in_bytes = xbytes + dybytes + n->dres.len + n->mean.len + n->rstd.len;
    const Lnorm__V1__Affine *a = n->affine;
    if (a) {
        if (a->gamma_ref || a->beta_ref)
            return lnorm__fail(err, errlen, LNORM_EINVAL,
                               "normalize_backward.affine: gamma_ref / beta_ref are not supported by the backward");
        if (a->beta.len)
            return lnorm__fail(err, errlen, LNORM_EINVAL,
                               "normalize_backward.affine.beta: not used by the backward (send gamma only)");
        if (a->params_id && a->params_id[0]) {
            if (a->gamma.len || a->dtype != LNORM__V1__DTYPE__DTYPE_UNSPECIFIED)
                return lnorm__fail(err, errlen, LNORM_EINVAL,
                                   "normalize_backward.affine: params_id and inline gamma/dtype are exclusive");
            if (!lnorm__codec_params_id_ok(a->params_id))
                return lnorm__fail(err, errlen, LNORM_EINVAL,
                                   "normalize_backward.affine.params_id: must be 1..128 bytes of [A-Za-z0-9_.:-]");
            d->params_id = a->params_id;
        } else {
            int pdt = a->dtype == LNORM__V1__DTYPE__DTYPE_UNSPECIFIED ? (int)n->x_dtype : (int)a->dtype;
            if (pdt != LNORM_DTYPE_F32 && pdt != (int)n->x_dtype)
                return lnorm__fail(err, errlen, LNORM_EINVAL,
                                   "normalize_backward.affine.dtype: %d must be F32 or x_dtype", (int)a->dtype);
            size_t pbytes = lnorm__mul(n->hidden, lnorm_dtype_size(pdt), &ovf);
            if (a->gamma.len != 0 && a->gamma.len != pbytes)
                return lnorm__fail(err, errlen, LNORM_EINVAL,
                                   "normalize_backward.affine.gamma: %zu bytes, expected 0 or hidden x %s = %zu",
                                   a->gamma.len, lnorm_dtype_name(pdt), pbytes);
            s->param_dtype = pdt;
            s->gamma = a->gamma.len ? a->gamma.data : NULL;
            d->in_bytes += a->gamma.len;
        }
    }
    d->want_dx = !n->skip_dx;
    d->want_dgamma = n->want_dgamma ? 1 : 0;
    d->want_dbeta = n->want_dbeta ? 1 : 0;
    d->dx_bytes = dxbytes;
    d->grad_bytes = gbytes;
    d->priority = n->priority;
    d->max_queue_us = n->max_queue_us;
    return LNORM_OK;
}

int lnorm__codec_decode_sqe(const lnorm_ring_sqe *q, uint64_t region, const lnorm__limits *lim,
                            lnorm__decoded *d, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    if (err && errlen)
        err[0] = 0;
    d->request_id = q->tag;
    d->deadline_us = q->deadline_us;
    d->kind = LNORM__REQ_NORMALIZE;
    if (q->op != LNORM_OP_LAYERNORM && q->op != LNORM_OP_RMSNORM)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.op: %d is not LAYERNORM or RMSNORM", (int)q->op);
    if (!lnorm__dtype_ok(q->x_dtype))
        return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.x_dtype: %d is not F32, F16 or BF16", (int)q->x_dtype);
    int ydt = q->y_dtype ? (int)q->y_dtype : (int)q->x_dtype;
    if (!lnorm__dtype_ok(ydt))
        return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.y_dtype: unknown dtype %d", (int)q->y_dtype);
    int pdt = q->param_dtype ? (int)q->param_dtype : (int)q->x_dtype;
    if (pdt != LNORM_DTYPE_F32 && pdt != (int)q->x_dtype)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.param_dtype: %d must be F32 or x_dtype", (int)q->param_dtype);
    if (q->eps_mode != LNORM_EPS_INSIDE && q->eps_mode != LNORM_EPS_OUTSIDE)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.eps_mode: unknown value %d", (int)q->eps_mode);
    if (q->want_stats > 1)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.want_stats: %d is not 0 or 1", (int)q->want_stats);
    float eps = q->eps;
    if (eps == 0.0f)
        eps = LNORM_DEFAULT_EPS;
    if (!isfinite(eps) || !(eps > 0.0f))
        return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.eps: %g is not finite and > 0", (double)eps);
    const char *ewhy = NULL;
    if (lnorm_eps_validate(eps, q->eps_mode, &ewhy) != LNORM_OK)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.%s", ewhy);
    if (q->reserved0 || q->reserved1 || q->reserved2)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.reserved: must be 0");
    if (q->rows < 1 || q->hidden < 1)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.rows, sqe.hidden: must be >= 1");
    if (q->rows > lim->max_rows)
        return lnorm__fail(err, errlen, LNORM_ELIMIT, "sqe.rows: %llu exceeds max-rows %llu",
                           (unsigned long long)q->rows, (unsigned long long)lim->max_rows);
    if (q->hidden > lnorm__max_hidden(lim))
        return lnorm__fail(err, errlen, LNORM_ELIMIT, "sqe.hidden: %llu exceeds max-hidden %llu",
                           (unsigned long long)q->hidden, (unsigned long long)lnorm__max_hidden(lim));
    int ovf = 0;
    size_t elems = lnorm__mul(q->rows, q->hidden, &ovf);
    size_t xs = lnorm_dtype_size(q->x_dtype), ys = lnorm_dtype_size(ydt), ps = lnorm_dtype_size(pdt);
    size_t xbytes = lnorm__mul(elems, xs, &ovf);
    size_t ybytes = lnorm__mul(elems, ys, &ovf);
    size_t sbytes = lnorm__mul(q->rows, 4, &ovf);
    size_t pbytes = lnorm__mul(q->hidden, ps, &ovf);
    if (ovf)
        return lnorm__fail(err, errlen, LNORM_ELIMIT, "sqe.rows x hidden: too large");
    int want_mean = q->want_stats && q->op == LNORM_OP_LAYERNORM, want_rstd = q->want_stats;
    int rc;
    if (q->x == LNORM_RING_NONE || q->y == LNORM_RING_NONE)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.x, sqe.y: both are required");
    if ((rc = lnorm__take_ref(d, LNORM__T_X, "sqe.x", region, q->x, xbytes, xbytes, xs, err, errlen)) ||
        (rc = lnorm__take_ref(d, LNORM__T_Y, "sqe.y", region, q->y, ybytes, ybytes, ys, err, errlen)))
        return rc;
    if (q->residual != LNORM_RING_NONE &&
        (rc = lnorm__take_ref(d, LNORM__T_RESIDUAL, "sqe.residual", region, q->residual, xbytes, xbytes, xs, err, errlen)))
        return rc;
    if ((q->residual_out != LNORM_RING_NONE) != (q->residual != LNORM_RING_NONE))
        return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.residual, sqe.residual_out: one given without the other");
    if (q->residual_out != LNORM_RING_NONE) {
        if ((rc = lnorm__take_ref(d, LNORM__T_RES_OUT, "sqe.residual_out", region, q->residual_out, xbytes, xbytes, xs,
                                  err, errlen)))
            return rc;
    }
    if (q->mean != LNORM_RING_NONE) {
        if (!want_mean)
            return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.mean: given without want_stats on a LayerNorm");
        if ((rc = lnorm__take_ref(d, LNORM__T_MEAN, "sqe.mean", region, q->mean, sbytes, sbytes, 4, err, errlen)))
            return rc;
    }
    if (q->rstd != LNORM_RING_NONE) {
        if (!want_rstd)
            return lnorm__fail(err, errlen, LNORM_EINVAL, "sqe.rstd: given without want_stats");
        if ((rc = lnorm__take_ref(d, LNORM__T_RSTD, "sqe.rstd", region, q->rstd, sbytes, sbytes, 4, err, errlen)))
            return rc;
    }
    if (q->gamma != LNORM_RING_NONE &&
        (rc = lnorm__take_ref(d, LNORM__T_GAMMA, "sqe.gamma", region, q->gamma, pbytes, pbytes, ps, err, errlen)))
        return rc;
    if (q->beta != LNORM_RING_NONE &&
        (rc = lnorm__take_ref(d, LNORM__T_BETA, "sqe.beta", region, q->beta, pbytes, pbytes, ps, err, errlen)))
        return rc;
    lnorm_segment *s = &d->seg;
    lnorm_segment_init(s, (lnorm_op)q->op, (lnorm_dtype)q->x_dtype, (int64_t)q->rows, (int64_t)q->hidden);
    s->y_dtype = ydt;
    s->param_dtype = pdt;
    s->eps = eps;
    s->eps_mode = (int32_t)q->eps_mode;
    d->res_out_bytes = q->residual != LNORM_RING_NONE ? xbytes : 0;
    d->y_bytes = ybytes;
    d->stat_bytes = sbytes;
    d->want_mean = want_mean;
    d->want_rstd = want_rstd;
    d->priority = q->priority;
    d->max_queue_us = q->max_queue_us;
    return LNORM_OK;
}

int lnorm__codec_check_register(const Lnorm__V1__RegisterParamsRequest *r, const lnorm__limits *lim, char *err,
                                size_t errlen)
{
    if (!lnorm__codec_params_id_ok(r->params_id))
        return lnorm__fail(err, errlen, LNORM_EINVAL, "register_params.params_id: must be 1..128 bytes of [A-Za-z0-9_.:-]");
    if (!lnorm__dtype_ok(r->dtype))
        return lnorm__fail(err, errlen, LNORM_EINVAL, "register_params.dtype: %d is not F32, F16 or BF16", (int)r->dtype);
    if (r->hidden < 1)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "register_params.hidden: must be >= 1");
    if (r->hidden > lnorm__max_hidden(lim))
        return lnorm__fail(err, errlen, LNORM_ELIMIT, "register_params.hidden: %llu exceeds max-hidden %llu",
                           (unsigned long long)r->hidden, (unsigned long long)lnorm__max_hidden(lim));
    size_t pbytes = (size_t)r->hidden * lnorm_dtype_size(r->dtype);
    if (r->gamma.len != 0 && r->gamma.len != pbytes)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "register_params.gamma: %zu bytes, expected 0 or hidden x %s = %zu",
                           r->gamma.len, lnorm_dtype_name(r->dtype), pbytes);
    if (r->beta.len != 0 && r->beta.len != pbytes)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "register_params.beta: %zu bytes, expected 0 or hidden x %s = %zu",
                           r->beta.len, lnorm_dtype_name(r->dtype), pbytes);
    if (!r->gamma.len && !r->beta.len)
        return lnorm__fail(err, errlen, LNORM_EINVAL, "register_params: gamma and beta are both empty");
    return LNORM_OK;
}

/* ---- the split: normalize.x and normalize.residual apart from the rest ---- */

/* The bytes are walked with proto/lnorm_wire.h; anything it rejects as
 * malformed or unusual (groups, field 0, ...) makes lnorm__split_find fail,
 * and the caller then leaves the message to protobuf-c whole. */

typedef struct lnorm__split {
    const uint8_t *nf0, *nf1;      /* Request.normalize: key .. end of value */
    const uint8_t *v0, *v1;        /* its value */
    const uint8_t *f0[2], *f1[2];  /* normalize.x, normalize.residual: key .. end (NULL: absent) */
    const uint8_t *data[2];        /* their bytes */
    size_t n[2];
} lnorm__split;

/* Find the one Request.normalize field and in it the x (8) and residual (9)
 * fields, each at most once and length-delimited. 0 when found, -1 for any
 * other shape (no normalize, normalize or x or residual repeated, a wire
 * type that protobuf-c would reject, malformed bytes). */
static int lnorm__split_find(const uint8_t *buf, size_t len, lnorm__split *sp)
{
    memset(sp, 0, sizeof *sp);
    lnorm__wire_rd r = lnorm__wire_reader(buf, len);
    int nn = 0;
    while (r.p < r.end) {
        const uint8_t *f0 = r.p;
        lnorm__wire_field fl;
        if (lnorm__wire_next_field(&r, &fl) != 0)
            return -1;
        if (fl.num == 10) {
            if (fl.wt != LNORM__WIRE_LEN || nn++)
                return -1;
            sp->nf0 = f0;
            sp->nf1 = r.p;
            sp->v0 = fl.data;
            sp->v1 = fl.data + fl.len;
        }
    }
    if (!nn)
        return -1;
    lnorm__wire_rd s = {sp->v0, sp->v1};
    while (s.p < s.end) {
        const uint8_t *f0 = s.p;
        lnorm__wire_field fl;
        if (lnorm__wire_next_field(&s, &fl) != 0)
            return -1;
        if (fl.num == 8 || fl.num == 9) {
            int k = (int)(fl.num - 8);
            if (fl.wt != LNORM__WIRE_LEN || sp->f0[k])
                return -1;
            sp->f0[k] = f0;
            sp->f1[k] = s.p;
            sp->data[k] = fl.data;
            sp->n[k] = fl.len;
        }
    }
    return sp->f0[0] || sp->f0[1] ? 0 : -1;
}

static size_t lnorm__put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* The message without normalize.x / normalize.residual (normalize's length
 * re-encoded). Returns the skeleton's length; sk has room for len + 10. */
static size_t lnorm__split_skeleton(const uint8_t *buf, size_t len, const lnorm__split *sp, uint8_t *sk)
{
    size_t inner = (size_t)(sp->v1 - sp->v0);
    for (int k = 0; k < 2; k++)
        if (sp->f0[k])
            inner -= (size_t)(sp->f1[k] - sp->f0[k]);
    size_t o = (size_t)(sp->nf0 - buf);
    memcpy(sk, buf, o);
    sk[o++] = (10 << 3) | 2;
    o += lnorm__put_varint(sk + o, inner);
    /* the value, the (at most two) fields cut out in the order they appear */
    const uint8_t *p = sp->v0;
    int first = sp->f0[0] && sp->f0[1] ? (sp->f0[1] < sp->f0[0]) : (sp->f0[0] ? 0 : 1);
    int order[2] = {first, 1 - first};
    for (int i = 0; i < 2; i++) {
        int k = order[i];
        if (!sp->f0[k])
            continue;
        memcpy(sk + o, p, (size_t)(sp->f0[k] - p));
        o += (size_t)(sp->f0[k] - p);
        p = sp->f1[k];
    }
    memcpy(sk + o, p, (size_t)(sp->v1 - p));
    o += (size_t)(sp->v1 - p);
    memcpy(sk + o, sp->nf1, (size_t)(buf + len - sp->nf1));
    o += (size_t)(buf + len - sp->nf1);
    return o;
}

/* Unpack: the skeleton through protobuf-c, then x / residual borrowed
 * (borrow) or copied into buffers of alloc. The whole message through
 * protobuf-c when the split does not apply. */
static int lnorm__unpack(const uint8_t *buf, size_t len, ProtobufCAllocator *alloc, int borrow, lnorm__decoded *out,
                         char *err, size_t errlen)
{
    lnorm__split sp;
    if (lnorm__split_find(buf, len, &sp) != 0) {
        out->msg = lnorm__v1__request__unpack(alloc, len, buf);
        return LNORM_OK;
    }
    size_t cut = sp.n[0] + sp.n[1];
    uint8_t stack[1024], *sk = stack;
    if (len - cut + 16 > sizeof stack && !(sk = malloc(len - cut + 16)))
        return lnorm__fail(err, errlen, LNORM_ENOMEM, "out of memory decoding the request");
    size_t skn = lnorm__split_skeleton(buf, len, &sp, sk);
    out->msg = lnorm__v1__request__unpack(alloc, skn, sk);
    if (sk != stack)
        free(sk);
    if (!out->msg || out->msg->body_case != LNORM__V1__REQUEST__BODY_NORMALIZE || !out->msg->normalize)
        return LNORM_OK;
    Lnorm__V1__NormalizeRequest *n = out->msg->normalize;
    ProtobufCBinaryData *f[2] = {&n->x, &n->residual};
    for (int k = 0; k < 2; k++) {
        if (!sp.n[k])
            continue;
        /* Borrowed only when aligned for every dtype (4 bytes): the kernels
         * read elements as float / uint16_t. Else copied, as below. */
        if (borrow && ((uintptr_t)sp.data[k] % 4) == 0) {
            out->borrowed |= 1 << k;
            f[k]->data = (uint8_t *)sp.data[k];
            f[k]->len = sp.n[k];
            continue;
        }
        uint8_t *p = alloc ? alloc->alloc(alloc->allocator_data, sp.n[k]) : malloc(sp.n[k]);
        if (!p) {
            out->request_id = out->msg->request_id;
            return lnorm__fail(err, errlen, LNORM_ENOMEM, "out of memory for the request's payload");
        }
        memcpy(p, sp.data[k], sp.n[k]);
        f[k]->data = p; /* freed with the message, by alloc */
        f[k]->len = sp.n[k];
    }
    return LNORM_OK;
}

/* ---- the scan: what protobuf-c would keep beyond the schema ---- */

/* Before unpacking, every field of the request and of its known
 * sub-messages is looked up in the schema (proto/lnorm_scan.h): more than
 * LNORM__MAX_UNKNOWN_FIELDS unknown fields or LNORM__MAX_UNKNOWN_BYTES of
 * them (beyond liblnorm's padding field and a newer client's few new
 * fields, protobuf-c would keep each at some 30 times its size, charged
 * nowhere) and a string with a NUL byte (a C string would end there) are
 * errors. Malformed bytes end the scan quietly: protobuf-c then rejects the
 * message with its own error. */
/* Status texts name a field by its path from the Request, as the proto's
 * field names spell it ("register_params.params_id",
 * "normalize.affine.params_id"): the path to a message of type want, into
 * path (depth-first, at most 4 levels); 0 when found. */
static int lnorm__field_path(const ProtobufCMessageDescriptor *in, const ProtobufCMessageDescriptor *want, int depth,
                             char *path, size_t len)
{
    if (in == want)
        return 0;
    for (unsigned i = 0; depth < 4 && i < in->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &in->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        size_t at = strlen(path);
        snprintf(path + at, len - at, "%s%s", at ? "." : "", f->name);
        if (lnorm__field_path(f->descriptor, want, depth + 1, path, len) == 0)
            return 0;
        path[at] = 0;
    }
    return -1;
}

/* A field that is not repeated given twice, or two fields of one oneof
 * (two bodies in a Request): INVALID_ARGUMENT naming the second, rather
 * than protobuf's merge (messages) or last-one-wins (the rest), which a
 * client would only mean by mistake. Recurses into sub-messages; path is
 * the message's path from Request. LNORM_OK, or LNORM_EINVAL (err). */
static int lnorm__once_check(const uint8_t *buf, size_t len, const ProtobufCMessageDescriptor *desc, int depth,
                             char *path, size_t pathlen, char *err, size_t errlen)
{
    enum { MAXF = 64 };
    uint8_t seen[MAXF] = {0};
    lnorm__wire_rd r = lnorm__wire_reader(buf, len);
    while (r.p < r.end) {
        lnorm__wire_field fl;
        if (lnorm__wire_next_field(&r, &fl) != 0)
            return LNORM_OK; /* malformed: protobuf-c says so */
        const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(desc, fl.num);
        if (!fd || (size_t)(fd - desc->fields) >= MAXF)
            continue;
        const size_t i = (size_t)(fd - desc->fields);
        const char *sep = path[0] ? "." : "";
        if (fd->label != PROTOBUF_C_LABEL_REPEATED) {
            if (seen[i])
                return lnorm__fail(err, errlen, LNORM_EINVAL, "%s%s%s: given twice (at most once)", path, sep,
                                   fd->name);
            for (size_t j = 0; j < desc->n_fields && j < MAXF; j++) {
                const ProtobufCFieldDescriptor *o = &desc->fields[j];
                if (seen[j] && (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && (o->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                    o->quantifier_offset == fd->quantifier_offset)
                    return lnorm__fail(err, errlen, LNORM_EINVAL, "%s%s%s: given with %s%s%s (one of them at most%s)",
                                       path, sep, fd->name, path, sep, o->name,
                                       desc == &lnorm__v1__request__descriptor ? ": one body per Request" : "");
            }
            seen[i] = 1;
        }
        if (fd->type == PROTOBUF_C_TYPE_MESSAGE && fl.wt == LNORM__WIRE_LEN && depth < 8) {
            size_t at = strlen(path);
            snprintf(path + at, pathlen - at, "%s%s", sep, fd->name);
            int rc = lnorm__once_check(fl.data, fl.len, fd->descriptor, depth + 1, path, pathlen, err, errlen);
            path[at] = 0;
            if (rc)
                return rc;
        }
    }
    return LNORM_OK;
}

static int lnorm__scan_request(const uint8_t *buf, size_t len, char *err, size_t errlen)
{
    lnorm__scan sc = {0};
    if (lnorm__scan_message(buf, len, &lnorm__v1__request__descriptor, 0, &sc) != 0)
        return LNORM_OK; /* malformed: protobuf-c says so */
    if (sc.unknown > LNORM__MAX_UNKNOWN_FIELDS || sc.unknown_bytes > LNORM__MAX_UNKNOWN_BYTES)
        return lnorm__fail(err, errlen, LNORM_EINVAL,
                           "message: %u fields of %zu bytes not in the lnorm.v1 schema (at most %u, of %u bytes)",
                           sc.unknown, sc.unknown_bytes, LNORM__MAX_UNKNOWN_FIELDS, LNORM__MAX_UNKNOWN_BYTES);
    if (sc.nul) {
        char path[128] = "";
        if (lnorm__field_path(&lnorm__v1__request__descriptor, sc.nul_in, 0, path, sizeof path) != 0)
            snprintf(path, sizeof path, "%s", sc.nul_in->short_name);
        return lnorm__fail(err, errlen, LNORM_EINVAL, "%s%s%s: a string with a NUL byte", path, path[0] ? "." : "",
                           sc.nul->name);
    }
    char path[128] = "";
    return lnorm__once_check(buf, len, &lnorm__v1__request__descriptor, 0, path, sizeof path, err, errlen);
}

static int lnorm__decode(const uint8_t *buf, size_t len, const lnorm__limits *lim, ProtobufCAllocator *alloc,
                         int borrow, lnorm__decoded *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->alloc = alloc;
    if (err && errlen)
        err[0] = 0;
    if (len > lim->max_message_bytes) {
        out->request_id = lnorm__peek_request_id(buf, len);
        return lnorm__fail(err, errlen, LNORM_ELIMIT, "message: %zu bytes exceeds max-message-bytes %llu", len,
                           (unsigned long long)lim->max_message_bytes);
    }
    int rc = lnorm__scan_request(buf, len, err, errlen);
    if (rc != LNORM_OK) {
        out->request_id = lnorm__peek_request_id(buf, len);
        return rc;
    }
    rc = lnorm__unpack(buf, len, alloc, borrow, out, err, errlen);
    if (rc != LNORM_OK)
        return rc;
    if (!out->msg) {
        out->request_id = lnorm__peek_request_id(buf, len);
        return lnorm__fail(err, errlen, LNORM_EINVAL, "message: not a valid lnorm.v1.Request (truncated or malformed protobuf)");
    }
    const Lnorm__V1__Request *m = out->msg;
    out->request_id = m->request_id;
    out->deadline_us = m->deadline_us;
    out->kind = (int)m->body_case;
    switch (m->body_case) {
    case LNORM__V1__REQUEST__BODY_NORMALIZE:
        return lnorm__check_normalize(m->normalize, lim, out, err, errlen);
    case LNORM__V1__REQUEST__BODY_NORMALIZE_BACKWARD:
        return lnorm__check_backward(m->normalize_backward, lim, out, err, errlen);
    case LNORM__V1__REQUEST__BODY_REGISTER_PARAMS:
        return lnorm__codec_check_register(m->register_params, lim, err, errlen);
    case LNORM__V1__REQUEST__BODY_DROP_PARAMS:
        if (!lnorm__codec_params_id_ok(m->drop_params->params_id))
            return lnorm__fail(err, errlen, LNORM_EINVAL, "drop_params.params_id: must be 1..128 bytes of [A-Za-z0-9_.:-]");
        return LNORM_OK;
    case LNORM__V1__REQUEST__BODY_HEALTH:
    case LNORM__V1__REQUEST__BODY_INFO:
    case LNORM__V1__REQUEST__BODY_REGION_STATUS:
        return LNORM_OK;
    case LNORM__V1__REQUEST__BODY_REGISTER_REGION: {
        const Lnorm__V1__RegisterRegionRequest *r = m->register_region;
        if (r->bytes < 1)
            return lnorm__fail(err, errlen, LNORM_EINVAL, "register_region.bytes: must be >= 1");
        if (r->cuda_ipc_handle.len != 0 && r->cuda_ipc_handle.len != 64)
            return lnorm__fail(err, errlen, LNORM_EINVAL, "register_region.cuda_ipc_handle: %zu bytes, expected 64",
                               r->cuda_ipc_handle.len);
        return LNORM_OK;
    }
    case LNORM__V1__REQUEST__BODY_UNREGISTER_REGION:
        if (!m->unregister_region->region)
            return lnorm__fail(err, errlen, LNORM_EINVAL, "unregister_region.region: 0 is not a region id");
        return LNORM_OK;
    case LNORM__V1__REQUEST__BODY_ATTACH_RING: {
        const Lnorm__V1__AttachRingRequest *a = m->attach_ring;
        uint32_t e = a->entries;
        if (e < LNORM_RING_MIN_ENTRIES || e > LNORM_RING_MAX_ENTRIES || (e & (e - 1)))
            return lnorm__fail(err, errlen, LNORM_EINVAL, "attach_ring.entries: %u is not a power of two in %u..%u", e,
                               LNORM_RING_MIN_ENTRIES, LNORM_RING_MAX_ENTRIES);
        if (a->offset % 64)
            return lnorm__fail(err, errlen, LNORM_EINVAL, "attach_ring.offset: %llu is not a multiple of 64",
                               (unsigned long long)a->offset);
        if (!a->region)
            return lnorm__fail(err, errlen, LNORM_EINVAL, "attach_ring.region: 0 is not a region id");
        return LNORM_OK;
    }
    default:
        out->kind = LNORM__REQ_NONE;
        return lnorm__fail(err, errlen, LNORM_EINVAL, "body: no request body set (or an unknown one)");
    }
}

int lnorm__codec_decode_request(const uint8_t *buf, size_t len, const lnorm__limits *lim, ProtobufCAllocator *alloc,
                                lnorm__decoded *out, char *err, size_t errlen)
{
    return lnorm__decode(buf, len, lim, alloc, 0, out, err, errlen);
}

int lnorm__codec_decode_request_borrow(const uint8_t *buf, size_t len, const lnorm__limits *lim, lnorm__decoded *out,
                                       char *err, size_t errlen)
{
    return lnorm__decode(buf, len, lim, NULL, 1, out, err, errlen);
}

void lnorm__codec_decoded_free(lnorm__decoded *d)
{
    if (d->msg && d->borrowed && d->msg->body_case == LNORM__V1__REQUEST__BODY_NORMALIZE && d->msg->normalize) {
        /* borrowed bytes are not protobuf-c's to free */
        if (d->borrowed & LNORM__BORROWED_X) {
            d->msg->normalize->x.data = NULL;
            d->msg->normalize->x.len = 0;
        }
        if (d->borrowed & LNORM__BORROWED_RESIDUAL) {
            d->msg->normalize->residual.data = NULL;
            d->msg->normalize->residual.len = 0;
        }
    }
    d->borrowed = 0;
    if (d->msg)
        lnorm__v1__request__free_unpacked(d->msg, d->alloc);
    d->msg = NULL;
}

int lnorm__codec_pack(const Lnorm__V1__Response *r, nng_msg **out)
{
    size_t n = lnorm__v1__response__get_packed_size(r);
    nng_msg *m;
    if (nng_msg_alloc(&m, n) != 0)
        return LNORM_ENOMEM;
    size_t w = lnorm__v1__response__pack(r, nng_msg_body(m));
    if (w != n) {
        nng_msg_free(m);
        return LNORM_EINTERNAL;
    }
    *out = m;
    return LNORM_OK;
}

int lnorm__codec_pack_error(uint64_t request_id, int err, const char *message, nng_msg **out)
{
    Lnorm__V1__Response r = LNORM__V1__RESPONSE__INIT;
    Lnorm__V1__Status st = LNORM__V1__STATUS__INIT;
    st.code = (Lnorm__V1__Code)lnorm_err_to_status(err);
    st.message = (char *)(message && *message ? message : lnorm_strerror(err));
    r.request_id = request_id;
    r.status = &st;
    return lnorm__codec_pack(&r, out);
}

static size_t lnorm__varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

int lnorm__codec_pack_y_in_place(nng_msg *msg, const void *y, size_t y_len, uint64_t request_id,
                                 const Lnorm__V1__Timings *t)
{
    uint8_t *body = nng_msg_body(msg);
    size_t blen = nng_msg_len(msg);
    const uint8_t *yp = y;
    if (yp < body || yp > body + blen || y_len > (size_t)(body + blen - yp))
        return LNORM_EINVAL;
    size_t oy = (size_t)(yp - body);
    /* F: normalize's key and length and y's, right in front of y. R: the
     * other fields as protobuf-c writes them (proto3: zero scalars left
     * out), in front of F when there is room, else after y. */
    uint8_t F[24], R[96];
    size_t fn = 0, rn = 0;
    F[fn++] = (10 << 3) | 2;
    fn += lnorm__put_varint(F + fn, 1 + lnorm__varint_len(y_len) + y_len);
    F[fn++] = (1 << 3) | 2;
    fn += lnorm__put_varint(F + fn, y_len);
    if (request_id) {
        R[rn++] = (1 << 3) | 0;
        rn += lnorm__put_varint(R + rn, request_id);
    }
    R[rn++] = (2 << 3) | 2; /* status: OK, no message */
    R[rn++] = 0;
    if (t) {
        uint8_t tb[48];
        size_t tn = 0;
        const uint64_t v[4] = {t->queue_us, t->compute_us, t->batch_rows, t->batch_requests};
        for (int i = 0; i < 4; i++)
            if (v[i]) {
                tb[tn++] = (uint8_t)(((i + 1) << 3) | 0);
                tn += lnorm__put_varint(tb + tn, v[i]);
            }
        R[rn++] = (3 << 3) | 2;
        rn += lnorm__put_varint(R + rn, tn);
        memcpy(R + rn, tb, tn);
        rn += tn;
    }
    /* (nng_msg_insert is not used: NNG 1.5.2 writes past the buffer when it
     * shuffles a trimmed body down.) */
    if (nng_msg_chop(msg, blen - (oy + y_len)) != 0)
        return LNORM_EINTERNAL;
    if (oy >= fn + rn) {
        /* The rest of the front becomes a padding field (unknown to every
         * reader, skipped), so that the reply is as long as the request: the
         * client's receive buffer of this reply then fits its next request
         * (liblnorm reuses it; NNG zeroes every new one), and y keeps x's
         * alignment. 1 or 2 spare bytes cannot be a field: trimmed. */
        size_t spare = oy - fn - rn, k = 0;
        if (spare >= 3) {
            k = spare - 3;
            while (2 + lnorm__varint_len(k) + k > spare)
                k--;
        }
        size_t pad = spare >= 3 ? 2 + lnorm__varint_len(k) + k : 0;
        if (nng_msg_trim(msg, spare - pad) != 0)
            return LNORM_EINTERNAL;
        uint8_t *b = nng_msg_body(msg);
        memcpy(b, R, rn);
        if (pad) {
            uint8_t *p = b + rn;
            p += lnorm__put_varint(p, (LNORM__PAD_FIELD << 3) | 2);
            p += lnorm__put_varint(p, k);
            memset(p, 0, k);
        }
        memcpy(b + rn + pad, F, fn);
        return LNORM_OK;
    }
    if (oy >= fn) {
        if (nng_msg_trim(msg, oy - fn) != 0)
            return LNORM_EINTERNAL;
        memcpy(nng_msg_body(msg), F, fn);
    } else {
        /* too little in front of y (not a message liblnorm writes): move y */
        if (nng_msg_realloc(msg, fn + y_len) != 0)
            return LNORM_ENOMEM;
        uint8_t *b = nng_msg_body(msg);
        memmove(b + fn, b + oy, y_len);
        memcpy(b, F, fn);
    }
    return nng_msg_append(msg, R, rn) == 0 ? LNORM_OK : LNORM_ENOMEM;
}
