/*
 * The CUDA backend of lnormd (backend_cuda.h). Per GPU: a submission
 * queue, a worker thread, a completion thread and a ring of batch slots,
 * under the GPU's own lock (nothing is shared between GPUs but a job
 * counter read without a lock). Each slot owns a device arena, a pinned
 * host input arena and output arena (the staging arenas), a stream, a
 * segment-table workspace and an event.
 *
 * The worker takes a job and any free slot and lays the batch out in the
 * slot's device memory as three regions: staged inputs, staged outputs,
 * direct buffers. A small segment (payload up to stage_max_bytes) is
 * STAGED: the worker memcpy's its x (and residual) into the pinned input
 * arena, laid out exactly as in the input region, and its outputs get room
 * in the output region; gamma/beta are placed once per batch whatever the
 * number of segments using them (de-duplicated by host pointer). Then ONE
 * copy moves the input region to the device, lnorm_cuda_run makes one
 * launch per (dtype, tier) group, and ONE copy brings the output region
 * back into the pinned output arena. A large segment (or one that no
 * longer fits the arenas) is DIRECT: copied straight from and to its own
 * buffers (payloads come from buf_alloc, pinned, so that is DMA too). A
 * batch larger than the device arena gets a stream-ordered temporary
 * buffer (cudaMallocAsync). All of it on the slot's stream, then its event.
 *
 * The completion thread waits for the slots' events in submission order,
 * scatters each staged segment's y / residual_out / mean / rstd from the
 * output arena into the job's buffers (row by row where rows are padded:
 * the padding between rows of a host buffer is never written), frees the
 * slot and calls job->done. A slot's arenas are not touched again before
 * its completion, so no copy in flight ever sees them rewritten.
 *
 * A CUDA failure fails the job with LNORM_ECUDA (queued copies are drained
 * first), or, with fallback = cpu, the job is computed on the CPU core
 * (kernels/cpu) from its host buffers and completes normally. An invalid
 * segment gives LNORM_EINVAL; no GPU gives LNORM_ENODEV at creation.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "backend_cuda.h"
#include "lnorm_cuda.h"

#define LNORM__CUDA_MAX_GPUS 16
#define LNORM__CUDA_QUEUE 1024
#define LNORM__CUDA_MAX_SLOTS 64
/* Segment-table entries per upload: a batch of up to 4096 one-row requests
 * (max-batch-rows' default) takes one upload. */
#define LNORM__CUDA_WS_SEGS 4096
#define LNORM__CUDA_ALIGN 256

/* Header in front of every buf_alloc block (lnorm__buf_hdr, padded). */
#define LNORM__BUF_HDR 64
#define LNORM__BUF_PINNED 0x50494e4eu
#define LNORM__BUF_MALLOC 0x4d414c4cu

/* The regions of a slot's device layout, in this order from the arena's
 * start: staged inputs (the image of the pinned input arena), staged
 * outputs (the image of the pinned output arena), direct buffers. */
enum { LNORM__REG_IN = 0, LNORM__REG_OUT = 1, LNORM__REG_DIR = 2, LNORM__NREG = 3 };

/* A buffer's place: region and offset in it. */
typedef struct lnorm__loc {
    int reg;
    size_t off;
} lnorm__loc;

/* Where one segment's buffers are, and whether it is staged. */
typedef struct lnorm__seg_plan {
    int staged;
    int mapped; /* x, y, ... in mapped client regions: the kernel moves them */
    lnorm__loc x, res, y, res_out, mean, rstd, gamma, beta;
} lnorm__seg_plan;

/* A client region registered with host_register: pinned for every GPU and
 * mapped into their address space, [lo, hi) on the host, dev on the GPUs. */
typedef struct lnorm__mapped {
    uintptr_t lo, hi, dev;
} lnorm__mapped;

/* Where one backward segment's buffers are (always direct). */
typedef struct lnorm__bwd_plan {
    lnorm__loc x, dy, dx, dres, gamma, mean, rstd, dgamma, dbeta;
} lnorm__bwd_plan;

/* A parameter vector placed in this batch (de-duplication by pointer). */
typedef struct lnorm__pent {
    const void *host;
    size_t bytes;
    lnorm__loc loc;
} lnorm__pent;

typedef struct lnorm__cuda_slot {
    void *arena;           /* device memory, slot_bytes */
    void *tmp;             /* temporary device buffer for an oversize batch */
    unsigned char *hin;    /* pinned input arena, stage_cap bytes (NULL: no staging) */
    unsigned char *hout;   /* pinned output arena, stage_cap bytes */
    size_t stage_cap;
    cudaStream_t stream;
    cudaEvent_t done_ev;
    lnorm_cuda_ws *ws;
    /* per batch, sized to the largest batch seen */
    lnorm_segment *dsegs;  /* device-pointer copy of the job's segments */
    lnorm__seg_plan *plan;
    size_t cap;            /* entries of dsegs and plan */
    lnorm_bwd_segment *dbsegs; /* device-pointer copy of the job's backward segments */
    lnorm__bwd_plan *bplan;
    size_t bcap;           /* entries of dbsegs and bplan */
    lnorm__pent *params;   /* distinct parameter vectors of the batch */
    int32_t *phash;        /* open addressing into params, -1: empty */
    size_t pcap, hcap;     /* entries of params, of phash (a power of two) */
    size_t nparams;
    /* the job in the slot */
    lnorm__job *job;
    int fault;             /* injected fault (fault_every) */
    int err;               /* enqueue error (then done_ev is not waited for) */
    const char *why;
    int enqueued;          /* work and done_ev are on the stream */
    int any_staged;        /* the completion has segments to scatter */
    uint64_t t0, t_enq;        /* job taken; its work queued (monotonic ns) */
    int busy;
} lnorm__cuda_slot;

typedef struct lnorm__cuda_be lnorm__cuda_be;

typedef struct lnorm__cuda_gpu {
    lnorm__cuda_be *be;
    int dev;
    char name[128];
    uint64_t mem;
    unsigned sched;        /* cudaDeviceSchedule* flag in effect */
    lnorm__cuda_slot *slots;
    int nslots;
    pthread_mutex_t mu;    /* everything below */
    pthread_cond_t cv_q;   /* queue not empty, or stopping (the worker) */
    pthread_cond_t cv_slot;/* a slot was freed (the worker) */
    pthread_cond_t cv_fifo;/* fifo not empty, or the worker finished (the completer) */
    lnorm__job *q[LNORM__CUDA_QUEUE];
    unsigned char qfault[LNORM__CUDA_QUEUE];
    size_t qhead, qcount;
    int fifo[LNORM__CUDA_MAX_SLOTS]; /* slots in flight, in submission order */
    int fhead, fcount;
    int stopping;
    int worker_done;
    atomic_int inflight;   /* queued + in slots; read without mu to pick a GPU */
    int sync_ok;           /* mu, cvs initialised */
    int worker_started, completer_started;
    pthread_t worker, completer;
} lnorm__cuda_gpu;

struct lnorm__cuda_be {
    lnorm__backend base;
    lnorm__cuda_gpu gpus[LNORM__CUDA_MAX_GPUS];
    int ngpus;
    size_t slot_bytes;
    size_t stage_max;
    int sync;
    int fallback;
    lnorm_cpu *cpu;        /* the CPU fallback (fallback = cpu) */
    uint64_t fault_every;  /* test only, 0: off */
    atomic_uint_fast64_t fault_seq;
    atomic_int stopping;
    atomic_uint_fast64_t n_errors, n_fallback, n_staged, n_direct, n_oversize, n_mapped;
    pthread_rwlock_t map_mu;   /* maps: written by host_(un)register, read per batch */
    lnorm__mapped *maps;
    size_t nmaps, mapcap;
    atomic_uint_fast64_t stage_ns[3], stage_n[3]; /* lnorm__backend_counters' stages */
};

static uint64_t lnorm__cuda_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void lnorm__cuda_stage(lnorm__cuda_be *be, int i, uint64_t ns)
{
    atomic_fetch_add_explicit(&be->stage_ns[i], ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&be->stage_n[i], 1, memory_order_relaxed);
}

static size_t lnorm__up(size_t n)
{
    return (n + LNORM__CUDA_ALIGN - 1) & ~(size_t)(LNORM__CUDA_ALIGN - 1);
}

/* Bytes spanned by rows rows of hidden elements at stride (0 if rows == 0). */
static size_t lnorm__span(int64_t rows, int64_t stride, int64_t hidden, int dt)
{
    if (rows < 1)
        return 0;
    return (size_t)((rows - 1) * stride + hidden) * lnorm_dtype_size(dt);
}

/* rows rows of row_bytes each from src (pitch src_pitch bytes) to dst
 * (pitch dst_pitch); one memcpy when both are packed. Bytes between rows
 * are neither read nor written. */
static void lnorm__copy_rows(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t row_bytes,
                             int64_t rows)
{
    if (rows < 1)
        return;
    if (dst_pitch == row_bytes && src_pitch == row_bytes) {
        memcpy(dst, src, row_bytes * (size_t)rows);
        return;
    }
    char *d = dst;
    const char *s = src;
    for (int64_t r = 0; r < rows; r++, d += dst_pitch, s += src_pitch)
        memcpy(d, s, row_bytes);
}

/* Room for bytes in region reg of the layout (used: bytes per region). */
static lnorm__loc lnorm__take(size_t *used, int reg, size_t bytes)
{
    lnorm__loc l = {reg, used[reg]};
    used[reg] += lnorm__up(bytes);
    return l;
}

/* Make the slot's per-batch tables hold a batch of n forward and nb
 * backward segments. */
static int lnorm__slot_reserve(lnorm__cuda_slot *sl, size_t n, size_t nb)
{
    if (nb > sl->bcap) {
        lnorm_bwd_segment *d = realloc(sl->dbsegs, nb * sizeof *d);
        if (!d)
            return LNORM_ENOMEM;
        sl->dbsegs = d;
        lnorm__bwd_plan *p = realloc(sl->bplan, nb * sizeof *p);
        if (!p)
            return LNORM_ENOMEM;
        sl->bplan = p;
        sl->bcap = nb;
    }
    n += nb; /* the parameter tables below count both kinds */
    if (n > sl->cap) {
        lnorm_segment *d = realloc(sl->dsegs, n * sizeof *d);
        if (!d)
            return LNORM_ENOMEM;
        sl->dsegs = d;
        lnorm__seg_plan *p = realloc(sl->plan, n * sizeof *p);
        if (!p)
            return LNORM_ENOMEM;
        sl->plan = p;
        sl->cap = n;
    }
    size_t pn = 2 * n; /* gamma and beta of every segment at most */
    if (pn > sl->pcap) {
        lnorm__pent *p = realloc(sl->params, pn * sizeof *p);
        if (!p)
            return LNORM_ENOMEM;
        sl->params = p;
        sl->pcap = pn;
    }
    size_t hn = 16;
    while (hn < 2 * pn)
        hn *= 2;
    if (hn > sl->hcap) {
        int32_t *h = realloc(sl->phash, hn * sizeof *h);
        if (!h)
            return LNORM_ENOMEM;
        sl->phash = h;
        sl->hcap = hn;
    }
    return LNORM_OK;
}

/* Place a parameter vector of the batch (NULL: none): the place it already
 * has if the same host pointer came earlier in this batch, else new room,
 * staged when it is small enough and fits. hmask: the hash size used for
 * this batch, minus 1. */
static lnorm__loc lnorm__place_param(lnorm__cuda_be *be, lnorm__cuda_slot *sl, size_t hmask, size_t *used,
                                     const void *host, size_t bytes)
{
    uintptr_t key = (uintptr_t)host;
    size_t h = (size_t)(((uint64_t)key >> 4) * 0x9e3779b97f4a7c15ull >> 20) & hmask;
    for (;; h = (h + 1) & hmask) {
        int32_t ix = sl->phash[h];
        if (ix < 0)
            break;
        lnorm__pent *e = &sl->params[ix];
        if (e->host == host && e->bytes >= bytes)
            return e->loc;
    }
    lnorm__pent *e = &sl->params[sl->nparams];
    e->host = host;
    e->bytes = bytes;
    if (sl->stage_cap && bytes <= be->stage_max && used[LNORM__REG_IN] + lnorm__up(bytes) <= sl->stage_cap)
        e->loc = lnorm__take(used, LNORM__REG_IN, bytes);
    else
        e->loc = lnorm__take(used, LNORM__REG_DIR, bytes);
    sl->phash[h] = (int32_t)sl->nparams++;
    return e->loc;
}

/* Plan one segment's buffers (see the file comment). */
/* The device address of [p, p + n) if it lies in one mapped region, else
 * 0 (map_mu held for reading). */
static uintptr_t lnorm__mapped_dev(const lnorm__cuda_be *be, const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < be->nmaps; i++) {
        const lnorm__mapped *m = &be->maps[i];
        if (a >= m->lo && a < m->hi && n <= m->hi - a)
            return m->dev + (a - m->lo);
    }
    return 0;
}

/* Plan s as a mapped segment if every tensor it has is in a mapped region
 * and its kernel moves them with plain loads and stores; p gets their
 * device addresses (region -1: an absolute address). map_mu held for
 * reading. */
static int lnorm__mapped_plan(const lnorm__cuda_be *be, const lnorm_segment *s, lnorm__seg_plan *p)
{
    if (!be->nmaps || !lnorm_cuda_plain_io(s))
        return 0;
    struct {
        const void *h;
        size_t n;
        lnorm__loc *l;
    } t[6] = {{s->x, lnorm__span(s->rows, s->x_stride, s->hidden, s->x_dtype), &p->x},
              {s->y, lnorm__span(s->rows, s->y_stride, s->hidden, s->y_dtype), &p->y},
              {s->residual, lnorm__span(s->rows, s->res_stride, s->hidden, s->x_dtype), &p->res},
              {s->residual_out, lnorm__span(s->rows, s->res_out_stride, s->hidden, s->x_dtype), &p->res_out},
              {s->mean, (size_t)s->rows * 4, &p->mean},
              {s->rstd, (size_t)s->rows * 4, &p->rstd}};
    for (int i = 0; i < 6; i++) {
        if (!t[i].h)
            continue;
        uintptr_t d = lnorm__mapped_dev(be, t[i].h, t[i].n);
        if (!d)
            return 0;
        t[i].l->reg = -1;
        t[i].l->off = (size_t)d;
    }
    p->mapped = 1;
    return 1;
}

static void lnorm__plan_segment(lnorm__cuda_be *be, lnorm__cuda_slot *sl, size_t hmask, size_t *used,
                                const lnorm_segment *s, lnorm__seg_plan *p)
{
    const size_t xsz = lnorm_dtype_size(s->x_dtype), ysz = lnorm_dtype_size(s->y_dtype);
    const size_t n = (size_t)s->rows * (size_t)s->hidden;
    const size_t xb = n * xsz, yb = n * ysz, sb = (size_t)s->rows * 4;
    size_t in_need = lnorm__up(xb), out_need = lnorm__up(yb), payload = xb + yb;
    if (s->residual) {
        in_need += lnorm__up(xb);
        out_need += lnorm__up(xb);
        payload += 2 * xb;
    }
    if (s->mean) {
        out_need += lnorm__up(sb);
        payload += sb;
    }
    if (s->rstd) {
        out_need += lnorm__up(sb);
        payload += sb;
    }
    memset(p, 0, sizeof *p);
    /* A small segment whose tensors all lie in mapped client regions is
     * read and written by the kernel over PCIe: no gather, no scatter, no
     * copy call (one 1 x 4096 row costs ~1.4 us of memcpy staged). */
    if (payload <= be->stage_max && lnorm__mapped_plan(be, s, p))
        goto params;
    p->staged = sl->stage_cap && payload <= be->stage_max && used[LNORM__REG_IN] + in_need <= sl->stage_cap &&
                used[LNORM__REG_OUT] + out_need <= sl->stage_cap;
    if (p->staged) {
        p->x = lnorm__take(used, LNORM__REG_IN, xb);
        p->y = lnorm__take(used, LNORM__REG_OUT, yb);
        if (s->residual) {
            p->res = lnorm__take(used, LNORM__REG_IN, xb);
            p->res_out = lnorm__take(used, LNORM__REG_OUT, xb);
        }
        if (s->mean)
            p->mean = lnorm__take(used, LNORM__REG_OUT, sb);
        if (s->rstd)
            p->rstd = lnorm__take(used, LNORM__REG_OUT, sb);
    } else {
        p->x = lnorm__take(used, LNORM__REG_DIR, lnorm__span(s->rows, s->x_stride, s->hidden, s->x_dtype));
        p->y = lnorm__take(used, LNORM__REG_DIR, lnorm__span(s->rows, s->y_stride, s->hidden, s->y_dtype));
        if (s->residual) {
            p->res = lnorm__take(used, LNORM__REG_DIR, lnorm__span(s->rows, s->res_stride, s->hidden, s->x_dtype));
            p->res_out =
                lnorm__take(used, LNORM__REG_DIR, lnorm__span(s->rows, s->res_out_stride, s->hidden, s->x_dtype));
        }
        if (s->mean)
            p->mean = lnorm__take(used, LNORM__REG_DIR, sb);
        if (s->rstd)
            p->rstd = lnorm__take(used, LNORM__REG_DIR, sb);
    }
params:;
    const size_t pb = (size_t)s->hidden * lnorm_dtype_size(s->param_dtype);
    if (s->gamma)
        p->gamma = lnorm__place_param(be, sl, hmask, used, s->gamma, pb);
    if (s->beta)
        p->beta = lnorm__place_param(be, sl, hmask, used, s->beta, pb);
}

/* Plan one backward segment: every buffer direct, in its own span. */
static void lnorm__plan_bwd(lnorm__cuda_be *be, lnorm__cuda_slot *sl, size_t hmask, size_t *used,
                            const lnorm_bwd_segment *s, lnorm__bwd_plan *p)
{
    const size_t sb = (size_t)s->rows * 4, gb = (size_t)s->hidden * 4;
    memset(p, 0, sizeof *p);
    p->x = lnorm__take(used, LNORM__REG_DIR, lnorm__span(s->rows, s->x_stride, s->hidden, s->x_dtype));
    p->dy = lnorm__take(used, LNORM__REG_DIR, lnorm__span(s->rows, s->dy_stride, s->hidden, s->dy_dtype));
    p->dx = lnorm__take(used, LNORM__REG_DIR, lnorm__span(s->rows, s->dx_stride, s->hidden, s->dx_dtype));
    if (s->dres)
        p->dres = lnorm__take(used, LNORM__REG_DIR, lnorm__span(s->rows, s->dres_stride, s->hidden, s->x_dtype));
    if (s->mean)
        p->mean = lnorm__take(used, LNORM__REG_DIR, sb);
    if (s->rstd)
        p->rstd = lnorm__take(used, LNORM__REG_DIR, sb);
    if (s->dgamma)
        p->dgamma = lnorm__take(used, LNORM__REG_DIR, gb);
    if (s->dbeta)
        p->dbeta = lnorm__take(used, LNORM__REG_DIR, gb);
    if (s->gamma)
        p->gamma = lnorm__place_param(be, sl, hmask, used, s->gamma,
                                      (size_t)s->hidden * lnorm_dtype_size(s->param_dtype));
}

#define LNORM__CK(call, what)           \
    do {                                \
        if ((call) != cudaSuccess) {    \
            sl->why = what;             \
            return LNORM_ECUDA;         \
        }                               \
    } while (0)

/* Enqueue one job on a slot's stream: gather, uploads, the batch,
 * downloads, event. Sets sl->enqueued once the event is recorded. */
static int lnorm__cuda_enqueue(lnorm__cuda_be *be, lnorm__cuda_slot *sl, lnorm__job *job)
{
    const lnorm_batch *b = &job->batch;
    const lnorm_bwd_batch *bb = &job->bwd;
    for (size_t i = 0; i < b->nsegs; i++) {
        int rc = lnorm_segment_validate(&b->segs[i], &sl->why);
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < bb->nsegs; i++) {
        int rc = lnorm_bwd_segment_validate(&bb->segs[i], &sl->why);
        if (rc)
            return rc;
    }
    if (sl->fault) {
        sl->why = "injected fault (fault_every, test only)";
        return LNORM_ECUDA;
    }
    if (b->nsegs == 0 && bb->nsegs == 0)
        return LNORM_OK;
    if (job->on_device) {
        if (bb->nsegs) {
            sl->why = "a job on GPU memory with backward segments (not supported)";
            return LNORM_EINVAL;
        }
        /* Every pointer is already memory of this GPU: the kernels run
         * where the tensors lie, on the slot's stream (with its workspace),
         * so that one job's launch overlaps the reply and the next request
         * of another. */
        int rc = lnorm_cuda_run(b, sl->stream, sl->ws, &sl->why);
        if (rc)
            return rc;
        LNORM__CK(cudaEventRecord(sl->done_ev, sl->stream), "cudaEventRecord");
        sl->enqueued = 1;
        return LNORM_OK;
    }
    if (lnorm__slot_reserve(sl, b->nsegs, bb->nsegs) != LNORM_OK) {
        sl->why = "out of memory (segment table)";
        return LNORM_ENOMEM;
    }

    /* Pass 1: the layout. */
    size_t used[LNORM__NREG] = {0, 0, 0};
    size_t hn = 16;
    while (hn < 4 * (b->nsegs + bb->nsegs))
        hn *= 2;
    memset(sl->phash, 0xff, hn * sizeof *sl->phash);
    sl->nparams = 0;
    uint64_t nstaged = 0, nmapped = 0;
    pthread_rwlock_rdlock(&be->map_mu);
    for (size_t i = 0; i < b->nsegs; i++) {
        lnorm__plan_segment(be, sl, hn - 1, used, &b->segs[i], &sl->plan[i]);
        nstaged += (uint64_t)sl->plan[i].staged;
        nmapped += (uint64_t)sl->plan[i].mapped;
    }
    pthread_rwlock_unlock(&be->map_mu);
    for (size_t i = 0; i < bb->nsegs; i++)
        lnorm__plan_bwd(be, sl, hn - 1, used, &bb->segs[i], &sl->bplan[i]);
    /* The backward's dgamma/dbeta partials: slot memory, after the rest. */
    size_t scratch_bytes = 0;
    lnorm__loc scratch = {LNORM__REG_DIR, 0};
    if (bb->nsegs) {
        scratch_bytes = lnorm_cuda_bwd_scratch_bytes(bb);
        if (scratch_bytes == SIZE_MAX) {
            sl->why = "backward batch: invalid";
            return LNORM_EINVAL;
        }
        scratch = lnorm__take(used, LNORM__REG_DIR, scratch_bytes);
    }
    sl->any_staged = nstaged != 0;
    atomic_fetch_add_explicit(&be->n_staged, nstaged, memory_order_relaxed);
    atomic_fetch_add_explicit(&be->n_mapped, nmapped, memory_order_relaxed);
    atomic_fetch_add_explicit(&be->n_direct, (uint64_t)(b->nsegs + bb->nsegs) - nstaged - nmapped,
                              memory_order_relaxed);

    const size_t in_bytes = used[LNORM__REG_IN], out_bytes = used[LNORM__REG_OUT];
    const size_t need = in_bytes + out_bytes + used[LNORM__REG_DIR];
    char *dev = sl->arena;
    if (need > be->slot_bytes) {
        void *t = NULL;
        if (cudaMallocAsync(&t, need, sl->stream) != cudaSuccess) {
            sl->why = "cudaMallocAsync (batch larger than a slot)";
            return LNORM_ECUDA;
        }
        sl->tmp = t;
        dev = t;
        atomic_fetch_add_explicit(&be->n_oversize, 1, memory_order_relaxed);
    }
    char *base[LNORM__NREG] = {dev, dev + in_bytes, dev + in_bytes + out_bytes};
#define LNORM__DEV(l) ((l).reg < 0 ? (char *)(l).off : base[(l).reg] + (l).off)

    /* Pass 2: device segments, the gather into the input arena. */
    for (size_t i = 0; i < b->nsegs; i++) {
        const lnorm_segment *s = &b->segs[i];
        const lnorm__seg_plan *p = &sl->plan[i];
        lnorm_segment *d = &sl->dsegs[i];
        *d = *s;
        d->x = LNORM__DEV(p->x);
        d->y = LNORM__DEV(p->y);
        if (s->residual) {
            d->residual = LNORM__DEV(p->res);
            d->residual_out = LNORM__DEV(p->res_out);
        }
        if (s->gamma)
            d->gamma = LNORM__DEV(p->gamma);
        if (s->beta)
            d->beta = LNORM__DEV(p->beta);
        if (s->mean)
            d->mean = (float *)(void *)LNORM__DEV(p->mean);
        if (s->rstd)
            d->rstd = (float *)(void *)LNORM__DEV(p->rstd);
        if (!p->staged)
            continue;
        /* Staged rows are packed on the device (strides = hidden); the
         * kernels' results do not depend on strides. */
        const size_t xsz = lnorm_dtype_size(s->x_dtype), row = (size_t)s->hidden * xsz;
        d->x_stride = d->y_stride = s->hidden;
        lnorm__copy_rows(sl->hin + p->x.off, row, s->x, (size_t)s->x_stride * xsz, row, s->rows);
        if (s->residual) {
            d->res_stride = d->res_out_stride = s->hidden;
            lnorm__copy_rows(sl->hin + p->res.off, row, s->residual, (size_t)s->res_stride * xsz, row, s->rows);
        }
    }
    for (size_t i = 0; i < bb->nsegs; i++) {
        const lnorm_bwd_segment *s = &bb->segs[i];
        const lnorm__bwd_plan *p = &sl->bplan[i];
        lnorm_bwd_segment *d = &sl->dbsegs[i];
        *d = *s;
        d->x = LNORM__DEV(p->x);
        d->dy = LNORM__DEV(p->dy);
        d->dx = LNORM__DEV(p->dx);
        if (s->dres)
            d->dres = LNORM__DEV(p->dres);
        if (s->gamma)
            d->gamma = LNORM__DEV(p->gamma);
        if (s->mean)
            d->mean = (const float *)(const void *)LNORM__DEV(p->mean);
        if (s->rstd)
            d->rstd = (const float *)(const void *)LNORM__DEV(p->rstd);
        if (s->dgamma)
            d->dgamma = (float *)(void *)LNORM__DEV(p->dgamma);
        if (s->dbeta)
            d->dbeta = (float *)(void *)LNORM__DEV(p->dbeta);
    }
    for (size_t k = 0; k < sl->nparams; k++) {
        const lnorm__pent *e = &sl->params[k];
        if (e->loc.reg == LNORM__REG_IN)
            memcpy(sl->hin + e->loc.off, e->host, e->bytes);
    }

    /* Uploads: the input region in one copy, then the direct buffers. */
    cudaStream_t st = sl->stream;
    if (in_bytes)
        LNORM__CK(cudaMemcpyAsync(base[LNORM__REG_IN], sl->hin, in_bytes, cudaMemcpyHostToDevice, st),
                  "cudaMemcpyAsync (staged inputs)");
    for (size_t k = 0; k < sl->nparams; k++) {
        const lnorm__pent *e = &sl->params[k];
        if (e->loc.reg == LNORM__REG_DIR)
            LNORM__CK(cudaMemcpyAsync(LNORM__DEV(e->loc), e->host, e->bytes, cudaMemcpyHostToDevice, st),
                      "cudaMemcpyAsync (gamma/beta)");
    }
    for (size_t i = 0; i < b->nsegs; i++) {
        const lnorm_segment *s = &b->segs[i];
        const lnorm_segment *d = &sl->dsegs[i];
        if (sl->plan[i].staged || sl->plan[i].mapped)
            continue;
        LNORM__CK(cudaMemcpyAsync((void *)d->x, s->x, lnorm__span(s->rows, s->x_stride, s->hidden, s->x_dtype),
                                  cudaMemcpyHostToDevice, st),
                  "cudaMemcpyAsync (x)");
        if (s->residual)
            LNORM__CK(cudaMemcpyAsync((void *)d->residual, s->residual,
                                      lnorm__span(s->rows, s->res_stride, s->hidden, s->x_dtype),
                                      cudaMemcpyHostToDevice, st),
                      "cudaMemcpyAsync (residual)");
    }
    for (size_t i = 0; i < bb->nsegs; i++) {
        const lnorm_bwd_segment *s = &bb->segs[i];
        const lnorm_bwd_segment *d = &sl->dbsegs[i];
        LNORM__CK(cudaMemcpyAsync((void *)d->x, s->x, lnorm__span(s->rows, s->x_stride, s->hidden, s->x_dtype),
                                  cudaMemcpyHostToDevice, st),
                  "cudaMemcpyAsync (backward x)");
        LNORM__CK(cudaMemcpyAsync((void *)d->dy, s->dy, lnorm__span(s->rows, s->dy_stride, s->hidden, s->dy_dtype),
                                  cudaMemcpyHostToDevice, st),
                  "cudaMemcpyAsync (backward dy)");
        if (s->dres)
            LNORM__CK(cudaMemcpyAsync((void *)d->dres, s->dres,
                                      lnorm__span(s->rows, s->dres_stride, s->hidden, s->x_dtype),
                                      cudaMemcpyHostToDevice, st),
                      "cudaMemcpyAsync (backward dres)");
        if (s->mean)
            LNORM__CK(cudaMemcpyAsync((void *)d->mean, s->mean, (size_t)s->rows * 4, cudaMemcpyHostToDevice, st),
                      "cudaMemcpyAsync (backward mean)");
        if (s->rstd)
            LNORM__CK(cudaMemcpyAsync((void *)d->rstd, s->rstd, (size_t)s->rows * 4, cudaMemcpyHostToDevice, st),
                      "cudaMemcpyAsync (backward rstd)");
    }
    void *scratch_dev = scratch_bytes ? LNORM__DEV(scratch) : NULL;
#undef LNORM__DEV

    int rc = LNORM_OK;
    if (b->nsegs) {
        lnorm_batch db = {sl->dsegs, b->nsegs};
        rc = lnorm_cuda_run(&db, st, sl->ws, &sl->why);
        if (rc)
            return rc;
    }
    if (bb->nsegs) {
        lnorm_bwd_batch dbb = {sl->dbsegs, bb->nsegs};
        rc = lnorm_cuda_run_bwd(&dbb, st, scratch_dev, scratch_bytes, &sl->why);
        if (rc)
            return rc;
    }

    /* Downloads: the output region in one copy, then the direct buffers. */
    if (out_bytes)
        LNORM__CK(cudaMemcpyAsync(sl->hout, base[LNORM__REG_OUT], out_bytes, cudaMemcpyDeviceToHost, st),
                  "cudaMemcpyAsync (staged outputs)");
    for (size_t i = 0; i < b->nsegs; i++) {
        const lnorm_segment *s = &b->segs[i];
        const lnorm_segment *d = &sl->dsegs[i];
        if (sl->plan[i].staged || sl->plan[i].mapped)
            continue;
        /* y and residual_out come back row by row (2D: one contiguous
         * copy when rows are not padded), so the padding between host rows
         * is never overwritten with what the device buffer holds there. */
        size_t ysz = lnorm_dtype_size(s->y_dtype), xsz = lnorm_dtype_size(s->x_dtype);
        LNORM__CK(cudaMemcpy2DAsync(s->y, (size_t)s->y_stride * ysz, d->y, (size_t)s->y_stride * ysz,
                                    (size_t)s->hidden * ysz, (size_t)s->rows, cudaMemcpyDeviceToHost, st),
                  "cudaMemcpy2DAsync (y)");
        if (s->residual) {
            LNORM__CK(cudaMemcpy2DAsync(s->residual_out, (size_t)s->res_out_stride * xsz, d->residual_out,
                                        (size_t)s->res_out_stride * xsz, (size_t)s->hidden * xsz, (size_t)s->rows,
                                        cudaMemcpyDeviceToHost, st),
                      "cudaMemcpy2DAsync (residual_out)");
        }
        if (s->mean)
            LNORM__CK(cudaMemcpyAsync(s->mean, d->mean, (size_t)s->rows * 4, cudaMemcpyDeviceToHost, st),
                      "cudaMemcpyAsync (mean)");
        if (s->rstd)
            LNORM__CK(cudaMemcpyAsync(s->rstd, d->rstd, (size_t)s->rows * 4, cudaMemcpyDeviceToHost, st),
                      "cudaMemcpyAsync (rstd)");
    }
    for (size_t i = 0; i < bb->nsegs; i++) {
        const lnorm_bwd_segment *s = &bb->segs[i];
        const lnorm_bwd_segment *d = &sl->dbsegs[i];
        size_t dxsz = lnorm_dtype_size(s->dx_dtype);
        LNORM__CK(cudaMemcpy2DAsync(s->dx, (size_t)s->dx_stride * dxsz, d->dx, (size_t)s->dx_stride * dxsz,
                                    (size_t)s->hidden * dxsz, (size_t)s->rows, cudaMemcpyDeviceToHost, st),
                  "cudaMemcpy2DAsync (dx)");
        if (s->dgamma)
            LNORM__CK(cudaMemcpyAsync(s->dgamma, d->dgamma, (size_t)s->hidden * 4, cudaMemcpyDeviceToHost, st),
                      "cudaMemcpyAsync (dgamma)");
        if (s->dbeta)
            LNORM__CK(cudaMemcpyAsync(s->dbeta, d->dbeta, (size_t)s->hidden * 4, cudaMemcpyDeviceToHost, st),
                      "cudaMemcpyAsync (dbeta)");
    }
    if (sl->tmp) {
        LNORM__CK(cudaFreeAsync(sl->tmp, st), "cudaFreeAsync");
        sl->tmp = NULL;
    }
    LNORM__CK(cudaEventRecord(sl->done_ev, st), "cudaEventRecord");
    sl->enqueued = 1;
    return LNORM_OK;
}

/* After a failure on a slot: wait until nothing queued on its stream can
 * still read or write the job's buffers or the slot's arenas, free a
 * temporary buffer, clear the (non-sticky) error. */
static void lnorm__slot_drain(lnorm__cuda_slot *sl)
{
    cudaStreamSynchronize(sl->stream);
    if (sl->tmp) {
        if (cudaFreeAsync(sl->tmp, sl->stream) == cudaSuccess)
            cudaStreamSynchronize(sl->stream);
        else
            cudaFree(sl->tmp);
        sl->tmp = NULL;
    }
    (void)cudaGetLastError();
}

/* Copy the staged outputs of a finished slot to the job's buffers. */
static void lnorm__slot_scatter(lnorm__cuda_slot *sl)
{
    const lnorm_batch *b = &sl->job->batch;
    for (size_t i = 0; i < b->nsegs; i++) {
        const lnorm__seg_plan *p = &sl->plan[i];
        if (!p->staged)
            continue;
        const lnorm_segment *s = &b->segs[i];
        const size_t ysz = lnorm_dtype_size(s->y_dtype), xsz = lnorm_dtype_size(s->x_dtype);
        const size_t yrow = (size_t)s->hidden * ysz, xrow = (size_t)s->hidden * xsz;
        lnorm__copy_rows(s->y, (size_t)s->y_stride * ysz, sl->hout + p->y.off, yrow, yrow, s->rows);
        if (s->residual)
            lnorm__copy_rows(s->residual_out, (size_t)s->res_out_stride * xsz, sl->hout + p->res_out.off, xrow,
                             xrow, s->rows);
        if (s->mean)
            memcpy(s->mean, sl->hout + p->mean.off, (size_t)s->rows * 4);
        if (s->rstd)
            memcpy(s->rstd, sl->hout + p->rstd.off, (size_t)s->rows * 4);
    }
}

/* A free slot of g, or -1; mu held. */
static int lnorm__free_slot(const lnorm__cuda_gpu *g)
{
    for (int k = 0; k < g->nslots; k++)
        if (!g->slots[k].busy)
            return k;
    return -1;
}

/* Worker: takes jobs from the GPU's queue, puts each on a free slot. */
static void *lnorm__cuda_worker(void *arg)
{
    lnorm__cuda_gpu *g = arg;
    lnorm__cuda_be *be = g->be;
    int dev_ok = cudaSetDevice(g->dev) == cudaSuccess;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->qcount && !g->stopping)
            pthread_cond_wait(&g->cv_q, &g->mu);
        if (!g->qcount)
            break; /* stopping and drained */
        int k;
        while ((k = lnorm__free_slot(g)) < 0)
            pthread_cond_wait(&g->cv_slot, &g->mu);
        lnorm__job *job = g->q[g->qhead];
        int fault = g->qfault[g->qhead];
        g->qhead = (g->qhead + 1) % LNORM__CUDA_QUEUE;
        g->qcount--;
        lnorm__cuda_slot *sl = &g->slots[k];
        sl->busy = 1;
        pthread_mutex_unlock(&g->mu);

        sl->job = job;
        sl->fault = fault;
        sl->why = NULL;
        sl->enqueued = 0;
        sl->any_staged = 0;
        sl->t0 = lnorm__cuda_now();
        if (!dev_ok) {
            sl->err = LNORM_ECUDA;
            sl->why = "cudaSetDevice";
        } else {
            sl->err = lnorm__cuda_enqueue(be, sl, job);
            sl->t_enq = lnorm__cuda_now();
            lnorm__cuda_stage(be, 0, sl->t_enq - sl->t0);
            if (sl->err) {
                /* Copies already queued may still read or write the job's
                 * buffers: let them finish before done is called. */
                lnorm__slot_drain(sl);
                sl->enqueued = 0;
            }
        }

        pthread_mutex_lock(&g->mu);
        g->fifo[(g->fhead + g->fcount) % LNORM__CUDA_MAX_SLOTS] = k;
        g->fcount++;
        pthread_cond_signal(&g->cv_fifo);
    }
    g->worker_done = 1;
    pthread_cond_signal(&g->cv_fifo);
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* Completion: waits for slots in submission order, scatters, calls done,
 * frees them. A job whose CUDA work failed goes to the CPU fallback when
 * it is configured. */
static void *lnorm__cuda_completer(void *arg)
{
    lnorm__cuda_gpu *g = arg;
    lnorm__cuda_be *be = g->be;
    cudaSetDevice(g->dev);
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->fcount && !g->worker_done)
            pthread_cond_wait(&g->cv_fifo, &g->mu);
        if (!g->fcount)
            break;
        int k = g->fifo[g->fhead];
        g->fhead = (g->fhead + 1) % LNORM__CUDA_MAX_SLOTS;
        g->fcount--;
        pthread_mutex_unlock(&g->mu);

        lnorm__cuda_slot *sl = &g->slots[k];
        lnorm__job *job = sl->job;
        int err = sl->err;
        const char *why = sl->why;
        if (!err && sl->enqueued) {
            cudaError_t ce = cudaEventSynchronize(sl->done_ev);
            uint64_t t_done = lnorm__cuda_now();
            lnorm__cuda_stage(be, 1, t_done - sl->t_enq);
            if (ce != cudaSuccess) {
                err = LNORM_ECUDA;
                why = cudaGetErrorString(ce);
                lnorm__slot_drain(sl);
            } else if (sl->any_staged) {
                lnorm__slot_scatter(sl);
                lnorm__cuda_stage(be, 2, lnorm__cuda_now() - t_done);
            }
        }
        if (err == LNORM_ECUDA) {
            atomic_fetch_add_explicit(&be->n_errors, 1, memory_order_relaxed);
            if (be->cpu && !job->on_device) {
                /* The stream is drained: nothing of the GPU's can still
                 * write the job's buffers. */
                const char *cwhy = NULL;
                int crc = lnorm_cpu_run(be->cpu, &job->batch, &cwhy);
                if (crc == LNORM_OK && job->bwd.nsegs)
                    crc = lnorm_cpu_run_bwd(be->cpu, &job->bwd, &cwhy);
                if (crc == LNORM_OK) {
                    atomic_fetch_add_explicit(&be->n_fallback, 1, memory_order_relaxed);
                    err = LNORM_OK;
                } else {
                    err = crc;
                    why = cwhy ? cwhy : "CPU fallback failed";
                }
            }
        }
        uint64_t ns = lnorm__cuda_now() - sl->t0;
        sl->job = NULL;

        pthread_mutex_lock(&g->mu);
        sl->busy = 0;
        pthread_cond_signal(&g->cv_slot);
        pthread_mutex_unlock(&g->mu);
        atomic_fetch_sub_explicit(&g->inflight, 1, memory_order_relaxed);
        job->done(job, err, err ? why : NULL, ns);
        pthread_mutex_lock(&g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

static lnorm__cuda_gpu *lnorm__cuda_gpu_of(lnorm__cuda_be *be, int dev)
{
    for (int i = 0; i < be->ngpus; i++)
        if (be->gpus[i].dev == dev)
            return &be->gpus[i];
    return NULL;
}

static int lnorm__cuda_submit(lnorm__backend *base, lnorm__job *job)
{
    lnorm__cuda_be *be = (lnorm__cuda_be *)base;
    if (atomic_load_explicit(&be->stopping, memory_order_acquire))
        return LNORM_EUNAVAIL;
    /* A job on device memory goes to its GPU; any other to the GPU with
     * the fewest jobs in hand (a racy read is fine: it only spreads the
     * load). */
    lnorm__cuda_gpu *g = &be->gpus[0];
    if (job->on_device) {
        g = lnorm__cuda_gpu_of(be, job->device);
        if (!g)
            return LNORM_ENODEV;
    } else {
        int best = atomic_load_explicit(&g->inflight, memory_order_relaxed);
        for (int i = 1; i < be->ngpus; i++) {
            int n = atomic_load_explicit(&be->gpus[i].inflight, memory_order_relaxed);
            if (n < best) {
                best = n;
                g = &be->gpus[i];
            }
        }
    }
    pthread_mutex_lock(&g->mu);
    if (g->stopping) {
        pthread_mutex_unlock(&g->mu);
        return LNORM_EUNAVAIL;
    }
    if (g->qcount == LNORM__CUDA_QUEUE) {
        pthread_mutex_unlock(&g->mu);
        return LNORM_EQUEUEFULL;
    }
    size_t at = (g->qhead + g->qcount) % LNORM__CUDA_QUEUE;
    g->q[at] = job;
    g->qfault[at] = 0;
    if (be->fault_every) {
        uint64_t n = atomic_fetch_add_explicit(&be->fault_seq, 1, memory_order_relaxed) + 1;
        g->qfault[at] = n % be->fault_every == 0;
    }
    g->qcount++;
    atomic_fetch_add_explicit(&g->inflight, 1, memory_order_relaxed);
    pthread_cond_signal(&g->cv_q);
    pthread_mutex_unlock(&g->mu);
    return LNORM_OK;
}

/* Pinned payload buffers are recycled: cudaHostAlloc costs tens of
 * microseconds and more for large blocks, too much per request. Blocks are
 * rounded up to a power of two (4 KiB .. 1 GiB) and freed blocks kept on a
 * per-size free list, up to LNORM__POOL_CAP bytes in all. The pool is
 * process-wide so that buffers freed after the backend is destroyed (the
 * daemon's parameter registry, say) are still handled. */
#define LNORM__POOL_MIN 12
#define LNORM__POOL_MAX 30
#define LNORM__POOL_CAP ((size_t)1 << 30)

typedef struct lnorm__buf_hdr {
    uint32_t tag;  /* LNORM__BUF_PINNED or LNORM__BUF_MALLOC */
    uint32_t cls;  /* size class (block = 1 << cls bytes), 0: not pooled */
    void *next;    /* free-list link while pooled */
} lnorm__buf_hdr;

static pthread_mutex_t lnorm__pool_mu = PTHREAD_MUTEX_INITIALIZER;
static lnorm__buf_hdr *lnorm__pool[LNORM__POOL_MAX + 1];
static size_t lnorm__pool_bytes;

static void lnorm__block_free(lnorm__buf_hdr *h)
{
    if (h->tag == LNORM__BUF_PINNED)
        cudaFreeHost(h);
    else
        free(h);
}

static void *lnorm__cuda_buf_alloc(lnorm__backend *base, size_t n)
{
    (void)base;
    size_t total = n + LNORM__BUF_HDR;
    uint32_t cls = 0;
    if (total <= ((size_t)1 << LNORM__POOL_MAX)) {
        cls = LNORM__POOL_MIN;
        while (((size_t)1 << cls) < total)
            cls++;
        total = (size_t)1 << cls;
        pthread_mutex_lock(&lnorm__pool_mu);
        lnorm__buf_hdr *h = lnorm__pool[cls];
        if (h) {
            lnorm__pool[cls] = h->next;
            lnorm__pool_bytes -= total;
        }
        pthread_mutex_unlock(&lnorm__pool_mu);
        if (h)
            return (char *)h + LNORM__BUF_HDR;
    }
    void *p = NULL;
    uint32_t tag = LNORM__BUF_PINNED;
    if (cudaHostAlloc(&p, total, cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        p = NULL;
        if (posix_memalign(&p, LNORM__BUF_HDR, total))
            return NULL;
        tag = LNORM__BUF_MALLOC;
    }
    lnorm__buf_hdr *h = p;
    h->tag = tag;
    h->cls = cls;
    h->next = NULL;
    return (char *)p + LNORM__BUF_HDR;
}

static void lnorm__cuda_buf_free(lnorm__backend *base, void *q)
{
    (void)base;
    if (!q)
        return;
    lnorm__buf_hdr *h = (lnorm__buf_hdr *)((char *)q - LNORM__BUF_HDR);
    if (h->cls) {
        size_t sz = (size_t)1 << h->cls;
        pthread_mutex_lock(&lnorm__pool_mu);
        if (lnorm__pool_bytes + sz <= LNORM__POOL_CAP) {
            h->next = lnorm__pool[h->cls];
            lnorm__pool[h->cls] = h;
            lnorm__pool_bytes += sz;
            h = NULL;
        }
        pthread_mutex_unlock(&lnorm__pool_mu);
        if (!h)
            return;
    }
    lnorm__block_free(h);
}

/* A client's shared region: pinned for every GPU (portable) and mapped
 * into their address space, so that a large segment in it is copied by
 * DMA like the daemon's own pinned buffers and a small one is read and
 * written by the kernel in place (lnorm__mapped_plan). A region the driver
 * will not map is still pinned, and its segments are staged or copied. */
static int lnorm__cuda_host_register(lnorm__backend *base, void *p, size_t n)
{
    lnorm__cuda_be *be = (lnorm__cuda_be *)base;
    void *dev = NULL;
    cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e == cudaSuccess && cudaHostGetDevicePointer(&dev, p, 0) != cudaSuccess)
        dev = NULL;
    if (e != cudaSuccess) {
        cudaGetLastError();
        e = cudaHostRegister(p, n, cudaHostRegisterPortable);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return LNORM_ECUDA;
    }
    (void)cudaGetLastError();
    if (!dev)
        return LNORM_OK;
    pthread_rwlock_wrlock(&be->map_mu);
    if (be->nmaps == be->mapcap) {
        size_t cap = be->mapcap ? 2 * be->mapcap : 16;
        lnorm__mapped *m = realloc(be->maps, cap * sizeof *m);
        if (m) {
            be->maps = m;
            be->mapcap = cap;
        }
    }
    if (be->nmaps < be->mapcap) /* (else: not mapped, still pinned) */
        be->maps[be->nmaps++] = (lnorm__mapped){(uintptr_t)p, (uintptr_t)p + n, (uintptr_t)dev};
    pthread_rwlock_unlock(&be->map_mu);
    return LNORM_OK;
}

/* Called once no request uses the region any more (regions.c). */
static void lnorm__cuda_host_unregister(lnorm__backend *base, void *p)
{
    lnorm__cuda_be *be = (lnorm__cuda_be *)base;
    pthread_rwlock_wrlock(&be->map_mu);
    for (size_t i = 0; i < be->nmaps; i++)
        if (be->maps[i].lo == (uintptr_t)p) {
            be->maps[i] = be->maps[--be->nmaps];
            break;
        }
    pthread_rwlock_unlock(&be->map_mu);
    if (cudaHostUnregister(p) != cudaSuccess)
        cudaGetLastError();
}

/* cuMemGetAddressRange, from the driver through the runtime (no libcuda
 * link): the allocation an IPC handle opened, to bound a client's region. */
typedef int (*lnorm__addr_range_fn)(unsigned long long *base, size_t *size, unsigned long long dptr);

static int lnorm__cuda_ipc_open(lnorm__backend *base, const void *handle, size_t len, uint32_t device,
                                uint64_t bytes, void **out, char *why, size_t n)
{
    lnorm__cuda_be *be = (lnorm__cuda_be *)base;
    lnorm__cuda_gpu *g = lnorm__cuda_gpu_of(be, (int)device);
    if (!g) {
        snprintf(why, n, "register_region.cuda_device: GPU %u is not one of this lnormd's", device);
        return LNORM_ENODEV;
    }
    cudaIpcMemHandle_t h;
    if (len != sizeof h) {
        snprintf(why, n, "register_region.cuda_ipc_handle: %zu bytes, expected %zu", len, sizeof h);
        return LNORM_EINVAL;
    }
    memcpy(&h, handle, sizeof h);
    void *p = NULL;
    cudaError_t e = cudaSetDevice(g->dev);
    if (e == cudaSuccess)
        e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        snprintf(why, n, "register_region.cuda_ipc_handle: cudaIpcOpenMemHandle: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return LNORM_EINVAL;
    }
    /* The client names the size; the driver knows it. A region that
     * claimed more would let requests reach past the allocation. */
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    unsigned long long b0 = 0;
    size_t sz = 0;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        !fn || ((lnorm__addr_range_fn)fn)(&b0, &sz, (unsigned long long)(uintptr_t)p) != 0) {
        cudaGetLastError();
        cudaIpcCloseMemHandle(p);
        snprintf(why, n, "register_region: the allocation's size cannot be read from the driver");
        return LNORM_ECUDA;
    }
    if ((unsigned long long)(uintptr_t)p < b0 || bytes > b0 + sz - (unsigned long long)(uintptr_t)p) {
        cudaIpcCloseMemHandle(p);
        snprintf(why, n, "register_region.bytes: %llu, but the allocation has %llu bytes from the handle's address",
                 (unsigned long long)bytes, (unsigned long long)(b0 + sz - (unsigned long long)(uintptr_t)p));
        return LNORM_EINVAL;
    }
    *out = p;
    return LNORM_OK;
}

static void lnorm__cuda_ipc_close(lnorm__backend *base, void *p, uint32_t device)
{
    (void)base;
    if (cudaSetDevice((int)device) != cudaSuccess || cudaIpcCloseMemHandle(p) != cudaSuccess)
        cudaGetLastError();
}

static int lnorm__cuda_devices(lnorm__backend *base, lnorm__device_info *out, int max)
{
    lnorm__cuda_be *be = (lnorm__cuda_be *)base;
    int n = 0;
    for (int i = 0; i < be->ngpus && n < max; i++, n++) {
        memset(&out[n], 0, sizeof out[n]);
        snprintf(out[n].backend, sizeof out[n].backend, "cuda");
        snprintf(out[n].name, sizeof out[n].name, "%s", be->gpus[i].name);
        out[n].memory_bytes = be->gpus[i].mem;
        out[n].index = (uint32_t)be->gpus[i].dev;
    }
    return n;
}

static int lnorm__cuda_max_inflight(lnorm__backend *base)
{
    lnorm__cuda_be *be = (lnorm__cuda_be *)base;
    int n = 0;
    for (int i = 0; i < be->ngpus; i++)
        n += be->gpus[i].nslots;
    return n > 0 ? n : 1;
}

static void lnorm__cuda_counters(lnorm__backend *base, lnorm__backend_counters *out)
{
    lnorm__cuda_be *be = (lnorm__cuda_be *)base;
    out->errors = atomic_load_explicit(&be->n_errors, memory_order_relaxed);
    out->fallback_batches = atomic_load_explicit(&be->n_fallback, memory_order_relaxed);
    out->staged_segments = atomic_load_explicit(&be->n_staged, memory_order_relaxed);
    out->direct_segments = atomic_load_explicit(&be->n_direct, memory_order_relaxed);
    out->mapped_segments = atomic_load_explicit(&be->n_mapped, memory_order_relaxed);
    out->oversize_batches = atomic_load_explicit(&be->n_oversize, memory_order_relaxed);
    for (int i = 0; i < 3; i++) {
        out->stage_ns[i] = atomic_load_explicit(&be->stage_ns[i], memory_order_relaxed);
        out->stage_n[i] = atomic_load_explicit(&be->stage_n[i], memory_order_relaxed);
    }
}

static const char *lnorm__sched_name(unsigned sched)
{
    switch (sched) {
    case cudaDeviceScheduleSpin: return "spin";
    case cudaDeviceScheduleYield: return "yield";
    case cudaDeviceScheduleBlockingSync: return "block";
    default: return "auto";
    }
}

static void lnorm__cuda_describe(lnorm__backend *base, char *buf, size_t n)
{
    lnorm__cuda_be *be = (lnorm__cuda_be *)base;
    static const char *const sync_names[] = {"spin", "yield", "block"};
    if (!n)
        return;
    size_t stage = be->ngpus && be->gpus[0].nslots ? be->gpus[0].slots[0].stage_cap : 0;
    int len = snprintf(buf, n,
                       "cuda: %d GPU(s), %d slots each; per slot a %zu MiB device arena and two %zu KiB pinned "
                       "staging arenas (in, out); staged requests <= %zu KiB; sync %s (in effect:",
                       be->ngpus, be->ngpus ? be->gpus[0].nslots : 0, be->slot_bytes >> 20, stage >> 10,
                       be->stage_max >> 10, sync_names[be->sync]);
    for (int i = 0; i < be->ngpus && len > 0 && (size_t)len < n; i++)
        len += snprintf(buf + len, n - (size_t)len, " %d:%s", be->gpus[i].dev, lnorm__sched_name(be->gpus[i].sched));
    if (len > 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, "); fallback %s",
                        be->fallback == LNORM__CUDA_FALLBACK_CPU ? "cpu" : "none");
    if (be->fault_every && len > 0 && (size_t)len < n)
        snprintf(buf + len, n - (size_t)len, ", FAULT INJECTION ON (every %llu jobs, test only)",
                 (unsigned long long)be->fault_every);
}

static void lnorm__cuda_free_gpu(lnorm__cuda_gpu *g)
{
    if (g->slots) {
        cudaSetDevice(g->dev);
        for (int k = 0; k < g->nslots; k++) {
            lnorm__cuda_slot *sl = &g->slots[k];
            if (sl->stream)
                cudaStreamSynchronize(sl->stream);
            lnorm_cuda_ws_destroy(sl->ws);
            if (sl->done_ev)
                cudaEventDestroy(sl->done_ev);
            if (sl->stream)
                cudaStreamDestroy(sl->stream);
            if (sl->arena)
                cudaFree(sl->arena);
            if (sl->hin)
                cudaFreeHost(sl->hin);
            if (sl->hout)
                cudaFreeHost(sl->hout);
            free(sl->dsegs);
            free(sl->plan);
            free(sl->dbsegs);
            free(sl->bplan);
            free(sl->params);
            free(sl->phash);
        }
        free(g->slots);
        g->slots = NULL;
    }
    if (g->sync_ok) {
        pthread_cond_destroy(&g->cv_fifo);
        pthread_cond_destroy(&g->cv_slot);
        pthread_cond_destroy(&g->cv_q);
        pthread_mutex_destroy(&g->mu);
        g->sync_ok = 0;
    }
}

static void lnorm__cuda_destroy(lnorm__backend *base)
{
    lnorm__cuda_be *be = (lnorm__cuda_be *)base;
    if (!be)
        return;
    atomic_store_explicit(&be->stopping, 1, memory_order_release);
    for (int i = 0; i < be->ngpus; i++) {
        lnorm__cuda_gpu *g = &be->gpus[i];
        if (!g->sync_ok)
            continue;
        pthread_mutex_lock(&g->mu);
        g->stopping = 1;
        pthread_cond_signal(&g->cv_q);
        pthread_mutex_unlock(&g->mu);
    }
    for (int i = 0; i < be->ngpus; i++) {
        lnorm__cuda_gpu *g = &be->gpus[i];
        if (g->worker_started)
            pthread_join(g->worker, NULL); /* drains the queue first */
        if (g->completer_started)
            pthread_join(g->completer, NULL); /* then the slots */
        lnorm__cuda_free_gpu(g);
    }
    lnorm_cpu_destroy(be->cpu);
    pthread_rwlock_destroy(&be->map_mu);
    free(be->maps);
    free(be);
}

static const lnorm__backend_ops lnorm__cuda_ops = {
    .name = "cuda",
    .caps = LNORM__BACKEND_CAP_PINNED_BUFFERS | LNORM__BACKEND_CAP_DEVICE_SEGMENTS,
    .submit = lnorm__cuda_submit,
    .buf_alloc = lnorm__cuda_buf_alloc,
    .buf_free = lnorm__cuda_buf_free,
    .devices = lnorm__cuda_devices,
    .max_inflight = lnorm__cuda_max_inflight,
    .destroy = lnorm__cuda_destroy,
    .counters = lnorm__cuda_counters,
    .describe = lnorm__cuda_describe,
    .host_register = lnorm__cuda_host_register,
    .host_unregister = lnorm__cuda_host_unregister,
    .ipc_open = lnorm__cuda_ipc_open,
    .ipc_close = lnorm__cuda_ipc_close,
};

/* Make dev current with the completion wait policy as its scheduling flag.
 * The flag is given before the device's primary context exists where we
 * can (cudaInitDevice); a context that already exists (a second backend in
 * one process) has its flags overwritten (cudaSetDeviceFlags). */
static int lnorm__cuda_open_device(lnorm__cuda_be *be, lnorm__cuda_gpu *g, int dev)
{
    unsigned sched = be->sync == LNORM__CUDA_SYNC_SPIN    ? cudaDeviceScheduleSpin
                     : be->sync == LNORM__CUDA_SYNC_YIELD ? cudaDeviceScheduleYield
                                                          : cudaDeviceScheduleBlockingSync;
    int inited = cudaInitDevice(dev, sched | cudaDeviceMapHost, cudaInitDeviceFlagsAreValid) == cudaSuccess;
    (void)cudaGetLastError();
    if (cudaSetDevice(dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return LNORM_ENODEV;
    }
    unsigned flags = 0;
    if (cudaGetDeviceFlags(&flags) != cudaSuccess)
        flags = 0;
    if (!inited || (flags & cudaDeviceScheduleMask) != sched) {
        if (cudaSetDeviceFlags(sched | cudaDeviceMapHost) != cudaSuccess)
            (void)cudaGetLastError();
        if (cudaGetDeviceFlags(&flags) != cudaSuccess)
            flags = 0;
    }
    g->sched = flags & cudaDeviceScheduleMask;
    return LNORM_OK;
}

/* Set up one GPU: its lock, its slots. */
static int lnorm__cuda_init_gpu(lnorm__cuda_be *be, lnorm__cuda_gpu *g, int dev, int nslots, size_t staging)
{
    g->be = be;
    g->dev = dev;
    atomic_init(&g->inflight, 0);
    if (pthread_mutex_init(&g->mu, NULL) != 0)
        return LNORM_ENOMEM;
    if (pthread_cond_init(&g->cv_q, NULL) != 0) {
        pthread_mutex_destroy(&g->mu);
        return LNORM_ENOMEM;
    }
    if (pthread_cond_init(&g->cv_slot, NULL) != 0) {
        pthread_cond_destroy(&g->cv_q);
        pthread_mutex_destroy(&g->mu);
        return LNORM_ENOMEM;
    }
    if (pthread_cond_init(&g->cv_fifo, NULL) != 0) {
        pthread_cond_destroy(&g->cv_slot);
        pthread_cond_destroy(&g->cv_q);
        pthread_mutex_destroy(&g->mu);
        return LNORM_ENOMEM;
    }
    g->sync_ok = 1;
    int rc = lnorm__cuda_open_device(be, g, dev);
    if (rc)
        return rc;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
        return LNORM_ENODEV;
    snprintf(g->name, sizeof g->name, "%.100s (sm_%d%d)", prop.name, prop.major, prop.minor);
    g->mem = (uint64_t)prop.totalGlobalMem;
    g->slots = calloc((size_t)nslots, sizeof *g->slots);
    if (!g->slots)
        return LNORM_ENOMEM;
    g->nslots = nslots;
    unsigned ev_flags = cudaEventDisableTiming;
    if (be->sync == LNORM__CUDA_SYNC_BLOCK)
        ev_flags |= cudaEventBlockingSync; /* blocks whatever the context's flags */
    for (int k = 0; k < nslots; k++) {
        lnorm__cuda_slot *sl = &g->slots[k];
        if (cudaMalloc(&sl->arena, be->slot_bytes) != cudaSuccess) {
            sl->arena = NULL;
            return LNORM_ENOMEM;
        }
        if (cudaStreamCreateWithFlags(&sl->stream, cudaStreamNonBlocking) != cudaSuccess) {
            sl->stream = NULL;
            return LNORM_ECUDA;
        }
        if (cudaEventCreateWithFlags(&sl->done_ev, ev_flags) != cudaSuccess) {
            sl->done_ev = NULL;
            return LNORM_ECUDA;
        }
        rc = lnorm_cuda_ws_create(&sl->ws, LNORM__CUDA_WS_SEGS);
        if (rc)
            return rc;
        if (staging) {
            /* No pinned staging (pinned memory exhausted): this slot copies
             * every segment directly, which is slower but correct. */
            void *in = NULL, *out = NULL;
            if (cudaHostAlloc(&in, staging, cudaHostAllocPortable) == cudaSuccess &&
                cudaHostAlloc(&out, staging, cudaHostAllocPortable) == cudaSuccess) {
                sl->hin = in;
                sl->hout = out;
                sl->stage_cap = staging;
            } else {
                (void)cudaGetLastError();
                if (in)
                    cudaFreeHost(in);
            }
        }
    }
    return LNORM_OK;
}

/* Parse a comma-separated device list into devs (at most max); the count,
 * or -1 if it is malformed, names a device >= count or repeats one. */
static int lnorm__parse_devices(const char *list, int count, int *devs, int max)
{
    int n = 0;
    const char *p = list;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= count || n == max)
            return -1;
        for (int i = 0; i < n; i++)
            if (devs[i] == (int)v)
                return -1;
        devs[n++] = (int)v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return n;
}

int lnorm__backend_cuda_create_opts(lnorm__backend **out, const lnorm__cuda_opts *o)
{
    if (!out || !o || o->slot_bytes == 0 || o->slots_per_gpu < 1 || o->slots_per_gpu > LNORM__CUDA_MAX_SLOTS ||
        o->sync < LNORM__CUDA_SYNC_SPIN || o->sync > LNORM__CUDA_SYNC_BLOCK ||
        (o->fallback != LNORM__CUDA_FALLBACK_NONE && o->fallback != LNORM__CUDA_FALLBACK_CPU) ||
        o->cpu_threads < 0)
        return LNORM_EINVAL;
    *out = NULL;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
        (void)cudaGetLastError();
        return LNORM_ENODEV;
    }
    int devs[LNORM__CUDA_MAX_GPUS], ndev = 0;
    if (o->devices && *o->devices) {
        ndev = lnorm__parse_devices(o->devices, count, devs, LNORM__CUDA_MAX_GPUS);
        if (ndev < 0)
            return LNORM_EINVAL;
    } else {
        for (int i = 0; i < count && ndev < LNORM__CUDA_MAX_GPUS; i++)
            devs[ndev++] = i;
    }
    if (ndev == 0)
        return LNORM_ENODEV;
    lnorm__cuda_be *be = calloc(1, sizeof *be);
    if (!be)
        return LNORM_ENOMEM;
    be->base.ops = &lnorm__cuda_ops;
    be->slot_bytes = o->slot_bytes;
    be->stage_max = o->stage_max_bytes;
    be->sync = o->sync;
    be->fallback = o->fallback;
    atomic_init(&be->stopping, 0);
    atomic_init(&be->fault_seq, 0);
    atomic_init(&be->n_errors, 0);
    atomic_init(&be->n_fallback, 0);
    atomic_init(&be->n_staged, 0);
    atomic_init(&be->n_direct, 0);
    atomic_init(&be->n_oversize, 0);
    atomic_init(&be->n_mapped, 0);
    pthread_rwlock_init(&be->map_mu, NULL);
    be->fault_every = o->fault_every;
    /* The staging arenas: at most half the device arena each, so that a
     * batch staged in full always fits the arena. */
    size_t staging = o->staging_bytes;
    if (staging > o->slot_bytes / 2)
        staging = o->slot_bytes / 2;
    staging &= ~(size_t)(LNORM__CUDA_ALIGN - 1);
    int rc = LNORM_OK;
    if (o->fallback == LNORM__CUDA_FALLBACK_CPU)
        rc = lnorm_cpu_create(&be->cpu, o->cpu_threads);
    for (int i = 0; i < ndev && rc == LNORM_OK; i++) {
        be->ngpus = i + 1;
        rc = lnorm__cuda_init_gpu(be, &be->gpus[i], devs[i], o->slots_per_gpu, staging);
    }
    for (int i = 0; i < be->ngpus && rc == LNORM_OK; i++) {
        lnorm__cuda_gpu *g = &be->gpus[i];
        if (pthread_create(&g->worker, NULL, lnorm__cuda_worker, g) != 0) {
            rc = LNORM_ENOMEM;
            break;
        }
        g->worker_started = 1;
        pthread_setname_np(g->worker, "lnorm:cuda-run");
        /* The completer only with a worker: it exits once the worker has. */
        if (pthread_create(&g->completer, NULL, lnorm__cuda_completer, g) != 0) {
            rc = LNORM_ENOMEM;
            break;
        }
        g->completer_started = 1;
        pthread_setname_np(g->completer, "lnorm:cuda-done");
    }
    if (rc != LNORM_OK) {
        lnorm__cuda_destroy(&be->base); /* no job was submitted: the threads just exit */
        return rc;
    }
    *out = &be->base;
    return LNORM_OK;
}

int lnorm__backend_cuda_create(lnorm__backend **out, const char *devices, size_t slot_bytes, int slots_per_gpu)
{
    lnorm__cuda_opts o;
    lnorm__cuda_opts_init(&o);
    o.devices = devices;
    o.slot_bytes = slot_bytes;
    o.slots_per_gpu = slots_per_gpu;
    return lnorm__backend_cuda_create_opts(out, &o);
}
