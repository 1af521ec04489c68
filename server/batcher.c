/*
 * Batch formation and the backend job life cycle. Batches form under the
 * lock on whichever thread has cause: the one that queues a request, the
 * one that finishes a batch (the backend has room again), and the loop
 * thread when the timerfd fires (a max_queue_delay_us wait ends, a queued
 * deadline passes) or the options change.
 */
#include <pthread.h>
#include <sys/timerfd.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "batcher.h"
#include "log.h"

struct lnorm__batcher {
    pthread_mutex_t mu;
    pthread_cond_t idle_cv;   /* signalled when a job finishes */
    lnorm__req *head, *tail;  /* the queue, in arrival order */
    uint64_t qlen, qrows, qbytes;
    uint64_t qdeadlines;      /* queued requests that have a deadline */
    int inflight;             /* jobs on the backend */
    int kickers;              /* threads inside lnorm__kick_locked */
    int rekick;               /* a job finished inside a kick on its thread */
    int closed;               /* loop handles closed: no more wake-ups */
    lnorm__batcher_opts opts;
    /* The batch / deadline timer: a timerfd polled by the loop, because
     * libuv's timers have millisecond resolution and max_queue_delay_us is
     * in microseconds. */
    int tfd;
    uv_poll_t timer;
    uint64_t timer_at;        /* armed for (monotonic ns), 0: disarmed */
    lnorm__backend *be;
    int max_inflight;
    lnorm__stats *st;
    lnorm__finish_fn finish;
    void *arg;
};

/* A batch on the backend. */
typedef struct lnorm__bjob {
    lnorm__job job;          /* first: the backend sees this */
    lnorm__batcher *b;
    uint64_t start_ns;
    size_t n;
    lnorm__req **reqs;
    lnorm_segment *segs;
} lnorm__bjob;

static void lnorm__kick_locked(lnorm__batcher *b);

static void lnorm__on_timer(uv_poll_t *h, int status, int events)
{
    lnorm__batcher *b = h->data;
    uint64_t expirations;
    (void)status;
    (void)events;
    if (read(b->tfd, &expirations, sizeof expirations) < 0) {
        /* EAGAIN: already consumed; nothing to do but re-check. */
    }
    pthread_mutex_lock(&b->mu);
    b->timer_at = 0;
    lnorm__kick_locked(b);
}

/* Arm the timer for the absolute monotonic time at (0: disarm); lock held
 * (any thread: the timerfd is polled by the loop, set by whoever kicks). */
static void lnorm__timer_set_locked(lnorm__batcher *b, uint64_t at)
{
    if (at == b->timer_at)
        return;
    struct itimerspec its;
    memset(&its, 0, sizeof its);
    if (at) {
        its.it_value.tv_sec = (time_t)(at / 1000000000ull);
        its.it_value.tv_nsec = (long)(at % 1000000000ull);
    }
    timerfd_settime(b->tfd, at ? TFD_TIMER_ABSTIME : 0, &its, NULL);
    b->timer_at = at;
}

int lnorm__batcher_create(lnorm__batcher **out, uv_loop_t *loop, lnorm__backend *be, lnorm__stats *st,
                          const lnorm__batcher_opts *opts, lnorm__finish_fn finish, void *arg)
{
    lnorm__batcher *b = calloc(1, sizeof *b);
    if (!b)
        return LNORM_ENOMEM;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->idle_cv, NULL);
    b->opts = *opts;
    b->be = be;
    b->max_inflight = be->ops->max_inflight ? be->ops->max_inflight(be) : 1;
    if (b->max_inflight < 1)
        b->max_inflight = 1;
    b->st = st;
    b->finish = finish;
    b->arg = arg;
    b->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (b->tfd < 0 || uv_poll_init(loop, &b->timer, b->tfd) != 0) {
        if (b->tfd >= 0)
            close(b->tfd);
        pthread_cond_destroy(&b->idle_cv);
        pthread_mutex_destroy(&b->mu);
        free(b);
        return LNORM_EINTERNAL;
    }
    uv_poll_start(&b->timer, UV_READABLE, lnorm__on_timer);
    b->timer.data = b;
    *out = b;
    return LNORM_OK;
}

int lnorm__batcher_submit(lnorm__batcher *b, lnorm__req *r)
{
    r->next = NULL;
    pthread_mutex_lock(&b->mu);
    if (b->qlen >= b->opts.max_queue) {
        pthread_mutex_unlock(&b->mu);
        return LNORM_EQUEUEFULL;
    }
    if (b->closed) {
        pthread_mutex_unlock(&b->mu);
        return LNORM_EUNAVAIL;
    }
    if (b->tail)
        b->tail->next = r;
    else
        b->head = r;
    b->tail = r;
    b->qlen++;
    b->qrows += r->rows;
    b->qbytes += r->bytes;
    b->qdeadlines += r->deadline_ns != 0;
    atomic_fetch_add(&b->st->queue_depth, 1);
    /* Form and submit batches right here, on the queueing thread: no
     * hand-off to the loop (it only fires the timerfd). */
    lnorm__kick_locked(b);
    return LNORM_OK;
}

void lnorm__batcher_set_opts(lnorm__batcher *b, const lnorm__batcher_opts *opts)
{
    pthread_mutex_lock(&b->mu);
    b->opts = *opts;
    lnorm__kick_locked(b);
}

void lnorm__batcher_get_opts(lnorm__batcher *b, lnorm__batcher_opts *out)
{
    pthread_mutex_lock(&b->mu);
    *out = b->opts;
    pthread_mutex_unlock(&b->mu);
}

int lnorm__batcher_idle(lnorm__batcher *b)
{
    pthread_mutex_lock(&b->mu);
    int idle = !b->head && !b->inflight && !b->kickers;
    pthread_mutex_unlock(&b->mu);
    return idle;
}

/* Unlink r (whose predecessor is prev) from the queue; lock held. */
static void lnorm__unlink_locked(lnorm__batcher *b, lnorm__req *prev, lnorm__req *r)
{
    if (prev)
        prev->next = r->next;
    else
        b->head = r->next;
    if (b->tail == r)
        b->tail = prev;
    r->next = NULL;
    b->qlen--;
    b->qrows -= r->rows;
    b->qbytes -= r->bytes;
    b->qdeadlines -= r->deadline_ns != 0;
    atomic_fetch_sub(&b->st->queue_depth, 1);
}

static void lnorm__job_done(lnorm__job *job, int err, const char *why, uint64_t compute_ns)
{
    lnorm__bjob *j = (lnorm__bjob *)job;
    lnorm__batcher *b = j->b;
    lnorm__timing t;
    t.compute_us = compute_ns / 1000;
    t.batch_rows = (uint32_t)(job->rows > UINT32_MAX ? UINT32_MAX : job->rows);
    t.batch_requests = (uint32_t)j->n;
    lnorm__hist_observe(&b->st->compute_seconds, (double)compute_ns / 1e9);
    if (err) {
        atomic_fetch_add(&b->st->backend_errors, 1);
        LOG_ERROR("backend %s failed a batch of %zu requests: %s (%s)", b->be->ops->name, j->n, lnorm_strerror(err),
                  why ? why : "-");
    } else {
        atomic_fetch_add(&b->st->rows, job->rows);
    }
    for (size_t i = 0; i < j->n; i++) {
        lnorm__req *r = j->reqs[i];
        t.queue_us = (j->start_ns - r->recv_ns) / 1000;
        b->finish(b->arg, r, err, why, &t);
    }
    free(j);
    pthread_mutex_lock(&b->mu);
    b->inflight--;
    atomic_fetch_sub(&b->st->batches_inflight, 1);
    if (!b->closed) {
        /* The backend has room again: form the next batch on this thread. */
        lnorm__kick_locked(b);
        return;
    }
    pthread_cond_broadcast(&b->idle_cv);
    pthread_mutex_unlock(&b->mu);
}

/* Take one batch from the head of the queue; lock held, queue not empty. */
static lnorm__bjob *lnorm__take_locked(lnorm__batcher *b)
{
    size_t n = 0;
    uint64_t rows = 0, bytes = 0;
    for (lnorm__req *r = b->head; r; r = r->next) {
        if (n > 0 && (rows + r->rows > b->opts.max_batch_rows || bytes + r->bytes > b->opts.max_batch_bytes))
            break;
        n++;
        rows += r->rows;
        bytes += r->bytes;
    }
    lnorm__bjob *j = malloc(sizeof *j + n * (sizeof(lnorm__req *) + sizeof(lnorm_segment)));
    if (!j)
        return NULL;
    memset(j, 0, sizeof *j);
    j->segs = (lnorm_segment *)(j + 1);
    j->reqs = (lnorm__req **)(j->segs + n);
    j->b = b;
    for (size_t i = 0; i < n; i++) {
        lnorm__req *r = b->head;
        lnorm__unlink_locked(b, NULL, r);
        j->reqs[i] = r;
        j->segs[i] = r->dec.seg;
    }
    j->n = n;
    j->job.batch.segs = j->segs;
    j->job.batch.nsegs = n;
    j->job.rows = rows;
    j->job.bytes = bytes;
    j->job.done = lnorm__job_done;
    j->job.arg = b;
    return j;
}

/* The batcher a thread is kicking: a job that finishes inside a kick (a
 * backend that ran it inline, or one that refused it) asks that kick to go
 * round again instead of recursing. */
static _Thread_local lnorm__batcher *lnorm__tl_kicking;

/* Fail expired requests, form batches and submit them while the backend has
 * room, arm the timer for the next batch or deadline. Any thread: entered
 * with the lock held, returns with it released. */
static void lnorm__kick_locked(lnorm__batcher *b)
{
    if (lnorm__tl_kicking == b) {
        b->rekick = 1;
        pthread_mutex_unlock(&b->mu);
        return;
    }
    lnorm__tl_kicking = b;
    b->kickers++;
    for (;;) {
        lnorm__req *expired = NULL, **exp_tail = &expired;
        lnorm__bjob *jobs[64];
        int njobs = 0;
        uint64_t now = lnorm__now_ns(), wake_at = 0;

        b->rekick = 0;
        /* Requests past their deadline leave the queue uncomputed. */
        for (lnorm__req *prev = NULL, *r = b->qdeadlines ? b->head : NULL; r;) {
            lnorm__req *next = r->next;
            if (r->deadline_ns && now >= r->deadline_ns) {
                lnorm__unlink_locked(b, prev, r);
                *exp_tail = r;
                exp_tail = &r->next;
            } else {
                prev = r;
            }
            r = next;
        }
        while (b->head && b->inflight < b->max_inflight && njobs < 64) {
            uint64_t ready_at = b->head->recv_ns + b->opts.max_queue_delay_us * 1000;
            if (b->opts.max_queue_delay_us && now < ready_at && b->qrows < b->opts.max_batch_rows &&
                b->qbytes < b->opts.max_batch_bytes) {
                wake_at = ready_at;
                break;
            }
            lnorm__bjob *j = lnorm__take_locked(b);
            if (!j) {
                wake_at = now + 1000000; /* out of memory: retry in 1 ms */
                break;
            }
            b->inflight++;
            atomic_fetch_add(&b->st->batches_inflight, 1);
            jobs[njobs++] = j;
        }
        for (lnorm__req *r = b->qdeadlines ? b->head : NULL; r; r = r->next)
            if (r->deadline_ns && (!wake_at || r->deadline_ns < wake_at))
                wake_at = r->deadline_ns;
        /* With a batch running, its completion kicks again: no timer is
         * needed for a head that is ready but waiting for room. */
        lnorm__timer_set_locked(b, wake_at ? (wake_at > now ? wake_at : now + 1) : 0);
        pthread_mutex_unlock(&b->mu);

        while (expired) {
            lnorm__req *r = expired;
            expired = r->next;
            r->next = NULL;
            lnorm__timing t = {(now - r->recv_ns) / 1000, 0, 0, 0};
            b->finish(b->arg, r, LNORM_ETIMEDOUT, "deadline exceeded while queued", &t);
        }
        for (int i = 0; i < njobs; i++) {
            lnorm__bjob *j = jobs[i];
            j->start_ns = lnorm__now_ns();
            atomic_fetch_add(&b->st->batches, 1);
            lnorm__hist_observe(&b->st->batch_rows, (double)j->job.rows);
            lnorm__hist_observe(&b->st->batch_requests, (double)j->n);
            for (size_t k = 0; k < j->n; k++)
                lnorm__hist_observe(&b->st->queue_seconds, (double)(j->start_ns - j->reqs[k]->recv_ns) / 1e9);
            /* The backend may run the job right here and call done. */
            int rc = b->be->ops->submit(b->be, &j->job);
            if (rc != LNORM_OK)
                lnorm__job_done(&j->job, rc, "backend refused the batch", 0);
        }

        pthread_mutex_lock(&b->mu);
        if (!(b->rekick || njobs == 64) || b->closed)
            break;
    }
    b->kickers--;
    lnorm__tl_kicking = NULL;
    pthread_cond_broadcast(&b->idle_cv);
    pthread_mutex_unlock(&b->mu);
}

void lnorm__batcher_close(lnorm__batcher *b)
{
    pthread_mutex_lock(&b->mu);
    b->closed = 1;
    pthread_mutex_unlock(&b->mu);
    uv_poll_stop(&b->timer);
    uv_close((uv_handle_t *)&b->timer, NULL);
}

void lnorm__batcher_abort(lnorm__batcher *b)
{
    lnorm__req *list = NULL, **tail = &list;
    pthread_mutex_lock(&b->mu);
    b->closed = 1;
    while (b->head) {
        lnorm__req *r = b->head;
        lnorm__unlink_locked(b, NULL, r);
        *tail = r;
        tail = &r->next;
    }
    pthread_mutex_unlock(&b->mu);
    while (list) {
        lnorm__req *r = list;
        list = r->next;
        r->next = NULL;
        lnorm__timing t = {(lnorm__now_ns() - r->recv_ns) / 1000, 0, 0, 0};
        b->finish(b->arg, r, LNORM_EUNAVAIL, "lnormd is shutting down", &t);
    }
    pthread_mutex_lock(&b->mu);
    while (b->inflight || b->kickers)
        pthread_cond_wait(&b->idle_cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
}

void lnorm__batcher_destroy(lnorm__batcher *b)
{
    if (!b)
        return;
    if (b->tfd >= 0)
        close(b->tfd);
    pthread_cond_destroy(&b->idle_cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
