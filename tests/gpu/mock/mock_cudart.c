/* The CUDA runtime stand-in of gpu.backend_mock (see cuda_runtime_api.h in
 * this folder) and a lnorm_cuda_run that runs the batch with the CPU core on
 * the stream's thread. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cuda_runtime_api.h"
#include "lnorm_core.h"
#include "lnorm_cuda.h"

typedef struct op {
    struct op *next;
    int kind; /* 0 memcpy, 1 2d, 2 run, 3 event, 4 free */
    void *d; const void *s; size_t n, dp, sp, w, h;
    lnorm_segment *segs; size_t nsegs;
    lnorm_bwd_segment *bsegs; /* kind 5: a backward batch */
    struct mock_event *ev; unsigned long gen;
} op;
struct mock_stream { pthread_t th; pthread_mutex_t mu; pthread_cond_t cv, idle; op *head, *tail; int stop, busy; };
struct mock_event { pthread_mutex_t mu; pthread_cond_t cv; unsigned long rec, done; };
static lnorm_cpu *g_cpu;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_long g_ops;
static unsigned g_flags = 0;
static void rnd_delay(void) { unsigned r = (unsigned)rand(); if (r % 4 == 0) usleep(r % 200); }
static void *sthread(void *a)
{
    struct mock_stream *s = a;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) { s->busy = 0; pthread_cond_broadcast(&s->idle); pthread_cond_wait(&s->cv, &s->mu); }
        if (!s->head) break;
        op *o = s->head; s->head = o->next; if (!s->head) s->tail = NULL;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        rnd_delay();
        if (o->kind == 0) memcpy(o->d, o->s, o->n);
        else if (o->kind == 1) { for (size_t r = 0; r < o->h; r++) memcpy((char *)o->d + r * o->dp, (const char *)o->s + r * o->sp, o->w); }
        else if (o->kind == 2) { const char *why; lnorm_batch b = {o->segs, o->nsegs}; int rc = lnorm_cpu_run(g_cpu, &b, &why); if (rc) { fprintf(stderr, "mock run failed %d %s\n", rc, why); abort(); } free(o->segs); }
        else if (o->kind == 3) { pthread_mutex_lock(&o->ev->mu); if (o->gen > o->ev->done) o->ev->done = o->gen; pthread_cond_broadcast(&o->ev->cv); pthread_mutex_unlock(&o->ev->mu); }
        else if (o->kind == 4) free(o->d);
        else if (o->kind == 5) { const char *why; lnorm_bwd_batch b = {o->bsegs, o->nsegs}; int rc = lnorm_cpu_run_bwd(g_cpu, &b, &why); if (rc) { fprintf(stderr, "mock bwd run failed %d %s\n", rc, why); abort(); } free(o->bsegs); }
        free(o);
        atomic_fetch_add(&g_ops, 1);
        pthread_mutex_lock(&s->mu);
    }
    s->busy = 0; pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}
static void push(struct mock_stream *s, op *o)
{
    o->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = o; else s->head = o;
    s->tail = o; s->busy = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}
cudaError_t cudaGetDeviceCount(int *n) { const char *e = getenv("MOCK_GPUS"); *n = e ? atoi(e) : 2; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { (void)d; return cudaSuccess; }
cudaError_t cudaInitDevice(int d, unsigned df, unsigned f) { (void)d; (void)f; g_flags = df; return cudaSuccess; }
cudaError_t cudaGetDeviceFlags(unsigned *f) { *f = g_flags; return cudaSuccess; }
cudaError_t cudaSetDeviceFlags(unsigned f) { g_flags = f; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) { (void)d; memset(p, 0, sizeof *p); strcpy(p->name, "MockGPU"); p->major = 9; p->totalGlobalMem = 1ull << 30; return cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t n) { *p = malloc(n); memset(*p, 0xA5, n); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) { (void)s; return cudaMalloc(p, n); }
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { op *o = calloc(1, sizeof *o); o->kind = 4; o->d = p; push(s, o); return cudaSuccess; }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned f) { (void)f; *p = malloc(n); if (*p) memset(*p, 0x5A, n); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }
/* Host memory is what the mock's "device" reads anyway: registering is a no-op. */
cudaError_t cudaHostRegister(void *p, size_t n, unsigned f) { (void)p; (void)n; (void)f; return cudaSuccess; }
cudaError_t cudaHostUnregister(void *p) { (void)p; return cudaSuccess; }
/* Unified addressing, as on a real 64-bit host: the device address of mapped memory is its host address. */
cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned f) { (void)f; *d = h; return cudaSuccess; }
/* No other process's GPU memory in a mock. */
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned f) { (void)h; (void)f; *p = NULL; return cudaErrorLaunchFailure; }
cudaError_t cudaIpcCloseMemHandle(void *p) { (void)p; return cudaSuccess; }
cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned v, unsigned long long f,
                                             enum cudaDriverEntryPointQueryResult *q)
{
    (void)sym; (void)v; (void)f;
    *fn = NULL;
    if (q)
        *q = cudaDriverEntryPointSymbolNotFound;
    return cudaErrorLaunchFailure;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned f)
{
    (void)f;
    struct mock_stream *s = calloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL); pthread_cond_init(&s->cv, NULL); pthread_cond_init(&s->idle, NULL);
    pthread_create(&s->th, NULL, sthread, s);
    *ps = s;
    pthread_mutex_lock(&g_mu);
    if (!g_cpu) lnorm_cpu_create(&g_cpu, 2);
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy) pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    cudaStreamSynchronize(s);
    pthread_mutex_lock(&s->mu); s->stop = 1; pthread_cond_signal(&s->cv); pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    free(s);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pe, unsigned f) { (void)f; struct mock_event *e = calloc(1, sizeof *e); pthread_mutex_init(&e->mu, NULL); pthread_cond_init(&e->cv, NULL); *pe = e; return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    op *o = calloc(1, sizeof *o); o->kind = 3; o->ev = e;
    pthread_mutex_lock(&e->mu); o->gen = ++e->rec; pthread_mutex_unlock(&e->mu);
    push(s, o);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    pthread_mutex_lock(&e->mu);
    unsigned long want = e->rec;
    while (e->done < want) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) { (void)k; memcpy(d, s, n); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st)
{ (void)k; op *o = calloc(1, sizeof *o); o->kind = 0; o->d = d; o->s = s; o->n = n; push(st, o); return cudaSuccess; }
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h, enum cudaMemcpyKind k, cudaStream_t st)
{ (void)k; op *o = calloc(1, sizeof *o); o->kind = 1; o->d = d; o->dp = dp; o->s = s; o->sp = sp; o->w = w; o->h = h; push(st, o); return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { (void)e; return "mock error"; }

struct lnorm_cuda_ws { int x; };
int lnorm_cuda_ws_create(lnorm_cuda_ws **out, size_t max_segs) { (void)max_segs; *out = calloc(1, sizeof **out); return LNORM_OK; }
void lnorm_cuda_ws_destroy(lnorm_cuda_ws *ws) { free(ws); }
int lnorm_cuda_run(const lnorm_batch *b, void *stream, lnorm_cuda_ws *ws, const char **why)
{
    (void)ws;
    for (size_t i = 0; i < b->nsegs; i++) { int rc = lnorm_segment_validate(&b->segs[i], why); if (rc) return rc; }
    if (!b->nsegs) return LNORM_OK;
    op *o = calloc(1, sizeof *o); o->kind = 2; o->nsegs = b->nsegs;
    o->segs = malloc(b->nsegs * sizeof *o->segs); memcpy(o->segs, b->segs, b->nsegs * sizeof *o->segs);
    push((struct mock_stream *)stream, o);
    return LNORM_OK;
}
/* The mock's kernels are the CPU core: they read any host memory. */
int lnorm_cuda_plain_io(const lnorm_segment *s) { return s && lnorm_segment_validate(s, NULL) == LNORM_OK; }
/* The backward: scratch as a real backend might ask (2 x hidden floats a
 * segment), checked to be given, then the CPU core on the stream. */
size_t lnorm_cuda_bwd_scratch_bytes(const lnorm_bwd_batch *b)
{
    size_t n = 0;
    for (size_t i = 0; i < b->nsegs; i++) { if (lnorm_bwd_segment_validate(&b->segs[i], NULL)) return SIZE_MAX; n += 2 * (size_t)b->segs[i].hidden * 4; }
    return n;
}
int lnorm_cuda_run_bwd(const lnorm_bwd_batch *b, void *stream, void *scratch, size_t scratch_bytes, const char **why)
{
    for (size_t i = 0; i < b->nsegs; i++) { int rc = lnorm_bwd_segment_validate(&b->segs[i], why); if (rc) return rc; }
    size_t need = lnorm_cuda_bwd_scratch_bytes(b);
    if (scratch_bytes < need || (need && !scratch)) { if (why) *why = "scratch: smaller than lnorm_cuda_bwd_scratch_bytes"; return LNORM_EINVAL; }
    if (need) memset(scratch, 0xA5, need); /* the scratch is written, as a device's would be */
    if (!b->nsegs) return LNORM_OK;
    op *o = calloc(1, sizeof *o); o->kind = 5; o->nsegs = b->nsegs;
    o->bsegs = malloc(b->nsegs * sizeof *o->bsegs); memcpy(o->bsegs, b->segs, b->nsegs * sizeof *o->bsegs);
    push((struct mock_stream *)stream, o);
    return LNORM_OK;
}
int lnorm_cuda_run_segment(const lnorm_segment *s, void *stream, const char **why)
{
    lnorm_batch b = {s, 1};
    return lnorm_cuda_run(&b, stream, NULL, why);
}
