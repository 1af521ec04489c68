/*
 * The submission ring: how a local client and lnormd share requests and
 * replies through memory instead of the socket (docs/shm.md).
 *
 * A ring lies inside a host region the client registered (RegisterRegion)
 * and is attached with AttachRing (lnorm_ring_attach in lnorm.h). It is a
 * header, then `entries` submission entries (lnorm_ring_sqe), then
 * `entries` completion entries (lnorm_ring_cqe); entries is a power of two.
 * Tensors are named by byte offsets into the same region.
 *
 * Indices are free-running 32-bit counters (entry = index & (entries - 1)):
 *   sq_tail  client: descriptors published;   sq_head  lnormd: taken
 *   cq_tail  lnormd: completions published;   cq_head  client: consumed
 * A side publishes an entry by writing it and then storing its tail with
 * release order; the other side loads the tail with acquire order. lnormd
 * copies a descriptor out of the ring once and checks that copy, so the
 * client may overwrite its ring at any time (it only hurts itself). lnormd
 * takes a descriptor only when its completion is sure to find room, so a
 * client that stops reaping stalls its own ring and nobody else's.
 *
 * Doorbells are futexes on the tail words, so that neither side spins
 * when idle: lnormd sets server_idle before it sleeps on sq_tail, and a
 * client that published with server_idle set does FUTEX_WAKE on sq_tail;
 * a client sets client_waiting before it sleeps on cq_tail, and lnormd
 * wakes it after publishing. Both re-check the tail after setting the
 * flag (a sequentially consistent fence between), so no wake-up is lost.
 */
#ifndef LNORM_RING_H
#define LNORM_RING_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LNORM_RING_MAGIC 0x4e524e4cu /* "LNRN" little-endian */
#define LNORM_RING_VERSION 1u
#define LNORM_RING_MIN_ENTRIES 2u
#define LNORM_RING_MAX_ENTRIES 65536u
/* Offset of an absent tensor in a descriptor. */
#define LNORM_RING_NONE UINT64_MAX
/* Bytes of the completion's message (NUL-terminated, truncated). */
#define LNORM_RING_MSG 96

/* A request: 128 bytes. Offsets are from the start of the region (not of
 * the ring); each tensor must lie inside the region, aligned to its
 * element. Dtypes are lnorm_dtype values (y_dtype / param_dtype NONE: x's). */
typedef struct lnorm_ring_sqe {
    uint64_t tag;          /* the client's, echoed in the completion */
    uint8_t op;            /* lnorm_op */
    uint8_t x_dtype, y_dtype, param_dtype;
    uint8_t eps_mode;      /* lnorm_eps_mode */
    uint8_t want_stats;    /* 1: mean (LayerNorm) and rstd are written */
    uint8_t priority;      /* 0: the server's default level */
    uint8_t reserved0;     /* 0 */
    float eps;             /* 0: the default, 1e-5 */
    uint32_t reserved1;    /* 0 */
    uint64_t rows, hidden;
    uint64_t max_queue_us; /* 0: the server's max-queue-wait-us */
    uint64_t deadline_us;  /* from lnormd taking it; 0: none */
    uint64_t x, residual, y, mean, rstd, residual_out, gamma, beta;
    uint64_t reserved2;    /* 0 */
} lnorm_ring_sqe;

/* A reply: 128 bytes. */
typedef struct lnorm_ring_cqe {
    uint64_t tag;
    int32_t err;           /* lnorm error code (LNORM_OK: outputs written) */
    uint32_t batch_rows;   /* rows of the batch it rode in */
    uint32_t queue_us, compute_us;
    uint32_t batch_requests;
    uint32_t reserved;
    char message[LNORM_RING_MSG]; /* why, for an error */
} lnorm_ring_cqe;

/* The header: 256 bytes, each side's words on their own cache line. */
typedef struct lnorm_ring_hdr {
    uint32_t magic, version, entries, reserved0;
    uint8_t pad0[48];
    uint32_t sq_tail;        /* client */
    uint8_t pad1[60];
    uint32_t sq_head;        /* lnormd */
    uint32_t server_idle;    /* lnormd: 1 while it may sleep on sq_tail */
    uint32_t cq_tail;        /* lnormd */
    uint8_t pad2[52];
    uint32_t cq_head;        /* client */
    uint32_t client_waiting; /* client: 1 while it may sleep on cq_tail */
    uint8_t pad3[56];
} lnorm_ring_hdr;

/* Bytes a ring of `entries` entries takes in its region. */
static inline uint64_t lnorm_ring_bytes(uint32_t entries)
{
    return (uint64_t)sizeof(lnorm_ring_hdr) + (uint64_t)entries * (sizeof(lnorm_ring_sqe) + sizeof(lnorm_ring_cqe));
}

static inline lnorm_ring_sqe *lnorm_ring_sq(lnorm_ring_hdr *h)
{
    return (lnorm_ring_sqe *)(void *)(h + 1);
}

static inline lnorm_ring_cqe *lnorm_ring_cq(lnorm_ring_hdr *h)
{
    return (lnorm_ring_cqe *)(void *)(lnorm_ring_sq(h) + h->entries);
}

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(lnorm_ring_sqe) == 128, "lnorm_ring_sqe is 128 bytes");
_Static_assert(sizeof(lnorm_ring_cqe) == 128, "lnorm_ring_cqe is 128 bytes");
_Static_assert(sizeof(lnorm_ring_hdr) == 256, "lnorm_ring_hdr is 256 bytes");
#endif

#ifdef __cplusplus
}
#endif
#endif /* LNORM_RING_H */
