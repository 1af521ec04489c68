/*
 * Request dispatch: decode + validate a message, answer control requests
 * (Health, Info, RegisterParams, DropParams) at once, hand Normalize to the
 * batcher, and turn finished requests into replies.
 */
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "log.h"
#include "ring.h"
#include "shm.h"

static void *lnorm__pb_alloc(void *data, size_t n)
{
    lnorm__backend *be = data;
    return be->ops->buf_alloc(be, n ? n : 1);
}

static void lnorm__pb_free(void *data, void *p)
{
    lnorm__backend *be = data;
    if (p)
        be->ops->buf_free(be, p);
}

int lnorm__dispatch_init_alloc(lnorm__daemon *d)
{
    const lnorm__backend_ops *ops = d->be->ops;
    d->pinned = (ops->caps & LNORM__BACKEND_CAP_PINNED_BUFFERS) != 0;
    d->borrow = !d->pinned && (ops->caps & LNORM__BACKEND_CAP_BORROW_INPUT);
    d->pb_allocp = NULL;
    if (!d->pinned)
        return LNORM_OK;
    if (!ops->buf_alloc || !ops->buf_free)
        return LNORM_EINTERNAL; /* a backend that states the cap without the allocator */
    d->pb_alloc.alloc = lnorm__pb_alloc;
    d->pb_alloc.free = lnorm__pb_free;
    d->pb_alloc.allocator_data = d->be;
    d->pb_allocp = &d->pb_alloc;
    return LNORM_OK;
}

static void *lnorm__obuf(lnorm__daemon *d, size_t n)
{
    return d->pinned ? d->be->ops->buf_alloc(d->be, n ? n : 1) : malloc(n ? n : 1);
}

static void lnorm__obuf_free(lnorm__daemon *d, void *p)
{
    if (!p)
        return;
    if (d->pinned)
        d->be->ops->buf_free(d->be, p);
    else
        free(p);
}

/* Send the reply m to request id and account for it. m is NULL when the
 * reply could not be packed (out of memory, as a rule for a large one): a
 * short RESOURCE_EXHAUSTED reply goes instead, so that the client hears
 * of it rather than waiting for its timeout; nothing goes only when even
 * that cannot be allocated. */
static void lnorm__send(lnorm__daemon *d, void *slot, uint64_t id, int code, nng_msg *m)
{
    if (!m) {
        code = lnorm_err_to_status(LNORM_ENOMEM);
        if (lnorm__codec_pack_error(id, LNORM_ENOMEM, "out of memory encoding the reply", &m) != LNORM_OK)
            m = NULL;
    }
    lnorm__stats_reply(&d->stats, code);
    if (m)
        atomic_fetch_add(&d->stats.bytes_out, nng_msg_len(m));
    else
        LOG_ERROR("request %llu: out of memory for any reply; request dropped", (unsigned long long)id);
    atomic_fetch_sub(&d->stats.inflight, 1);
    uint64_t t0 = lnorm__now_ns();
    lnorm__transport_reply(slot, m);
    lnorm__stats_stage(&d->stats, LNORM__STAGE_SEND, lnorm__now_ns() - t0);
}

static void lnorm__reply_error(lnorm__daemon *d, void *slot, uint64_t id, int err, const char *msg)
{
    nng_msg *m = NULL;
    LOG_DEBUG("request %llu: %s: %s", (unsigned long long)id, lnorm_errname(err), msg ? msg : "");
    lnorm__codec_pack_error(id, err, msg, &m);
    lnorm__send(d, slot, id, lnorm_err_to_status(err), m);
}

static void lnorm__reply_body(lnorm__daemon *d, void *slot, Lnorm__V1__Response *r)
{
    Lnorm__V1__Status st = LNORM__V1__STATUS__INIT;
    r->status = &st;
    nng_msg *m = NULL;
    lnorm__codec_pack(r, &m);
    lnorm__send(d, slot, r->request_id, 0, m);
}

static void lnorm__req_free(lnorm__daemon *d, lnorm__req *r)
{
    lnorm__shm_release(r);
    if (r->reserved)
        atomic_fetch_sub(&d->stats.inflight_bytes, (int_fast64_t)r->reserved);
    lnorm__obuf_free(d, r->y);
    lnorm__obuf_free(d, r->mean);
    lnorm__obuf_free(d, r->rstd);
    lnorm__obuf_free(d, r->res_out);
    lnorm__params_put(r->pset);
    nng_msg *src = r->dec.src;
    lnorm__codec_decoded_free(&r->dec);
    if (src)
        nng_msg_free(src);
    free(r);
}

static void lnorm__do_info(lnorm__daemon *d, void *slot, uint64_t id)
{
    Lnorm__V1__Response r = LNORM__V1__RESPONSE__INIT;
    Lnorm__V1__InfoResponse info = LNORM__V1__INFO_RESPONSE__INIT;
    Lnorm__V1__Limits lim = LNORM__V1__LIMITS__INIT;
    lnorm__device_info dev[16];
    Lnorm__V1__Device pdev[16], *pdevp[16];
    /* The backend that serves, alone: a fallback inside it (cuda-fallback)
     * is its own, counted in /metrics. */
    char *backends[1] = {(char *)d->be->ops->name};
    int ndev = d->be->ops->devices ? d->be->ops->devices(d->be, dev, 16) : 0;
    for (int i = 0; i < ndev; i++) {
        lnorm__v1__device__init(&pdev[i]);
        pdev[i].backend = dev[i].backend;
        pdev[i].name = dev[i].name;
        pdev[i].memory_bytes = dev[i].memory_bytes;
        pdev[i].index = dev[i].index;
        pdevp[i] = &pdev[i];
    }
    info.version = LNORM_VERSION;
    info.backends = backends;
    info.n_backends = 1;
    info.devices = pdevp;
    info.n_devices = (size_t)ndev;
    lnorm__batcher_opts bo; /* (SIGHUP changes these: the batcher's copy, not d->cfg) */
    lnorm__batcher_get_opts(d->batcher, &bo);
    lim.max_message_bytes = d->cfg.max_message_bytes;
    lim.max_rows = d->cfg.max_rows;
    lim.max_hidden = d->lim.max_hidden;
    lim.max_batch_rows = bo.max_batch_rows;
    lim.max_batch_bytes = bo.max_batch_bytes;
    lim.max_queue_requests = bo.max_queue;
    lim.max_params_bytes = d->cfg.max_params_bytes;
    lim.max_inflight_bytes = d->cfg.max_inflight_bytes;
    lnorm__peer peer;
    char why[160];
    lnorm__transport_peer(slot, &peer);
    lim.shm = lnorm__regions_allowed(d->regions, &peer, why, sizeof why) == LNORM_OK;
    info.limits = &lim;
    r.request_id = id;
    r.body_case = LNORM__V1__RESPONSE__BODY_INFO;
    r.info = &info;
    lnorm__reply_body(d, slot, &r);
}

/*
 * Whether y can be computed over x in the request message and sent back in
 * it (no copy of x in, no output buffer, no copy of y out): the backend
 * computes in place (LNORM__BACKEND_CAP_IN_PLACE), x lies in the message
 * (borrowed), y has x's element size (rows split over threads then never
 * overlap another row's x), x is aligned to its element, and the reply is
 * y alone (no stats, no residual_out).
 */
static int lnorm__can_run_in_place(const lnorm__daemon *d, const lnorm__decoded *dec)
{
    const lnorm_segment *s = &dec->seg;
    size_t xs = lnorm_dtype_size(s->x_dtype);
    return (d->be->ops->caps & LNORM__BACKEND_CAP_IN_PLACE) && (dec->borrowed & LNORM__BORROWED_X) && dec->src &&
           !dec->nrefs &&
           !dec->want_mean && !dec->want_rstd && !dec->res_out_bytes && !s->residual &&
           lnorm_dtype_size(s->y_dtype) == xs && xs && ((uintptr_t)s->x % xs) == 0;
}

/* Answer ring request r (its resources released first, as a reply's are):
 * err with why, timings t (may be NULL; copied before r goes, t may be
 * r's own). */
static void lnorm__ring_answer(lnorm__daemon *d, lnorm__req *r, int err, const char *why, const lnorm__timing *t)
{
    lnorm__ring *ring = r->ring;
    uint64_t id = r->dec.request_id;
    lnorm__timing tc = t ? *t : (lnorm__timing){0};
    r->ring = NULL;
    if (err == LNORM_OK)
        atomic_fetch_add(&d->stats.normalize_ok, 1);
    lnorm__req_free(d, r);
    lnorm__stats_reply(&d->stats, lnorm_err_to_status(err));
    atomic_fetch_sub(&d->stats.inflight, 1);
    lnorm__ring_complete(ring, id, err, why, t ? &tc : NULL);
}

/* A request answered before it was queued: its error goes back the way
 * it came (reply on its slot, or completion on its ring). */
static void lnorm__req_fail(lnorm__daemon *d, lnorm__req *r, int rc, const char *why)
{
    uint64_t id = r->dec.request_id;
    void *slot = r->slot;
    if (r->ring) {
        LOG_DEBUG("ring request %llu: %s: %s", (unsigned long long)id, lnorm_errname(rc), why);
        lnorm__ring_answer(d, r, rc, why, NULL);
        return;
    }
    nng_msg *m = NULL;
    lnorm__codec_pack_error(id, rc, why, &m);
    lnorm__req_free(d, r);
    lnorm__send(d, slot, id, lnorm_err_to_status(rc), m);
}

/* A request whose every tensor is in shared memory and whose payload is
 * larger than this is split by rows into chunks of about this size, queued
 * as requests of their own: the backend then pipelines them (one chunk's
 * upload beside another's download) instead of moving it whole. */
#define LNORM__SHM_CHUNK_BYTES ((uint64_t)32 << 20)

/* The parent of a split request: answered when its last chunk finishes. */
typedef struct lnorm__group {
    atomic_int left;
    atomic_int err;            /* first error (LNORM_OK: none) */
    char why[256];             /* its message (written by the first error only) */
    atomic_flag why_taken;
    lnorm__req *parent;        /* holds the reply route, regions and reservation */
    lnorm__req *chunks;        /* the chunks (one array), freed with the group */
    atomic_uint_fast64_t queue_us_max, compute_us_sum;
    uint32_t nchunks;
} lnorm__group;

static int lnorm__all_by_ref(const lnorm__decoded *dec)
{
    return dec->in_bytes == 0 && dec->ref[LNORM__T_X].set && dec->ref[LNORM__T_Y].set &&
           (!dec->want_mean || dec->ref[LNORM__T_MEAN].set) && (!dec->want_rstd || dec->ref[LNORM__T_RSTD].set) &&
           (!dec->res_out_bytes || dec->ref[LNORM__T_RES_OUT].set);
}

static void lnorm__reply_done(lnorm__daemon *d, lnorm__req *r, int err, const char *why, const lnorm__timing *t);

/* Split parent r into chunks of rows and queue them; LNORM_OK when every
 * chunk is queued (the parent is then answered by the last one), else an
 * error and the chunks queued so far answer into the group, which then
 * answers the parent with that error. */
static int lnorm__submit_split(lnorm__daemon *d, lnorm__req *r, char *err, size_t errlen)
{
    lnorm_segment *s = &r->dec.seg;
    uint64_t rows = (uint64_t)s->rows;
    uint64_t per_row = r->bytes / rows;
    uint64_t crow = per_row ? LNORM__SHM_CHUNK_BYTES / per_row : rows;
    if (crow < 1)
        crow = 1;
    uint64_t nch = (rows + crow - 1) / crow;
    lnorm__group *g = calloc(1, sizeof *g);
    lnorm__req *ch = g ? calloc(nch, sizeof *ch) : NULL;
    if (!ch) {
        free(g);
        snprintf(err, errlen, "out of memory splitting the request");
        return LNORM_ENOMEM;
    }
    atomic_init(&g->left, (int)nch + 1); /* + 1: this function's, dropped at the end */
    atomic_init(&g->err, LNORM_OK);
    atomic_flag_clear(&g->why_taken);
    g->parent = r;
    g->chunks = ch;
    g->nchunks = (uint32_t)nch;
    size_t xs = lnorm_dtype_size(s->x_dtype), ys = lnorm_dtype_size(s->y_dtype);
    uint64_t H = (uint64_t)s->hidden;
    int rc = LNORM_OK;
    for (uint64_t i = 0; i < nch; i++) {
        lnorm__req *c = &ch[i];
        uint64_t r0 = i * crow, n = rows - r0 < crow ? rows - r0 : crow;
        *c = (lnorm__req){0};
        c->group = g;
        c->recv_ns = r->recv_ns;
        c->deadline_ns = r->deadline_ns;
        c->priority = r->priority;
        c->max_queue_us = r->max_queue_us;
        c->dec.request_id = r->dec.request_id;
        c->dec.kind = LNORM__REQ_NORMALIZE;
        lnorm_segment *cs = &c->dec.seg;
        *cs = *s;
        cs->rows = (int64_t)n;
        cs->x = (const unsigned char *)s->x + r0 * H * xs;
        cs->y = (unsigned char *)s->y + r0 * H * ys;
        if (s->residual) {
            cs->residual = (const unsigned char *)s->residual + r0 * H * xs;
            cs->residual_out = (unsigned char *)s->residual_out + r0 * H * xs;
        }
        if (s->mean)
            cs->mean = (float *)s->mean + r0;
        if (s->rstd)
            cs->rstd = (float *)s->rstd + r0;
        c->rows = n;
        c->bytes = n * per_row;
        if (rc == LNORM_OK)
            rc = lnorm__batcher_submit(d->batcher, c, err, errlen);
        if (rc != LNORM_OK) {
            /* Not queued: this chunk (and every later one) counts as done. */
            if (!atomic_flag_test_and_set(&g->why_taken)) {
                snprintf(g->why, sizeof g->why, "%s", err);
                atomic_store(&g->err, rc);
            }
            atomic_fetch_sub(&g->left, 1);
        }
    }
    if (atomic_fetch_sub(&g->left, 1) == 1) {
        lnorm__timing t = {0};
        int e = atomic_load(&g->err);
        free(g->chunks);
        lnorm__reply_done(d, g->parent, e, e ? g->why : NULL, &t);
        free(g);
    }
    return LNORM_OK;
}

/* A chunk of a split request finished (any thread). */
static void lnorm__chunk_done(lnorm__daemon *d, lnorm__req *c, int err, const char *why, const lnorm__timing *t)
{
    lnorm__group *g = c->group;
    if (err != LNORM_OK && !atomic_flag_test_and_set(&g->why_taken)) {
        snprintf(g->why, sizeof g->why, "%s", why ? why : "");
        atomic_store(&g->err, err);
    }
    uint64_t q = atomic_load(&g->queue_us_max);
    while (t->queue_us > q && !atomic_compare_exchange_weak(&g->queue_us_max, &q, t->queue_us))
        ;
    atomic_fetch_add(&g->compute_us_sum, t->compute_us);
    if (atomic_fetch_sub(&g->left, 1) != 1)
        return;
    lnorm__req *p = g->parent;
    lnorm__timing pt = *t;
    pt.queue_us = atomic_load(&g->queue_us_max);
    pt.compute_us = atomic_load(&g->compute_us_sum);
    int e = atomic_load(&g->err);
    free(g->chunks); /* (c and t with it: pt is a copy) */
    lnorm__reply_done(d, p, e, e ? g->why : NULL, &pt);
    free(g);
}

/* A request on GPU memory (CUDA IPC regions): a job of its own, straight
 * to the backend, computed where it lies (no copy, nothing to batch). */
typedef struct lnorm__devjob {
    lnorm__job job;
    lnorm_segment seg;
    lnorm__req *r;
    lnorm__daemon *d;
} lnorm__devjob;

/* GPU-memory requests in flight at most: device jobs share the backend's
 * queue with the batcher's jobs, so they must never fill it. */
#define LNORM__DEVJOBS_MAX 256

static void lnorm__devjob_done(lnorm__job *job, int err, const char *why, uint64_t compute_ns)
{
    lnorm__devjob *dj = (lnorm__devjob *)job;
    lnorm__daemon *d = dj->d;
    lnorm__timing t = {0};
    uint64_t now = lnorm__now_ns();
    t.compute_us = compute_ns / 1000;
    t.queue_us = now - dj->r->recv_ns > compute_ns ? (now - dj->r->recv_ns - compute_ns) / 1000 : 0;
    t.batch_rows = (uint32_t)dj->r->rows;
    t.batch_requests = 1;
    if (err == LNORM_OK)
        atomic_fetch_add(&dj->d->stats.rows, dj->r->rows);
    lnorm__reply_done(dj->d, dj->r, err, why, &t);
    free(dj);
    atomic_fetch_sub(&d->dev_jobs, 1); /* (after the reply: shutdown waits for it) */
}

static int lnorm__submit_device(lnorm__daemon *d, lnorm__req *r, char *err, size_t errlen)
{
    if (atomic_fetch_add(&d->dev_jobs, 1) >= LNORM__DEVJOBS_MAX) {
        atomic_fetch_sub(&d->dev_jobs, 1);
        snprintf(err, errlen, "GPU-memory requests in flight: lnormd takes at most %d at once; wait for replies",
                 LNORM__DEVJOBS_MAX);
        return LNORM_ELIMIT;
    }
    lnorm__devjob *dj = calloc(1, sizeof *dj);
    if (!dj) {
        atomic_fetch_sub(&d->dev_jobs, 1);
        snprintf(err, errlen, "out of memory");
        return LNORM_ENOMEM;
    }
    dj->seg = r->dec.seg;
    dj->r = r;
    dj->d = d;
    dj->job.batch.segs = &dj->seg;
    dj->job.batch.nsegs = 1;
    dj->job.rows = r->rows;
    dj->job.bytes = r->bytes;
    dj->job.done = lnorm__devjob_done;
    dj->job.on_device = 1;
    dj->job.device = r->gpu;
    int rc = d->be->ops->submit(d->be, &dj->job);
    if (rc != LNORM_OK) {
        free(dj);
        atomic_fetch_sub(&d->dev_jobs, 1);
        snprintf(err, errlen, "the backend did not take the GPU job: %s", lnorm_strerror(rc));
    }
    return rc;
}

/* Normalize: resolve params and tensors by reference, allocate the other
 * outputs, queue. Takes r (with dec and dec.src, the message it may borrow
 * from); peer is the sender (socket requests) or NULL (ring requests,
 * whose tensors are in the ring's own region). */
static void lnorm__normalize_req(lnorm__daemon *d, lnorm__req *r, const lnorm__peer *peer)
{
    char err[256];
    lnorm__decoded *dec = &r->dec;
    if (dec->deadline_us)
        r->deadline_ns = r->recv_ns + (dec->deadline_us > UINT64_MAX / 4000 ? UINT64_MAX / 4 : dec->deadline_us * 1000);
    lnorm_segment *s = &dec->seg;
    int rc = LNORM_OK;
    if (dec->params_id) {
        if (lnorm__params_get(d->params, dec->params_id, &r->pset) != LNORM_OK) {
            snprintf(err, sizeof err, "normalize.affine.params_id: '%s' is not registered", dec->params_id);
            rc = LNORM_ENOTFOUND;
        } else if (r->pset->hidden != (uint64_t)s->hidden) {
            snprintf(err, sizeof err, "normalize.affine.params_id: '%s' has hidden %llu, the request %lld",
                     dec->params_id, (unsigned long long)r->pset->hidden, (long long)s->hidden);
            rc = LNORM_EINVAL;
        } else if (r->pset->dtype != LNORM_DTYPE_F32 && r->pset->dtype != s->x_dtype) {
            snprintf(err, sizeof err, "normalize.affine.params_id: '%s' is %s, x is %s (params must be f32 or x's dtype)",
                     dec->params_id, lnorm_dtype_name(r->pset->dtype), lnorm_dtype_name(s->x_dtype));
            rc = LNORM_EINVAL;
        } else {
            s->param_dtype = r->pset->dtype;
            s->gamma = r->pset->gamma;
            s->beta = r->pset->beta;
        }
    }
    if (rc == LNORM_OK && dec->nrefs)
        rc = lnorm__shm_resolve(d, r, peer, r->ring ? lnorm__ring_region(r->ring) : NULL, err, sizeof err);
    int own_y = !dec->ref[LNORM__T_Y].set, own_mean = dec->want_mean && !dec->ref[LNORM__T_MEAN].set;
    int own_rstd = dec->want_rstd && !dec->ref[LNORM__T_RSTD].set;
    int own_res = dec->res_out_bytes && !dec->ref[LNORM__T_RES_OUT].set;
    if (rc == LNORM_OK) {
        /* Memory held by requests in flight is bounded (max-inflight-bytes);
         * tensors in shared memory are the client's, not counted. */
        uint64_t need = dec->in_bytes + (own_y ? dec->y_bytes : 0) + (own_res ? dec->res_out_bytes : 0) +
                        (own_mean ? dec->stat_bytes : 0) + (own_rstd ? dec->stat_bytes : 0);
        uint64_t held = (uint64_t)atomic_fetch_add(&d->stats.inflight_bytes, (int_fast64_t)need);
        r->reserved = need;
        if (held + need > d->cfg.max_inflight_bytes) {
            snprintf(err, sizeof err, "max-inflight-bytes: %llu bytes held by requests in flight, this one needs %llu",
                     (unsigned long long)held, (unsigned long long)need);
            rc = LNORM_ELIMIT;
        }
    }
    if (rc == LNORM_OK && lnorm__can_run_in_place(d, dec)) {
        dec->in_place = 1;
        s->y = (void *)s->x;
    } else if (rc == LNORM_OK) {
        if (own_y)
            s->y = r->y = lnorm__obuf(d, dec->y_bytes);
        if (own_mean)
            s->mean = r->mean = lnorm__obuf(d, dec->stat_bytes);
        if (own_rstd)
            s->rstd = r->rstd = lnorm__obuf(d, dec->stat_bytes);
        if (own_res)
            s->residual_out = r->res_out = lnorm__obuf(d, dec->res_out_bytes);
        if ((own_y && !r->y) || (own_mean && !r->mean) || (own_rstd && !r->rstd) || (own_res && !r->res_out)) {
            snprintf(err, sizeof err, "out of memory for the outputs");
            rc = LNORM_ENOMEM;
        }
    }
    if (rc == LNORM_OK) {
        r->rows = (uint64_t)s->rows;
        r->bytes = dec->in_bytes + dec->y_bytes + dec->res_out_bytes + (dec->want_mean ? dec->stat_bytes : 0) +
                   (dec->want_rstd ? dec->stat_bytes : 0);
        for (int t = 0; t < LNORM__T_N; t++)
            if (dec->ref[t].set && t != LNORM__T_Y && t != LNORM__T_MEAN && t != LNORM__T_RSTD && t != LNORM__T_RES_OUT)
                r->bytes += dec->ref[t].bytes;
        r->priority = dec->priority;
        r->max_queue_us = dec->max_queue_us;
        if (r->on_device)
            rc = lnorm__submit_device(d, r, err, sizeof err);
        else if (r->rows > 1 && r->bytes > LNORM__SHM_CHUNK_BYTES && lnorm__all_by_ref(dec) &&
                 !s->residual == !s->residual_out)
            rc = lnorm__submit_split(d, r, err, sizeof err);
        else
            rc = lnorm__batcher_submit(d->batcher, r, err, sizeof err);
    }
    if (rc != LNORM_OK)
        lnorm__req_fail(d, r, rc, err);
}

/* NormalizeBackward: resolve gamma by params id, allocate dx / dgamma /
 * dbeta (dx even when not wanted: the core always writes it), queue. */
static void lnorm__backward_req(lnorm__daemon *d, lnorm__req *r)
{
    char err[256];
    lnorm__decoded *dec = &r->dec;
    if (dec->deadline_us)
        r->deadline_ns = r->recv_ns + (dec->deadline_us > UINT64_MAX / 4000 ? UINT64_MAX / 4 : dec->deadline_us * 1000);
    lnorm_bwd_segment *s = &dec->bseg;
    int rc = LNORM_OK;
    if (dec->params_id) {
        if (lnorm__params_get(d->params, dec->params_id, &r->pset) != LNORM_OK) {
            snprintf(err, sizeof err, "normalize_backward.affine.params_id: '%s' is not registered", dec->params_id);
            rc = LNORM_ENOTFOUND;
        } else if (r->pset->hidden != (uint64_t)s->hidden) {
            snprintf(err, sizeof err, "normalize_backward.affine.params_id: '%s' has hidden %llu, the request %lld",
                     dec->params_id, (unsigned long long)r->pset->hidden, (long long)s->hidden);
            rc = LNORM_EINVAL;
        } else if (r->pset->dtype != LNORM_DTYPE_F32 && r->pset->dtype != s->x_dtype) {
            snprintf(err, sizeof err,
                     "normalize_backward.affine.params_id: '%s' is %s, x is %s (params must be f32 or x's dtype)",
                     dec->params_id, lnorm_dtype_name(r->pset->dtype), lnorm_dtype_name(s->x_dtype));
            rc = LNORM_EINVAL;
        } else {
            s->param_dtype = r->pset->dtype;
            s->gamma = r->pset->gamma; /* NULL when the set has only a beta */
        }
    }
    const uint64_t out = dec->dx_bytes + (dec->want_dgamma ? dec->grad_bytes : 0) +
                         (dec->want_dbeta ? dec->grad_bytes : 0);
    if (rc == LNORM_OK) {
        uint64_t need = dec->in_bytes + out;
        uint64_t held = (uint64_t)atomic_fetch_add(&d->stats.inflight_bytes, (int_fast64_t)need);
        r->reserved = need;
        if (held + need > d->cfg.max_inflight_bytes) {
            snprintf(err, sizeof err, "max-inflight-bytes: %llu bytes held by requests in flight, this one needs %llu",
                     (unsigned long long)held, (unsigned long long)need);
            rc = LNORM_ELIMIT;
        }
    }
    if (rc == LNORM_OK) {
        s->dx = r->y = lnorm__obuf(d, dec->dx_bytes);
        if (dec->want_dgamma)
            s->dgamma = r->mean = lnorm__obuf(d, dec->grad_bytes);
        if (dec->want_dbeta)
            s->dbeta = r->rstd = lnorm__obuf(d, dec->grad_bytes);
        if (!r->y || (dec->want_dgamma && !r->mean) || (dec->want_dbeta && !r->rstd)) {
            snprintf(err, sizeof err, "out of memory for the outputs");
            rc = LNORM_ENOMEM;
        }
    }
    if (rc == LNORM_OK) {
        r->rows = (uint64_t)s->rows;
        r->bytes = dec->in_bytes + out;
        r->priority = dec->priority;
        r->max_queue_us = dec->max_queue_us;
        rc = lnorm__batcher_submit(d->batcher, r, err, sizeof err);
    }
    if (rc != LNORM_OK)
        lnorm__req_fail(d, r, rc, err);
}

/* Normalize from a message: the request takes dec (and dec->src). */
static void lnorm__do_normalize(lnorm__daemon *d, void *slot, lnorm__decoded *dec, uint64_t recv_ns)
{
    lnorm__req *r = calloc(1, sizeof *r);
    if (!r) {
        lnorm__reply_error(d, slot, dec->request_id, LNORM_ENOMEM, "out of memory");
        nng_msg *src = dec->src;
        lnorm__codec_decoded_free(dec);
        if (src)
            nng_msg_free(src);
        return;
    }
    r->dec = *dec;
    r->slot = slot;
    r->recv_ns = recv_ns;
    if (dec->kind == LNORM__REQ_BACKWARD) {
        lnorm__backward_req(d, r);
        return;
    }
    lnorm__peer peer;
    if (dec->nrefs)
        lnorm__transport_peer(slot, &peer);
    lnorm__normalize_req(d, r, dec->nrefs ? &peer : NULL);
}

/* A descriptor from a ring (the ring poller's thread): decoded from its
 * private copy and queued like a message's request; answered on the ring. */
void lnorm__dispatch_ring(void *arg, lnorm__ring *ring, const lnorm_ring_sqe *sqe, uint64_t recv_ns)
{
    lnorm__daemon *d = arg;
    char err[256];
    atomic_fetch_add(&d->stats.inflight, 1);
    lnorm__req *r = calloc(1, sizeof *r);
    if (!r) {
        lnorm__stats_reply(&d->stats, lnorm_err_to_status(LNORM_ENOMEM));
        atomic_fetch_sub(&d->stats.inflight, 1);
        lnorm__ring_complete(ring, sqe->tag, LNORM_ENOMEM, "out of memory", NULL);
        return;
    }
    r->ring = ring;
    r->recv_ns = recv_ns;
    int rc = lnorm__codec_decode_sqe(sqe, lnorm__ring_region(ring)->id, &d->lim, &r->dec, err, sizeof err);
    if (rc == LNORM_OK && atomic_load(&d->draining)) {
        snprintf(err, sizeof err, "lnormd is shutting down (draining)");
        rc = LNORM_EUNAVAIL;
    }
    if (rc != LNORM_OK) {
        r->dec.request_id = sqe->tag;
        lnorm__req_fail(d, r, rc, err);
        return;
    }
    lnorm__normalize_req(d, r, NULL);
}

void lnorm__dispatch_msg(void *arg, void *slot, nng_msg *msg)
{
    lnorm__daemon *d = arg;
    uint64_t recv_ns = lnorm__now_ns();
    char err[256];
    lnorm__decoded dec;
    size_t len = nng_msg_len(msg);
    /* Whether the request arrived after SIGTERM is decided here, before it
     * counts as in flight (and before decoding, which takes a while for a
     * large message): a request seen in flight before the signal is served. */
    int late = atomic_load(&d->draining);
    atomic_fetch_add(&d->stats.inflight, 1);
    atomic_fetch_add(&d->stats.bytes_in, len);
    /* A backend that borrows its inputs gets x in the message, which then
     * lives as long as the request; else x is copied (into pinned memory
     * where the backend wants it). */
    int rc = d->borrow ? lnorm__codec_decode_request_borrow(nng_msg_body(msg), len, &d->lim, &dec, err, sizeof err)
                       : lnorm__codec_decode_request(nng_msg_body(msg), len, &d->lim, d->pb_allocp, &dec, err,
                                                     sizeof err);
    lnorm__stats_stage(&d->stats, LNORM__STAGE_DECODE, lnorm__now_ns() - recv_ns);
    if (rc != LNORM_OK) {
        lnorm__reply_error(d, slot, dec.request_id, rc, err);
        lnorm__codec_decoded_free(&dec);
        nng_msg_free(msg);
        return;
    }
    Lnorm__V1__Request *m = dec.msg;
    Lnorm__V1__Response r = LNORM__V1__RESPONSE__INIT;
    r.request_id = dec.request_id;
    if (late && dec.kind != LNORM__REQ_HEALTH && dec.kind != LNORM__REQ_INFO &&
        dec.kind != LNORM__V1__REQUEST__BODY_UNREGISTER_REGION) {
        /* Received after SIGTERM: not started, so that the drain ends. */
        lnorm__reply_error(d, slot, dec.request_id, LNORM_EUNAVAIL, "lnormd is shutting down (draining)");
        lnorm__codec_decoded_free(&dec);
        nng_msg_free(msg);
        return;
    }
    switch (dec.kind) {
    case LNORM__REQ_NORMALIZE:
    case LNORM__REQ_BACKWARD:
        if (dec.borrowed)
            dec.src = msg;
        else
            nng_msg_free(msg);
        lnorm__do_normalize(d, slot, &dec, recv_ns);
        return; /* dec (and msg) are owned by the request now */
    case LNORM__REQ_HEALTH: {
        Lnorm__V1__HealthResponse h = LNORM__V1__HEALTH_RESPONSE__INIT;
        h.serving = atomic_load(&d->serving) ? 1 : 0;
        r.body_case = LNORM__V1__RESPONSE__BODY_HEALTH;
        r.health = &h;
        lnorm__reply_body(d, slot, &r);
        break;
    }
    case LNORM__REQ_INFO:
        lnorm__do_info(d, slot, dec.request_id);
        break;
    case LNORM__REQ_REGISTER: {
        const Lnorm__V1__RegisterParamsRequest *p = m->register_params;
        rc = lnorm__params_register(d->params, p->params_id, p->dtype, p->hidden, p->gamma.data, p->gamma.len,
                                    p->beta.data, p->beta.len);
        if (rc == LNORM_OK) {
            Lnorm__V1__RegisterParamsResponse body = LNORM__V1__REGISTER_PARAMS_RESPONSE__INIT;
            r.body_case = LNORM__V1__RESPONSE__BODY_REGISTER_PARAMS;
            r.register_params = &body;
            LOG_INFO("params '%s' registered (%s, hidden %llu)", p->params_id, lnorm_dtype_name(p->dtype),
                     (unsigned long long)p->hidden);
            lnorm__reply_body(d, slot, &r);
        } else {
            snprintf(err, sizeof err, "register_params.params_id: '%s' %s%s%s", p->params_id,
                     rc == LNORM_EEXIST ? "is already registered (drop it first to replace it)" : "not registered: ",
                     rc == LNORM_EEXIST ? "" : lnorm_strerror(rc), rc == LNORM_ELIMIT ? " (max-params-bytes)" : "");
            lnorm__reply_error(d, slot, dec.request_id, rc, err);
        }
        break;
    }
    case LNORM__REQ_DROP:
        rc = lnorm__params_drop(d->params, m->drop_params->params_id);
        if (rc == LNORM_OK) {
            Lnorm__V1__DropParamsResponse body = LNORM__V1__DROP_PARAMS_RESPONSE__INIT;
            r.body_case = LNORM__V1__RESPONSE__BODY_DROP_PARAMS;
            r.drop_params = &body;
            LOG_INFO("params '%s' dropped", m->drop_params->params_id);
            lnorm__reply_body(d, slot, &r);
        } else {
            snprintf(err, sizeof err, "drop_params.params_id: '%s' is not registered", m->drop_params->params_id);
            lnorm__reply_error(d, slot, dec.request_id, rc, err);
        }
        break;
    case LNORM__V1__REQUEST__BODY_REGISTER_REGION:
    case LNORM__V1__REQUEST__BODY_UNREGISTER_REGION:
    case LNORM__V1__REQUEST__BODY_REGION_STATUS:
    case LNORM__V1__REQUEST__BODY_ATTACH_RING: {
        lnorm__peer peer;
        lnorm__shm_reply body;
        lnorm__transport_peer(slot, &peer);
        rc = lnorm__shm_control(d, &peer, m, &r, &body, err, sizeof err);
        if (rc == LNORM_OK)
            lnorm__reply_body(d, slot, &r);
        else
            lnorm__reply_error(d, slot, dec.request_id, rc, err);
        break;
    }
    default:
        lnorm__reply_error(d, slot, dec.request_id, LNORM_EINVAL, "body: unknown request");
        break;
    }
    lnorm__codec_decoded_free(&dec);
    nng_msg_free(msg);
}

void lnorm__dispatch_finish(void *arg, lnorm__req *r, int err, const char *why, const lnorm__timing *t)
{
    lnorm__daemon *d = arg;
    if (r->group)
        lnorm__chunk_done(d, r, err, why, t);
    else
        lnorm__reply_done(d, r, err, why, t);
}

/* The reply of a finished NormalizeBackward (status OK); frees r. */
static void lnorm__reply_backward(lnorm__daemon *d, lnorm__req *r, Lnorm__V1__Timings *tm, uint64_t t0)
{
    void *slot = r->slot;
    nng_msg *m = NULL;
    Lnorm__V1__Response resp = LNORM__V1__RESPONSE__INIT;
    Lnorm__V1__NormalizeBackwardResponse body = LNORM__V1__NORMALIZE_BACKWARD_RESPONSE__INIT;
    if (r->dec.want_dx) {
        body.dx.data = r->y;
        body.dx.len = r->dec.dx_bytes;
    }
    if (r->mean) {
        body.dgamma.data = r->mean;
        body.dgamma.len = r->dec.grad_bytes;
    }
    if (r->rstd) {
        body.dbeta.data = r->rstd;
        body.dbeta.len = r->dec.grad_bytes;
    }
    resp.request_id = r->dec.request_id;
    resp.timings = tm;
    resp.body_case = LNORM__V1__RESPONSE__BODY_NORMALIZE_BACKWARD;
    resp.normalize_backward = &body;
    Lnorm__V1__Status st = LNORM__V1__STATUS__INIT;
    resp.status = &st;
    if (lnorm__codec_pack(&resp, &m) == LNORM_OK)
        atomic_fetch_add(&d->stats.normalize_ok, 1);
    lnorm__stats_stage(&d->stats, LNORM__STAGE_ENCODE, lnorm__now_ns() - t0);
    lnorm__req_free(d, r);
    lnorm__send(d, slot, resp.request_id, 0, m);
}

/* Answer a finished request: on its ring, or as a reply on its slot. */
static void lnorm__reply_done(lnorm__daemon *d, lnorm__req *r, int err, const char *why, const lnorm__timing *t)
{
    void *slot = r->slot;
    nng_msg *m = NULL;
    uint64_t t0 = lnorm__now_ns();
    if (t->done_ns)
        lnorm__stats_stage(&d->stats, LNORM__STAGE_REPLY_WAIT, t0 - t->done_ns);
    if (r->ring) {
        char msg[LNORM_RING_MSG];
        if (err != LNORM_OK)
            snprintf(msg, sizeof msg, "%s%s%s", lnorm_strerror(err), why ? ": " : "", why ? why : "");
        lnorm__ring_answer(d, r, err, err != LNORM_OK ? msg : NULL, t);
        return;
    }
    if (err != LNORM_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s%s%s", lnorm_strerror(err), why ? ": " : "", why ? why : "");
        uint64_t id = r->dec.request_id;
        lnorm__codec_pack_error(id, err, msg, &m);
        /* Resources go back before the reply leaves, so that a client
         * that has its reply sees them released (metrics, params). */
        lnorm__req_free(d, r);
        lnorm__send(d, slot, id, lnorm_err_to_status(err), m);
        return;
    }
    Lnorm__V1__Response resp = LNORM__V1__RESPONSE__INIT;
    Lnorm__V1__Timings tm = LNORM__V1__TIMINGS__INIT;
    Lnorm__V1__NormalizeResponse body = LNORM__V1__NORMALIZE_RESPONSE__INIT;
    tm.queue_us = t->queue_us;
    tm.compute_us = t->compute_us;
    tm.batch_rows = t->batch_rows;
    tm.batch_requests = t->batch_requests;
    if (r->dec.in_place) {
        /* y lies in the request message: the reply is written around it */
        m = r->dec.src;
        r->dec.src = NULL;
        nng_msg_header_clear(m);
        int rc = lnorm__codec_pack_y_in_place(m, r->dec.seg.y, r->dec.y_bytes, r->dec.request_id, &tm);
        lnorm__stats_stage(&d->stats, LNORM__STAGE_ENCODE, lnorm__now_ns() - t0);
        uint64_t id = r->dec.request_id;
        if (rc != LNORM_OK) {
            nng_msg_free(m);
            m = NULL;
        } else {
            atomic_fetch_add(&d->stats.normalize_ok, 1);
        }
        lnorm__req_free(d, r);
        if (rc != LNORM_OK) {
            lnorm__codec_pack_error(id, rc, "could not encode the reply", &m);
            lnorm__send(d, slot, id, lnorm_err_to_status(rc), m);
        } else {
            lnorm__send(d, slot, id, 0, m);
        }
        return;
    }
    if (r->dec.kind == LNORM__REQ_BACKWARD) {
        lnorm__reply_backward(d, r, &tm, t0);
        return;
    }
    if (r->y) { /* (NULL: y was written into the client's region) */
        body.y.data = r->y;
        body.y.len = r->dec.y_bytes;
    }
    if (r->mean) {
        body.mean.data = r->mean;
        body.mean.len = r->dec.stat_bytes;
    }
    if (r->rstd) {
        body.rstd.data = r->rstd;
        body.rstd.len = r->dec.stat_bytes;
    }
    if (r->res_out) {
        body.residual_out.data = r->res_out;
        body.residual_out.len = r->dec.res_out_bytes;
    }
    resp.request_id = r->dec.request_id;
    resp.timings = &tm;
    resp.body_case = LNORM__V1__RESPONSE__BODY_NORMALIZE;
    resp.normalize = &body;
    Lnorm__V1__Status st = LNORM__V1__STATUS__INIT;
    resp.status = &st;
    if (lnorm__codec_pack(&resp, &m) == LNORM_OK)
        atomic_fetch_add(&d->stats.normalize_ok, 1);
    lnorm__stats_stage(&d->stats, LNORM__STAGE_ENCODE, lnorm__now_ns() - t0);
    lnorm__req_free(d, r);
    lnorm__send(d, slot, resp.request_id, 0, m);
}
