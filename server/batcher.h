/*
 * The batcher, the same for every backend. Requests queue (from any
 * thread); batches are formed from the head of the queue up to
 * max_batch_rows / max_batch_bytes, waiting at most max_queue_delay_us for
 * a batch to fill (0: take whatever queued while the backend was busy), and
 * submitted while the backend has room. A batch forms on the thread that
 * queues a request or finishes a batch; the daemon's loop thread forms one
 * only when the wait or a deadline ends (a timerfd) or the options change
 * (SIGHUP, drain). Requests of any shape, dtype and op share a batch as segments.
 * Each request has a priority level (1..priority_levels): a batch takes
 * requests from the highest level down, FIFO within a level, and stops at
 * the first that does not fit the caps; a level may have its own queue
 * limit. A request whose deadline, or whose longest queue wait
 * (max_queue_us: queueing only, not compute), passes while queued is
 * answered DEADLINE_EXCEEDED and never computed; both end on the same
 * timerfd. Every request submitted is finished exactly once; those of a
 * batch that completed are finished on the reply pool (replies.h) when
 * reply_threads > 0.
 */
#ifndef LNORM_SERVER_BATCHER_H
#define LNORM_SERVER_BATCHER_H

#include <uv.h>

#include "backend.h"
#include "request.h"
#include "stats.h"

typedef struct lnorm__batcher lnorm__batcher;

typedef struct lnorm__batcher_opts {
    uint64_t max_batch_rows;
    uint64_t max_batch_bytes;
    uint64_t max_queue_delay_us;
    uint64_t max_queue;
    unsigned priority_levels;   /* 1..LNORM__MAX_PRIORITY (0: 1) */
    unsigned default_priority;  /* level of a request that asks none (0: 1; capped at the levels) */
    uint64_t priority_max_queue[LNORM__MAX_PRIORITY]; /* [0]: level 1; 0: only max_queue */
    uint64_t max_queue_wait_us; /* for a request that asks none; 0: no limit */
    unsigned reply_threads;     /* at create only: threads that finish a completed batch's
                                   requests (0: the completing thread itself) */
} lnorm__batcher_opts;

/* Called once per request, from any thread: err LNORM_OK with outputs
 * written, or an error (why: a message or NULL). Takes ownership of r. */
typedef void (*lnorm__finish_fn)(void *arg, lnorm__req *r, int err, const char *why, const lnorm__timing *t);

int lnorm__batcher_create(lnorm__batcher **out, uv_loop_t *loop, lnorm__backend *be, lnorm__stats *st,
                          const lnorm__batcher_opts *opts, lnorm__finish_fn finish, void *arg);
/* Queue a request (any thread): r->priority (0: the default level) and
 * r->max_queue_us (0: max_queue_wait_us) are resolved here. On an error
 * the request is not queued and the caller keeps r; why (why_len bytes)
 * says why: LNORM_EINVAL (priority out of range), LNORM_EQUEUEFULL
 * (max_queue, or the level's limit), LNORM_EUNAVAIL (closed). */
int lnorm__batcher_submit(lnorm__batcher *b, lnorm__req *r, char *why, size_t why_len);
/* Change the options (loop thread). */
void lnorm__batcher_set_opts(lnorm__batcher *b, const lnorm__batcher_opts *opts);
/* The options in force (any thread: SIGHUP changes them on the loop
 * thread, so readers elsewhere take them from here, under the lock). */
void lnorm__batcher_get_opts(lnorm__batcher *b, lnorm__batcher_opts *out);
/* 1 when nothing is queued or running. */
int lnorm__batcher_idle(lnorm__batcher *b);
/* Close the loop handles (loop thread; the batcher must be idle). */
void lnorm__batcher_close(lnorm__batcher *b);
/* Shut-down: fail every queued request (LNORM_EUNAVAIL) and wait until no
 * batch is running. Any thread; no request is submitted afterwards. */
void lnorm__batcher_abort(lnorm__batcher *b);
/* Free after the loop has run the close callbacks. */
void lnorm__batcher_destroy(lnorm__batcher *b);

#endif
