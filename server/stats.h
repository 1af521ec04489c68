/* INFO-style counters and histograms, updated lock-free from any thread and
 * rendered in the Prometheus text format for /metrics. */
#ifndef LNORM_SERVER_STATS_H
#define LNORM_SERVER_STATS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define LNORM__HIST_MAXB 24
#define LNORM__NCODES 17
/* Batching priority levels lnormd can be configured with (priority-levels). */
#define LNORM__MAX_PRIORITY 16

typedef struct lnorm__hist {
    const char *name;
    const char *help;
    int nb;                              /* bucket bounds */
    double bounds[LNORM__HIST_MAXB];
    atomic_uint_fast64_t counts[LNORM__HIST_MAXB + 1];
    atomic_uint_fast64_t n;
    _Atomic double sum;
} lnorm__hist;

/* Where a request's time goes on the host, summed over requests
 * (lnormd_stage_seconds_total / lnormd_stage_events_total, label stage).
 * queue and compute have their own histograms; the CUDA stages are the
 * backend's, per batch. */
enum {
    LNORM__STAGE_DECODE,       /* unpack + validate (+ copy into pinned memory) */
    LNORM__STAGE_REPLY_WAIT,   /* batch finished -> a reply thread takes the request */
    LNORM__STAGE_ENCODE,       /* the reply message packed */
    LNORM__STAGE_SEND,         /* handing the reply to NNG (may write it out) */
    LNORM__STAGE_CUDA_ENQUEUE, /* batch: gather into pinned staging + copies and launches queued */
    LNORM__STAGE_CUDA_WAIT,    /* batch: queued -> its event done (H2D, kernels, D2H, any wait behind a slot) */
    LNORM__STAGE_CUDA_SCATTER, /* batch: outputs copied out of staging */
    LNORM__NSTAGES
};

/* One batching priority level (lnormd_priority_* series, label priority). */
typedef struct lnorm__level_stats {
    atomic_int_fast64_t queue_depth;     /* requests of the level waiting */
    atomic_uint_fast64_t taken;          /* requests of the level taken into a batch */
    atomic_uint_fast64_t queue_timeouts; /* answered DEADLINE_EXCEEDED past max_queue_us */
    atomic_uint_fast64_t rejected;       /* refused: the level's queue was full */
    lnorm__hist queue_seconds;           /* receipt to the start of the batch's compute */
} lnorm__level_stats;

typedef struct lnorm__stats {
    atomic_uint_fast64_t requests[LNORM__NCODES]; /* every reply, by wire status code */
    atomic_uint_fast64_t normalize_ok;
    atomic_uint_fast64_t rows;          /* rows computed */
    atomic_uint_fast64_t bytes_in;      /* request messages */
    atomic_uint_fast64_t bytes_out;     /* response messages */
    atomic_uint_fast64_t batches;
    atomic_uint_fast64_t backend_errors;
    atomic_int_fast64_t inflight;       /* requests received, not yet answered */
    atomic_int_fast64_t queue_depth;    /* requests waiting for a batch */
    atomic_int_fast64_t inflight_bytes; /* payload held by Normalize requests */
    atomic_int_fast64_t batches_inflight;
    atomic_int_fast64_t params_count;
    atomic_int_fast64_t params_bytes;
    atomic_int_fast64_t shm_regions;    /* clients' shared-memory regions (set before each render) */
    atomic_int_fast64_t shm_bytes;
    atomic_int_fast64_t shm_rings;
    atomic_int_fast64_t connections;            /* pipes taken (conns.c) */
    atomic_uint_fast64_t conns_refused_listener; /* closed on arrival: max-connections */
    atomic_uint_fast64_t conns_refused_peer;     /* closed on arrival: max-connections-per-peer */
    atomic_uint_fast64_t frames_timed_out;       /* closed by the frame watchdog: frame-timeout-ms */
    atomic_uint_fast64_t ipc_relistens;          /* ipc listeners replaced after NNG stopped them */
    atomic_int_fast64_t receiving_bytes;         /* of frames in progress, the watchdog's last look */
    atomic_uint_fast64_t frames_over_budget;     /* closed by the frame watchdog: max-receive-bytes */
    /* The backend's own counters (lnorm__backend_counters), copied in by
     * lnorm__stats_set_backend before each render. */
    atomic_uint_fast64_t cuda_errors;           /* jobs whose CUDA work failed */
    atomic_uint_fast64_t cuda_fallback_batches; /* of those, computed on the CPU */
    atomic_uint_fast64_t cuda_staged_segments;
    atomic_uint_fast64_t cuda_direct_segments;
    atomic_uint_fast64_t cuda_mapped_segments;
    atomic_uint_fast64_t cuda_oversize_batches;
    atomic_uint_fast64_t stage_ns[LNORM__NSTAGES];
    atomic_uint_fast64_t stage_n[LNORM__NSTAGES];
    lnorm__hist batch_rows;
    lnorm__hist batch_requests;
    lnorm__hist queue_seconds;
    lnorm__hist compute_seconds;
    atomic_int priority_levels;         /* levels rendered (the batcher's option in force) */
    lnorm__level_stats level[LNORM__MAX_PRIORITY]; /* [0]: level 1 */
    uint64_t start_ns;
} lnorm__stats;

void lnorm__stats_init(lnorm__stats *s);
void lnorm__hist_observe(lnorm__hist *h, double v);
void lnorm__stats_reply(lnorm__stats *s, int wire_code);
/* Add one event of ns nanoseconds to a stage (LNORM__STAGE_*). */
void lnorm__stats_stage(lnorm__stats *s, int stage, uint64_t ns);

/* Copy a backend's counters into s (any thread). */
struct lnorm__backend_counters;
void lnorm__stats_set_backend(lnorm__stats *s, const struct lnorm__backend_counters *c);

/* Render /metrics into a malloc'ed buffer (*out, *len); 0 or -1. */
int lnorm__stats_render(lnorm__stats *s, const char *backend, char **out, size_t *len);

/* Monotonic nanoseconds. */
uint64_t lnorm__now_ns(void);

#endif
