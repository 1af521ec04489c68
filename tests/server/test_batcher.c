/*
 * server.batcher: the batcher (server/batcher.c) against a recording fake
 * backend, no daemon.
 *
 *   test_batcher caps          every batch within max_batch_rows and
 *                              max_batch_bytes, each as full as they allow
 *   test_batcher early         with a 10 s max_queue_delay_us, a batch whose
 *                              rows or bytes reach the cap leaves at once;
 *                              below both caps the queue waits
 *
 * The fake backend takes one job at a time (max_inflight 1) and records
 * each batch (rows, bytes, segments, when); it finishes a job at once, or
 * holds it until the test lets it go, so that requests pile up in the
 * queue behind it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "batcher.h"
#include "check.h"
#include "testdaemon.h"

enum { MAX_JOBS = 256 };

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

/* The daemon's side: every request finished exactly once, with OK. */
static int g_finished, g_finish_errors;

static void on_finish(void *arg, lnorm__req *r, int err, const char *why, const lnorm__timing *t)
{
    (void)arg;
    (void)why;
    (void)t;
    g_finished++;
    g_finish_errors += err != LNORM_OK;
    free(r);
}

typedef struct rig {
    uv_loop_t loop;
    lnorm__stats st;
    fake_be be;
    lnorm__batcher *b;
    int submitted;
} rig;

static void rig_open(rig *k, uint64_t max_rows, uint64_t max_bytes, uint64_t delay_us, int hold)
{
    memset(k, 0, sizeof *k);
    uv_loop_init(&k->loop);
    lnorm__stats_init(&k->st);
    k->be.base.ops = &fake_ops;
    pthread_mutex_init(&k->be.mu, NULL);
    k->be.hold = hold;
    lnorm__batcher_opts o = {max_rows, max_bytes, delay_us, 10000};
    int rc = lnorm__batcher_create(&k->b, &k->loop, &k->be.base, &k->st, &o, on_finish, NULL);
    CHECK(rc == LNORM_OK, "lnorm__batcher_create: %d", rc);
    g_finished = g_finish_errors = 0;
}

static void submit(rig *k, uint64_t rows, uint64_t bytes)
{
    lnorm__req *r = calloc(1, sizeof *r);
    r->rows = rows;
    r->bytes = bytes;
    r->recv_ns = lnorm__now_ns();
    int rc = lnorm__batcher_submit(k->b, r);
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
    CHECK_EQ_INT(g_finish_errors, 0, "requests finished with an error");
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

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "caps") && strcmp(argv[1], "early"))) {
        fprintf(stderr, "usage: %s caps|early\n", argv[0]);
        return 2;
    }
    td_watchdog(60);
    if (!strcmp(argv[1], "caps"))
        test_caps();
    else
        test_early();
    char name[64];
    snprintf(name, sizeof name, "server.batcher_%s", argv[1]);
    return check_finish(name);
}
