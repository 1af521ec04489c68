/*
 * fault.multi_daemon: one liblnorm client dialed to three lnormd on
 * loopback (ipc paths in private folders), under load from many threads,
 * while one daemon is killed with SIGKILL and another drained with SIGTERM,
 * then both restarted on the same paths.
 *
 *   fault_multi LNORMD
 *
 * Load: 6 threads on one shared client and 2 threads with a client each,
 * all dialed to the three URLs, sending random normalize requests
 * (LayerNorm / RMSNorm, f32 / bf16 / f16, 1..24 rows of 64..2048, affine,
 * residual and stats by turns) back to back, every output poisoned first
 * and checked against the float64 reference.
 * Timeline: 1.5 s of load; kill -9 daemon A; 1 s; SIGTERM daemon B (it
 * drains: requests in hand answered, later ones UNAVAILABLE, exit 0); 1 s;
 * A and B started again; 3 s of load.
 * Checks: zero failed calls and zero wrong outputs (a request in flight on
 * the killed daemon is resent, one answered UNAVAILABLE by the draining
 * daemon goes to another, nothing waits for its timeout); every daemon
 * served normalize requests before the faults, the survivor C throughout,
 * and the restarted A and B again after the restart (lnormd_normalize_ok_total
 * in each one's /metrics); B exited 0.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "check.h"
#include "lnorm/lnorm.h"
#include "testcase.h"
#include "testclient.h"
#include "testdaemon.h"
#include "testutil.h"

#define NDAEMONS 3
#define NSHARED 6
#define NOWN 2

static const char *g_urls[NDAEMONS];
static lnorm_client *g_shared;
static atomic_int g_stop;

typedef struct worker {
    int idx;
    lnorm_client *own; /* NULL: the shared client */
    long ok, failed, wrong;
    atomic_llong busy_since; /* td_now_ms() when its call began, 0 between calls */
    char problem[400];
} worker;

static void fail_once(worker *w, const char *what, int rv, const lnorm_result *res)
{
    if (!w->problem[0])
        snprintf(w->problem, sizeof w->problem, "%s: %s (%s)", what, lnorm_errname(rv), res ? res->message : "");
}

static void *work(void *arg)
{
    worker *w = arg;
    lnorm_client *c = w->own ? w->own : g_shared;
    lnorm_rng g;
    lnorm_rng_seed(&g, lnorm_test_seed(1000) + (uint64_t)w->idx * 7919u);
    static const int dts[3] = {LNORM_DTYPE_F32, LNORM_DTYPE_BF16, LNORM_DTYPE_F16};
    for (unsigned k = 0; !atomic_load(&g_stop); k++) {
        lnorm_test_case_cfg cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.op = k & 1 ? LNORM_OP_RMSNORM : LNORM_OP_LAYERNORM;
        cfg.x_dtype = dts[lnorm_rng_next(&g) % 3];
        cfg.rows = 1 + (int64_t)(lnorm_rng_next(&g) % 24);
        cfg.hidden = 64 << (lnorm_rng_next(&g) % 6);
        cfg.gamma = k % 3 != 0;
        cfg.beta = k % 3 == 2;
        cfg.residual = k % 5 == 1;
        cfg.stats = k % 4 == 3;
        lnorm_test_case tc;
        if (lnorm_test_case_make(&tc, &cfg, &g) != LNORM_OK) {
            w->failed++;
            fail_once(w, "out of memory", LNORM_ENOMEM, NULL);
            break;
        }
        const lnorm_segment *s = &tc.seg;
        lnorm_normalize_req q;
        lnorm_normalize_req_init(&q, (lnorm_op)s->op, (lnorm_dtype)s->x_dtype, (uint64_t)s->rows,
                                 (uint64_t)s->hidden);
        q.y_dtype = (lnorm_dtype)s->y_dtype;
        q.param_dtype = (lnorm_dtype)s->param_dtype;
        q.eps = s->eps;
        q.eps_mode = (lnorm_eps_mode)s->eps_mode;
        q.x = s->x, q.residual = s->residual, q.residual_out = s->residual_out;
        q.gamma = s->gamma, q.beta = s->beta;
        q.y = s->y, q.mean = s->mean, q.rstd = s->rstd;
        lnorm_result res;
        atomic_store(&w->busy_since, (long long)td_now_ms());
        int rv = lnorm_normalize(c, &q, &res);
        atomic_store(&w->busy_since, 0);
        if (rv != LNORM_OK) {
            w->failed++;
            fail_once(w, "normalize", rv, &res);
        } else if (lnorm_test_check_segment(s, NULL, "multi_daemon") != 0) {
            w->wrong++;
            fail_once(w, "output differs from the float64 reference", rv, &res);
        } else {
            w->ok++;
        }
        lnorm_test_case_free(&tc);
    }
    return NULL;
}

static double served(td_daemon *d)
{
    return td_metric(d, "lnormd_normalize_ok_total");
}

int main(int argc, char **argv)
{
    if (!td_usage(argc, argv, 2, "LNORMD"))
        return 2;
    td_watchdog(110);
    td_daemon d[NDAEMONS];
    char dirs[NDAEMONS][256], urls[NDAEMONS][288];
    for (int i = 0; i < NDAEMONS; i++) {
        if (td_tmpdir(dirs[i], sizeof dirs[i], "multi") != 0)
            return 1;
        snprintf(urls[i], sizeof urls[i], "ipc://%.240s/lnormd.sock", dirs[i]);
        g_urls[i] = urls[i];
        const char *args[] = {"--listen", urls[i], "--backend", "cpu", "--cpu-threads", "1", NULL};
        if (td_start(&d[i], argv[1], dirs[i], args, 0) != 0)
            return 1;
    }
    lnorm_client_opts o;
    tc_client_opts(&o, 20000, 50, 200);
    CHECK(lnorm_client_open(&g_shared, g_urls, NDAEMONS, &o) == LNORM_OK, "open the shared client");
    worker ws[NSHARED + NOWN];
    pthread_t th[NSHARED + NOWN];
    memset(ws, 0, sizeof ws);
    atomic_init(&g_stop, 0);
    for (int i = 0; i < NSHARED + NOWN; i++) {
        ws[i].idx = i;
        if (i >= NSHARED)
            CHECK(lnorm_client_open(&ws[i].own, g_urls, NDAEMONS, &o) == LNORM_OK, "open client %d", i);
        pthread_create(&th[i], NULL, work, &ws[i]);
    }

    td_sleep_ms(1500);
    double before[NDAEMONS];
    for (int i = 0; i < NDAEMONS; i++)
        before[i] = served(&d[i]);
    printf("load for 1.5 s; A killed\n");
    fflush(stdout);
    int st = td_stop(&d[0], SIGKILL, 5000);
    CHECK(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "daemon A did not die of SIGKILL");
    td_sleep_ms(1000);
    before[1] = served(&d[1]);
    printf("B drained\n");
    fflush(stdout);
    st = td_stop(&d[1], SIGTERM, 20000);
    td_check_exit0(&d[1], st, "daemon B on SIGTERM under load");
    double c_mid = served(&d[2]);
    td_sleep_ms(1000);
    printf("A and B restarted\n");
    fflush(stdout);
    CHECK(td_restart(&d[0]) == 0, "daemon A did not start again");
    CHECK(td_restart(&d[1]) == 0, "daemon B did not start again");
    td_sleep_ms(3000);
    double after[NDAEMONS];
    for (int i = 0; i < NDAEMONS; i++)
        after[i] = served(&d[i]);
    printf("stopping the load\n");
    fflush(stdout);
    atomic_store(&g_stop, 1);
    /* Each thread ends its call in progress, which the client bounds (a
     * send of at most 20 s, a reply within 20 s of it): a call past that
     * is a hang, named here rather than by the watchdog. */
    td_watchdog_note("joining the load threads");
    const int64_t join_by = td_now_ms() + 50000;
    int hung = 0;
    for (int i = 0; i < NSHARED + NOWN; i++) {
        int64_t left = join_by - td_now_ms();
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += (left > 0 ? left : 0) / 1000 + 1;
        if (pthread_timedjoin_np(th[i], NULL, &until) != 0) {
            const long long since = atomic_load(&ws[i].busy_since);
            CHECK_FAIL("load thread %d (%s client) still in a call after %lld ms (%ld ok before it)", i,
                       i < NSHARED ? "the shared" : "its own", since ? (long long)td_now_ms() - since : -1LL,
                       ws[i].ok);
            hung = 1;
        }
    }
    if (hung) {
        for (int i = 0; i < NDAEMONS; i++)
            td_stop(&d[i], SIGKILL, 5000);
        return check_finish("fault.multi_daemon"); /* (the clients stay open: a call holds them) */
    }
    long ok = 0, failed = 0, wrong = 0;
    for (int i = 0; i < NSHARED + NOWN; i++) {
        ok += ws[i].ok;
        failed += ws[i].failed;
        wrong += ws[i].wrong;
        if (ws[i].problem[0])
            fprintf(stderr, "thread %d: %s\n", i, ws[i].problem);
    }
    /* Closing a client lets replies due arrive for a bounded time, then
     * closes its socket: seconds at most. */
    static char close_notes[NOWN + 1][64];
    for (int i = 0; i <= NOWN; i++) {
        lnorm_client *cl = i < NOWN ? ws[NSHARED + i].own : g_shared;
        if (i < NOWN)
            snprintf(close_notes[i], sizeof close_notes[i], "closing the client of load thread %d", NSHARED + i);
        else
            snprintf(close_notes[i], sizeof close_notes[i], "closing the shared client");
        td_watchdog_note(close_notes[i]);
        const int64_t t0 = td_now_ms();
        lnorm_client_close(cl);
        const int64_t took = td_now_ms() - t0;
        CHECK(took < 10000, "%s took %lld ms", close_notes[i], (long long)took);
    }
    td_watchdog_note(NULL);
    printf("multi_daemon: %ld calls ok, %ld failed, %ld wrong; normalize_ok before the faults A %g B %g C %g; "
           "C %g at B's drain, %g at the end; after the restart A %g B %g\n",
           ok, failed, wrong, before[0], before[1], before[2], c_mid, after[2], after[0], after[1]);
    CHECK(ok > 0 && failed == 0 && wrong == 0, "%ld calls failed and %ld were wrong of %ld", failed, wrong,
          ok + failed + wrong);
    for (int i = 0; i < NDAEMONS; i++)
        CHECK(before[i] > 0, "daemon %c served nothing before the faults (%g)", 'A' + i, before[i]);
    CHECK(after[2] > c_mid, "daemon C served nothing after B's drain (%g, then %g)", c_mid, after[2]);
    CHECK(after[0] > 0 && after[1] > 0, "a restarted daemon got no load: A %g, B %g", after[0], after[1]);
    td_stop_check(&d[0], "A, restarted, on SIGTERM");
    td_stop_check(&d[1], "B, restarted, on SIGTERM");
    td_stop_check(&d[2], "C on SIGTERM");
    return check_finish("fault.multi_daemon");
}
