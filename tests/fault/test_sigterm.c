/*
 * What SIGTERM's drain promises (server/main.c: "requests in hand are
 * answered, later ones get UNAVAILABLE"; the replies are written out before
 * the socket closes), and a reply that cannot be written.
 *
 *   fault_sigterm LNORMD                 (fault.sigterm_under_load)
 *
 * 6 raw SP/TCP REQ peers (wire.h) each keep 4 requests of 64 x 512 f32 in
 * flight, so each knows which requests it wrote, when, and which were
 * answered; they go on sending through the drain. One more peer holds the
 * drain open: its request (4096 x 1024 f32) is in lnormd's hands before the
 * load starts, and it reads nothing until 500 ms after the signal, so its
 * 16 MiB reply cannot be written out before then. After 1.5 s of load
 * lnormd gets SIGTERM. Checks:
 *  - the log shows the drain begin at the signal and end with every reply
 *    written out, with no drain timeout; lnormd exits 0;
 *  - the held reply arrives whole and right once its peer reads;
 *  - the requests that reached lnormd during the drain were answered
 *    UNAVAILABLE, not dropped (at least one: the peers kept sending);
 *  - every request written 200 ms or more before the signal (by then in
 *    lnormd's hands: a request still in the socket is not) got a reply;
 *  - later requests are answered, or see the connection closed; none hangs
 *    (a peer gives up after 15 s of silence, which fails);
 *  - the load was real (at least 50 correct replies) and no reply was wrong.
 * A daemon that exits at once on SIGTERM, even with status 0, fails the
 * first three checks.
 *
 *   fault_sigterm LNORMD large_reply     (fault.sigterm_large_reply)
 *
 * One peer sends a request of 4000 x 4096 f32 (a 65.5 MB reply), lnormd
 * gets SIGTERM 50 ms later, and the peer reads nothing for 3 s: the reply
 * is handed to NNG long before the connection can carry it. Checks: the
 * whole reply arrives and is right (NNG completes a send when the pipe
 * takes it, not when it is written), and lnormd exits 0 without a drain
 * timeout.
 *
 *   fault_sigterm LNORMD drain_delay     (fault.sigterm_queue_delay)
 *
 * --max-queue-delay-us 10000000 (a lone request waits up to 10 s for rows
 * to join its batch) and --drain-timeout-ms 5000: a request is queued,
 * then SIGTERM. Checks: it is answered, right, within 3 s of the signal
 * (the drain runs what is queued at once: no more work is coming), and
 * lnormd exits 0 without a drain timeout.
 *
 *   fault_sigterm LNORMD send_timeout    (fault.send_timeout)
 *
 * --send-timeout-ms 300; one peer pipelines two requests of 4096 x 1024
 * f32 (16 MiB replies) on one connection with a 64 KiB receive buffer and
 * reads nothing for 2 s. The second reply times out in rep0's queue behind
 * the first. Checks: the peer is not left waiting on a live connection for
 * a reply that will never come: it gets both replies, or the server closes
 * the connection; lnormd serves a new connection after.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "check.h"
#include "testdaemon.h"
#include "wire.h"

#define NCLIENTS 6
#define DEPTH 4
#define ROWS 64
#define HIDDEN 512

/* lnormd on tcp://127.0.0.1:0 with one CPU thread and extra arguments. */
static int start(td_daemon *d, const char *lnormd, const char *const *extra)
{
    const char *args[TD_MAX_ARGS] = {"--listen", "tcp://127.0.0.1:0", "--backend", "cpu", "--cpu-threads", "1"};
    int n = 6;
    for (int i = 0; extra[i] && n < TD_MAX_ARGS - 1; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    if (td_start(d, lnormd, NULL, args, 0) != 0) {
        CHECK_FAIL("lnormd did not start");
        return -1;
    }
    return 0;
}

/* A raw SP/TCP REQ peer connected to url (receive buffer rcvbuf bytes
 * when not 0), or -1 with the failure counted. */
static int connect_peer(const char *url, int rcvbuf)
{
    int fd = fw_tcp_connect(url);
    if (fd >= 0 && rcvbuf)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    if (fd < 0 || fw_sp_handshake(fd, 5000) != 0) {
        CHECK_FAIL("connect to %s", url);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* The drain ended with every reply written out, not by its timeout. */
static void check_drained(const td_daemon *d)
{
    CHECK(!td_log_contains(d, "drain timeout"), "lnormd hit its drain timeout");
    CHECK(td_log_contains(d, "drained: every request received was answered"),
          "lnormd's log does not show the drain ending with every reply written out");
}

/* ---- under load ----------------------------------------------------------- */

typedef struct slot {
    int used;
    uint32_t id;
    int op;
    float *x;
    int64_t sent_ms;
} slot;

typedef struct client {
    pthread_t th;
    int index;
    long ok, unavailable, wrong, late_unanswered, lost, hung;
    long after_signal; /* replies that arrived after SIGTERM */
    char problem[256];
} client;

/* Written this long before SIGTERM, a request is in lnormd's hands. */
#define IN_HAND_MS 200

static const char *g_url;
static atomic_llong g_sig_ms; /* 0 until SIGTERM is sent */

static void problem(client *c, const char *what)
{
    if (!c->problem[0])
        snprintf(c->problem, sizeof c->problem, "%s", what);
}

/* A request of slot s is done (answered at now, or never when now < 0). */
static void settle(client *c, slot *s, int64_t now)
{
    int64_t sig = atomic_load(&g_sig_ms);
    if (sig && now >= sig)
        c->after_signal++;
    if (now < 0) {
        if (!sig || s->sent_ms <= sig - IN_HAND_MS) {
            c->lost++;
            char m[128];
            snprintf(m, sizeof m, "request %u written %lld ms before SIGTERM got no reply", s->id,
                     (long long)(sig ? sig - s->sent_ms : -1));
            problem(c, m);
        } else {
            c->late_unanswered++;
        }
    }
    free(s->x);
    memset(s, 0, sizeof *s);
}

static void *client_main(void *arg)
{
    client *c = arg;
    slot sl[DEPTH];
    memset(sl, 0, sizeof sl);
    int fd = connect_peer(g_url, 0);
    if (fd < 0)
        return NULL;
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    uint32_t next = 1;
    int open = 1;
    int64_t last_activity = td_now_ms();
    while (open) {
        /* Fill the window. */
        for (int i = 0; i < DEPTH && open; i++) {
            if (sl[i].used)
                continue;
            size_t len;
            int op = (next & 1) ? LNORM__V1__OP__OP_LAYER_NORM : LNORM__V1__OP__OP_RMS_NORM;
            float *x;
            uint8_t *buf = fw_pack_norm(next, op, ROWS, HIDDEN, next * 7u + (uint32_t)c->index, &x, &len);
            int sent = fw_sp_send(fd, next, buf, len) == 0;
            free(buf);
            if (!sent) { /* not fully written: not counted as sent */
                free(x);
                open = 0;
                break;
            }
            sl[i] = (slot){1, next++, op, x, td_now_ms()};
        }
        if (!open)
            break;
        uint32_t id;
        uint8_t *body;
        size_t blen;
        int r = fw_sp_recv(fd, &id, &body, &blen, 200);
        if (r == 1) {
            if (td_now_ms() - last_activity > 15000) {
                c->hung++;
                problem(c, "no reply and no close for 15 s");
                break;
            }
            continue;
        }
        if (r < 0)
            break;
        int64_t now = last_activity = td_now_ms();
        int k = -1;
        for (int i = 0; i < DEPTH; i++)
            if (sl[i].used && sl[i].id == id)
                k = i;
        Lnorm__V1__Response *resp = fw_unpack(body, blen);
        free(body);
        char why[200];
        if (k < 0 || !resp) {
            c->wrong++;
            problem(c, k < 0 ? "reply to an unknown request id" : "undecodable reply");
        } else if (resp->status && resp->status->code == LNORM__V1__CODE__UNAVAILABLE) {
            c->unavailable++;
        } else if (fw_check_norm(resp, sl[k].op, ROWS, HIDDEN, sl[k].x, why, sizeof why) == 0) {
            c->ok++;
        } else {
            c->wrong++;
            problem(c, why);
        }
        if (k >= 0)
            settle(c, &sl[k], now);
        if (resp)
            lnorm__v1__response__free_unpacked(resp, NULL);
    }
    close(fd);
    for (int i = 0; i < DEPTH; i++)
        if (sl[i].used)
            settle(c, &sl[i], -1);
    return NULL;
}

static int read_replies(int fd, int n, uint64_t rows, uint64_t hidden, float **x, int timeout_ms, int *closed);

static int under_load_main(const char *lnormd)
{
    static const char *const extra[] = {"--drain-timeout-ms", "5000", NULL};
    td_daemon d;
    if (start(&d, lnormd, extra) != 0)
        return 1;
    g_url = d.tcp_url;
    enum { HOLD_ROWS = 4096, HOLD_HIDDEN = 1024, HOLD_MS = 500 };
    float *hx = NULL;
    size_t hlen;
    uint8_t *hreq = fw_pack_norm(1, LNORM__V1__OP__OP_LAYER_NORM, HOLD_ROWS, HOLD_HIDDEN, 99, &hx, &hlen);
    int hfd = connect_peer(g_url, 65536);
    CHECK(hfd >= 0 && fw_sp_send(hfd, 0x80000001u, hreq, hlen) == 0, "the holding peer's request was not sent");
    double got = td_wait_metric(&d, "lnormd_received_bytes_total", (double)hlen, 20000);
    CHECK(got == (double)hlen, "lnormd received %.0f of the holding request's %zu bytes", got, hlen);
    atomic_init(&g_sig_ms, 0);
    static client cl[NCLIENTS];
    for (int i = 0; i < NCLIENTS; i++) {
        cl[i].index = i;
        pthread_create(&cl[i].th, NULL, client_main, &cl[i]);
    }
    td_sleep_ms(1500);
    atomic_store(&g_sig_ms, td_now_ms());
    int64_t t0 = td_now_ms();
    td_signal(&d, SIGTERM);
    td_sleep_ms(HOLD_MS);
    int closed = 0, held = hfd >= 0 ? read_replies(hfd, 1, HOLD_ROWS, HOLD_HIDDEN, &hx, 20000, &closed) : -1;
    CHECK(held == 1, "the reply in transit at SIGTERM was %s", held < 0 ? "never sent" : "cut off");
    int status = td_stop(&d, 0, 15000);
    int64_t exit_ms = td_now_ms() - t0;
    long ok = 0, unav = 0, wrong = 0, late = 0, lost = 0, hung = 0, after = 0;
    for (int i = 0; i < NCLIENTS; i++) {
        pthread_join(cl[i].th, NULL);
        ok += cl[i].ok;
        unav += cl[i].unavailable;
        wrong += cl[i].wrong;
        late += cl[i].late_unanswered;
        lost += cl[i].lost;
        hung += cl[i].hung;
        after += cl[i].after_signal;
        if (cl[i].problem[0])
            fprintf(stderr, "client %d: %s\n", i, cl[i].problem);
    }
    printf("sigterm: lnormd exited %lld ms after SIGTERM; replies: %ld ok, %ld unavailable, %ld wrong, %ld of them "
           "after SIGTERM; unanswered at close: %ld written less than %d ms before SIGTERM or after it, %ld "
           "written earlier (lost); %ld hung\n",
           (long long)exit_ms, ok, unav, wrong, after, late, IN_HAND_MS, lost, hung);
    td_check_exit0(&d, status, "on SIGTERM under load");
    CHECK(td_log_contains(&d, "SIGTERM: draining"), "lnormd's log does not show a drain starting at SIGTERM");
    check_drained(&d);
    CHECK(unav >= 1, "no request was answered UNAVAILABLE: the requests sent during the drain were dropped");
    if (hfd >= 0)
        close(hfd);
    free(hreq);
    free(hx);
    CHECK_EQ_INT(lost, 0, "requests in lnormd's hands at SIGTERM that got no reply");
    CHECK_EQ_INT(hung, 0, "clients left hanging");
    CHECK(ok >= 50, "only %ld correct replies: the load was not real", ok);
    CHECK_EQ_INT(wrong, 0, "wrong replies");
    return check_finish("fault.sigterm_under_load");
}

/* ---- one request, replies checked ----------------------------------------- */

/* Read replies until n arrived or the connection ends; each must be a
 * correct OK reply of (rows, hidden, x[k]). Returns the replies read, or -1
 * when one did not come within timeout_ms on a live connection. */
static int read_replies(int fd, int n, uint64_t rows, uint64_t hidden, float **x, int timeout_ms, int *closed)
{
    *closed = 0;
    for (int k = 0; k < n; k++) {
        uint32_t id;
        uint8_t *body = NULL;
        size_t len = 0;
        int rv = fw_sp_recv(fd, &id, &body, &len, timeout_ms);
        if (rv == 1)
            return -1;
        if (rv < 0) {
            *closed = 1;
            return k;
        }
        Lnorm__V1__Response *r = fw_unpack(body, len);
        char why[256] = "not a Response";
        int idx = (int)(id & 0x7fffffffu) - 1;
        CHECK(r && idx >= 0 && idx < n &&
                  fw_check_norm(r, LNORM__V1__OP__OP_LAYER_NORM, rows, hidden, x[idx], why, sizeof why) == 0,
              "reply %d (id %u): %s", k, id, why);
        if (r)
            lnorm__v1__response__free_unpacked(r, NULL);
        free(body);
    }
    return n;
}

/* One request of rows x hidden, SIGTERM once lnormd has it in hand; the
 * peer reads nothing for read_after_ms, then the reply must be whole and
 * right, within within_ms of the signal, and the drain must end cleanly. */
static int one_request_main(const char *lnormd, const char *name, const char *const *extra, int rows, int hidden,
                            int read_after_ms, int within_ms)
{
    td_daemon d;
    if (start(&d, lnormd, extra) != 0)
        return 1;
    float *x = NULL;
    size_t len;
    uint8_t *req = fw_pack_norm(1, LNORM__V1__OP__OP_LAYER_NORM, (uint64_t)rows, (uint64_t)hidden, 77, &x, &len);
    int fd = connect_peer(d.tcp_url, 0);
    if (fd >= 0) {
        CHECK(fw_sp_send(fd, 0x80000001u, req, len) == 0, "send");
        double got_bytes = td_wait_metric(&d, "lnormd_received_bytes_total", (double)len, 20000);
        CHECK(got_bytes == (double)len, "lnormd received %.0f of the request's %zu bytes", got_bytes, len);
        int64_t t0 = td_now_ms();
        td_signal(&d, SIGTERM);
        td_sleep_ms(read_after_ms);
        int closed = 0;
        int got = read_replies(fd, 1, (uint64_t)rows, (uint64_t)hidden, &x, 20000, &closed);
        int64_t dt = td_now_ms() - t0;
        printf("%s: %d of 1 reply of %zu bytes, %lld ms after SIGTERM%s\n", name, got, (size_t)rows * hidden * 4,
               (long long)dt, closed ? " (then the connection closed)" : "");
        CHECK(got == 1, "the request in hand at SIGTERM was %s", got < 0 ? "never answered" : "cut off");
        CHECK(dt < within_ms, "the reply came %lld ms after SIGTERM (want < %d)", (long long)dt, within_ms);
        close(fd);
    }
    td_check_exit0(&d, td_stop(&d, 0, 20000), "after SIGTERM");
    check_drained(&d);
    free(req);
    free(x);
    return check_finish(name);
}

static int send_timeout_main(const char *lnormd)
{
    static const char *const extra[] = {"--send-timeout-ms", "300", NULL};
    td_daemon d;
    if (start(&d, lnormd, extra) != 0)
        return 1;
    enum { R = 4096, H = 1024 };
    float *x[2] = {NULL, NULL};
    size_t len[2];
    uint8_t *req[2];
    for (int k = 0; k < 2; k++)
        req[k] = fw_pack_norm((uint64_t)k + 1, LNORM__V1__OP__OP_LAYER_NORM, R, H, 90 + (uint32_t)k, &x[k], &len[k]);
    int fd = connect_peer(d.tcp_url, 65536);
    if (fd >= 0) {
        for (int k = 0; k < 2; k++)
            CHECK(fw_sp_send(fd, 0x80000001u + (uint32_t)k, req[k], len[k]) == 0, "send %d", k);
        td_sleep_ms(2000);
        int closed = 0;
        int got = read_replies(fd, 2, R, H, x, 8000, &closed);
        printf("send_timeout: %d of 2 replies, connection %s\n", got, closed ? "closed by lnormd" : "open");
        CHECK(got == 2 || (got >= 0 && closed),
              "a reply was dropped on a live connection: the peer waited 8 s for it (%d of 2 arrived)", got);
        close(fd);
    }
    /* still serving */
    int fd2 = connect_peer(d.tcp_url, 0);
    int ok = 0;
    if (fd2 >= 0 && fw_sp_send(fd2, 0x80000001u, req[0], len[0]) == 0) {
        int closed = 0;
        ok = read_replies(fd2, 1, R, H, x, 10000, &closed) == 1;
    }
    CHECK(ok, "lnormd does not serve a new connection after the lost reply");
    if (fd2 >= 0)
        close(fd2);
    td_stop_check(&d, "after a send timeout, on SIGTERM");
    for (int k = 0; k < 2; k++) {
        free(req[k]);
        free(x[k]);
    }
    return check_finish("fault.send_timeout");
}

int main(int argc, char **argv)
{
    static const char *const large[] = {"--drain-timeout-ms", "20000", NULL};
    static const char *const delay[] = {"--max-queue-delay-us", "10000000", "--drain-timeout-ms", "5000", NULL};
    signal(SIGPIPE, SIG_IGN);
    if (argc == 2)
        return under_load_main(argv[1]);
    if (argc == 3 && !strcmp(argv[2], "large_reply")) /* the reply is handed to NNG; nobody reads for 3 s */
        return one_request_main(argv[1], "fault.sigterm_large_reply", large, 4000, 4096, 3000, 20000);
    if (argc == 3 && !strcmp(argv[2], "drain_delay")) /* queued, waiting 10 s for companions */
        return one_request_main(argv[1], "fault.sigterm_queue_delay", delay, 8, 256, 0, 3000);
    if (argc == 3 && !strcmp(argv[2], "send_timeout"))
        return send_timeout_main(argv[1]);
    fprintf(stderr, "usage: %s LNORMD [large_reply|send_timeout|drain_delay]\n", argv[0]);
    return 2;
}
