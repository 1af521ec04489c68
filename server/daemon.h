/* The daemon object: the long-lived handles tied together (one per process). */
#ifndef LNORM_SERVER_DAEMON_H
#define LNORM_SERVER_DAEMON_H

#include <stdatomic.h>

#include <uv.h>

#include "backend.h"
#include "batcher.h"
#include "codec.h"
#include "config.h"
#include "http.h"
#include "params.h"
#include "regions.h"
#include "ring.h"
#include "stats.h"
#include "transport.h"

typedef struct lnorm__daemon {
    lnorm__config cfg;
    int argc;                      /* the command line, for SIGHUP's reload */
    char **argv;
    lnorm__limits lim;
    uv_loop_t loop;
    uv_signal_t sig_int, sig_term, sig_hup;
    uv_timer_t housekeeping;
    lnorm__backend *be;
    int pinned;                    /* payloads through be's buf_alloc (LNORM__BACKEND_CAP_PINNED_BUFFERS) */
    int borrow;                    /* inputs left in the message (LNORM__BACKEND_CAP_BORROW_INPUT) */
    ProtobufCAllocator pb_alloc;   /* through be's buf_alloc when pinned */
    ProtobufCAllocator *pb_allocp; /* NULL: protobuf-c's default */
    lnorm__batcher *batcher;
    lnorm__params *params;
    lnorm__regions *regions;       /* clients' shared memory (allow-shm) */
    lnorm__rings *rings;           /* their submission rings' poller */
    lnorm__transport *tp;
    lnorm__http *http;
    lnorm__stats stats;
    atomic_int serving;            /* 1 once ready, 0 while draining */
    atomic_int draining;           /* SIGINT/SIGTERM seen */
    /* Requests on GPU memory with the backend: they skip the batcher, so
     * shutdown waits for this to reach 0 before the transport goes. */
    atomic_int dev_jobs;
    int stopping;                  /* the loop's handles are closing */
    uint64_t drain_start_ns;
    uint64_t last_stats_log_ns;
} lnorm__daemon;

/* The transport's message handler (dispatch.c). */
void lnorm__dispatch_msg(void *arg, void *slot, nng_msg *msg);
/* The batcher's finish handler (dispatch.c). */
void lnorm__dispatch_finish(void *arg, lnorm__req *r, int err, const char *why, const lnorm__timing *t);
/* The ring poller's handler (dispatch.c). */
void lnorm__dispatch_ring(void *arg, lnorm__ring *ring, const lnorm_ring_sqe *sqe, uint64_t recv_ns);
/* Set how payloads are allocated from the backend's caps (dispatch.c).
 * LNORM_EINTERNAL: the backend states a cap it does not implement. */
int lnorm__dispatch_init_alloc(lnorm__daemon *d);

#endif
