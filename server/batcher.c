/*
 * Batch formation and the backend job life cycle. Batches form under the
 * lock on whichever thread has cause: the one that queues a request, the
 * one that finishes a batch (the backend has room again), and the loop
 * thread when the timerfd fires (a max_queue_delay_us wait ends, a queued
 * deadline or max_queue_us passes) or the options change.
 */
#include <pthread.h>
#include <stdio.h>
#include <sys/timerfd.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "batcher.h"
#include "log.h"
#include "replies.h"

struct lnorm__batcher {
    pthread_mutex_t mu;
    pthread_cond_t idle_cv;   /* signalled when a job finishes */
    struct {
        lnorm__req *head, *tail; /* in arrival order */
        uint64_t n;
    } q[LNORM__MAX_PRIORITY]; /* one queue per priority level ([0]: level 1) */
    uint64_t qlen, qrows, qbytes; /* all levels */
    uint64_t qdeadlines;      /* queued requests with a deadline or a max queue wait */
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
    lnorm__replies *replies;  /* NULL: finish on the completing thread */
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

/* When r leaves the queue unless taken first: its deadline or the end of
 * its longest queue wait, the earlier (0: never). */
static uint64_t lnorm__expiry(const lnorm__req *r)
{
    uint64_t a = r->deadline_ns, q = r->queue_deadline_ns;
    return !a ? q : !q ? a : a < q ? a : q;
}

/* The options with their priority fields in range. */
static lnorm__batcher_opts lnorm__opts_fixed(const lnorm__batcher_opts *o)
{
    lnorm__batcher_opts f = *o;
    if (f.priority_levels < 1)
        f.priority_levels = 1;
    if (f.priority_levels > LNORM__MAX_PRIORITY)
        f.priority_levels = LNORM__MAX_PRIORITY;
    if (f.default_priority < 1)
        f.default_priority = 1;
    if (f.default_priority > f.priority_levels)
        f.default_priority = f.priority_levels;
    return f;
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

/* A completed request on a reply pool thread. */
static void lnorm__finish_pooled(void *arg, lnorm__req *r)
{
    lnorm__batcher *b = arg;
    b->finish(b->arg, r, LNORM_OK, NULL, &r->timing);
}

int lnorm__batcher_create(lnorm__batcher **out, uv_loop_t *loop, lnorm__backend *be, lnorm__stats *st,
                          const lnorm__batcher_opts *opts, lnorm__finish_fn finish, void *arg)
{
    lnorm__batcher *b = calloc(1, sizeof *b);
    if (!b)
        return LNORM_ENOMEM;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->idle_cv, NULL);
    b->opts = lnorm__opts_fixed(opts);
    atomic_store(&st->priority_levels, (int)b->opts.priority_levels);
    b->be = be;
    b->max_inflight = be->ops->max_inflight ? be->ops->max_inflight(be) : 1;
    if (b->max_inflight < 1)
        b->max_inflight = 1;
    b->st = st;
    b->finish = finish;
    b->arg = arg;
    if (opts->reply_threads &&
        lnorm__replies_create(&b->replies, (int)opts->reply_threads, lnorm__finish_pooled, b) != LNORM_OK)
        b->tfd = -1;
    else
        b->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (b->tfd < 0 || uv_poll_init(loop, &b->timer, b->tfd) != 0) {
        if (b->tfd >= 0)
            close(b->tfd);
        lnorm__replies_destroy(b->replies);
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

int lnorm__batcher_submit(lnorm__batcher *b, lnorm__req *r, char *why, size_t why_len)
{
    r->next = NULL;
    pthread_mutex_lock(&b->mu);
    const lnorm__batcher_opts *o = &b->opts;
    int rc = LNORM_OK;
    unsigned lv = r->priority ? r->priority : o->default_priority;
    if (r->priority > o->priority_levels) {
        snprintf(why, why_len, "normalize.priority: %u is out of range [0, %u] (priority-levels %u; 0: "
                 "default-priority %u)", r->priority, o->priority_levels, o->priority_levels, o->default_priority);
        rc = LNORM_EINVAL;
    } else if (b->qlen >= o->max_queue) {
        snprintf(why, why_len, "queue full: %llu requests waiting (max-queue)", (unsigned long long)o->max_queue);
        rc = LNORM_EQUEUEFULL;
    } else if (o->priority_max_queue[lv - 1] && b->q[lv - 1].n >= o->priority_max_queue[lv - 1]) {
        snprintf(why, why_len, "queue full at priority %u: %llu requests of that level waiting (priority-max-queue)",
                 lv, (unsigned long long)o->priority_max_queue[lv - 1]);
        atomic_fetch_add(&b->st->level[lv - 1].rejected, 1);
        rc = LNORM_EQUEUEFULL;
    } else if (b->closed) {
        snprintf(why, why_len, "shutting down");
        rc = LNORM_EUNAVAIL;
    }
    if (rc != LNORM_OK) {
        pthread_mutex_unlock(&b->mu);
        return rc;
    }
    r->priority = lv;
    if (!r->max_queue_us)
        r->max_queue_us = o->max_queue_wait_us;
    r->queue_deadline_ns = 0;
    if (r->max_queue_us)
        r->queue_deadline_ns =
            r->recv_ns + (r->max_queue_us > UINT64_MAX / 4000 ? UINT64_MAX / 4 : r->max_queue_us * 1000);
    if (b->q[lv - 1].tail)
        b->q[lv - 1].tail->next = r;
    else
        b->q[lv - 1].head = r;
    b->q[lv - 1].tail = r;
    b->q[lv - 1].n++;
    b->qlen++;
    b->qrows += r->rows;
    b->qbytes += r->bytes;
    b->qdeadlines += lnorm__expiry(r) != 0;
    atomic_fetch_add(&b->st->queue_depth, 1);
    atomic_fetch_add(&b->st->level[lv - 1].queue_depth, 1);
    /* Form and submit batches right here, on the queueing thread: no
     * hand-off to the loop (it only fires the timerfd). */
    lnorm__kick_locked(b);
    return LNORM_OK;
}

void lnorm__batcher_set_opts(lnorm__batcher *b, const lnorm__batcher_opts *opts)
{
    pthread_mutex_lock(&b->mu);
    b->opts = lnorm__opts_fixed(opts);
    atomic_store(&b->st->priority_levels, (int)b->opts.priority_levels);
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
    int idle = !b->qlen && !b->inflight && !b->kickers;
    pthread_mutex_unlock(&b->mu);
    return idle && (!b->replies || lnorm__replies_pending(b->replies) == 0);
}

/* Unlink r (whose predecessor is prev) from its level's queue; lock held. */
static void lnorm__unlink_locked(lnorm__batcher *b, lnorm__req *prev, lnorm__req *r)
{
    unsigned l = r->priority - 1;
    if (prev)
        prev->next = r->next;
    else
        b->q[l].head = r->next;
    if (b->q[l].tail == r)
        b->q[l].tail = prev;
    r->next = NULL;
    b->q[l].n--;
    b->qlen--;
    b->qrows -= r->rows;
    b->qbytes -= r->bytes;
    b->qdeadlines -= lnorm__expiry(r) != 0;
    atomic_fetch_sub(&b->st->queue_depth, 1);
    atomic_fetch_sub(&b->st->level[l].queue_depth, 1);
}

static void lnorm__job_done(lnorm__job *job, int err, const char *why, uint64_t compute_ns)
{
    lnorm__bjob *j = (lnorm__bjob *)job;
    lnorm__batcher *b = j->b;
    lnorm__timing t = {0};
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
    t.done_ns = lnorm__now_ns();
    if (b->replies && !err) {
        /* Replies of a good batch go to the pool as one list; an error
         * (why may not outlive this call) is answered right here. */
        for (size_t i = 0; i < j->n; i++) {
            lnorm__req *r = j->reqs[i];
            r->timing = t;
            r->timing.queue_us = (j->start_ns - r->recv_ns) / 1000;
            r->next = i + 1 < j->n ? j->reqs[i + 1] : NULL;
        }
        if (j->n)
            lnorm__replies_push(b->replies, j->reqs[0], j->reqs[j->n - 1], j->n);
    } else {
        for (size_t i = 0; i < j->n; i++) {
            lnorm__req *r = j->reqs[i];
            t.queue_us = (j->start_ns - r->recv_ns) / 1000;
            b->finish(b->arg, r, err, why, &t);
        }
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

/* Take one batch: requests from the highest level down, FIFO within a
 * level, up to the first that does not fit the caps; lock held, queue
 * not empty. */
static lnorm__bjob *lnorm__take_locked(lnorm__batcher *b)
{
    size_t n = 0, per[LNORM__MAX_PRIORITY] = {0};
    uint64_t rows = 0, bytes = 0;
    int full = 0;
    for (int l = LNORM__MAX_PRIORITY - 1; l >= 0 && !full; l--) {
        for (lnorm__req *r = b->q[l].head; r; r = r->next) {
            if (n > 0 && (rows + r->rows > b->opts.max_batch_rows || bytes + r->bytes > b->opts.max_batch_bytes)) {
                full = 1;
                break;
            }
            n++;
            per[l]++;
            rows += r->rows;
            bytes += r->bytes;
        }
    }
    /* Forward and backward requests share the batch; their segments go
     * to the job's two tables (room for n in each). */
    lnorm__bjob *j = malloc(sizeof *j + n * (sizeof(lnorm__req *) + sizeof(lnorm_segment) + sizeof(lnorm_bwd_segment)));
    if (!j)
        return NULL;
    memset(j, 0, sizeof *j);
    j->segs = (lnorm_segment *)(j + 1);
    lnorm_bwd_segment *bsegs = (lnorm_bwd_segment *)(j->segs + n);
    j->reqs = (lnorm__req **)(bsegs + n);
    j->b = b;
    size_t i = 0, nf = 0, nb = 0;
    for (int l = LNORM__MAX_PRIORITY - 1; l >= 0; l--) {
        for (size_t k = 0; k < per[l]; k++, i++) {
            lnorm__req *r = b->q[l].head;
            lnorm__unlink_locked(b, NULL, r);
            j->reqs[i] = r;
            if (r->dec.kind == LNORM__REQ_BACKWARD)
                bsegs[nb++] = r->dec.bseg;
            else
                j->segs[nf++] = r->dec.seg;
        }
    }
    j->n = n;
    j->job.batch.segs = j->segs;
    j->job.batch.nsegs = nf;
    j->job.bwd.segs = bsegs;
    j->job.bwd.nsegs = nb;
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
        /* Requests past their deadline or max queue wait leave the queue
         * uncomputed. */
        for (int l = 0; l < LNORM__MAX_PRIORITY && b->qdeadlines; l++) {
            for (lnorm__req *prev = NULL, *r = b->q[l].head; r;) {
                lnorm__req *next = r->next;
                uint64_t e = lnorm__expiry(r);
                if (e && now >= e) {
                    lnorm__unlink_locked(b, prev, r);
                    *exp_tail = r;
                    exp_tail = &r->next;
                } else {
                    prev = r;
                }
                r = next;
            }
        }
        while (b->qlen && b->inflight < b->max_inflight && njobs < 64) {
            uint64_t oldest = UINT64_MAX;
            for (int l = 0; l < LNORM__MAX_PRIORITY; l++)
                if (b->q[l].head && b->q[l].head->recv_ns < oldest)
                    oldest = b->q[l].head->recv_ns;
            uint64_t ready_at = oldest + b->opts.max_queue_delay_us * 1000;
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
        for (int l = 0; l < LNORM__MAX_PRIORITY && b->qdeadlines; l++) {
            for (lnorm__req *r = b->q[l].head; r; r = r->next) {
                uint64_t e = lnorm__expiry(r);
                if (e && (!wake_at || e < wake_at))
                    wake_at = e;
            }
        }
        /* With a batch running, its completion kicks again: no timer is
         * needed for a head that is ready but waiting for room. */
        lnorm__timer_set_locked(b, wake_at ? (wake_at > now ? wake_at : now + 1) : 0);
        pthread_mutex_unlock(&b->mu);

        while (expired) {
            lnorm__req *r = expired;
            expired = r->next;
            r->next = NULL;
            lnorm__timing t = {.queue_us = (now - r->recv_ns) / 1000};
            if (r->queue_deadline_ns && r->queue_deadline_ns == lnorm__expiry(r)) {
                char why[128];
                snprintf(why, sizeof why, "waited past max_queue_us (%llu us) in the queue at priority %u; not run",
                         (unsigned long long)r->max_queue_us, r->priority);
                atomic_fetch_add(&b->st->level[r->priority - 1].queue_timeouts, 1);
                b->finish(b->arg, r, LNORM_ETIMEDOUT, why, &t);
            } else {
                b->finish(b->arg, r, LNORM_ETIMEDOUT, "deadline exceeded while queued", &t);
            }
        }
        for (int i = 0; i < njobs; i++) {
            lnorm__bjob *j = jobs[i];
            j->start_ns = lnorm__now_ns();
            atomic_fetch_add(&b->st->batches, 1);
            lnorm__hist_observe(&b->st->batch_rows, (double)j->job.rows);
            lnorm__hist_observe(&b->st->batch_requests, (double)j->n);
            for (size_t k = 0; k < j->n; k++) {
                lnorm__req *r = j->reqs[k];
                double qs = (double)(j->start_ns - r->recv_ns) / 1e9;
                lnorm__hist_observe(&b->st->queue_seconds, qs);
                lnorm__hist_observe(&b->st->level[r->priority - 1].queue_seconds, qs);
                atomic_fetch_add(&b->st->level[r->priority - 1].taken, 1);
            }
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
    for (int l = LNORM__MAX_PRIORITY - 1; l >= 0; l--) {
        while (b->q[l].head) {
            lnorm__req *r = b->q[l].head;
            lnorm__unlink_locked(b, NULL, r);
            *tail = r;
            tail = &r->next;
        }
    }
    pthread_mutex_unlock(&b->mu);
    while (list) {
        lnorm__req *r = list;
        list = r->next;
        r->next = NULL;
        lnorm__timing t = {.queue_us = (lnorm__now_ns() - r->recv_ns) / 1000};
        b->finish(b->arg, r, LNORM_EUNAVAIL, "lnormd is shutting down", &t);
    }
    pthread_mutex_lock(&b->mu);
    while (b->inflight || b->kickers)
        pthread_cond_wait(&b->idle_cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
    if (b->replies)
        lnorm__replies_wait_idle(b->replies);
}

void lnorm__batcher_destroy(lnorm__batcher *b)
{
    if (!b)
        return;
    lnorm__replies_destroy(b->replies); /* finishes whatever is still queued */
    if (b->tfd >= 0)
        close(b->tfd);
    pthread_cond_destroy(&b->idle_cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
