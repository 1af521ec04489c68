/*
 * gpu.backend: lnormd's CUDA backend (server/backend_cuda.c) on a GPU.
 * Many jobs of mixed batches (dtypes, hidden sizes across tiers, residual,
 * stats, padded rows; some larger than a slot) submitted at once from
 * pinned buffers (buf_alloc), each checked against the float64 reference
 * when its done callback has fired; a job with an invalid segment must
 * finish with LNORM_EINVAL; destroy must return with every job done.
 * Needs a GPU: exits 1 when none is usable.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "testcase.h"
#include "testutil.h"

#define NJOBS 48
#define MAXSEG 4

typedef struct tjob {
    lnorm__job job;
    lnorm_test_case tc[MAXSEG];
    lnorm_segment segs[MAXSEG]; /* pinned copies */
    int nsegs;
    int bad; /* expected to fail with EINVAL */
    int err;
    int done_calls;
} tjob;

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

/* Copy a host buffer into a pinned one from the backend. */
static void *pin(lnorm__backend *be, const void *src, size_t n)
{
    if (!src)
        return NULL;
    void *p = be->ops->buf_alloc(be, n);
    if (p)
        memcpy(p, src, n);
    return p;
}

int main(void)
{
    static const int64_t hs[] = {1, 64, 100, 1000, 4097, 8192, 20000, 70000, 300000};
    static const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16, LNORM_DTYPE_BF16};
    lnorm__backend *be = NULL;
    int rc = lnorm__backend_cuda_create(&be, NULL, 1 << 20, 3); /* 1 MiB slots: some batches overflow */
    if (rc != LNORM_OK) {
        fprintf(stderr, "FAIL: lnorm__backend_cuda_create: %s (this test needs a GPU)\n", lnorm_errname(rc));
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
    long fails = 0;
    for (int j = 0; j < NJOBS; j++) {
        tjob *t = &jobs[j];
        t->nsegs = 1 + (int)(lnorm_rng_next(&g) % MAXSEG);
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
            if (lnorm_test_case_make(&t->tc[i], &c, &g) != LNORM_OK) {
                fprintf(stderr, "FAIL: out of memory\n");
                return 1;
            }
            lnorm_test_case *tc = &t->tc[i];
            lnorm_segment *s = &t->segs[i];
            *s = tc->seg;
            size_t pb = (size_t)c.hidden * lnorm_dtype_size(s->param_dtype);
            s->x = pin(be, tc->x, tc->x_bytes);
            s->y = pin(be, tc->y, tc->y_bytes);
            s->residual = pin(be, tc->residual, tc->res_bytes);
            s->residual_out = pin(be, tc->residual_out, tc->res_bytes);
            s->gamma = pin(be, tc->gamma, pb);
            s->beta = pin(be, tc->beta, pb);
            s->mean = pin(be, tc->mean, (size_t)c.rows * 4);
            s->rstd = pin(be, tc->rstd, (size_t)c.rows * 4);
        }
        if (t->bad)
            t->segs[t->nsegs - 1].eps = -1.0f;
        t->job.batch.segs = t->segs;
        t->job.batch.nsegs = (size_t)t->nsegs;
        t->job.done = on_done;
        t->job.arg = t;
    }
    for (int j = 0; j < NJOBS; j++) {
        rc = be->ops->submit(be, &jobs[j].job);
        if (rc != LNORM_OK) {
            fprintf(stderr, "FAIL: submit %d: %s\n", j, lnorm_errname(rc));
            pthread_mutex_lock(&g_mu);
            g_done++; /* never to be called */
            pthread_mutex_unlock(&g_mu);
            fails++;
        }
    }
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 120;
    pthread_mutex_lock(&g_mu);
    while (g_done < NJOBS)
        if (pthread_cond_timedwait(&g_cv, &g_mu, &dl) != 0)
            break;
    int finished = g_done;
    pthread_mutex_unlock(&g_mu);
    if (finished < NJOBS) {
        fprintf(stderr, "FAIL: only %d of %d jobs finished in 120 s\n", finished, NJOBS);
        return 1;
    }
    {
        /* Recycled pinned buffers: a freed block is handed out again for the
         * same size, and a job using recycled buffers still checks out. */
        void *a = be->ops->buf_alloc(be, 12345);
        be->ops->buf_free(be, a);
        void *b = be->ops->buf_alloc(be, 12000);
        if (a != b) {
            fprintf(stderr, "FAIL: freed pinned block not reused (%p vs %p)\n", a, b);
            fails++;
        }
        be->ops->buf_free(be, b);
    }
    be->ops->destroy(be); /* frees nothing of ours; every job is done */
    be = NULL;
    int checked = 0;
    for (int j = 0; j < NJOBS; j++) {
        tjob *t = &jobs[j];
        if (t->done_calls != 1) {
            fprintf(stderr, "FAIL job %d: done called %d times\n", j, t->done_calls);
            fails++;
        }
        if (t->bad) {
            if (t->err != LNORM_EINVAL) {
                fprintf(stderr, "FAIL job %d: invalid segment finished with %s\n", j, lnorm_errname(t->err));
                fails++;
            }
            continue;
        }
        if (t->err != LNORM_OK) {
            fprintf(stderr, "FAIL job %d: %s\n", j, lnorm_errname(t->err));
            fails++;
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
                fprintf(stderr, "FAIL %s: %ld mismatches\n", label, bad);
                fails++;
            }
            checked++;
        }
    }
    printf("%s: %d jobs, %d segments checked, %ld failures\n", fails ? "FAIL" : "PASS", NJOBS, checked, fails);
    for (int j = 0; j < NJOBS; j++)
        for (int i = 0; i < jobs[j].nsegs; i++)
            lnorm_test_case_free(&jobs[j].tc[i]);
    free(jobs);
    return fails != 0;
}
