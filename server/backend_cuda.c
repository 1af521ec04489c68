/*
 * The CUDA backend of lnormd (server/backend.h). Per GPU: a submission
 * queue, a worker thread and a ring of batch slots; each slot owns a device
 * arena, a stream, a segment-table workspace and an event. The worker
 * copies a job's inputs host-to-device, runs the whole batch
 * (lnorm_cuda_run: one launch per (dtype, tier) group) and copies the
 * outputs back, all on the slot's stream, then hands the slot to the GPU's
 * completion thread, which waits for the slot's event, calls job->done and
 * frees the slot. Slots overlap (copies of one with the kernel of another).
 * Payload buffers come from buf_alloc as pinned host memory, so the copies
 * are DMA straight from/to the daemon's decoded requests and replies.
 * A batch larger than the slot's arena gets a stream-ordered temporary
 * device buffer. Every CUDA failure becomes LNORM_ECUDA for the job it hit.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "backend.h"
#include "lnorm_cuda.h"

#define LNORM__CUDA_MAX_GPUS 16
#define LNORM__CUDA_QUEUE 1024
#define LNORM__CUDA_WS_SEGS 1024
#define LNORM__CUDA_ALIGN 256

/* Header in front of every buf_alloc block (lnorm__buf_hdr, padded). */
#define LNORM__BUF_HDR 64
#define LNORM__BUF_PINNED 0x50494e4eu
#define LNORM__BUF_MALLOC 0x4d414c4cu

typedef struct lnorm__cuda_slot {
    void *arena;           /* device memory, slot_bytes */
    void *tmp;             /* temporary device buffer for an oversize batch */
    cudaStream_t stream;
    cudaEvent_t done_ev;
    lnorm_cuda_ws *ws;
    lnorm_segment *dsegs;  /* device-pointer copy of the job's segments */
    size_t dsegs_cap;
    lnorm__job *job;
    int err;               /* enqueue error (then done_ev is not waited for) */
    const char *why;
    uint64_t t0;
    int busy;
} lnorm__cuda_slot;

typedef struct lnorm__cuda_gpu {
    struct lnorm__cuda_be *be;
    int dev;
    char name[128];
    uint64_t mem;
    lnorm__cuda_slot *slots;
    int nslots;
    int next_slot;
    /* submission queue */
    lnorm__job *q[LNORM__CUDA_QUEUE];
    size_t qhead, qcount;
    /* slots in flight, in submission order */
    int fifo[64];
    int fhead, fcount;
    int inflight;          /* queued + in slots */
    int worker_done;
    pthread_t worker, completer;
    int threads_started;
} lnorm__cuda_gpu;

typedef struct lnorm__cuda_be {
    lnorm__backend base;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* any change of queues, slots or fifos */
    lnorm__cuda_gpu gpus[LNORM__CUDA_MAX_GPUS];
    int ngpus;
    size_t slot_bytes;
    int stopping;
} lnorm__cuda_be;

static uint64_t lnorm__cuda_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
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

/* Device bytes one segment needs (every buffer 256-byte aligned). */
static size_t lnorm__seg_bytes(const lnorm_segment *s)
{
    size_t n = lnorm__up(lnorm__span(s->rows, s->x_stride, s->hidden, s->x_dtype));
    n += lnorm__up(lnorm__span(s->rows, s->y_stride, s->hidden, s->y_dtype));
    if (s->residual) {
        n += lnorm__up(lnorm__span(s->rows, s->res_stride, s->hidden, s->x_dtype));
        n += lnorm__up(lnorm__span(s->rows, s->res_out_stride, s->hidden, s->x_dtype));
    }
    size_t p = (size_t)s->hidden * lnorm_dtype_size(s->param_dtype);
    if (s->gamma)
        n += lnorm__up(p);
    if (s->beta)
        n += lnorm__up(p);
    if (s->mean)
        n += lnorm__up((size_t)s->rows * 4);
    if (s->rstd)
        n += lnorm__up((size_t)s->rows * 4);
    return n;
}

#define LNORM__CK(call, what)           \
    do {                                \
        if ((call) != cudaSuccess) {    \
            sl->why = what;             \
            return LNORM_ECUDA;         \
        }                               \
    } while (0)

/* Enqueue one job on a slot's stream: uploads, the batch, downloads, event. */
static int lnorm__cuda_enqueue(lnorm__cuda_be *be, lnorm__cuda_slot *sl, lnorm__job *job)
{
    const lnorm_batch *b = &job->batch;
    for (size_t i = 0; i < b->nsegs; i++) {
        int rc = lnorm_segment_validate(&b->segs[i], &sl->why);
        if (rc)
            return rc;
    }
    if (b->nsegs == 0)
        return LNORM_OK;
    if (b->nsegs > sl->dsegs_cap) {
        lnorm_segment *n = realloc(sl->dsegs, b->nsegs * sizeof *n);
        if (!n) {
            sl->why = "out of memory (segment table)";
            return LNORM_ENOMEM;
        }
        sl->dsegs = n;
        sl->dsegs_cap = b->nsegs;
    }
    size_t need = 0;
    for (size_t i = 0; i < b->nsegs; i++)
        need += lnorm__seg_bytes(&b->segs[i]);
    char *dev = sl->arena;
    if (need > be->slot_bytes) {
        LNORM__CK(cudaMallocAsync(&sl->tmp, need, sl->stream), "cudaMallocAsync (batch larger than a slot)");
        dev = sl->tmp;
    }
    cudaStream_t st = sl->stream;
    size_t off = 0;
#define LNORM__PLACE(dst, bytes) \
    do {                         \
        (dst) = dev + off;       \
        off += lnorm__up(bytes); \
    } while (0)
    for (size_t i = 0; i < b->nsegs; i++) {
        const lnorm_segment *s = &b->segs[i];
        lnorm_segment *d = &sl->dsegs[i];
        *d = *s;
        size_t xb = lnorm__span(s->rows, s->x_stride, s->hidden, s->x_dtype);
        size_t yb = lnorm__span(s->rows, s->y_stride, s->hidden, s->y_dtype);
        size_t pb = (size_t)s->hidden * lnorm_dtype_size(s->param_dtype);
        char *p;
        LNORM__PLACE(p, xb);
        d->x = p;
        LNORM__CK(cudaMemcpyAsync(p, s->x, xb, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync (x)");
        LNORM__PLACE(p, yb);
        d->y = p;
        if (s->residual) {
            size_t rb = lnorm__span(s->rows, s->res_stride, s->hidden, s->x_dtype);
            size_t ob = lnorm__span(s->rows, s->res_out_stride, s->hidden, s->x_dtype);
            LNORM__PLACE(p, rb);
            d->residual = p;
            LNORM__CK(cudaMemcpyAsync(p, s->residual, rb, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync (residual)");
            LNORM__PLACE(p, ob);
            d->residual_out = p;
        }
        if (s->gamma) {
            LNORM__PLACE(p, pb);
            d->gamma = p;
            LNORM__CK(cudaMemcpyAsync(p, s->gamma, pb, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync (gamma)");
        }
        if (s->beta) {
            LNORM__PLACE(p, pb);
            d->beta = p;
            LNORM__CK(cudaMemcpyAsync(p, s->beta, pb, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync (beta)");
        }
        if (s->mean) {
            LNORM__PLACE(p, (size_t)s->rows * 4);
            d->mean = (float *)p;
        }
        if (s->rstd) {
            LNORM__PLACE(p, (size_t)s->rows * 4);
            d->rstd = (float *)p;
        }
    }
#undef LNORM__PLACE
    lnorm_batch db = {sl->dsegs, b->nsegs};
    int rc = lnorm_cuda_run(&db, st, sl->ws, &sl->why);
    if (rc)
        return rc;
    for (size_t i = 0; i < b->nsegs; i++) {
        const lnorm_segment *s = &b->segs[i];
        const lnorm_segment *d = &sl->dsegs[i];
        /* y (and residual_out) come back over their whole strided span:
         * the padding between rows is overwritten with what the device
         * buffer holds there, so copy row by row when rows are padded. */
        size_t ysz = lnorm_dtype_size(s->y_dtype), xsz = lnorm_dtype_size(s->x_dtype);
        if (s->y_stride == s->hidden) {
            LNORM__CK(cudaMemcpyAsync(s->y, d->y, lnorm__span(s->rows, s->y_stride, s->hidden, s->y_dtype),
                                      cudaMemcpyDeviceToHost, st), "cudaMemcpyAsync (y)");
        } else {
            LNORM__CK(cudaMemcpy2DAsync(s->y, (size_t)s->y_stride * ysz, d->y, (size_t)s->y_stride * ysz,
                                        (size_t)s->hidden * ysz, (size_t)s->rows, cudaMemcpyDeviceToHost, st),
                      "cudaMemcpy2DAsync (y)");
        }
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
    if (sl->tmp) {
        LNORM__CK(cudaFreeAsync(sl->tmp, st), "cudaFreeAsync");
        sl->tmp = NULL;
    }
    LNORM__CK(cudaEventRecord(sl->done_ev, st), "cudaEventRecord");
    return LNORM_OK;
}

/* Worker: takes jobs from the GPU's queue, puts each on a free slot. */
static void *lnorm__cuda_worker(void *arg)
{
    lnorm__cuda_gpu *g = arg;
    lnorm__cuda_be *be = g->be;
    int dev_ok = cudaSetDevice(g->dev) == cudaSuccess;
    pthread_mutex_lock(&be->mu);
    for (;;) {
        while (!g->qcount && !be->stopping)
            pthread_cond_wait(&be->cv, &be->mu);
        if (!g->qcount)
            break; /* stopping and drained */
        int k = g->next_slot;
        while (g->slots[k].busy)
            pthread_cond_wait(&be->cv, &be->mu);
        lnorm__job *job = g->q[g->qhead];
        g->qhead = (g->qhead + 1) % LNORM__CUDA_QUEUE;
        g->qcount--;
        lnorm__cuda_slot *sl = &g->slots[k];
        sl->busy = 1;
        g->next_slot = (k + 1) % g->nslots;
        pthread_mutex_unlock(&be->mu);

        sl->job = job;
        sl->why = NULL;
        sl->t0 = lnorm__cuda_now();
        if (!dev_ok) {
            sl->err = LNORM_ECUDA;
            sl->why = "cudaSetDevice";
        } else {
            sl->err = lnorm__cuda_enqueue(be, sl, job);
            if (sl->err) {
                /* Copies already queued may still read or write the job's
                 * buffers: let them finish before done is called. */
                cudaStreamSynchronize(sl->stream);
                if (sl->tmp) {
                    cudaFree(sl->tmp);
                    sl->tmp = NULL;
                }
                (void)cudaGetLastError();
            }
        }

        pthread_mutex_lock(&be->mu);
        g->fifo[(g->fhead + g->fcount) % 64] = k;
        g->fcount++;
        pthread_cond_broadcast(&be->cv);
    }
    g->worker_done = 1;
    pthread_cond_broadcast(&be->cv);
    pthread_mutex_unlock(&be->mu);
    return NULL;
}

/* Completion: waits for slots in submission order, calls done, frees them. */
static void *lnorm__cuda_completer(void *arg)
{
    lnorm__cuda_gpu *g = arg;
    lnorm__cuda_be *be = g->be;
    cudaSetDevice(g->dev);
    pthread_mutex_lock(&be->mu);
    for (;;) {
        while (!g->fcount && !g->worker_done)
            pthread_cond_wait(&be->cv, &be->mu);
        if (!g->fcount)
            break;
        int k = g->fifo[g->fhead];
        g->fhead = (g->fhead + 1) % 64;
        g->fcount--;
        pthread_mutex_unlock(&be->mu);

        lnorm__cuda_slot *sl = &g->slots[k];
        int err = sl->err;
        const char *why = sl->why;
        if (!err && sl->job->batch.nsegs) {
            cudaError_t ce = cudaEventSynchronize(sl->done_ev);
            if (ce != cudaSuccess) {
                err = LNORM_ECUDA;
                why = cudaGetErrorString(ce);
            }
        }
        lnorm__job *job = sl->job;
        uint64_t ns = lnorm__cuda_now() - sl->t0;
        sl->job = NULL;

        pthread_mutex_lock(&be->mu);
        sl->busy = 0;
        g->inflight--;
        pthread_cond_broadcast(&be->cv);
        pthread_mutex_unlock(&be->mu);
        job->done(job, err, err ? why : NULL, ns);
        pthread_mutex_lock(&be->mu);
    }
    pthread_mutex_unlock(&be->mu);
    return NULL;
}

static int lnorm__cuda_submit(lnorm__backend *base, lnorm__job *job)
{
    lnorm__cuda_be *be = (lnorm__cuda_be *)base;
    pthread_mutex_lock(&be->mu);
    if (be->stopping) {
        pthread_mutex_unlock(&be->mu);
        return LNORM_EUNAVAIL;
    }
    /* The GPU with the fewest jobs in hand. */
    lnorm__cuda_gpu *g = &be->gpus[0];
    for (int i = 1; i < be->ngpus; i++)
        if (be->gpus[i].inflight < g->inflight)
            g = &be->gpus[i];
    if (g->qcount == LNORM__CUDA_QUEUE) {
        pthread_mutex_unlock(&be->mu);
        return LNORM_EQUEUEFULL;
    }
    g->q[(g->qhead + g->qcount) % LNORM__CUDA_QUEUE] = job;
    g->qcount++;
    g->inflight++;
    pthread_cond_broadcast(&be->cv);
    pthread_mutex_unlock(&be->mu);
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

static void lnorm__cuda_free_gpu(lnorm__cuda_gpu *g)
{
    if (!g->slots)
        return;
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
        free(sl->dsegs);
    }
    free(g->slots);
    g->slots = NULL;
}

static void lnorm__cuda_destroy(lnorm__backend *base)
{
    lnorm__cuda_be *be = (lnorm__cuda_be *)base;
    if (!be)
        return;
    pthread_mutex_lock(&be->mu);
    be->stopping = 1;
    pthread_cond_broadcast(&be->cv);
    pthread_mutex_unlock(&be->mu);
    for (int i = 0; i < be->ngpus; i++) {
        lnorm__cuda_gpu *g = &be->gpus[i];
        if (g->threads_started) {
            pthread_join(g->worker, NULL); /* drains the queue first */
            pthread_join(g->completer, NULL);
        }
        lnorm__cuda_free_gpu(g);
    }
    pthread_cond_destroy(&be->cv);
    pthread_mutex_destroy(&be->mu);
    free(be);
}

static const lnorm__backend_ops lnorm__cuda_ops = {
    .name = "cuda",
    .submit = lnorm__cuda_submit,
    .buf_alloc = lnorm__cuda_buf_alloc,
    .buf_free = lnorm__cuda_buf_free,
    .devices = lnorm__cuda_devices,
    .max_inflight = lnorm__cuda_max_inflight,
    .destroy = lnorm__cuda_destroy,
};

/* Set up one GPU's slots. */
static int lnorm__cuda_init_gpu(lnorm__cuda_be *be, lnorm__cuda_gpu *g, int dev, int nslots)
{
    g->be = be;
    g->dev = dev;
    if (cudaSetDevice(dev) != cudaSuccess)
        return LNORM_ENODEV;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
        return LNORM_ENODEV;
    snprintf(g->name, sizeof g->name, "%.100s (sm_%d%d)", prop.name, prop.major, prop.minor);
    g->mem = (uint64_t)prop.totalGlobalMem;
    g->slots = calloc((size_t)nslots, sizeof *g->slots);
    if (!g->slots)
        return LNORM_ENOMEM;
    g->nslots = nslots;
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
        if (cudaEventCreateWithFlags(&sl->done_ev, cudaEventDisableTiming) != cudaSuccess) {
            sl->done_ev = NULL;
            return LNORM_ECUDA;
        }
        int rc = lnorm_cuda_ws_create(&sl->ws, LNORM__CUDA_WS_SEGS);
        if (rc)
            return rc;
    }
    return LNORM_OK;
}

int lnorm__backend_cuda_create(lnorm__backend **out, const char *devices, size_t slot_bytes, int slots_per_gpu)
{
    if (!out || slot_bytes == 0 || slots_per_gpu < 1 || slots_per_gpu > 64)
        return LNORM_EINVAL;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
        (void)cudaGetLastError();
        return LNORM_ENODEV;
    }
    int devs[LNORM__CUDA_MAX_GPUS], ndev = 0;
    if (devices && *devices) {
        const char *p = devices;
        while (*p) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= count || ndev == LNORM__CUDA_MAX_GPUS)
                return LNORM_EINVAL;
            for (int i = 0; i < ndev; i++)
                if (devs[i] == (int)v)
                    return LNORM_EINVAL;
            devs[ndev++] = (int)v;
            p = end;
            if (*p == ',')
                p++;
            else if (*p)
                return LNORM_EINVAL;
        }
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
    be->slot_bytes = slot_bytes;
    pthread_mutex_init(&be->mu, NULL);
    pthread_cond_init(&be->cv, NULL);
    int rc = LNORM_OK;
    for (int i = 0; i < ndev && rc == LNORM_OK; i++) {
        rc = lnorm__cuda_init_gpu(be, &be->gpus[i], devs[i], slots_per_gpu);
        be->ngpus = i + 1;
    }
    for (int i = 0; i < be->ngpus && rc == LNORM_OK; i++) {
        lnorm__cuda_gpu *g = &be->gpus[i];
        if (pthread_create(&g->worker, NULL, lnorm__cuda_worker, g) != 0) {
            rc = LNORM_ENOMEM;
            break;
        }
        if (pthread_create(&g->completer, NULL, lnorm__cuda_completer, g) != 0) {
            /* the worker exits once stopping is set; join it in destroy */
            pthread_mutex_lock(&be->mu);
            be->stopping = 1;
            pthread_cond_broadcast(&be->cv);
            pthread_mutex_unlock(&be->mu);
            pthread_join(g->worker, NULL);
            rc = LNORM_ENOMEM;
            break;
        }
        g->threads_started = 1;
    }
    if (rc != LNORM_OK) {
        lnorm__cuda_destroy(&be->base);
        return rc;
    }
    *out = &be->base;
    return LNORM_OK;
}
