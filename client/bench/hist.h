/*
 * A log-linear latency histogram (HdrHistogram-style): values below
 * LNORM__HIST_SUB are counted exactly; above, each power of two is split
 * into LNORM__HIST_SUB equal buckets, so a bucket is never wider than
 * 1/LNORM__HIST_SUB of its lower bound. Reported values are bucket
 * midpoints: relative error <= 1/(2*LNORM__HIST_SUB) (0.4%). Recording is
 * lock-free (relaxed atomics) and safe from many threads at once.
 */
#ifndef LNORM_BENCH_HIST_H
#define LNORM_BENCH_HIST_H

#include <stdatomic.h>
#include <stdint.h>

#define LNORM__HIST_SUB_BITS 7
#define LNORM__HIST_SUB (1u << LNORM__HIST_SUB_BITS)
/* shifts 0..(63 - SUB_BITS), plus the exact range below SUB */
#define LNORM__HIST_BUCKETS ((64 - LNORM__HIST_SUB_BITS + 1) * LNORM__HIST_SUB)

typedef struct lnorm__hist {
    _Atomic uint64_t counts[LNORM__HIST_BUCKETS];
    _Atomic uint64_t total;
    _Atomic uint64_t min;
    _Atomic uint64_t max;
    _Atomic uint64_t sum_lo; /* sum of values (wraps only past 2^64 ns) */
} lnorm__hist;

/* Allocate a zeroed histogram (NULL on failure); free with lnorm__hist_free. */
lnorm__hist *lnorm__hist_new(void);
void lnorm__hist_free(lnorm__hist *h);
void lnorm__hist_reset(lnorm__hist *h);
/* Record one value. */
void lnorm__hist_record(lnorm__hist *h, uint64_t v);
/* Add every count of src into dst. */
void lnorm__hist_merge(lnorm__hist *dst, const lnorm__hist *src);
uint64_t lnorm__hist_count(const lnorm__hist *h);
/* The value at quantile q in [0, 1] (0 when empty); exact min/max at 0/1. */
uint64_t lnorm__hist_quantile(const lnorm__hist *h, double q);
double lnorm__hist_mean(const lnorm__hist *h);
/* Bucket index of a value, and the [lo, hi] range of values in a bucket. */
unsigned lnorm__hist_index(uint64_t v);
void lnorm__hist_bounds(unsigned idx, uint64_t *lo, uint64_t *hi);

#endif /* LNORM_BENCH_HIST_H */
