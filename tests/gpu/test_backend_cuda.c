/*
 * gpu.backend: lnormd's CUDA backend (server/backend_cuda.c) on a GPU.
 *
 * 1. Many jobs of mixed batches (dtypes, hidden sizes across tiers,
 *    residual, stats, padded rows; some larger than a slot) submitted at
 *    once from pinned buffers (buf_alloc), each checked against the float64
 *    reference when its done callback has fired; a job with an invalid
 *    segment must finish with LNORM_EINVAL; destroy must return with every
 *    job done.
 * 2. Staging: copies of one batch mixing small (staged) and large (direct)
 *    segments, padded rows, gamma/beta shared by pointer between segments
 *    and jobs, mean/rstd, residual, f32/f16/bf16, under three settings
 *    (staging on; small arenas and slots, so that some small segments go
 *    direct and batches take the temporary-buffer path; staging off) and
 *    the three cuda-sync modes: every output equal to the CPU backend's
 *    on the same inputs (test_gpu's tolerance) and to the float64
 *    reference, row padding still poison, the backend's counters as
 *    expected.
 * 3. A client's region (host_register): the mixed batch laid out in one
 *    registered region, as a shared-memory client has it; small segments
 *    are read and written in place by the kernels (mapped, no staging),
 *    large ones copied; outputs checked as in 2, the counters say so.
 * 4. Fault injection (fault_every = 3, test only): fallback none,
 *    exactly jobs 3, 6, 9 (1-based, in submission order) finish with
 *    LNORM_ECUDA and the others are correct; fallback cpu, every job is
 *    correct and the counters say which were computed on the CPU.
 * 5. Device jobs (on_device: every tensor already in GPU memory, as a
 *    CUDA IPC client's): NDEV jobs of mixed ops, dtypes and tiers in
 *    flight at once on the slots, outputs poisoned on the device, each
 *    checked against float64 once copied back; with fault_every = 3 and
 *    fallback cpu, exactly jobs 3, 6, 9 fail with LNORM_ECUDA (device
 *    pointers are never handed to the CPU fallback) and the counters say
 *    no batch was computed on the CPU; a device job for a GPU the backend
 *    does not have is refused (LNORM_ENODEV), never run elsewhere.
 * 6. Backward segments (lnorm_bwd_segment) in jobs beside forward ones,
 *    padded rows, stats given or not, dres, under big slots and under 1 MiB
 *    slots (temporary buffer), and with every third job faulted and
 *    computed by the CPU fallback: dx / dgamma / dbeta against the float64
 *    reference of tests/common/testbwd.h, dx's padding still poison.
 * Needs a GPU: exits 1 when none is usable.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "check.h"
#include "backend_cuda.h"
#include "testbwd.h"
#include "testcase.h"
#include "testutil.h"

#define NJOBS 48
#define RAND_MAXSEG 4 /* segments per job of part 1 */
#define MAXSEG 16

typedef struct tjob {
    lnorm__job job;
    lnorm_test_case tc[MAXSEG];
    lnorm_segment segs[MAXSEG]; /* pinned copies */
    int nsegs;
    int bad; /* expected to fail with EINVAL */
    int err;
    int done_calls;
} tjob;

/* A backend that lives through the whole test, for buf_alloc / buf_free
 * (the pinned pool is process-wide; a destroyed backend's ops are gone). */
static lnorm__backend *g_pb;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_done;

static void on_done(lnorm__job *j, int err, const char *why, uint64_t ns)
{
    (void)why;
    (void)ns;
    tjob *t = (tjob *)j;
    pthread_mutex_lock(&g_mu);
    t->err = err;
    t->done_calls++;
    g_done++;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* Part 3's client region: while set, pin() lays buffers out in it, 256-byte
 * aligned, instead of taking them from buf_alloc. */
static unsigned char *g_rgn;
static size_t g_rgn_size, g_rgn_used;

static int in_rgn(const void *p)
{
    return g_rgn && (const unsigned char *)p >= g_rgn && (const unsigned char *)p < g_rgn + g_rgn_size;
}

static void unpin(lnorm__backend *be, const void *p)
{
    if (p && !in_rgn(p))
        be->ops->buf_free(be, (void *)p);
}

/* Copy a host buffer into a pinned one from the backend (or the region). */
static void *pin(lnorm__backend *be, const void *src, size_t n)
{
    if (!src)
        return NULL;
    void *p = NULL;
    if (g_rgn) {
        size_t off = (g_rgn_used + 255) & ~(size_t)255;
        if (off + n <= g_rgn_size) {
            p = g_rgn + off;
            g_rgn_used = off + n;
        }
    } else {
        p = be->ops->buf_alloc(be, n);
    }
    if (p)
        memcpy(p, src, n);
    return p;
}

/* Point segment s at pinned copies of case tc's buffers, gamma and beta
 * too when params. Returns -1 when a buffer the case has is not pinned. */
static int pin_case(lnorm__backend *be, lnorm_test_case *tc, lnorm_segment *s, int params)
{
    *s = tc->seg;
    size_t pb = (size_t)s->hidden * lnorm_dtype_size(s->param_dtype);
    s->x = pin(be, tc->x, tc->x_bytes);
    s->y = pin(be, tc->y, tc->y_bytes);
    s->residual = pin(be, tc->residual, tc->res_bytes);
    s->residual_out = pin(be, tc->residual_out, tc->res_bytes);
    s->mean = pin(be, tc->mean, (size_t)s->rows * 4);
    s->rstd = pin(be, tc->rstd, (size_t)s->rows * 4);
    if (params) {
        s->gamma = pin(be, tc->gamma, pb);
        s->beta = pin(be, tc->beta, pb);
        if ((tc->gamma && !s->gamma) || (tc->beta && !s->beta))
            return -1;
    }
    if (!s->x || !s->y || (tc->residual && (!s->residual || !s->residual_out)) || (tc->mean && !s->mean) ||
        (tc->rstd && !s->rstd))
        return -1;
    return 0;
}

static int wait_done(int n, int seconds)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += seconds;
    pthread_mutex_lock(&g_mu);
    while (g_done < n)
        if (pthread_cond_timedwait(&g_cv, &g_mu, &dl) != 0)
            break;
    int finished = g_done;
    pthread_mutex_unlock(&g_mu);
    return finished;
}

/* Submit jobs[0..n) in order, from this thread; a job the backend refuses
 * counts as done, its callback never to be called. */
static void submit_all(lnorm__backend *be, tjob *jobs, int n, const char *name)
{
    for (int j = 0; j < n; j++) {
        int rc = be->ops->submit(be, &jobs[j].job);
        if (rc != LNORM_OK) {
            CHECK_FAIL("%s: submit %d: %s", name, j, lnorm_errname(rc));
            pthread_mutex_lock(&g_mu);
            g_done++;
            pthread_mutex_unlock(&g_mu);
        }
    }
}

/* Part 1: random jobs, the backend with its default options (1 MiB slots). */
static long test_random_jobs(void)
{
    static const int64_t hs[] = {1, 64, 100, 1000, 4097, 8192, 20000, 70000, 300000};
    static const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16, LNORM_DTYPE_BF16};
    lnorm__backend *be = NULL;
    pthread_mutex_lock(&g_mu);
    g_done = 0;
    pthread_mutex_unlock(&g_mu);
    int rc = lnorm__backend_cuda_create(&be, NULL, 1 << 20, 3); /* 1 MiB slots: some batches overflow */
    if (rc != LNORM_OK) {
        CHECK_FAIL("lnorm__backend_cuda_create: %s (this test needs a GPU)", lnorm_errname(rc));
        return 1;
    }
    lnorm__device_info info[16];
    int nd = be->ops->devices(be, info, 16);
    for (int i = 0; i < nd; i++)
        printf("device %u: %s, %llu MiB\n", info[i].index, info[i].name, (unsigned long long)(info[i].memory_bytes >> 20));
    printf("max in flight: %d\n", be->ops->max_inflight(be));

    lnorm_rng g;
    lnorm_rng_seed(&g, 0xbac4e11du);
    tjob *jobs = calloc(NJOBS, sizeof *jobs);
    const int f0 = check_failures();
    for (int j = 0; j < NJOBS; j++) {
        tjob *t = &jobs[j];
        t->nsegs = 1 + (int)(lnorm_rng_next(&g) % RAND_MAXSEG);
        t->bad = (j % 17 == 5);
        for (int i = 0; i < t->nsegs; i++) {
            lnorm_test_case_cfg c = {0};
            c.op = (lnorm_rng_next(&g) % 2) ? LNORM_OP_RMSNORM : LNORM_OP_LAYERNORM;
            c.x_dtype = dts[lnorm_rng_next(&g) % 3];
            c.y_dtype = (lnorm_rng_next(&g) % 3 == 0) ? LNORM_DTYPE_F32 : c.x_dtype;
            c.param_dtype = (lnorm_rng_next(&g) % 2) ? LNORM_DTYPE_F32 : c.x_dtype;
            c.gamma = 1;
            c.beta = c.op == LNORM_OP_LAYERNORM;
            c.residual = (int)(lnorm_rng_next(&g) % 2);
            c.stats = (int)(lnorm_rng_next(&g) % 2);
            c.hidden = hs[lnorm_rng_next(&g) % (sizeof hs / sizeof *hs)];
            c.rows = c.hidden >= 70000 ? 1 + (int64_t)(lnorm_rng_next(&g) % 2) : 1 + (int64_t)(lnorm_rng_next(&g) % 40);
            c.pad = (lnorm_rng_next(&g) % 3 == 0) ? 3 : 0;
            c.x_mean = 0.5;
            c.x_spread = 1.5;
            if (lnorm_test_case_make(&t->tc[i], &c, &g) != LNORM_OK ||
                pin_case(be, &t->tc[i], &t->segs[i], 1) != 0) {
                CHECK_FAIL("out of memory");
                return 1;
            }
        }
        if (t->bad)
            t->segs[t->nsegs - 1].eps = -1.0f;
        t->job.batch.segs = t->segs;
        t->job.batch.nsegs = (size_t)t->nsegs;
        t->job.done = on_done;
        t->job.arg = t;
    }
    submit_all(be, jobs, NJOBS, "random");
    int finished = wait_done(NJOBS, 120);
    if (finished < NJOBS) {
        CHECK_FAIL("only %d of %d jobs finished in 120 s", finished, NJOBS);
        return 1;
    }
    {
        /* Recycled pinned buffers: a freed block is handed out again for the
         * same size, and a job using recycled buffers still checks out. */
        void *a = be->ops->buf_alloc(be, 12345);
        be->ops->buf_free(be, a);
        void *b = be->ops->buf_alloc(be, 12000);
        if (a != b) {
            CHECK_FAIL("freed pinned block not reused (%p vs %p)", a, b);
        }
        be->ops->buf_free(be, b);
    }
    be->ops->destroy(be); /* frees nothing of ours; every job is done */
    be = NULL;
    int checked = 0;
    for (int j = 0; j < NJOBS; j++) {
        tjob *t = &jobs[j];
        if (t->done_calls != 1) {
            CHECK_FAIL("job %d: done called %d times", j, t->done_calls);
        }
        if (t->bad) {
            if (t->err != LNORM_EINVAL) {
                CHECK_FAIL("job %d: invalid segment finished with %s", j, lnorm_errname(t->err));
            }
            continue;
        }
        if (t->err != LNORM_OK) {
            CHECK_FAIL("job %d: %s", j, lnorm_errname(t->err));
            continue;
        }
        for (int i = 0; i < t->nsegs; i++) {
            char label[96];
            snprintf(label, sizeof label, "backend job %d seg %d H=%lld", j, i, (long long)t->segs[i].hidden);
            long bad = lnorm_test_check_segment(&t->segs[i], NULL, label);
            /* Row padding of the pinned outputs must still be poison. */
            lnorm_test_case *tc = &t->tc[i];
            memcpy(tc->y, t->segs[i].y, tc->y_bytes);
            if (tc->residual_out)
                memcpy(tc->residual_out, t->segs[i].residual_out, tc->res_bytes);
            bad += lnorm_test_case_pad_writes(tc);
            if (bad) {
                CHECK_FAIL("%s: %ld mismatches", label, bad);
            }
            checked++;
        }
    }
    printf("part 1 (random jobs): %d jobs, %d segments checked, %d failures\n", NJOBS, checked,
           check_failures() - f0);
    for (int j = 0; j < NJOBS; j++)
        for (int i = 0; i < jobs[j].nsegs; i++) {
            lnorm_segment *s = &jobs[j].segs[i];
            void *bufs[] = {(void *)s->x, s->y, (void *)s->residual, s->residual_out, (void *)s->gamma,
                            (void *)s->beta, s->mean, s->rstd};
            for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
                g_pb->ops->buf_free(g_pb, bufs[k]);
            lnorm_test_case_free(&jobs[j].tc[i]);
        }
    free(jobs);
    return check_failures() - f0;
}


/* ---- parts 2 and 3: staging, shared parameters, fault injection -------- */

/* One segment of the mixed batch. shared: 0 own gamma/beta, 1 the shared
 * f32 pair (hidden 1024), 2 the shared bf16 pair (hidden 4096). */
typedef struct mixdef {
    int op, x_dtype, y_dtype, param_dtype;
    int64_t rows, hidden, pad;
    int residual, stats, shared;
} mixdef;

#define LN LNORM_OP_LAYERNORM
#define RMS LNORM_OP_RMSNORM
#define F32 LNORM_DTYPE_F32
#define F16 LNORM_DTYPE_F16
#define BF16 LNORM_DTYPE_BF16
static const mixdef g_mix[] = {
    /* small: staged with the default settings (payload <= 256 KiB) */
    {LN, F32, F32, F32, 1, 1024, 0, 0, 1, 1},
    {LN, BF16, BF16, F32, 2, 1024, 3, 0, 1, 1},   /* padded rows, f32 params shared with f32 x */
    {RMS, F16, F16, F32, 3, 1024, 0, 1, 1, 1},    /* residual */
    {LN, BF16, F32, BF16, 1, 4096, 0, 0, 0, 2},
    {LN, BF16, BF16, BF16, 4, 4096, 5, 1, 1, 2},  /* residual, padding, stats */
    {RMS, F32, BF16, F32, 2, 1024, 0, 0, 1, 1},
    {LN, F16, F16, F16, 1, 100, 0, 0, 1, 0},      /* own params, odd hidden */
    {RMS, BF16, BF16, BF16, 7, 64, 1, 1, 1, 0},
    /* large: direct */
    {LN, F32, F32, F32, 64, 1024, 0, 1, 1, 1},    /* 1 MiB, shared params */
    {LN, BF16, BF16, BF16, 40, 4096, 3, 0, 1, 2}, /* padded, shared bf16 params */
    {RMS, F16, F32, F16, 16, 40000, 0, 1, 1, 0},  /* a cluster tier */
    {LN, F32, F32, F32, 1, 70000, 0, 0, 1, 0},
    /* small again, after the large ones */
    {LN, BF16, BF16, F32, 1, 1024, 0, 0, 1, 1},
    {LN, F32, F16, F32, 5, 1024, 2, 1, 1, 1},
};
#undef LN
#undef RMS
#define NMIX ((int)(sizeof g_mix / sizeof g_mix[0]))

/* Pinned parameters shared by pointer (registered params, as lnormd has
 * them): [0] gamma/beta f32 hidden 1024, [1] gamma/beta bf16 hidden 4096. */
static void *g_sh_gamma[2], *g_sh_beta[2];


/* Build job t from g_mix, inputs from rng, pinned buffers from be. */
static int make_mix_job(lnorm__backend *be, tjob *t, lnorm_rng *rng)
{
    memset(t, 0, sizeof *t);
    t->nsegs = NMIX;
    for (int i = 0; i < NMIX; i++) {
        const mixdef *m = &g_mix[i];
        lnorm_test_case_cfg c;
        memset(&c, 0, sizeof c);
        c.op = m->op;
        c.x_dtype = m->x_dtype;
        c.y_dtype = m->y_dtype;
        c.param_dtype = m->param_dtype;
        c.gamma = 1;
        c.beta = m->op == LNORM_OP_LAYERNORM;
        c.residual = m->residual;
        c.stats = m->stats;
        c.rows = m->rows;
        c.hidden = m->hidden;
        c.pad = m->pad;
        c.x_mean = 0.5;
        c.x_spread = 1.5;
        if (lnorm_test_case_make(&t->tc[i], &c, rng) != LNORM_OK)
            return -1;
        lnorm_segment *s = &t->segs[i];
        if (pin_case(be, &t->tc[i], s, !m->shared) != 0)
            return -1;
        if (m->shared) {
            s->gamma = g_sh_gamma[m->shared - 1];
            s->beta = c.beta ? g_sh_beta[m->shared - 1] : NULL;
        }
        if (!s->gamma || (c.beta && !s->beta))
            return -1;
    }
    t->job.batch.segs = t->segs;
    t->job.batch.nsegs = (size_t)t->nsegs;
    t->job.done = on_done;
    t->job.arg = t;
    return 0;
}

/* Free a mixed job's pinned buffers (not the shared parameters) and cases. */
static void free_mix_job(lnorm__backend *be, tjob *t)
{
    for (int i = 0; i < t->nsegs; i++) {
        lnorm_segment *s = &t->segs[i];
        unpin(be, s->x);
        unpin(be, s->y);
        unpin(be, s->residual);
        unpin(be, s->residual_out);
        unpin(be, s->mean);
        unpin(be, s->rstd);
        if (!g_mix[i].shared) {
            unpin(be, s->gamma);
            unpin(be, s->beta);
        }
        lnorm_test_case_free(&t->tc[i]);
    }
}

/* Check a finished mixed job: against float64, row padding still poison,
 * and equal to the CPU backend's outputs on the same inputs. */
static long check_mix_job(tjob *t, lnorm_cpu *cpu, const char *what, int j)
{
    const int f0 = check_failures();
    for (int i = 0; i < t->nsegs; i++) {
        const lnorm_segment *s = &t->segs[i];
        lnorm_test_case *tc = &t->tc[i];
        char label[128];
        snprintf(label, sizeof label, "%s job %d seg %d (%s H=%lld rows=%lld)", what, j, i,
                 lnorm_dtype_name(s->x_dtype), (long long)s->hidden, (long long)s->rows);
        long bad = lnorm_test_check_segment(s, NULL, label);
        /* Row padding of the pinned outputs must still be poison. */
        memcpy(tc->y, s->y, tc->y_bytes);
        if (tc->residual_out)
            memcpy(tc->residual_out, s->residual_out, tc->res_bytes);
        long pw = lnorm_test_case_pad_writes(tc);
        if (pw)
            fprintf(stderr, "  %s: %ld bytes of row padding written\n", label, pw);
        bad += pw;
        /* The CPU backend on the same inputs, into the case's own (poisoned
         * again) outputs. */
        lnorm_test_case_repoison(tc);
        lnorm_segment c = *s;
        c.y = tc->y;
        c.residual_out = tc->residual_out;
        c.mean = tc->mean;
        c.rstd = tc->rstd;
        const char *why = NULL;
        lnorm_batch cb = {&c, 1};
        int rc = lnorm_cpu_run(cpu, &cb, &why);
        if (rc != LNORM_OK) {
            fprintf(stderr, "  %s: CPU backend: %s (%s)\n", label, lnorm_errname(rc), why ? why : "-");
            bad++;
        } else {
            bad += lnorm_test_cmp_outputs(s, &c, label);
        }
        if (bad) {
            CHECK_FAIL("%s: %ld mismatches", label, bad);
        }
    }
    return check_failures() - f0;
}

/* A run of parts 2 and 3: a backend under one setting and n mixed jobs. */
typedef struct mixrun {
    const char *name;
    int n;
    lnorm__backend *be;
    tjob *jobs;
    int nmade; /* jobs to free, the one that failed half-built included */
    size_t region; /* > 0: the jobs' tensors in one registered region of this size */
    lnorm__backend_counters cn;
} mixrun;

/* Create the backend under o, build r->n mixed jobs, submit them in order
 * from this thread, wait for them and read the counters. Returns 0 when
 * every job is done (check them, then mix_end), else -1 with the failure
 * reported: mix_end frees what can be freed. */
static int mix_run(mixrun *r, const lnorm__cuda_opts *o, lnorm_rng *rng)
{
    int rc = lnorm__backend_cuda_create_opts(&r->be, o);
    if (rc != LNORM_OK) {
        CHECK_FAIL("%s: create: %s", r->name, lnorm_errname(rc));
        r->be = NULL;
        return -1;
    }
    char desc[512];
    r->be->ops->describe(r->be, desc, sizeof desc);
    printf("%s: %s\n", r->name, desc);
    if (r->region) {
        g_rgn = aligned_alloc(4096, r->region);
        g_rgn_size = r->region;
        g_rgn_used = 0;
        if (!g_rgn || r->be->ops->host_register(r->be, g_rgn, r->region) != LNORM_OK) {
            CHECK_FAIL("%s: region of %zu bytes not registered", r->name, r->region);
            free(g_rgn);
            g_rgn = NULL;
            return -1;
        }
    }
    pthread_mutex_lock(&g_mu);
    g_done = 0;
    pthread_mutex_unlock(&g_mu);
    r->jobs = calloc((size_t)r->n, sizeof *r->jobs);
    for (r->nmade = 0; r->nmade < r->n; r->nmade++)
        if (!r->jobs || make_mix_job(g_pb, &r->jobs[r->nmade], rng) != 0) {
            CHECK_FAIL("%s: out of memory building the jobs", r->name);
            r->nmade++;
            return -1;
        }
    submit_all(r->be, r->jobs, r->n, r->name);
    if (wait_done(r->n, 120) < r->n) {
        CHECK_FAIL("%s: jobs did not finish in 120 s", r->name);
        r->be = NULL; /* it still holds the jobs: nothing can be freed */
        r->jobs = NULL;
        r->nmade = 0;
        return -1;
    }
    memset(&r->cn, 0, sizeof r->cn);
    r->be->ops->counters(r->be, &r->cn);
    return 0;
}

/* Destroy a run's backend and free its jobs. */
static void mix_end(mixrun *r)
{
    if (r->be && g_rgn)
        r->be->ops->host_unregister(r->be, g_rgn);
    if (r->be)
        r->be->ops->destroy(r->be);
    for (int j = 0; j < r->nmade; j++)
        free_mix_job(g_pb, &r->jobs[j]);
    free(r->jobs);
    if (r->region && r->be) {
        free(g_rgn);
        g_rgn = NULL;
    }
}

/* Part 2: NCOPY copies of the mixed batch at once under one setting. */
#define NCOPY 6
static long test_mixed(const char *name, const lnorm__cuda_opts *o, lnorm_cpu *cpu, int expect_staged,
                       int expect_direct, int expect_oversize, lnorm_rng *rng)
{
    const int f0 = check_failures();
    mixrun r = {.name = name, .n = NCOPY};
    if (mix_run(&r, o, rng) != 0)
        goto out;
    tjob *jobs = r.jobs;
    const lnorm__backend_counters cn = r.cn;
    for (int j = 0; j < NCOPY; j++) {
        if (jobs[j].done_calls != 1 || jobs[j].err != LNORM_OK) {
            CHECK_FAIL("%s job %d: done called %d times, %s", name, j, jobs[j].done_calls,
                    lnorm_errname(jobs[j].err));
            continue;
        }
        check_mix_job(&jobs[j], cpu, name, j);
    }
    printf("%s: staged %llu, direct %llu, oversize batches %llu, errors %llu\n", name,
           (unsigned long long)cn.staged_segments, (unsigned long long)cn.direct_segments,
           (unsigned long long)cn.oversize_batches, (unsigned long long)cn.errors);
    if ((expect_staged >= 0 && (cn.staged_segments > 0) != (expect_staged > 0)) ||
        (expect_direct >= 0 && (cn.direct_segments > 0) != (expect_direct > 0)) ||
        (expect_oversize >= 0 && (cn.oversize_batches > 0) != (expect_oversize > 0)) || cn.errors ||
        cn.staged_segments + cn.direct_segments != (uint64_t)NCOPY * NMIX) {
        CHECK_FAIL("%s: counters not as expected (staged %s, direct %s, oversize %s, no errors, %d segments)",
                name, expect_staged ? "> 0" : "0", expect_direct ? "> 0" : "0", expect_oversize ? "> 0" : "0",
                NCOPY * NMIX);
    }
out:
    mix_end(&r);
    printf("%s: %d failures\n", name, check_failures() - f0);
    return check_failures() - f0;
}

/* Part 3: the mixed batch in a registered client region. */
static long test_region(lnorm_cpu *cpu, lnorm_rng *rng)
{
    const char *name = "client-region";
    lnorm__cuda_opts o;
    lnorm__cuda_opts_init(&o);
    o.slot_bytes = (size_t)64 << 20;
    const int f0 = check_failures();
    mixrun r = {.name = name, .n = NCOPY, .region = (size_t)64 << 20};
    if (mix_run(&r, &o, rng) != 0)
        goto out;
    const lnorm__backend_counters cn = r.cn;
    for (int j = 0; j < NCOPY; j++) {
        if (r.jobs[j].done_calls != 1 || r.jobs[j].err != LNORM_OK) {
            CHECK_FAIL("%s job %d: done called %d times, %s", name, j, r.jobs[j].done_calls,
                       lnorm_errname(r.jobs[j].err));
            continue;
        }
        check_mix_job(&r.jobs[j], cpu, name, j);
    }
    printf("%s: mapped %llu, staged %llu, direct %llu, errors %llu\n", name,
           (unsigned long long)cn.mapped_segments, (unsigned long long)cn.staged_segments,
           (unsigned long long)cn.direct_segments, (unsigned long long)cn.errors);
    if (!cn.mapped_segments || !cn.direct_segments || cn.errors ||
        cn.mapped_segments + cn.staged_segments + cn.direct_segments != (uint64_t)NCOPY * NMIX)
        CHECK_FAIL("%s: counters not as expected (mapped > 0, direct > 0, no errors, %d segments)", name,
                   NCOPY * NMIX);
out:
    mix_end(&r);
    printf("%s: %d failures\n", name, check_failures() - f0);
    return check_failures() - f0;
}

/* Part 4: fault_every = 3 over NFAULT jobs submitted one by one. */
#define NFAULT 9
static long test_faults(int fallback, lnorm_cpu *cpu, lnorm_rng *rng)
{
    const char *name = fallback ? "fault/fallback-cpu" : "fault/fallback-none";
    lnorm__cuda_opts o;
    lnorm__cuda_opts_init(&o);
    o.fault_every = 3;
    o.slot_bytes = (size_t)64 << 20;
    o.fallback = fallback ? LNORM__CUDA_FALLBACK_CPU : LNORM__CUDA_FALLBACK_NONE;
    const int f0 = check_failures();
    /* mix_run submits from one thread, in order: job j is the (j+1)th. */
    mixrun r = {.name = name, .n = NFAULT};
    if (mix_run(&r, &o, rng) != 0)
        goto out;
    tjob *jobs = r.jobs;
    const lnorm__backend_counters cn = r.cn;
    int faulted = 0;
    for (int j = 0; j < NFAULT; j++) {
        int fault = (j + 1) % 3 == 0;
        faulted += fault;
        int want = fault && !fallback ? LNORM_ECUDA : LNORM_OK;
        if (jobs[j].done_calls != 1 || jobs[j].err != want) {
            CHECK_FAIL("%s job %d: done called %d times, %s (want %s)", name, j, jobs[j].done_calls,
                    lnorm_errname(jobs[j].err), lnorm_errname(want));
            continue;
        }
        if (want == LNORM_OK)
            check_mix_job(&jobs[j], cpu, name, j);
    }
    printf("%s: errors %llu, CPU fallback batches %llu\n", name, (unsigned long long)cn.errors,
           (unsigned long long)cn.fallback_batches);
    if (cn.errors != (uint64_t)faulted || cn.fallback_batches != (uint64_t)(fallback ? faulted : 0)) {
        CHECK_FAIL("%s: counters: errors %llu (want %d), fallback %llu (want %d)", name,
                (unsigned long long)cn.errors, faulted, (unsigned long long)cn.fallback_batches,
                fallback ? faulted : 0);
    }
out:
    mix_end(&r);
    printf("%s: %d failures\n", name, check_failures() - f0);
    return check_failures() - f0;
}

/* ---- part 5: device jobs ---- */

#define NDEV 9

/* A device copy of host buffer src (n bytes), or of n poison bytes. */
static void *dev_copy(const void *src, size_t n)
{
    void *d = NULL;
    if (!n || cudaMalloc(&d, n) != cudaSuccess)
        return NULL;
    if (src) {
        if (cudaMemcpy(d, src, n, cudaMemcpyHostToDevice) != cudaSuccess) {
            cudaFree(d);
            return NULL;
        }
    } else {
        void *h = malloc(n);
        if (!h || (memset(h, 0xFF, n), cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)) != cudaSuccess) {
            free(h);
            cudaFree(d);
            return NULL;
        }
        free(h);
    }
    return d;
}

static long test_device_jobs(lnorm_rng *rng)
{
    const char *name = "device-jobs/fault-fallback-cpu";
    const int f0 = check_failures();
    lnorm__cuda_opts o;
    lnorm__cuda_opts_init(&o);
    o.slot_bytes = (size_t)1 << 20; /* device jobs use no arena: a small one must not matter */
    o.fault_every = 3;
    o.fallback = LNORM__CUDA_FALLBACK_CPU;
    lnorm__backend *be = NULL;
    if (lnorm__backend_cuda_create_opts(&be, &o) != LNORM_OK) {
        CHECK_FAIL("%s: create", name);
        return 1;
    }
    static const int64_t hs[NDEV] = {64, 1000, 4096, 8192, 3000, 65536, 768, 16384, 4096};
    static tjob jobs[NDEV];
    memset(jobs, 0, sizeof jobs);
    g_done = 0;
    for (int j = 0; j < NDEV; j++) {
        tjob *t = &jobs[j];
        lnorm_test_case_cfg c;
        memset(&c, 0, sizeof c);
        c.op = j % 2 ? LNORM_OP_RMSNORM : LNORM_OP_LAYERNORM;
        c.x_dtype = j % 3 == 0 ? LNORM_DTYPE_F32 : j % 3 == 1 ? LNORM_DTYPE_BF16 : LNORM_DTYPE_F16;
        c.rows = 1 + (int64_t)(lnorm_rng_next(rng) % 40);
        c.hidden = hs[j];
        c.gamma = 1;
        c.beta = j % 2 == 0;
        c.residual = j == 4;
        c.stats = 1;
        if (lnorm_test_case_make(&t->tc[0], &c, rng) != LNORM_OK) {
            CHECK_FAIL("%s: out of memory", name);
            goto out;
        }
        lnorm_test_case *tc = &t->tc[0];
        lnorm_segment *d = &t->segs[0];
        *d = tc->seg;
        const size_t pb = (size_t)d->hidden * lnorm_dtype_size(d->param_dtype);
        d->x = dev_copy(tc->x, tc->x_bytes);
        d->y = dev_copy(NULL, tc->y_bytes);
        d->gamma = dev_copy(tc->gamma, tc->gamma ? pb : 0);
        d->beta = dev_copy(tc->beta, tc->beta ? pb : 0);
        d->mean = dev_copy(NULL, tc->mean ? (size_t)d->rows * 4 : 0);
        d->rstd = dev_copy(NULL, (size_t)d->rows * 4);
        if (tc->residual) {
            d->residual = dev_copy(tc->residual, tc->res_bytes);
            d->residual_out = dev_copy(NULL, tc->res_bytes);
        }
        t->nsegs = 1;
        t->job.batch.segs = t->segs;
        t->job.batch.nsegs = 1;
        t->job.rows = (uint64_t)d->rows;
        t->job.done = on_done;
        t->job.on_device = 1;
        t->job.device = 0;
        if (!d->x || !d->y || !d->rstd || (tc->mean && !d->mean) || (tc->gamma && !d->gamma) ||
            (tc->beta && !d->beta) || (tc->residual && (!d->residual || !d->residual_out))) {
            CHECK_FAIL("%s: cudaMalloc", name);
            t->nsegs = -1;
        }
    }
    if (jobs[0].nsegs == 1) {
        jobs[0].job.device = 99;
        int rc = be->ops->submit(be, &jobs[0].job);
        CHECK(rc == LNORM_ENODEV, "%s: a job on GPU 99: %s (want ENODEV)", name, lnorm_errname(rc));
        jobs[0].job.device = 0;
    }
    int sent = 0;
    for (int j = 0; j < NDEV; j++) {
        if (jobs[j].nsegs != 1)
            continue;
        int rc = be->ops->submit(be, &jobs[j].job);
        if (rc != LNORM_OK)
            CHECK_FAIL("%s: submit job %d: %s", name, j, lnorm_errname(rc));
        else
            sent++;
    }
    pthread_mutex_lock(&g_mu);
    while (g_done < sent)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    lnorm__backend_counters cn;
    be->ops->counters(be, &cn);
    for (int j = 0; j < NDEV; j++) {
        tjob *t = &jobs[j];
        if (t->nsegs != 1)
            continue;
        const int want = (j + 1) % 3 == 0 ? LNORM_ECUDA : LNORM_OK;
        if (t->done_calls != 1 || t->err != want) {
            CHECK_FAIL("%s job %d: done called %d times, %s (want %s)", name, j, t->done_calls,
                       lnorm_errname(t->err), lnorm_errname(want));
            continue;
        }
        if (want != LNORM_OK)
            continue;
        lnorm_test_case *tc = &t->tc[0];
        const lnorm_segment *d = &t->segs[0];
        int ok = cudaMemcpy(tc->y, d->y, tc->y_bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
                 cudaMemcpy(tc->rstd, d->rstd, (size_t)d->rows * 4, cudaMemcpyDeviceToHost) == cudaSuccess &&
                 (!tc->mean || cudaMemcpy(tc->mean, d->mean, (size_t)d->rows * 4, cudaMemcpyDeviceToHost) ==
                                   cudaSuccess) &&
                 (!tc->residual || cudaMemcpy(tc->residual_out, d->residual_out, tc->res_bytes,
                                              cudaMemcpyDeviceToHost) == cudaSuccess);
        char label[96];
        snprintf(label, sizeof label, "%s job %d", name, j);
        CHECK(ok, "%s: copy back", label);
        if (ok)
            CHECK(lnorm_test_check_segment(&tc->seg, NULL, label) == 0, "%s: outputs vs float64", label);
    }
    CHECK(cn.errors == 3 && cn.fallback_batches == 0, "%s: counters: errors %llu (want 3), fallback %llu (want 0)",
          name, (unsigned long long)cn.errors, (unsigned long long)cn.fallback_batches);
out:
    be->ops->destroy(be);
    for (int j = 0; j < NDEV; j++) {
        lnorm_segment *d = &jobs[j].segs[0];
        void *bufs[8] = {(void *)d->x, d->y, (void *)d->gamma, (void *)d->beta, d->mean, d->rstd,
                         (void *)d->residual, d->residual_out};
        for (int k = 0; k < 8; k++)
            if (bufs[k])
                cudaFree(bufs[k]);
        lnorm_test_case_free(&jobs[j].tc[0]);
    }
    printf("%s: %d failures\n", name, check_failures() - f0);
    return check_failures() - f0;
}

/* ---- part 6: backward segments ---- */

#define NBWD 12

typedef struct bjob {
    tjob t;                    /* first: the job; its forward segment in tc[0] / segs[0] */
    lnorm_test_bwd_case bc[2];
    lnorm_bwd_segment bsegs[2]; /* pinned copies */
} bjob;

/* Point backward segment d at pinned copies of case tc's buffers. */
static int pin_bwd(lnorm__backend *be, const lnorm_test_bwd_case *tc, lnorm_bwd_segment *d)
{
    const lnorm_bwd_segment *s = &tc->seg;
    *d = *s;
    size_t n = (size_t)(s->rows * s->x_stride), H = (size_t)s->hidden;
    d->x = pin(be, s->x, n * lnorm_dtype_size(s->x_dtype));
    d->dy = pin(be, s->dy, n * lnorm_dtype_size(s->dy_dtype));
    d->dx = pin(be, s->dx, tc->dx_bytes);
    d->dres = pin(be, s->dres, n * lnorm_dtype_size(s->x_dtype));
    d->gamma = pin(be, s->gamma, H * lnorm_dtype_size(s->param_dtype));
    d->mean = pin(be, s->mean, (size_t)s->rows * 4);
    d->rstd = pin(be, s->rstd, (size_t)s->rows * 4);
    d->dgamma = pin(be, s->dgamma, H * 4);
    d->dbeta = pin(be, s->dbeta, H * 4);
    return d->x && d->dy && d->dx && (!s->dres || d->dres) && (!s->gamma || d->gamma) && (!s->mean || d->mean) &&
                   (!s->rstd || d->rstd) && (!s->dgamma || d->dgamma) && (!s->dbeta || d->dbeta)
               ? 0
               : -1;
}

static void unpin_bwd(lnorm__backend *be, lnorm_bwd_segment *d)
{
    void *ps[] = {(void *)d->x, (void *)d->dy, d->dx, (void *)d->dres, (void *)d->gamma, (void *)d->mean,
                  (void *)d->rstd, d->dgamma, d->dbeta};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++)
        if (ps[k])
            be->ops->buf_free(be, ps[k]);
}

static long test_backward(const char *name, const lnorm__cuda_opts *o, lnorm_rng *rng)
{
    const int f0 = check_failures();
    lnorm__backend *be = NULL;
    int rc = lnorm__backend_cuda_create_opts(&be, o);
    if (rc != LNORM_OK) {
        CHECK_FAIL("%s: create: %s", name, lnorm_errname(rc));
        return 1;
    }
    bjob *jobs = calloc(NBWD, sizeof *jobs);
    int made = 0;
    for (int j = 0; jobs && j < NBWD; j++, made++) {
        bjob *b = &jobs[j];
        lnorm_test_case_cfg fc = {.op = 1 + j % 2, .x_dtype = 1 + j % 3, .rows = 3 + j, .hidden = 512,
                                  .gamma = 1, .beta = 1, .stats = 1};
        if (lnorm_test_case_make(&b->t.tc[0], &fc, rng) || pin_case(g_pb, &b->t.tc[0], &b->t.segs[0], 1)) {
            CHECK_FAIL("%s: forward case", name);
            break;
        }
        b->t.nsegs = 1;
        for (int k = 0; k < 2; k++) {
            lnorm_test_bwd_cfg bc = {.op = 1 + (j + k) % 2, .x_dtype = 1 + (j + k) % 3, .dx_dtype = k ? LNORM_DTYPE_F32 : 0,
                                     .rows = 5 + 7 * j + 300 * (j % 4 == 3), .hidden = k ? 4099 : 1024, .pad = k * 3,
                                     .gamma = (j + k) % 3 != 0, .dres = j % 2, .stats = (j + k) % 2, .dgamma = 1,
                                     .dbeta = k, .eps_mode = j % 5 == 4};
            if (lnorm_test_bwd_make(&b->bc[k], &bc, rng, NULL) || pin_bwd(g_pb, &b->bc[k], &b->bsegs[k])) {
                CHECK_FAIL("%s: backward case", name);
                goto out;
            }
        }
        b->t.job.batch.segs = b->t.segs;
        b->t.job.batch.nsegs = 1;
        b->t.job.bwd.segs = b->bsegs;
        b->t.job.bwd.nsegs = 2;
        b->t.job.done = on_done;
    }
    pthread_mutex_lock(&g_mu);
    g_done = 0;
    pthread_mutex_unlock(&g_mu);
    for (int j = 0; j < made; j++) {
        rc = be->ops->submit(be, &jobs[j].t.job);
        if (rc != LNORM_OK) {
            CHECK_FAIL("%s: submit %d: %s", name, j, lnorm_errname(rc));
            pthread_mutex_lock(&g_mu);
            g_done++;
            pthread_mutex_unlock(&g_mu);
        }
    }
    CHECK(wait_done(made, 120) == made, "%s: jobs did not finish", name);
    for (int j = 0; j < made; j++) {
        bjob *b = &jobs[j];
        CHECK(b->t.done_calls == 1 && b->t.err == LNORM_OK, "%s job %d: done %d times, %s", name, j,
              b->t.done_calls, lnorm_errname(b->t.err));
        CHECK(lnorm_test_check_segment(&b->t.segs[0], NULL, name) == 0, "%s job %d: forward segment", name, j);
        for (int k = 0; k < 2; k++) {
            lnorm_test_bwd_case *tc = &b->bc[k];
            const lnorm_bwd_segment *d = &b->bsegs[k];
            /* The pinned outputs back into the case's buffers, then checked. */
            memcpy(tc->dx, d->dx, tc->dx_bytes);
            if (d->dgamma)
                memcpy(tc->dgamma, d->dgamma, (size_t)d->hidden * 4);
            if (d->dbeta)
                memcpy(tc->dbeta, d->dbeta, (size_t)d->hidden * 4);
            CHECK(lnorm_test_bwd_check(&tc->seg, 0, name) == 0, "%s job %d: backward segment %d", name, j, k);
            CHECK(lnorm_test_bwd_pad_writes(tc) == 0, "%s job %d: dx padding written", name, j);
        }
    }
out:
    be->ops->destroy(be);
    for (int j = 0; jobs && j < made + (made < NBWD); j++) {
        for (int k = 0; k < 2; k++) {
            unpin_bwd(g_pb, &jobs[j].bsegs[k]);
            lnorm_test_bwd_free(&jobs[j].bc[k]);
        }
        lnorm_segment *s = &jobs[j].t.segs[0];
        void *ps[] = {(void *)s->x, s->y, (void *)s->gamma, (void *)s->beta, s->mean, s->rstd};
        for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++)
            if (ps[k])
                g_pb->ops->buf_free(g_pb, ps[k]);
        lnorm_test_case_free(&jobs[j].t.tc[0]);
    }
    free(jobs);
    printf("%s: %d failures\n", name, check_failures() - f0);
    return check_failures() - f0;
}

int main(void)
{
    lnorm_cpu *cpu = NULL;
    lnorm__backend *pb = NULL;
    int rc = lnorm__backend_cuda_create(&pb, NULL, 1 << 20, 1);
    if (rc != LNORM_OK) {
        CHECK_FAIL("lnorm__backend_cuda_create: %s (this test needs a GPU)", lnorm_errname(rc));
        return check_finish("test_backend_cuda");
    }
    if (lnorm_cpu_create(&cpu, 0) != LNORM_OK) {
        CHECK_FAIL("lnorm_cpu_create");
        pb->ops->destroy(pb);
        return check_finish("test_backend_cuda");
    }
    g_pb = pb;
    test_random_jobs();

    /* The shared parameters, pinned. */
    lnorm_rng rng;
    lnorm_rng_seed(&rng, 0x5ca77e2du);
    static const int pdt[2] = {LNORM_DTYPE_F32, LNORM_DTYPE_BF16};
    static const size_t ph[2] = {1024, 4096};
    for (int k = 0; k < 2; k++) {
        size_t n = ph[k] * lnorm_dtype_size(pdt[k]);
        g_sh_gamma[k] = pb->ops->buf_alloc(pb, n);
        g_sh_beta[k] = pb->ops->buf_alloc(pb, n);
        if (!g_sh_gamma[k] || !g_sh_beta[k]) {
            CHECK_FAIL("out of memory");
            return check_finish("test_backend_cuda");
        }
        lnorm_test_fill(&rng, g_sh_gamma[k], pdt[k], ph[k], 1.0, 0.5);
        lnorm_test_fill(&rng, g_sh_beta[k], pdt[k], ph[k], 0.0, 0.5);
    }

    lnorm__cuda_opts o;
    /* Staging on (the defaults, smaller slots): small segments staged,
     * large ones direct, everything fits the arena. Completion: spin. */
    lnorm__cuda_opts_init(&o);
    o.slot_bytes = (size_t)64 << 20;
    o.sync = LNORM__CUDA_SYNC_SPIN;
    test_mixed("staged+direct/spin", &o, cpu, 1, 1, 0, &rng);
    /* Small arenas and slots: some small segments no longer fit the
     * staging arenas (direct), batches exceed the 1 MiB device arena
     * (temporary buffer). Completion: block. */
    lnorm__cuda_opts_init(&o);
    o.slot_bytes = (size_t)1 << 20;
    o.staging_bytes = (size_t)64 << 10;
    o.sync = LNORM__CUDA_SYNC_BLOCK;
    test_mixed("small-arenas+oversize/block", &o, cpu, 1, 1, 1, &rng);
    /* Staging off: every segment direct. Completion: yield. */
    lnorm__cuda_opts_init(&o);
    o.slot_bytes = (size_t)64 << 20;
    o.staging_bytes = 0;
    o.sync = LNORM__CUDA_SYNC_YIELD;
    test_mixed("no-staging/yield", &o, cpu, 0, 1, 0, &rng);

    test_region(cpu, &rng);

    test_faults(0, cpu, &rng);
    test_faults(1, cpu, &rng);
    test_device_jobs(&rng);

    lnorm__cuda_opts_init(&o);
    o.slot_bytes = (size_t)64 << 20;
    test_backward("backward/big-slots", &o, &rng);
    lnorm__cuda_opts_init(&o);
    o.slot_bytes = (size_t)1 << 20;
    test_backward("backward/oversize", &o, &rng);
    lnorm__cuda_opts_init(&o);
    o.slot_bytes = (size_t)64 << 20;
    o.fault_every = 3;
    o.fallback = LNORM__CUDA_FALLBACK_CPU;
    test_backward("backward/fault-fallback-cpu", &o, &rng);

    for (int k = 0; k < 2; k++) {
        pb->ops->buf_free(pb, g_sh_gamma[k]);
        pb->ops->buf_free(pb, g_sh_beta[k]);
    }
    pb->ops->destroy(pb);
    lnorm_cpu_destroy(cpu);
    return check_finish("test_backend_cuda");
}
