/* NNG rep0 socket + context pool; listeners on tcp://, ipc://, tls+tcp://. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/tls/tls.h>

#include "conns.h"
#include "log.h"
#include "lnorm/errors.h"
#include "stats.h"
#include "transport.h"

enum { SLOT_RECV, SLOT_BUSY, SLOT_SEND };

typedef struct lnorm__slot {
    nng_ctx ctx;
    nng_aio *aio;
    lnorm__transport *tp;
    int state;
    nng_pipe pipe; /* the connection the request in hand came on */
} lnorm__slot;

struct lnorm__transport {
    nng_socket sock;
    int sock_open;
    nng_listener ls[LNORM__MAX_LISTEN];
    char urls[LNORM__MAX_LISTEN][LNORM__STR_MAX + 16];
    int nls;
    nng_tls_config *tls;
    lnorm__conns *conns; /* connection limits, frame watchdog */
    lnorm__slot *slots;
    int nslots;
    lnorm__on_msg_fn on_msg;
    void *arg;
    atomic_int draining;
    atomic_int closing;
    atomic_int busy;
    atomic_int in_nng; /* threads inside nng_ctx_send/recv (lnorm__gate_enter) */
    atomic_uint_fast64_t last_recv_ns;
    nng_duration send_timeout_ms;
    void (*on_close)(void *arg, uint32_t pipe);
    void *on_close_arg;
    atomic_uint_fast64_t last_drop_log_ns;
    /* Replies handed to NNG, per live pipe (under pmu; an entry from the
     * pipe's ADD_POST to its REM_POST event): the drain compares them with
     * what each pipe has written (lnorm__transport_in_transit). */
    pthread_mutex_t pmu;
    struct lnorm__pipe_rec {
        uint32_t id;
        uint64_t handed;
    } *pipes;
    size_t npipes, cap_pipes;
    /* The ipc listener keeper (lnorm__keeper). */
    pthread_t keeper;
    int keeper_on;
    pthread_mutex_t kmu;
    pthread_cond_t kcv;
    int kstop;
    int64_t other[LNORM__MAX_LISTEN]; /* each listener's "other" error count, as last seen */
    atomic_uint_fast64_t arrived[LNORM__MAX_LISTEN]; /* connections each listener handed over (ADD_PRE) */
    lnorm__stats *st;
};

/* One more reply handed to NNG on pipe p. Only live pipes have an entry:
 * rep0 completes a send to a pipe that is gone as if it had gone out, and
 * that one is not counted (nor kept). */
static void lnorm__pipe_handed(lnorm__transport *tp, nng_pipe p)
{
    uint32_t id = (uint32_t)nng_pipe_id(p);
    pthread_mutex_lock(&tp->pmu);
    for (size_t i = 0; i < tp->npipes; i++)
        if (tp->pipes[i].id == id) {
            tp->pipes[i].handed++;
            break;
        }
    pthread_mutex_unlock(&tp->pmu);
}

/* A reply that cannot go (a send that timed out or failed, or none could be
 * made): rep0 forgets the request, so its client would wait on a live
 * connection until its own timeout. Close that connection instead: the
 * client sees it drop (liblnorm resends). Logged at most once a second. */
static void lnorm__reply_lost(lnorm__transport *tp, nng_pipe p, const char *why)
{
    if (nng_pipe_id(p) > 0)
        lnorm__conns_close(tp->conns, (uint32_t)nng_pipe_id(p));
    uint64_t now = lnorm__now_ns(), last = atomic_load(&tp->last_drop_log_ns);
    if (now - last >= 1000000000ull && atomic_compare_exchange_strong(&tp->last_drop_log_ns, &last, now))
        LOG_WARN("reply not sent (%s): its connection closed", why);
}

/*
 * Every nng_ctx_send and nng_ctx_recv passes this gate: libnng 1.5.2 lets
 * nng_close free the socket while another thread is still on its way out
 * of an nng_ctx_ call (it drops the context's last reference after the
 * closer was told the context is gone, then locks the freed socket's
 * mutex). Once closing, no thread enters; close waits until none is
 * inside. (Sequentially consistent: the entering thread counts itself
 * before it reads closing, close sets closing before it reads the count.)
 */
static int lnorm__gate_enter(lnorm__transport *tp)
{
    atomic_fetch_add(&tp->in_nng, 1);
    if (!atomic_load(&tp->closing))
        return 1;
    atomic_fetch_sub(&tp->in_nng, 1);
    return 0;
}

static void lnorm__slot_recv(lnorm__slot *s)
{
    lnorm__transport *tp = s->tp;
    s->state = SLOT_RECV;
    if (!lnorm__gate_enter(tp))
        return; /* (closing: no more requests) */
    nng_aio_set_timeout(s->aio, NNG_DURATION_INFINITE);
    nng_ctx_recv(s->ctx, s->aio);
    atomic_fetch_sub(&tp->in_nng, 1);
}

static void lnorm__slot_cb(void *arg)
{
    lnorm__slot *s = arg;
    lnorm__transport *tp = s->tp;
    int rv = nng_aio_result(s->aio);
    if (s->state == SLOT_SEND) {
        if (rv != 0) {
            nng_msg *m = nng_aio_get_msg(s->aio);
            if (m)
                nng_msg_free(m);
            nng_aio_set_msg(s->aio, NULL);
            if (rv != NNG_ECLOSED)
                lnorm__reply_lost(tp, s->pipe, nng_strerror(rv));
        } else {
            lnorm__pipe_handed(tp, s->pipe);
        }
        /* While draining, a context that has replied receives no more. */
        if (!atomic_load(&tp->closing) && !atomic_load(&tp->draining) && rv != NNG_ECLOSED)
            lnorm__slot_recv(s);
        atomic_fetch_sub(&tp->busy, 1);
        return;
    }
    if (rv != 0) {
        if (rv == NNG_ECLOSED || atomic_load(&tp->closing))
            return;
        LOG_WARN("receive failed: %s", nng_strerror(rv));
        lnorm__slot_recv(s);
        return;
    }
    nng_msg *m = nng_aio_get_msg(s->aio);
    nng_aio_set_msg(s->aio, NULL);
    s->pipe = nng_msg_get_pipe(m);
    s->state = SLOT_BUSY;
    atomic_fetch_add(&tp->busy, 1);
    atomic_store(&tp->last_recv_ns, lnorm__now_ns());
    tp->on_msg(tp->arg, s, m);
}

void lnorm__transport_reply(void *slot, nng_msg *msg)
{
    lnorm__slot *s = slot;
    if (!msg) {
        lnorm__reply_lost(s->tp, s->pipe, "out of memory");
        if (!atomic_load(&s->tp->draining) && !atomic_load(&s->tp->closing))
            lnorm__slot_recv(s);
        atomic_fetch_sub(&s->tp->busy, 1);
        return;
    }
    lnorm__transport *tp = s->tp;
    if (!lnorm__gate_enter(tp)) { /* closing: the reply cannot go out any more */
        nng_msg_free(msg);
        s->state = SLOT_RECV;
        atomic_fetch_sub(&tp->busy, 1);
        return;
    }
    s->state = SLOT_SEND;
    /* A peer that does not read cannot hold a context forever. */
    nng_aio_set_timeout(s->aio, tp->send_timeout_ms);
    nng_aio_set_msg(s->aio, msg);
    nng_ctx_send(s->ctx, s->aio);
    atomic_fetch_sub(&tp->in_nng, 1);
}

void lnorm__transport_peer(void *slot, lnorm__peer *out)
{
    lnorm__slot *s = slot;
    uint64_t pid = 0, uid = 0;
    memset(out, 0, sizeof *out);
    out->pipe = (uint32_t)(nng_pipe_id(s->pipe) > 0 ? nng_pipe_id(s->pipe) : 0);
    if (out->pipe && nng_pipe_get_uint64(s->pipe, NNG_OPT_IPC_PEER_PID, &pid) == 0 &&
        nng_pipe_get_uint64(s->pipe, NNG_OPT_IPC_PEER_UID, &uid) == 0) {
        out->local = 1;
        out->pid = (int64_t)pid;
        out->uid = uid;
    }
}

void lnorm__transport_on_close(lnorm__transport *tp, void (*fn)(void *arg, uint32_t pipe), void *arg)
{
    tp->on_close_arg = arg;
    tp->on_close = fn;
}

static void lnorm__pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    lnorm__transport *tp = arg;
    if (ev == NNG_PIPE_EV_ADD_PRE) {
        uint32_t lid = (uint32_t)nng_listener_id(nng_pipe_listener(p));
        for (int i = 0; i < tp->nls; i++)
            if ((uint32_t)nng_listener_id(tp->ls[i]) == lid)
                atomic_fetch_add(&tp->arrived[i], 1);
        /* Closed here, a pipe is never used: NNG has not begun to read it. */
        if (atomic_load(&tp->draining) || !lnorm__conns_admit(tp->conns, p))
            nng_pipe_close(p);
        return;
    }
    uint32_t id = (uint32_t)nng_pipe_id(p);
    if (ev == NNG_PIPE_EV_ADD_POST) {
        /* (A failed allocation leaves the pipe untracked: the drain then
         * cannot wait for its replies, as before it could.) */
        pthread_mutex_lock(&tp->pmu);
        if (tp->npipes == tp->cap_pipes) {
            size_t cap = tp->cap_pipes ? 2 * tp->cap_pipes : 64;
            void *np = realloc(tp->pipes, cap * sizeof *tp->pipes);
            if (np) {
                tp->pipes = np;
                tp->cap_pipes = cap;
            }
        }
        if (tp->npipes < tp->cap_pipes) {
            tp->pipes[tp->npipes].id = id;
            tp->pipes[tp->npipes].handed = 0;
            tp->npipes++;
        }
        pthread_mutex_unlock(&tp->pmu);
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        lnorm__conns_removed(tp->conns, p);
        if (tp->on_close)
            tp->on_close(tp->on_close_arg, id);
        pthread_mutex_lock(&tp->pmu);
        for (size_t i = 0; i < tp->npipes; i++)
            if (tp->pipes[i].id == id) {
                tp->pipes[i] = tp->pipes[--tp->npipes];
                break;
            }
        pthread_mutex_unlock(&tp->pmu);
    }
}

static char *lnorm__read_file(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4097 > cap) {
            cap = cap * 2 + 8192;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                snprintf(err, errlen, "%s: out of memory", path);
                return NULL;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, 4096, f);
        len += n;
        if (n < 4096)
            break;
    }
    fclose(f);
    buf[len] = 0;
    return buf;
}

static int lnorm__tls_setup(lnorm__transport *tp, const lnorm__config *cfg, char *err, size_t errlen)
{
    int rv = nng_tls_config_alloc(&tp->tls, NNG_TLS_MODE_SERVER);
    if (rv != 0) {
        snprintf(err, errlen, "tls: %s", nng_strerror(rv));
        return LNORM_ETRANSPORT;
    }
    char *cert = lnorm__read_file(cfg->tls_cert, err, errlen);
    if (!cert)
        return LNORM_EINVAL;
    char *key = lnorm__read_file(cfg->tls_key, err, errlen);
    if (!key) {
        free(cert);
        return LNORM_EINVAL;
    }
    rv = nng_tls_config_own_cert(tp->tls, cert, key, NULL);
    memset(key, 0, strlen(key));
    free(key);
    free(cert);
    if (rv != 0) {
        snprintf(err, errlen, "tls-cert/tls-key: %s", nng_strerror(rv));
        return LNORM_EINVAL;
    }
    if (cfg->tls_ca[0] && (rv = nng_tls_config_ca_file(tp->tls, cfg->tls_ca)) != 0) {
        snprintf(err, errlen, "tls-ca %s: %s", cfg->tls_ca, nng_strerror(rv));
        return LNORM_EINVAL;
    }
    rv = nng_tls_config_auth_mode(tp->tls, cfg->tls_verify_peer ? NNG_TLS_AUTH_MODE_REQUIRED : NNG_TLS_AUTH_MODE_NONE);
    if (rv != 0) {
        snprintf(err, errlen, "tls auth mode: %s", nng_strerror(rv));
        return LNORM_EINVAL;
    }
    return LNORM_OK;
}

/* A started listener on url (ipc: socket mode 0660; tls: the config). */
static int lnorm__listener_open(lnorm__transport *tp, const char *url, nng_listener *out, char *err, size_t errlen)
{
    nng_listener l;
    int rv = nng_listener_create(&l, tp->sock, url);
    if (rv != 0) {
        snprintf(err, errlen, "listen %s: %s", url, nng_strerror(rv));
        return rv == NNG_EADDRINVAL || rv == NNG_ENOTSUP || rv == NNG_EINVAL ? LNORM_EINVAL : LNORM_ETRANSPORT;
    }
    int is_ipc = !strncmp(url, "ipc://", 6), is_tls = !strncmp(url, "tls+tcp://", 10);
    if (is_ipc && (rv = nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, 0660)) != 0)
        LOG_WARN("listen %s: cannot set permissions: %s", url, nng_strerror(rv));
    if (is_tls && (rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, tp->tls)) != 0) {
        snprintf(err, errlen, "listen %s: tls: %s", url, nng_strerror(rv));
        nng_listener_close(l);
        return LNORM_ETRANSPORT;
    }
    if ((rv = nng_listener_start(l, 0)) != 0) {
        snprintf(err, errlen, "listen %s: %s", url, nng_strerror(rv));
        nng_listener_close(l);
        return LNORM_ETRANSPORT;
    }
    *out = l;
    return LNORM_OK;
}

static int lnorm__listen(lnorm__transport *tp, const char *url, char *err, size_t errlen)
{
    nng_listener l;
    int rc = lnorm__listener_open(tp, url, &l, err, errlen);
    if (rc != LNORM_OK)
        return rc;
    int is_ipc = !strncmp(url, "ipc://", 6);
    char *real = tp->urls[tp->nls];
    snprintf(real, sizeof tp->urls[0], "%s", url);
    if (!is_ipc) {
        int port = 0;
        nng_url *u = NULL;
        if (nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port) == 0 && nng_url_parse(&u, url) == 0) {
            const char *host = u->u_hostname && u->u_hostname[0] ? u->u_hostname : "0.0.0.0";
            if (strchr(host, ':'))
                snprintf(real, sizeof tp->urls[0], "%s://[%s]:%d", u->u_scheme, host, port);
            else
                snprintf(real, sizeof tp->urls[0], "%s://%s:%d", u->u_scheme, host, port);
        }
        if (u)
            nng_url_free(u);
    }
    tp->other[tp->nls] = 0; /* a new listener's count starts at 0 */
    tp->ls[tp->nls++] = l;
    LOG_INFO("listening on %s", real);
    return LNORM_OK;
}

/* NNG 1.5.2's ipc transport hands the error of a connection that closes
 * during its SP handshake to the listener's pending accept, as NNG_ECLOSED,
 * and the socket core takes that for the listener closing: it never
 * accepts again (one connect() and close() on the socket path is enough).
 * The keeper reads each ipc listener's "other" error count (where ECLOSED
 * is counted, beside errors after which the listener goes on) every
 * 200 ms; when it rose, the keeper connects as a REQ peer: a listener
 * whose connection does not reach the socket (its pipe event) within
 * 500 ms has stopped (the transport still does the handshake, the core no
 * longer takes the connection), and is replaced: the new one binds the
 * same path. The old one's connections close with
 * it (liblnorm resends their requests); nothing else can restart its
 * accepts. */
#define LNORM__KEEPER_NS 200000000ull
#define LNORM__PROBE_MS 500

/* Whether ipc listener i hands a REQ peer's connection to the socket
 * within LNORM__PROBE_MS (1), or not (0). The probe completes the SP
 * handshake before it closes, so it cannot stop the listener itself. */
static int lnorm__ipc_alive(lnorm__transport *tp, int i)
{
    const char *url = tp->urls[i];
    const uint64_t before = atomic_load(&tp->arrived[i]);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (snprintf(a.sun_path, sizeof a.sun_path, "%s", url + 6) >= (int)sizeof a.sun_path)
        return 1; /* not a path we can probe: assume alive */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 1;
    static const unsigned char req_hdr[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0}; /* REQ (48) */
    unsigned char got[8];
    size_t n = 0;
    int alive = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && send(fd, req_hdr, sizeof req_hdr, MSG_NOSIGNAL) == 8) {
        uint64_t end = lnorm__now_ns() + (uint64_t)LNORM__PROBE_MS * 1000000ull;
        while (n < sizeof got) {
            uint64_t now = lnorm__now_ns();
            if (now >= end)
                break;
            struct pollfd pfd = {fd, POLLIN, 0};
            if (poll(&pfd, 1, (int)((end - now) / 1000000ull) + 1) <= 0)
                break;
            ssize_t r = recv(fd, got + n, sizeof got - n, 0);
            if (r <= 0)
                break;
            n += (size_t)r;
        }
        while (n == sizeof got && atomic_load(&tp->arrived[i]) == before && lnorm__now_ns() < end) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
        alive = atomic_load(&tp->arrived[i]) != before;
    }
    close(fd);
    return alive;
}

static int64_t lnorm__listener_other(nng_stat *root, int id)
{
    for (nng_stat *c = nng_stat_child(root); c; c = nng_stat_next(c)) {
        if (strcmp(nng_stat_name(c), "listener") != 0)
            continue;
        nng_stat *sid = nng_stat_find(c, "id"), *other = nng_stat_find(c, "other");
        if (sid && other && nng_stat_value(sid) == (uint64_t)id)
            return (int64_t)nng_stat_value(other);
    }
    return -1;
}

static void lnorm__keeper_tick(lnorm__transport *tp)
{
    nng_stat *root;
    if (nng_stats_get(&root) != 0)
        return;
    for (int i = 0; i < tp->nls; i++) {
        if (strncmp(tp->urls[i], "ipc://", 6) != 0)
            continue;
        int64_t v = lnorm__listener_other(root, nng_listener_id(tp->ls[i]));
        if (v < 0)
            continue;
        if (v <= tp->other[i] || atomic_load(&tp->draining) || atomic_load(&tp->closing) ||
            lnorm__ipc_alive(tp, i)) {
            tp->other[i] = v;
            continue;
        }
        char err[256];
        nng_listener l;
        nng_listener_close(tp->ls[i]);
        if (lnorm__listener_open(tp, tp->urls[i], &l, err, sizeof err) != LNORM_OK) {
            LOG_ERROR("%s stopped accepting and could not be listened on again: %s (next try in 200 ms)",
                      tp->urls[i], err);
            continue; /* the count stays: tried again next tick */
        }
        tp->ls[i] = l;
        tp->other[i] = 0;
        if (tp->st)
            atomic_fetch_add(&tp->st->ipc_relistens, 1);
        LOG_WARN("%s stopped accepting (a peer closed its connection during the handshake, which stops NNG "
                 "1.5's ipc listener): listening again; its open connections were closed",
                 tp->urls[i]);
    }
    nng_stats_free(root);
}

static void *lnorm__keeper(void *arg)
{
    lnorm__transport *tp = arg;
    pthread_mutex_lock(&tp->kmu);
    while (!tp->kstop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + LNORM__KEEPER_NS;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&tp->kcv, &tp->kmu, &ts);
        if (tp->kstop)
            break;
        pthread_mutex_unlock(&tp->kmu);
        lnorm__keeper_tick(tp);
        pthread_mutex_lock(&tp->kmu);
    }
    pthread_mutex_unlock(&tp->kmu);
    return NULL;
}


int lnorm__transport_create(lnorm__transport **out, const lnorm__config *cfg, lnorm__stats *st, lnorm__on_msg_fn fn,
                            void *arg, char *err, size_t errlen)
{
    lnorm__transport *tp = calloc(1, sizeof *tp);
    if (!tp)
        return LNORM_ENOMEM;
    if (!(tp->conns = lnorm__conns_create(cfg, st))) {
        free(tp);
        return LNORM_ENOMEM;
    }
    pthread_mutex_init(&tp->pmu, NULL);
    pthread_mutex_init(&tp->kmu, NULL);
    tp->st = st;
    pthread_cond_init(&tp->kcv, NULL);
    tp->on_msg = fn;
    tp->arg = arg;
    tp->send_timeout_ms = (nng_duration)cfg->send_timeout_ms;
    int rc = LNORM_OK, rv;
    if ((rv = nng_rep0_open(&tp->sock)) != 0) {
        snprintf(err, errlen, "rep0 socket: %s", nng_strerror(rv));
        pthread_mutex_destroy(&tp->pmu);
        lnorm__conns_destroy(tp->conns);
        free(tp);
        return LNORM_ETRANSPORT;
    }
    tp->sock_open = 1;
    if ((rv = lnorm__conns_watch(tp->conns, tp->sock)) != 0) {
        snprintf(err, errlen, "frame watchdog: %s", strerror(rv));
        lnorm__transport_close(tp);
        lnorm__transport_destroy(tp);
        return LNORM_ENOMEM;
    }
    /* Messages up to 1 MiB over max-message-bytes are still received so that
     * they can be answered RESOURCE_EXHAUSTED; NNG closes the connection of
     * a larger one when its length arrives (the receive limit per connection:
     * one frame is in progress on a connection at a time). */
    nng_socket_set_size(tp->sock, NNG_OPT_RECVMAXSZ, (size_t)cfg->max_message_bytes + (1u << 20));
    nng_pipe_notify(tp->sock, NNG_PIPE_EV_ADD_PRE, lnorm__pipe_cb, tp);
    nng_pipe_notify(tp->sock, NNG_PIPE_EV_ADD_POST, lnorm__pipe_cb, tp);
    nng_pipe_notify(tp->sock, NNG_PIPE_EV_REM_POST, lnorm__pipe_cb, tp);
    if (cfg->tls_cert[0])
        rc = lnorm__tls_setup(tp, cfg, err, errlen);
    for (int i = 0; rc == LNORM_OK && i < cfg->nlisten; i++)
        rc = lnorm__listen(tp, cfg->listen[i], err, errlen);
    int n = (int)cfg->contexts;
    if (rc == LNORM_OK && !(tp->slots = calloc((size_t)n, sizeof *tp->slots)))
        rc = LNORM_ENOMEM;
    for (int i = 0; rc == LNORM_OK && i < n; i++) {
        lnorm__slot *s = &tp->slots[i];
        s->tp = tp;
        if ((rv = nng_ctx_open(&s->ctx, tp->sock)) != 0 || (rv = nng_aio_alloc(&s->aio, lnorm__slot_cb, s)) != 0) {
            snprintf(err, errlen, "context %d: %s", i, nng_strerror(rv));
            rc = LNORM_ETRANSPORT;
            break;
        }
        tp->nslots = i + 1;
    }
    int any_ipc = 0;
    for (int i = 0; i < tp->nls; i++)
        any_ipc |= !strncmp(tp->urls[i], "ipc://", 6);
    if (rc == LNORM_OK && any_ipc) {
        if ((rv = pthread_create(&tp->keeper, NULL, lnorm__keeper, tp)) != 0) {
            snprintf(err, errlen, "ipc listener keeper: %s", strerror(rv));
            rc = LNORM_ENOMEM;
        } else {
            tp->keeper_on = 1;
        }
    }
    if (rc != LNORM_OK) {
        lnorm__transport_close(tp);
        lnorm__transport_destroy(tp);
        return rc;
    }
    *out = tp;
    return LNORM_OK;
}

int lnorm__transport_start(lnorm__transport *tp)
{
    for (int i = 0; i < tp->nslots; i++)
        lnorm__slot_recv(&tp->slots[i]);
    return LNORM_OK;
}

int lnorm__transport_nlisteners(const lnorm__transport *tp)
{
    return tp->nls;
}

const char *lnorm__transport_url(const lnorm__transport *tp, int i)
{
    return tp->urls[i];
}

void lnorm__transport_drain(lnorm__transport *tp)
{
    atomic_store(&tp->draining, 1);
}

int lnorm__transport_busy(lnorm__transport *tp)
{
    return atomic_load(&tp->busy);
}

/* NNG 1.5 has no flush: a send completes when the pipe takes the reply,
 * before the connection has carried it, and closing the socket then cuts
 * it off. But a pipe's statistics count a message sent (tx_msgs) only
 * once it is written out: a pipe of ours that has written fewer messages
 * than we handed it replies still has one on its way. */
int lnorm__transport_in_transit(lnorm__transport *tp)
{
    nng_stat *root;
    if (!tp->sock_open || nng_stats_get(&root) != 0)
        return 0; /* no statistics in this NNG build: nothing to wait for */
    const uint64_t sid = (uint64_t)nng_socket_id(tp->sock);
    int n = 0;
    pthread_mutex_lock(&tp->pmu);
    for (nng_stat *c = nng_stat_child(root); c; c = nng_stat_next(c)) {
        if (strcmp(nng_stat_name(c), "pipe") != 0)
            continue;
        nng_stat *id = nng_stat_find(c, "id"), *sk = nng_stat_find(c, "socket"), *tx = nng_stat_find(c, "tx_msgs");
        if (!id || !sk || !tx || nng_stat_value(sk) != sid)
            continue;
        for (size_t i = 0; i < tp->npipes; i++)
            if (tp->pipes[i].id == (uint32_t)nng_stat_value(id) && nng_stat_value(tx) < tp->pipes[i].handed)
                n++;
    }
    pthread_mutex_unlock(&tp->pmu);
    nng_stats_free(root);
    return n;
}

uint64_t lnorm__transport_last_recv_ns(lnorm__transport *tp)
{
    return atomic_load(&tp->last_recv_ns);
}

void lnorm__transport_close(lnorm__transport *tp)
{
    atomic_store(&tp->closing, 1);
    if (tp->keeper_on) {
        pthread_mutex_lock(&tp->kmu);
        tp->kstop = 1;
        pthread_cond_signal(&tp->kcv);
        pthread_mutex_unlock(&tp->kmu);
        pthread_join(tp->keeper, NULL);
        tp->keeper_on = 0;
    }
    while (atomic_load(&tp->in_nng) > 0) /* (see lnorm__gate_enter) */
        sched_yield();
    if (tp->sock_open) {
        nng_close(tp->sock);
        tp->sock_open = 0;
    }
}

void lnorm__transport_destroy(lnorm__transport *tp)
{
    if (!tp)
        return;
    for (int i = 0; i < tp->nslots; i++) {
        if (tp->slots[i].aio) {
            nng_aio_stop(tp->slots[i].aio);
            nng_msg *m = nng_aio_get_msg(tp->slots[i].aio);
            if (m)
                nng_msg_free(m);
            nng_aio_free(tp->slots[i].aio);
        }
    }
    free(tp->slots);
    free(tp->pipes);
    lnorm__conns_destroy(tp->conns);
    pthread_mutex_destroy(&tp->pmu);
    pthread_mutex_destroy(&tp->kmu);
    pthread_cond_destroy(&tp->kcv);
    if (tp->tls)
        nng_tls_config_free(tp->tls);
    free(tp);
}
