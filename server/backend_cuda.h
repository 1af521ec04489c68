/* The CUDA backend (backend_cuda.c; backend_nocuda.c when lnormd is built
 * without CUDA) and its settings. Contract: backend.h. */
#ifndef LNORM_SERVER_BACKEND_CUDA_H
#define LNORM_SERVER_BACKEND_CUDA_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the completion threads wait for a batch (cuda-sync): spinning,
 * spinning with sched_yield, or blocked in the driver until the GPU
 * interrupts. */
enum { LNORM__CUDA_SYNC_SPIN = 0, LNORM__CUDA_SYNC_YIELD = 1, LNORM__CUDA_SYNC_BLOCK = 2 };

/* What to do with a job whose CUDA work failed (cuda-fallback): fail it
 * with LNORM_ECUDA, or compute it on the CPU. */
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
    /* Test only, 0: off. Every Nth job submitted (counted over the
     * backend's life, every GPU) fails as if a kernel launch had failed,
     * after validation and before anything is enqueued; the job then takes
     * the fallback path. */
    uint64_t fault_every;
} lnorm__cuda_opts;

/* Fill o with the defaults: every GPU, 256 MiB slots, 2 per GPU, 16 MiB
 * staging arenas, 256 KiB stage threshold, spin (most rows/s measured,
 * docs/gpu.md), no fallback, no fault injection. */
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
    o->fault_every = 0;
}

/* Create the CUDA backend with the settings in o. Returns LNORM_ENODEV when
 * no GPU is usable, LNORM_EINVAL for a bad setting (a device list naming a
 * GPU that does not exist, say) and LNORM_ENOTSUP when lnormd was built
 * without CUDA. */
int lnorm__backend_cuda_create_opts(lnorm__backend **out, const lnorm__cuda_opts *o);

/* lnorm__backend_cuda_create_opts with the defaults but for the device list
 * (NULL for all), the slot size and the slots per GPU. */
int lnorm__backend_cuda_create(lnorm__backend **out, const char *devices,
                               size_t slot_bytes, int slots_per_gpu);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_SERVER_BACKEND_CUDA_H */
