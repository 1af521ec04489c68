/* The CPU runner (lnorm_cpu_*, lnorm_core.h): ISA choice and a batch's rows
 * split over the pool; the row math itself is in rows_*.c. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_pool.h"
#include "cpu_rows.h"
#include "lnorm_core.h"

/* A task is a run of whole rows of one segment of about this many elements. */
#define TASK_ELEMS (32 * 1024)
/* Batches smaller than this many elements run on the caller's thread. */
#define SMALL_ELEMS (64 * 1024)

typedef struct isa_entry {
    const char *name;
    lnorm__cpu_rows_fn *fn;
} isa_entry;

/* Best first. */
static const isa_entry isa_table[] = {
#ifdef LNORM_CPU_HAVE_AVX512
    {"avx512", lnorm__cpu_rows_avx512},
#endif
#ifdef LNORM_CPU_HAVE_AVX2
    {"avx2", lnorm__cpu_rows_avx2},
#endif
    {"scalar", lnorm__cpu_rows_scalar},
};
#define NISA ((int)(sizeof isa_table / sizeof isa_table[0]))

struct lnorm_cpu {
    lnorm__pool *pool;
    int nthreads;
    int isa; /* index into isa_table */
};

/* Which entries of isa_table this machine can run, found once. */
static int isa_ok[NISA];
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does
 * not know the name "f16c", gcc's does; cpuid works with both. */
static int has_f16c(void)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
#endif

static void isa_probe(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
#endif
    for (int i = 0; i < NISA; i++) {
        const char *n = isa_table[i].name;
        isa_ok[i] = 1; /* scalar; on non-x86 builds the table holds nothing else */
#if defined(__x86_64__) || defined(__i386__)
        if (!strcmp(n, "avx512"))
            isa_ok[i] = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && has_f16c() &&
                        __builtin_cpu_supports("fma");
        else if (!strcmp(n, "avx2"))
            isa_ok[i] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
#else
        (void)n;
#endif
    }
}

/* Whether this machine can run entry i of isa_table. */
static int isa_supported(int i)
{
    pthread_once(&isa_once, isa_probe);
    return isa_ok[i];
}

static int isa_find(const char *name)
{
    for (int i = 0; i < NISA; i++)
        if (!strcmp(isa_table[i].name, name))
            return i;
    return -1;
}

/* The default ISA: $LNORM_CPU_ISA when set and supported, else the best. */
static int isa_default(void)
{
    const char *env = getenv("LNORM_CPU_ISA");
    if (env && *env) {
        int i = isa_find(env);
        if (i >= 0 && isa_supported(i))
            return i;
    }
    for (int i = 0; i < NISA; i++)
        if (isa_supported(i))
            return i;
    return NISA - 1;
}

int lnorm_cpu_create(lnorm_cpu **out, int nthreads)
{
    if (!out || nthreads < 0)
        return LNORM_EINVAL;
    if (nthreads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = n > 0 ? (int)n : 1;
    }
    if (nthreads > 1024)
        return LNORM_EINVAL;
    lnorm_cpu *c = calloc(1, sizeof *c);
    if (!c)
        return LNORM_ENOMEM;
    c->nthreads = nthreads;
    c->isa = isa_default();
    /* The calling thread is one of the nthreads. */
    int err = lnorm__pool_create(&c->pool, nthreads - 1);
    if (err) {
        free(c);
        return err;
    }
    *out = c;
    return LNORM_OK;
}

void lnorm_cpu_destroy(lnorm_cpu *cpu)
{
    if (!cpu)
        return;
    lnorm__pool_destroy(cpu->pool);
    free(cpu);
}

int lnorm_cpu_threads(const lnorm_cpu *cpu)
{
    return cpu ? cpu->nthreads : 1;
}

const char *lnorm_cpu_isa(const lnorm_cpu *cpu)
{
    return isa_table[cpu ? cpu->isa : isa_default()].name;
}

int lnorm_cpu_set_isa(lnorm_cpu *cpu, const char *isa)
{
    if (!cpu || !isa)
        return LNORM_EINVAL;
    int i = isa_find(isa);
    if (i < 0) {
        /* A known name this build lacks is "not supported"; others invalid. */
        if (!strcmp(isa, "avx512") || !strcmp(isa, "avx2"))
            return LNORM_ENOTSUP;
        return LNORM_EINVAL;
    }
    if (!isa_supported(i))
        return LNORM_ENOTSUP;
    cpu->isa = i;
    return LNORM_OK;
}

lnorm__cpu_rows_fn *lnorm__cpu_rows_of(const lnorm_cpu *cpu)
{
    return isa_table[cpu ? cpu->isa : isa_default()].fn;
}

lnorm__pool *lnorm__cpu_pool_of(lnorm_cpu *cpu)
{
    return cpu->pool;
}

int lnorm_cpu_run_segment(const lnorm_cpu *cpu, const lnorm_segment *s, const char **why)
{
    int err = lnorm_segment_validate(s, why);
    if (err)
        return err;
    isa_table[cpu ? cpu->isa : isa_default()].fn(s, 0, s->rows);
    return LNORM_OK;
}

/* ---- batches over the pool ---------------------------------------------- */

typedef struct batch_job {
    const lnorm_batch *b;
    lnorm__cpu_rows_fn *fn;
    const int64_t *first; /* first task of each segment; first[nsegs] = total */
    const int64_t *rows_per_task;
} batch_job;

static void run_task(void *arg, int64_t t)
{
    const batch_job *j = arg;
    /* The segment holding task t: binary search over first[]. */
    size_t lo = 0, hi = j->b->nsegs;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (j->first[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    const lnorm_segment *s = &j->b->segs[lo];
    int64_t r0 = (t - j->first[lo]) * j->rows_per_task[lo];
    int64_t r1 = r0 + j->rows_per_task[lo];
    if (r1 > s->rows)
        r1 = s->rows;
    j->fn(s, r0, r1);
}

int lnorm_cpu_run(lnorm_cpu *cpu, const lnorm_batch *b, const char **why)
{
    if (!cpu || !b || (b->nsegs && !b->segs)) {
        if (why)
            *why = "batch: NULL";
        return LNORM_EINVAL;
    }
    int64_t elems = 0;
    for (size_t i = 0; i < b->nsegs; i++) {
        int err = lnorm_segment_validate(&b->segs[i], why);
        if (err)
            return err;
        /* Validated extents are below 2^60 elements; saturate the total. */
        int64_t e = b->segs[i].rows * b->segs[i].hidden;
        elems = elems > INT64_MAX - e ? INT64_MAX : elems + e;
    }
    lnorm__cpu_rows_fn *fn = isa_table[cpu->isa].fn;
    if (cpu->nthreads <= 1 || elems < SMALL_ELEMS) {
        for (size_t i = 0; i < b->nsegs; i++)
            fn(&b->segs[i], 0, b->segs[i].rows);
        return LNORM_OK;
    }
    int64_t stack_buf[2 * 33];
    int64_t *first = stack_buf, *rpt = stack_buf + 33;
    if (b->nsegs > 32) {
        first = malloc((2 * b->nsegs + 1) * sizeof *first);
        if (!first) {
            if (why)
                *why = "batch: out of memory";
            return LNORM_ENOMEM;
        }
        rpt = first + b->nsegs + 1;
    }
    int64_t total = 0;
    for (size_t i = 0; i < b->nsegs; i++) {
        const lnorm_segment *s = &b->segs[i];
        int64_t per = TASK_ELEMS / s->hidden;
        if (per < 1)
            per = 1;
        rpt[i] = per;
        first[i] = total;
        total += (s->rows + per - 1) / per;
    }
    first[b->nsegs] = total;
    batch_job j = {b, fn, first, rpt};
    lnorm__pool_run(cpu->pool, run_task, &j, total);
    if (first != stack_buf)
        free(first);
    return LNORM_OK;
}
