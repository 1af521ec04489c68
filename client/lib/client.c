/*
 * The client object and the call engine: a pool of NNG contexts, and calls
 * made of one or several request/reply exchanges (chunks) kept in flight up
 * to a depth, each completing through its aio callback.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#include <nng/protocol/reqrep0/req.h>

const char *lnorm_client_version(void)
{
    return LNORM_VERSION;
}

void lnorm_client_opts_init(lnorm_client_opts *o)
{
    memset(o, 0, sizeof *o);
    o->send_timeout_ms = 10000;
    o->recv_timeout_ms = 30000;
    o->reconnect_min_ms = 100;
    o->reconnect_max_ms = 2000;
    o->resend_ms = 0;
    o->chunk_bytes = LNORM_DEFAULT_CHUNK_BYTES;
    o->pipeline_depth = LNORM_DEFAULT_PIPELINE_DEPTH;
    o->max_recv_bytes = (size_t)1 << 30;
}

int lnorm__from_nng(int rv)
{
    switch (rv) {
    case 0: return LNORM_OK;
    case NNG_ETIMEDOUT: return LNORM_ETIMEDOUT;
    case NNG_ECLOSED: return LNORM_ECLOSED;
    case NNG_ENOMEM: return LNORM_ENOMEM;
    case NNG_ECANCELED: return LNORM_ECANCELED;
    case NNG_EINVAL: case NNG_EADDRINVAL: return LNORM_EINVAL;
    case NNG_ENOTSUP: return LNORM_ENOTSUP;
    case NNG_EMSGSIZE: return LNORM_ELIMIT;
    case NNG_EPERM: case NNG_EPEERAUTH: return LNORM_EPERM;
    case NNG_ENOENT: return LNORM_ENOTFOUND;
    default: return LNORM_ETRANSPORT;
    }
}

void lnorm__result_fail(lnorm_result *r, int err, int status, const char *fmt, ...)
{
    if (r->err != LNORM_OK)
        return;
    r->err = err;
    r->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof r->message, fmt, ap);
    va_end(ap);
}

uint64_t lnorm__next_id(lnorm_client *c)
{
    nng_mtx_lock(c->mtx);
    uint64_t id = ++c->next_id;
    nng_mtx_unlock(c->mtx);
    return id;
}

nng_msg *lnorm__msg_get(lnorm_client *c, size_t n)
{
    nng_msg *m = NULL;
    nng_mtx_lock(c->mtx);
    for (int i = 0; i < c->npool; i++) {
        if (nng_msg_capacity(c->msg_pool[i]) >= n) { /* room from the body on */
            m = c->msg_pool[i];
            c->msg_pool[i] = c->msg_pool[--c->npool];
            break;
        }
    }
    nng_mtx_unlock(c->mtx);
    if (m) {
        nng_msg_clear(m);
        nng_msg_header_clear(m);
        if (nng_msg_realloc(m, n) == 0)
            return m;
        nng_msg_free(m);
    }
    if (nng_msg_alloc(&m, n) != 0)
        return NULL;
    return m;
}

void lnorm__msg_put(lnorm_client *c, nng_msg *m)
{
    if (!m)
        return;
    size_t cap = nng_msg_capacity(m);
    nng_mtx_lock(c->mtx);
    if (!c->closing && c->npool < LNORM__MSG_POOL && cap <= 2 * c->opts.chunk_bytes + ((size_t)1 << 20) &&
        cap >= 4096) {
        c->msg_pool[c->npool++] = m;
        m = NULL;
    }
    nng_mtx_unlock(c->mtx);
    if (m)
        nng_msg_free(m);
}

int lnorm__pack(const Lnorm__V1__Request *req, nng_msg **out)
{
    size_t n = lnorm__v1__request__get_packed_size(req);
    nng_msg *m;
    if (nng_msg_alloc(&m, n) != 0)
        return LNORM_ENOMEM;
    size_t w = lnorm__v1__request__pack(req, nng_msg_body(m));
    if (w != n) {
        nng_msg_free(m);
        return LNORM_EINTERNAL;
    }
    *out = m;
    return LNORM_OK;
}

/* ---- open / close --------------------------------------------------------- */

/* Create and start the dialer of c's URL i (TLS options from c->opts). */
static int dial_one(lnorm_client *c, size_t i)
{
    const lnorm_client_opts *o = &c->opts;
    const char *url = c->dials[i].url;
    nng_dialer d;
    int rv = nng_dialer_create(&d, c->sock, url);
    if (rv != 0)
        return lnorm__from_nng(rv);
    if (strncmp(url, "tls+tcp", 7) == 0) {
        if (o->tls_ca_file && (rv = nng_dialer_set_string(d, NNG_OPT_TLS_CA_FILE, o->tls_ca_file)) != 0)
            goto fail;
        if (o->tls_cert_key_file &&
            (rv = nng_dialer_set_string(d, NNG_OPT_TLS_CERT_KEY_FILE, o->tls_cert_key_file)) != 0)
            goto fail;
        if (o->tls_server_name &&
            (rv = nng_dialer_set_string(d, NNG_OPT_TLS_SERVER_NAME, o->tls_server_name)) != 0)
            goto fail;
        if (o->tls_insecure && (rv = nng_dialer_set_int(d, NNG_OPT_TLS_AUTH_MODE, 0)) != 0)
            goto fail;
    }
    /* Known before it can make a connection (pipe_cb maps pipes to URLs). */
    nng_mtx_lock(c->mtx);
    c->dials[i].d = d;
    c->dials[i].idle_since = nng_clock();
    nng_mtx_unlock(c->mtx);
    /* Non-blocking: a server that is down is dialed again in the background. */
    if ((rv = nng_dialer_start(d, NNG_FLAG_NONBLOCK)) != 0)
        goto fail;
    return LNORM_OK;
fail:
    nng_dialer_close(d);
    return lnorm__from_nng(rv);
}

/* The record of connection id, or NULL. Called with c->mtx held. */
static lnorm__pipe_rec *pipe_find(lnorm_client *c, uint32_t id)
{
    for (int i = 0; i < c->npipes; i++)
        if (c->pipes[i].id == id)
            return &c->pipes[i];
    return NULL;
}

/* Track the client's connections, each from ADD_PRE (which always comes
 * before REM_POST) to REM_POST, with the URL whose dialer made it. */
static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    lnorm_client *c = arg;
    uint32_t id = (uint32_t)nng_pipe_id(p);
    int did = ev == NNG_PIPE_EV_ADD_PRE ? nng_dialer_id(nng_pipe_dialer(p)) : -1;
    nng_mtx_lock(c->mtx);
    if (ev == NNG_PIPE_EV_ADD_PRE) {
        if ((size_t)c->npipes == c->cap_pipes) {
            size_t cap = c->cap_pipes ? 2 * c->cap_pipes : 8;
            lnorm__pipe_rec *np = realloc(c->pipes, cap * sizeof *np);
            if (!np) {
                nng_mtx_unlock(c->mtx);
                nng_pipe_close(p); /* untracked connections are not kept */
                return;
            }
            c->pipes = np;
            c->cap_pipes = cap;
        }
        lnorm__pipe_rec *r = &c->pipes[c->npipes++];
        r->id = id;
        r->dial = -1;
        r->closed = 0;
        for (size_t i = 0; i < c->ndials; i++)
            if (did > 0 && nng_dialer_id(c->dials[i].d) == did) {
                r->dial = (int)i;
                c->dials[i].npipes++;
                c->dials[i].refused = 0;
            }
        c->nlive++;
        c->pipes_gen++;
        c->ever_connected = 1;
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        lnorm__pipe_rec *r = pipe_find(c, id);
        if (r) {
            if (r->dial >= 0 && --c->dials[r->dial].npipes == 0)
                c->dials[r->dial].idle_since = nng_clock();
            if (!r->closed && --c->nlive == 0)
                c->idle_since = nng_clock();
            *r = c->pipes[--c->npipes];
        }
        nng_cv_wake(c->keeper_cv); /* (a URL may have no connection now) */
    }
    nng_mtx_unlock(c->mtx);
}

/*
 * The server on connection p answered UNAVAILABLE (draining). When the
 * client has a connection to another server, hold this server's URL: the
 * keeper closes its dialer (and so its connections: NNG would reconnect
 * at once) and dials it again after the hold, so that nothing new goes to
 * it until it serves again; meanwhile its connections count as closed.
 * A reply read after its connection closed (a drained lnormd exits right
 * after its last reply) holds nothing. Returns the connections left to
 * other servers (0: nothing done).
 */
static int hold_server(lnorm_client *c, nng_pipe p)
{
    nng_mtx_lock(c->mtx);
    lnorm__pipe_rec *r = pipe_find(c, (uint32_t)nng_pipe_id(p));
    int left = c->nlive; /* (no record: that connection is gone already, its server likely too) */
    if (r) {
        int dial = r->dial, mine = 0;
        for (int i = 0; i < c->npipes; i++)
            mine += !c->pipes[i].closed && (dial >= 0 ? c->pipes[i].dial == dial : &c->pipes[i] == r);
        left = c->nlive - mine;
        if (left > 0) {
            for (int i = 0; i < c->npipes; i++)
                if (!c->pipes[i].closed && (dial >= 0 ? c->pipes[i].dial == dial : &c->pipes[i] == r))
                    c->pipes[i].closed = 1;
            c->nlive = left;
            if (dial >= 0 && !c->dials[dial].held) {
                c->dials[dial].held = 1;
                c->dials[dial].held_until = nng_clock() + (nng_time)c->hold_ms;
                c->dials[dial].close_now = 1;
            }
            if (c->nclose < LNORM__CLOSE_QUEUE)
                c->close_pipes[c->nclose++] = p; /* (at once: a dialer closes its connections later) */
            nng_cv_wake(c->keeper_cv);
        }
    }
    nng_mtx_unlock(c->mtx);
    return left > 0 ? left : 0;
}

/* Replies still on their way to c's socket: over its connections (or
 * only the nonly pipes of only), the requests written less the replies
 * read (NNG's statistics of each connection; 0 when this NNG keeps none). */
static uint64_t replies_due(lnorm_client *c, const nng_pipe *only, int nonly)
{
    nng_stat *root = NULL;
    if (nng_stats_get(&root) != 0)
        return 0;
    const uint64_t sid = (uint64_t)nng_socket_id(c->sock);
    uint64_t due = 0;
    for (nng_stat *p = nng_stat_child(root); p; p = nng_stat_next(p)) {
        if (strcmp(nng_stat_name(p), "pipe") != 0)
            continue;
        nng_stat *sk = nng_stat_find(p, "socket"), *id = nng_stat_find(p, "id");
        nng_stat *tx = nng_stat_find(p, "tx_msgs"), *rx = nng_stat_find(p, "rx_msgs");
        if (!sk || !id || !tx || !rx || nng_stat_value(sk) != sid || nng_stat_value(tx) <= nng_stat_value(rx))
            continue;
        int listed = only == NULL;
        for (int i = 0; !listed && i < nonly; i++)
            listed = (uint64_t)nng_pipe_id(only[i]) == nng_stat_value(id);
        if (listed)
            due += nng_stat_value(tx) - nng_stat_value(rx);
    }
    nng_stats_free(root);
    return due;
}

/*
 * Before connections are closed (all of them: nng_close; some: the keeper),
 * let the replies still on their way to them arrive, for at most ms:
 * libnng 1.5.2 loses a connection's receive when a message is arriving as
 * the connection closes (the read of its body is dropped unstarted), and
 * its reaper then waits for good, in every later close of the process.
 * Replies of aborted calls still come (the server computes them anyway);
 * a request whose connection dropped has none coming, and the wait ends
 * at the bound.
 */
static void await_replies(lnorm_client *c, const nng_pipe *only, int nonly, int ms)
{
    nng_time until = nng_clock() + (nng_time)ms;
    while (replies_due(c, only, nonly) > 0 && nng_clock() < until)
        nng_msleep(1);
}

/*
 * The keeper: a thread of the client that makes every change to its
 * dialers and connections, never from NNG's own threads (libnng 1.5.2 can
 * leave nng_close waiting for good when a connection of the socket was
 * closed from inside one of its aio callbacks). It
 *  - closes the dialer of a URL put on hold (hold_server) and dials it
 *    again once the hold is over;
 *  - replaces the dialer of a URL that has had no connection for
 *    redial_ms: libnng 1.5.2's dialer stops for good when a connect fails
 *    with NNG_ECLOSED, which is what writing the SP header gives when the
 *    server was killed between accepting and reading it (the kernel
 *    releases a killed process's connections before its listening
 *    socket, so an immediate redial can land there), and that URL would
 *    never connect again. A replaced dialer that was only waiting for its
 *    server costs one early connect attempt.
 * Before it closes connections it lets the replies due on them arrive
 * (await_replies). It looks every 100 ms while a URL has no connection or
 * is held, else sleeps until a connection closes or a server is held.
 */
static void held_resume(lnorm__slot *s);

static void keeper(void *arg)
{
    lnorm_client *c = arg;
    nng_mtx_lock(c->mtx);
    for (;;) {
        nng_time now = nng_clock();
        size_t todo[64];
        nng_dialer old[64];
        int redial[64];
        size_t n = 0;
        for (size_t i = 0; i < c->ndials && n < 64; i++) {
            lnorm__dial *d = &c->dials[i];
            int close_now = d->close_now;
            int again = d->held ? now >= d->held_until
                                : d->npipes == 0 && now - d->idle_since >= (nng_time)c->redial_ms;
            if (!close_now && !again)
                continue;
            nng_dialer none = NNG_DIALER_INITIALIZER;
            old[n] = close_now || !d->held ? d->d : none;
            redial[n] = again;
            d->close_now = 0;
            if (again)
                d->held = 0;
            todo[n++] = i;
        }
        /* The connections closed now: those queued, and those of the
         * dialers closed now (close_now). */
        nng_pipe pipes[LNORM__CLOSE_QUEUE + 64];
        int np = c->nclose, nwait = np;
        memcpy(pipes, c->close_pipes, (size_t)np * sizeof pipes[0]);
        c->nclose = 0;
        const int wcap = (int)(sizeof pipes / sizeof pipes[0]);
        for (size_t k = 0; k < n; k++)
            for (int j = 0; nng_dialer_id(old[k]) > 0 && j < c->npipes && nwait < wcap; j++)
                if (c->pipes[j].dial == (int)todo[k])
                    pipes[nwait++] = (nng_pipe){.id = c->pipes[j].id};
        nng_mtx_unlock(c->mtx);
        if (nwait > 0)
            await_replies(c, pipes, nwait, LNORM__PIPE_LINGER_MS);
        for (int k = 0; k < np; k++)
            nng_pipe_close(pipes[k]);
        for (size_t k = 0; k < n; k++) {
            if (nng_dialer_id(old[k]) > 0)
                nng_dialer_close(old[k]);
            if (redial[k])
                dial_one(c, todo[k]); /* (fails only when closing or out of memory) */
        }
        /* Requests answered UNAVAILABLE, now that their server's
         * connections are closed: sent again to another server. */
        nng_mtx_lock(c->mtx);
        lnorm__slot *held = c->held_slots;
        c->held_slots = NULL;
        nng_mtx_unlock(c->mtx);
        for (lnorm__slot *h = held, *next; h; h = next) {
            next = h->next_held;
            held_resume(h);
        }
        nng_mtx_lock(c->mtx);
        if (c->closing && !c->held_slots)
            break;
        if (c->closing || n || np || held)
            continue;
        /* Look again, under the lock, at what may have come since this
         * round looked (a hold, a held request, a closed connection: their
         * wakes found no one waiting), before waiting for the next. */
        int pending = c->held_slots != NULL || c->nclose > 0, idle = 0;
        for (size_t i = 0; i < c->ndials; i++) {
            pending |= c->dials[i].close_now;
            idle |= c->dials[i].held || c->dials[i].npipes == 0;
        }
        if (pending)
            continue;
        if (idle)
            nng_cv_until(c->keeper_cv, nng_clock() + 100);
        else
            nng_cv_wait(c->keeper_cv);
    }
    nng_mtx_unlock(c->mtx);
}

static nng_duration ms_to_dur(int ms)
{
    return ms < 0 ? NNG_DURATION_INFINITE : (nng_duration)ms;
}

/* NNG 1.5 initializes itself on first use with a check of a plain flag
 * before its lock, so two threads opening their first sockets at once
 * race (ThreadSanitizer reports it in libnng, from client.concurrent).
 * The first use goes through pthread_once instead: one socket opened and
 * closed, every later caller ordered after it. */
static pthread_once_t lnorm__nng_once = PTHREAD_ONCE_INIT;

static void lnorm__nng_first_use(void)
{
    nng_socket s;
    if (nng_req0_open(&s) == 0)
        nng_close(s);
}

static char *dup_opt(const char *s, int *oom)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *oom = 1;
    return d;
}

/* Free what lnorm_client_open allocated (the socket is closed already). */
static void client_free(lnorm_client *c)
{
    free(c->pipes);
    for (size_t i = 0; i < c->ndials; i++)
        free(c->dials[i].url);
    free(c->dials);
    free((char *)c->opts.tls_ca_file);
    free((char *)c->opts.tls_cert_key_file);
    free((char *)c->opts.tls_server_name);
    if (c->cv)
        nng_cv_free(c->cv);
    if (c->keeper_cv)
        nng_cv_free(c->keeper_cv);
    if (c->mtx)
        nng_mtx_free(c->mtx);
    free(c);
}

/* The client's own copies of the URLs and TLS strings (they are used
 * again when the dialers are replaced). */
static int client_copy_strings(lnorm_client *c, const char *const *urls, size_t nurls)
{
    int oom = 0;
    c->opts.tls_ca_file = dup_opt(c->opts.tls_ca_file, &oom);
    c->opts.tls_cert_key_file = dup_opt(c->opts.tls_cert_key_file, &oom);
    c->opts.tls_server_name = dup_opt(c->opts.tls_server_name, &oom);
    c->dials = calloc(nurls, sizeof *c->dials);
    if (!c->dials)
        return LNORM_ENOMEM;
    for (; c->ndials < nurls; c->ndials++)
        if (!(c->dials[c->ndials].url = dup_opt(urls[c->ndials], &oom)))
            break;
    return oom ? LNORM_ENOMEM : LNORM_OK;
}

/* Open and set up c's socket: NNG's own REQ resend stays off (liblnorm
 * resends, see try_resend); the pipe events count connections. */
static int client_socket(lnorm_client *c)
{
    const lnorm_client_opts *o = &c->opts;
    int rv;
    if ((rv = nng_req0_open(&c->sock)) != 0)
        return lnorm__from_nng(rv);
    if ((rv = nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, o->max_recv_bytes)) != 0 ||
        (rv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, o->reconnect_min_ms)) != 0 ||
        (rv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, o->reconnect_max_ms)) != 0 ||
        (rv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_ADD_PRE, pipe_cb, c)) != 0 ||
        (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, pipe_cb, c)) != 0) {
        nng_close(c->sock);
        return lnorm__from_nng(rv);
    }
    return LNORM_OK;
}

int lnorm_client_open(lnorm_client **out, const char *const *urls, size_t nurls,
                      const lnorm_client_opts *opts)
{
    if (!out || !urls || nurls == 0)
        return LNORM_EINVAL;
    pthread_once(&lnorm__nng_once, lnorm__nng_first_use);
    *out = NULL;
    for (size_t i = 0; i < nurls; i++)
        if (!urls[i] || !urls[i][0])
            return LNORM_EINVAL;
    lnorm_client_opts o;
    lnorm_client_opts_init(&o);
    if (opts)
        o = *opts;
    if (o.chunk_bytes == 0)
        o.chunk_bytes = LNORM_DEFAULT_CHUNK_BYTES;
    if (o.pipeline_depth <= 0)
        o.pipeline_depth = LNORM_DEFAULT_PIPELINE_DEPTH;
    if (o.max_recv_bytes == 0)
        o.max_recv_bytes = (size_t)1 << 30;
    if (o.reconnect_min_ms <= 0 || o.reconnect_max_ms < 0)
        return LNORM_EINVAL;

    lnorm_client *c = calloc(1, sizeof *c);
    if (!c)
        return LNORM_ENOMEM;
    c->opts = o;
    /* A live dialer tries at least every max(reconnect_min, reconnect_max):
     * twice that without a connection, and at least LNORM__REDIAL_MIN_MS. */
    int every = o.reconnect_max_ms > o.reconnect_min_ms ? o.reconnect_max_ms : o.reconnect_min_ms;
    c->redial_ms = every >= INT32_MAX / 2 ? INT32_MAX
                   : every > LNORM__REDIAL_MIN_MS / 2 ? 2 * every
                                                      : LNORM__REDIAL_MIN_MS;
    c->unavail_ms = c->redial_ms > LNORM__UNAVAIL_MIN_MS ? c->redial_ms : LNORM__UNAVAIL_MIN_MS;
    c->hold_ms = every > LNORM__HOLD_MIN_MS ? every : LNORM__HOLD_MIN_MS;
    c->idle_since = nng_clock();
    int rv = client_copy_strings(c, urls, nurls);
    if (rv == LNORM_OK && ((rv = nng_mtx_alloc(&c->mtx)) != 0 || (rv = nng_cv_alloc(&c->cv, c->mtx)) != 0 ||
                           (rv = nng_cv_alloc(&c->keeper_cv, c->mtx)) != 0))
        rv = lnorm__from_nng(rv);
    if (rv == LNORM_OK)
        rv = client_socket(c);
    if (rv != LNORM_OK) {
        client_free(c);
        return rv;
    }
    if ((rv = lnorm__probe_init(c)) != LNORM_OK) {
        nng_close(c->sock);
        lnorm__probe_fini(c);
        client_free(c);
        return rv;
    }
    for (size_t i = 0; i < nurls; i++) {
        if ((rv = dial_one(c, i)) != LNORM_OK) {
            nng_close(c->sock);
            lnorm__probe_fini(c);
            client_free(c);
            return rv;
        }
    }
    /* A synchronous dial of every URL at once, bounded: a URL where nobody
     * listens is known now, so that a call fails at once instead of after
     * its send timeout (lnorm__no_server); the dialers keep trying. */
    nng_mtx_lock(c->mtx);
    lnorm__probe_start_locked(c);
    while (c->nprobing > 0)
        nng_cv_wait(c->cv);
    nng_mtx_unlock(c->mtx);
    if ((rv = nng_thread_create(&c->keeper, keeper, c)) != 0) {
        nng_close(c->sock);
        lnorm__probe_fini(c);
        client_free(c);
        return lnorm__from_nng(rv);
    }
    *out = c;
    return LNORM_OK;
}

void lnorm_client_close(lnorm_client *c)
{
    if (!c)
        return;
    nng_mtx_lock(c->mtx);
    c->closing = 1;
    nng_cv_wake(c->keeper_cv);
    nng_mtx_unlock(c->mtx);
    if (c->keeper)
        nng_thread_destroy(c->keeper); /* (joins it) */
    /* Every exchange is aborted while the socket is still open, until every
     * call has completed (with LNORM_ECLOSED) through its callback: a
     * callback starts nothing new once closing, except the receive that
     * follows a finished send, which the next round aborts (and with it
     * the request, should it still wait for a connection). Aborting
     * resets each context's request before nng_close runs: libnng 1.5.2
     * can lose a message handed to a connection as it closes. */
    nng_mtx_lock(c->mtx);
    while (c->ncalls > 0) {
        size_t nslots = c->nslots; /* (no slot is made once closing) */
        nng_mtx_unlock(c->mtx);
        for (size_t i = 0; i < nslots; i++)
            nng_aio_cancel(c->all_slots[i]->aio);
        nng_mtx_lock(c->mtx);
        if (c->ncalls > 0)
            nng_cv_until(c->cv, nng_clock() + 5);
    }
    c->gate_shut = 1;
    while (c->in_nng > 0) /* (see gate_enter) */
        nng_cv_wait(c->cv);
    nng_mtx_unlock(c->mtx);
    await_replies(c, NULL, 0, LNORM__CLOSE_LINGER_MS);
    nng_close(c->sock);
    lnorm__probe_fini(c);
    for (size_t i = 0; i < c->nslots; i++) {
        nng_aio_free(c->all_slots[i]->aio);
        free(c->all_slots[i]);
    }
    for (int i = 0; i < c->npool; i++)
        nng_msg_free(c->msg_pool[i]);
    free(c->all_slots);
    /* Regions still registered: the daemon drops them with the connection. */
    lnorm__auto_forget(c);
    lnorm__shm_forget_all(c);
    client_free(c);
}

/* ---- the call engine ------------------------------------------------------ */

static void slot_cb(void *arg);

/* Take a free slot, or make one. Called with c->mtx held. */
static int slot_get(lnorm_client *c, lnorm__slot **out)
{
    if (c->closing)
        return LNORM_ECLOSED;
    lnorm__slot *s = c->free_slots;
    if (s) {
        c->free_slots = s->next_free;
        *out = s;
        return LNORM_OK;
    }
    if (c->nslots == c->cap_slots) {
        size_t cap = c->cap_slots ? c->cap_slots * 2 : 16;
        lnorm__slot **all = realloc(c->all_slots, cap * sizeof *all);
        if (!all)
            return LNORM_ENOMEM;
        c->all_slots = all;
        c->cap_slots = cap;
    }
    s = calloc(1, sizeof *s);
    if (!s)
        return LNORM_ENOMEM;
    s->c = c;
    int rv = nng_aio_alloc(&s->aio, slot_cb, s);
    if (rv != 0) {
        free(s);
        return lnorm__from_nng(rv);
    }
    if ((rv = nng_ctx_open(&s->ctx, c->sock)) != 0) {
        nng_aio_free(s->aio);
        free(s);
        return lnorm__from_nng(rv);
    }
    if ((rv = nng_ctx_set_ms(s->ctx, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0) {
        nng_ctx_close(s->ctx);
        nng_aio_free(s->aio);
        free(s);
        return lnorm__from_nng(rv);
    }
    c->all_slots[c->nslots++] = s;
    *out = s;
    return LNORM_OK;
}

/* The call that lnorm__call_start is starting on this thread, and whether
 * it completed there (every chunk done or failed before start returned):
 * advance_unlock then leaves it to lnorm__call_start instead of running
 * the callback on the caller's thread. */
static _Thread_local lnorm__call *lnorm__starting;
static _Thread_local int lnorm__started_done;

/* Free a completed call and count it out of the client (close waits for
 * the count to reach 0). */
static void call_release(lnorm__call *call)
{
    lnorm_client *c = call->c;
    if (call->cleanup)
        call->cleanup(call);
    free(call);
    nng_mtx_lock(c->mtx);
    c->ncalls--;
    nng_cv_wake(c->cv);
    nng_mtx_unlock(c->mtx);
}

static void call_finish(lnorm__call *call)
{
    call->cb(call->cb_arg, call->res.err, &call->res);
    call_release(call);
}

/* Account for a finished chunk (reply handled, failed, or skipped). Called
 * with c->mtx held; err/why describe a failure. */
static void chunk_account(lnorm__call *call, uint64_t i, int err, int status, const char *why)
{
    call->inflight--;
    call->finished++;
    if (err != LNORM_OK) {
        call->failed = 1;
        if (call->nchunks > 1)
            lnorm__result_fail(&call->res, err, status, "chunk %llu of %llu: %s",
                               (unsigned long long)i + 1, (unsigned long long)call->nchunks, why);
        else
            lnorm__result_fail(&call->res, err, status, "%s", why);
    }
}

static void start_chunk(lnorm__call *call, uint64_t i);

/*
 * Called with c->mtx held; releases it. Claims the chunks that may start now
 * (a contiguous range) or, when nothing is in flight and nothing is left,
 * completes the call. A thread holding claimed, unstarted chunks keeps
 * inflight > 0, so the call cannot complete under it; it must not touch the
 * call after starting its last claimed chunk.
 */
static void advance_unlock(lnorm__call *call)
{
    lnorm_client *c = call->c;
    uint64_t first = 0, n = 0;
    int complete = 0;
    if (!call->failed && call->next < call->nchunks && call->inflight < call->depth) {
        uint64_t room = (uint64_t)(call->depth - call->inflight);
        uint64_t left = call->nchunks - call->next;
        n = room < left ? room : left;
        first = call->next;
        call->next += n;
        call->inflight += (int)n;
    } else if (call->inflight == 0 && !call->completed &&
               (call->failed || call->finished == call->nchunks)) {
        call->completed = 1;
        complete = 1;
    }
    nng_mtx_unlock(c->mtx);
    if (complete && call == lnorm__starting) {
        lnorm__started_done = 1; /* lnorm__call_start owns it now */
        return;
    }
    if (complete) {
        call_finish(call);
        return;
    }
    for (uint64_t k = 0; k < n; k++)
        start_chunk(call, first + k);
}

/* How long the pending send may wait for a connection this time: until
 * its send_by, in steps of at most redial_ms (slot_cb then checks the
 * dialers and sends again). */
static nng_duration send_wait(const lnorm__slot *s)
{
    nng_duration to = s->c->redial_ms;
    nng_mtx_lock(s->c->mtx);
    if (s->c->nlive == 0)
        to = 100; /* no connection: look again soon (lnorm__no_server) */
    nng_mtx_unlock(s->c->mtx);
    if (s->has_send_by) {
        nng_time now = nng_clock();
        nng_time left = s->send_by > now ? s->send_by - now : 0;
        if (left < (nng_time)to)
            to = (nng_duration)left;
    }
    return to;
}

/*
 * Every nng_ctx_send and nng_ctx_recv of the client passes this gate.
 * libnng 1.5.2 lets nng_close free the socket while another thread is
 * still on its way out of nng_ctx_recv: that thread drops the context's
 * last reference after the closer was told the context is gone, then
 * locks the freed socket's mutex (a panic, seen when a reply completes a
 * call on one thread while the receive that found it returns on another).
 * So close shuts the gate (once every call has completed), waits until
 * no thread is inside, and only then closes the socket. A refused thread
 * ends its chunk with LNORM_ECLOSED.
 */
static int gate_enter(lnorm_client *c)
{
    nng_mtx_lock(c->mtx);
    int open = !c->gate_shut;
    if (open)
        c->in_nng++;
    nng_mtx_unlock(c->mtx);
    return open;
}

static void gate_leave(lnorm_client *c)
{
    nng_mtx_lock(c->mtx);
    if (--c->in_nng == 0 && c->gate_shut)
        nng_cv_wake(c->cv);
    nng_mtx_unlock(c->mtx);
}

static void slot_done(lnorm__slot *s, int rv, int err, int status, char *why, size_t whylen);

/* The slot's chunk ends because the client is closing (gate refused). */
static void slot_closed(lnorm__slot *s)
{
    char why[200];
    snprintf(why, sizeof why, "client closed");
    slot_done(s, NNG_ECLOSED, LNORM_ECLOSED, -1, why, sizeof why);
}

/* Send message m of the slot's chunk, waiting at most send_to (< 0:
 * without end) for a connection. */
static void slot_send(lnorm__slot *s, nng_msg *m, nng_duration send_to)
{
    s->has_send_by = send_to >= 0;
    if (s->has_send_by)
        s->send_by = nng_clock() + (nng_time)send_to;
    s->sending = 1;
    if (!gate_enter(s->c)) {
        nng_msg_free(m);
        slot_closed(s);
        return;
    }
    lnorm_client *c = s->c; /* (s may be reused once the send is under way) */
    nng_aio_set_msg(s->aio, m);
    nng_aio_set_timeout(s->aio, send_wait(s));
    nng_ctx_send(s->ctx, s->aio);
    gate_leave(c);
}

static void start_chunk(lnorm__call *call, uint64_t i)
{
    lnorm_client *c = call->c;
    nng_msg *m = NULL;
    nng_mtx_lock(c->mtx);
    int skip = call->failed;
    nng_mtx_unlock(c->mtx);
    uint64_t id = skip ? 0 : lnorm__next_id(c);
    int rv = skip ? LNORM_ECANCELED : call->ops->make(call, i, id, &m);
    if (rv != LNORM_OK) {
        nng_mtx_lock(c->mtx);
        chunk_account(call, i, rv, -1, "could not build the request");
        advance_unlock(call);
        return;
    }
    char why[200];
    if (lnorm__no_server(c, why, sizeof why)) {
        nng_msg_free(m);
        nng_mtx_lock(c->mtx);
        chunk_account(call, i, LNORM_EUNAVAIL, -1, why);
        advance_unlock(call);
        return;
    }
    lnorm__slot *s = NULL;
    nng_mtx_lock(c->mtx);
    rv = slot_get(c, &s);
    if (rv != LNORM_OK) {
        chunk_account(call, i, rv, -1, rv == LNORM_ECLOSED ? "client closed" : "no context");
        nng_msg_free(m);
        advance_unlock(call);
        return;
    }
    nng_mtx_unlock(c->mtx);
    s->call = call;
    s->chunk = i;
    s->id = id;
    s->resends = 0;
    s->timer_resends = 0;
    s->sent = 0;
    s->has_deadline = 0;
    slot_send(s, m, ms_to_dur(c->opts.send_timeout_ms));
}

static void handle_reply(lnorm__call *call, uint64_t i, uint64_t id, nng_msg *m, int *err, int *status,
                         char *why, size_t whylen)
{
    lnorm__resp_view v;
    if (lnorm__resp_parse(nng_msg_body(m), nng_msg_len(m), &v) != LNORM_OK) {
        *err = LNORM_EPROTO;
        snprintf(why, whylen, "malformed reply (%zu bytes)", nng_msg_len(m));
        return;
    }
    /* The reply must be this request's (the server echoes request_id); an
     * error reply may carry 0, for a request the server could not read. */
    if (v.request_id != id && !(v.code != 0 && v.request_id == 0)) {
        *err = LNORM_EPROTO;
        snprintf(why, whylen, "reply for request %llu, expected %llu", (unsigned long long)v.request_id,
                 (unsigned long long)id);
        return;
    }
    nng_mtx_lock(call->c->mtx);
    call->res.queue_us += v.queue_us;
    call->res.compute_us += v.compute_us;
    call->res.batch_rows = v.batch_rows;
    call->res.batch_requests = v.batch_requests;
    nng_mtx_unlock(call->c->mtx);
    if (v.code != 0) {
        *err = lnorm_status_to_err(v.code);
        *status = v.code;
        if (v.message.n > 0)
            snprintf(why, whylen, "%.*s", (int)(v.message.n < 1024 ? v.message.n : 1024),
                     (const char *)v.message.p);
        else
            snprintf(why, whylen, "%s", lnorm_strerror(*err));
    } else {
        *err = call->ops->take(call, i, &v);
        if (*err != LNORM_OK)
            snprintf(why, whylen, "unexpected reply: %s", lnorm_strerror(*err));
    }
}

/* Whether an exchange failed because the connection carrying it dropped
 * (with NNG's REQ resend off, a context's receive fails with ECONNRESET
 * when its pipe closes). ECLOSED also comes from our own close: the
 * caller checks c->closing. */
static int conn_dropped(int rv)
{
    return rv == NNG_ECONNRESET || rv == NNG_ECONNSHUT || rv == NNG_ECONNABORTED ||
           rv == NNG_ECLOSED;
}

/* Milliseconds left before the slot's deadline (0: expired). */
static nng_duration time_left(const lnorm__slot *s)
{
    nng_time now = nng_clock();
    if (now >= s->deadline)
        return 0;
    uint64_t left = s->deadline - now;
    return left > INT32_MAX ? INT32_MAX : (nng_duration)left;
}

/* How long the receive of a sent request may wait: until the reply
 * deadline, and no longer than resend_ms when it is > 0 (the receive then
 * times out and try_resend sends the request again). */
static nng_duration recv_wait(const lnorm__slot *s)
{
    nng_duration to = s->call->recv_timeout;
    if (s->has_deadline) {
        to = time_left(s);
        if (to < 1)
            to = 1;
    }
    int every = s->c->opts.resend_ms;
    if (every > 0 && (to < 0 || to > every))
        to = every;
    return to;
}

/* Whether the exchange that failed with rv may be resent, and counts it:
 * after its connection dropped (at most LNORM__MAX_RESENDS times), or
 * when its receive timed out after resend_ms (as often as the reply
 * deadline allows; only a receive, never a send that found no
 * connection). */
static int resend_allowed(lnorm__slot *s, int rv)
{
    if (conn_dropped(rv)) {
        if (s->resends >= LNORM__MAX_RESENDS)
            return 0;
        s->resends++;
        return 1;
    }
    if (rv == NNG_ETIMEDOUT && !s->sending && s->c->opts.resend_ms > 0 &&
        (!s->has_deadline || time_left(s) > 0)) {
        s->timer_resends++;
        return 1;
    }
    return 0;
}

/*
 * After the exchange of the slot's chunk failed with rv: if resend_allowed,
 * the client is not closing, the call has not failed and the reply timeout
 * (counted from the first send) has not expired, send the same request
 * (same request id) again on the same context: req0 drops the old
 * exchange, so a late reply to it is discarded; NNG dials again by itself
 * and the send waits for a connection. Returns 1 when the request was
 * resent: the slot's callback will run again and the caller must not touch
 * the slot; 0 otherwise. The aio holds no message here.
 */
static int try_resend(lnorm__slot *s, int rv)
{
    lnorm_client *c = s->c;
    lnorm__call *call = s->call;
    nng_mtx_lock(c->mtx);
    int stop = c->closing || call->failed;
    nng_mtx_unlock(c->mtx);
    if (stop || !resend_allowed(s, rv))
        return 0;
    nng_duration send_to = ms_to_dur(c->opts.send_timeout_ms);
    if (s->has_deadline) {
        nng_duration left = time_left(s);
        if (left <= 0)
            return 0;
        if (send_to < 0 || send_to > left)
            send_to = left;
    }
    nng_msg *m = NULL;
    if (call->ops->make(call, s->chunk, s->id, &m) != LNORM_OK)
        return 0;
    slot_send(s, m, send_to);
    return 1;
}

/* The send of the slot timed out with time left before its send_by: no
 * connection came up for a while. Replace stuck dialers and send the same
 * message (NNG hands it back on a timeout) again. Returns 1 when sent. */
static int send_again(lnorm__slot *s)
{
    lnorm_client *c = s->c;
    nng_mtx_lock(c->mtx);
    int stop = c->closing || s->call->failed;
    nng_mtx_unlock(c->mtx);
    nng_msg *m = nng_aio_get_msg(s->aio);
    if (stop || !m || (s->has_send_by && nng_clock() >= s->send_by) || !gate_enter(c))
        return 0;
    nng_aio_set_timeout(s->aio, send_wait(s));
    nng_ctx_send(s->ctx, s->aio);
    gate_leave(c);
    return 1;
}

/* The request of the slot is sent: wait for its reply. The reply timeout
 * runs from the first send, resends included. */
static void slot_sent(lnorm__slot *s)
{
    s->sending = 0;
    if (!s->sent) {
        s->sent = 1;
        s->has_deadline = s->call->recv_timeout >= 0;
        if (s->has_deadline)
            s->deadline = nng_clock() + (nng_time)s->call->recv_timeout;
    }
    lnorm_client *c = s->c;
    if (!gate_enter(c)) {
        slot_closed(s);
        return;
    }
    nng_aio_set_timeout(s->aio, recv_wait(s));
    nng_ctx_recv(s->ctx, s->aio);
    gate_leave(c);
}

/* Give the slot back and account for its chunk; err/status/why describe
 * how the exchange ended (rv: NNG's result). */
static void slot_done(lnorm__slot *s, int rv, int err, int status, char *why, size_t whylen)
{
    lnorm_client *c = s->c;
    lnorm__call *call = s->call;
    int resends = s->resends + s->timer_resends;
    if (rv != 0 && resends > 0) {
        size_t n = strlen(why);
        snprintf(why + n, whylen - n, " (after %d resend%s)", resends, resends == 1 ? "" : "s");
    }
    nng_mtx_lock(c->mtx);
    if (rv != 0 && c->closing) {
        err = LNORM_ECLOSED;
        snprintf(why, whylen, "client closed (%s)", nng_strerror(rv));
    }
    s->call = NULL;
    s->next_free = c->free_slots;
    c->free_slots = s;
    chunk_account(call, s->chunk, err, status, why);
    advance_unlock(call);
}

/*
 * A reply UNAVAILABLE (a draining lnormd: the request was not started):
 * close the connection it came on, so that nothing new goes to that
 * server (a draining lnormd accepts no new connection; the dialer
 * connects again once one serves there), and send the request again on
 * another connection when there is one, within the resend bound and the
 * reply timeout. Returns 1 when resent (m is then consumed).
 */
static int unavailable_resend(lnorm__slot *s, nng_msg *m)
{
    lnorm__resp_view v;
    if (lnorm__resp_parse(nng_msg_body(m), nng_msg_len(m), &v) != LNORM_OK ||
        v.code != LNORM__V1__CODE__UNAVAILABLE || (v.request_id != s->id && v.request_id != 0))
        return 0;
    if (hold_server(s->c, nng_msg_get_pipe(m)) == 0)
        return 0; /* no other server: the caller gets the reply's status */
    lnorm_client *c = s->c;
    nng_mtx_lock(c->mtx);
    int closing = c->closing; /* (the keeper may be gone) */
    if (!closing) {
        s->held_reply = m; /* the keeper resends it once that server's connections are closed */
        s->next_held = c->held_slots;
        c->held_slots = s;
        nng_cv_wake(c->keeper_cv);
    }
    nng_mtx_unlock(c->mtx);
    return !closing;
}

/* The reply m of the slot's chunk: handled, and the slot given back. */
static void slot_reply(lnorm__slot *s, nng_msg *m)
{
    int err = LNORM_OK, status = -1;
    char why[200];
    why[0] = 0;
    handle_reply(s->call, s->chunk, s->id, m, &err, &status, why, sizeof why);
    lnorm__msg_put(s->c, m);
    slot_done(s, 0, err, status, why, sizeof why);
}

/* On the keeper: a request answered UNAVAILABLE, sent again (to another
 * server: that one's connections are closed), or ended with the reply. */
static void held_resume(lnorm__slot *s)
{
    nng_msg *m = s->held_reply;
    s->held_reply = NULL;
    if (try_resend(s, NNG_ECONNSHUT)) {
        lnorm__msg_put(s->c, m);
        return;
    }
    slot_reply(s, m);
}

static void slot_cb(void *arg)
{
    lnorm__slot *s = arg;
    int rv = nng_aio_result(s->aio);
    int err = LNORM_OK, status = -1;
    char why[200];
    why[0] = 0;
    if (s->sending && rv == 0) {
        slot_sent(s);
        return;
    }
    if (rv != 0) {
        if (s->sending && rv == NNG_ETIMEDOUT && lnorm__no_server(s->c, why, sizeof why)) {
            nng_msg_free(nng_aio_get_msg(s->aio));
            nng_aio_set_msg(s->aio, NULL);
            slot_done(s, 0, LNORM_EUNAVAIL, -1, why, sizeof why);
            return;
        }
        if (s->sending && rv == NNG_ETIMEDOUT && send_again(s))
            return;
        if (s->sending) {
            nng_msg_free(nng_aio_get_msg(s->aio));
            nng_aio_set_msg(s->aio, NULL);
        }
        if (try_resend(s, rv))
            return;
        err = lnorm__from_nng(rv);
        if (s->sending)
            snprintf(why, sizeof why, "send failed: %s", nng_strerror(rv));
        else
            snprintf(why, sizeof why, "%s",
                     rv == NNG_ETIMEDOUT ? "no reply before the timeout" : nng_strerror(rv));
    } else {
        nng_msg *m = nng_aio_get_msg(s->aio);
        nng_aio_set_msg(s->aio, NULL);
        if (!unavailable_resend(s, m))
            slot_reply(s, m);
        return;
    }
    slot_done(s, rv, err, status, why, sizeof why);
}

int lnorm__call_new(lnorm_client *c, const lnorm__call_ops *ops, lnorm__call **out)
{
    lnorm__call *call = calloc(1, sizeof *call);
    if (!call)
        return LNORM_ENOMEM;
    call->c = c;
    call->ops = ops;
    call->nchunks = 1;
    call->depth = 1;
    call->recv_timeout = ms_to_dur(c->opts.recv_timeout_ms);
    if (c->opts.send_deadline && c->opts.recv_timeout_ms > 0)
        call->deadline_us = (uint64_t)c->opts.recv_timeout_ms * 1000u;
    *out = call;
    return LNORM_OK;
}

int lnorm__call_start(lnorm__call *call, lnorm_result *res)
{
    lnorm_client *c = call->c;
    nng_mtx_lock(c->mtx);
    if (c->closing) {
        nng_mtx_unlock(c->mtx);
        if (call->cleanup)
            call->cleanup(call);
        free(call);
        if (res) {
            memset(res, 0, sizeof *res);
            lnorm__result_fail(res, LNORM_ECLOSED, -1, "client closed");
        }
        return LNORM_ECLOSED;
    }
    c->ncalls++;
    call->res.chunks = (uint32_t)(call->nchunks > UINT32_MAX ? UINT32_MAX : call->nchunks);
    lnorm__call *outer = lnorm__starting; /* (a callback that starts a call) */
    int outer_done = lnorm__started_done;
    lnorm__starting = call;
    lnorm__started_done = 0;
    advance_unlock(call);
    int done = lnorm__started_done;
    lnorm__starting = outer;
    lnorm__started_done = outer_done;
    if (!done)
        return LNORM_OK; /* (the call may be finished and freed by now) */
    /* It completed on this thread: only a chunk that could not be built or
     * given a context does that (replies are handled on NNG threads), so
     * it failed. It was not started: no callback, the error returned. */
    int err = call->res.err != LNORM_OK ? call->res.err : LNORM_EINTERNAL;
    if (res)
        *res = call->res;
    call_release(call);
    return err;
}

typedef struct sync_wait {
    nng_mtx *mtx;
    nng_cv *cv;
    int done;
    lnorm_result res;
} sync_wait;

static void sync_cb(void *arg, int err, const lnorm_result *res)
{
    sync_wait *w = arg;
    (void)err;
    nng_mtx_lock(w->mtx);
    w->res = *res;
    w->done = 1;
    nng_cv_wake(w->cv);
    nng_mtx_unlock(w->mtx);
}

int lnorm__call_sync(lnorm__call *call, lnorm_result *res)
{
    sync_wait w;
    memset(&w, 0, sizeof w);
    int rv;
    if ((rv = nng_mtx_alloc(&w.mtx)) != 0 || (rv = nng_cv_alloc(&w.cv, w.mtx)) != 0) {
        if (w.mtx)
            nng_mtx_free(w.mtx);
        if (call->cleanup)
            call->cleanup(call);
        free(call);
        rv = lnorm__from_nng(rv);
        if (res) {
            memset(res, 0, sizeof *res);
            lnorm__result_fail(res, rv, -1, "out of memory");
        }
        return rv;
    }
    call->cb = sync_cb;
    call->cb_arg = &w;
    rv = lnorm__call_start(call, &w.res);
    if (rv == LNORM_OK) {
        nng_mtx_lock(w.mtx);
        while (!w.done)
            nng_cv_wait(w.cv);
        nng_mtx_unlock(w.mtx);
        rv = w.res.err;
    }
    nng_cv_free(w.cv);
    nng_mtx_free(w.mtx);
    if (res)
        *res = w.res;
    return rv;
}
