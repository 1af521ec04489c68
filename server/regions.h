/*
 * Shared-memory regions of local clients (docs/shm.md): the table of
 * regions each client registered, mapped once into lnormd and pinned by the
 * backend where it can, and the checks that keep one client out of
 * another's memory and lnormd safe from what a client does to its own.
 *
 * A region is a long-lived handle: registered over the ipc transport by a
 * peer whose uid is allowed (the peer's pid and uid come from the socket,
 * SO_PEERCRED, never from the message), usable only by requests from the
 * same process, and dropped when unregistered or when the connection that
 * registered it closes. Each request (and ring) that uses a region holds a
 * reference: the mapping goes only when the last one is put, so a request
 * in flight always writes into mapped memory, whatever its client does.
 *
 * A host region is a memfd sealed against shrinking (F_SEAL_SHRINK): its
 * pages cannot vanish under lnormd, so no access can raise SIGBUS. A device
 * region is a CUDA IPC allocation opened through the backend.
 */
#ifndef LNORM_SERVER_REGIONS_H
#define LNORM_SERVER_REGIONS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "peer.h"

typedef struct lnorm__regions_opts {
    int allow;                 /* allow-shm */
    uint64_t uids[16];         /* shm-uids: uids allowed besides lnormd's own */
    int nuids;
    uint64_t max_regions;      /* per client process */
    uint64_t max_bytes;        /* mapped bytes per client process */
} lnorm__regions_opts;

typedef struct lnorm__regions lnorm__regions;
struct lnorm__ring;
struct lnorm__rings;

typedef struct lnorm__region {
    uint64_t id;
    uint32_t pipe;             /* the connection that registered it */
    int64_t pid;
    uint64_t uid;
    unsigned char *base;       /* host: mapped here; device: the device pointer */
    uint64_t bytes;
    int device;                /* a CUDA IPC region */
    uint32_t gpu;              /* device: the GPU it lives on */
    int pinned;                /* host: registered with the backend for DMA */
    atomic_int refs;           /* the table's + one per request or ring using it */
    atomic_uint_fast64_t requests; /* requests in flight using it */
    struct lnorm__ring *ring;  /* attached ring (under the table's lock) */
    lnorm__regions *rs;
    struct lnorm__region *next;
} lnorm__region;

int lnorm__regions_create(lnorm__regions **out, lnorm__backend *be, const lnorm__regions_opts *opts);
/* Unregister everything (rings detached first) and free: callers must have
 * put every region they got. */
void lnorm__regions_destroy(lnorm__regions *rs);
/* The ring poller that attached rings join (ring.h; NULL: rings refused). */
void lnorm__regions_set_rings(lnorm__regions *rs, struct lnorm__rings *rings);
void lnorm__regions_set_opts(lnorm__regions *rs, const lnorm__regions_opts *opts);

/* May this peer use regions at all? LNORM_OK, else LNORM_EPERM with why. */
int lnorm__regions_allowed(lnorm__regions *rs, const lnorm__peer *peer, char *why, size_t n);

/* Register the peer's memfd fd (its number in the peer) of `bytes` bytes:
 * LNORM_OK and *id, or LNORM_EPERM / LNORM_EINVAL / LNORM_ELIMIT /
 * LNORM_ENOMEM with why. */
int lnorm__regions_register_host(lnorm__regions *rs, const lnorm__peer *peer, uint32_t fd, uint64_t bytes,
                                 uint64_t *id, char *why, size_t n);
/* Register a CUDA IPC allocation (handle: 64 bytes) on GPU device. */
int lnorm__regions_register_device(lnorm__regions *rs, const lnorm__peer *peer, const void *handle,
                                   size_t handle_len, uint32_t device, uint64_t bytes, uint64_t *id, char *why,
                                   size_t n);
/* Unregister: LNORM_OK or LNORM_ENOTFOUND (not one of the peer's). */
int lnorm__regions_unregister(lnorm__regions *rs, const lnorm__peer *peer, uint64_t id);
/* The connection pipe closed: unregister every region it registered. */
void lnorm__regions_pipe_closed(lnorm__regions *rs, uint32_t pipe);

/* Get one of the peer's regions with a reference (put it with
 * lnorm__region_put): LNORM_OK, LNORM_ENOTFOUND or LNORM_EPERM. */
int lnorm__regions_get(lnorm__regions *rs, const lnorm__peer *peer, uint64_t id, lnorm__region **out);
void lnorm__region_ref(lnorm__region *r);
void lnorm__region_put(lnorm__region *r);

/* A tensor at [off, off + bytes) of r, aligned to align: its address, or
 * NULL with why filled. */
void *lnorm__region_at(const lnorm__region *r, uint64_t off, uint64_t bytes, uint64_t align, const char *what,
                       char *why, size_t n);

/* Attach a ring (ring.h) to the peer's region: LNORM_OK or an error. */
int lnorm__regions_attach_ring(lnorm__regions *rs, const lnorm__peer *peer, uint64_t id, uint64_t off,
                               uint32_t entries, struct lnorm__ring **ring, char *why, size_t n);

/* Up to max of the peer's regions described into out; returns the count. */
typedef struct lnorm__region_info {
    uint64_t id, bytes, requests;
    int device, ring;
} lnorm__region_info;
int lnorm__regions_list(lnorm__regions *rs, const lnorm__peer *peer, lnorm__region_info *out, int max);

/* Regions registered now, and their bytes (for /metrics). */
void lnorm__regions_count(lnorm__regions *rs, uint64_t *regions, uint64_t *bytes, uint64_t *rings);

#endif
