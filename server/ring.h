/*
 * Submission rings of local clients (layout and protocol:
 * include/lnorm/ring.h): the poller thread that takes descriptors out of
 * every attached ring and hands them to dispatch, and the completion side
 * that publishes replies and wakes the client.
 *
 * A ring is a long-lived handle on part of a region (it holds a reference
 * on it); each request taken from it holds a reference on the ring, so
 * that its completion always has somewhere to go, even after the ring was
 * detached (the completion is then written and nobody reads it).
 */
#ifndef LNORM_SERVER_RING_H
#define LNORM_SERVER_RING_H

#include <stddef.h>
#include <stdint.h>

#include "lnorm/ring.h"
#include "regions.h"
#include "request.h"

typedef struct lnorm__ring lnorm__ring;
typedef struct lnorm__rings lnorm__rings;

/* Hand one descriptor (a private copy) taken from ring to dispatch, which
 * must complete it exactly once (lnorm__ring_complete), from any thread;
 * the request holds a reference on ring, which that completion drops. */
typedef void (*lnorm__ring_take_fn)(void *arg, lnorm__ring *ring, const lnorm_ring_sqe *sqe, uint64_t recv_ns);

/* The most rings one lnormd serves (one futex_waitv call waits on all). */
#define LNORM__MAX_RINGS 127

int lnorm__rings_create(lnorm__rings **out, lnorm__ring_take_fn take, void *arg);
/* Stop the poller (rings must have been removed) and free. */
void lnorm__rings_destroy(lnorm__rings *rs);

/* A ring over region rg at offset off (checked to fit by the caller):
 * writes the header (magic, version, entries, zero indices). */
int lnorm__ring_create(lnorm__ring **out, lnorm__region *rg, uint64_t off, uint32_t entries, char *why, size_t n);
/* Join / leave the poller; after lnorm__rings_remove returns the poller
 * no longer reads the ring. */
int lnorm__rings_add(lnorm__rings *rs, lnorm__ring *r, char *why, size_t n);
void lnorm__rings_remove(lnorm__rings *rs, lnorm__ring *r);
void lnorm__ring_ref(lnorm__ring *r);
void lnorm__ring_put(lnorm__ring *r);
/* The region the ring lies in (its tensors are offsets into it). */
lnorm__region *lnorm__ring_region(lnorm__ring *r);

/* Publish the completion of descriptor tag: err (LNORM_OK: outputs
 * written) with why, timings t (may be NULL); wakes a waiting client.
 * Drops the reference the request held on the ring. */
void lnorm__ring_complete(lnorm__ring *r, uint64_t tag, int err, const char *why, const lnorm__timing *t);

#endif
