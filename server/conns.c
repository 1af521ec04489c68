/* Connection limits and the frame watchdog (conns.h says how a frame in
 * progress is seen). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "conns.h"
#include "log.h"

enum { CONN_IPC, CONN_TCP, CONN_TLS };

typedef struct lnorm__conn {
    uint32_t id;
    uint32_t listener;
    int kind;
    uint8_t peer[17]; /* family, then the address (tcp/tls) */
    struct sockaddr_storage loc, rem;
    int fd;            /* its socket in this process (-1: not found yet) */
    uint64_t rx_msgs;  /* messages NNG completed, as last seen */
    uint64_t base;     /* tls: bytes read when rx_msgs last changed */
    int based;
    uint64_t since_ns; /* a frame in progress since (0: none seen) */
    uint64_t partial;  /* bytes of it read, at the last look */
    int closing;
} lnorm__conn;

struct lnorm__conns {
    uint64_t max_conns, max_per_peer, timeout_ns, budget;
    lnorm__stats *st;
    nng_socket sock;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int running, stop;
    lnorm__conn *v;
    size_t n, cap;
    struct {
        uint32_t id;
        uint64_t n;
    } ls[LNORM__MAX_LISTEN * 2];
    int nls;
    uint64_t last_refuse_log_ns, last_close_log_ns;
    atomic_int tcp_info_missing_logged;
};

lnorm__conns *lnorm__conns_create(const lnorm__config *cfg, lnorm__stats *st)
{
    lnorm__conns *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->max_conns = cfg->max_connections;
    c->max_per_peer = cfg->max_connections_per_peer;
    c->timeout_ns = cfg->frame_timeout_ms * 1000000ull;
    c->budget = cfg->max_receive_bytes;
    c->st = st;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    return c;
}

/* nng_sockaddr (tcp) as a struct sockaddr_storage; 0 or -1. */
static int lnorm__to_sockaddr(const nng_sockaddr *a, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof *out);
    if (a->s_family == NNG_AF_INET) {
        struct sockaddr_in *s = (struct sockaddr_in *)out;
        s->sin_family = AF_INET;
        s->sin_port = a->s_in.sa_port;
        s->sin_addr.s_addr = a->s_in.sa_addr;
        return 0;
    }
    if (a->s_family == NNG_AF_INET6) {
        struct sockaddr_in6 *s = (struct sockaddr_in6 *)out;
        s->sin6_family = AF_INET6;
        s->sin6_port = a->s_in6.sa_port;
        memcpy(&s->sin6_addr, a->s_in6.sa_addr, 16);
        return 0;
    }
    return -1;
}

static int lnorm__same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return 0;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
        return x->sin6_port == y->sin6_port && !memcmp(&x->sin6_addr, &y->sin6_addr, 16);
    }
    return 0;
}

static void lnorm__peer_text(const lnorm__conn *r, char *buf, size_t len)
{
    if (!inet_ntop(r->peer[0] == 4 ? AF_INET : AF_INET6, r->peer + 1, buf, (socklen_t)len))
        snprintf(buf, len, "?");
}

static int lnorm__fd_for(const struct sockaddr_storage *loc, const struct sockaddr_storage *rem);
static uint64_t lnorm__bytes_read(lnorm__conns *c, lnorm__conn *r, int *ok);

int lnorm__conns_admit(lnorm__conns *c, nng_pipe p)
{
    lnorm__conn r;
    memset(&r, 0, sizeof r);
    r.id = (uint32_t)nng_pipe_id(p);
    r.listener = (uint32_t)nng_listener_id(nng_pipe_listener(p));
    r.fd = -1;
    nng_sockaddr rem, loc;
    bool verified;
    r.kind = CONN_IPC;
    if (nng_pipe_get_addr(p, NNG_OPT_REMADDR, &rem) == 0 && lnorm__to_sockaddr(&rem, &r.rem) == 0) {
        r.kind = nng_pipe_get_bool(p, NNG_OPT_TLS_VERIFIED, &verified) == 0 ? CONN_TLS : CONN_TCP;
        if (rem.s_family == NNG_AF_INET) {
            r.peer[0] = 4;
            memcpy(r.peer + 1, &rem.s_in.sa_addr, 4);
        } else {
            r.peer[0] = 6;
            memcpy(r.peer + 1, rem.s_in6.sa_addr, 16);
        }
        if (nng_pipe_get_addr(p, NNG_OPT_LOCADDR, &loc) != 0 || lnorm__to_sockaddr(&loc, &r.loc) != 0)
            memset(&r.loc, 0, sizeof r.loc); /* never matched: not watched */
    }
    pthread_mutex_lock(&c->mu);
    int li = 0;
    while (li < c->nls && c->ls[li].id != r.listener)
        li++;
    if (li == c->nls && c->nls < (int)(sizeof c->ls / sizeof c->ls[0])) {
        c->ls[li].id = r.listener;
        c->ls[li].n = 0;
        c->nls++;
    }
    const char *why = NULL;
    uint64_t same = 0;
    if (li < c->nls && c->ls[li].n >= c->max_conns)
        why = "listener";
    if (!why && r.kind != CONN_IPC) {
        for (size_t i = 0; i < c->n; i++)
            same += c->v[i].kind != CONN_IPC && !memcmp(c->v[i].peer, r.peer, sizeof r.peer);
        if (same >= c->max_per_peer)
            why = "peer";
    }
    if (!why && c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        void *nv = realloc(c->v, cap * sizeof *c->v);
        if (nv) {
            c->v = nv;
            c->cap = cap;
        } else {
            why = "memory";
        }
    }
    if (!why) {
        c->v[c->n++] = r;
        if (li < c->nls)
            c->ls[li].n++;
        pthread_mutex_unlock(&c->mu);
        if (c->st)
            atomic_fetch_add(&c->st->connections, 1);
        /* TLS hides where messages end: what NNG has read by now (the
         * handshakes, and what its TLS layer read ahead) is the base. (A
         * look in between takes its own base, as late or later.) */
        int ok = 0;
        if (r.kind == CONN_TLS && r.loc.ss_family && (r.fd = lnorm__fd_for(&r.loc, &r.rem)) >= 0)
            r.base = lnorm__bytes_read(c, &r, &ok);
        pthread_mutex_lock(&c->mu);
        for (size_t i = 0; ok && i < c->n; i++)
            if (c->v[i].id == r.id && !c->v[i].based) {
                c->v[i].fd = r.fd;
                c->v[i].base = r.base;
                c->v[i].based = 1;
            }
        pthread_mutex_unlock(&c->mu);
        return 1;
    }
    uint64_t now = lnorm__now_ns();
    int log = now - c->last_refuse_log_ns >= 1000000000ull;
    if (log)
        c->last_refuse_log_ns = now;
    pthread_mutex_unlock(&c->mu);
    if (c->st) {
        if (!strcmp(why, "peer"))
            atomic_fetch_add(&c->st->conns_refused_peer, 1);
        else
            atomic_fetch_add(&c->st->conns_refused_listener, 1);
    }
    if (log) {
        char who[64] = "a local peer";
        if (r.kind != CONN_IPC)
            lnorm__peer_text(&r, who, sizeof who);
        if (!strcmp(why, "peer"))
            LOG_WARN("connection from %s refused: %llu connections from that address (max-connections-per-peer)",
                     who, (unsigned long long)same);
        else if (!strcmp(why, "listener"))
            LOG_WARN("connection from %s refused: %llu connections on its listener (max-connections)", who,
                     (unsigned long long)c->max_conns);
        else
            LOG_WARN("connection from %s refused: out of memory", who);
    }
    return 0;
}

void lnorm__conns_removed(lnorm__conns *c, nng_pipe p)
{
    uint32_t id = (uint32_t)nng_pipe_id(p);
    int found = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n; i++)
        if (c->v[i].id == id) {
            for (int l = 0; l < c->nls; l++)
                if (c->ls[l].id == c->v[i].listener && c->ls[l].n)
                    c->ls[l].n--;
            c->v[i] = c->v[--c->n];
            found = 1;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    if (found && c->st)
        atomic_fetch_sub(&c->st->connections, 1);
}

/* The socket of this process with these two addresses, or -1. */
static int lnorm__fd_for(const struct sockaddr_storage *loc, const struct sockaddr_storage *rem)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int dfd = dirfd(d), found = -1;
    struct dirent *e;
    while (found < 0 && (e = readdir(d))) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        struct sockaddr_storage l, r;
        socklen_t ll = sizeof l, rl = sizeof r;
        if (*end || end == e->d_name || fd == dfd || getsockname((int)fd, (struct sockaddr *)&l, &ll) != 0 ||
            !lnorm__same_addr(&l, loc) || getpeername((int)fd, (struct sockaddr *)&r, &rl) != 0 ||
            !lnorm__same_addr(&r, rem))
            continue;
        found = (int)fd;
    }
    closedir(d);
    return found;
}

/* Find the sockets of the watched pipes that have none yet: every socket
 * of this process whose two addresses are a pipe's (under mu). */
static void lnorm__find_fds(lnorm__conns *c)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return;
    int dfd = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end || end == e->d_name || fd == dfd)
            continue;
        struct sockaddr_storage loc, rem;
        socklen_t ll = sizeof loc, rl = sizeof rem;
        if (getsockname((int)fd, (struct sockaddr *)&loc, &ll) != 0 ||
            (loc.ss_family != AF_INET && loc.ss_family != AF_INET6))
            continue;
        int peer_read = 0;
        for (size_t i = 0; i < c->n; i++) {
            lnorm__conn *r = &c->v[i];
            if (r->kind == CONN_IPC || r->fd >= 0 || !lnorm__same_addr(&loc, &r->loc))
                continue;
            if (!peer_read && getpeername((int)fd, (struct sockaddr *)&rem, &rl) != 0)
                break;
            peer_read = 1;
            if (lnorm__same_addr(&rem, &r->rem)) {
                r->fd = (int)fd;
                break;
            }
        }
    }
    closedir(d);
}

/* Bytes NNG has read from r's socket; 0 and *ok = 0 when its socket is no
 * longer the pipe's or the kernel does not count them. */
static uint64_t lnorm__bytes_read(lnorm__conns *c, lnorm__conn *r, int *ok)
{
    struct sockaddr_storage loc, rem;
    socklen_t ll = sizeof loc, rl = sizeof rem;
    *ok = 0;
    if (getsockname(r->fd, (struct sockaddr *)&loc, &ll) != 0 || !lnorm__same_addr(&loc, &r->loc) ||
        getpeername(r->fd, (struct sockaddr *)&rem, &rl) != 0 || !lnorm__same_addr(&rem, &r->rem)) {
        r->fd = -1; /* closed, perhaps reused: look again */
        return 0;
    }
    struct tcp_info ti;
    socklen_t tl = sizeof ti;
    memset(&ti, 0, sizeof ti);
    int inq = 0;
    if (getsockopt(r->fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0 ||
        tl < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received ||
        ioctl(r->fd, SIOCINQ, &inq) != 0) {
        if (!atomic_exchange(&c->tcp_info_missing_logged, 1)) {
            LOG_WARN("frame-timeout-ms: the kernel does not count a connection's bytes (TCP_INFO): not applied");
        }
        return 0;
    }
    *ok = 1;
    return ti.tcpi_bytes_received - (uint64_t)(inq > 0 ? inq : 0);
}

/* One look at every watched pipe; the ids of those to close into out, with
 * why[i] 0 (frame-timeout-ms) or 1 (max-receive-bytes). */
static size_t lnorm__tick(lnorm__conns *c, uint32_t *out, int *why, size_t outcap)
{
    int watched = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n && !watched; i++)
        watched = c->v[i].kind != CONN_IPC;
    pthread_mutex_unlock(&c->mu);
    nng_stat *root;
    if (!watched || nng_stats_get(&root) != 0)
        return 0;
    const uint64_t sid = (uint64_t)nng_socket_id(c->sock), now = lnorm__now_ns();
    size_t nout = 0;
    pthread_mutex_lock(&c->mu);
    int missing = 0;
    for (size_t i = 0; i < c->n; i++)
        missing |= c->v[i].kind != CONN_IPC && c->v[i].fd < 0 && c->v[i].loc.ss_family;
    if (missing)
        lnorm__find_fds(c);
    for (nng_stat *s = nng_stat_child(root); s; s = nng_stat_next(s)) {
        if (strcmp(nng_stat_name(s), "pipe") != 0)
            continue;
        nng_stat *id = nng_stat_find(s, "id"), *sk = nng_stat_find(s, "socket");
        nng_stat *msgs = nng_stat_find(s, "rx_msgs"), *bytes = nng_stat_find(s, "rx_bytes");
        if (!id || !sk || !msgs || !bytes || nng_stat_value(sk) != sid)
            continue;
        lnorm__conn *r = NULL;
        for (size_t i = 0; i < c->n && !r; i++)
            if (c->v[i].id == (uint32_t)nng_stat_value(id))
                r = &c->v[i];
        if (!r || r->kind == CONN_IPC || r->fd < 0 || r->closing)
            continue;
        int ok;
        const uint64_t rd = lnorm__bytes_read(c, r, &ok), m = nng_stat_value(msgs);
        if (!ok)
            continue;
        if (r->kind == CONN_TCP) {
            /* the 8-byte SP handshake, then an 8-byte length before each message */
            const uint64_t done = 8 + 8 * m + nng_stat_value(bytes);
            r->partial = rd > done ? rd - done : 0;
        } else {
            if (!r->based || m != r->rx_msgs) {
                r->base = rd;
                r->based = 1;
            }
            r->partial = rd > r->base ? rd - r->base : 0;
        }
        const int busy = r->partial > 0;
        if (m != r->rx_msgs) {
            r->rx_msgs = m;
            r->since_ns = 0;
        }
        if (!busy) {
            r->since_ns = 0;
        } else if (!r->since_ns) {
            r->since_ns = now;
        } else if (c->timeout_ns && now - r->since_ns >= c->timeout_ns && nout < outcap) {
            r->closing = 1;
            why[nout] = 0;
            out[nout++] = r->id;
        }
    }
    /* Over max-receive-bytes: close the connections holding the most. */
    uint64_t sum = 0;
    for (size_t i = 0; i < c->n; i++)
        sum += c->v[i].closing || c->v[i].kind == CONN_IPC ? 0 : c->v[i].partial;
    while (sum > c->budget && nout < outcap) {
        lnorm__conn *big = NULL;
        for (size_t i = 0; i < c->n; i++)
            if (!c->v[i].closing && c->v[i].kind != CONN_IPC && c->v[i].partial &&
                (!big || c->v[i].partial > big->partial))
                big = &c->v[i];
        if (!big)
            break;
        big->closing = 1;
        sum -= big->partial;
        why[nout] = 1;
        out[nout++] = big->id;
    }
    if (c->st)
        atomic_store(&c->st->receiving_bytes, (int_fast64_t)sum);
    pthread_mutex_unlock(&c->mu);
    nng_stats_free(root);
    return nout;
}

/* Whether fd is still the socket between loc and rem. */
static int lnorm__fd_is(int fd, const struct sockaddr_storage *loc, const struct sockaddr_storage *rem)
{
    struct sockaddr_storage l, r;
    socklen_t ll = sizeof l, rl = sizeof r;
    return fd >= 0 && getsockname(fd, (struct sockaddr *)&l, &ll) == 0 && lnorm__same_addr(&l, loc) &&
           getpeername(fd, (struct sockaddr *)&r, &rl) == 0 && lnorm__same_addr(&r, rem);
}

void lnorm__conns_close(lnorm__conns *c, uint32_t id)
{
    int done = 0;
    if (c) {
        pthread_mutex_lock(&c->mu);
        lnorm__conn *r = NULL;
        for (size_t i = 0; i < c->n && !r; i++)
            if (c->v[i].id == id)
                r = &c->v[i];
        if (r && r->kind != CONN_IPC && r->loc.ss_family) {
            if (!lnorm__fd_is(r->fd, &r->loc, &r->rem)) {
                r->fd = -1;
                lnorm__find_fds(c);
            }
            /* A duplicate, checked: should NNG close r->fd meanwhile and the
             * number be reused, the shutdown still reaches this socket only. */
            int fd = r->fd >= 0 ? fcntl(r->fd, F_DUPFD_CLOEXEC, 0) : -1;
            done = fd >= 0 && lnorm__fd_is(fd, &r->loc, &r->rem) && shutdown(fd, SHUT_RDWR) == 0;
            if (fd >= 0)
                close(fd);
        }
        pthread_mutex_unlock(&c->mu);
    }
    if (!done)
        nng_pipe_close((nng_pipe){.id = id});
}

static void *lnorm__watchdog(void *arg)
{
    lnorm__conns *c = arg;
    /* A quarter of the timeout between looks, 50 to 250 ms: a frame is
     * closed between timeout and timeout + two looks after it began, and
     * max-receive-bytes is overrun by at most what arrives in one look. */
    uint64_t period = c->timeout_ns ? c->timeout_ns / 4 : 250000000ull;
    period = period < 50000000ull ? 50000000ull : period > 250000000ull ? 250000000ull : period;
    uint32_t ids[256];
    int why[256];
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + period;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        if (c->stop)
            break;
        pthread_mutex_unlock(&c->mu);
        size_t n = lnorm__tick(c, ids, why, sizeof ids / sizeof ids[0]), over = 0;
        for (size_t i = 0; i < n; i++) {
            lnorm__conns_close(c, ids[i]);
            over += (size_t)why[i];
        }
        if (n && c->st) {
            atomic_fetch_add(&c->st->frames_timed_out, n - over);
            atomic_fetch_add(&c->st->frames_over_budget, over);
        }
        uint64_t now = lnorm__now_ns();
        if (n && now - c->last_close_log_ns >= 1000000000ull) {
            c->last_close_log_ns = now;
            LOG_WARN("closed %zu connection(s) with a message arriving for more than %llu ms (frame-timeout-ms) and "
                     "%zu holding the most when more than max-receive-bytes (%llu) were arriving",
                     n - over, (unsigned long long)(c->timeout_ns / 1000000ull), over,
                     (unsigned long long)c->budget);
        }
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int lnorm__conns_watch(lnorm__conns *c, nng_socket sock)
{
    c->sock = sock;
    int rv = pthread_create(&c->thread, NULL, lnorm__watchdog, c);
    if (rv == 0)
        c->running = 1;
    return rv;
}

void lnorm__conns_destroy(lnorm__conns *c)
{
    if (!c)
        return;
    if (c->running) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c->v);
    free(c);
}
