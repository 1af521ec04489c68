/* Parameter registry: a hash table of reference-counted gamma/beta sets. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "params.h"

/* The table starts with this many chains and doubles whenever the sets
 * outnumber its chains twice over, so a lookup under the lock stays short
 * however many sets are registered. */
#define LNORM__PBUCKETS0 256

_Static_assert(sizeof(lnorm__pset) + 48 <= LNORM__PSET_OVERHEAD,
               "LNORM__PSET_OVERHEAD must cover a set's struct and its allocations' headers");

struct lnorm__params {
    pthread_mutex_t mu;
    lnorm__pset **buckets;
    size_t nbuckets;       /* a power of two */
    size_t count;          /* sets in the table */
    uint64_t max_bytes;
    uint64_t used_bytes;   /* includes dropped sets still referenced */
    lnorm__backend *be;
    lnorm__stats *st;
};

static unsigned lnorm__hash(const char *s)
{
    unsigned h = 2166136261u;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 16777619u;
    return h;
}

/* Twice the chains, every set moved; called with the lock held. A failed
 * allocation leaves the table as it was (longer chains, still correct). */
static void lnorm__grow_locked(lnorm__params *p)
{
    size_t n = p->nbuckets * 2;
    lnorm__pset **nb = calloc(n, sizeof *nb);
    if (!nb)
        return;
    for (size_t i = 0; i < p->nbuckets; i++) {
        lnorm__pset *ps = p->buckets[i];
        while (ps) {
            lnorm__pset *next = ps->next;
            lnorm__pset **b = &nb[lnorm__hash(ps->id) & (n - 1)];
            ps->next = *b;
            *b = ps;
            ps = next;
        }
    }
    free(p->buckets);
    p->buckets = nb;
    p->nbuckets = n;
}

/* Whether params live in the backend's payload memory (else malloc). */
static int lnorm__pbuf_pinned(const lnorm__params *p)
{
    return p->be && (p->be->ops->caps & LNORM__BACKEND_CAP_PINNED_BUFFERS);
}

static void *lnorm__pbuf_alloc(lnorm__params *p, size_t n)
{
    return lnorm__pbuf_pinned(p) ? p->be->ops->buf_alloc(p->be, n) : malloc(n);
}

static void lnorm__pbuf_free(lnorm__params *p, void *b)
{
    if (!b)
        return;
    if (lnorm__pbuf_pinned(p))
        p->be->ops->buf_free(p->be, b);
    else
        free(b);
}

int lnorm__params_create(lnorm__params **out, uint64_t max_bytes, lnorm__backend *be, lnorm__stats *st)
{
    lnorm__params *p = calloc(1, sizeof *p);
    if (!p)
        return LNORM_ENOMEM;
    p->nbuckets = LNORM__PBUCKETS0;
    if (!(p->buckets = calloc(p->nbuckets, sizeof *p->buckets))) {
        free(p);
        return LNORM_ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    p->max_bytes = max_bytes;
    p->be = be;
    p->st = st;
    *out = p;
    return LNORM_OK;
}

/* Free a set whose last reference is gone; called with the lock held. */
static void lnorm__pset_free_locked(lnorm__pset *ps)
{
    lnorm__params *p = ps->reg;
    p->used_bytes -= ps->bytes;
    atomic_fetch_sub(&p->st->params_bytes, (int_fast64_t)ps->bytes);
    lnorm__pbuf_free(p, ps->gamma);
    lnorm__pbuf_free(p, ps->beta);
    free(ps);
}

void lnorm__params_destroy(lnorm__params *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->nbuckets; i++) {
        lnorm__pset *ps = p->buckets[i];
        while (ps) {
            lnorm__pset *next = ps->next;
            lnorm__pset_free_locked(ps);
            ps = next;
        }
    }
    pthread_mutex_destroy(&p->mu);
    free(p->buckets);
    free(p);
}

static lnorm__pset **lnorm__find_locked(lnorm__params *p, const char *id)
{
    lnorm__pset **pp = &p->buckets[lnorm__hash(id) & (p->nbuckets - 1)];
    while (*pp && strcmp((*pp)->id, id) != 0)
        pp = &(*pp)->next;
    return pp;
}

int lnorm__params_register(lnorm__params *p, const char *id, int dtype, uint64_t hidden, const void *gamma,
                           size_t glen, const void *beta, size_t blen)
{
    size_t idlen = strlen(id);
    if (idlen == 0 || idlen > 128)
        return LNORM_EINVAL;
    /* Charged: the bytes of gamma and beta and a set's bookkeeping, so
     * that max-params-bytes bounds what the registry holds, also for
     * many tiny sets. */
    size_t total = glen + blen + LNORM__PSET_OVERHEAD;
    lnorm__pset *ps = calloc(1, sizeof *ps);
    if (!ps)
        return LNORM_ENOMEM;
    memcpy(ps->id, id, idlen + 1);
    ps->reg = p;
    ps->dtype = dtype;
    ps->hidden = hidden;
    ps->bytes = total;
    ps->refs = 1; /* the registry's own reference */
    /* Reserve the bytes first so that concurrent registrations cannot
     * overshoot the limit while copying. */
    pthread_mutex_lock(&p->mu);
    if (*lnorm__find_locked(p, id)) {
        pthread_mutex_unlock(&p->mu);
        free(ps);
        return LNORM_EEXIST;
    }
    if (total > p->max_bytes || p->used_bytes > p->max_bytes - total) {
        pthread_mutex_unlock(&p->mu);
        free(ps);
        return LNORM_ELIMIT;
    }
    p->used_bytes += total;
    pthread_mutex_unlock(&p->mu);

    int rc = LNORM_OK;
    if (glen && !(ps->gamma = lnorm__pbuf_alloc(p, glen)))
        rc = LNORM_ENOMEM;
    if (rc == LNORM_OK && blen && !(ps->beta = lnorm__pbuf_alloc(p, blen)))
        rc = LNORM_ENOMEM;
    if (rc == LNORM_OK) {
        if (glen)
            memcpy(ps->gamma, gamma, glen);
        if (blen)
            memcpy(ps->beta, beta, blen);
    }
    pthread_mutex_lock(&p->mu);
    lnorm__pset **slot = lnorm__find_locked(p, id);
    if (rc == LNORM_OK && *slot)
        rc = LNORM_EEXIST; /* lost a race with the same id */
    if (rc != LNORM_OK) {
        p->used_bytes -= total;
        pthread_mutex_unlock(&p->mu);
        lnorm__pbuf_free(p, ps->gamma);
        lnorm__pbuf_free(p, ps->beta);
        free(ps);
        return rc;
    }
    *slot = ps;
    if (++p->count > 2 * p->nbuckets)
        lnorm__grow_locked(p);
    atomic_fetch_add(&p->st->params_bytes, (int_fast64_t)total);
    atomic_fetch_add(&p->st->params_count, 1);
    pthread_mutex_unlock(&p->mu);
    return LNORM_OK;
}

int lnorm__params_drop(lnorm__params *p, const char *id)
{
    pthread_mutex_lock(&p->mu);
    lnorm__pset **slot = lnorm__find_locked(p, id);
    lnorm__pset *ps = *slot;
    if (!ps) {
        pthread_mutex_unlock(&p->mu);
        return LNORM_ENOTFOUND;
    }
    *slot = ps->next;
    ps->next = NULL;
    p->count--;
    atomic_fetch_sub(&p->st->params_count, 1);
    if (--ps->refs == 0)
        lnorm__pset_free_locked(ps);
    pthread_mutex_unlock(&p->mu);
    return LNORM_OK;
}

int lnorm__params_get(lnorm__params *p, const char *id, lnorm__pset **out)
{
    pthread_mutex_lock(&p->mu);
    lnorm__pset *ps = *lnorm__find_locked(p, id);
    if (ps)
        ps->refs++;
    pthread_mutex_unlock(&p->mu);
    *out = ps;
    return ps ? LNORM_OK : LNORM_ENOTFOUND;
}

void lnorm__params_put(lnorm__pset *ps)
{
    if (!ps)
        return;
    lnorm__params *p = ps->reg;
    pthread_mutex_lock(&p->mu);
    if (--ps->refs == 0)
        lnorm__pset_free_locked(ps);
    pthread_mutex_unlock(&p->mu);
}
