/*
 * CPU backend adapter: job threads that run lnormd's batches with
 * lnorm_cpu_run (kernels/cpu, which splits rows over its worker pool).
 * Several jobs in flight. A small batch (up to LNORM__CPU_INLINE_BYTES of
 * payload) runs at once on the thread that submits it, and done is called
 * there before submit returns: handing it to a job thread would cost more
 * than computing it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "backend_cpu.h"

#define LNORM__CPU_RING 256
/* Payload (in + out) at or below which a batch runs on the submitter. */
#define LNORM__CPU_INLINE_BYTES (512u * 1024u)

typedef struct lnorm__cpu_be {
    lnorm__backend base;
    lnorm_cpu *cpu;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    lnorm__job *ring[LNORM__CPU_RING];
    size_t head, count;
    int stopping;
    atomic_int stopped; /* stopping, readable without mu */
    int njobs;
    pthread_t *threads;
} lnorm__cpu_be;

static uint64_t lnorm__cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A job's forward batch, then its backward batch. */
static int lnorm__cpu_run_job(lnorm_cpu *cpu, lnorm__job *job, const char **why)
{
    int err = lnorm_cpu_run(cpu, &job->batch, why);
    if (err == LNORM_OK && job->bwd.nsegs)
        err = lnorm_cpu_run_bwd(cpu, &job->bwd, why);
    return err;
}

static void *lnorm__cpu_job_thread(void *arg)
{
    lnorm__cpu_be *b = arg;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        while (!b->count && !b->stopping)
            pthread_cond_wait(&b->cv, &b->mu);
        if (!b->count) { /* stopping and nothing left */
            pthread_mutex_unlock(&b->mu);
            return NULL;
        }
        lnorm__job *job = b->ring[b->head];
        b->head = (b->head + 1) % LNORM__CPU_RING;
        b->count--;
        pthread_mutex_unlock(&b->mu);

        const char *why = NULL;
        uint64_t t0 = lnorm__cpu_now();
        int err = lnorm__cpu_run_job(b->cpu, job, &why);
        job->done(job, err, err ? why : NULL, lnorm__cpu_now() - t0);
    }
}

static int lnorm__cpu_submit(lnorm__backend *be, lnorm__job *job)
{
    lnorm__cpu_be *b = (lnorm__cpu_be *)be;
    if (job->bytes <= LNORM__CPU_INLINE_BYTES) {
        if (atomic_load_explicit(&b->stopped, memory_order_acquire))
            return LNORM_EUNAVAIL;
        const char *why = NULL;
        uint64_t t0 = lnorm__cpu_now();
        int err = lnorm__cpu_run_job(b->cpu, job, &why);
        job->done(job, err, err ? why : NULL, lnorm__cpu_now() - t0);
        return LNORM_OK;
    }
    pthread_mutex_lock(&b->mu);
    if (b->stopping || b->count == LNORM__CPU_RING) {
        pthread_mutex_unlock(&b->mu);
        return LNORM_EUNAVAIL;
    }
    b->ring[(b->head + b->count) % LNORM__CPU_RING] = job;
    b->count++;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return LNORM_OK;
}

static int lnorm__cpu_devices(lnorm__backend *be, lnorm__device_info *out, int max)
{
    lnorm__cpu_be *b = (lnorm__cpu_be *)be;
    if (max < 1)
        return 0;
    snprintf(out[0].backend, sizeof out[0].backend, "cpu");
    snprintf(out[0].name, sizeof out[0].name, "cpu (%s, %d threads)", lnorm_cpu_isa(b->cpu),
             lnorm_cpu_threads(b->cpu));
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    out[0].memory_bytes = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    out[0].index = 0;
    return 1;
}

static int lnorm__cpu_max_inflight(lnorm__backend *be)
{
    return ((lnorm__cpu_be *)be)->njobs;
}

static void lnorm__cpu_destroy(lnorm__backend *be)
{
    lnorm__cpu_be *b = (lnorm__cpu_be *)be;
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->stopping = 1;
    atomic_store(&b->stopped, 1);
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->njobs; i++)
        pthread_join(b->threads[i], NULL); /* each drains the ring first */
    free(b->threads);
    lnorm_cpu_destroy(b->cpu);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

/* Host memory as it comes: inputs read where they arrived, y over x (the
 * row kernels read each vector of x before writing y at its place). */
static const lnorm__backend_ops lnorm__cpu_ops = {
    .name = "cpu",
    .caps = LNORM__BACKEND_CAP_BORROW_INPUT | LNORM__BACKEND_CAP_IN_PLACE,
    .submit = lnorm__cpu_submit,
    .buf_alloc = NULL,
    .buf_free = NULL,
    .devices = lnorm__cpu_devices,
    .max_inflight = lnorm__cpu_max_inflight,
    .destroy = lnorm__cpu_destroy,
};

int lnorm__backend_cpu_create(lnorm__backend **out, int nthreads, int njobs)
{
    if (njobs < 1 || njobs > 64 || nthreads < 0)
        return LNORM_EINVAL;
    lnorm__cpu_be *b = calloc(1, sizeof *b);
    if (!b)
        return LNORM_ENOMEM;
    b->base.ops = &lnorm__cpu_ops;
    int rc = lnorm_cpu_create(&b->cpu, nthreads);
    if (rc != LNORM_OK) {
        free(b);
        return rc;
    }
    b->threads = calloc((size_t)njobs, sizeof *b->threads);
    if (!b->threads) {
        lnorm_cpu_destroy(b->cpu);
        free(b);
        return LNORM_ENOMEM;
    }
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    for (int i = 0; i < njobs; i++) {
        if (pthread_create(&b->threads[i], NULL, lnorm__cpu_job_thread, b) != 0) {
            b->njobs = i;
            lnorm__cpu_destroy(&b->base);
            return LNORM_ENOMEM;
        }
        b->njobs = i + 1;
        pthread_setname_np(b->threads[i], "lnorm:cpu-job");
    }
    *out = &b->base;
    return LNORM_OK;
}
