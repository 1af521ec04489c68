/*
 * lnormd: configuration, start-up, the libuv loop (signals, housekeeping),
 * graceful drain and shut-down. The data path is transport.c -> dispatch.c
 * (codec.c) -> batcher.c -> backend_*.c -> dispatch.c -> transport.c.
 */
#include <errno.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_cpu.h"
#include "backend_cuda.h"
#include "daemon.h"
#include "log.h"
#include "workers.h"

#define LNORM__HOUSEKEEPING_MS 50

/* Tear-down watchdog: NNG's nng_close can, rarely, hang while peers keep
 * sending (seen with NNG 1.5.2 under load; nanomsg/nng#1813 is similar).
 * Everything has been answered by then, so after a bound we exit anyway. */
#define LNORM__TEARDOWN_BOUND_S 3
static int lnorm__exit_code;

/* The backend's failure counters as last logged (housekeeping, loop thread). */
static uint64_t lnorm__last_backend_check_ns, lnorm__last_backend_errors, lnorm__last_backend_fallback;

static void *lnorm__teardown_watchdog(void *arg)
{
    (void)arg;
    sleep(LNORM__TEARDOWN_BOUND_S);
    LOG_WARN("tear-down still blocked in NNG after %d s; exiting (%d)", LNORM__TEARDOWN_BOUND_S, lnorm__exit_code);
    _exit(lnorm__exit_code);
    return NULL;
}

static int lnorm__metrics_hook(void *arg, char **out, size_t *len)
{
    lnorm__daemon *d = arg;
    if (d->be->ops->counters) {
        lnorm__backend_counters c;
        memset(&c, 0, sizeof c);
        d->be->ops->counters(d->be, &c);
        lnorm__stats_set_backend(&d->stats, &c);
    }
    if (d->regions) {
        uint64_t n, bytes, rings;
        lnorm__regions_count(d->regions, &n, &bytes, &rings);
        atomic_store(&d->stats.shm_regions, (int_fast64_t)n);
        atomic_store(&d->stats.shm_bytes, (int_fast64_t)bytes);
        atomic_store(&d->stats.shm_rings, (int_fast64_t)rings);
    }
    return lnorm__stats_render(&d->stats, d->be->ops->name, out, len);
}

static int lnorm__ready_hook(void *arg)
{
    return atomic_load(&((lnorm__daemon *)arg)->serving);
}

static int lnorm__write_ready_file(lnorm__daemon *d, const char *http_bound)
{
    char tmp[LNORM__STR_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", d->cfg.ready_file, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        LOG_ERROR("ready-file %s: %s", tmp, strerror(errno));
        return -1;
    }
    for (int i = 0; i < lnorm__transport_nlisteners(d->tp); i++)
        fprintf(f, "listen %s\n", lnorm__transport_url(d->tp, i));
    if (http_bound)
        fprintf(f, "http %s\n", http_bound);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0 || rename(tmp, d->cfg.ready_file) != 0) {
        LOG_ERROR("ready-file %s: %s", d->cfg.ready_file, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

static void lnorm__batcher_opts_of(const lnorm__config *c, lnorm__batcher_opts *o)
{
    o->max_batch_rows = c->max_batch_rows;
    o->max_batch_bytes = c->max_batch_bytes;
    o->max_queue_delay_us = c->max_queue_delay_us;
    o->max_queue = c->max_queue;
    o->priority_levels = (unsigned)c->priority_levels;
    o->default_priority = (unsigned)c->default_priority;
    memcpy(o->priority_max_queue, c->priority_max_queue, sizeof o->priority_max_queue);
    o->max_queue_wait_us = c->max_queue_wait_us;
    o->reply_threads = (unsigned)c->reply_threads;
}

static void lnorm__regions_opts_of(const lnorm__config *c, lnorm__regions_opts *o)
{
    memset(o, 0, sizeof *o);
    o->allow = c->allow_shm;
    o->nuids = c->nshm_uids;
    memcpy(o->uids, c->shm_uid, sizeof o->uids);
    o->max_regions = c->shm_max_regions;
    o->max_bytes = c->shm_max_bytes;
}

/* A connection closed: the regions it registered go with it. */
static void lnorm__on_pipe_closed(void *arg, uint32_t pipe)
{
    lnorm__daemon *d = arg;
    if (d->regions)
        lnorm__regions_pipe_closed(d->regions, pipe);
}

static void lnorm__stop_loop(lnorm__daemon *d)
{
    if (d->stopping)
        return;
    d->stopping = 1;
    uv_timer_stop(&d->housekeeping);
    uv_close((uv_handle_t *)&d->housekeeping, NULL);
    uv_close((uv_handle_t *)&d->sig_int, NULL);
    uv_close((uv_handle_t *)&d->sig_term, NULL);
    uv_close((uv_handle_t *)&d->sig_hup, NULL);
    /* Closing the handles restored the default actions: a late SIGTERM
     * must not kill the process in the middle of its orderly exit. */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    lnorm__batcher_close(d->batcher);
}

static void lnorm__on_housekeeping(uv_timer_t *t)
{
    lnorm__daemon *d = t->data;
    uint64_t now = lnorm__now_ns();
    if (atomic_load(&d->draining)) {
        /* Contexts stop receiving once they have replied, so busy falls to
         * 0 once everything received is answered; the socket is closed only
         * once those replies are written out too (closing it cuts off a
         * reply still on its way). */
        int transit = 0;
        if (lnorm__transport_busy(d->tp) == 0 && lnorm__batcher_idle(d->batcher) &&
            (transit = lnorm__transport_in_transit(d->tp)) == 0) {
            LOG_INFO("drained: every request received was answered and its reply written out; exiting");
            lnorm__stop_loop(d);
            return;
        }
        if (now - d->drain_start_ns >= d->cfg.drain_timeout_ms * 1000000ull) {
            LOG_WARN("drain timeout (%llu ms): %d requests still in flight, %d connections with a reply on its "
                     "way; exiting",
                     (unsigned long long)d->cfg.drain_timeout_ms, lnorm__transport_busy(d->tp), transit);
            lnorm__stop_loop(d);
            return;
        }
    }
    if (d->be->ops->counters && now - lnorm__last_backend_check_ns >= 1000000000ull) {
        /* Device failures are answered (or computed on the CPU) batch by
         * batch; say so in the log, at most once a second. */
        lnorm__last_backend_check_ns = now;
        lnorm__backend_counters c;
        memset(&c, 0, sizeof c);
        d->be->ops->counters(d->be, &c);
        lnorm__stats_set_backend(&d->stats, &c);
        if (c.errors != lnorm__last_backend_errors) {
            LOG_WARN("%s: %llu batch(es) failed on the device in the last second, %llu of them computed on the "
                     "CPU (%llu failed, %llu on the CPU since start)",
                     d->be->ops->name, (unsigned long long)(c.errors - lnorm__last_backend_errors),
                     (unsigned long long)(c.fallback_batches - lnorm__last_backend_fallback),
                     (unsigned long long)c.errors, (unsigned long long)c.fallback_batches);
            lnorm__last_backend_errors = c.errors;
            lnorm__last_backend_fallback = c.fallback_batches;
        }
    }
    if (now - d->last_stats_log_ns >= 60ull * 1000000000ull) {
        d->last_stats_log_ns = now;
        LOG_DEBUG("stats: %llu batches, %llu rows, %lld in flight, %lld queued",
                  (unsigned long long)atomic_load(&d->stats.batches), (unsigned long long)atomic_load(&d->stats.rows),
                  (long long)atomic_load(&d->stats.inflight), (long long)atomic_load(&d->stats.queue_depth));
    }
}

static void lnorm__on_signal(uv_signal_t *h, int signum)
{
    lnorm__daemon *d = h->data;
    if (signum == SIGHUP) {
        if (!d->cfg.config_file[0]) {
            LOG_INFO("SIGHUP: no config file to reload");
            return;
        }
        lnorm__config *nc = malloc(sizeof *nc);
        char err[512];
        if (!nc)
            return;
        if (lnorm__config_reload(d->argc, d->argv, nc, err, sizeof err) != 0) {
            LOG_ERROR("SIGHUP: reload failed, keeping the running configuration: %s", err);
            free(nc);
            return;
        }
        d->cfg.log_level = nc->log_level;
        d->cfg.max_queue_delay_us = nc->max_queue_delay_us;
        d->cfg.max_batch_rows = nc->max_batch_rows;
        d->cfg.max_batch_bytes = nc->max_batch_bytes;
        d->cfg.max_queue = nc->max_queue;
        d->cfg.priority_levels = nc->priority_levels;
        d->cfg.default_priority = nc->default_priority;
        memcpy(d->cfg.priority_max_queue_list, nc->priority_max_queue_list, sizeof d->cfg.priority_max_queue_list);
        memcpy(d->cfg.priority_max_queue, nc->priority_max_queue, sizeof d->cfg.priority_max_queue);
        d->cfg.max_queue_wait_us = nc->max_queue_wait_us;
        d->cfg.allow_shm = nc->allow_shm;
        memcpy(d->cfg.shm_uids, nc->shm_uids, sizeof d->cfg.shm_uids);
        memcpy(d->cfg.shm_uid, nc->shm_uid, sizeof d->cfg.shm_uid);
        d->cfg.nshm_uids = nc->nshm_uids;
        d->cfg.shm_max_regions = nc->shm_max_regions;
        d->cfg.shm_max_bytes = nc->shm_max_bytes;
        free(nc);
        {
            /* (Regions already registered stay; the new rules apply to new ones.) */
            lnorm__regions_opts ro;
            lnorm__regions_opts_of(&d->cfg, &ro);
            lnorm__regions_set_opts(d->regions, &ro);
        }
        atomic_store(&lnorm__log_level, d->cfg.log_level);
        lnorm__batcher_opts bo;
        lnorm__batcher_opts_of(&d->cfg, &bo);
        lnorm__batcher_set_opts(d->batcher, &bo);
        LOG_INFO("SIGHUP: reloaded %s (log-level %s, max-queue-delay-us %llu, max-batch-rows %llu, "
                 "max-batch-bytes %llu, max-queue %llu, priority-levels %llu, default-priority %llu, "
                 "priority-max-queue '%s', max-queue-wait-us %llu)",
                 d->cfg.config_file, lnorm__log_level_name(d->cfg.log_level),
                 (unsigned long long)d->cfg.max_queue_delay_us, (unsigned long long)d->cfg.max_batch_rows,
                 (unsigned long long)d->cfg.max_batch_bytes, (unsigned long long)d->cfg.max_queue,
                 (unsigned long long)d->cfg.priority_levels, (unsigned long long)d->cfg.default_priority,
                 d->cfg.priority_max_queue_list, (unsigned long long)d->cfg.max_queue_wait_us);
        return;
    }
    if (atomic_load(&d->draining)) {
        LOG_WARN("second %s while draining: exiting now", signum == SIGINT ? "SIGINT" : "SIGTERM");
        lnorm__stop_loop(d);
        return;
    }
    LOG_INFO("%s: draining: no new connections; requests in hand are answered, later ones get UNAVAILABLE",
             signum == SIGINT ? "SIGINT" : "SIGTERM");
    atomic_store(&d->draining, 1);
    d->drain_start_ns = lnorm__now_ns();
    atomic_store(&d->serving, 0);
    /* No more work is coming to fill a batch: run what is queued now
     * (max-queue-delay-us may be as long as the drain timeout). */
    lnorm__batcher_opts bo;
    lnorm__batcher_get_opts(d->batcher, &bo);
    bo.max_queue_delay_us = 0;
    lnorm__batcher_set_opts(d->batcher, &bo);
    lnorm__transport_drain(d->tp);
}

static int lnorm__backend_open(lnorm__daemon *d)
{
    const char *want = d->cfg.backend;
    if (strcmp(want, "cpu") != 0) {
        lnorm__cuda_opts o;
        lnorm__cuda_opts_init(&o);
        o.devices = d->cfg.cuda_devices[0] ? d->cfg.cuda_devices : NULL;
        o.slot_bytes = (size_t)d->cfg.cuda_slot_bytes;
        o.slots_per_gpu = (int)d->cfg.cuda_slots;
        o.staging_bytes = (size_t)d->cfg.cuda_staging_bytes;
        o.stage_max_bytes = (size_t)d->cfg.cuda_stage_max_bytes;
        o.sync = !strcmp(d->cfg.cuda_sync, "spin")    ? LNORM__CUDA_SYNC_SPIN
                 : !strcmp(d->cfg.cuda_sync, "yield") ? LNORM__CUDA_SYNC_YIELD
                                                      : LNORM__CUDA_SYNC_BLOCK;
        o.fallback = !strcmp(d->cfg.cuda_fallback, "cpu") ? LNORM__CUDA_FALLBACK_CPU : LNORM__CUDA_FALLBACK_NONE;
        o.cpu_threads = (int)d->cfg.cpu_threads;
        /* Test only: LNORM_CUDA_FAULT_EVERY=N fails every Nth job (docs/gpu.md). */
        const char *fe = getenv("LNORM_CUDA_FAULT_EVERY");
        if (fe && *fe) {
            char *end;
            unsigned long long v = strtoull(fe, &end, 10);
            if (*end == 0 && v >= 1)
                o.fault_every = v;
        }
        int rc = lnorm__backend_cuda_create_opts(&d->be, &o);
        if (rc == LNORM_OK) {
            if (d->be->ops->describe) {
                char desc[512];
                d->be->ops->describe(d->be, desc, sizeof desc);
                LOG_INFO("%s", desc);
            }
            return 0;
        }
        if (!strcmp(want, "cuda")) {
            LOG_ERROR("backend cuda: %s", lnorm_strerror(rc));
            return -1;
        }
        LOG_INFO("backend auto: cuda not usable (%s); using cpu", lnorm_strerror(rc));
    }
    int rc = lnorm__backend_cpu_create(&d->be, (int)d->cfg.cpu_threads, (int)d->cfg.cpu_jobs);
    if (rc != LNORM_OK) {
        LOG_ERROR("backend cpu: %s", lnorm_strerror(rc));
        return -1;
    }
    return 0;
}

/* glibc's malloc, set for payload-sized blocks (KiB to MiB, allocated and
 * freed on whichever NNG callback thread has the request, since small
 * batches run inline):
 * - one arena per core (at least 2) instead of up to 8 per core, so that
 *   the blocks do not spread over many arenas;
 * - the mmap and trim thresholds fixed at the ceilings glibc's dynamic
 *   thresholds reach anyway after the first large request (32 MiB, 64 MiB),
 *   so that freed payload memory is reused rather than given back and
 *   faulted in again at each size change.
 * Reason: glibc's defaults let RSS under a steady load wander by 5-12%.
 * MALLOC_* or a glibc.malloc tunable in the environment wins. */
static void lnorm__malloc_setup(void)
{
#if defined(__GLIBC__) && defined(M_ARENA_MAX)
    const char *tun = getenv("GLIBC_TUNABLES");
    if (getenv("MALLOC_ARENA_MAX") || getenv("MALLOC_MMAP_THRESHOLD_") || getenv("MALLOC_TRIM_THRESHOLD_") ||
        (tun && strstr(tun, "glibc.malloc.")))
        return;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    mallopt(M_ARENA_MAX, (int)(ncpu < 2 ? 2 : ncpu > 64 ? 64 : ncpu));
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
}

int main(int argc, char **argv)
{
    static lnorm__daemon daemon_obj;
    lnorm__malloc_setup();
    lnorm__daemon *d = &daemon_obj;
    char err[1024];
    d->argc = argc;
    d->argv = argv;
    int rc = lnorm__config_from_args(&d->cfg, argc, argv, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "lnormd: %s\n", err);
        return 2;
    }
    if (rc == LNORM__CFG_HELP) {
        lnorm__config_usage(stdout, "lnormd");
        return 0;
    }
    if (rc == LNORM__CFG_VERSION) {
        printf("lnormd %s\n", LNORM_VERSION);
        return 0;
    }
    atomic_store(&lnorm__log_level, d->cfg.log_level);
    signal(SIGPIPE, SIG_IGN);
    if (d->cfg.workers > 1) {
        /* Before any thread exists: the supervisor returns only at the end. */
        int wrc = lnorm__workers_run(&d->cfg);
        if (wrc >= 0)
            return wrc;
    }
    d->lim.max_message_bytes = d->cfg.max_message_bytes;
    d->lim.max_rows = d->cfg.max_rows;
    d->lim.max_hidden = d->cfg.max_hidden < LNORM_CORE_MAX_HIDDEN ? d->cfg.max_hidden : LNORM_CORE_MAX_HIDDEN;
    lnorm__stats_init(&d->stats);
    d->last_stats_log_ns = lnorm__now_ns();

    int exit_code = 1, loop_ran = 0;
    if (uv_loop_init(&d->loop) != 0) {
        LOG_ERROR("uv_loop_init failed");
        return 1;
    }
    if (lnorm__backend_open(d) != 0)
        goto out_loop;
    if (lnorm__dispatch_init_alloc(d) != LNORM_OK) {
        LOG_ERROR("backend %s: PINNED_BUFFERS without buf_alloc / buf_free", d->be->ops->name);
        goto out_backend;
    }
    if (lnorm__params_create(&d->params, d->cfg.max_params_bytes, d->be, &d->stats) != LNORM_OK)
        goto out_backend;
    lnorm__batcher_opts bo;
    lnorm__batcher_opts_of(&d->cfg, &bo);
    if (lnorm__batcher_create(&d->batcher, &d->loop, d->be, &d->stats, &bo, lnorm__dispatch_finish, d) != LNORM_OK)
        goto out_params;
    {
        lnorm__regions_opts ro;
        lnorm__regions_opts_of(&d->cfg, &ro);
        if (lnorm__regions_create(&d->regions, d->be, &ro) != LNORM_OK ||
            lnorm__rings_create(&d->rings, lnorm__dispatch_ring, d) != LNORM_OK) {
            LOG_ERROR("out of memory starting the shared-memory rings");
            goto out_regions;
        }
        lnorm__regions_set_rings(d->regions, d->rings);
    }
    rc = lnorm__transport_create(&d->tp, &d->cfg, &d->stats, lnorm__dispatch_msg, d, err, sizeof err);
    if (rc != LNORM_OK) {
        LOG_ERROR("%s", err);
        exit_code = rc == LNORM_EINVAL ? 2 : 1;
        goto out_regions;
    }
    lnorm__transport_on_close(d->tp, lnorm__on_pipe_closed, d);
    char http_bound[128] = "";
    if (strcmp(d->cfg.http, "off") != 0) {
        lnorm__http_hooks hooks = {lnorm__metrics_hook, lnorm__ready_hook, d};
        rc = lnorm__http_start(&d->http, d->cfg.http, &hooks, http_bound, sizeof http_bound, err, sizeof err);
        if (rc != LNORM_OK) {
            LOG_ERROR("%s", err);
            exit_code = rc == LNORM_EINVAL ? 2 : 1;
            goto out_transport;
        }
    }
    uv_signal_init(&d->loop, &d->sig_int);
    uv_signal_init(&d->loop, &d->sig_term);
    uv_signal_init(&d->loop, &d->sig_hup);
    d->sig_int.data = d->sig_term.data = d->sig_hup.data = d;
    uv_signal_start(&d->sig_int, lnorm__on_signal, SIGINT);
    uv_signal_start(&d->sig_term, lnorm__on_signal, SIGTERM);
    uv_signal_start(&d->sig_hup, lnorm__on_signal, SIGHUP);
    {
        /* A worker inherits them blocked (workers.c): now they are handled. */
        sigset_t sigs;
        sigemptyset(&sigs);
        sigaddset(&sigs, SIGINT);
        sigaddset(&sigs, SIGTERM);
        sigaddset(&sigs, SIGHUP);
        pthread_sigmask(SIG_UNBLOCK, &sigs, NULL);
    }
    uv_timer_init(&d->loop, &d->housekeeping);
    d->housekeeping.data = d;
    uv_timer_start(&d->housekeeping, lnorm__on_housekeeping, LNORM__HOUSEKEEPING_MS, LNORM__HOUSEKEEPING_MS);

    lnorm__transport_start(d->tp);
    atomic_store(&d->serving, 1);
    if (d->cfg.ready_file[0] && lnorm__write_ready_file(d, http_bound[0] ? http_bound : NULL) != 0) {
        lnorm__stop_loop(d);
        uv_run(&d->loop, UV_RUN_DEFAULT);
        loop_ran = 1;
        goto out_http;
    }
    LOG_INFO("lnormd %s serving on the %s backend (%d contexts, max-batch-rows %llu, max-queue-delay-us %llu)",
             LNORM_VERSION, d->be->ops->name, (int)d->cfg.contexts, (unsigned long long)d->cfg.max_batch_rows,
             (unsigned long long)d->cfg.max_queue_delay_us);
    /* A request within max-message-bytes can need three times as much
     * (16-bit x with f32 y): below that, some such requests are always
     * refused. Allowed (a deliberate cap), but said. */
    if (d->cfg.max_inflight_bytes / 3 < d->cfg.max_message_bytes)
        LOG_WARN("max-inflight-bytes %llu is under 3 x max-message-bytes (%llu): some requests within "
                 "max-message-bytes need more and will always get RESOURCE_EXHAUSTED",
                 (unsigned long long)d->cfg.max_inflight_bytes, (unsigned long long)d->cfg.max_message_bytes);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    loop_ran = 1;
    exit_code = 0;

out_http:
    lnorm__exit_code = exit_code;
    {
        pthread_t wd;
        if (pthread_create(&wd, NULL, lnorm__teardown_watchdog, NULL) == 0)
            pthread_detach(wd);
    }
    lnorm__http_stop(d->http);
out_transport:
    /* Nothing is in flight after a clean drain. After a drain timeout the
     * socket closes first, so replies still coming from the backend are
     * dropped; the backend's destroy waits for its jobs, which finish their
     * requests (all replies fail harmlessly) before anything is freed. */
    lnorm__transport_close(d->tp);
    if (!loop_ran) {
        lnorm__batcher_close(d->batcher);
        uv_run(&d->loop, UV_RUN_DEFAULT);
    }
out_regions:
    /* No message comes any more (the socket is closed): rings leave the
     * poller with their regions, and requests still in flight keep what
     * they use until they finish (below). */
    lnorm__regions_destroy(d->regions);
    d->regions = NULL;
    lnorm__rings_destroy(d->rings);
    d->rings = NULL;
    if (!d->tp) {
        lnorm__batcher_close(d->batcher);
        uv_run(&d->loop, UV_RUN_DEFAULT);
        lnorm__batcher_destroy(d->batcher);
        goto out_params;
    }
    /* Every request still queued is failed, every running batch waited
     * for: after this no callback touches a request, a slot or params. */
    lnorm__batcher_abort(d->batcher);
    /* Requests on GPU memory skip the batcher: their kernels finish, and
     * their replies use the transport's slots. */
    while (atomic_load(&d->dev_jobs) > 0)
        usleep(1000);
    lnorm__transport_destroy(d->tp);
    lnorm__batcher_destroy(d->batcher);
out_params:
    lnorm__params_destroy(d->params);
out_backend:
    if (d->be)
        d->be->ops->destroy(d->be);
out_loop:
    uv_loop_close(&d->loop);
    if (d->cfg.ready_file[0] && exit_code == 0)
        unlink(d->cfg.ready_file);
    LOG_INFO("lnormd exiting (%d)", exit_code);
    return exit_code;
}
