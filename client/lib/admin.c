/*
 * The small calls: register and drop parameters, health and info. Each is
 * one exchange through the call engine, run synchronously.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lnorm_scan.h"

/* State of a small call: the request to send and where to put the answer. */
typedef struct admin_state {
    Lnorm__V1__Request req;
    Lnorm__V1__RegisterParamsRequest reg;
    Lnorm__V1__DropParamsRequest drop;
    Lnorm__V1__HealthRequest health;
    Lnorm__V1__InfoRequest info;
    int *serving;
    lnorm_server_info *out_info;
} admin_state;

static int admin_make(lnorm__call *call, uint64_t i, uint64_t id, nng_msg **out)
{
    admin_state *st = call->data;
    (void)i;
    st->req.request_id = id;
    st->req.deadline_us = call->deadline_us;
    return lnorm__pack(&st->req, out);
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

/* A health or info body protobuf-c may unpack: the schema's fields, the
 * few others of lnorm_scan.h's limits, at most 64 repeated entries (an
 * InfoResponse lists a few backends and devices), no NUL in a string. A
 * hostile reply of many tiny fields would cost some 45 times its size to
 * unpack. */
static int admin_body_ok(const ProtobufCMessageDescriptor *desc, const lnorm__resp_view *resp)
{
    lnorm__scan sc = {0};
    if (lnorm__scan_message(resp->body_bytes.p, resp->body_bytes.n, desc, 0, &sc) != 0)
        return 1; /* malformed: protobuf-c rejects it */
    return sc.unknown <= LNORM__MAX_UNKNOWN_FIELDS && sc.unknown_bytes <= LNORM__MAX_UNKNOWN_BYTES &&
           sc.repeated <= 64 && !sc.nul;
}

static int admin_take(lnorm__call *call, uint64_t i, const lnorm__resp_view *resp)
{
    admin_state *st = call->data;
    (void)i;
    if (resp->body != (int)st->req.body_case)
        return LNORM_EPROTO;
    switch (resp->body) {
    case LNORM__V1__RESPONSE__BODY_HEALTH: {
        if (!admin_body_ok(&lnorm__v1__health_response__descriptor, resp))
            return LNORM_EPROTO;
        Lnorm__V1__HealthResponse *h =
            lnorm__v1__health_response__unpack(NULL, resp->body_bytes.n, resp->body_bytes.p);
        if (!h)
            return LNORM_EPROTO;
        *st->serving = h->serving ? 1 : 0;
        lnorm__v1__health_response__free_unpacked(h, NULL);
        return LNORM_OK;
    }
    case LNORM__V1__RESPONSE__BODY_INFO: {
        if (!admin_body_ok(&lnorm__v1__info_response__descriptor, resp))
            return LNORM_EPROTO;
        Lnorm__V1__InfoResponse *in =
            lnorm__v1__info_response__unpack(NULL, resp->body_bytes.n, resp->body_bytes.p);
        lnorm_server_info *o = st->out_info;
        if (!in)
            return LNORM_EPROTO;
        memset(o, 0, sizeof *o);
        copy_str(o->version, sizeof o->version, in->version);
        for (size_t k = 0; k < in->n_backends && k < LNORM_INFO_MAX_BACKENDS; k++)
            copy_str(o->backends[o->nbackends++], sizeof o->backends[0], in->backends[k]);
        for (size_t k = 0; k < in->n_devices && k < LNORM_INFO_MAX_DEVICES; k++) {
            const Lnorm__V1__Device *d = in->devices[k];
            lnorm_device_desc *dd = &o->devices[o->ndevices++];
            copy_str(dd->backend, sizeof dd->backend, d->backend);
            copy_str(dd->name, sizeof dd->name, d->name);
            dd->memory_bytes = d->memory_bytes;
            dd->index = d->index;
        }
        if (in->limits) {
            o->max_message_bytes = in->limits->max_message_bytes;
            o->max_rows = in->limits->max_rows;
            o->max_hidden = in->limits->max_hidden;
            o->max_batch_rows = in->limits->max_batch_rows;
            o->max_batch_bytes = in->limits->max_batch_bytes;
            o->max_queue_requests = in->limits->max_queue_requests;
            o->max_params_bytes = in->limits->max_params_bytes;
            o->max_inflight_bytes = in->limits->max_inflight_bytes;
            o->shm = in->limits->shm ? 1 : 0;
        }
        lnorm__v1__info_response__free_unpacked(in, NULL);
        lnorm__limits_note(call->c, o);
        return LNORM_OK;
    }
    default:
        return LNORM_OK;
    }
}

static void admin_cleanup(lnorm__call *call)
{
    free(call->data);
}

static const lnorm__call_ops admin_ops = {admin_make, admin_take};

static int fail(lnorm_result *res, int rv, const char *why)
{
    if (res) {
        memset(res, 0, sizeof *res);
        lnorm__result_fail(res, rv, -1, "%s", why);
    }
    return rv;
}

/* Make a small call with its state zeroed; the caller fills st->req. */
static int admin_new(lnorm_client *c, lnorm__call **call, admin_state **st)
{
    *st = calloc(1, sizeof **st);
    if (!*st)
        return LNORM_ENOMEM;
    int rv = lnorm__call_new(c, &admin_ops, call);
    if (rv != LNORM_OK) {
        free(*st);
        return rv;
    }
    Lnorm__V1__Request init = LNORM__V1__REQUEST__INIT;
    (*st)->req = init;
    (*call)->data = *st;
    (*call)->cleanup = admin_cleanup;
    return LNORM_OK;
}

int lnorm_register_params(lnorm_client *c, const lnorm_params_desc *p, lnorm_result *res)
{
    if (!c || !p)
        return fail(res, LNORM_EINVAL, "client or params is NULL");
    if (!lnorm__valid_params_id(p->id))
        return fail(res, LNORM_EINVAL, "id must be 1..128 bytes of [A-Za-z0-9_.:-]");
    size_t es = lnorm_dtype_size(p->dtype);
    if (es == 0)
        return fail(res, LNORM_EINVAL, "dtype must be f32, f16 or bf16");
    if (p->hidden < 1 || p->hidden > ((uint64_t)1 << 40))
        return fail(res, LNORM_EINVAL, "hidden must be >= 1");
    if (!p->gamma && !p->beta)
        return fail(res, LNORM_EINVAL, "neither gamma nor beta given");
    lnorm__call *call;
    admin_state *st;
    int rv = admin_new(c, &call, &st);
    if (rv != LNORM_OK)
        return fail(res, rv, lnorm_strerror(rv));
    Lnorm__V1__RegisterParamsRequest reg = LNORM__V1__REGISTER_PARAMS_REQUEST__INIT;
    st->reg = reg;
    st->reg.params_id = (char *)p->id; /* only read while the call is alive (sync) */
    st->reg.dtype = (Lnorm__V1__DType)p->dtype;
    st->reg.hidden = p->hidden;
    if (p->gamma) {
        st->reg.gamma.data = (uint8_t *)p->gamma;
        st->reg.gamma.len = p->hidden * es;
    }
    if (p->beta) {
        st->reg.beta.data = (uint8_t *)p->beta;
        st->reg.beta.len = p->hidden * es;
    }
    st->req.body_case = LNORM__V1__REQUEST__BODY_REGISTER_PARAMS;
    st->req.register_params = &st->reg;
    return lnorm__call_sync(call, res);
}

int lnorm_drop_params(lnorm_client *c, const char *id, lnorm_result *res)
{
    if (!c)
        return fail(res, LNORM_EINVAL, "client is NULL");
    if (!lnorm__valid_params_id(id))
        return fail(res, LNORM_EINVAL, "id must be 1..128 bytes of [A-Za-z0-9_.:-]");
    lnorm__call *call;
    admin_state *st;
    int rv = admin_new(c, &call, &st);
    if (rv != LNORM_OK)
        return fail(res, rv, lnorm_strerror(rv));
    Lnorm__V1__DropParamsRequest d = LNORM__V1__DROP_PARAMS_REQUEST__INIT;
    st->drop = d;
    st->drop.params_id = (char *)id;
    st->req.body_case = LNORM__V1__REQUEST__BODY_DROP_PARAMS;
    st->req.drop_params = &st->drop;
    return lnorm__call_sync(call, res);
}

int lnorm_health(lnorm_client *c, int *serving, lnorm_result *res)
{
    if (!c || !serving)
        return fail(res, LNORM_EINVAL, "client or serving is NULL");
    lnorm__call *call;
    admin_state *st;
    int rv = admin_new(c, &call, &st);
    if (rv != LNORM_OK)
        return fail(res, rv, lnorm_strerror(rv));
    Lnorm__V1__HealthRequest h = LNORM__V1__HEALTH_REQUEST__INIT;
    st->health = h;
    st->serving = serving;
    st->req.body_case = LNORM__V1__REQUEST__BODY_HEALTH;
    st->req.health = &st->health;
    return lnorm__call_sync(call, res);
}

int lnorm__info_call(lnorm_client *c, lnorm_server_info *info, int timeout_ms, lnorm_callback cb, void *arg,
                     lnorm_result *res)
{
    if (!c || !info)
        return fail(res, LNORM_EINVAL, "client or info is NULL");
    lnorm__call *call;
    admin_state *st;
    int rv = admin_new(c, &call, &st);
    if (rv != LNORM_OK)
        return fail(res, rv, lnorm_strerror(rv));
    Lnorm__V1__InfoRequest in = LNORM__V1__INFO_REQUEST__INIT;
    st->info = in;
    st->out_info = info;
    st->req.body_case = LNORM__V1__REQUEST__BODY_INFO;
    st->req.info = &st->info;
    if (timeout_ms != 0)
        call->recv_timeout = timeout_ms < 0 ? NNG_DURATION_INFINITE : timeout_ms;
    if (!cb)
        return lnorm__call_sync(call, res);
    call->cb = cb;
    call->cb_arg = arg;
    return lnorm__call_start(call, res);
}

int lnorm_info(lnorm_client *c, lnorm_server_info *info, lnorm_result *res)
{
    return lnorm__info_call(c, info, 0, NULL, NULL, res);
}
