/*
 * server.batcher: the batcher (server/batcher.c) against a recording fake
 * backend, no daemon.
 *
 *   test_batcher caps          every batch within max_batch_rows and
 *                              max_batch_bytes, each as full as they allow
 *   test_batcher early         with a 10 s max_queue_delay_us, a batch whose
 *                              rows or bytes reach the cap leaves at once;
 *                              below both caps the queue waits
 *   test_batcher priority      batches take the highest level first, FIFO
 *                              within a level, a batch mixes levels up to
 *                              the caps; priority 0 is default_priority;
 *                              per-level metrics count it
 *   test_batcher prio_limits   a level's own queue limit and max_queue are
 *                              RESOURCE_EXHAUSTED, a priority above the
 *                              levels INVALID_ARGUMENT, each saying which
 *   test_batcher queue_wait    a request queued past its max_queue_us (or
 *                              the default max_queue_wait_us) is answered
 *                              DEADLINE_EXCEEDED and never reaches the
 *                              backend; a deadline keeps its own message;
 *                              the wait does not cover compute
 *   test_batcher replies       with reply_threads, a batch's requests are
 *                              finished on several pool threads at once,
 *                              not on the thread that completed it; the
 *                              batcher is not idle while a reply is
 *                              pending; abort waits for every reply
 *
 * The fake backend takes one job at a time (max_inflight 1) and records
 * each batch (rows, bytes, segments, when); it finishes a job at once, or
 * holds it until the test lets it go, so that requests pile up in the
 * queue behind it.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "batcher.h"
#include "check.h"
#include "testdaemon.h"

enum { MAX_JOBS = 256, MAX_TAGS = 16, NTAGS = 100 };

typedef struct fake_be {
    lnorm__backend base;
    pthread_mutex_t mu;
    int hold;                /* keep submitted jobs until fake_release */
    lnorm__job *held;        /* the job on the backend (max_inflight 1) */
    int njobs;
    struct {
        uint64_t rows, bytes;
        size_t nsegs;
        int64_t at_ms;
        int tag[MAX_TAGS];   /* the requests' tags (segment x), in batch order */
    } job[MAX_JOBS];
} fake_be;

static int fake_submit(lnorm__backend *be, lnorm__job *job)
{
    fake_be *f = (fake_be *)be;
    pthread_mutex_lock(&f->mu);
    if (f->njobs < MAX_JOBS) {
        f->job[f->njobs].rows = job->rows;
        f->job[f->njobs].bytes = job->bytes;
        f->job[f->njobs].nsegs = job->batch.nsegs;
        f->job[f->njobs].at_ms = td_now_ms();
        for (size_t i = 0; i < job->batch.nsegs && i < MAX_TAGS; i++)
            f->job[f->njobs].tag[i] = (int)(uintptr_t)job->batch.segs[i].x;
    }
    f->njobs++;
    int hold = f->hold;
    if (hold) {
        CHECK(f->held == NULL, "a second job on a backend that takes one at a time");
        f->held = job;
    }
    pthread_mutex_unlock(&f->mu);
    if (!hold)
        job->done(job, LNORM_OK, NULL, 0);
    return LNORM_OK;
}

static int fake_max_inflight(lnorm__backend *be)
{
    (void)be;
    return 1;
}

static const lnorm__backend_ops fake_ops = {.name = "fake", .submit = fake_submit, .max_inflight = fake_max_inflight};

/* Finish the held job (the batcher then forms the next batch on this
 * thread); 0 when there was none. */
static int fake_release(fake_be *f)
{
    pthread_mutex_lock(&f->mu);
    lnorm__job *j = f->held;
    f->held = NULL;
    pthread_mutex_unlock(&f->mu);
    if (j)
        j->done(j, LNORM_OK, NULL, 0);
    return j != NULL;
}

static int fake_njobs(fake_be *f)
{
    pthread_mutex_lock(&f->mu);
    int n = f->njobs;
    pthread_mutex_unlock(&f->mu);
    return n;
}

/* The daemon's side: every request finished exactly once; by tag (1 ..
 * NTAGS - 1), how many times, with which error and message. */
static int g_finished, g_finish_errors;
static int g_done[NTAGS], g_err[NTAGS];
static char g_why[NTAGS][160];

/* test_replies: finishes of good requests wait at the gate while it is
 * shut, counting how many wait at once and on which threads. */
static pthread_mutex_t g_gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_cv = PTHREAD_COND_INITIALIZER;
static int g_gate_on, g_gate_open, g_in_finish, g_max_in_finish;
static pthread_t g_completer;
static int g_on_completer;

static void gate(int err)
{
    pthread_mutex_lock(&g_gate_mu);
    if (!g_gate_on || err != LNORM_OK) {
        pthread_mutex_unlock(&g_gate_mu);
        return;
    }
    g_on_completer += pthread_equal(pthread_self(), g_completer) != 0;
    g_in_finish++;
    if (g_in_finish > g_max_in_finish)
        g_max_in_finish = g_in_finish;
    pthread_cond_broadcast(&g_gate_cv);
    while (!g_gate_open)
        pthread_cond_wait(&g_gate_cv, &g_gate_mu);
    g_in_finish--;
    pthread_mutex_unlock(&g_gate_mu);
}

static void on_finish(void *arg, lnorm__req *r, int err, const char *why, const lnorm__timing *t)
{
    (void)arg;
    (void)t;
    gate(err);
    pthread_mutex_lock(&g_gate_mu); /* pool threads finish concurrently */
    g_finished++;
    g_finish_errors += err != LNORM_OK;
    int tag = (int)(uintptr_t)r->dec.seg.x;
    if (tag > 0 && tag < NTAGS) {
        g_done[tag]++;
        g_err[tag] = err;
        snprintf(g_why[tag], sizeof g_why[tag], "%s", why ? why : "");
    }
    pthread_mutex_unlock(&g_gate_mu);
    free(r);
}

typedef struct rig {
    uv_loop_t loop;
    lnorm__stats st;
    fake_be be;
    lnorm__batcher *b;
    int submitted;
    int want_errors;         /* requests meant to finish with an error */
} rig;

static void rig_open_opts(rig *k, const lnorm__batcher_opts *o, int hold)
{
    memset(k, 0, sizeof *k);
    uv_loop_init(&k->loop);
    lnorm__stats_init(&k->st);
    k->be.base.ops = &fake_ops;
    pthread_mutex_init(&k->be.mu, NULL);
    k->be.hold = hold;
    int rc = lnorm__batcher_create(&k->b, &k->loop, &k->be.base, &k->st, o, on_finish, NULL);
    CHECK(rc == LNORM_OK, "lnorm__batcher_create: %d", rc);
    g_finished = g_finish_errors = 0;
    memset(g_done, 0, sizeof g_done);
    memset(g_err, 0, sizeof g_err);
    memset(g_why, 0, sizeof g_why);
}

static void rig_open(rig *k, uint64_t max_rows, uint64_t max_bytes, uint64_t delay_us, int hold)
{
    lnorm__batcher_opts o = {max_rows, max_bytes, delay_us, 10000, 1, 1, {0}, 0, 0};
    rig_open_opts(k, &o, hold);
}

/* Queue a request tagged tag (its segment's x) at priority prio with
 * max_queue_us mq and deadline dl_ms from now (0: none); the submit's
 * status, and its message in why (may be NULL). */
static int submit_req(rig *k, uint64_t rows, int tag, unsigned prio, uint64_t mq, int dl_ms, char *why, size_t wn)
{
    char buf[256] = "";
    lnorm__req *r = calloc(1, sizeof *r);
    r->rows = rows;
    r->bytes = 100;
    r->dec.seg.x = (const void *)(uintptr_t)tag;
    r->priority = prio;
    r->max_queue_us = mq;
    r->recv_ns = lnorm__now_ns();
    if (dl_ms)
        r->deadline_ns = r->recv_ns + (uint64_t)dl_ms * 1000000u;
    int rc = lnorm__batcher_submit(k->b, r, buf, sizeof buf);
    if (why)
        snprintf(why, wn, "%s", buf);
    if (rc != LNORM_OK)
        free(r);
    else
        k->submitted++;
    return rc;
}

static void submit(rig *k, uint64_t rows, uint64_t bytes)
{
    lnorm__req *r = calloc(1, sizeof *r);
    char why[256];
    r->rows = rows;
    r->bytes = bytes;
    r->recv_ns = lnorm__now_ns();
    int rc = lnorm__batcher_submit(k->b, r, why, sizeof why);
    CHECK(rc == LNORM_OK, "submit: %d", rc);
    if (rc != LNORM_OK)
        free(r);
    else
        k->submitted++;
}

/* Run the loop (the batcher's timer) for ms, or until the backend has
 * seen njobs jobs; the jobs seen. */
static int run_loop_until(rig *k, int njobs, int ms)
{
    int64_t end = td_now_ms() + ms;
    while (fake_njobs(&k->be) < njobs && td_now_ms() < end) {
        uv_run(&k->loop, UV_RUN_NOWAIT);
        td_sleep_ms(1);
    }
    return fake_njobs(&k->be);
}

/* Let everything queued run, then close: every request finished once, OK. */
static void rig_close(rig *k)
{
    lnorm__batcher_opts o;
    lnorm__batcher_get_opts(k->b, &o);
    o.max_queue_delay_us = 0;
    k->be.hold = 0;
    lnorm__batcher_set_opts(k->b, &o);
    while (fake_release(&k->be))
        ;
    for (int i = 0; i < 1000 && !lnorm__batcher_idle(k->b); i++) {
        uv_run(&k->loop, UV_RUN_NOWAIT);
        td_sleep_ms(1);
    }
    CHECK(lnorm__batcher_idle(k->b), "the batcher is not idle at the end");
    CHECK_EQ_INT(g_finished, k->submitted, "requests finished");
    CHECK_EQ_INT(g_finish_errors, k->want_errors, "requests finished with an error");
    lnorm__batcher_close(k->b);
    uv_run(&k->loop, UV_RUN_DEFAULT);
    lnorm__batcher_destroy(k->b);
    uv_loop_close(&k->loop);
    pthread_mutex_destroy(&k->be.mu);
}

/* Requests queue behind a held job; each batch formed from that queue must
 * be within both caps and as full as they allow: want[i] segments. */
static void check_batches(const char *what, uint64_t max_rows, uint64_t max_bytes, const uint64_t (*reqs)[2],
                          int nreqs, const size_t *want, int nwant)
{
    rig k;
    rig_open(&k, max_rows, max_bytes, 0, 1);
    submit(&k, 1, 100); /* runs at once and is held: the rest queue */
    CHECK_EQ_INT(fake_njobs(&k.be), 1, "%s: the first request is not on the backend", what);
    for (int i = 0; i < nreqs; i++)
        submit(&k, reqs[i][0], reqs[i][1]);
    CHECK_EQ_INT(fake_njobs(&k.be), 1, "%s: a batch left while the backend was full", what);
    while (fake_release(&k.be))
        ;
    int n = fake_njobs(&k.be) - 1;
    printf("%s: %d requests behind a held job left in %d batches:", what, nreqs, n);
    for (int i = 1; i <= n && i < MAX_JOBS; i++)
        printf(" %zu (%llu rows, %llu bytes)", k.be.job[i].nsegs, (unsigned long long)k.be.job[i].rows,
               (unsigned long long)k.be.job[i].bytes);
    printf("\n");
    CHECK_EQ_INT(n, nwant, "%s: batches", what);
    for (int i = 1; i <= n && i < MAX_JOBS; i++) {
        uint64_t rows = k.be.job[i].rows, bytes = k.be.job[i].bytes;
        size_t segs = k.be.job[i].nsegs;
        CHECK(segs == 1 || (rows <= max_rows && bytes <= max_bytes),
              "%s: batch %d of %zu requests has %llu rows and %llu bytes; caps %llu rows, %llu bytes", what, i,
              segs, (unsigned long long)rows, (unsigned long long)bytes, (unsigned long long)max_rows,
              (unsigned long long)max_bytes);
        if (i <= nwant)
            CHECK_EQ_INT(segs, want[i - 1], "%s: requests in batch %d", what, i);
    }
    rig_close(&k);
}

static void test_caps(void)
{
    /* Rows: 30-row requests under a 100-row cap go three to a batch; a
     * 150-row request goes alone; a 100-row one fills a batch by itself. */
    static const uint64_t rows_reqs[][2] = {{30, 10}, {30, 10}, {30, 10}, {30, 10}, {30, 10}, {30, 10},
                                            {30, 10}, {150, 10}, {30, 10}, {100, 10}, {30, 10}, {30, 10}};
    static const size_t rows_want[] = {3, 3, 1, 1, 1, 1, 2};
    check_batches("max_batch_rows 100", 100, 1 << 20, rows_reqs, 12, rows_want, 7);
    /* Bytes: 3000-byte requests under a 10000-byte cap, three to a batch. */
    static const uint64_t bytes_reqs[][2] = {{1, 3000}, {1, 3000}, {1, 3000}, {1, 3000}, {1, 3000},
                                             {1, 3000}, {1, 3000}, {1, 20000}, {1, 3000}};
    static const size_t bytes_want[] = {3, 3, 1, 1, 1};
    check_batches("max_batch_bytes 10000", 1 << 20, 10000, bytes_reqs, 9, bytes_want, 5);
}

/* With a long queue delay: below both caps nothing leaves; the request
 * that makes the queue reach a cap sends a batch at once. */
static void check_early(const char *what, uint64_t max_rows, uint64_t max_bytes, uint64_t rows, uint64_t bytes,
                        int to_cap, size_t want_segs)
{
    rig k;
    rig_open(&k, max_rows, max_bytes, 10000000, 0);
    for (int i = 0; i < to_cap - 1; i++)
        submit(&k, rows, bytes);
    int seen = run_loop_until(&k, 1, 200);
    CHECK_EQ_INT(seen, 0, "%s: a batch left below both caps without waiting its queue delay", what);
    int64_t t0 = td_now_ms();
    submit(&k, rows, bytes);
    seen = run_loop_until(&k, 1, 2000);
    int64_t dt = td_now_ms() - t0;
    printf("%s: %d requests below the cap waited; the one reaching it sent a batch after %lld ms\n", what,
           to_cap - 1, (long long)(seen ? dt : -1));
    CHECK(seen >= 1 && dt < 1000, "%s: no batch %lld ms after the queue reached the cap (queue delay 10 s)", what,
          (long long)dt);
    if (seen >= 1) {
        CHECK(k.be.job[0].rows <= max_rows && k.be.job[0].bytes <= max_bytes,
              "%s: the batch has %llu rows, %llu bytes", what, (unsigned long long)k.be.job[0].rows,
              (unsigned long long)k.be.job[0].bytes);
        CHECK_EQ_INT(k.be.job[0].nsegs, want_segs, "%s: requests in the batch", what);
    }
    rig_close(&k);
}

static void test_early(void)
{
    /* 4 x 25 rows reach 100 exactly: one batch of 4. */
    check_early("max_batch_rows 100 reached", 100, 1 << 20, 25, 10, 4, 4);
    /* 4 x 30 rows pass 100: a batch of the 3 that fit. */
    check_early("max_batch_rows 100 passed", 100, 1 << 20, 30, 10, 4, 3);
    /* 4 x 2500 bytes reach 10000 exactly. */
    check_early("max_batch_bytes 10000 reached", 1 << 20, 10000, 1, 2500, 4, 4);
    /* 4 x 3000 bytes pass 10000. */
    check_early("max_batch_bytes 10000 passed", 1 << 20, 10000, 1, 3000, 4, 3);
}

/* The value of one /metrics series (exact name with labels), -1 if absent. */
static double metric(rig *k, const char *series)
{
    char *txt;
    size_t len;
    double v = -1;
    if (lnorm__stats_render(&k->st, "fake", &txt, &len) != 0)
        return -2;
    size_t n = strlen(series);
    for (const char *p = txt; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (!strncmp(p, series, n) && p[n] == ' ') {
            v = strtod(p + n + 1, NULL);
            break;
        }
    }
    free(txt);
    return v;
}

static void check_metric(rig *k, const char *series, double want)
{
    double v = metric(k, series);
    CHECK(v == want, "/metrics %s is %g, want %g", series, v, want);
}

/* The tags of batch i (1: the first behind the held job) as "a b c". */
static void batch_tags(rig *k, int i, char *out, size_t n)
{
    out[0] = 0;
    for (size_t s = 0; s < k->be.job[i].nsegs && s < MAX_TAGS; s++) {
        size_t l = strlen(out);
        snprintf(out + l, n - l, "%s%d", s ? " " : "", k->be.job[i].tag[s]);
    }
}

static void test_priority(void)
{
    rig k;
    /* 3 levels, unmarked requests at level 2; 10-row requests, 3 to a batch */
    lnorm__batcher_opts o = {30, 1 << 20, 0, 10000, 3, 2, {0}, 0, 0};
    rig_open_opts(&k, &o, 1);
    CHECK_EQ_INT(submit_req(&k, 10, 1, 1, 0, 0, NULL, 0), LNORM_OK, "held request");
    static const struct {
        int tag;
        unsigned prio;
    } q[] = {{10, 1}, {30, 3}, {20, 2}, {11, 1}, {31, 3}, {21, 2}, {22, 0}, {32, 3}};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        CHECK_EQ_INT(submit_req(&k, 10, q[i].tag, q[i].prio, 0, 0, NULL, 0), LNORM_OK, "submit tag %d", q[i].tag);
    check_metric(&k, "lnormd_priority_queue_depth{priority=\"1\"}", 2);
    check_metric(&k, "lnormd_priority_queue_depth{priority=\"2\"}", 3);
    check_metric(&k, "lnormd_priority_queue_depth{priority=\"3\"}", 3);
    check_metric(&k, "lnormd_priority_taken_total{priority=\"1\"}", 1);
    CHECK(metric(&k, "lnormd_priority_queue_depth{priority=\"4\"}") == -1, "/metrics shows a 4th level of 3");
    while (fake_release(&k.be))
        ;
    static const char *const want[] = {"30 31 32", "20 21 22", "10 11"};
    int n = fake_njobs(&k.be) - 1;
    CHECK_EQ_INT(n, 3, "batches behind the held one");
    for (int i = 1; i <= n && i <= 3; i++) {
        char got[128];
        batch_tags(&k, i, got, sizeof got);
        printf("priority: batch %d: %s\n", i, got);
        CHECK(!strcmp(got, want[i - 1]), "batch %d has requests %s, want %s (highest level first, FIFO within)", i,
              got, want[i - 1]);
    }
    for (int l = 1; l <= 3; l++) {
        char s[96];
        snprintf(s, sizeof s, "lnormd_priority_queue_depth{priority=\"%d\"}", l);
        check_metric(&k, s, 0);
        snprintf(s, sizeof s, "lnormd_priority_taken_total{priority=\"%d\"}", l);
        check_metric(&k, s, 3);
        snprintf(s, sizeof s, "lnormd_priority_queue_seconds_count{priority=\"%d\"}", l);
        check_metric(&k, s, 3);
        snprintf(s, sizeof s, "lnormd_priority_queue_timeouts_total{priority=\"%d\"}", l);
        check_metric(&k, s, 0);
    }
    rig_close(&k);
}

static void test_prio_limits(void)
{
    rig k;
    char why[256];
    /* 2 levels; level 1 holds at most 2 queued, level 2 only max_queue (5) */
    lnorm__batcher_opts o = {1000, 1 << 20, 0, 5, 2, 1, {2, 0}, 0, 0};
    rig_open_opts(&k, &o, 1);
    CHECK_EQ_INT(submit_req(&k, 1, 1, 1, 0, 0, NULL, 0), LNORM_OK, "held request");
    CHECK_EQ_INT(submit_req(&k, 1, 10, 1, 0, 0, NULL, 0), LNORM_OK, "1st at level 1");
    CHECK_EQ_INT(submit_req(&k, 1, 11, 0, 0, 0, NULL, 0), LNORM_OK, "2nd at level 1 (default)");
    int rc = submit_req(&k, 1, 12, 1, 0, 0, why, sizeof why);
    printf("prio_limits: 3rd at level 1: %s: %s\n", lnorm_errname(rc), why);
    CHECK_EQ_INT(rc, LNORM_EQUEUEFULL, "3rd request at level 1 (limit 2)");
    CHECK(strstr(why, "priority 1") && strstr(why, "priority-max-queue"), "level-full message: %s", why);
    CHECK_EQ_INT(submit_req(&k, 1, 13, 0, 0, 0, NULL, 0), LNORM_EQUEUEFULL, "default-level request, level 1 full");
    for (int t = 20; t < 23; t++)
        CHECK_EQ_INT(submit_req(&k, 1, t, 2, 0, 0, NULL, 0), LNORM_OK, "level 2 request %d (level 1 full)", t);
    rc = submit_req(&k, 1, 23, 2, 0, 0, why, sizeof why);
    printf("prio_limits: 6th queued: %s: %s\n", lnorm_errname(rc), why);
    CHECK_EQ_INT(rc, LNORM_EQUEUEFULL, "a 6th request with max_queue 5");
    CHECK(strstr(why, "max-queue") && !strstr(why, "priority-max-queue"), "queue-full message: %s", why);
    rc = submit_req(&k, 1, 24, 3, 0, 0, why, sizeof why);
    printf("prio_limits: priority 3 of 2: %s: %s\n", lnorm_errname(rc), why);
    CHECK_EQ_INT(rc, LNORM_EINVAL, "priority 3 with 2 levels");
    CHECK(strstr(why, "normalize.priority") && strstr(why, "[0, 2]"), "out-of-range message: %s", why);
    check_metric(&k, "lnormd_priority_rejected_total{priority=\"1\"}", 2);
    check_metric(&k, "lnormd_priority_rejected_total{priority=\"2\"}", 0);
    check_metric(&k, "lnormd_priority_queue_depth{priority=\"1\"}", 2);
    check_metric(&k, "lnormd_priority_queue_depth{priority=\"2\"}", 3);
    rig_close(&k);
    for (int t = 10; t < 25; t++)
        CHECK_EQ_INT(g_done[t], (t <= 11 || (t >= 20 && t <= 22)) ? 1 : 0, "replies to request %d", t);
}

/* Run the loop (timers) for ms. */
static void run_loop_ms(rig *k, int ms)
{
    int64_t end = td_now_ms() + ms;
    while (td_now_ms() < end) {
        uv_run(&k->loop, UV_RUN_NOWAIT);
        td_sleep_ms(1);
    }
}

static void test_queue_wait(void)
{
    rig k;
    lnorm__batcher_opts o = {1000, 1 << 20, 0, 100, 1, 1, {0}, 0, 0};
    rig_open_opts(&k, &o, 1);
    CHECK_EQ_INT(submit_req(&k, 1, 1, 0, 0, 0, NULL, 0), LNORM_OK, "held request");
    submit_req(&k, 1, 10, 0, 50000, 0, NULL, 0); /* 50 ms queue wait */
    submit_req(&k, 1, 11, 0, 0, 0, NULL, 0);     /* no limit */
    submit_req(&k, 1, 12, 0, 0, 50, NULL, 0);    /* 50 ms deadline */
    run_loop_ms(&k, 300);
    printf("queue_wait: max_queue_us 50000: %s: %s\n", lnorm_errname(g_err[10]), g_why[10]);
    printf("queue_wait: deadline 50 ms: %s: %s\n", lnorm_errname(g_err[12]), g_why[12]);
    CHECK(g_done[10] == 1 && g_err[10] == LNORM_ETIMEDOUT, "max_queue_us 50000 after 300 ms queued: %d replies, %s",
          g_done[10], lnorm_errname(g_err[10]));
    CHECK(strstr(g_why[10], "max_queue_us (50000 us)") != NULL, "queue-wait message: %s", g_why[10]);
    CHECK(g_done[12] == 1 && g_err[12] == LNORM_ETIMEDOUT && strstr(g_why[12], "deadline exceeded while queued"),
          "deadline 50 ms after 300 ms queued: %d replies, %s, '%s'", g_done[12], lnorm_errname(g_err[12]),
          g_why[12]);
    CHECK_EQ_INT(g_done[11], 0, "replies to the request with no queue limit");
    check_metric(&k, "lnormd_priority_queue_timeouts_total{priority=\"1\"}", 1);
    /* The server's default, and a request's own value over it. */
    o.max_queue_wait_us = 50000;
    lnorm__batcher_set_opts(k.b, &o);
    submit_req(&k, 1, 13, 0, 0, 0, NULL, 0);        /* the default: 50 ms */
    submit_req(&k, 1, 14, 0, 10000000, 0, NULL, 0); /* its own 10 s */
    run_loop_ms(&k, 300);
    CHECK(g_done[13] == 1 && g_err[13] == LNORM_ETIMEDOUT && strstr(g_why[13], "max_queue_us (50000 us)"),
          "max-queue-wait-us 50000, request without its own: %d replies, %s, '%s'", g_done[13],
          lnorm_errname(g_err[13]), g_why[13]);
    CHECK_EQ_INT(g_done[14], 0, "replies to the request with its own max_queue_us 10 s");
    check_metric(&k, "lnormd_priority_queue_timeouts_total{priority=\"1\"}", 2);
    CHECK_EQ_INT(fake_njobs(&k.be), 1, "batches while the backend was held");
    while (fake_release(&k.be))
        ;
    /* The wait is queueing only: taken at once, then held 200 ms, it is OK. */
    submit_req(&k, 1, 15, 0, 50000, 0, NULL, 0);
    run_loop_ms(&k, 200);
    CHECK_EQ_INT(g_done[15], 0, "replies to a request on the backend");
    fake_release(&k.be);
    CHECK(g_done[15] == 1 && g_err[15] == LNORM_OK, "max_queue_us 50000, held 200 ms on the backend: %s",
          lnorm_errname(g_err[15]));
    for (int i = 0; i < fake_njobs(&k.be) && i < MAX_JOBS; i++)
        for (size_t s = 0; s < k.be.job[i].nsegs && s < MAX_TAGS; s++) {
            int t = k.be.job[i].tag[s];
            CHECK(t != 10 && t != 12 && t != 13, "request %d, answered DEADLINE_EXCEEDED, reached the backend", t);
        }
    k.want_errors = 3;
    rig_close(&k);
    CHECK(g_done[11] == 1 && g_err[11] == LNORM_OK && g_done[14] == 1 && g_err[14] == LNORM_OK,
          "the requests that waited: %s, %s", lnorm_errname(g_err[11]), lnorm_errname(g_err[14]));
}

static void *release_thread(void *arg)
{
    while (fake_release(arg))
        ;
    return NULL;
}

/* Wait (up to 5 s) until n finishes wait at the gate; how many do. */
static int gate_wait_for(int n)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    pthread_mutex_lock(&g_gate_mu);
    while (g_in_finish < n && pthread_cond_timedwait(&g_gate_cv, &g_gate_mu, &until) == 0)
        ;
    int got = g_in_finish;
    pthread_mutex_unlock(&g_gate_mu);
    return got;
}

static void gate_set(int on, int open)
{
    pthread_mutex_lock(&g_gate_mu);
    g_gate_on = on;
    g_gate_open = open;
    pthread_cond_broadcast(&g_gate_cv);
    pthread_mutex_unlock(&g_gate_mu);
}

static void *open_gate_later(void *arg)
{
    (void)arg;
    td_sleep_ms(100);
    gate_set(1, 1);
    return NULL;
}

static void test_replies(void)
{
    enum { NREQ = 32, THREADS = 4 };
    rig k;
    lnorm__batcher_opts o = {1000, 1 << 20, 0, 10000, 1, 1, {0}, 0, THREADS};
    rig_open_opts(&k, &o, 1);
    submit(&k, 1, 100); /* held: the rest queue behind it */
    for (int i = 0; i < NREQ; i++)
        submit(&k, 1, 100);
    gate_set(1, 0);
    /* Another thread completes the batches, as a backend's completion
     * thread would; none of the finishes may run on it. */
    pthread_create(&g_completer, NULL, release_thread, &k.be);
    int waiting = gate_wait_for(2);
    printf("replies: %d finishes at the gate at once (%d pool threads)\n", waiting, THREADS);
    CHECK(waiting >= 2, "only %d finish at a time: the batch's replies are not spread over the pool", waiting);
    CHECK(!lnorm__batcher_idle(k.b), "the batcher says idle while replies are still pending");
    gate_set(1, 1);
    pthread_join(g_completer, NULL);
    rig_close(&k);
    CHECK_EQ_INT(g_on_completer, 0, "finishes run on the thread that completed the batch");
    CHECK(g_max_in_finish <= THREADS, "%d finishes at once on %d threads", g_max_in_finish, THREADS);

    /* abort returns only once every reply is done. */
    rig_open_opts(&k, &o, 1);
    submit(&k, 1, 100);
    for (int i = 0; i < 8; i++)
        submit(&k, 1, 100);
    gate_set(1, 0);
    pthread_create(&g_completer, NULL, release_thread, &k.be);
    pthread_join(g_completer, NULL);
    CHECK(gate_wait_for(1) >= 1, "no finish reached the gate");
    pthread_t opener;
    pthread_create(&opener, NULL, open_gate_later, NULL); /* while abort waits */
    lnorm__batcher_abort(k.b);
    pthread_join(opener, NULL);
    CHECK_EQ_INT(g_finished, k.submitted, "requests finished when abort returned");
    gate_set(0, 0);
    rig_close(&k);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {{"caps", test_caps},
                 {"early", test_early},
                 {"priority", test_priority},
                 {"prio_limits", test_prio_limits},
                 {"queue_wait", test_queue_wait},
                 {"replies", test_replies}};
    size_t i = 0, n = sizeof tests / sizeof tests[0];
    while (argc == 2 && i < n && strcmp(argv[1], tests[i].name))
        i++;
    if (argc != 2 || i == n) {
        fprintf(stderr, "usage: %s caps|early|priority|prio_limits|queue_wait|replies\n", argv[0]);
        return 2;
    }
    td_watchdog(60);
    tests[i].fn();
    char name[64];
    snprintf(name, sizeof name, "server.batcher_%s", argv[1]);
    return check_finish(name);
}
