/*
 * Whether anybody listens at a client's URLs. NNG's dialers reconnect in
 * the background and say nothing of a connect that fails, so a request
 * with no connection could only wait for its send timeout. A probe is one
 * connect of NNG's stream dialer followed by the SP handshake of a REQ
 * peer (send our 8-byte header, read the server's), bounded by
 * LNORM__PROBE_TIMEOUT_MS a step: a refused connect (no listener, or no
 * ipc socket file) marks the URL refused; anything else leaves it
 * possibly serving. The handshake is completed, never cut short: libnng
 * 1.5.2's ipc listener stops accepting for good when a peer closes before
 * the server's header is written. tcp:// and ipc:// URLs are probed;
 * others (tls+tcp://) are never counted as refused. lnorm_client_open
 * probes every URL at once and waits for them; later probes run while
 * requests wait without a connection.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* The SP header of a REQ0 peer: "\0SP\0", protocol 48 (big-endian), 0. */
static const uint8_t req_hdr[8] = {0, 'S', 'P', 0, 0, 48, 0, 0};

/* Move the probe on by one step (data: the step's buffer and length). */
static void probe_io(lnorm__dial *d, uint8_t *data, size_t len)
{
    nng_iov iov = {data + d->probe_done, len - d->probe_done};
    nng_aio_set_iov(d->probe_aio, 1, &iov);
    nng_aio_set_timeout(d->probe_aio, LNORM__PROBE_TIMEOUT_MS);
    if (d->probe_step == 2)
        nng_stream_send(d->probe_conn, d->probe_aio);
    else
        nng_stream_recv(d->probe_conn, d->probe_aio);
}

static void probe_cb(void *arg)
{
    lnorm__dial *d = arg;
    lnorm_client *c = d->owner;
    int rv = nng_aio_result(d->probe_aio);
    if (rv == 0 && d->probe_step == 1) {
        d->probe_conn = nng_aio_get_output(d->probe_aio, 0);
        d->probe_step = 2;
        d->probe_done = 0;
        memcpy(d->probe_hdr, req_hdr, 8);
        probe_io(d, d->probe_hdr, 8);
        return;
    }
    if (rv == 0 && d->probe_step >= 2) {
        d->probe_done += nng_aio_count(d->probe_aio);
        if (d->probe_done < 8) {
            probe_io(d, d->probe_hdr, 8);
            return;
        }
        if (d->probe_step == 2) {
            d->probe_step = 3;
            d->probe_done = 0;
            probe_io(d, d->probe_hdr, 8);
            return;
        }
    }
    if (d->probe_conn) {
        nng_stream_free(d->probe_conn);
        d->probe_conn = NULL;
    }
    nng_mtx_lock(c->mtx);
    /* (a connection made meanwhile proves a listener whatever the probe says) */
    d->refused = d->probe_step == 1 && (rv == NNG_ECONNREFUSED || rv == NNG_ENOENT) && d->npipes == 0;
    d->probing = 0;
    d->probe_step = 0;
    c->nprobing--;
    nng_cv_wake(c->cv);
    nng_mtx_unlock(c->mtx);
}

int lnorm__probe_init(lnorm_client *c)
{
    for (size_t i = 0; i < c->ndials; i++) {
        lnorm__dial *d = &c->dials[i];
        if (strncmp(d->url, "tcp", 3) != 0 && strncmp(d->url, "ipc://", 6) != 0)
            continue;
        if (nng_stream_dialer_alloc(&d->probe, d->url) != 0) {
            d->probe = NULL;
            continue;
        }
        d->owner = c;
        if (nng_aio_alloc(&d->probe_aio, probe_cb, d) != 0) {
            nng_stream_dialer_free(d->probe);
            d->probe = NULL;
            return LNORM_ENOMEM;
        }
    }
    return LNORM_OK;
}

void lnorm__probe_start_locked(lnorm_client *c)
{
    if (c->closing)
        return;
    c->probe_at = nng_clock();
    for (size_t i = 0; i < c->ndials; i++) {
        lnorm__dial *d = &c->dials[i];
        if (!d->probe || d->probing)
            continue;
        d->probing = 1;
        d->probe_step = 1;
        c->nprobing++;
        nng_aio_set_timeout(d->probe_aio, LNORM__PROBE_TIMEOUT_MS);
        nng_stream_dialer_dial(d->probe, d->probe_aio);
    }
}

void lnorm__probe_fini(lnorm_client *c)
{
    for (size_t i = 0; i < c->ndials; i++) {
        lnorm__dial *d = &c->dials[i];
        if (d->probe_aio) {
            nng_aio_stop(d->probe_aio); /* the callback has run or never will */
            nng_aio_free(d->probe_aio);
            d->probe_aio = NULL;
        }
        if (d->probe_conn) {
            nng_stream_free(d->probe_conn);
            d->probe_conn = NULL;
        }
        if (d->probe) {
            nng_stream_dialer_free(d->probe);
            d->probe = NULL;
        }
    }
}

int lnorm__no_server(lnorm_client *c, char *why, size_t n)
{
    nng_time now = nng_clock();
    int fail = 0;
    nng_mtx_lock(c->mtx);
    if (c->nlive == 0 && !c->closing) {
        size_t refused = 0;
        for (size_t i = 0; i < c->ndials; i++)
            refused += c->dials[i].refused != 0;
        fail = refused == c->ndials && (!c->ever_connected || now - c->idle_since >= (nng_time)c->unavail_ms);
        if (!fail && now - c->probe_at >= LNORM__PROBE_EVERY_MS)
            lnorm__probe_start_locked(c);
    }
    if (fail) {
        size_t w = (size_t)snprintf(why, n, "no lnormd is listening at ");
        for (size_t i = 0; i < c->ndials && w < n; i++)
            w += (size_t)snprintf(why + w, n - w, "%s%s", i ? ", " : "", c->dials[i].url);
    }
    nng_mtx_unlock(c->mtx);
    return fail;
}
