/*
 * fault.kill9_restart: lnormd killed with SIGKILL and restarted on the same
 * ipc path while clients keep sending.
 *
 *   fault_restart LNORMD
 *
 * First, before any lnormd: a raw listener on the path accepts each
 * connection and closes it unread for 500 ms, as a killed lnormd can (the
 * kernel releases a killed process's connections before its listening
 * socket, so a client that redials at once may connect just before the
 * listener goes away). libnng 1.5.2's dialer then fails writing the SP
 * header with EPIPE (NNG_ECLOSED) and never dials again. A liblnorm client
 * and a plain NNG client opened during that time must each get a reply
 * from the lnormd started afterwards (liblnorm replaces a dialer that has
 * not connected for redial_ms; the plain client replaces its own after a
 * send that found no connection for 2 s).
 * Then three clients loop on normalize requests (64 x 1024 f32) over
 * ipc://DIR/lnormd.sock: a plain NNG REQ socket (redial every 50 ms),
 * liblnorm with its defaults (plus short reconnect times), and liblnorm
 * with resend_ms = 2000. None uses NNG's REQ resend: the plain client
 * resends on its own, as liblnorm does, after its connection dropped or
 * 2 s without a reply, within 15 s per request. The liblnorm ones send
 * back to back, so calls are in flight when lnormd is killed.
 * lnormd is killed with SIGKILL after 1 s, the socket file is left behind
 * (stale), and a new lnormd is started on the same path 500 ms later.
 * Checks: lnormd starts despite the stale socket file (both times); every
 * client's requests, including those sent while no server was up, all
 * succeed with correct results (the clients resend the ones lost with the
 * old connection); each client completes requests after the restart.
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "check.h"
#include "testclient.h"
#include "testdaemon.h"
#include "lnorm/lnorm.h"
#include "wire.h"

#define ROWS 64
#define HIDDEN 1024

static char g_url[400];
static atomic_int g_stop;
static atomic_llong g_restart_ms; /* when the new lnormd was ready (0: not yet) */

typedef struct cstats {
    atomic_long ok; /* (read by main while the client runs) */
    long failed, ok_after_restart, resends, redials;
    char problem[512];
} cstats;

/* The plain client's socket: NNG's REQ resend off, 2 s send and receive
 * timeouts, redial every 50 ms; *d its dialer. */
static int plain_open(nng_socket *s, nng_dialer *d)
{
    int rv = nng_req0_open(s);
    if (rv)
        return rv;
    if ((rv = nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = nng_socket_set_ms(*s, NNG_OPT_RECVTIMEO, 2000)) != 0 ||
        (rv = nng_socket_set_ms(*s, NNG_OPT_SENDTIMEO, 2000)) != 0 ||
        (rv = nng_socket_set_ms(*s, NNG_OPT_RECONNMINT, 50)) != 0 ||
        (rv = nng_socket_set_ms(*s, NNG_OPT_RECONNMAXT, 50)) != 0 ||
        (rv = nng_socket_set_size(*s, NNG_OPT_RECVMAXSZ, 0)) != 0 ||
        (rv = nng_dial(*s, g_url, d, NNG_FLAG_NONBLOCK)) != 0)
        nng_close(*s);
    return rv;
}

/* One exchange on the plain socket, within 15 s: sent again after its
 * connection dropped or 2 s without a reply; a send that finds no
 * connection for 2 s replaces the dialer first (libnng 1.5.2's dialer
 * stops for good after a connect that fails with EPIPE, see
 * dead_dialer_check). */
static int nng_call_resend(nng_socket s, nng_dialer *d, const uint8_t *buf, size_t len,
                           Lnorm__V1__Response **r, cstats *st)
{
    int64_t end = td_now_ms() + 15000;
    int rv;
    *r = NULL;
    do {
        if ((rv = nng_send(s, (void *)buf, len, 0)) == NNG_ETIMEDOUT) {
            nng_dialer_close(*d);
            nng_dial(s, g_url, d, NNG_FLAG_NONBLOCK);
            st->redials++;
            continue;
        }
        void *rbuf = NULL;
        size_t rlen = 0;
        if (rv == 0 && (rv = nng_recv(s, &rbuf, &rlen, NNG_FLAG_ALLOC)) == 0) {
            *r = fw_unpack(rbuf, rlen);
            nng_free(rbuf, rlen);
            return *r ? 0 : -1;
        }
        if (rv != NNG_ETIMEDOUT && rv != NNG_ECONNRESET && rv != NNG_ECONNSHUT)
            return rv;
        st->resends++;
    } while (td_now_ms() < end);
    return rv;
}

/* Count one request of a client: ok (after the restart too, once there
 * was one), or failed, the first failure's problem kept. */
static void tally(cstats *st, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void tally(cstats *st, int ok, const char *fmt, ...)
{
    if (ok) {
        st->ok++;
        if (atomic_load(&g_restart_ms))
            st->ok_after_restart++;
        return;
    }
    st->failed++;
    if (!st->problem[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(st->problem, sizeof st->problem, fmt, ap);
        va_end(ap);
    }
}

static void *nng_client(void *arg)
{
    cstats *st = arg;
    nng_socket s;
    nng_dialer d;
    int rv = plain_open(&s, &d);
    if (rv) {
        st->failed++;
        snprintf(st->problem, sizeof st->problem, "open: %s", nng_strerror(rv));
        return NULL;
    }
    for (uint32_t i = 0; !atomic_load(&g_stop); i++) {
        float *x;
        size_t len;
        int op = i & 1 ? LNORM__V1__OP__OP_RMS_NORM : LNORM__V1__OP__OP_LAYER_NORM;
        uint8_t *buf = fw_pack_norm(i, op, ROWS, HIDDEN, i, &x, &len);
        Lnorm__V1__Response *r = NULL;
        rv = nng_call_resend(s, &d, buf, len, &r, st);
        char why[200] = "";
        tally(st, rv == 0 && fw_check_norm(r, op, ROWS, HIDDEN, x, why, sizeof why) == 0, "request %u: %s", i,
              rv ? (rv > 0 ? nng_strerror(rv) : "bad reply") : why);
        if (r)
            lnorm__v1__response__free_unpacked(r, NULL);
        free(buf);
        free(x);
        td_sleep_ms(5);
    }
    nng_close(s);
    return NULL;
}

typedef struct lib_arg {
    cstats st;
    int resend_ms; /* liblnorm's resend_ms option */
} lib_arg;

static void *lib_client(void *arg)
{
    lib_arg *la = arg;
    cstats *st = &la->st;
    lnorm_client_opts o;
    lnorm_client_opts_init(&o);
    o.resend_ms = la->resend_ms;
    o.reconnect_min_ms = 50;
    o.reconnect_max_ms = 50;
    o.recv_timeout_ms = 20000;
    const char *url = g_url;
    lnorm_client *c;
    int rv = lnorm_client_open(&c, &url, 1, &o);
    if (rv != LNORM_OK) {
        st->failed++;
        snprintf(st->problem, sizeof st->problem, "lnorm_client_open: %s", lnorm_strerror(rv));
        return NULL;
    }
    float *x = malloc(ROWS * HIDDEN * sizeof *x), *y = malloc(ROWS * HIDDEN * sizeof *y);
    for (uint32_t i = 0; !atomic_load(&g_stop); i++) {
        for (int k = 0; k < ROWS * HIDDEN; k++)
            x[k] = (float)((k * 37 + (int)i * 11) % 101) / 25.0f - 2.0f;
        lnorm_normalize_req r;
        lnorm_normalize_req_init(&r, LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, ROWS, HIDDEN);
        r.x = x;
        r.y = y;
        lnorm_result res;
        rv = lnorm_normalize(c, &r, &res);
        /* Check row 0 against a float64 reference. */
        double mean = 0, var = 0, worst = 0;
        for (int k = 0; k < HIDDEN; k++)
            mean += x[k];
        mean /= HIDDEN;
        for (int k = 0; k < HIDDEN; k++)
            var += (x[k] - mean) * (x[k] - mean);
        double rstd = 1.0 / sqrt(var / HIDDEN + 1e-5);
        for (int k = 0; rv == LNORM_OK && k < HIDDEN; k++) {
            double e = fabs(y[k] - (x[k] - mean) * rstd);
            if (e > worst)
                worst = e;
        }
        tally(st, rv == LNORM_OK && worst < 1e-3, "liblnorm call %u: %s (%s), max error %g", i, lnorm_strerror(rv),
              res.message, worst);
    }
    free(x);
    free(y);
    lnorm_client_close(c);
    return NULL;
}

/* A client whose first connects reach a server that accepts and closes
 * before reading the SP header (what lnormd does when killed between
 * accepting and reading: the kernel releases a killed process's
 * connections before its listening socket): libnng 1.5.2's dialer gets
 * EPIPE (NNG_ECLOSED) and never dials again. Both client kinds must still
 * reach the lnormd started afterwards on the same path. */
typedef struct dead_dialer {
    int fd;              /* the raw listener */
    int accepted;
    lnorm_client *lib;   /* liblnorm, 50 ms reconnect, 8 s timeouts */
    nng_socket plain;
    nng_dialer plain_d;
    int plain_ok;
} dead_dialer;

static void dead_dialer_setup(dead_dialer *dd, const char *path)
{
    memset(dd, 0, sizeof *dd);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    CHECK(n < sizeof sa.sun_path, "socket path too long: %s", path);
    memcpy(sa.sun_path, path, n < sizeof sa.sun_path ? n : 0);
    dd->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(dd->fd >= 0 && bind(dd->fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(dd->fd, 16) == 0,
          "raw listener on %s", path);
    lnorm_client_opts o;
    tc_client_opts(&o, 8000, 50, 50);
    const char *url = g_url;
    CHECK(lnorm_client_open(&dd->lib, &url, 1, &o) == LNORM_OK, "liblnorm open");
    dd->plain_ok = plain_open(&dd->plain, &dd->plain_d) == 0;
    CHECK(dd->plain_ok, "plain NNG open");
    for (int64_t end = td_now_ms() + 500; td_now_ms() < end;) {
        struct pollfd p = {dd->fd, POLLIN, 0};
        if (poll(&p, 1, 20) == 1) {
            int a = accept(dd->fd, NULL, NULL);
            if (a >= 0) {
                close(a);
                dd->accepted++;
            }
        }
    }
    close(dd->fd); /* the socket file stays: stale */
    CHECK(dd->accepted > 0, "no client connected to the raw listener");
}

/* After lnormd is up on the path: one call of each client succeeds. */
static void dead_dialer_check(dead_dialer *dd)
{
    int64_t t0 = td_now_ms();
    int serving = 0;
    lnorm_result res;
    int rv = dd->lib ? lnorm_health(dd->lib, &serving, &res) : LNORM_EINVAL;
    CHECK(rv == LNORM_OK && serving, "liblnorm after connects closed unread: %s (%s)", lnorm_errname(rv),
          rv == LNORM_OK ? "" : res.message);
    int64_t t1 = td_now_ms();
    cstats st;
    memset(&st, 0, sizeof st);
    size_t len;
    uint8_t *buf = fw_pack_health(1, &len);
    Lnorm__V1__Response *r = NULL;
    rv = dd->plain_ok ? nng_call_resend(dd->plain, &dd->plain_d, buf, len, &r, &st) : -1;
    CHECK(rv == 0, "plain NNG client after connects closed unread: %s", rv > 0 ? nng_strerror(rv) : "no reply");
    printf("restart: %d connects closed unread, then liblnorm answered in %lld ms, the plain NNG client in "
           "%lld ms (%ld new dialer(s))\n",
           dd->accepted, (long long)(t1 - t0), (long long)(td_now_ms() - t1), st.redials);
    if (r)
        lnorm__v1__response__free_unpacked(r, NULL);
    free(buf);
    lnorm_client_close(dd->lib);
    if (dd->plain_ok)
        nng_close(dd->plain);
}

int main(int argc, char **argv)
{
    if (!td_usage(argc, argv, 2, "LNORMD"))
        return 2;
    char dir[256], sock[320];
    if (td_tmpdir(dir, sizeof dir, "restart") != 0)
        return 1;
    snprintf(sock, sizeof sock, "%s/lnormd.sock", dir);
    snprintf(g_url, sizeof g_url, "ipc://%s", sock);
    const char *args[] = {"--listen", g_url, "--backend", "cpu", "--cpu-threads", "1", NULL};
    dead_dialer dd;
    dead_dialer_setup(&dd, sock);
    td_daemon d;
    if (td_start(&d, argv[1], dir, args, 0) != 0)
        return 1;
    dead_dialer_check(&dd);
    atomic_init(&g_stop, 0);
    atomic_init(&g_restart_ms, 0);
    cstats a;
    lib_arg b, c;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    memset(&c, 0, sizeof c);
    c.resend_ms = 2000;
    pthread_t ta, tb, tc;
    pthread_create(&ta, NULL, nng_client, &a);
    pthread_create(&tb, NULL, lib_client, &b);
    pthread_create(&tc, NULL, lib_client, &c);
    td_sleep_ms(1000);

    long before = a.ok + b.st.ok + c.st.ok;
    int st = td_stop(&d, SIGKILL, 5000);
    CHECK(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "lnormd did not die of SIGKILL");
    struct stat sb;
    printf("restart: killed lnormd after %ld good requests; socket file %s\n", before,
           stat(sock, &sb) == 0 ? "left behind (stale)" : "gone");
    td_sleep_ms(500);
    int started = td_restart(&d) == 0;
    CHECK(started, "lnormd did not start again on %s after kill -9", g_url);
    if (started) {
        atomic_store(&g_restart_ms, td_now_ms());
        td_sleep_ms(2500);
    }
    atomic_store(&g_stop, 1);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_join(tc, NULL);
    printf("restart: nng client %ld ok (%ld after restart), %ld failed, %ld resend(s), %ld new dialer(s); liblnorm client (defaults) "
           "%ld ok (%ld after restart), %ld failed; liblnorm client (resend_ms 2000) %ld ok (%ld "
           "after restart), %ld failed\n",
           a.ok, a.ok_after_restart, a.failed, a.resends, a.redials, b.st.ok, b.st.ok_after_restart, b.st.failed, c.st.ok,
           c.st.ok_after_restart, c.st.failed);
    if (a.problem[0])
        fprintf(stderr, "nng client: %s\n", a.problem);
    if (b.st.problem[0])
        fprintf(stderr, "liblnorm client (defaults): %s\n", b.st.problem);
    if (c.st.problem[0])
        fprintf(stderr, "liblnorm client (resend_ms 2000): %s\n", c.st.problem);
    CHECK(a.failed == 0, "NNG client: requests failed across the restart");
    CHECK(c.st.failed == 0, "liblnorm (resend_ms 2000): requests failed across the restart");
    /* lnorm.h: resend_ms <= 0 (the default) never resends on a live
     * connection, "requests on a dropped connection are still resent
     * elsewhere". Hold the library to it. */
    CHECK(b.st.failed == 0,
          "liblnorm (default options): a request on the killed connection failed instead of "
          "being resent, contrary to lnorm.h's resend_ms contract");
    CHECK(a.ok_after_restart > 0 && b.st.ok_after_restart > 0 && c.st.ok_after_restart > 0,
          "a client made no progress after the restart");
    if (started)
        td_stop_check(&d, "restarted, on SIGTERM");
    return check_finish("fault.kill9_restart");
}
