/*
 * The contract between lnormd's batcher and a compute backend: what every
 * backend implements and states about itself, nothing about any one of them
 * (their constructors and settings: backend_cpu.h, backend_cuda.h).
 *
 * The batcher hands a backend a job: a batch of segments (see
 * kernels/core/lnorm_core.h) whose pointers are HOST pointers: inputs
 * (x, residual, gamma, beta) already filled, outputs (y, residual_out,
 * mean, rstd) allocated and waiting to be written; and a batch of backward
 * segments (lnorm_bwd_segment) in the same way (inputs x, dy, dres, gamma,
 * mean, rstd; outputs dx, dgamma, dbeta). The backend runs the job
 * asynchronously and calls job->done exactly once, from any thread, when
 * every output is written (or on failure). What the daemon may do with a
 * backend's buffers it learns from ops->caps alone (LNORM__BACKEND_CAP_*).
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
    /* Backward segments (host pointers; never on a device job): run as
     * their own launch(es) besides batch, in the same job. */
    lnorm_bwd_batch bwd;
    uint64_t rows;       /* total rows in the batch */
    uint64_t bytes;      /* total payload bytes (in + out) */
    /* Called exactly once when the job is finished. err is LNORM_OK or an
     * lnorm error code (then why, if not NULL, is a static message);
     * compute_ns is the time the backend spent on it. */
    void (*done)(lnorm__job *job, int err, const char *why, uint64_t compute_ns);
    void *arg;           /* the batcher's */
    int on_device;       /* 0: host pointers; 1: every pointer is memory of GPU `device` */
    int device;
};

/* A device a backend computes on, for the Info reply and /metrics. */
typedef struct lnorm__device_info {
    char backend[16];    /* "cpu", "cuda" */
    char name[128];
    uint64_t memory_bytes;
    uint32_t index;
} lnorm__device_info;

typedef struct lnorm__backend lnorm__backend;

/* Counters a backend keeps about its device work (a backend without
 * ops->counters reports them all zero). */
typedef struct lnorm__backend_counters {
    uint64_t errors;           /* jobs whose device work failed (injected faults included) */
    uint64_t fallback_batches; /* of those, computed on the CPU instead */
    uint64_t staged_segments;  /* segments gathered into / scattered from staging memory */
    uint64_t direct_segments;  /* segments copied straight from / to their own buffers */
    uint64_t mapped_segments;  /* segments the kernels read and wrote in a client's mapped region */
    uint64_t oversize_batches; /* batches that needed a temporary device buffer */
    /* Host time by stage, summed over batches: [0] enqueue (gather and
     * queue the copies and launches), [1] wait (until the batch's device
     * work is done), [2] scatter (outputs out of staging); stage_n: batches. */
    uint64_t stage_ns[3];
    uint64_t stage_n[3];
} lnorm__backend_counters;

/* What a backend can do with the daemon's buffers: bits of ops->caps. */
enum {
    /* Every payload buffer (request inputs, outputs, registered params)
     * must come from ops->buf_alloc / buf_free (pinned memory, for DMA):
     * the daemon allocates them all there, the protobuf-c decoder
     * included, so bytes arrive in that memory with one copy only. */
    LNORM__BACKEND_CAP_PINNED_BUFFERS = 1u << 0,
    /* Inputs may stay where they arrived (in the received message, any
     * host memory aligned to their element): no copy at decode. Without
     * PINNED_BUFFERS only. */
    LNORM__BACKEND_CAP_BORROW_INPUT = 1u << 1,
    /* y may be the same memory as x (same element size, same strides):
     * each vector of x is read before y is written at its place, and no
     * row is written by one thread while another reads it. The daemon then
     * computes y over x in the request message and replies in it. */
    LNORM__BACKEND_CAP_IN_PLACE = 1u << 2,
    /* A job may hold DEVICE segments (lnorm__job.on_device set): every
     * pointer of every segment is device memory of GPU job->device, and
     * the job is computed there without any copy. */
    LNORM__BACKEND_CAP_DEVICE_SEGMENTS = 1u << 3,
};

/* The operations every backend implements. */
typedef struct lnorm__backend_ops {
    const char *name; /* "cpu", "cuda" */
    unsigned caps;    /* LNORM__BACKEND_CAP_* */
    /* Start a job; LNORM_OK means done will be called later. Any other
     * return means the job was not taken and done will not be called. */
    int (*submit)(lnorm__backend *be, lnorm__job *job);
    /* The payload allocator, with LNORM__BACKEND_CAP_PINNED_BUFFERS only
     * (else NULL: the daemon uses malloc). */
    void *(*buf_alloc)(lnorm__backend *be, size_t n);
    void (*buf_free)(lnorm__backend *be, void *p);
    /* Up to max devices described into out; returns the count. */
    int (*devices)(lnorm__backend *be, lnorm__device_info *out, int max);
    /* How many jobs the backend can have in flight at once (>= 1). */
    int (*max_inflight)(lnorm__backend *be);
    /* Stop and free; every submitted job has had done called before return. */
    void (*destroy)(lnorm__backend *be);
    /* Optional: a snapshot of the backend's own counters (for /metrics). */
    void (*counters)(lnorm__backend *be, struct lnorm__backend_counters *out);
    /* Optional: one line describing the backend's settings (for the log);
     * writes at most n bytes, NUL-terminated. */
    void (*describe)(lnorm__backend *be, char *buf, size_t n);
    /* Optional: pin n bytes of host memory at p (a client's shared region)
     * so that segments in it are copied by DMA; LNORM_OK or an error (the
     * memory is then used as it is). host_unregister undoes it, called
     * only when no job uses the memory. */
    int (*host_register)(lnorm__backend *be, void *p, size_t n);
    void (*host_unregister)(lnorm__backend *be, void *p);
    /* Optional, with LNORM__BACKEND_CAP_DEVICE_SEGMENTS: open a CUDA IPC
     * memory handle of a client's allocation of at least bytes on GPU
     * device; *p is its device pointer. LNORM_OK or an error with why. */
    int (*ipc_open)(lnorm__backend *be, const void *handle, size_t len, uint32_t device, uint64_t bytes, void **p,
                    char *why, size_t n);
    void (*ipc_close)(lnorm__backend *be, void *p, uint32_t device);
} lnorm__backend_ops;

/* Base of every backend object: a backend's struct starts with this. */
struct lnorm__backend {
    const lnorm__backend_ops *ops;
};

#ifdef __cplusplus
}
#endif
#endif /* LNORM_SERVER_BACKEND_H */
