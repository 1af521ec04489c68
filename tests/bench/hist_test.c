/* bench.histogram: the log-linear histogram's accuracy against exact
 * quantiles of sorted samples, bucket bounds and merging. */
#include "check.h"
#include "hist.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>


static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Exact quantile with the same rank rule as the histogram: ceil(q*n). */
static uint64_t exact_q(const uint64_t *s, size_t n, double q)
{
    if (q <= 0)
        return s[0];
    if (q >= 1)
        return s[n - 1];
    double r = q * (double)n;
    size_t rank = (size_t)r;
    if ((double)rank < r)
        rank++;
    if (rank < 1)
        rank = 1;
    return s[rank - 1];
}

static void check_bounds(void)
{
    /* every bucket's range maps back to it, ranges are contiguous, and a
     * bucket is at most 1/SUB of its lower bound wide */
    uint64_t prev_hi = 0;
    for (unsigned i = 0; i < LNORM__HIST_BUCKETS; i++) {
        uint64_t lo, hi;
        lnorm__hist_bounds(i, &lo, &hi);
        CHECK(lnorm__hist_index(lo) == i && lnorm__hist_index(hi) == i, "bucket %u maps back", i);
        if (i > 0)
            CHECK(lo == prev_hi + 1, "bucket %u contiguous", i);
        if (lo >= LNORM__HIST_SUB)
            CHECK((double)(hi - lo + 1) <= (double)lo / LNORM__HIST_SUB, "bucket %u width", i);
        prev_hi = hi;
        if (hi == UINT64_MAX) {
            CHECK(i == LNORM__HIST_BUCKETS - 1, "last bucket is %u", i);
            break;
        }
    }
    CHECK(lnorm__hist_index(UINT64_MAX) == LNORM__HIST_BUCKETS - 1, "max index");
}

static void check_accuracy(const char *name, uint64_t (*gen)(void), size_t n)
{
    uint64_t *s = malloc(n * sizeof(*s));
    lnorm__hist *h = lnorm__hist_new();
    if (!s || !h) {
        CHECK_FAIL("%s: out of memory", name);
        free(s);
        lnorm__hist_free(h);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        s[i] = gen();
        lnorm__hist_record(h, s[i]);
    }
    qsort(s, n, sizeof(*s), cmp_u64);
    CHECK(lnorm__hist_count(h) == n, "%s: count", name);
    static const double qs[] = {0, 0.001, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1};
    double worst = 0;
    for (size_t k = 0; k < sizeof(qs) / sizeof(qs[0]); k++) {
        uint64_t want = exact_q(s, n, qs[k]);
        uint64_t got = lnorm__hist_quantile(h, qs[k]);
        double rel = want ? fabs((double)got - (double)want) / (double)want : (double)got;
        if (rel > worst)
            worst = rel;
        CHECK(rel <= 0.01, "%s: q=%g exact %llu hist %llu (rel err %.4f > 1%%)", name, qs[k],
              (unsigned long long)want, (unsigned long long)got, rel);
    }
    double mean = 0;
    for (size_t i = 0; i < n; i++)
        mean += (double)s[i];
    mean /= (double)n;
    if (s[n - 1] < UINT64_MAX / n) /* the running sum cannot wrap */
        CHECK(fabs(lnorm__hist_mean(h) - mean) <= 1e-9 * mean + 1e-9, "%s: mean", name);
    printf("%-12s n=%zu worst relative quantile error %.5f (bound %.5f)\n", name, n, worst,
           0.5 / LNORM__HIST_SUB);
    free(s);
    lnorm__hist_free(h);
}

static uint64_t gen_loguniform(void) /* 1 ns .. ~10 s, log-uniform */
{
    double u = (double)(rng() >> 11) / 9007199254740992.0;
    return (uint64_t)exp(u * log(1e10));
}

static uint64_t gen_narrow(void) /* 50..60 us: the common case */
{
    return 50000 + rng() % 10000;
}

static uint64_t gen_small(void) /* exact range */
{
    return rng() % 200;
}

static uint64_t gen_bimodal(void)
{
    return (rng() & 7) ? 20000 + rng() % 1000 : 5000000 + rng() % 3000000;
}

static uint64_t gen_huge(void)
{
    return (rng() >> 1) | (1ull << 62);
}

int main(void)
{
    check_bounds();
    check_accuracy("loguniform", gen_loguniform, 200000);
    check_accuracy("narrow", gen_narrow, 100000);
    check_accuracy("small", gen_small, 50000);
    check_accuracy("bimodal", gen_bimodal, 100000);
    check_accuracy("huge", gen_huge, 20000);

    /* empty, single value, merge */
    lnorm__hist *a = lnorm__hist_new(), *b = lnorm__hist_new();
    CHECK(a && b, "alloc");
    if (a && b) {
        CHECK(lnorm__hist_quantile(a, 0.5) == 0, "empty quantile");
        lnorm__hist_record(a, 123456);
        CHECK(lnorm__hist_quantile(a, 0.5) == 123456 && lnorm__hist_quantile(a, 1) == 123456,
              "single value exact via min/max clamp");
        for (int i = 0; i < 1000; i++)
            lnorm__hist_record(b, 1000);
        lnorm__hist_merge(a, b);
        CHECK(lnorm__hist_count(a) == 1001, "merged count");
        CHECK(lnorm__hist_quantile(a, 0.5) == 1000 || labs((long)lnorm__hist_quantile(a, 0.5) - 1000) <= 5,
              "merged median %llu", (unsigned long long)lnorm__hist_quantile(a, 0.5));
        CHECK(lnorm__hist_quantile(a, 1) == 123456, "merged max");
        CHECK(lnorm__hist_quantile(a, 0) == 1000, "merged min");
    }
    lnorm__hist_free(a);
    lnorm__hist_free(b);
    return check_finish("bench.histogram");
}
