/* Background load for fault tests (see loadgen.h). */
#include "loadgen.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "testdaemon.h"
#include "wire.h"

typedef struct fl_client {
    fl_load *l;
    int index;
    pthread_t th;
    int started;
    fl_stats st;
    pthread_mutex_t mu;
} fl_client;

struct fl_load {
    char url[320];
    uint64_t rows, hidden;
    int timeout_ms;
    atomic_int stop;
    int n;
    fl_client *c;
};

static void note(fl_client *c, long *counter, const char *fmt, const char *why)
{
    pthread_mutex_lock(&c->mu);
    (*counter)++;
    if (!c->st.first_problem[0])
        snprintf(c->st.first_problem, sizeof c->st.first_problem, fmt, why);
    pthread_mutex_unlock(&c->mu);
}

static void *client_main(void *arg)
{
    fl_client *c = arg;
    fl_load *l = c->l;
    nng_socket s;
    int rv = fw_req_open(&s, l->url, l->timeout_ms, 50);
    if (rv) {
        note(c, &c->st.failed, "open: %s", nng_strerror(rv));
        return NULL;
    }
    uint32_t seq = 0;
    while (!atomic_load(&l->stop)) {
        int op = (seq & 1) ? LNORM__V1__OP__OP_RMS_NORM : LNORM__V1__OP__OP_LAYER_NORM;
        float *x = NULL;
        size_t len = 0;
        uint64_t id = ((uint64_t)c->index << 32) | seq;
        uint8_t *buf = fw_pack_norm(id, op, l->rows, l->hidden, seq * 131u + (uint32_t)c->index, &x, &len);
        seq++;
        if (!buf) {
            free(x);
            note(c, &c->st.failed, "%s", "out of memory");
            break;
        }
        int64_t t0 = td_now_ms();
        Lnorm__V1__Response *r = NULL;
        rv = fw_req_call(s, buf, len, &r);
        int64_t dt = td_now_ms() - t0;
        char why[200];
        if (rv) {
            note(c, &c->st.failed, "transport: %s", rv > 0 ? nng_strerror(rv) : "bad reply");
        } else if (r->request_id != id) {
            note(c, &c->st.wrong, "%s", "reply carries another request_id");
        } else if (fw_check_norm(r, op, l->rows, l->hidden, x, why, sizeof why) != 0) {
            note(c, &c->st.wrong, "%s", why);
        } else {
            pthread_mutex_lock(&c->mu);
            c->st.ok++;
            pthread_mutex_unlock(&c->mu);
        }
        pthread_mutex_lock(&c->mu);
        if (dt > c->st.max_ms)
            c->st.max_ms = dt;
        pthread_mutex_unlock(&c->mu);
        if (r)
            lnorm__v1__response__free_unpacked(r, NULL);
        free(buf);
        free(x);
    }
    nng_close(s);
    return NULL;
}

fl_load *fl_start(const char *url, int nclients, uint64_t rows, uint64_t hidden, int timeout_ms)
{
    fl_load *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->c = calloc((size_t)nclients, sizeof *l->c);
    if (!l->c) {
        free(l);
        return NULL;
    }
    snprintf(l->url, sizeof l->url, "%s", url);
    l->rows = rows;
    l->hidden = hidden;
    l->timeout_ms = timeout_ms;
    l->n = nclients;
    atomic_init(&l->stop, 0);
    for (int i = 0; i < nclients; i++) {
        fl_client *c = &l->c[i];
        c->l = l;
        c->index = i;
        pthread_mutex_init(&c->mu, NULL);
        c->started = pthread_create(&c->th, NULL, client_main, c) == 0;
    }
    return l;
}

void fl_stats_add(fl_stats *tot, const fl_stats *s)
{
    tot->ok += s->ok;
    tot->wrong += s->wrong;
    tot->failed += s->failed;
    if (s->max_ms > tot->max_ms)
        tot->max_ms = s->max_ms;
    if (!tot->first_problem[0] && s->first_problem[0])
        snprintf(tot->first_problem, sizeof tot->first_problem, "%s", s->first_problem);
}

static void sum(fl_load *l, fl_stats *out)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < l->n; i++) {
        fl_client *c = &l->c[i];
        pthread_mutex_lock(&c->mu);
        fl_stats_add(out, &c->st);
        pthread_mutex_unlock(&c->mu);
    }
}

void fl_peek(fl_load *l, fl_stats *out)
{
    sum(l, out);
}

void fl_stop(fl_load *l, fl_stats *out)
{
    atomic_store(&l->stop, 1);
    for (int i = 0; i < l->n; i++)
        if (l->c[i].started)
            pthread_join(l->c[i].th, NULL);
    sum(l, out);
    for (int i = 0; i < l->n; i++)
        pthread_mutex_destroy(&l->c[i].mu);
    free(l->c);
    free(l);
}
