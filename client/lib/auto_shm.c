/*
 * Shared memory on the caller's behalf (lnorm_client_opts.auto_shm_bytes).
 *
 * A synchronous lnorm_normalize whose tensors add up to at least
 * auto_shm_bytes, from a client whose URLs are all ipc:// (lnormd on this
 * host) and whose daemon allows it shared memory (Info), copies its inputs
 * into a region of the client's own, sends one small request naming them
 * (lnorm_normalize_shm) and copies the outputs back: two memcpy's at memory
 * speed instead of the socket's 2-3 GB/s. Regions are kept for later calls
 * (up to LNORM__AUTO_KEEP idle ones) and created when none idle is large
 * enough. A call the shared path cannot take (no region could be made, the
 * region was lost with its connection) goes over the socket instead; a
 * daemon that refuses this client shared memory turns the path off for
 * the client.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define LNORM__AUTO_ALIGN 64
#define LNORM__AUTO_MIN_REGION ((size_t)1 << 20)

static size_t up(size_t n)
{
    return (n + LNORM__AUTO_ALIGN - 1) & ~(size_t)(LNORM__AUTO_ALIGN - 1);
}

/* Whether the shared path may be tried: every URL ipc://, and the daemon
 * says this caller may use shared memory (asked once). */
static int auto_on(lnorm_client *c)
{
    nng_mtx_lock(c->mtx);
    int st = c->auto_state;
    nng_mtx_unlock(c->mtx);
    if (st)
        return st > 0;
    st = 1;
    for (size_t i = 0; i < c->ndials; i++)
        if (strncmp(c->dials[i].url, "ipc://", 6) != 0)
            st = -1;
    if (st > 0) {
        lnorm_server_info info;
        if (lnorm_info(c, &info, NULL) != LNORM_OK)
            return 0; /* not known yet: the socket this time, ask again next time */
        st = info.shm ? 1 : -1;
    }
    nng_mtx_lock(c->mtx);
    c->auto_state = st;
    nng_mtx_unlock(c->mtx);
    return st > 0;
}

/* An idle region of at least n bytes, or a new one; NULL if none can be had. */
static lnorm_shm *auto_take(lnorm_client *c, size_t n, int *refused)
{
    nng_mtx_lock(c->mtx);
    for (int i = 0; i < c->nauto_idle; i++)
        if (lnorm_shm_size(c->auto_idle[i]) >= n) {
            lnorm_shm *s = c->auto_idle[i];
            c->auto_idle[i] = c->auto_idle[--c->nauto_idle];
            nng_mtx_unlock(c->mtx);
            return s;
        }
    nng_mtx_unlock(c->mtx);
    size_t size = LNORM__AUTO_MIN_REGION;
    while (size < n)
        size *= 2;
    lnorm_shm *s = NULL;
    lnorm_result res;
    int rv = lnorm_shm_create(c, size, &s, &res);
    *refused = rv == LNORM_EPERM || rv == LNORM_ENOTSUP;
    return rv == LNORM_OK ? s : NULL;
}

/* Keep s for a later call, or unregister it (the smallest goes first). */
static void auto_put(lnorm_client *c, lnorm_shm *s)
{
    nng_mtx_lock(c->mtx);
    if (c->nauto_idle < LNORM__AUTO_KEEP) {
        c->auto_idle[c->nauto_idle++] = s;
        s = NULL;
    } else {
        int k = 0;
        for (int i = 1; i < c->nauto_idle; i++)
            if (lnorm_shm_size(c->auto_idle[i]) < lnorm_shm_size(c->auto_idle[k]))
                k = i;
        if (lnorm_shm_size(c->auto_idle[k]) < lnorm_shm_size(s)) {
            lnorm_shm *t = c->auto_idle[k];
            c->auto_idle[k] = s;
            s = t;
        }
    }
    nng_mtx_unlock(c->mtx);
    lnorm_shm_destroy(s, NULL);
}

static void *place(unsigned char *base, size_t *off, const void *src, size_t n)
{
    void *p = base + *off;
    if (src)
        memcpy(p, src, n);
    *off += up(n);
    return p;
}

int lnorm__auto_normalize(lnorm_client *c, const lnorm_normalize_req *req, lnorm_result *res)
{
    if (lnorm_normalize_req_check(req, NULL) != LNORM_OK)
        return LNORM__AUTO_NO; /* the normal path says what is wrong */
    const lnorm_dtype yd = req->y_dtype ? req->y_dtype : req->x_dtype;
    const lnorm_dtype pd = req->param_dtype ? req->param_dtype : req->x_dtype;
    const size_t n = (size_t)req->rows * (size_t)req->hidden;
    const size_t xb = n * lnorm_dtype_size(req->x_dtype), yb = n * lnorm_dtype_size(yd);
    const size_t pb = (size_t)req->hidden * lnorm_dtype_size(pd), sb = (size_t)req->rows * 4;
    const int res_on = req->residual != NULL, mean_on = req->want_stats && req->mean,
              rstd_on = req->want_stats && req->rstd;
    size_t need = up(xb) + up(yb) + (res_on ? 2 * up(xb) : 0) + (req->gamma ? up(pb) : 0) +
                  (req->beta ? up(pb) : 0) + (mean_on ? up(sb) : 0) + (rstd_on ? up(sb) : 0);
    size_t payload = xb + yb + (res_on ? 2 * xb : 0);
    if (payload < c->opts.auto_shm_bytes || need > ((size_t)1 << 40) || !auto_on(c))
        return LNORM__AUTO_NO;
    int refused = 0;
    lnorm_shm *s = auto_take(c, need, &refused);
    if (!s) {
        if (refused) {
            nng_mtx_lock(c->mtx);
            c->auto_state = -1;
            nng_mtx_unlock(c->mtx);
        }
        return LNORM__AUTO_NO;
    }
    unsigned char *b = lnorm_shm_data(s);
    size_t off = 0;
    lnorm_normalize_req q = *req;
    q.x = place(b, &off, req->x, xb);
    q.y = place(b, &off, NULL, yb);
    q.residual = res_on ? place(b, &off, req->residual, xb) : NULL;
    q.residual_out = res_on ? place(b, &off, NULL, xb) : NULL;
    q.gamma = req->gamma ? place(b, &off, req->gamma, pb) : NULL;
    q.beta = req->beta ? place(b, &off, req->beta, pb) : NULL;
    q.mean = mean_on ? place(b, &off, NULL, sb) : NULL;
    q.rstd = rstd_on ? place(b, &off, NULL, sb) : NULL;
    int rv = lnorm_normalize_shm(c, &q, res);
    if (rv == LNORM_ENOTFOUND || rv == LNORM_EPERM) {
        /* The region went with its connection, or the daemon changed its
         * mind: this call goes over the socket. */
        lnorm_shm_destroy(s, NULL);
        if (rv == LNORM_EPERM) {
            nng_mtx_lock(c->mtx);
            c->auto_state = -1;
            nng_mtx_unlock(c->mtx);
        }
        return LNORM__AUTO_NO;
    }
    if (rv == LNORM_OK) {
        memcpy(req->y, q.y, yb);
        if (res_on && req->residual_out)
            memcpy(req->residual_out, q.residual_out, xb);
        if (mean_on)
            memcpy(req->mean, q.mean, sb);
        if (rstd_on)
            memcpy(req->rstd, q.rstd, sb);
    }
    auto_put(c, s);
    return rv;
}

void lnorm__auto_forget(lnorm_client *c)
{
    c->nauto_idle = 0; /* the regions themselves go with lnorm__shm_forget_all */
}
