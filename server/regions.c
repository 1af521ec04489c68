/* Shared-memory regions of local clients: the table, mapping and checks. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lnorm/errors.h"
#include "lnorm/ring.h"
#include "log.h"
#include "regions.h"
#include "ring.h"

#ifndef F_SEAL_SHRINK
#define F_ADD_SEALS 1033
#define F_GET_SEALS 1034
#define F_SEAL_SHRINK 0x0002
#endif

struct lnorm__regions {
    lnorm__backend *be;
    lnorm__rings *rings;        /* the ring poller (NULL: rings refused) */
    pthread_mutex_t mu;
    lnorm__regions_opts opts;
    lnorm__region *head;        /* registered regions */
    uint64_t next_id;
};

int lnorm__regions_create(lnorm__regions **out, lnorm__backend *be, const lnorm__regions_opts *opts)
{
    lnorm__regions *rs = calloc(1, sizeof *rs);
    if (!rs)
        return LNORM_ENOMEM;
    rs->be = be;
    rs->opts = *opts;
    pthread_mutex_init(&rs->mu, NULL);
    /* Ids start at a random point: a stale id from an earlier lnormd does
     * not name a region of this one by accident. */
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
        r = (uint64_t)getpid() << 32;
    rs->next_id = (r >> 16) | 1;
    *out = rs;
    return LNORM_OK;
}

void lnorm__regions_set_rings(lnorm__regions *rs, lnorm__rings *rings)
{
    rs->rings = rings;
}

void lnorm__regions_set_opts(lnorm__regions *rs, const lnorm__regions_opts *opts)
{
    pthread_mutex_lock(&rs->mu);
    rs->opts = *opts;
    pthread_mutex_unlock(&rs->mu);
}

static void lnorm__region_free(lnorm__region *r)
{
    lnorm__backend *be = r->rs->be;
    if (r->device) {
        if (be->ops->ipc_close)
            be->ops->ipc_close(be, r->base, r->gpu);
    } else {
        if (r->pinned && be->ops->host_unregister)
            be->ops->host_unregister(be, r->base);
        munmap(r->base, (size_t)r->bytes);
    }
    free(r);
}

void lnorm__region_ref(lnorm__region *r)
{
    atomic_fetch_add(&r->refs, 1);
}

void lnorm__region_put(lnorm__region *r)
{
    if (r && atomic_fetch_sub(&r->refs, 1) == 1)
        lnorm__region_free(r);
}

/* Take r out of the table (under rs->mu): its ring stops, its id no longer
 * resolves, the table's reference is put by the caller (outside the lock). */
static void lnorm__unlink(lnorm__regions *rs, lnorm__region **pp)
{
    lnorm__region *r = *pp;
    *pp = r->next;
    r->next = NULL;
    if (r->ring) {
        lnorm__rings_remove(rs->rings, r->ring);
        lnorm__ring_put(r->ring);
        r->ring = NULL;
    }
}

void lnorm__regions_destroy(lnorm__regions *rs)
{
    if (!rs)
        return;
    pthread_mutex_lock(&rs->mu);
    while (rs->head) {
        lnorm__region *r = rs->head;
        lnorm__unlink(rs, &rs->head);
        lnorm__region_put(r);
    }
    pthread_mutex_unlock(&rs->mu);
    pthread_mutex_destroy(&rs->mu);
    free(rs);
}

int lnorm__regions_allowed(lnorm__regions *rs, const lnorm__peer *peer, char *why, size_t n)
{
    pthread_mutex_lock(&rs->mu);
    int allow = rs->opts.allow, ok = 0;
    if (allow && peer->local) {
        ok = peer->uid == (uint64_t)geteuid();
        for (int i = 0; i < rs->opts.nuids && !ok; i++)
            ok = rs->opts.uids[i] == peer->uid;
    }
    pthread_mutex_unlock(&rs->mu);
    if (ok)
        return LNORM_OK;
    if (!allow)
        snprintf(why, n, "shared memory is off in this lnormd (allow-shm)");
    else if (!peer->local)
        snprintf(why, n, "shared memory is only for local clients over ipc://");
    else
        snprintf(why, n, "uid %llu may not use shared memory (shm-uids)", (unsigned long long)peer->uid);
    return LNORM_EPERM;
}

/* A region of peer's at base (bytes long), with the table's reference. */
static lnorm__region *lnorm__region_new(lnorm__regions *rs, const lnorm__peer *peer, void *base, uint64_t bytes)
{
    lnorm__region *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->pipe = peer->pipe;
    r->pid = peer->pid;
    r->uid = peer->uid;
    r->base = base;
    r->bytes = bytes;
    r->rs = rs;
    atomic_init(&r->refs, 1);
    atomic_init(&r->requests, 0);
    return r;
}

/* Count the peer's regions and bytes (under rs->mu). */
static void lnorm__usage(lnorm__regions *rs, int64_t pid, uint64_t *count, uint64_t *bytes)
{
    *count = *bytes = 0;
    for (lnorm__region *r = rs->head; r; r = r->next)
        if (r->pid == pid) {
            (*count)++;
            *bytes += r->bytes;
        }
}

/* Insert r if the peer stays within its limits: LNORM_OK or LNORM_ELIMIT. */
static int lnorm__insert(lnorm__regions *rs, lnorm__region *r, uint64_t *id, char *why, size_t n)
{
    pthread_mutex_lock(&rs->mu);
    uint64_t count, bytes;
    lnorm__usage(rs, r->pid, &count, &bytes);
    int rc = LNORM_OK;
    if (count + 1 > rs->opts.max_regions) {
        snprintf(why, n, "shm-max-regions: this process has %llu regions already (at most %llu)",
                 (unsigned long long)count, (unsigned long long)rs->opts.max_regions);
        rc = LNORM_ELIMIT;
    } else if (bytes + r->bytes > rs->opts.max_bytes) {
        snprintf(why, n, "shm-max-bytes: %llu bytes registered by this process, %llu more asked (at most %llu)",
                 (unsigned long long)bytes, (unsigned long long)r->bytes, (unsigned long long)rs->opts.max_bytes);
        rc = LNORM_ELIMIT;
    } else {
        r->id = rs->next_id++;
        if (!r->id)
            r->id = rs->next_id++;
        r->next = rs->head;
        rs->head = r;
        *id = r->id;
    }
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

int lnorm__regions_register_host(lnorm__regions *rs, const lnorm__peer *peer, uint32_t fd, uint64_t bytes,
                                 uint64_t *id, char *why, size_t n)
{
    int rc = lnorm__regions_allowed(rs, peer, why, n);
    if (rc != LNORM_OK)
        return rc;
    if (bytes > (uint64_t)SIZE_MAX / 2) {
        snprintf(why, n, "register_region.bytes: %llu is too large", (unsigned long long)bytes);
        return LNORM_EINVAL;
    }
    /* The pid is the kernel's (SO_PEERCRED): a client can only name its
     * own descriptors. */
    char path[64];
    snprintf(path, sizeof path, "/proc/%lld/fd/%u", (long long)peer->pid, fd);
    int f = open(path, O_RDWR | O_CLOEXEC);
    if (f < 0) {
        snprintf(why, n, "register_region.fd: cannot open descriptor %u of process %lld: %s", fd,
                 (long long)peer->pid, strerror(errno));
        return errno == EACCES || errno == EPERM ? LNORM_EPERM : LNORM_EINVAL;
    }
    struct stat st;
    int seals = fcntl(f, F_GET_SEALS);
    if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, n, "register_region.fd: descriptor %u is not a memfd", fd);
        rc = LNORM_EINVAL;
    } else if ((uint64_t)st.st_uid != peer->uid) {
        snprintf(why, n, "register_region.fd: descriptor %u belongs to uid %llu, the caller is uid %llu", fd,
                 (unsigned long long)st.st_uid, (unsigned long long)peer->uid);
        rc = LNORM_EPERM;
    } else if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        /* Without the seal the client could truncate it under lnormd,
         * whose next access would then raise SIGBUS. */
        snprintf(why, n,
                 "register_region.fd: descriptor %u is not a memfd sealed with F_SEAL_SHRINK "
                 "(memfd_create with MFD_ALLOW_SEALING, then fcntl F_ADD_SEALS)", fd);
        rc = LNORM_EINVAL;
    } else if ((uint64_t)st.st_size != bytes) {
        snprintf(why, n, "register_region.bytes: %llu, but the memfd has %lld bytes", (unsigned long long)bytes,
                 (long long)st.st_size);
        rc = LNORM_EINVAL;
    }
    if (rc != LNORM_OK) {
        close(f);
        return rc;
    }
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    int merr = errno;
    close(f);
    if (p == MAP_FAILED) {
        snprintf(why, n, "register_region: mapping %llu bytes failed: %s", (unsigned long long)bytes, strerror(merr));
        return LNORM_ENOMEM;
    }
    lnorm__region *r = lnorm__region_new(rs, peer, p, bytes);
    if (!r) {
        munmap(p, (size_t)bytes);
        snprintf(why, n, "out of memory");
        return LNORM_ENOMEM;
    }
    /* Pinned for the GPU's DMA where the backend can: copies to and from
     * the region then run at PCIe speed (pageable memory is some 10x
     * slower). Not fatal: the backend copies through its own buffers. */
    if (rs->be->ops->host_register) {
        if (rs->be->ops->host_register(rs->be, p, (size_t)bytes) == LNORM_OK)
            r->pinned = 1;
        else
            LOG_WARN("region of %llu bytes: the %s backend could not pin it; it is copied as pageable memory",
                     (unsigned long long)bytes, rs->be->ops->name);
    }
    rc = lnorm__insert(rs, r, id, why, n);
    if (rc != LNORM_OK) {
        lnorm__region_put(r);
        return rc;
    }
    LOG_INFO("region %llu registered: %llu bytes of process %lld%s", (unsigned long long)*id,
             (unsigned long long)bytes, (long long)peer->pid, r->pinned ? ", pinned" : "");
    return LNORM_OK;
}

int lnorm__regions_register_device(lnorm__regions *rs, const lnorm__peer *peer, const void *handle,
                                   size_t handle_len, uint32_t device, uint64_t bytes, uint64_t *id, char *why,
                                   size_t n)
{
    int rc = lnorm__regions_allowed(rs, peer, why, n);
    if (rc != LNORM_OK)
        return rc;
    lnorm__backend *be = rs->be;
    if (!be->ops->ipc_open) {
        snprintf(why, n, "register_region.cuda_ipc_handle: the %s backend has no GPU memory", be->ops->name);
        return LNORM_ENOTSUP;
    }
    void *p = NULL;
    rc = be->ops->ipc_open(be, handle, handle_len, device, bytes, &p, why, n);
    if (rc != LNORM_OK)
        return rc;
    lnorm__region *r = lnorm__region_new(rs, peer, p, bytes);
    if (!r) {
        be->ops->ipc_close(be, p, device);
        snprintf(why, n, "out of memory");
        return LNORM_ENOMEM;
    }
    r->device = 1;
    r->gpu = device;
    rc = lnorm__insert(rs, r, id, why, n);
    if (rc != LNORM_OK) {
        lnorm__region_put(r);
        return rc;
    }
    LOG_INFO("region %llu registered: %llu bytes of GPU %u memory of process %lld", (unsigned long long)*id,
             (unsigned long long)bytes, device, (long long)peer->pid);
    return LNORM_OK;
}

/* The peer's region id in the table (under rs->mu), or NULL. */
static lnorm__region **lnorm__find(lnorm__regions *rs, const lnorm__peer *peer, uint64_t id)
{
    for (lnorm__region **pp = &rs->head; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id)
            return peer->local && (*pp)->pid == peer->pid && (*pp)->uid == peer->uid ? pp : NULL;
    return NULL;
}

int lnorm__regions_unregister(lnorm__regions *rs, const lnorm__peer *peer, uint64_t id)
{
    pthread_mutex_lock(&rs->mu);
    lnorm__region **pp = lnorm__find(rs, peer, id), *r = NULL;
    if (pp) {
        r = *pp;
        lnorm__unlink(rs, pp);
    }
    pthread_mutex_unlock(&rs->mu);
    if (!r)
        return LNORM_ENOTFOUND;
    LOG_INFO("region %llu unregistered", (unsigned long long)id);
    lnorm__region_put(r);
    return LNORM_OK;
}

void lnorm__regions_pipe_closed(lnorm__regions *rs, uint32_t pipe)
{
    lnorm__region *gone = NULL;
    pthread_mutex_lock(&rs->mu);
    for (lnorm__region **pp = &rs->head; *pp;) {
        if ((*pp)->pipe == pipe) {
            lnorm__region *r = *pp;
            lnorm__unlink(rs, pp);
            r->next = gone;
            gone = r;
        } else {
            pp = &(*pp)->next;
        }
    }
    pthread_mutex_unlock(&rs->mu);
    while (gone) {
        lnorm__region *r = gone;
        gone = r->next;
        LOG_INFO("region %llu dropped: its connection closed", (unsigned long long)r->id);
        lnorm__region_put(r);
    }
}

int lnorm__regions_get(lnorm__regions *rs, const lnorm__peer *peer, uint64_t id, lnorm__region **out)
{
    pthread_mutex_lock(&rs->mu);
    lnorm__region **pp = lnorm__find(rs, peer, id);
    if (pp)
        lnorm__region_ref(*pp);
    pthread_mutex_unlock(&rs->mu);
    *out = pp ? *pp : NULL;
    return pp ? LNORM_OK : LNORM_ENOTFOUND;
}

void *lnorm__region_at(const lnorm__region *r, uint64_t off, uint64_t bytes, uint64_t align, const char *what,
                       char *why, size_t n)
{
    if (off > r->bytes || bytes > r->bytes - off) {
        snprintf(why, n, "%s: bytes %llu..%llu are outside region %llu (%llu bytes)", what, (unsigned long long)off,
                 (unsigned long long)off + bytes, (unsigned long long)r->id, (unsigned long long)r->bytes);
        return NULL;
    }
    if (align > 1 && off % align) {
        snprintf(why, n, "%s: offset %llu is not a multiple of %llu", what, (unsigned long long)off,
                 (unsigned long long)align);
        return NULL;
    }
    return r->base + off;
}

int lnorm__regions_attach_ring(lnorm__regions *rs, const lnorm__peer *peer, uint64_t id, uint64_t off,
                               uint32_t entries, lnorm__ring **ring, char *why, size_t n)
{
    if (!rs->rings) {
        snprintf(why, n, "attach_ring: rings are not served by this lnormd");
        return LNORM_ENOTSUP;
    }
    pthread_mutex_lock(&rs->mu);
    lnorm__region **pp = lnorm__find(rs, peer, id);
    int rc = LNORM_OK;
    if (!pp) {
        snprintf(why, n, "attach_ring.region: %llu is not one of this process's regions", (unsigned long long)id);
        rc = LNORM_ENOTFOUND;
    } else if ((*pp)->device) {
        snprintf(why, n, "attach_ring.region: %llu is GPU memory; a ring needs a host region", (unsigned long long)id);
        rc = LNORM_EINVAL;
    } else if ((*pp)->ring) {
        snprintf(why, n, "attach_ring.region: %llu has a ring already", (unsigned long long)id);
        rc = LNORM_EEXIST;
    } else if (off > (*pp)->bytes || lnorm_ring_bytes(entries) > (*pp)->bytes - off) {
        snprintf(why, n, "attach_ring: a ring of %u entries (%llu bytes) at offset %llu does not fit region %llu "
                 "(%llu bytes)", entries, (unsigned long long)lnorm_ring_bytes(entries), (unsigned long long)off,
                 (unsigned long long)id, (unsigned long long)(*pp)->bytes);
        rc = LNORM_EINVAL;
    } else {
        rc = lnorm__ring_create(ring, *pp, off, entries, why, n);
        if (rc == LNORM_OK) {
            rc = lnorm__rings_add(rs->rings, *ring, why, n);
            if (rc == LNORM_OK) {
                (*pp)->ring = *ring;
            } else {
                lnorm__ring_put(*ring);
                *ring = NULL;
            }
        }
    }
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

int lnorm__regions_list(lnorm__regions *rs, const lnorm__peer *peer, lnorm__region_info *out, int max)
{
    int k = 0;
    pthread_mutex_lock(&rs->mu);
    for (lnorm__region *r = rs->head; r && k < max; r = r->next) {
        if (!peer->local || r->pid != peer->pid || r->uid != peer->uid)
            continue;
        out[k].id = r->id;
        out[k].bytes = r->bytes;
        out[k].requests = atomic_load(&r->requests);
        out[k].device = r->device;
        out[k].ring = r->ring != NULL;
        k++;
    }
    pthread_mutex_unlock(&rs->mu);
    return k;
}

void lnorm__regions_count(lnorm__regions *rs, uint64_t *regions, uint64_t *bytes, uint64_t *rings)
{
    *regions = *bytes = *rings = 0;
    pthread_mutex_lock(&rs->mu);
    for (lnorm__region *r = rs->head; r; r = r->next) {
        (*regions)++;
        *bytes += r->bytes;
        *rings += r->ring != NULL;
    }
    pthread_mutex_unlock(&rs->mu);
}
