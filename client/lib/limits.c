/*
 * The servers' limits, read with Info once per new connection: chunks of a
 * normalize call are cut to fit max-message-bytes, and a request whose
 * single row cannot fit is refused here (LNORM_ELIMIT naming the limit)
 * instead of being sent to a server that would drop it (lnormd drops a
 * message over max-message-bytes + 1 MiB unanswered).
 */
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

/* A new connection's limits are read at most this often. */
#define LNORM__LIMITS_EVERY_MS 1000

void lnorm__limits_note(lnorm_client *c, const lnorm_server_info *info)
{
    nng_mtx_lock(c->mtx);
    if (info->max_message_bytes && (!c->max_message_bytes || info->max_message_bytes < c->max_message_bytes))
        c->max_message_bytes = info->max_message_bytes;
    nng_mtx_unlock(c->mtx);
}

/* Whether to read the limits now; if so, marks the read started. */
static int limits_begin(lnorm_client *c)
{
    nng_time now = nng_clock();
    nng_mtx_lock(c->mtx);
    int go = !c->lim_fetching && !c->closing &&
             (!c->lim_tried || (c->pipes_gen != c->lim_gen && now - c->lim_at >= LNORM__LIMITS_EVERY_MS));
    if (go) {
        c->lim_fetching = 1;
        c->lim_tried = 1;
        c->lim_gen = c->pipes_gen;
        c->lim_at = now;
    }
    nng_mtx_unlock(c->mtx);
    return go;
}

static void limits_end(lnorm_client *c)
{
    nng_mtx_lock(c->mtx);
    c->lim_fetching = 0;
    nng_mtx_unlock(c->mtx);
}

/* Errors of an Info call that mean no server could be asked: a normalize
 * call would meet the same. */
static int unreachable(int err)
{
    return err == LNORM_ETIMEDOUT || err == LNORM_EUNAVAIL || err == LNORM_ECLOSED || err == LNORM_ETRANSPORT;
}

int lnorm__limits_refresh(lnorm_client *c, int timeout_ms, lnorm_result *res)
{
    if (!limits_begin(c))
        return LNORM_OK;
    lnorm_server_info info;
    lnorm_result r;
    int rv = lnorm__info_call(c, &info, timeout_ms, NULL, NULL, &r);
    limits_end(c);
    if (rv == LNORM_OK || !unreachable(rv))
        return LNORM_OK;
    if (res)
        *res = r;
    return rv;
}

typedef struct kick_state {
    lnorm_client *c;
    lnorm_server_info info;
} kick_state;

static void kick_done(void *arg, int err, const lnorm_result *res)
{
    kick_state *k = arg;
    (void)err;
    (void)res;
    limits_end(k->c);
    free(k);
}

void lnorm__limits_kick(lnorm_client *c)
{
    if (!limits_begin(c))
        return;
    kick_state *k = malloc(sizeof *k);
    if (k) {
        k->c = c;
        if (lnorm__info_call(c, &k->info, 0, kick_done, k, NULL) == LNORM_OK)
            return;
        free(k);
    }
    limits_end(c);
}

int lnorm__fit_rows(lnorm_client *c, size_t req_row, size_t fixed, size_t reply_row, uint64_t *rows,
                    const char **why)
{
    static _Thread_local char text[200];
    uint64_t lim = 0;
    nng_mtx_lock(c->mtx);
    lim = c->max_message_bytes;
    nng_mtx_unlock(c->mtx);
    if (lim) {
        if (req_row + fixed > lim) {
            snprintf(text, sizeof text,
                     "one row makes a request of %zu bytes, over the server's max-message-bytes %llu", req_row + fixed,
                     (unsigned long long)lim);
            *why = text;
            return LNORM_ELIMIT;
        }
        uint64_t fit = (lim - fixed) / req_row;
        if (*rows > fit)
            *rows = fit;
    }
    size_t rlim = c->opts.max_recv_bytes;
    if (reply_row + fixed > rlim) {
        snprintf(text, sizeof text, "one row's reply of %zu bytes is over max_recv_bytes %zu", reply_row + fixed, rlim);
        *why = text;
        return LNORM_ELIMIT;
    }
    uint64_t rfit = (rlim - fixed) / reply_row;
    if (*rows > rfit)
        *rows = rfit;
    return LNORM_OK;
}
