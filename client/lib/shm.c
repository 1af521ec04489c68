/*
 * Shared memory with a local lnormd: regions (a sealed memfd mapped here
 * and registered with the daemon), normalize requests that name tensors in
 * them, and submission rings (include/lnorm/ring.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "lnorm/ring.h"

#ifndef MFD_ALLOW_SEALING
#define MFD_CLOEXEC 0x0001U
#define MFD_ALLOW_SEALING 0x0002U
#endif
#ifndef F_SEAL_SHRINK
#define F_ADD_SEALS 1033
#define F_SEAL_SEAL 0x0001
#define F_SEAL_SHRINK 0x0002
#endif

struct lnorm_ring {
    lnorm_shm *shm;
    lnorm_ring_hdr *h;
    lnorm_ring_sqe *sq;
    lnorm_ring_cqe *cq;
    uint32_t entries, mask;
    uint32_t sq_tail;          /* published */
    uint32_t cq_head;          /* consumed */
};

struct lnorm_shm {
    lnorm_shm *next;
    lnorm_client *c;
    int fd;                    /* -1: GPU memory (CUDA IPC), the caller's */
    unsigned char *base;
    size_t bytes;
    uint64_t id;
    lnorm_ring *ring;
};

static int fail(lnorm_result *res, int rv, const char *fmt, const char *arg)
{
    if (res) {
        memset(res, 0, sizeof *res);
        lnorm__result_fail(res, rv, -1, fmt, arg);
    }
    return rv;
}

/* ---- one control exchange -------------------------------------------------- */

typedef struct shm_call {
    Lnorm__V1__Request req;
    Lnorm__V1__RegisterRegionRequest reg;
    Lnorm__V1__UnregisterRegionRequest unreg;
    Lnorm__V1__AttachRingRequest attach;
    Lnorm__V1__NormalizeRequest norm;
    Lnorm__V1__Affine aff;
    Lnorm__V1__ShmRef ref[8];
    uint64_t *region_out;
} shm_call;

static int shm_make(lnorm__call *call, uint64_t i, uint64_t id, nng_msg **out)
{
    shm_call *st = call->data;
    (void)i;
    st->req.request_id = id;
    st->req.deadline_us = call->deadline_us;
    return lnorm__pack(&st->req, out);
}

static int shm_take(lnorm__call *call, uint64_t i, const lnorm__resp_view *resp)
{
    shm_call *st = call->data;
    (void)i;
    if (resp->body != (int)st->req.body_case)
        return LNORM_EPROTO;
    if (resp->body == LNORM__V1__RESPONSE__BODY_REGISTER_REGION) {
        Lnorm__V1__RegisterRegionResponse *r =
            lnorm__v1__register_region_response__unpack(NULL, resp->body_bytes.n, resp->body_bytes.p);
        if (!r)
            return LNORM_EPROTO;
        *st->region_out = r->region;
        lnorm__v1__register_region_response__free_unpacked(r, NULL);
        if (!*st->region_out)
            return LNORM_EPROTO;
    } else if (resp->body == LNORM__V1__RESPONSE__BODY_NORMALIZE) {
        /* Every output was written into a region: the body must be empty. */
        if (resp->body_bytes.n)
            return LNORM_EPROTO;
    }
    return LNORM_OK;
}

static void shm_cleanup(lnorm__call *call)
{
    free(call->data);
}

static const lnorm__call_ops shm_ops = {shm_make, shm_take};

static int shm_new(lnorm_client *c, lnorm__call **call, shm_call **st)
{
    *st = calloc(1, sizeof **st);
    if (!*st)
        return LNORM_ENOMEM;
    int rv = lnorm__call_new(c, &shm_ops, call);
    if (rv != LNORM_OK) {
        free(*st);
        return rv;
    }
    Lnorm__V1__Request init = LNORM__V1__REQUEST__INIT;
    (*st)->req = init;
    (*call)->data = *st;
    (*call)->cleanup = shm_cleanup;
    return LNORM_OK;
}

/* ---- regions ------------------------------------------------------------------ */

int lnorm_shm_create(lnorm_client *c, size_t bytes, lnorm_shm **out, lnorm_result *res)
{
    if (!c || !out || bytes < 1)
        return fail(res, LNORM_EINVAL, "%s", "client, out or bytes is missing");
    *out = NULL;
    lnorm_shm *s = calloc(1, sizeof *s);
    if (!s)
        return fail(res, LNORM_ENOMEM, "%s", "out of memory");
    s->c = c;
    s->bytes = bytes;
    s->fd = (int)syscall(SYS_memfd_create, "lnorm-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    /* Sealed against shrinking: lnormd refuses a region that could vanish
     * under it (its next access would raise SIGBUS there). */
    if (s->fd < 0 || ftruncate(s->fd, (off_t)bytes) != 0 ||
        fcntl(s->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
        int e = errno;
        if (s->fd >= 0)
            close(s->fd);
        free(s);
        return fail(res, e == ENOMEM || e == ENOSPC ? LNORM_ENOMEM : LNORM_EIO, "memfd: %s", strerror(e));
    }
    s->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (s->base == MAP_FAILED) {
        int e = errno;
        close(s->fd);
        free(s);
        return fail(res, LNORM_ENOMEM, "mmap: %s", strerror(e));
    }
    lnorm__call *call;
    shm_call *st;
    int rv = shm_new(c, &call, &st);
    if (rv == LNORM_OK) {
        Lnorm__V1__RegisterRegionRequest reg = LNORM__V1__REGISTER_REGION_REQUEST__INIT;
        st->reg = reg;
        st->reg.fd = (uint32_t)s->fd;
        st->reg.bytes = bytes;
        st->region_out = &s->id;
        st->req.body_case = LNORM__V1__REQUEST__BODY_REGISTER_REGION;
        st->req.register_region = &st->reg;
        rv = lnorm__call_sync(call, res);
    } else {
        fail(res, rv, "%s", lnorm_strerror(rv));
    }
    if (rv != LNORM_OK) {
        munmap(s->base, bytes);
        close(s->fd);
        free(s);
        return rv;
    }
    nng_mtx_lock(c->mtx);
    s->next = c->shms;
    c->shms = s;
    nng_mtx_unlock(c->mtx);
    *out = s;
    return LNORM_OK;
}

int lnorm_shm_register_cuda(lnorm_client *c, const void *handle, size_t handle_len, int device, void *dev_ptr,
                            size_t bytes, lnorm_shm **out, lnorm_result *res)
{
    if (!c || !handle || handle_len != 64 || device < 0 || !dev_ptr || !bytes || !out)
        return fail(res, LNORM_EINVAL, "%s", "a 64-byte CUDA IPC handle, a device, a pointer and a size are needed");
    *out = NULL;
    lnorm_shm *s = calloc(1, sizeof *s);
    if (!s)
        return fail(res, LNORM_ENOMEM, "%s", "out of memory");
    s->c = c;
    s->fd = -1;
    s->base = dev_ptr;
    s->bytes = bytes;
    lnorm__call *call;
    shm_call *st;
    int rv = shm_new(c, &call, &st);
    if (rv == LNORM_OK) {
        Lnorm__V1__RegisterRegionRequest reg = LNORM__V1__REGISTER_REGION_REQUEST__INIT;
        st->reg = reg;
        st->reg.bytes = bytes;
        st->reg.cuda_ipc_handle.data = (uint8_t *)handle;
        st->reg.cuda_ipc_handle.len = handle_len;
        st->reg.cuda_device = (uint32_t)device;
        st->region_out = &s->id;
        st->req.body_case = LNORM__V1__REQUEST__BODY_REGISTER_REGION;
        st->req.register_region = &st->reg;
        rv = lnorm__call_sync(call, res);
    } else {
        fail(res, rv, "%s", lnorm_strerror(rv));
    }
    if (rv != LNORM_OK) {
        free(s);
        return rv;
    }
    nng_mtx_lock(c->mtx);
    s->next = c->shms;
    c->shms = s;
    nng_mtx_unlock(c->mtx);
    *out = s;
    return LNORM_OK;
}

/* Release what lnorm_shm_create made here (nothing for GPU memory). */
static void shm_unmap(lnorm_shm *s)
{
    free(s->ring);
    if (s->fd >= 0) {
        munmap(s->base, s->bytes);
        close(s->fd);
    }
    free(s);
}

void *lnorm_shm_data(const lnorm_shm *s)
{
    return s ? s->base : NULL;
}

size_t lnorm_shm_size(const lnorm_shm *s)
{
    return s ? s->bytes : 0;
}

uint64_t lnorm_shm_id(const lnorm_shm *s)
{
    return s ? s->id : 0;
}

int lnorm_shm_destroy(lnorm_shm *s, lnorm_result *res)
{
    if (!s)
        return LNORM_OK;
    lnorm_client *c = s->c;
    nng_mtx_lock(c->mtx);
    for (lnorm_shm **pp = &c->shms; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    nng_mtx_unlock(c->mtx);
    lnorm__call *call;
    shm_call *st;
    int rv = shm_new(c, &call, &st);
    if (rv == LNORM_OK) {
        Lnorm__V1__UnregisterRegionRequest u = LNORM__V1__UNREGISTER_REGION_REQUEST__INIT;
        st->unreg = u;
        st->unreg.region = s->id;
        st->req.body_case = LNORM__V1__REQUEST__BODY_UNREGISTER_REGION;
        st->req.unregister_region = &st->unreg;
        rv = lnorm__call_sync(call, res);
    } else {
        fail(res, rv, "%s", lnorm_strerror(rv));
    }
    /* (lnormd keeps its own mapping while requests still use it.) */
    shm_unmap(s);
    return rv;
}

void lnorm__shm_forget_all(lnorm_client *c)
{
    while (c->shms) {
        lnorm_shm *s = c->shms;
        c->shms = s->next;
        shm_unmap(s);
    }
}

/* ---- normalize by reference --------------------------------------------------- */

/* Find the region of c holding [p, p + n): its id and p's offset. */
static int shm_locate(lnorm_client *c, const void *p, uint64_t n, uint64_t *id, uint64_t *off)
{
    int found = 0;
    uintptr_t a = (uintptr_t)p;
    nng_mtx_lock(c->mtx);
    for (lnorm_shm *s = c->shms; s && !found; s = s->next) {
        uintptr_t b = (uintptr_t)s->base;
        if (a >= b && a - b <= s->bytes && n <= s->bytes - (a - b)) {
            *id = s->id;
            *off = a - b;
            found = 1;
        }
    }
    nng_mtx_unlock(c->mtx);
    return found;
}

static int shm_norm_prepare(lnorm_client *c, const lnorm_normalize_req *q, lnorm__call **out, const char **why)
{
    int rv = lnorm_normalize_req_check(q, why);
    if (rv != LNORM_OK)
        return rv;
    if (q->params_id && q->params_id[0]) {
        *why = "params_id is not supported with shared memory (put gamma/beta in a region)";
        return LNORM_EINVAL;
    }
    lnorm__call *call;
    shm_call *st;
    rv = shm_new(c, &call, &st);
    if (rv != LNORM_OK) {
        *why = lnorm_strerror(rv);
        return rv;
    }
    Lnorm__V1__NormalizeRequest n = LNORM__V1__NORMALIZE_REQUEST__INIT;
    st->norm = n;
    Lnorm__V1__NormalizeRequest *m = &st->norm;
    lnorm_dtype ydt = q->y_dtype ? q->y_dtype : q->x_dtype, pdt = q->param_dtype ? q->param_dtype : q->x_dtype;
    uint64_t el = q->rows * q->hidden;
    uint64_t xb = el * lnorm_dtype_size(q->x_dtype), yb = el * lnorm_dtype_size(ydt), sb = q->rows * 4;
    uint64_t pb = q->hidden * lnorm_dtype_size(pdt);
    m->op = (Lnorm__V1__Op)q->op;
    m->x_dtype = (Lnorm__V1__DType)q->x_dtype;
    m->y_dtype = (Lnorm__V1__DType)ydt;
    m->rows = q->rows;
    m->hidden = q->hidden;
    m->eps_present_case = LNORM__V1__NORMALIZE_REQUEST__EPS_PRESENT_EPS;
    m->eps = q->eps;
    m->eps_mode = (Lnorm__V1__EpsMode)q->eps_mode;
    m->want_stats = q->want_stats ? 1 : 0;
    m->priority = q->priority;
    m->max_queue_us = q->max_queue_us;
    struct {
        const void *p;
        uint64_t n;
        Lnorm__V1__ShmRef **slot;
        const char *outside; /* the error when it is not in a region */
    } t[8] = {
#define OUT(n) n " is not inside a region of this client"
        {q->x, xb, &m->x_ref, OUT("x")},
        {q->residual, xb, &m->residual_ref, OUT("residual")},
        {q->y, yb, &m->y_ref, OUT("y")},
        {q->want_stats && q->op == LNORM_OP_LAYERNORM ? q->mean : NULL, sb, &m->mean_ref, OUT("mean")},
        {q->want_stats ? q->rstd : NULL, sb, &m->rstd_ref, OUT("rstd")},
        {q->residual_out, xb, &m->residual_out_ref, OUT("residual_out")},
        {q->gamma, pb, NULL, OUT("gamma")},
        {q->beta, pb, NULL, OUT("beta")},
#undef OUT
    };
    if (q->gamma || q->beta) {
        Lnorm__V1__Affine a = LNORM__V1__AFFINE__INIT;
        st->aff = a;
        st->aff.dtype = (Lnorm__V1__DType)pdt;
        m->affine = &st->aff;
        t[6].slot = &st->aff.gamma_ref;
        t[7].slot = &st->aff.beta_ref;
    }
    for (int k = 0; k < 8; k++) {
        if (!t[k].p)
            continue;
        Lnorm__V1__ShmRef r = LNORM__V1__SHM_REF__INIT;
        st->ref[k] = r;
        if (!shm_locate(c, t[k].p, t[k].n, &st->ref[k].region, &st->ref[k].offset)) {
            *why = t[k].outside;
            call->cleanup(call);
            free(call);
            return LNORM_EINVAL;
        }
        st->ref[k].bytes = t[k].n;
        *t[k].slot = &st->ref[k];
    }
    /* Stats asked for but not wanted back (NULL) still need a place. */
    if (q->want_stats && ((q->op == LNORM_OP_LAYERNORM && !q->mean) || !q->rstd)) {
        *why = "want_stats with shared memory needs mean (LayerNorm) and rstd buffers in a region";
        call->cleanup(call);
        free(call);
        return LNORM_EINVAL;
    }
    st->req.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE;
    st->req.normalize = m;
    if (q->timeout_ms)
        call->recv_timeout = q->timeout_ms < 0 ? NNG_DURATION_INFINITE : q->timeout_ms;
    *out = call;
    return LNORM_OK;
}

int lnorm_normalize_shm(lnorm_client *c, const lnorm_normalize_req *req, lnorm_result *res)
{
    if (!c || !req)
        return fail(res, LNORM_EINVAL, "%s", "client or request is NULL");
    lnorm__call *call;
    const char *why = NULL;
    int rv = shm_norm_prepare(c, req, &call, &why);
    if (rv != LNORM_OK)
        return fail(res, rv, "%s", why ? why : lnorm_strerror(rv));
    return lnorm__call_sync(call, res);
}

int lnorm_normalize_shm_async(lnorm_client *c, const lnorm_normalize_req *req, lnorm_callback cb, void *arg)
{
    if (!c || !req || !cb)
        return LNORM_EINVAL;
    lnorm__call *call;
    const char *why = NULL;
    int rv = shm_norm_prepare(c, req, &call, &why);
    if (rv != LNORM_OK)
        return rv;
    call->cb = cb;
    call->cb_arg = arg;
    return lnorm__call_start(call, NULL);
}

/* ---- rings ----------------------------------------------------------------------- */

int lnorm_ring_attach(lnorm_shm *s, size_t offset, uint32_t entries, lnorm_ring **out, lnorm_result *res)
{
    if (!s || !out)
        return fail(res, LNORM_EINVAL, "%s", "region or out is NULL");
    if (s->ring)
        return fail(res, LNORM_EEXIST, "%s", "this region has a ring already");
    if (s->fd < 0)
        return fail(res, LNORM_EINVAL, "%s", "a ring needs a host region (this one is GPU memory)");
    if (entries < LNORM_RING_MIN_ENTRIES || entries > LNORM_RING_MAX_ENTRIES || (entries & (entries - 1)) ||
        offset % 64 || offset > s->bytes || lnorm_ring_bytes(entries) > s->bytes - offset)
        return fail(res, LNORM_EINVAL, "%s", "entries must be a power of two in 2..65536, offset a multiple of 64, "
                                             "and the ring must fit the region");
    lnorm_ring *r = calloc(1, sizeof *r);
    if (!r)
        return fail(res, LNORM_ENOMEM, "%s", "out of memory");
    lnorm__call *call;
    shm_call *st;
    int rv = shm_new(s->c, &call, &st);
    if (rv == LNORM_OK) {
        Lnorm__V1__AttachRingRequest a = LNORM__V1__ATTACH_RING_REQUEST__INIT;
        st->attach = a;
        st->attach.region = s->id;
        st->attach.offset = offset;
        st->attach.entries = entries;
        st->req.body_case = LNORM__V1__REQUEST__BODY_ATTACH_RING;
        st->req.attach_ring = &st->attach;
        rv = lnorm__call_sync(call, res);
    } else {
        fail(res, rv, "%s", lnorm_strerror(rv));
    }
    if (rv != LNORM_OK) {
        free(r);
        return rv;
    }
    r->shm = s;
    r->h = (lnorm_ring_hdr *)(void *)(s->base + offset);
    r->entries = entries;
    r->mask = entries - 1;
    r->sq = (lnorm_ring_sqe *)(void *)(r->h + 1);
    r->cq = (lnorm_ring_cqe *)(void *)(r->sq + entries);
    s->ring = r;
    *out = r;
    return LNORM_OK;
}

uint32_t lnorm_ring_entries(const lnorm_ring *r)
{
    return r ? r->entries : 0;
}

uint32_t lnorm_ring_outstanding(const lnorm_ring *r)
{
    return r ? r->sq_tail - r->cq_head : 0;
}

static void futex_wake(uint32_t *addr)
{
    syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* lnormd sleeps on sq_tail with server_idle set: wake it (the fence pairs
 * with its own between setting the flag and re-reading the tails). */
static void ring_doorbell(lnorm_ring *r)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&r->h->server_idle, __ATOMIC_RELAXED))
        futex_wake(&r->h->sq_tail);
}

int lnorm_ring_submit(lnorm_ring *r, const lnorm_ring_sqe *sqes, int n)
{
    if (!r || !sqes || n <= 0)
        return 0;
    int k = 0;
    /* At most `entries` outstanding: the submission entry is free and the
     * completion will find room. */
    while (k < n && r->sq_tail - r->cq_head < r->entries) {
        r->sq[r->sq_tail & r->mask] = sqes[k++];
        r->sq_tail++;
    }
    if (k) {
        __atomic_store_n(&r->h->sq_tail, r->sq_tail, __ATOMIC_RELEASE);
        ring_doorbell(r);
    }
    return k;
}

static int ring_take(lnorm_ring *r, lnorm_ring_cqe *out, int max)
{
    uint32_t tail = __atomic_load_n(&r->h->cq_tail, __ATOMIC_ACQUIRE);
    int k = 0;
    while (k < max && r->cq_head != tail && r->cq_head != r->sq_tail) {
        out[k++] = r->cq[r->cq_head & r->mask];
        r->cq_head++;
    }
    if (k) {
        __atomic_store_n(&r->h->cq_head, r->cq_head, __ATOMIC_RELEASE);
        /* lnormd may have stopped taking for want of completion room. */
        if (r->sq_tail != __atomic_load_n(&r->h->sq_head, __ATOMIC_ACQUIRE))
            ring_doorbell(r);
    }
    return k;
}

int lnorm_ring_reap(lnorm_ring *r, lnorm_ring_cqe *out, int max, int timeout_ms)
{
    if (!r || !out || max <= 0)
        return 0;
    int k = ring_take(r, out, max);
    if (k)
        return k;
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    if (timeout_ms >= 0) {
        end.tv_sec += timeout_ms / 1000;
        end.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (end.tv_nsec >= 1000000000L) {
            end.tv_sec++;
            end.tv_nsec -= 1000000000L;
        }
    }
    /* Spin briefly (a batch is often microseconds away), then sleep. */
    for (int spin = 0; spin < 2000; spin++) {
        if ((k = ring_take(r, out, max)))
            return k;
        __builtin_ia32_pause();
    }
    for (;;) {
        uint32_t seen = __atomic_load_n(&r->h->cq_tail, __ATOMIC_ACQUIRE);
        __atomic_store_n(&r->h->client_waiting, 1, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if ((k = ring_take(r, out, max))) {
            __atomic_store_n(&r->h->client_waiting, 0, __ATOMIC_RELAXED);
            return k;
        }
        struct timespec now, rel, *relp = NULL;
        if (timeout_ms >= 0) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            long long ns = (long long)(end.tv_sec - now.tv_sec) * 1000000000LL + (end.tv_nsec - now.tv_nsec);
            if (ns <= 0) {
                __atomic_store_n(&r->h->client_waiting, 0, __ATOMIC_RELAXED);
                return 0;
            }
            rel.tv_sec = (time_t)(ns / 1000000000LL);
            rel.tv_nsec = (long)(ns % 1000000000LL);
            relp = &rel;
        }
        syscall(SYS_futex, &r->h->cq_tail, FUTEX_WAIT, seen, relp, NULL, 0);
        __atomic_store_n(&r->h->client_waiting, 0, __ATOMIC_RELAXED);
        if ((k = ring_take(r, out, max)))
            return k;
    }
}
