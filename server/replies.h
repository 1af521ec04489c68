/*
 * The reply pool: threads that finish the requests of completed batches
 * (the batcher's finish callback, which encodes and sends each reply), so
 * that the thread completing a batch (the CUDA backend's completion thread,
 * or an NNG thread that ran a CPU batch inline) hands its replies out
 * instead of encoding and sending them one after another.
 */
#ifndef LNORM_SERVER_REPLIES_H
#define LNORM_SERVER_REPLIES_H

#include <stddef.h>

#include "request.h"

typedef struct lnorm__replies lnorm__replies;

/* Called once per pushed request, on a pool thread; takes r. */
typedef void (*lnorm__replies_fn)(void *arg, lnorm__req *r);

/* nthreads >= 1. LNORM_ENOMEM, or LNORM_EINTERNAL when no thread starts. */
int lnorm__replies_create(lnorm__replies **out, int nthreads, lnorm__replies_fn fn, void *arg);
/* Queue the list head..tail (n requests, linked by next); any thread. */
void lnorm__replies_push(lnorm__replies *p, lnorm__req *head, lnorm__req *tail, size_t n);
/* Requests queued or being finished. */
size_t lnorm__replies_pending(lnorm__replies *p);
/* Wait until nothing is queued or being finished. */
void lnorm__replies_wait_idle(lnorm__replies *p);
/* Finish what is queued, stop and join the threads, free. */
void lnorm__replies_destroy(lnorm__replies *p);

#endif
