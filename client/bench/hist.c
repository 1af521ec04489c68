/* Log-linear histogram: see hist.h. */
#include "hist.h"

#include <stdlib.h>

lnorm__hist *lnorm__hist_new(void)
{
    lnorm__hist *h = calloc(1, sizeof(*h));
    if (h)
        lnorm__hist_reset(h);
    return h;
}

void lnorm__hist_free(lnorm__hist *h)
{
    free(h);
}

void lnorm__hist_reset(lnorm__hist *h)
{
    for (unsigned i = 0; i < LNORM__HIST_BUCKETS; i++)
        atomic_store_explicit(&h->counts[i], 0, memory_order_relaxed);
    atomic_store(&h->total, 0);
    atomic_store(&h->min, UINT64_MAX);
    atomic_store(&h->max, 0);
    atomic_store(&h->sum_lo, 0);
}

unsigned lnorm__hist_index(uint64_t v)
{
    if (v < LNORM__HIST_SUB)
        return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    unsigned shift = msb - LNORM__HIST_SUB_BITS;
    return (shift + 1u) * LNORM__HIST_SUB + (unsigned)((v >> shift) - LNORM__HIST_SUB);
}

void lnorm__hist_bounds(unsigned idx, uint64_t *lo, uint64_t *hi)
{
    if (idx < LNORM__HIST_SUB) {
        *lo = *hi = idx;
        return;
    }
    unsigned shift = idx / LNORM__HIST_SUB - 1u;
    uint64_t base = (uint64_t)(idx % LNORM__HIST_SUB + LNORM__HIST_SUB) << shift;
    *lo = base;
    *hi = base + ((uint64_t)1 << shift) - 1u;
}

void lnorm__hist_record(lnorm__hist *h, uint64_t v)
{
    atomic_fetch_add_explicit(&h->counts[lnorm__hist_index(v)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->total, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_lo, v, memory_order_relaxed);
    uint64_t cur = atomic_load_explicit(&h->min, memory_order_relaxed);
    while (v < cur && !atomic_compare_exchange_weak(&h->min, &cur, v))
        ;
    cur = atomic_load_explicit(&h->max, memory_order_relaxed);
    while (v > cur && !atomic_compare_exchange_weak(&h->max, &cur, v))
        ;
}

void lnorm__hist_merge(lnorm__hist *dst, const lnorm__hist *src)
{
    for (unsigned i = 0; i < LNORM__HIST_BUCKETS; i++) {
        uint64_t c = atomic_load_explicit(&src->counts[i], memory_order_relaxed);
        if (c)
            atomic_fetch_add_explicit(&dst->counts[i], c, memory_order_relaxed);
    }
    uint64_t n = atomic_load(&src->total);
    atomic_fetch_add(&dst->total, n);
    atomic_fetch_add(&dst->sum_lo, atomic_load(&src->sum_lo));
    if (n) {
        uint64_t mn = atomic_load(&src->min), mx = atomic_load(&src->max);
        if (mn < atomic_load(&dst->min))
            atomic_store(&dst->min, mn);
        if (mx > atomic_load(&dst->max))
            atomic_store(&dst->max, mx);
    }
}

uint64_t lnorm__hist_count(const lnorm__hist *h)
{
    return atomic_load_explicit(&h->total, memory_order_relaxed);
}

double lnorm__hist_mean(const lnorm__hist *h)
{
    uint64_t n = lnorm__hist_count(h);
    return n ? (double)atomic_load(&h->sum_lo) / (double)n : 0.0;
}

uint64_t lnorm__hist_quantile(const lnorm__hist *h, double q)
{
    /* Sum the buckets themselves: total may run ahead of them while other
     * threads record. */
    uint64_t n = 0;
    for (unsigned i = 0; i < LNORM__HIST_BUCKETS; i++)
        n += atomic_load_explicit(&h->counts[i], memory_order_relaxed);
    if (n == 0)
        return 0;
    uint64_t mn = atomic_load(&h->min), mx = atomic_load(&h->max);
    if (q <= 0.0)
        return mn;
    if (q >= 1.0)
        return mx;
    /* rank of the wanted value, 1-based: ceil(q * n) */
    double r = q * (double)n;
    uint64_t rank = (uint64_t)r;
    if ((double)rank < r)
        rank++;
    if (rank < 1)
        rank = 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < LNORM__HIST_BUCKETS; i++) {
        seen += atomic_load_explicit(&h->counts[i], memory_order_relaxed);
        if (seen >= rank) {
            uint64_t lo, hi;
            lnorm__hist_bounds(i, &lo, &hi);
            uint64_t mid = lo + (hi - lo) / 2u;
            if (mid < mn)
                mid = mn;
            if (mid > mx)
                mid = mx;
            return mid;
        }
    }
    return mx;
}
