/*
 * The contract between lnormd's batcher and a compute backend (CPU, CUDA).
 *
 * The batcher hands a backend a job: a batch of segments (see
 * kernels/core/lnorm_core.h) whose pointers are HOST pointers: inputs
 * (x, residual, gamma, beta) already filled, outputs (y, residual_out,
 * mean, rstd) allocated and waiting to be written. The backend runs the job
 * asynchronously and calls job->done exactly once, from any thread, when
 * every output is written (or on failure). A backend that wants its host
 * buffers in special memory (pinned, for DMA) provides buf_alloc/buf_free,
 * and the daemon then allocates every payload of a request through them
 * (the protobuf-c decoder included), so bytes arrive in that memory with
 * one copy only.
 */
#ifndef LNORM_SERVER_BACKEND_H
#define LNORM_SERVER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "lnorm_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lnorm__job lnorm__job;

/* A batch in flight. Owned by the batcher; the backend must not free it. */
struct lnorm__job {
    lnorm_batch batch;   /* host pointers */
    uint64_t rows;       /* total rows in the batch */
    uint64_t bytes;      /* total payload bytes (in + out) */
    /* Called exactly once when the job is finished. err is LNORM_OK or an
     * lnorm error code (then why, if not NULL, is a static message);
     * compute_ns is the time the backend spent on it. */
    void (*done)(lnorm__job *job, int err, const char *why, uint64_t compute_ns);
    void *arg;           /* the batcher's */
};

/* A device a backend computes on, for the Info reply and /metrics. */
typedef struct lnorm__device_info {
    char backend[16];    /* "cpu", "cuda" */
    char name[128];
    uint64_t memory_bytes;
    uint32_t index;
} lnorm__device_info;

typedef struct lnorm__backend lnorm__backend;

/* The operations every backend implements. */
typedef struct lnorm__backend_ops {
    const char *name; /* "cpu", "cuda" */
    /* Start a job; LNORM_OK means done will be called later. Any other
     * return means the job was not taken and done will not be called. */
    int (*submit)(lnorm__backend *be, lnorm__job *job);
    /* Optional allocator for request/response payload buffers (NULL: malloc). */
    void *(*buf_alloc)(lnorm__backend *be, size_t n);
    void (*buf_free)(lnorm__backend *be, void *p);
    /* Up to max devices described into out; returns the count. */
    int (*devices)(lnorm__backend *be, lnorm__device_info *out, int max);
    /* How many jobs the backend can have in flight at once (>= 1). */
    int (*max_inflight)(lnorm__backend *be);
    /* Stop and free; every submitted job has had done called before return. */
    void (*destroy)(lnorm__backend *be);
} lnorm__backend_ops;

/* Base of every backend object: a backend's struct starts with this. */
struct lnorm__backend {
    const lnorm__backend_ops *ops;
};

/* Create the CPU backend with nthreads workers (0: number of cores). */
int lnorm__backend_cpu_create(lnorm__backend **out, int nthreads);

/* Create the CUDA backend on every visible GPU (or the ones in the
 * comma-separated list `devices`, NULL for all). Returns LNORM_ENODEV when
 * no GPU is usable and LNORM_ENOTSUP when lnormd was built without CUDA. */
int lnorm__backend_cuda_create(lnorm__backend **out, const char *devices,
                               size_t slot_bytes, int slots_per_gpu);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_SERVER_BACKEND_H */
