/*
 * fault.sigterm_under_load: SIGTERM while 6 clients keep lnormd busy.
 *
 *   fault_sigterm LNORMD
 *
 * Each client is a raw SP/TCP REQ peer (wire.h) keeping 4 requests of
 * 64 x 512 f32 in flight, so it knows exactly which requests it wrote and
 * which were answered. After 1.5 s of load lnormd gets SIGTERM. Checks:
 *  - lnormd exits 0 within 15 s;
 *  - every reply is a correct OK result or UNAVAILABLE (shutting down);
 *  - every request written at least 200 ms before the signal was answered:
 *    zero lost (lnormd had it in hand, so draining must answer it);
 *  - requests written later are answered or see the connection closed (a
 *    definite error): none hangs (each client gives up after 15 s of
 *    silence, which fails the test);
 *  - the load was real (at least 50 correct replies).
 *
 *   fault_sigterm LNORMD large_reply     (fault.sigterm_large_reply)
 *
 * One raw SP/TCP peer sends a request of 4000 x 4096 f32 (a 65.5 MB
 * reply), lnormd gets SIGTERM 50 ms later, and the peer reads nothing for
 * 3 s: the reply is handed to NNG long before the connection can carry it.
 * Checks: the whole reply arrives and is right (NNG completes a send when
 * the pipe takes it; lnormd used to close the socket then, cutting the
 * reply off), and lnormd exits 0 without a drain timeout.
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
 * --send-timeout-ms 300; one raw peer pipelines two requests of
 * 4096 x 1024 f32 (16 MiB replies) on one connection with a 64 KiB
 * receive buffer and reads nothing for 2 s. The second reply times out in
 * rep0's queue behind the first. Checks: the peer is not left waiting on a
 * live connection for a reply that will never come: it gets both replies,
 * or the server closes the connection (it used to drop the reply and keep
 * the connection open); lnormd serves a new connection after.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "wire.h"

#define NCLIENTS 6
#define DEPTH 4
#define ROWS 64
#define HIDDEN 512

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
    long ok, unavailable, wrong, closed_unanswered, lost, hung;
    int64_t unanswered_sent_ms[DEPTH];
    int nunanswered;
    char problem[256];
} client;

static const char *g_url;
static atomic_llong g_sig_ms; /* 0 until SIGTERM is sent */

static void problem(client *c, const char *fmt, const char *a)
{
    if (!c->problem[0])
        snprintf(c->problem, sizeof c->problem, fmt, a);
}

static void *client_main(void *arg)
{
    client *c = arg;
    slot sl[DEPTH];
    memset(sl, 0, sizeof sl);
    int fd = fw_tcp_connect(g_url);
    if (fd < 0 || fw_sp_handshake(fd, 5000) != 0) {
        problem(c, "%s", "connect/handshake failed");
        c->wrong++;
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    uint32_t next = 1;
    int open = 1;
    int64_t last_activity = fh_now_ms();
    while (open) {
        /* Fill the window. */
        for (int i = 0; i < DEPTH && open; i++) {
            if (sl[i].used)
                continue;
            size_t len;
            int op = (next & 1) ? LNORM__V1__OP__OP_LAYER_NORM : LNORM__V1__OP__OP_RMS_NORM;
            uint8_t *buf = fw_pack_norm(next, op, ROWS, HIDDEN, next * 7u + (uint32_t)c->index,
                                        &sl[i].x, &len);
            if (fw_sp_send(fd, next, buf, len) != 0) {
                free(buf);
                free(sl[i].x);
                sl[i].x = NULL;
                open = 0; /* not fully written: not counted as sent */
                break;
            }
            free(buf);
            sl[i].used = 1;
            sl[i].id = next++;
            sl[i].op = op;
            sl[i].sent_ms = fh_now_ms();
        }
        if (!open)
            break;
        uint32_t id;
        uint8_t *body;
        size_t blen;
        int r = fw_sp_recv(fd, &id, &body, &blen, 200);
        if (r == 1) {
            if (fh_now_ms() - last_activity > 15000) {
                c->hung++;
                problem(c, "%s", "no reply and no close for 15 s");
                break;
            }
            continue;
        }
        if (r < 0)
            break;
        last_activity = fh_now_ms();
        int k = -1;
        for (int i = 0; i < DEPTH; i++)
            if (sl[i].used && sl[i].id == id)
                k = i;
        Lnorm__V1__Response *resp = fw_unpack(body, blen);
        free(body);
        if (k < 0 || !resp) {
            c->wrong++;
            problem(c, "%s", k < 0 ? "reply to an unknown request id" : "undecodable reply");
        } else {
            char why[200];
            if (resp->status && resp->status->code == LNORM__V1__CODE__UNAVAILABLE)
                c->unavailable++;
            else if (fw_check_norm(resp, sl[k].op, ROWS, HIDDEN, sl[k].x, why, sizeof why) == 0)
                c->ok++;
            else {
                c->wrong++;
                problem(c, "%s", why);
            }
            free(sl[k].x);
            sl[k].x = NULL;
            sl[k].used = 0;
        }
        if (resp)
            lnorm__v1__response__free_unpacked(resp, NULL);
    }
    close(fd);
    int64_t sig = atomic_load(&g_sig_ms);
    for (int i = 0; i < DEPTH; i++) {
        if (!sl[i].used)
            continue;
        if (sig == 0 || sl[i].sent_ms < sig - 200) {
            c->lost++;
            char m[96];
            snprintf(m, sizeof m, "request %u written %lld ms before SIGTERM got no reply", sl[i].id,
                     (long long)(sig ? sig - sl[i].sent_ms : -1));
            problem(c, "%s", m);
        } else {
            c->closed_unanswered++;
        }
        free(sl[i].x);
    }
    return NULL;
}

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
        FH_CHECK(r && idx >= 0 && idx < n && fw_check_norm(r, LNORM__V1__OP__OP_LAYER_NORM, rows, hidden, x[idx], why,
                                                           sizeof why) == 0,
                 "reply %d (id %u): %s", k, id, why);
        if (r)
            lnorm__v1__response__free_unpacked(r, NULL);
        free(body);
    }
    return n;
}

static int large_reply_main(const char *lnormd)
{
    char dir[256];
    if (fh_mkdtemp(dir, sizeof dir, "sigterm-large") != 0)
        return 1;
    const char *args[] = {"--listen", "tcp://127.0.0.1:0", "--backend", "cpu", "--cpu-threads", "1",
                          "--drain-timeout-ms", "20000", NULL};
    fh_daemon d;
    if (fh_daemon_start(&d, lnormd, dir, args, 15000) != 0) {
        fh_rmdir(dir);
        return 1;
    }
    enum { R = 4000, H = 4096 };
    float *x = NULL;
    size_t len;
    uint8_t *req = fw_pack_norm(1, LNORM__V1__OP__OP_LAYER_NORM, R, H, 77, &x, &len);
    int fd = fw_tcp_connect(fh_daemon_url(&d, "tcp://"));
    FH_CHECK(fd >= 0 && fw_sp_handshake(fd, 5000) == 0, "connect");
    if (fd >= 0) {
        FH_CHECK(fw_sp_send(fd, 0x80000001u, req, len) == 0, "send");
        fh_sleep_ms(50);
        kill(d.pid, SIGTERM);
        fh_sleep_ms(3000); /* the reply is computed and handed to NNG; nobody reads */
        int closed = 0;
        int got = read_replies(fd, 1, R, H, &x, 20000, &closed);
        printf("sigterm_large_reply: %d of 1 reply of %d MB arrived%s\n", got, (int)((size_t)R * H * 4 >> 20),
               closed ? " (then the connection closed)" : "");
        FH_CHECK(got == 1, "the reply in hand at SIGTERM was %s", got < 0 ? "never sent" : "cut off");
        close(fd);
    }
    int status = fh_daemon_stop(&d, 0, 20000);
    fh_check_exit0(&d, status, "after SIGTERM with a large reply in flight");
    char line[512];
    FILE *lf = fopen(d.log, "r");
    while (lf && fgets(line, sizeof line, lf))
        FH_CHECK(!strstr(line, "drain timeout"), "lnormd hit its drain timeout: %s", line);
    if (lf)
        fclose(lf);
    if (fh_failures)
        fh_daemon_dump_log(&d);
    free(req);
    free(x);
    fh_rmdir(dir);
    return fh_finish("fault.sigterm_large_reply");
}

static int drain_delay_main(const char *lnormd)
{
    char dir[256];
    if (fh_mkdtemp(dir, sizeof dir, "drain-delay") != 0)
        return 1;
    const char *args[] = {"--listen", "tcp://127.0.0.1:0", "--backend", "cpu", "--cpu-threads", "1",
                          "--max-queue-delay-us", "10000000", "--drain-timeout-ms", "5000", NULL};
    fh_daemon d;
    if (fh_daemon_start(&d, lnormd, dir, args, 15000) != 0) {
        fh_rmdir(dir);
        return 1;
    }
    enum { R = 8, H = 256 };
    float *x = NULL;
    size_t len;
    uint8_t *req = fw_pack_norm(1, LNORM__V1__OP__OP_LAYER_NORM, R, H, 5, &x, &len);
    int fd = fw_tcp_connect(fh_daemon_url(&d, "tcp://"));
    FH_CHECK(fd >= 0 && fw_sp_handshake(fd, 5000) == 0, "connect");
    if (fd >= 0) {
        FH_CHECK(fw_sp_send(fd, 0x80000001u, req, len) == 0, "send");
        fh_sleep_ms(200); /* queued, waiting for companions */
        int64_t t0 = fh_now_ms();
        kill(d.pid, SIGTERM);
        int closed = 0;
        int got = read_replies(fd, 1, R, H, &x, 10000, &closed);
        int64_t dt = fh_now_ms() - t0;
        printf("sigterm_queue_delay: %d of 1 reply, %lld ms after SIGTERM\n", got, (long long)dt);
        FH_CHECK(got == 1 && dt < 3000, "the queued request was %s %lld ms after SIGTERM",
                 got == 1 ? "answered only" : "not answered", (long long)dt);
        close(fd);
    }
    int status = fh_daemon_stop(&d, 0, 20000);
    fh_check_exit0(&d, status, "after SIGTERM with a request waiting for its batch");
    char line[512];
    FILE *lf = fopen(d.log, "r");
    while (lf && fgets(line, sizeof line, lf))
        FH_CHECK(!strstr(line, "drain timeout"), "lnormd hit its drain timeout: %s", line);
    if (lf)
        fclose(lf);
    if (fh_failures)
        fh_daemon_dump_log(&d);
    free(req);
    free(x);
    fh_rmdir(dir);
    return fh_finish("fault.sigterm_queue_delay");
}

static int send_timeout_main(const char *lnormd)
{
    char dir[256];
    if (fh_mkdtemp(dir, sizeof dir, "send-timeout") != 0)
        return 1;
    const char *args[] = {"--listen", "tcp://127.0.0.1:0", "--backend", "cpu", "--cpu-threads", "1",
                          "--send-timeout-ms", "300", NULL};
    fh_daemon d;
    if (fh_daemon_start(&d, lnormd, dir, args, 15000) != 0) {
        fh_rmdir(dir);
        return 1;
    }
    enum { R = 4096, H = 1024 };
    float *x[2] = {NULL, NULL};
    size_t len[2];
    uint8_t *req[2];
    for (int k = 0; k < 2; k++)
        req[k] = fw_pack_norm((uint64_t)k + 1, LNORM__V1__OP__OP_LAYER_NORM, R, H, 90 + (uint32_t)k, &x[k], &len[k]);
    const char *url = fh_daemon_url(&d, "tcp://");
    int fd = fw_tcp_connect(url);
    int small = 65536;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    FH_CHECK(fd >= 0 && fw_sp_handshake(fd, 5000) == 0, "connect");
    if (fd >= 0) {
        for (int k = 0; k < 2; k++)
            FH_CHECK(fw_sp_send(fd, 0x80000001u + (uint32_t)k, req[k], len[k]) == 0, "send %d", k);
        fh_sleep_ms(2000);
        int closed = 0;
        int got = read_replies(fd, 2, R, H, x, 8000, &closed);
        printf("send_timeout: %d of 2 replies, connection %s\n", got, closed ? "closed by lnormd" : "open");
        FH_CHECK(got == 2 || (got >= 0 && closed),
                 "a reply was dropped on a live connection: the peer waited 8 s for it (%d of 2 arrived)", got);
        close(fd);
    }
    /* still serving */
    int fd2 = fw_tcp_connect(url);
    int ok = 0;
    if (fd2 >= 0 && fw_sp_handshake(fd2, 5000) == 0 && fw_sp_send(fd2, 0x80000001u, req[0], len[0]) == 0) {
        int closed = 0;
        ok = read_replies(fd2, 1, R, H, x, 10000, &closed) == 1;
    }
    FH_CHECK(ok, "lnormd does not serve a new connection after the lost reply");
    if (fd2 >= 0)
        close(fd2);
    int status = fh_daemon_stop(&d, SIGTERM, 15000);
    fh_check_exit0(&d, status, "after a send timeout");
    if (fh_failures)
        fh_daemon_dump_log(&d);
    for (int k = 0; k < 2; k++) {
        free(req[k]);
        free(x[k]);
    }
    fh_rmdir(dir);
    return fh_finish("fault.send_timeout");
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc == 3 && !strcmp(argv[2], "large_reply"))
        return large_reply_main(argv[1]);
    if (argc == 3 && !strcmp(argv[2], "send_timeout"))
        return send_timeout_main(argv[1]);
    if (argc == 3 && !strcmp(argv[2], "drain_delay"))
        return drain_delay_main(argv[1]);
    if (argc != 2) {
        fprintf(stderr, "usage: %s LNORMD [large_reply|send_timeout|drain_delay]\n", argv[0]);
        return 2;
    }
    char dir[256];
    if (fh_mkdtemp(dir, sizeof dir, "sigterm") != 0)
        return 1;
    const char *args[] = {"--listen", "tcp://127.0.0.1:0", "--backend", "cpu", "--cpu-threads", "1",
                          "--drain-timeout-ms", "5000", NULL};
    fh_daemon d;
    if (fh_daemon_start(&d, argv[1], dir, args, 15000) != 0) {
        fh_rmdir(dir);
        return 1;
    }
    g_url = fh_daemon_url(&d, "tcp://");
    atomic_init(&g_sig_ms, 0);
    static client cl[NCLIENTS];
    for (int i = 0; i < NCLIENTS; i++) {
        cl[i].index = i;
        pthread_create(&cl[i].th, NULL, client_main, &cl[i]);
    }
    fh_sleep_ms(1500);
    atomic_store(&g_sig_ms, fh_now_ms());
    int64_t t0 = fh_now_ms();
    int status = fh_daemon_stop(&d, SIGTERM, 15000);
    int64_t exit_ms = fh_now_ms() - t0;
    long ok = 0, unav = 0, wrong = 0, closed = 0, lost = 0, hung = 0;
    for (int i = 0; i < NCLIENTS; i++) {
        pthread_join(cl[i].th, NULL);
        ok += cl[i].ok;
        unav += cl[i].unavailable;
        wrong += cl[i].wrong;
        closed += cl[i].closed_unanswered;
        lost += cl[i].lost;
        hung += cl[i].hung;
        if (cl[i].problem[0])
            fprintf(stderr, "client %d: %s\n", i, cl[i].problem);
    }
    printf("sigterm: lnormd exited in %lld ms (wait status %d); replies: %ld ok, %ld unavailable, "
           "%ld wrong; unanswered at close: %ld written after SIGTERM-200ms, %ld lost; %ld hung\n",
           (long long)exit_ms, status, ok, unav, wrong, closed, lost, hung);
    fh_check_exit0(&d, status, "on SIGTERM under load");
    FH_CHECK(ok >= 50, "only %ld correct replies: the load was not real", ok);
    FH_CHECK(wrong == 0, "%ld wrong replies", wrong);
    FH_CHECK(lost == 0, "%ld requests lost", lost);
    FH_CHECK(hung == 0, "%ld clients hung", hung);
    /* lnormd logs a drain timeout when it exits with requests in flight,
     * i.e. it dropped requests it had accepted. */
    char line[512];
    FILE *lf = fopen(d.log, "r");
    while (lf && fgets(line, sizeof line, lf))
        FH_CHECK(!strstr(line, "drain timeout"), "lnormd dropped accepted requests: %s", line);
    if (lf)
        fclose(lf);
    if (fh_failures)
        fh_daemon_dump_log(&d);
    fh_rmdir(dir);
    return fh_finish("fault.sigterm_under_load");
}
