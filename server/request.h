/* A Normalize (or NormalizeBackward) request on its way through the batcher
 * (short-lived). */
#ifndef LNORM_SERVER_REQUEST_H
#define LNORM_SERVER_REQUEST_H

#include <stdint.h>

#include "codec.h"
#include "params.h"

/* What the batcher reports with each finished request. */
typedef struct lnorm__timing {
    uint64_t queue_us;
    uint64_t compute_us;
    uint32_t batch_rows;
    uint32_t batch_requests;
    uint64_t done_ns;         /* when its batch finished (monotonic) */
} lnorm__timing;

struct lnorm__region;
struct lnorm__ring;
struct lnorm__group;

typedef struct lnorm__req {
    struct lnorm__req *next;  /* queue link (the batcher's, then the reply pool's) */
    void *slot;               /* transport context that replies (NULL: ring or group) */
    struct lnorm__ring *ring; /* the ring it came from (a reference), or NULL */
    struct lnorm__group *group; /* one chunk of a larger request, or NULL */
    struct lnorm__region *rg[8]; /* regions its tensors lie in (references) */
    int nrg;
    int on_device;            /* every tensor is memory of GPU `gpu` (CUDA IPC regions) */
    int gpu;
    lnorm__decoded dec;       /* the message; dec.seg has inputs AND outputs set */
    lnorm__pset *pset;        /* registered params in use, or NULL */
    uint64_t recv_ns;         /* receipt (monotonic) */
    uint64_t deadline_ns;     /* 0: none */
    unsigned priority;        /* as asked (0: default); the level 1..16 once queued */
    uint64_t max_queue_us;    /* as asked (0: the server's); the wait in force once queued */
    uint64_t queue_deadline_ns; /* receipt + max_queue_us (0: none; set by the batcher) */
    uint64_t rows;
    uint64_t bytes;           /* payload in + out */
    uint64_t reserved;        /* counted in the daemon's in-flight bytes */
    void *y, *mean, *rstd, *res_out; /* output buffers (backend memory); a backward's
                                        dx, dgamma, dbeta are y, mean, rstd */
    lnorm__timing timing;     /* set when its batch finishes (for the reply pool) */
} lnorm__req;

#endif
