/* Submission rings: the poller thread and the completion side. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "lnorm/errors.h"
#include "log.h"
#include "ring.h"
#include "stats.h"

struct lnorm__ring {
    lnorm__region *rg;         /* a reference */
    lnorm_ring_hdr *h;         /* in the client's memory: read as untrusted */
    lnorm_ring_sqe *sq;
    lnorm_ring_cqe *cq;
    uint32_t entries, mask;    /* lnormd's own copies */
    uint32_t head;             /* descriptors taken (poller only) */
    int broken;                /* the client wrote an impossible tail (poller only) */
    pthread_mutex_t cmu;       /* completion side */
    uint32_t ctail;            /* completions published (under cmu) */
    atomic_int refs;           /* the region's + one per request taken */
};

struct lnorm__rings {
    pthread_t th;
    int started;
    pthread_mutex_t mu;        /* the list; held by the poller while it reads rings */
    lnorm__ring *list[LNORM__MAX_RINGS];
    int n;
    _Atomic uint32_t wake;     /* the poller's own futex: bumped on a change of the list or stop */
    atomic_int stop;
    lnorm__ring_take_fn take;
    void *arg;
};

/* Shared words: atomic accesses to plain fields of the client's memory. */
static inline uint32_t ld_acq(const uint32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline void st_rel(uint32_t *p, uint32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static void lnorm__futex_wake(void *addr, int shared)
{
    syscall(SYS_futex, addr, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

int lnorm__ring_create(lnorm__ring **out, lnorm__region *rg, uint64_t off, uint32_t entries, char *why, size_t n)
{
    lnorm__ring *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(why, n, "out of memory");
        return LNORM_ENOMEM;
    }
    r->rg = rg;
    lnorm__region_ref(rg);
    r->h = (lnorm_ring_hdr *)(void *)(rg->base + off);
    r->sq = (lnorm_ring_sqe *)(void *)(r->h + 1);
    r->cq = (lnorm_ring_cqe *)(void *)(r->sq + entries);
    r->entries = entries;
    r->mask = entries - 1;
    pthread_mutex_init(&r->cmu, NULL);
    atomic_init(&r->refs, 1);
    memset(r->h, 0, sizeof *r->h);
    r->h->magic = LNORM_RING_MAGIC;
    r->h->version = LNORM_RING_VERSION;
    r->h->entries = entries;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    *out = r;
    return LNORM_OK;
}

lnorm__region *lnorm__ring_region(lnorm__ring *r)
{
    return r->rg;
}

void lnorm__ring_ref(lnorm__ring *r)
{
    atomic_fetch_add(&r->refs, 1);
}

void lnorm__ring_put(lnorm__ring *r)
{
    if (r && atomic_fetch_sub(&r->refs, 1) == 1) {
        pthread_mutex_destroy(&r->cmu);
        lnorm__region_put(r->rg);
        free(r);
    }
}

void lnorm__ring_complete(lnorm__ring *r, uint64_t tag, int err, const char *why, const lnorm__timing *t)
{
    lnorm_ring_hdr *h = r->h;
    pthread_mutex_lock(&r->cmu);
    lnorm_ring_cqe *c = &r->cq[r->ctail & r->mask];
    c->tag = tag;
    c->err = err;
    c->batch_rows = t ? t->batch_rows : 0;
    c->batch_requests = t ? t->batch_requests : 0;
    c->queue_us = t ? (uint32_t)(t->queue_us > UINT32_MAX ? UINT32_MAX : t->queue_us) : 0;
    c->compute_us = t ? (uint32_t)(t->compute_us > UINT32_MAX ? UINT32_MAX : t->compute_us) : 0;
    c->reserved = 0;
    if (err != LNORM_OK)
        snprintf(c->message, sizeof c->message, "%s", why ? why : lnorm_strerror(err));
    else
        c->message[0] = 0;
    r->ctail++;
    st_rel(&h->cq_tail, r->ctail);
    pthread_mutex_unlock(&r->cmu);
    /* Pairs with the client's fence between setting client_waiting and
     * re-reading cq_tail: one of the two sees the other's store. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->client_waiting, __ATOMIC_RELAXED))
        lnorm__futex_wake(&h->cq_tail, 1);
    lnorm__ring_put(r);
}

/* Take up to budget descriptors from r (poller, under rs->mu); how many. */
static int lnorm__ring_poll(lnorm__rings *rs, lnorm__ring *r, int budget)
{
    if (r->broken)
        return 0;
    lnorm_ring_hdr *h = r->h;
    uint32_t tail = ld_acq(&h->sq_tail);
    uint32_t avail = tail - r->head;
    if (avail > r->entries) {
        /* Only a client that wrote its own ring wrong gets here: its ring
         * stops; every other client goes on. */
        r->broken = 1;
        LOG_WARN("region %llu: ring tail %u is %u entries past its head (at most %u): ring stopped",
                 (unsigned long long)r->rg->id, tail, avail, r->entries);
        return 0;
    }
    /* Room for the completion of everything taken: taken - consumed. */
    uint32_t used = r->head - ld_acq(&h->cq_head);
    uint32_t room = used < r->entries ? r->entries - used : 0;
    uint32_t n = avail < room ? avail : room;
    if (n > (uint32_t)budget)
        n = (uint32_t)budget;
    uint64_t now = lnorm__now_ns();
    for (uint32_t k = 0; k < n; k++) {
        lnorm_ring_sqe q;
        memcpy(&q, &r->sq[r->head & r->mask], sizeof q); /* once: checks apply to this copy */
        r->head++;
        st_rel(&h->sq_head, r->head);
        lnorm__ring_ref(r);
        rs->take(rs->arg, r, &q, now);
    }
    return (int)n;
}

/* Whether r has descriptors the poller could take now (under rs->mu). */
static int lnorm__ring_ready(const lnorm__ring *r)
{
    if (r->broken)
        return 0;
    uint32_t avail = ld_acq(&r->h->sq_tail) - r->head;
    uint32_t used = r->head - ld_acq(&r->h->cq_head);
    return avail && avail <= r->entries && used < r->entries;
}

static long lnorm__futex_waitv(struct futex_waitv *w, unsigned n)
{
#ifdef SYS_futex_waitv
    return syscall(SYS_futex_waitv, w, n, 0, NULL, 0);
#else
    (void)w;
    (void)n;
    errno = ENOSYS;
    return -1;
#endif
}

/* Spin this long without work before sleeping: a busy client's next
 * descriptor usually comes within it, and a wake-up costs more. */
#define LNORM__RING_SPIN_NS 50000ull

static void *lnorm__poller(void *arg)
{
    lnorm__rings *rs = arg;
    prctl(PR_SET_NAME, "lnorm:ring", 0, 0, 0);
    struct futex_waitv w[LNORM__MAX_RINGS + 1];
    uint64_t idle_since = 0;
    int have_waitv = 1;
    while (!atomic_load(&rs->stop)) {
        int took = 0;
        pthread_mutex_lock(&rs->mu);
        for (int i = 0; i < rs->n; i++)
            took += lnorm__ring_poll(rs, rs->list[i], 64);
        pthread_mutex_unlock(&rs->mu);
        if (took) {
            idle_since = 0;
            continue;
        }
        uint64_t now = lnorm__now_ns();
        if (!idle_since)
            idle_since = now;
        if (now - idle_since < LNORM__RING_SPIN_NS) {
            __builtin_ia32_pause();
            continue;
        }
        /* Sleep until a client rings (or the list changes). */
        uint32_t wk = atomic_load(&rs->wake);
        int nw = 0, ready = 0;
        pthread_mutex_lock(&rs->mu);
        for (int i = 0; i < rs->n; i++)
            __atomic_store_n(&rs->list[i]->h->server_idle, 1, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        for (int i = 0; i < rs->n; i++) {
            lnorm__ring *r = rs->list[i];
            ready |= lnorm__ring_ready(r);
            w[nw].val = ld_acq(&r->h->sq_tail);
            w[nw].uaddr = (uint64_t)(uintptr_t)&r->h->sq_tail;
            w[nw].flags = FUTEX_32;
            w[nw].__reserved = 0;
            nw++;
        }
        pthread_mutex_unlock(&rs->mu);
        w[nw].val = wk;
        w[nw].uaddr = (uint64_t)(uintptr_t)&rs->wake;
        w[nw].flags = FUTEX_32 | FUTEX_PRIVATE_FLAG;
        w[nw].__reserved = 0;
        nw++;
        if (!ready && !atomic_load(&rs->stop)) {
            if (have_waitv && lnorm__futex_waitv(w, (unsigned)nw) < 0 && errno == ENOSYS) {
                have_waitv = 0;
                LOG_WARN("futex_waitv is not available (Linux < 5.16): idle rings are polled every 200 us");
            }
            if (!have_waitv) {
                struct timespec ts = {0, 200000};
                nanosleep(&ts, NULL);
            }
        }
        pthread_mutex_lock(&rs->mu);
        for (int i = 0; i < rs->n; i++)
            __atomic_store_n(&rs->list[i]->h->server_idle, 0, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&rs->mu);
        idle_since = 0;
    }
    return NULL;
}

int lnorm__rings_create(lnorm__rings **out, lnorm__ring_take_fn take, void *arg)
{
    lnorm__rings *rs = calloc(1, sizeof *rs);
    if (!rs)
        return LNORM_ENOMEM;
    pthread_mutex_init(&rs->mu, NULL);
    atomic_init(&rs->wake, 0);
    atomic_init(&rs->stop, 0);
    rs->take = take;
    rs->arg = arg;
    if (pthread_create(&rs->th, NULL, lnorm__poller, rs) != 0) {
        pthread_mutex_destroy(&rs->mu);
        free(rs);
        return LNORM_ENOMEM;
    }
    rs->started = 1;
    *out = rs;
    return LNORM_OK;
}

static void lnorm__rings_kick(lnorm__rings *rs)
{
    atomic_fetch_add(&rs->wake, 1);
    lnorm__futex_wake(&rs->wake, 0);
}

void lnorm__rings_destroy(lnorm__rings *rs)
{
    if (!rs)
        return;
    atomic_store(&rs->stop, 1);
    lnorm__rings_kick(rs);
    if (rs->started)
        pthread_join(rs->th, NULL);
    pthread_mutex_destroy(&rs->mu);
    free(rs);
}

int lnorm__rings_add(lnorm__rings *rs, lnorm__ring *r, char *why, size_t n)
{
    pthread_mutex_lock(&rs->mu);
    int ok = rs->n < LNORM__MAX_RINGS;
    if (ok) {
        lnorm__ring_ref(r);
        rs->list[rs->n++] = r;
    }
    pthread_mutex_unlock(&rs->mu);
    if (!ok) {
        snprintf(why, n, "attach_ring: lnormd serves at most %d rings", LNORM__MAX_RINGS);
        return LNORM_ELIMIT;
    }
    lnorm__rings_kick(rs);
    return LNORM_OK;
}

void lnorm__rings_remove(lnorm__rings *rs, lnorm__ring *r)
{
    int found = 0;
    pthread_mutex_lock(&rs->mu);
    for (int i = 0; i < rs->n; i++)
        if (rs->list[i] == r) {
            rs->list[i] = rs->list[--rs->n];
            found = 1;
            break;
        }
    pthread_mutex_unlock(&rs->mu);
    if (found) {
        lnorm__rings_kick(rs);
        lnorm__ring_put(r);
    }
}
