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

/* Counters a backend keeps about itself (all zero for the CPU backend). */
typedef struct lnorm__backend_counters {
    uint64_t errors;           /* jobs whose device work failed (injected faults included) */
    uint64_t fallback_batches; /* of those, computed on the CPU instead (cuda-fallback = cpu) */
    uint64_t staged_segments;  /* segments gathered into / scattered from a slot's pinned arenas */
    uint64_t direct_segments;  /* segments copied straight from / to their own buffers */
    uint64_t oversize_batches; /* batches that needed a temporary device buffer */
} lnorm__backend_counters;

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
    /* Optional: a snapshot of the backend's own counters (for /metrics). */
    void (*counters)(lnorm__backend *be, struct lnorm__backend_counters *out);
    /* Optional: one line describing the backend's settings (for the log);
     * writes at most n bytes, NUL-terminated. */
    void (*describe)(lnorm__backend *be, char *buf, size_t n);
} lnorm__backend_ops;

/* Base of every backend object: a backend's struct starts with this. */
struct lnorm__backend {
    const lnorm__backend_ops *ops;
};

/* Create the CPU backend with nthreads workers (0: number of cores). */
int lnorm__backend_cpu_create(lnorm__backend **out, int nthreads);

/* How the CUDA backend's completion threads wait for a batch
 * (cuda-sync): spinning, spinning with sched_yield, or blocked in the
 * driver until the GPU interrupts. */
enum { LNORM__CUDA_SYNC_SPIN = 0, LNORM__CUDA_SYNC_YIELD = 1, LNORM__CUDA_SYNC_BLOCK = 2 };

/* What the CUDA backend does with a job whose CUDA work failed
 * (cuda-fallback): fail it with LNORM_ECUDA, or compute it on the CPU. */
enum { LNORM__CUDA_FALLBACK_NONE = 0, LNORM__CUDA_FALLBACK_CPU = 1 };

/* Defaults of the staging arenas (see lnorm__cuda_opts). */
#define LNORM__CUDA_DEFAULT_STAGING_BYTES ((size_t)16 << 20)
#define LNORM__CUDA_DEFAULT_STAGE_MAX_BYTES ((size_t)256 << 10)

/* The CUDA backend's settings (lnorm__cuda_opts_init gives the defaults). */
typedef struct lnorm__cuda_opts {
    const char *devices;    /* comma-separated GPU indices; NULL or "": all */
    size_t slot_bytes;      /* device arena per slot (a larger batch gets a temporary buffer) */
    int slots_per_gpu;      /* batches in flight per GPU, 1..64 */
    /* Pinned host input arena and output arena per slot, each this size
     * (capped at slot_bytes / 2; 0: no staging, every segment is copied
     * from / to its own buffers). */
    size_t staging_bytes;
    /* A segment whose payload (inputs + outputs, rows packed) is at most
     * this is staged: gathered into the input arena and scattered from the
     * output arena, so a batch moves in one copy each way. */
    size_t stage_max_bytes;
    int sync;               /* LNORM__CUDA_SYNC_* */
    int fallback;           /* LNORM__CUDA_FALLBACK_* */
    int cpu_threads;        /* the CPU fallback's worker pool (0: number of cores) */
} lnorm__cuda_opts;

/* Fill o with the defaults: every GPU, 256 MiB slots, 2 per GPU, 16 MiB
 * staging arenas, 256 KiB stage threshold, spin (lnormd's measured default,
 * docs/gpu.md), no fallback. */
static inline void lnorm__cuda_opts_init(lnorm__cuda_opts *o)
{
    o->devices = NULL;
    o->slot_bytes = (size_t)256 << 20;
    o->slots_per_gpu = 2;
    o->staging_bytes = LNORM__CUDA_DEFAULT_STAGING_BYTES;
    o->stage_max_bytes = LNORM__CUDA_DEFAULT_STAGE_MAX_BYTES;
    o->sync = LNORM__CUDA_SYNC_SPIN;
    o->fallback = LNORM__CUDA_FALLBACK_NONE;
    o->cpu_threads = 0;
}

/* Create the CUDA backend with the settings in o. Returns LNORM_ENODEV when
 * no GPU is usable, LNORM_EINVAL for a bad setting (a device list naming a
 * GPU that does not exist, say) and LNORM_ENOTSUP when lnormd was built
 * without CUDA.
 *
 * Test only: the environment variable LNORM_CUDA_FAULT_EVERY=N (N >= 1)
 * makes every Nth job submitted (counted over the backend's life, every
 * GPU) fail as if a kernel launch had failed, after validation and before
 * anything is enqueued; the job then takes the cuda-fallback path. */
int lnorm__backend_cuda_create_opts(lnorm__backend **out, const lnorm__cuda_opts *o);

/* lnorm__backend_cuda_create_opts with the defaults but for the device list
 * (NULL for all), the slot size and the slots per GPU. */
int lnorm__backend_cuda_create(lnorm__backend **out, const char *devices,
                               size_t slot_bytes, int slots_per_gpu);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_SERVER_BACKEND_H */
