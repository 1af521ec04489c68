/*
 * fault.hostile_frames: peers that open connections and declare large
 * frames they never finish.
 *
 *   fault_hostile LNORMD            the test (lnormd with small limits, below)
 *   fault_hostile LNORMD measure [LNORMD-ARGS...]
 *                                   the same peers against lnormd with the
 *                                   given arguments (none: its defaults);
 *                                   prints VSZ and RSS, judges nothing
 *   fault_hostile LNORMD tls GEN_CERTS_SH
 *                                   fault.hostile_frames_tls (below)
 *
 * lnormd listens on tcp://127.0.0.1:0 and an ipc path; two well-behaved
 * clients load it over ipc the whole time and check every reply. Over tcp:
 *  - 1 idle connection (SP handshake, no frame) from 127.0.0.9;
 *  - 100 "stallers" from 127.0.0.1: each declares a 64 MiB frame, sends 10
 *    bytes of it and nothing more;
 *  - 100 "tricklers", each from its own address 127.0.1.N: each declares a
 *    64 MiB frame and sends 256 KiB of it every 100 ms.
 * for HOLD_MS. The test runs lnormd with --max-connections 48
 * --max-connections-per-peer 32 --frame-timeout-ms 1500 --max-receive-bytes
 * 32 MiB and checks: at most 32 stallers and at most 47 hostile connections
 * in all are taken, the others are closed at once (refused: the peer limit
 * and the listener limit both refuse some); each staller taken is closed by
 * lnormd between the frame timeout and the timeout + 2.5 s after its frame
 * began, each trickler by then at the latest (the receive budget closes
 * some sooner); the idle connection stays open and answers Health after;
 * /metrics counts the refusals, and the frames timed out and over budget
 * add up to the connections closed; lnormd's VSZ stays within
 * 48 x 65 MiB + 256 MiB of where it began and RSS within 96 MiB (without
 * the limits the same peers reserve 12.8 GB and make 1.1 GB of it
 * resident); the good clients keep getting right answers throughout.
 *
 * fault.watchdog_streaming (fault_hostile LNORMD stream): the watchdog
 * closes connections while their bytes are still pouring in. 12 rounds of
 * 8 peers, each declaring a 64 MiB frame and writing it as fast as lnormd
 * reads, against --max-receive-bytes 4 MiB: lnormd closes every one of
 * them within 3 s of its start, and, after the rounds, its connection
 * count is back where it began within 5 s (every closed connection was
 * torn down: libnng 1.5.2 can lose a receive of a connection closed as a
 * message arrives, and its reaper then waits for good), a new client is
 * served, and lnormd exits 0 on SIGTERM.
 *
 * fault.hostile_frames_tls: over tls+tcp:// (certificates from
 * scripts/gen-certs.sh), --frame-timeout-ms 1500: 4 peers finish the SP
 * handshake, declare a 64 MiB frame and send 64 KiB of it every 100 ms;
 * each is closed between the timeout and 2.5 s after it, /metrics counts
 * exactly them, and an idle TLS connection beside them is left open and
 * answers Health after.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

#include "check.h"
#include "loadgen.h"
#include "testdaemon.h"
#include "wire.h"

#define NSTALL 100
#define NTRICKLE 100
#define NHOSTILE (NSTALL + NTRICKLE)
#define FRAME_BYTES (64ull << 20)
#define TRICKLE_BYTES (256 << 10)
#define HOLD_MS 6000
#define MAX_CONNS 48
#define MAX_PER_PEER 32
#define FRAME_TIMEOUT_MS 1500
#define RECEIVE_BYTES (32 << 20)

typedef struct peer {
    int fd;
    int trickle;
    int64_t began_ms;  /* frame header sent */
    int64_t closed_ms; /* seen closed by lnormd (0: not yet) */
    uint64_t sent;     /* bytes of the frame written */
} peer;

/* VmSize and VmRSS of pid in KiB. */
static void vm_kb(pid_t pid, long *vsz, long *rss)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    *vsz = *rss = -1;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmSize:", 7))
            *vsz = atol(line + 7);
        else if (!strncmp(line, "VmRSS:", 6))
            *rss = atol(line + 6);
    }
    fclose(f);
}

/* A TCP connection from source address src to 127.0.0.1:port, SP handshake
 * done; -1 when lnormd did not take it that far. */
static int connect_from(const char *src, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    inet_pton(AF_INET, src, &sa.sin_addr);
    struct sockaddr_in da = sa;
    da.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &da.sin_addr);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || connect(fd, (struct sockaddr *)&da, sizeof da) != 0 ||
        fw_sp_handshake(fd, 3000) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Write up to len bytes without blocking; bytes written, or -1 when the
 * connection is gone. */
static long send_some(int fd, const uint8_t *buf, size_t len)
{
    ssize_t n = send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0)
        return n;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
}

/* Mark the peers lnormd has closed (EOF or reset). */
static void reap(peer *p, int n, int64_t now)
{
    struct pollfd pf[NHOSTILE];
    for (int i = 0; i < n; i++) {
        pf[i].fd = p[i].closed_ms ? -1 : p[i].fd;
        pf[i].events = POLLIN;
        pf[i].revents = 0;
    }
    if (poll(pf, (nfds_t)n, 0) <= 0)
        return;
    for (int i = 0; i < n; i++) {
        if (!pf[i].revents)
            continue;
        char b[64];
        ssize_t r = recv(p[i].fd, b, sizeof b, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            p[i].closed_ms = now;
    }
}

/* Ask Health (request id) on the raw SP connection fd: 0 when it answers
 * OK within 5 s, -1 when nothing comes, 1 when something else comes. */
static int health(int fd, uint32_t id)
{
    size_t hl;
    uint8_t *h = fw_pack_health(id, &hl);
    uint32_t rid = 0;
    uint8_t *body = NULL;
    size_t bl = 0;
    int r = fd >= 0 && fw_sp_send(fd, id, h, hl) == 0 ? fw_sp_recv(fd, &rid, &body, &bl, 5000) : -1;
    Lnorm__V1__Response *resp = r == 0 ? fw_unpack(body, bl) : NULL;
    if (r == 0)
        r = resp && (!resp->status || resp->status->code == 0) &&
                    resp->body_case == LNORM__V1__RESPONSE__BODY_HEALTH
                ? 0
                : 1;
    if (resp)
        lnorm__v1__response__free_unpacked(resp, NULL);
    free(body);
    free(h);
    return r;
}

static void st_done(void *arg)
{
    atomic_store((atomic_int *)arg, 1);
}

/* Sends that did not end in time: finished once their stream is closed. */
static struct {
    nng_aio *aio;
    atomic_int *fin;
} g_left[64];
static int g_nleft;

/* All of len bytes sent (send) or received on a TLS stream within
 * timeout_ms: 0 or an NNG error. (The wait is bounded here, and what is
 * left waiting goes to g_left: a TLS send on a connection the server
 * closed can outlast NNG's aio timeout.) */
static int st_io(nng_stream *s, int send, void *buf, size_t len, int timeout_ms)
{
    atomic_int *fin = malloc(sizeof *fin); /* outlives a send left to NNG */
    nng_aio *aio;
    if (!fin || nng_aio_alloc(&aio, st_done, fin) != 0) {
        free(fin);
        return NNG_ENOMEM;
    }
    size_t done = 0;
    int rv = 0;
    while (done < len && rv == 0) {
        nng_iov iov = {(char *)buf + done, len - done};
        nng_aio_set_iov(aio, 1, &iov);
        nng_aio_set_timeout(aio, timeout_ms);
        atomic_store(fin, 0);
        if (send)
            nng_stream_send(s, aio);
        else
            nng_stream_recv(s, aio);
        for (int64_t end = td_now_ms() + timeout_ms; !atomic_load(fin) && td_now_ms() < end;)
            td_sleep_ms(2);
        if (!atomic_load(fin)) {
            rv = NNG_ETIMEDOUT;
            if (g_nleft < 64) {
                g_left[g_nleft].aio = aio;
                g_left[g_nleft++].fin = fin;
            }
            break;
        }
        rv = nng_aio_result(aio);
        if (rv == 0 && nng_aio_count(aio) == 0)
            rv = NNG_ECLOSED; /* nothing moves: the connection is gone */
        done += nng_aio_count(aio);
    }
    if (rv != NNG_ETIMEDOUT) {
        nng_aio_free(aio);
        free(fin);
    }
    return rv;
}

/* A TLS stream to url with the SP handshake of a REQ peer done; NULL on failure. */
static nng_stream *tls_peer(nng_stream_dialer *dl)
{
    nng_aio *aio;
    nng_stream *s = NULL;
    if (nng_aio_alloc(&aio, NULL, NULL) != 0)
        return NULL;
    nng_aio_set_timeout(aio, 5000);
    nng_stream_dialer_dial(dl, aio);
    nng_aio_wait(aio);
    if (nng_aio_result(aio) == 0)
        s = nng_aio_get_output(aio, 0);
    nng_aio_free(aio);
    uint8_t hello[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0}, peer[8];
    if (s && (st_io(s, 1, hello, 8, 5000) != 0 || st_io(s, 0, peer, 8, 5000) != 0 || peer[5] != 0x31)) {
        nng_stream_free(s);
        s = NULL;
    }
    return s;
}

/* A receive that never gets data on a trickler: it ends when lnormd
 * closes the connection, and notes when. */
typedef struct closer {
    nng_aio *aio;
    uint8_t b[16];
    _Atomic int64_t at;
} closer;

static void closer_cb(void *arg)
{
    closer *c = arg;
    atomic_store(&c->at, td_now_ms());
}

static int tls_main(const char *lnormd, const char *gen_certs)
{
    char pki[400], cmd[1000], cert[460], key[460], ca[460];
    td_daemon d;
    char dir[300];
    if (td_tmpdir(dir, sizeof dir, "hostile-tls") != 0)
        return 1;
    snprintf(pki, sizeof pki, "%s/pki", dir);
    snprintf(cmd, sizeof cmd, "bash '%s' '%s' >/dev/null", gen_certs, pki);
    if (system(cmd) != 0) {
        CHECK_FAIL("%s failed", gen_certs);
        return check_finish("fault.hostile_frames_tls");
    }
    snprintf(cert, sizeof cert, "%s/server.crt", pki);
    snprintf(key, sizeof key, "%s/server.key", pki);
    snprintf(ca, sizeof ca, "%s/ca.crt", pki);
    char timeout[16];
    snprintf(timeout, sizeof timeout, "%d", FRAME_TIMEOUT_MS);
    const char *args[] = {"--backend", "cpu", "--cpu-threads", "2", "--listen", "tls+tcp://127.0.0.1:0",
                          "--tls-cert", cert, "--tls-key", key, "--frame-timeout-ms", timeout, NULL};
    if (td_start(&d, lnormd, dir, args, TD_ENDPOINTS) != 0)
        return 1;
    fl_load *load = fl_start(d.ipc_url, 2, 16, 256, 10000);
    nng_stream_dialer *dl = NULL;
    nng_tls_config *cfg = NULL;
    if (nng_stream_dialer_alloc(&dl, d.tls_url) != 0 || nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT) != 0 ||
        nng_tls_config_ca_file(cfg, ca) != 0 || nng_tls_config_server_name(cfg, "localhost") != 0 ||
        nng_stream_dialer_set_ptr(dl, NNG_OPT_TLS_CONFIG, cfg) != 0) {
        CHECK_FAIL("TLS dialer for %s", d.tls_url);
        return check_finish("fault.hostile_frames_tls");
    }
    enum { NT = 4 };
    nng_stream *idle = tls_peer(dl), *t[NT];
    int64_t began[NT], closed[NT];
    static closer cl[NT];
    static uint8_t chunk[64 << 10];
    memset(chunk, 0x5a, sizeof chunk);
    CHECK(idle != NULL, "an idle TLS connection was not taken");
    for (int i = 0; i < NT; i++) {
        t[i] = tls_peer(dl);
        closed[i] = 0;
        CHECK(t[i] != NULL, "TLS peer %d was not taken", i);
        uint8_t hdr[8];
        for (int b = 0; b < 8; b++)
            hdr[b] = (uint8_t)(FRAME_BYTES >> (56 - 8 * b));
        began[i] = td_now_ms();
        if (t[i] && st_io(t[i], 1, hdr, 8, 2000) != 0)
            closed[i] = td_now_ms();
        if (t[i] && nng_aio_alloc(&cl[i].aio, closer_cb, &cl[i]) == 0) {
            nng_iov iov = {cl[i].b, sizeof cl[i].b};
            nng_aio_set_iov(cl[i].aio, 1, &iov);
            nng_stream_recv(t[i], cl[i].aio);
        }
    }
    const int64_t end = td_now_ms() + FRAME_TIMEOUT_MS + 3000;
    while (td_now_ms() < end) {
        for (int i = 0; i < NT; i++) {
            if (!closed[i] && atomic_load(&cl[i].at))
                closed[i] = atomic_load(&cl[i].at);
            if (t[i] && !closed[i] && st_io(t[i], 1, chunk, sizeof chunk, 100) != 0 && !closed[i])
                closed[i] = atomic_load(&cl[i].at) ? atomic_load(&cl[i].at) : td_now_ms();
        }
        td_sleep_ms(100);
    }
    int early = 0, late = 0;
    for (int i = 0; i < NT; i++) {
        int64_t held = closed[i] ? closed[i] - began[i] : -1;
        printf("hostile tls: trickler %d closed after %lld ms\n", i, (long long)held);
        early += closed[i] && held < FRAME_TIMEOUT_MS - 100;
        late += !closed[i] || held > FRAME_TIMEOUT_MS + 2500;
    }
    CHECK(early == 0 && late == 0, "TLS tricklers: %d closed before the frame timeout, %d late or never", early,
          late);
    double timed_out = td_metric(&d, "lnormd_frames_timed_out_total");
    CHECK(timed_out == NT, "/metrics: %g frames timed out, %d tricklers", timed_out, NT);
    size_t hl;
    uint8_t *h = fw_pack_health(9, &hl), frame[12], rh[12];
    for (int b = 0; b < 8; b++)
        frame[b] = (uint8_t)((hl + 4) >> (56 - 8 * b));
    frame[8] = 0x80, frame[9] = 0, frame[10] = 0, frame[11] = 9;
    int ok = idle && st_io(idle, 1, frame, 12, 3000) == 0 && st_io(idle, 1, h, hl, 3000) == 0 &&
             st_io(idle, 0, rh, 12, 5000) == 0;
    Lnorm__V1__Response *resp = NULL;
    if (ok) {
        size_t n = 0;
        for (int b = 0; b < 8; b++)
            n = n << 8 | rh[b];
        uint8_t *body = n >= 4 && n < (1u << 20) ? malloc(n - 4) : NULL;
        if (body && st_io(idle, 0, body, n - 4, 5000) == 0)
            resp = fw_unpack(body, n - 4);
        free(body);
    }
    CHECK(resp && resp->body_case == LNORM__V1__RESPONSE__BODY_HEALTH, "the idle TLS connection got no Health reply");
    if (resp)
        lnorm__v1__response__free_unpacked(resp, NULL);
    free(h);
    for (int i = 0; i < NT; i++)
        if (t[i])
            nng_stream_close(t[i]);
    for (int i = 0; i < NT; i++)
        if (cl[i].aio) {
            nng_aio_wait(cl[i].aio);
            nng_aio_free(cl[i].aio);
        }
    for (int i = 0; i < g_nleft; i++) {
        nng_aio_wait(g_left[i].aio);
        nng_aio_free(g_left[i].aio);
        free(g_left[i].fin);
    }
    for (int i = 0; i < NT; i++)
        if (t[i])
            nng_stream_free(t[i]);
    if (idle)
        nng_stream_free(idle);
    nng_stream_dialer_free(dl);
    nng_tls_config_free(cfg);
    fl_stats st;
    fl_stop(load, &st);
    CHECK(st.wrong == 0 && st.failed == 0 && st.ok > 0, "good clients: %ld ok, problems: %s", st.ok,
          st.first_problem);
    td_stop_check(&d, "on SIGTERM");
    return check_finish("fault.hostile_frames_tls");
}

#define SROUNDS 12
#define SPEERS 8
#define SBUDGET (4 << 20)

static int stream_main(const char *lnormd)
{
    char budget[16];
    snprintf(budget, sizeof budget, "%d", SBUDGET);
    const char *args[] = {"--backend", "cpu", "--cpu-threads", "2", "--max-receive-bytes", budget,
                          "--max-connections-per-peer", "256", NULL};
    td_daemon d;
    if (td_start(&d, lnormd, NULL, args, TD_ENDPOINTS) != 0)
        return 1;
    const int port = atoi(strrchr(d.tcp_url, ':') + 1);
    double conns0 = td_metric(&d, "lnormd_connections");
    static uint8_t chunk[1 << 20];
    memset(chunk, 0x5a, sizeof chunk);
    int closed = 0, late = 0, taken = 0;
    uint64_t poured = 0;
    for (int round = 0; round < SROUNDS; round++) {
        peer p[SPEERS];
        int n = 0;
        for (int i = 0; i < SPEERS; i++) {
            int fd = connect_from("127.0.0.1", port);
            if (fd < 0)
                continue;
            uint8_t hdr[8];
            for (int b = 0; b < 8; b++)
                hdr[b] = (uint8_t)(FRAME_BYTES >> (56 - 8 * b));
            p[n] = (peer){fd, 1, td_now_ms(), 0, 0};
            if (send_some(fd, hdr, sizeof hdr) != (long)sizeof hdr)
                p[n].closed_ms = td_now_ms();
            n++;
        }
        taken += n;
        const int64_t end = td_now_ms() + 3000;
        int open = n;
        while (open > 0 && td_now_ms() < end) {
            for (int i = 0; i < n; i++) {
                if (p[i].closed_ms || p[i].sent >= FRAME_BYTES - sizeof chunk)
                    continue;
                long w = send_some(p[i].fd, chunk, sizeof chunk);
                if (w < 0)
                    p[i].closed_ms = td_now_ms();
                else
                    p[i].sent += (uint64_t)w;
            }
            reap(p, n, td_now_ms());
            open = 0;
            for (int i = 0; i < n; i++)
                open += !p[i].closed_ms;
            if (open)
                td_sleep_ms(1);
        }
        for (int i = 0; i < n; i++) {
            closed += p[i].closed_ms != 0;
            late += !p[i].closed_ms;
            poured += p[i].sent;
            close(p[i].fd);
        }
    }
    double conns = td_wait_metric(&d, "lnormd_connections", conns0, 5000);
    printf("stream: %d connections over %d rounds, %d closed by lnormd while pouring (%.0f MiB), %d not within 3 s; "
           "connections %g before, %g after\n",
           taken, SROUNDS, closed, poured / 1048576.0, late, conns0, conns);
    CHECK(taken == SROUNDS * SPEERS, "%d of %d connections taken", taken, SROUNDS * SPEERS);
    CHECK(late == 0, "%d connections pouring past max-receive-bytes were not closed within 3 s", late);
    CHECK(conns == conns0, "lnormd counts %g connections once every peer is gone (%g before): "
          "closed connections were not torn down", conns, conns0);
    double over = td_metric(&d, "lnormd_frames_over_budget_total");
    CHECK(over >= 1, "/metrics: %g frames over budget", over);
    int fd = connect_from("127.0.0.9", port);
    int r = health(fd, 9);
    CHECK(r == 0, "a new connection got no Health reply (%d)", r);
    if (fd >= 0)
        close(fd);
    td_stop_check(&d, "on SIGTERM");
    return check_finish("fault.watchdog_streaming");
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[2], "tls")) {
        signal(SIGPIPE, SIG_IGN);
        td_watchdog(90);
        return tls_main(argv[1], argv[3]);
    }
    if (argc == 3 && !strcmp(argv[2], "stream")) {
        signal(SIGPIPE, SIG_IGN);
        td_watchdog(90);
        return stream_main(argv[1]);
    }
    if (argc < 2 || (argc > 2 && strcmp(argv[2], "measure"))) {
        fprintf(stderr, "usage: %s LNORMD [measure [LNORMD-ARGS...] | stream | tls GEN_CERTS_SH]\n", argv[0]);
        return 2;
    }
    const int measure = argc > 2 && !strcmp(argv[2], "measure");
    td_watchdog(90);
    signal(SIGPIPE, SIG_IGN);

    const char *args[TD_MAX_ARGS] = {"--backend", "cpu", "--cpu-threads", "2", NULL};
    int na = 4;
    char conns[16], per_peer[16], timeout[16], budget[16];
    if (measure) {
        for (int i = 3; i < argc && na < TD_MAX_ARGS - 1; i++)
            args[na++] = argv[i];
    } else {
        snprintf(conns, sizeof conns, "%d", MAX_CONNS);
        snprintf(per_peer, sizeof per_peer, "%d", MAX_PER_PEER);
        snprintf(timeout, sizeof timeout, "%d", FRAME_TIMEOUT_MS);
        snprintf(budget, sizeof budget, "%d", RECEIVE_BYTES);
        const char *lim[] = {"--max-connections", conns, "--max-connections-per-peer", per_peer,
                             "--frame-timeout-ms", timeout, "--max-receive-bytes", budget};
        for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
            args[na++] = lim[i];
    }
    args[na] = NULL;

    td_daemon d;
    if (td_start(&d, argv[1], NULL, args, TD_ENDPOINTS) != 0)
        return 1;
    const int port = atoi(strrchr(d.tcp_url, ':') + 1);
    fl_load *load = fl_start(d.ipc_url, 2, 16, 256, 10000);
    td_sleep_ms(500);
    long vsz0, rss0;
    vm_kb(d.pid, &vsz0, &rss0);

    int idle = connect_from("127.0.0.9", port);
    CHECK(idle >= 0, "an idle connection was not taken");

    static peer p[NHOSTILE];
    static uint8_t chunk[TRICKLE_BYTES];
    memset(chunk, 0x5a, sizeof chunk);
    fl_stats st0;
    fl_peek(load, &st0);
    int n = 0, nconnected = 0;
    for (int i = 0; i < NHOSTILE; i++) {
        char src[32];
        const int trickle = i >= NSTALL; /* the stallers meet the peer limit, the tricklers the listener's */
        if (trickle)
            snprintf(src, sizeof src, "127.0.1.%d", 1 + i - NSTALL);
        else
            snprintf(src, sizeof src, "127.0.0.1");
        int fd = connect_from(src, port);
        if (fd < 0)
            continue; /* refused before the handshake finished */
        nconnected++;
        uint8_t hdr[8 + 10];
        memset(hdr, 0x5a, sizeof hdr);
        for (int b = 0; b < 8; b++)
            hdr[b] = (uint8_t)(FRAME_BYTES >> (56 - 8 * b));
        p[n] = (peer){fd, trickle, td_now_ms(), 0, 0};
        long w = send_some(fd, hdr, sizeof hdr);
        if (w < 0)
            p[n].closed_ms = td_now_ms();
        else
            p[n].sent = (uint64_t)(w > 8 ? w - 8 : 0);
        n++;
    }

    long vsz_peak = vsz0, rss_peak = rss0;
    const int64_t end = td_now_ms() + HOLD_MS;
    for (int64_t now = td_now_ms(); now < end; now = td_now_ms()) {
        for (int i = 0; i < n; i++) {
            if (!p[i].trickle || p[i].closed_ms || p[i].sent >= FRAME_BYTES - TRICKLE_BYTES)
                continue;
            long w = send_some(p[i].fd, chunk, sizeof chunk);
            if (w < 0)
                p[i].closed_ms = now;
            else
                p[i].sent += (uint64_t)w;
        }
        td_sleep_ms(100);
        reap(p, n, td_now_ms());
        long v, r;
        vm_kb(d.pid, &v, &r);
        vsz_peak = v > vsz_peak ? v : vsz_peak;
        rss_peak = r > rss_peak ? r : rss_peak;
    }
    fl_stats st1;
    fl_peek(load, &st1);

    /* A staller is closed as it arrives (refused) or at the frame timeout;
     * a trickler as it arrives, over the receive budget, or at the
     * timeout: /metrics says which (below). */
    int taken_stall = 0, open_end = 0, late = 0;
    uint64_t trickled = 0;
    for (int i = 0; i < n; i++) {
        const int64_t held = p[i].closed_ms ? p[i].closed_ms - p[i].began_ms : HOLD_MS;
        if (!p[i].closed_ms)
            open_end++;
        trickled += p[i].sent;
        taken_stall += !p[i].trickle && held >= FRAME_TIMEOUT_MS - 100;
        if (held > FRAME_TIMEOUT_MS + 2500)
            late++;
    }
    long vsz1, rss1;
    td_sleep_ms(500);
    vm_kb(d.pid, &vsz1, &rss1);
    printf("hostile: %d of %d peers connected, %d stallers held to the frame timeout, %d still open at the end; "
           "%.1f MiB trickled; lnormd VSZ %ld -> peak %ld -> %ld MiB, RSS %ld -> peak %ld -> %ld MiB; "
           "good clients %ld replies during\n",
           nconnected, NHOSTILE, taken_stall, open_end, trickled / 1048576.0,
           vsz0 / 1024, vsz_peak / 1024, vsz1 / 1024, rss0 / 1024, rss_peak / 1024, rss1 / 1024,
           st1.ok - st0.ok);

    if (!measure) {
        CHECK(taken_stall <= MAX_PER_PEER, "%d connections from one address held (limit %d)", taken_stall,
              MAX_PER_PEER);
        CHECK(late == 0 && open_end == 0, "%d connections closed late, %d never", late, open_end);
        double refused_peer = td_metric(&d, "lnormd_connections_refused_total{limit=\"peer\"}");
        double refused_listener = td_metric(&d, "lnormd_connections_refused_total{limit=\"listener\"}");
        double timed_out = td_metric(&d, "lnormd_frames_timed_out_total");
        double over = td_metric(&d, "lnormd_frames_over_budget_total");
        printf("hostile: /metrics: refused %g (peer) %g (listener), frames timed out %g, over budget %g\n",
               refused_peer, refused_listener, timed_out, over);
        const double taken = timed_out + over;
        CHECK(refused_peer == NSTALL - taken_stall && refused_listener >= 1,
              "refusals: /metrics %g (peer) %g (listener); %d of %d stallers were refused", refused_peer,
              refused_listener, NSTALL - taken_stall, NSTALL);
        CHECK(refused_peer + refused_listener + taken == NHOSTILE,
              "/metrics: %g + %g refused and %g closed by the watchdog, of %d hostile connections", refused_peer,
              refused_listener, taken, NHOSTILE);
        CHECK(taken <= MAX_CONNS - 1 && taken >= MAX_CONNS / 2,
              "%g hostile connections taken beside the idle one (limit %d in all)", taken, MAX_CONNS);
        CHECK(timed_out >= taken_stall && over >= 1, "/metrics: %g frames timed out (%d stallers), %g over budget",
              timed_out, taken_stall, over);
        CHECK(vsz_peak - vsz0 <= (long)MAX_CONNS * 65 * 1024 + 256 * 1024, "VSZ grew by %ld MiB",
              (vsz_peak - vsz0) / 1024);
#if !defined(__SANITIZE_ADDRESS__)
        /* (ASan's quarantine and shadow memory make RSS no measure of lnormd's.) */
        CHECK(rss_peak - rss0 <= 96 * 1024, "RSS grew by %ld MiB", (rss_peak - rss0) / 1024);
        CHECK(vsz1 - vsz0 <= 256 * 1024, "VSZ still %ld MiB up once the peers are closed", (vsz1 - vsz0) / 1024);
#endif
        CHECK(st1.ok - st0.ok >= 5, "good clients made %ld replies in %d ms", st1.ok - st0.ok, HOLD_MS);
        /* The idle connection was left alone: it is served now. */
        int r = health(idle, 7);
        CHECK(r == 0, "the idle connection got no Health reply (%d)", r);
    }
    for (int i = 0; i < n; i++)
        close(p[i].fd);
    if (idle >= 0)
        close(idle);
    fl_stats st;
    fl_stop(load, &st);
    printf("hostile: good clients: %ld ok, %ld wrong, %ld failed, slowest %lld ms\n", st.ok, st.wrong, st.failed,
           (long long)st.max_ms);
    CHECK(st.wrong == 0 && st.failed == 0, "good clients hit problems: %s", st.first_problem);
    td_stop_check(&d, "on SIGTERM");
    return check_finish(measure ? "fault.hostile_frames (measure)" : "fault.hostile_frames");
}
