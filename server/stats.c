/* Counters, histograms and their Prometheus rendering. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#include <malloc.h>
#define LNORM__HAVE_MALLINFO2 1
#endif

#include "backend.h"
#include "stats.h"

uint64_t lnorm__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void lnorm__hist_init(lnorm__hist *h, const char *name, const char *help, double first, double factor, int nb)
{
    h->name = name;
    h->help = help;
    h->nb = nb;
    double b = first;
    for (int i = 0; i < nb; i++, b *= factor)
        h->bounds[i] = b;
}

void lnorm__stats_init(lnorm__stats *s)
{
    memset(s, 0, sizeof *s);
    lnorm__hist_init(&s->batch_rows, "lnormd_batch_rows", "Rows per batch.", 1, 2, 17);
    lnorm__hist_init(&s->batch_requests, "lnormd_batch_requests", "Requests per batch.", 1, 2, 11);
    lnorm__hist_init(&s->queue_seconds, "lnormd_queue_seconds",
                     "Time from receipt to the start of the batch's compute.", 1e-6, 2, 24);
    lnorm__hist_init(&s->compute_seconds, "lnormd_compute_seconds", "Backend compute time per batch.", 1e-6, 2, 24);
    for (int i = 0; i < LNORM__MAX_PRIORITY; i++)
        lnorm__hist_init(&s->level[i].queue_seconds, "lnormd_priority_queue_seconds",
                         "Time from receipt to the start of the batch's compute, by priority level.", 1e-6, 2, 24);
    atomic_store(&s->priority_levels, 1);
    s->start_ns = lnorm__now_ns();
}

void lnorm__hist_observe(lnorm__hist *h, double v)
{
    int i = 0;
    while (i < h->nb && v > h->bounds[i])
        i++;
    atomic_fetch_add_explicit(&h->counts[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->n, 1, memory_order_relaxed);
    double old = atomic_load_explicit(&h->sum, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&h->sum, &old, old + v, memory_order_relaxed, memory_order_relaxed))
        ;
}

void lnorm__stats_reply(lnorm__stats *s, int code)
{
    if (code < 0 || code >= LNORM__NCODES)
        code = 2; /* UNKNOWN */
    atomic_fetch_add_explicit(&s->requests[code], 1, memory_order_relaxed);
}

void lnorm__stats_stage(lnorm__stats *s, int stage, uint64_t ns)
{
    atomic_fetch_add_explicit(&s->stage_ns[stage], ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->stage_n[stage], 1, memory_order_relaxed);
}

void lnorm__stats_set_backend(lnorm__stats *s, const lnorm__backend_counters *c)
{
    atomic_store_explicit(&s->cuda_errors, c->errors, memory_order_relaxed);
    atomic_store_explicit(&s->cuda_fallback_batches, c->fallback_batches, memory_order_relaxed);
    atomic_store_explicit(&s->cuda_staged_segments, c->staged_segments, memory_order_relaxed);
    atomic_store_explicit(&s->cuda_direct_segments, c->direct_segments, memory_order_relaxed);
    atomic_store_explicit(&s->cuda_mapped_segments, c->mapped_segments, memory_order_relaxed);
    atomic_store_explicit(&s->cuda_oversize_batches, c->oversize_batches, memory_order_relaxed);
    static const int st[3] = {LNORM__STAGE_CUDA_ENQUEUE, LNORM__STAGE_CUDA_WAIT, LNORM__STAGE_CUDA_SCATTER};
    for (int i = 0; i < 3; i++) {
        atomic_store_explicit(&s->stage_ns[st[i]], c->stage_ns[i], memory_order_relaxed);
        atomic_store_explicit(&s->stage_n[st[i]], c->stage_n[i], memory_order_relaxed);
    }
}

typedef struct lnorm__sbuf {
    char *p;
    size_t len, cap;
    int oom;
} lnorm__sbuf;

static void lnorm__sb_printf(lnorm__sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void lnorm__sb_printf(lnorm__sbuf *b, const char *fmt, ...)
{
    for (;;) {
        if (b->oom)
            return;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t ncap = b->cap * 2 + (size_t)n;
        char *np = realloc(b->p, ncap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
}

static const char *const lnorm__code_names[LNORM__NCODES] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED"};

#define LD(x) ((unsigned long long)atomic_load_explicit(&(x), memory_order_relaxed))
#define LDS(x) ((long long)atomic_load_explicit(&(x), memory_order_relaxed))

static void lnorm__render_counter(lnorm__sbuf *b, const char *name, const char *type, const char *help, unsigned long long v)
{
    lnorm__sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name, v);
}

/* A histogram's series; label: "" or one label pair, e.g. priority="2"
 * (then HELP and TYPE are the caller's, once for every label value). */
static void lnorm__render_hist_series(lnorm__sbuf *b, lnorm__hist *h, const char *label)
{
    const char *sep = label[0] ? "," : "";
    unsigned long long cum = 0;
    for (int i = 0; i < h->nb; i++) {
        cum += LD(h->counts[i]);
        lnorm__sb_printf(b, "%s_bucket{%s%sle=\"%.9g\"} %llu\n", h->name, label, sep, h->bounds[i], cum);
    }
    cum += LD(h->counts[h->nb]);
    const char *lo = label[0] ? "{" : "", *lc = label[0] ? "}" : "";
    lnorm__sb_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n%s_sum%s%s%s %.9g\n%s_count%s%s%s %llu\n", h->name, label,
                     sep, cum, h->name, lo, label, lc, atomic_load_explicit(&h->sum, memory_order_relaxed), h->name,
                     lo, label, lc, cum);
}

static void lnorm__render_hist(lnorm__sbuf *b, lnorm__hist *h)
{
    lnorm__sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help, h->name);
    lnorm__render_hist_series(b, h, "");
}

/* The lnormd_priority_* series of levels 1..n (label priority="N"). */
static void lnorm__render_levels(lnorm__sbuf *b, lnorm__stats *s, int n)
{
    static const struct {
        const char *name, *type, *help;
        size_t off;
        int gauge;
    } m[] = {
        {"lnormd_priority_queue_depth", "gauge", "Requests waiting for a batch, by priority level.",
         offsetof(lnorm__level_stats, queue_depth), 1},
        {"lnormd_priority_taken_total", "counter", "Requests taken into a batch, by priority level.",
         offsetof(lnorm__level_stats, taken), 0},
        {"lnormd_priority_queue_timeouts_total", "counter",
         "Requests answered DEADLINE_EXCEEDED after waiting past max_queue_us, by priority level.",
         offsetof(lnorm__level_stats, queue_timeouts), 0},
        {"lnormd_priority_rejected_total", "counter",
         "Requests refused RESOURCE_EXHAUSTED by the level's queue limit (priority-max-queue), by priority level.",
         offsetof(lnorm__level_stats, rejected), 0},
    };
    for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
        lnorm__sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", m[k].name, m[k].help, m[k].name, m[k].type);
        for (int i = 0; i < n; i++) {
            char *f = (char *)&s->level[i] + m[k].off;
            long long v = m[k].gauge ? LDS(*(atomic_int_fast64_t *)f) : (long long)LD(*(atomic_uint_fast64_t *)f);
            lnorm__sb_printf(b, "%s{priority=\"%d\"} %lld\n", m[k].name, i + 1, v);
        }
    }
    lnorm__hist *h = &s->level[0].queue_seconds;
    lnorm__sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help, h->name);
    for (int i = 0; i < n; i++) {
        char label[32];
        snprintf(label, sizeof label, "priority=\"%d\"", i + 1);
        lnorm__render_hist_series(b, &s->level[i].queue_seconds, label);
    }
}

int lnorm__stats_render(lnorm__stats *s, const char *backend, char **out, size_t *len)
{
    lnorm__sbuf b = {malloc(8192), 0, 8192, 0};
    if (!b.p)
        return -1;
    lnorm__sb_printf(&b, "# HELP lnormd_requests_total Replies sent, by status.\n# TYPE lnormd_requests_total counter\n");
    for (int i = 0; i < LNORM__NCODES; i++) {
        unsigned long long v = LD(s->requests[i]);
        if (v || i == 0 || i == 3 || i == 4 || i == 5 || i == 8)
            lnorm__sb_printf(&b, "lnormd_requests_total{status=\"%s\"} %llu\n", lnorm__code_names[i], v);
    }
    lnorm__render_counter(&b, "lnormd_normalize_ok_total", "counter", "Normalize requests answered OK.", LD(s->normalize_ok));
    lnorm__render_counter(&b, "lnormd_rows_total", "counter", "Rows normalized.", LD(s->rows));
    lnorm__render_counter(&b, "lnormd_received_bytes_total", "counter", "Request bytes received.", LD(s->bytes_in));
    lnorm__render_counter(&b, "lnormd_sent_bytes_total", "counter", "Response bytes sent.", LD(s->bytes_out));
    lnorm__render_counter(&b, "lnormd_batches_total", "counter", "Batches run by the backend.", LD(s->batches));
    lnorm__render_counter(&b, "lnormd_backend_errors_total", "counter", "Batches the backend failed.", LD(s->backend_errors));
    lnorm__render_counter(&b, "lnormd_requests_in_flight", "gauge", "Requests received and not yet answered.", (unsigned long long)LDS(s->inflight));
    lnorm__render_counter(&b, "lnormd_in_flight_bytes", "gauge", "Payload bytes (in + out) held by Normalize requests in flight.", (unsigned long long)LDS(s->inflight_bytes));
    lnorm__render_counter(&b, "lnormd_queue_depth", "gauge", "Requests waiting for a batch.", (unsigned long long)LDS(s->queue_depth));
    lnorm__render_counter(&b, "lnormd_batches_in_flight", "gauge", "Batches running on the backend.", (unsigned long long)LDS(s->batches_inflight));
    lnorm__render_counter(&b, "lnormd_params_registered", "gauge", "Registered parameter sets.", (unsigned long long)LDS(s->params_count));
    lnorm__render_counter(&b, "lnormd_params_bytes", "gauge", "Bytes of registered parameters.", (unsigned long long)LDS(s->params_bytes));
    lnorm__render_counter(&b, "lnormd_shm_regions", "gauge", "Shared-memory regions registered by clients.", (unsigned long long)LDS(s->shm_regions));
    lnorm__render_counter(&b, "lnormd_shm_bytes", "gauge", "Bytes of those regions (mapped into lnormd).", (unsigned long long)LDS(s->shm_bytes));
    lnorm__render_counter(&b, "lnormd_shm_rings", "gauge", "Submission rings attached to them.", (unsigned long long)LDS(s->shm_rings));
    lnorm__render_counter(&b, "lnormd_connections", "gauge", "Connections open (every listener).",
                          (unsigned long long)LDS(s->connections));
    lnorm__sb_printf(&b, "# HELP lnormd_connections_refused_total Connections closed on arrival, by the limit that "
                         "refused them.\n# TYPE lnormd_connections_refused_total counter\n"
                         "lnormd_connections_refused_total{limit=\"listener\"} %llu\n"
                         "lnormd_connections_refused_total{limit=\"peer\"} %llu\n",
                     LD(s->conns_refused_listener), LD(s->conns_refused_peer));
    lnorm__render_counter(&b, "lnormd_frames_timed_out_total", "counter",
                          "Connections closed with a message arriving for longer than frame-timeout-ms.",
                          LD(s->frames_timed_out));
    lnorm__render_counter(&b, "lnormd_ipc_relistens_total", "counter",
                          "ipc listeners listened on again after NNG stopped accepting on them (a peer that "
                          "closed during the handshake).",
                          LD(s->ipc_relistens));
    lnorm__render_counter(&b, "lnormd_frames_over_budget_total", "counter",
                          "Connections closed because the messages still arriving held more than max-receive-bytes.",
                          LD(s->frames_over_budget));
    lnorm__render_counter(&b, "lnormd_receiving_bytes", "gauge",
                          "Bytes of messages still arriving over tcp:// and tls+tcp://, as the frame watchdog last saw.",
                          (unsigned long long)LDS(s->receiving_bytes));
    lnorm__render_counter(&b, "lnormd_cuda_errors_total", "counter",
                          "Batches whose CUDA work failed (then answered with errors, or computed on the CPU).",
                          LD(s->cuda_errors));
    lnorm__render_counter(&b, "lnormd_cuda_fallback_batches_total", "counter",
                          "Batches computed on the CPU after a CUDA failure (cuda-fallback = cpu).",
                          LD(s->cuda_fallback_batches));
    lnorm__render_counter(&b, "lnormd_cuda_staged_segments_total", "counter",
                          "Requests moved through a slot's pinned staging arenas.", LD(s->cuda_staged_segments));
    lnorm__render_counter(&b, "lnormd_cuda_direct_segments_total", "counter",
                          "Requests copied straight from / to their own buffers.", LD(s->cuda_direct_segments));
    lnorm__render_counter(&b, "lnormd_cuda_mapped_segments_total", "counter",
                          "Requests the kernels read and wrote in place in a client's shared-memory region.",
                          LD(s->cuda_mapped_segments));
    lnorm__render_counter(&b, "lnormd_cuda_oversize_batches_total", "counter",
                          "Batches larger than a slot's device arena (temporary device buffer).",
                          LD(s->cuda_oversize_batches));
    static const char *stage_names[LNORM__NSTAGES] = {"decode",       "reply_wait",   "encode",      "send",
                                                      "cuda_enqueue", "cuda_wait", "cuda_scatter"};
    lnorm__sb_printf(&b, "# HELP lnormd_stage_seconds_total Host time spent in each stage (requests; cuda_*: batches).\n"
                         "# TYPE lnormd_stage_seconds_total counter\n");
    for (int i = 0; i < LNORM__NSTAGES; i++)
        lnorm__sb_printf(&b, "lnormd_stage_seconds_total{stage=\"%s\"} %.6f\n", stage_names[i],
                         (double)LD(s->stage_ns[i]) / 1e9);
    lnorm__sb_printf(&b, "# HELP lnormd_stage_events_total Events counted in lnormd_stage_seconds_total.\n"
                         "# TYPE lnormd_stage_events_total counter\n");
    for (int i = 0; i < LNORM__NSTAGES; i++)
        lnorm__sb_printf(&b, "lnormd_stage_events_total{stage=\"%s\"} %llu\n", stage_names[i], LD(s->stage_n[i]));
    lnorm__render_hist(&b, &s->batch_rows);
    lnorm__render_hist(&b, &s->batch_requests);
    lnorm__render_hist(&b, &s->queue_seconds);
    lnorm__render_hist(&b, &s->compute_seconds);
    int nlev = atomic_load(&s->priority_levels);
    lnorm__render_levels(&b, s, nlev < 1 ? 1 : nlev > LNORM__MAX_PRIORITY ? LNORM__MAX_PRIORITY : nlev);
#ifdef LNORM__HAVE_MALLINFO2
    /* In use = arena bytes handed out + mmapped blocks: what a leak raises,
     * unlike RSS, which also holds the allocator's free and fragmented pages. */
    struct mallinfo2 mi = mallinfo2();
    lnorm__render_counter(&b, "lnormd_heap_bytes", "gauge",
                          "Bytes malloc has handed out and not had back (glibc mallinfo2: uordblks + hblkhd).",
                          (unsigned long long)(mi.uordblks + mi.hblkhd));
#endif
    lnorm__sb_printf(&b, "# HELP lnormd_uptime_seconds Seconds since start.\n# TYPE lnormd_uptime_seconds gauge\nlnormd_uptime_seconds %.3f\n",
                     (double)(lnorm__now_ns() - s->start_ns) / 1e9);
    lnorm__sb_printf(&b, "# HELP lnormd_info Build and backend.\n# TYPE lnormd_info gauge\nlnormd_info{version=\"%s\",backend=\"%s\"} 1\n",
                     LNORM_VERSION, backend);
    if (b.oom) {
        free(b.p);
        return -1;
    }
    *out = b.p;
    *len = b.len;
    return 0;
}
