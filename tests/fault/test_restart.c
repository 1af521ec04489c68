/*
 * fault.kill9_restart: lnormd killed with SIGKILL and restarted on the same
 * ipc path while clients keep sending.
 *
 *   fault_restart LNORMD
 *
 * Three clients loop on normalize requests (64 x 1024 f32) over
 * ipc://DIR/lnormd.sock: a plain NNG REQ socket (redial every 50 ms), liblnorm
 * with its defaults (plus short reconnect times), and liblnorm with
 * resend_ms = 2000. None uses NNG's REQ resend (libnng 1.5.2's resend path
 * can leave a request unsent across a restart): the plain client resends
 * on its own, as liblnorm does, after its connection dropped or 2 s without
 * a reply, within 15 s per request. The liblnorm ones send back to back, so
 * calls are in flight when lnormd is killed.
 * lnormd is killed with SIGKILL after 1 s, the socket file is left behind
 * (stale), and a new lnormd is started on the same path 500 ms later.
 * Checks: the new lnormd starts despite the stale socket file; every
 * client's requests, including those sent while no server was up, all
 * succeed with correct results (NNG redials, the clients resend the ones
 * lost with the old connection); each client completes requests after the
 * restart.
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "check.h"
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
    long failed, ok_after_restart, resends;
    char problem[512];
} cstats;

/* One exchange on the plain REQ socket (NNG's resend off, 2 s send and
 * receive timeouts), sent again after its connection dropped or 2 s
 * without a reply, for at most 15 s. */
static int nng_call_resend(nng_socket s, const uint8_t *buf, size_t len, Lnorm__V1__Response **r,
                           long *resends)
{
    int64_t end = td_now_ms() + 15000;
    for (;;) {
        int rv = fw_req_call(s, buf, len, r);
        if ((rv != NNG_ETIMEDOUT && rv != NNG_ECONNRESET && rv != NNG_ECONNSHUT) || td_now_ms() >= end)
            return rv;
        (*resends)++;
    }
}

static void *nng_client(void *arg)
{
    cstats *st = arg;
    nng_socket s;
    int rv = fw_req_open(&s, g_url, 2000, 50);
    if (rv == 0)
        rv = nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
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
        rv = nng_call_resend(s, buf, len, &r, &st->resends);
        char why[200] = "";
        if (rv == 0 && fw_check_norm(r, op, ROWS, HIDDEN, x, why, sizeof why) == 0) {
            st->ok++;
            if (atomic_load(&g_restart_ms))
                st->ok_after_restart++;
        } else {
            st->failed++;
            if (!st->problem[0])
                snprintf(st->problem, sizeof st->problem, "request %u: %s", i,
                         rv ? (rv > 0 ? nng_strerror(rv) : "bad reply") : why);
        }
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
        if (rv == LNORM_OK && worst < 1e-3) {
            st->ok++;
            if (atomic_load(&g_restart_ms))
                st->ok_after_restart++;
        } else {
            st->failed++;
            if (!st->problem[0])
                snprintf(st->problem, sizeof st->problem, "liblnorm call %u: %s (%s), max error %g", i,
                         lnorm_strerror(rv), res.message, worst);
        }
    }
    free(x);
    free(y);
    lnorm_client_close(c);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s LNORMD\n", argv[0]);
        return 2;
    }
    char dir[256], sock[320];
    if (td_tmpdir(dir, sizeof dir, "restart") != 0)
        return 1;
    snprintf(sock, sizeof sock, "%s/lnormd.sock", dir);
    snprintf(g_url, sizeof g_url, "ipc://%s", sock);
    const char *args[] = {"--listen", g_url, "--backend", "cpu", "--cpu-threads", "1", NULL};
    td_daemon d;
    if (td_start(&d, argv[1], dir, args, 0) != 0)
        return 1;
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
    printf("restart: nng client %ld ok (%ld after restart), %ld failed, %ld resend(s); liblnorm client (defaults) "
           "%ld ok (%ld after restart), %ld failed; liblnorm client (resend_ms 2000) %ld ok (%ld "
           "after restart), %ld failed\n",
           a.ok, a.ok_after_restart, a.failed, a.resends, b.st.ok, b.st.ok_after_restart, b.st.failed, c.st.ok,
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
