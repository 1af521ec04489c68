/*
 * lnorm-bench: the bundled load tester of lnormd. See `lnorm-bench --help`
 * and docs/bench.md.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "echo.h"
#include "load.h"
#include "lnorm/types.h"
#include "multi.h"
#include "proc.h"
#include "report.h"
#include "spec.h"
#include "work.h"

#define MAX_TAGS 16
#define MAX_EXTRA 32

static const char usage[] =
    "usage: lnorm-bench [options] [-- extra lnormd args (with --spawn)]\n"
    "\n"
    "Load tester of lnormd: sends normalize requests over NNG, closed loop (a fixed\n"
    "number of requests in flight) or open loop (requests at an offered rate),\n"
    "and reports throughput, latency percentiles, errors, and the server's own\n"
    "queue/compute times. Every run stops by itself.\n"
    "\n"
    "Target\n"
    "  --url URL[,URL...]     lnormd to load (default ipc:///tmp/lnormd.sock); several\n"
    "                         (the workers of lnormd --workers): each socket dials all\n"
    "  --spawn PATH           start the lnormd at PATH on a private ipc path (or\n"
    "                         --spawn-listen URL), wait for its --ready-file, measure,\n"
    "                         stop it; arguments after `--` are passed to it\n"
    "  --spawn-listen URL     listen URL for the spawned lnormd (tcp://127.0.0.1:0 ok)\n"
    "  --allow-remote         allow a URL that is not loopback or ipc (refused otherwise,\n"
    "                         so that a load test cannot hit another machine by mistake)\n"
    "  --driver lib|raw       lib: the client library's async API (default when built\n"
    "                         with it; splits large requests into chunks); raw: one\n"
    "                         NNG message per request over req0 contexts\n"
    "  --transport socket|shm|ring|cuda-ipc\n"
    "                         socket (default): tensors in the messages; shm: every\n"
    "                         tensor in a shared region (lnormd --allow-shm, ipc://),\n"
    "                         messages only name them; ring: requests through a\n"
    "                         submission ring in that region, no socket at all;\n"
    "                         cuda-ipc: every tensor in this process's GPU memory,\n"
    "                         lent to lnormd by CUDA IPC (the CUDA backend computes\n"
    "                         on it in place; needs the CUDA build)\n"
    "  --gpu N                cuda-ipc: the GPU whose memory holds the tensors (0)\n"
    "  --chunk-bytes SIZE     lib driver: bytes of x per chunk (e.g. 4M; 0: default)\n"
    "  --pipeline-depth N     lib driver: chunks of one request in flight\n"
    "\n"
    "Load\n"
    "  --concurrency LIST     closed loop: requests in flight, a sweep e.g. 1,8,64\n"
    "                         (default 8)\n"
    "  --rate LIST            open loop: offered requests/s, a sweep e.g. 1000,2000,4000\n"
    "  --arrivals KIND        open loop gaps: constant (default) or poisson\n"
    "  --max-in-flight N      open loop: most requests in flight (default 512); a send\n"
    "                         that must wait still counts its latency from its\n"
    "                         scheduled time (no coordinated omission)\n"
    "  --duration SECONDS     measured time per point (default 5)\n"
    "  --warmup SECONDS       unmeasured time before it (default 1; 0 with --requests)\n"
    "  --requests N           stop a point after N requests (warm-up ones included)\n"
    "  --timeout MS           per-request timeout (default 5000)\n"
    "  --grace SECONDS        after the end, wait this long for replies, then close the\n"
    "                         socket: whatever is in flight counts as aborted (default 2)\n"
    "  --procs N              send from N processes (default 1), each with its own NNG\n"
    "                         and 1/N of --concurrency (or --rate, --max-in-flight,\n"
    "                         --requests, --verify), released together each point;\n"
    "                         one report: summed counts and rates, latencies from the\n"
    "                         summed histograms. One process is bounded by NNG's one\n"
    "                         I/O thread per process (some 25k-50k messages/s)\n"
    "\n"
    "Workload\n"
    "  --op ln|rms|ln-bwd|rms-bwd  operation (default ln); the -bwd ops send\n"
    "                         NormalizeBackward requests (x and dy, dgamma and dbeta\n"
    "                         asked for; --residual sends dres, --params gamma; raw\n"
    "                         socket driver only, no --stats)\n"
    "  --dtype f32|f16|bf16   x dtype (default f32)\n"
    "  --out-dtype DTYPE      y dtype (default: same as x)\n"
    "  --rows N               rows per request (default 1)\n"
    "  --hidden N             elements per row (default 1024)\n"
    "  --mix SPEC             a weighted mix of shapes instead of --rows/--hidden:\n"
    "                         ROWSxHIDDEN[:DTYPE][:ln|rms][:out=DTYPE][:WEIGHT],...\n"
    "                         e.g. \"1x1024:f32:ln:70,8x4096:bf16:rms:30\"\n"
    "  --stats                ask for mean/rstd\n"
    "  --residual             send a residual (and get residual_out back)\n"
    "  --params KIND          none (default), inline (f32 gamma/beta in each request)\n"
    "                         or registered (registered once, sent by id)\n"
    "  --eps E                epsilon (default 1e-5)\n"
    "  --variants N           distinct random inputs per shape (default 4)\n"
    "  --seed N               input seed (default 42)\n"
    "  --verify N             check N replies per point against an f64 reference;\n"
    "                         a mismatch counts as an error\n"
    "\n"
    "Baseline\n"
    "  --echo                 also measure an NNG echo server (rep0 with contexts, a\n"
    "                         separate process) on the same transport with the same\n"
    "                         messages and load, and report lnormd/echo ratios\n"
    "  --echo-only            measure the echo server alone\n"
    "  --echo-url URL         its URL (default: a private ipc path, or tcp port 0 on\n"
    "                         the target's host)\n"
    "  --echo-contexts N      its contexts (default 1024)\n"
    "\n"
    "Output\n"
    "  --json FILE            results as JSON (with device, date, commit)\n"
    "  --csv FILE             one row per point\n"
    "  --plot FILE.svg        latency distribution and throughput/latency-vs-load plot\n"
    "  --tag KEY=VALUE        add to the JSON's \"tags\" (repeatable)\n"
    "  --progress / --no-progress  live line on stderr (default: when it is a terminal)\n"
    "  -h, --help             this text\n"
    "\n"
    "Exit status: 0 all points ran without errors; 1 usage or setup failure;\n"
    "3 some requests failed or mismatched (see the table).\n";

static char *device_name(void)
{
    static char name[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return name;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ' || *c == '\t')
                    c++;
                c[strcspn(c, "\n")] = '\0';
                snprintf(name, sizeof name, "%s", c);
            }
            break;
        }
    }
    fclose(f);
    return name;
}

static void git_commit(char *buf, size_t n)
{
    const char *env = getenv("LNORM_BENCH_COMMIT");
    if (env && *env) {
        snprintf(buf, n, "%s", env);
        return;
    }
    snprintf(buf, n, "unknown");
    FILE *p = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r");
    if (!p)
        return;
    char line[64];
    if (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0])
            snprintf(buf, n, "%s", line);
    }
    pclose(p);
}

/* Loopback or local transports only, unless --allow-remote. */
static int url_is_local1(const char *url)
{
    if (!strncmp(url, "ipc://", 6) || !strncmp(url, "inproc://", 9))
        return 1;
    const char *h = NULL;
    if (!strncmp(url, "tcp://", 6))
        h = url + 6;
    else if (!strncmp(url, "tcp4://", 7) || !strncmp(url, "tcp6://", 7))
        h = url + 7;
    else if (!strncmp(url, "tls+tcp://", 10))
        h = url + 10;
    if (!h)
        return 0;
    return !strncmp(h, "127.", 4) || !strncmp(h, "localhost:", 10) || !strncmp(h, "[::1]:", 6);
}

/* Every URL of a comma-separated list. */
static int url_is_local(const char *list)
{
    char urls[LNORM__URLS_MAX][LNORM__URL_MAX];
    int n = lnorm__urls_split(list, urls);
    for (int i = 0; i < n; i++)
        if (!url_is_local1(urls[i]))
            return 0;
    return n > 0;
}

static void on_sigint(int sig)
{
    (void)sig;
    lnorm__interrupted = 1;
}

/* Derive the echo server's URL from the target's transport. */
static int echo_url_for(const char *url, char *out, size_t n)
{
    if (!strncmp(url, "ipc://", 6)) {
        snprintf(out, n, "ipc:///tmp/lnorm-bench-echo-%d.sock", (int)getpid());
        return 0;
    }
    if (!strncmp(url, "tcp://", 6)) {
        const char *colon = strrchr(url + 6, ':');
        if (!colon)
            return -1;
        snprintf(out, n, "%.*s:0", (int)(colon - url), url);
        return 0;
    }
    return -1;
}

enum {
    O_URL = 256, O_SPAWN, O_SPAWN_LISTEN, O_DRIVER, O_TRANSPORT, O_CHUNK, O_PIPE, O_CONC, O_RATE, O_ARR,
    O_MAXIF, O_DUR, O_WARM, O_REQS, O_TIMEOUT, O_GRACE, O_OP, O_DTYPE, O_ODTYPE, O_ROWS,
    O_HIDDEN, O_MIX, O_STATS, O_RESID, O_PARAMS, O_EPS, O_VARIANTS, O_SEED, O_VERIFY, O_ECHO,
    O_ECHO_ONLY, O_ECHO_URL, O_ECHO_CTX, O_JSON, O_CSV, O_PLOT, O_TAG, O_PROGRESS, O_NOPROGRESS,
    O_ECHO_SERVE, O_READY, O_LIFETIME, O_REMOTE, O_PROCS, O_GPU
};

static const struct option longopts[] = {
    {"url", 1, 0, O_URL}, {"spawn", 1, 0, O_SPAWN}, {"spawn-listen", 1, 0, O_SPAWN_LISTEN},
    {"driver", 1, 0, O_DRIVER}, {"transport", 1, 0, O_TRANSPORT}, {"chunk-bytes", 1, 0, O_CHUNK}, {"pipeline-depth", 1, 0, O_PIPE},
    {"concurrency", 1, 0, O_CONC}, {"rate", 1, 0, O_RATE}, {"arrivals", 1, 0, O_ARR},
    {"max-in-flight", 1, 0, O_MAXIF}, {"duration", 1, 0, O_DUR}, {"warmup", 1, 0, O_WARM},
    {"requests", 1, 0, O_REQS}, {"timeout", 1, 0, O_TIMEOUT}, {"grace", 1, 0, O_GRACE},
    {"op", 1, 0, O_OP}, {"dtype", 1, 0, O_DTYPE}, {"out-dtype", 1, 0, O_ODTYPE},
    {"rows", 1, 0, O_ROWS}, {"hidden", 1, 0, O_HIDDEN}, {"mix", 1, 0, O_MIX},
    {"stats", 0, 0, O_STATS}, {"residual", 0, 0, O_RESID}, {"params", 1, 0, O_PARAMS},
    {"eps", 1, 0, O_EPS}, {"variants", 1, 0, O_VARIANTS}, {"seed", 1, 0, O_SEED},
    {"verify", 1, 0, O_VERIFY}, {"echo", 0, 0, O_ECHO}, {"echo-only", 0, 0, O_ECHO_ONLY},
    {"echo-url", 1, 0, O_ECHO_URL}, {"echo-contexts", 1, 0, O_ECHO_CTX}, {"json", 1, 0, O_JSON},
    {"csv", 1, 0, O_CSV}, {"plot", 1, 0, O_PLOT}, {"tag", 1, 0, O_TAG},
    {"progress", 0, 0, O_PROGRESS}, {"no-progress", 0, 0, O_NOPROGRESS},
    {"echo-serve", 1, 0, O_ECHO_SERVE}, {"ready-file", 1, 0, O_READY},
    {"echo-lifetime", 1, 0, O_LIFETIME}, {"allow-remote", 0, 0, O_REMOTE}, {"procs", 1, 0, O_PROCS},
    {"gpu", 1, 0, O_GPU}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};

static int bad(const char *opt, const char *val)
{
    fprintf(stderr, "lnorm-bench: bad value for --%s: '%s' (see --help)\n", opt, val);
    return 1;
}

static int parse_pos(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

/* Everything the command line sets, and what is derived from it. */
typedef struct bench_opts {
    const char *url, *spawn, *spawn_listen, *mix_spec, *json, *csv, *plot, *echo_url;
    const char *echo_serve, *ready_file, *params_s, *conc_s, *rate_s;
    const char *tags[MAX_TAGS];
    size_t ntags;
    char *extra[MAX_EXTRA];  /* lnormd arguments after `--` (with --spawn) */
    int nextra;
    int driver, poisson, max_inflight, timeout_ms, echo, echo_only, echo_ctx, progress;
    int driver_given;        /* --driver or --transport was given */
    int pipeline, lifetime, allow_remote;
    int procs;               /* load processes (--procs) */
    int gpu;                 /* --gpu (cuda-ipc) */
    double duration, warmup, grace;
    uint64_t max_requests, chunk;
    unsigned verify_n;
    lnorm__wl wl;
    lnorm__mix_shape def;    /* the shape of --rows/--hidden/--op/... */
    double points[LNORM__LIST_MAX]; /* concurrencies or rates */
    int npoints, open;       /* open: open loop (--rate) */
    char mix_desc[512];
} bench_opts;

static void opts_defaults(bench_opts *b)
{
    memset(b, 0, sizeof *b);
    b->url = "ipc:///tmp/lnormd.sock";
    b->params_s = "none";
#ifdef LNORM_BENCH_HAVE_LIB
    b->driver = LNORM__DRV_LIB;
#else
    b->driver = LNORM__DRV_RAW;
#endif
    b->max_inflight = 512;
    b->timeout_ms = 5000;
    b->echo_ctx = 1024;
    b->progress = isatty(2);
    b->lifetime = 3600;
    b->procs = 1;
    b->duration = -1;
    b->warmup = -1;
    b->grace = 2.0;
    b->wl.eps = LNORM_DEFAULT_EPS;
    b->wl.variants = 4;
    b->wl.seed = 42;
    lnorm__mix_shape def = {LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, LNORM_DTYPE_NONE, 1, 1024, 1};
    b->def = def;
}

/* The workload options: 0 taken, 1 bad value (said), -1 not one of them. */
static int opt_workload(bench_opts *b, int c, const char *name, const char *arg)
{
    lnorm__wl *wl = &b->wl;
    lnorm__mix_shape *def = &b->def;
    double v;
    uint64_t u;
    switch (c) {
    case O_OP: if ((def->op = lnorm__op_parse(arg)) < 0) return bad(name, arg); return 0;
    case O_DTYPE: if ((def->x_dtype = lnorm__dtype_parse(arg)) < 0) return bad(name, arg); return 0;
    case O_ODTYPE: if ((def->y_dtype = lnorm__dtype_parse(arg)) < 0) return bad(name, arg); return 0;
    case O_ROWS: if (lnorm__size_parse(arg, &def->rows) || !def->rows) return bad(name, arg); return 0;
    case O_HIDDEN: if (lnorm__size_parse(arg, &def->hidden) || !def->hidden) return bad(name, arg); return 0;
    case O_MIX: b->mix_spec = arg; return 0;
    case O_STATS: wl->stats = 1; return 0;
    case O_RESID: wl->residual = 1; return 0;
    case O_PARAMS:
        b->params_s = arg;
        if (!strcmp(arg, "none")) wl->params = LNORM__PARAMS_NONE;
        else if (!strcmp(arg, "inline")) wl->params = LNORM__PARAMS_INLINE;
        else if (!strcmp(arg, "registered")) wl->params = LNORM__PARAMS_REGISTERED;
        else return bad(name, arg);
        return 0;
    case O_EPS: if (parse_pos(arg, 1e-30, 1, &v)) return bad(name, arg); wl->eps = (float)v; return 0;
    case O_VARIANTS: if (parse_pos(arg, 1, 1024, &v)) return bad(name, arg); wl->variants = (unsigned)v; return 0;
    case O_SEED: if (lnorm__size_parse(arg, &u)) return bad(name, arg); wl->seed = u; return 0;
    case O_VERIFY: if (parse_pos(arg, 0, 1000000, &v)) return bad(name, arg); b->verify_n = (unsigned)v; return 0;
    default: return -1;
    }
}

/* The load options: 0 taken, 1 bad value (said), -1 not one of them. */
static int opt_load(bench_opts *b, int c, const char *name, const char *arg)
{
    double v;
    switch (c) {
    case O_CONC: b->conc_s = arg; return 0;
    case O_RATE: b->rate_s = arg; return 0;
    case O_ARR:
        if (!strcmp(arg, "poisson")) b->poisson = 1;
        else if (!strcmp(arg, "constant")) b->poisson = 0;
        else return bad(name, arg);
        return 0;
    case O_MAXIF: if (parse_pos(arg, 1, 65536, &v)) return bad(name, arg); b->max_inflight = (int)v; return 0;
    case O_DUR: if (parse_pos(arg, 0, 86400, &b->duration)) return bad(name, arg); return 0;
    case O_WARM: if (parse_pos(arg, 0, 3600, &b->warmup)) return bad(name, arg); return 0;
    case O_REQS: if (lnorm__size_parse(arg, &b->max_requests) || !b->max_requests) return bad(name, arg); return 0;
    case O_TIMEOUT: if (parse_pos(arg, 1, 3600000, &v)) return bad(name, arg); b->timeout_ms = (int)v; return 0;
    case O_GRACE: if (parse_pos(arg, 0, 3600, &b->grace)) return bad(name, arg); return 0;
    case O_PROCS:
        if (parse_pos(arg, 1, LNORM__PROCS_MAX, &v) || v != (int)v) return bad(name, arg);
        b->procs = (int)v;
        return 0;
    default: return -1;
    }
}

/* --driver lib|raw: 0, or 1 after the error. */
static int opt_driver(bench_opts *b, const char *name, const char *arg)
{
    if (!strcmp(arg, "raw")) {
        b->driver = LNORM__DRV_RAW;
        return 0;
    }
    if (strcmp(arg, "lib"))
        return bad(name, arg);
#ifdef LNORM_BENCH_HAVE_LIB
    b->driver = LNORM__DRV_LIB;
    return 0;
#else
    fprintf(stderr, "lnorm-bench: built without the client library\n");
    return 1;
#endif
}

/* --transport socket|shm|ring|cuda-ipc: 0, or 1 after the error. */
static int opt_transport(bench_opts *b, const char *name, const char *arg)
{
    if (!strcmp(arg, "socket"))
        return 0;
    if (strcmp(arg, "shm") && strcmp(arg, "ring") && strcmp(arg, "cuda-ipc"))
        return bad(name, arg);
#ifdef LNORM_BENCH_HAVE_LIB
    b->driver = !strcmp(arg, "shm") ? LNORM__DRV_SHM : !strcmp(arg, "ring") ? LNORM__DRV_RING : LNORM__DRV_CUDA;
    return 0;
#else
    fprintf(stderr, "lnorm-bench: built without the client library\n");
    return 1;
#endif
}

/* Target, driver, baseline and output options: 0 taken, 1 bad value
 * (said), -1 unknown. */
static int opt_other(bench_opts *b, int c, const char *name, const char *arg)
{
    double v;
    switch (c) {
    case O_URL: b->url = arg; return 0;
    case O_SPAWN: b->spawn = arg; return 0;
    case O_SPAWN_LISTEN: b->spawn_listen = arg; return 0;
    case O_REMOTE: b->allow_remote = 1; return 0;
    case O_DRIVER: b->driver_given = 1; return opt_driver(b, name, arg);
    case O_TRANSPORT: b->driver_given = 1; return opt_transport(b, name, arg);
    case O_CHUNK: if (lnorm__size_parse(arg, &b->chunk)) return bad(name, arg); return 0;
    case O_PIPE: if (parse_pos(arg, 1, 1024, &v)) return bad(name, arg); b->pipeline = (int)v; return 0;
    case O_GPU: if (parse_pos(arg, 0, 1024, &v) || v != (int)v) return bad(name, arg); b->gpu = (int)v; return 0;
    case O_ECHO: b->echo = 1; return 0;
    case O_ECHO_ONLY: b->echo_only = 1; return 0;
    case O_ECHO_URL: b->echo_url = arg; return 0;
    case O_ECHO_CTX: if (parse_pos(arg, 1, 65536, &v)) return bad(name, arg); b->echo_ctx = (int)v; return 0;
    case O_JSON: b->json = arg; return 0;
    case O_CSV: b->csv = arg; return 0;
    case O_PLOT: b->plot = arg; return 0;
    case O_TAG:
        if (b->ntags == MAX_TAGS || !strchr(arg, '=')) return bad(name, arg);
        b->tags[b->ntags++] = arg;
        return 0;
    case O_PROGRESS: b->progress = 1; return 0;
    case O_NOPROGRESS: b->progress = 0; return 0;
    case O_ECHO_SERVE: b->echo_serve = arg; return 0;
    case O_READY: b->ready_file = arg; return 0;
    case O_LIFETIME: if (parse_pos(arg, 1, 86400, &v)) return bad(name, arg); b->lifetime = (int)v; return 0;
    default: return -1;
    }
}

/* Parse the command line into b. -1: go on; otherwise the exit status
 * (0 after --help). */
static int parse_args(int argc, char **argv, bench_opts *b)
{
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        const char *name = "";
        for (const struct option *o = longopts; o->name; o++)
            if (o->val == c)
                name = o->name;
        if (c == 'h') {
            fputs(usage, stdout);
            return 0;
        }
        int rv = opt_workload(b, c, name, optarg);
        if (rv < 0)
            rv = opt_load(b, c, name, optarg);
        if (rv < 0)
            rv = opt_other(b, c, name, optarg);
        if (rv < 0) {
            fputs("see lnorm-bench --help\n", stderr);
            return 1;
        }
        if (rv > 0)
            return rv;
    }
    if (b->echo_serve)
        return -1;
    for (int i = optind; i < argc; i++) {
        if (!b->spawn) {
            fprintf(stderr, "lnorm-bench: unexpected argument '%s' (extra arguments go to --spawn)\n", argv[i]);
            return 1;
        }
        if (b->nextra == MAX_EXTRA - 8) {
            fprintf(stderr, "lnorm-bench: too many lnormd arguments\n");
            return 1;
        }
        b->extra[b->nextra++] = argv[i];
    }
    return -1;
}

/* The mix of shapes (--mix, or the one shape of the other options) and
 * its description for the report. 0, or 1 after the error. */
static int build_mix(bench_opts *b)
{
    char err[512];
    lnorm__wl *wl = &b->wl;
    if (b->mix_spec) {
        if (lnorm__mix_parse(b->mix_spec, &b->def, &wl->mix, err, sizeof err)) {
            fprintf(stderr, "lnorm-bench: --mix: %s\n", err);
            return 1;
        }
    } else {
        wl->mix.shapes[0] = b->def;
        wl->mix.n = 1;
        wl->mix.total_weight = 1;
    }
    b->mix_desc[0] = '\0';
    for (size_t i = 0; i < wl->mix.n; i++) {
        const lnorm__mix_shape *s = &wl->mix.shapes[i];
        size_t l = strlen(b->mix_desc);
        snprintf(b->mix_desc + l, sizeof b->mix_desc - l, "%s%llux%llu:%s:%s%s%s:%u", i ? "," : "",
                 (unsigned long long)s->rows, (unsigned long long)s->hidden,
                 lnorm_dtype_name(s->x_dtype), lnorm__op_name(s->op),
                 s->y_dtype ? ":out=" : "", s->y_dtype ? lnorm_dtype_name(s->y_dtype) : "", s->weight);
        /* The backward goes through the raw socket driver only (its default). */
        if (LNORM__OP_IS_BWD(s->op) && !b->driver_given)
            b->driver = LNORM__DRV_RAW;
        if (LNORM__OP_IS_BWD(s->op) && (b->driver != LNORM__DRV_RAW || wl->stats)) {
            fprintf(stderr, "lnorm-bench: %s: the raw socket driver only, without --stats\n", lnorm__op_name(s->op));
            return 1;
        }
    }
    return 0;
}

/* Checks across options, the load points, the defaults that depend on
 * other options, and the mix. 0, or 1 after the error. */
static int validate(bench_opts *b)
{
    const char *check[] = {b->spawn ? b->spawn_listen : b->url, b->echo_url};
    for (int i = 0; i < 2; i++) {
        if (check[i] && !b->allow_remote && !url_is_local(check[i])) {
            fprintf(stderr, "lnorm-bench: %s is not loopback or ipc; add --allow-remote to load it\n",
                    check[i]);
            return 1;
        }
    }
    if (b->conc_s && b->rate_s) {
        fprintf(stderr, "lnorm-bench: give --concurrency (closed loop) or --rate (open loop), not both\n");
        return 1;
    }
    b->open = b->rate_s != NULL;
    const char *list = b->open ? b->rate_s : b->conc_s ? b->conc_s : "8";
    b->npoints = lnorm__list_parse(list, b->points, LNORM__LIST_MAX);
    if (b->npoints < 0)
        return bad(b->open ? "rate" : "concurrency", list);
    if (!b->open)
        for (int i = 0; i < b->npoints; i++)
            if (b->points[i] != (int)b->points[i] || b->points[i] > 65536)
                return bad("concurrency", b->conc_s);
    for (int i = 0; i < b->npoints && b->procs > 1; i++) {
        if (!b->open && b->points[i] < b->procs) {
            fprintf(stderr, "lnorm-bench: --concurrency %g is less than --procs %d (each process needs one)\n",
                    b->points[i], b->procs);
            return 1;
        }
    }
    if (b->procs > 1 && ((b->open && b->max_inflight < b->procs) ||
                         (b->max_requests && b->max_requests < (uint64_t)b->procs))) {
        fprintf(stderr, "lnorm-bench: --max-in-flight and --requests must be at least --procs %d\n", b->procs);
        return 1;
    }
    if (b->duration < 0)
        b->duration = b->max_requests ? 600 : 5; /* --requests alone: bounded by 10 minutes */
    if (b->warmup < 0)
        b->warmup = b->max_requests ? 0 : 1;
    return build_mix(b);
}

static void install_signals(void)
{
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* --spawn: start lnormd on a private ipc path (or --spawn-listen) and wait
 * for its ready file; *url becomes its URL. 0, or 1 after the error. */
static int spawn_lnormd(const bench_opts *b, lnorm__child *lnormd, const char **url)
{
    char listen[300], ready[256], err[512];
    if (b->spawn_listen)
        snprintf(listen, sizeof listen, "%s", b->spawn_listen);
    else
        snprintf(listen, sizeof listen, "ipc:///tmp/lnorm-bench-%d.sock", (int)getpid());
    snprintf(ready, sizeof ready, "/tmp/lnorm-bench-%d.ready", (int)getpid());
    snprintf(lnormd->ready_path, sizeof lnormd->ready_path, "%s", ready);
    char *av[MAX_EXTRA + 10];
    int ac = 0;
    av[ac++] = (char *)b->spawn;
    av[ac++] = "--listen";
    av[ac++] = listen;
    av[ac++] = "--ready-file";
    av[ac++] = ready;
    av[ac++] = "--http";
    av[ac++] = "off";
    for (int i = 0; i < b->nextra; i++)
        av[ac++] = b->extra[i];
    av[ac] = NULL;
    if (lnorm__child_start(lnormd, av, err, sizeof err) ||
        lnorm__child_wait_ready(lnormd, 15000, err, sizeof err)) {
        fprintf(stderr, "lnorm-bench: --spawn %s: %s\n", b->spawn, err);
        return 1;
    }
    *url = lnormd->url;
    return 0;
}

/* --echo / --echo-only: start the echo server (this program again, with
 * --echo-serve) and wait for it. 0, or 1 after the error. */
static int start_echo(const bench_opts *b, const char *url, lnorm__child *echod)
{
    char eurl[300], err[512];
    const char *from = b->spawn && !b->echo_only && b->spawn_listen ? b->spawn_listen : url;
    char first[LNORM__URLS_MAX][LNORM__URL_MAX]; /* the first URL of a list */
    if (b->echo_url) {
        snprintf(eurl, sizeof eurl, "%s", b->echo_url);
    } else if (echo_url_for(lnorm__urls_split(from, first) ? first[0] : "", eurl, sizeof eurl)) {
        fprintf(stderr, "lnorm-bench: cannot derive an echo URL from %s; give --echo-url\n", url);
        return 1;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "lnorm-bench: cannot find my own executable\n");
        return 1;
    }
    self[n] = '\0';
    snprintf(echod->ready_path, sizeof echod->ready_path, "/tmp/lnorm-bench-echo-%d.ready", (int)getpid());
    char ctx_s[16], life_s[16];
    snprintf(ctx_s, sizeof ctx_s, "%d", b->echo_ctx);
    snprintf(life_s, sizeof life_s, "%d", (int)(b->duration + b->warmup + b->grace + 60) * (b->npoints + 1));
    char *av[] = {self, "--echo-serve", eurl, "--ready-file", echod->ready_path,
                  "--echo-contexts", ctx_s, "--echo-lifetime", life_s, NULL};
    if (lnorm__child_start(echod, av, err, sizeof err) ||
        lnorm__child_wait_ready(echod, 10000, err, sizeof err)) {
        fprintf(stderr, "lnorm-bench: echo server: %s\n", err);
        return 1;
    }
    return 0;
}

/* The run of point i against lnormd (tgt 0) or the echo server (tgt 1). */
static void point_cfg(const bench_opts *b, int i, int tgt, const char *url, const lnorm__child *lnormd,
                      const lnorm__child *echod, lnorm__runcfg *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->url = tgt ? echod->url : url;
    cfg->label = tgt ? "echo" : "lnormd";
    cfg->target = tgt ? LNORM__TARGET_ECHO : LNORM__TARGET_LNORMD;
    cfg->driver = tgt ? LNORM__DRV_RAW : b->driver;
    cfg->open_loop = b->open;
    cfg->concurrency = b->open ? b->max_inflight : (int)b->points[i];
    cfg->rate = b->open ? b->points[i] : 0;
    cfg->poisson = b->poisson;
    cfg->duration_s = b->duration;
    cfg->warmup_s = b->warmup;
    cfg->grace_s = b->grace;
    cfg->max_requests = b->max_requests;
    cfg->timeout_ms = b->timeout_ms;
    cfg->verify_n = tgt ? 0 : b->verify_n;
    cfg->progress = b->progress;
    cfg->chunk_bytes = (size_t)b->chunk;
    cfg->pipeline_depth = b->pipeline;
    cfg->gpu = b->gpu;
    cfg->server_pid = tgt ? (int)echod->pid : (b->spawn ? (int)lnormd->pid : 0);
}

/* Share k of n of a count: n parts that add up to it. */
static uint64_t share_of(uint64_t total, int k, int n)
{
    return total / (uint64_t)n + ((uint64_t)k < total % (uint64_t)n);
}

/* Load process k of b->procs: its share of the point's load. */
static void proc_share(const bench_opts *b, int k, lnorm__runcfg *cfg)
{
    int n = b->procs;
    cfg->stream = (unsigned)k;
    cfg->nstreams = (unsigned)n;
    cfg->concurrency = (int)share_of((uint64_t)cfg->concurrency, k, n);
    cfg->rate /= n;
    if (cfg->max_requests)
        cfg->max_requests = share_of(cfg->max_requests, k, n);
    cfg->verify_n = (unsigned)share_of(cfg->verify_n, k, n);
    cfg->progress = 0;
    cfg->server_pid = 0; /* the parent measures the server */
}

/* What a load process (--procs) needs: the parent's state at the fork. */
typedef struct proc_ctx {
    const bench_opts *b;
    lnorm__work *const *w;    /* the variables of main, set by the fork */
    const char *const *url;
    const lnorm__child *lnormd, *echod;
    lnorm__multi *m;
} proc_ctx;

static int skip_target(const bench_opts *b, int tgt)
{
    return (tgt == 0 && b->echo_only) || (tgt == 1 && !b->echo && !b->echo_only);
}

/* A load process: every point, in the parent's order, released by it. */
static int proc_body(void *arg, int k)
{
    proc_ctx *pc = arg;
    const bench_opts *b = pc->b;
    lnorm__hist *h = lnorm__hist_new();
    if (!h)
        return 1;
    for (int i = 0; i < b->npoints && !lnorm__interrupted; i++) {
        for (int tgt = 0; tgt < 2 && !lnorm__interrupted; tgt++) {
            if (skip_target(b, tgt))
                continue;
            lnorm__runcfg cfg;
            point_cfg(b, i, tgt, *pc->url, pc->lnormd, pc->echod, &cfg);
            proc_share(b, k, &cfg);
            cfg.before_start = lnorm__multi_child_ready;
            cfg.before_arg = pc->m;
            cfg.hist_out = h;
            lnorm__hist_reset(h);
            lnorm__runres res;
            lnorm__run(&cfg, *pc->w, &res);
            if (lnorm__multi_child_done(pc->m, &res, h) != 0) {
                lnorm__hist_free(h);
                return 0;
            }
        }
    }
    lnorm__hist_free(h);
    return 0;
}

/* Every point against each target; results appended to runs. With
 * --procs, m holds the load processes. The exit status so far: 0, 1 (a
 * run could not be made) or 3 (errors). */
static int run_points(const bench_opts *b, const lnorm__work *w, const char *url, const lnorm__child *lnormd,
                      const lnorm__child *echod, lnorm__multi *m, lnorm__runres *runs, size_t *nruns)
{
    int status = 0;
    /* a load process must not outlast: setup, the run, the grace, a margin */
    int done_ms = (int)((b->warmup + b->duration + b->grace) * 1000) + b->timeout_ms + 10000;
    for (int i = 0; i < b->npoints && !lnorm__interrupted; i++) {
        for (int tgt = 0; tgt < 2 && !lnorm__interrupted; tgt++) {
            if (skip_target(b, tgt))
                continue;
            lnorm__runcfg cfg;
            point_cfg(b, i, tgt, url, lnormd, echod, &cfg);
            lnorm__runres *r = &runs[*nruns];
            int rc;
            if (m) {
                lnorm__multi_point(m, cfg.server_pid, 20000, done_ms, r);
                snprintf(r->label, sizeof r->label, "%s", cfg.label);
                r->open_loop = cfg.open_loop;
                r->concurrency = cfg.concurrency;
                r->rate = cfg.rate;
                if (!r->driver[0])
                    snprintf(r->driver, sizeof r->driver, "%s", lnorm__driver_name(cfg.driver));
                rc = r->error[0] ? -1 : 0;
            } else {
                rc = lnorm__run(&cfg, w, r);
            }
            if (rc != 0) {
                fprintf(stderr, "lnorm-bench: %s: %s\n", cfg.label, r->error);
                status = 1;
            } else if (!r->ok && !r->errors && !lnorm__interrupted) {
                /* e.g. nothing listens at the URL and the client waits to connect */
                fprintf(stderr, "lnorm-bench: %s: no request completed in the measured time\n", cfg.label);
                status = 1;
            } else if (r->errors && status == 0) {
                status = 3;
            }
            (*nruns)++;
        }
    }
    return status;
}

/* The table on stdout and the --json / --csv / --plot files. 0, or 1
 * when a file could not be written. */
static int write_reports(const bench_opts *b, int argc, char **argv, const char *url,
                         const lnorm__runres *runs, size_t nruns)
{
    char date[32], commit[64], host[128] = "";
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    git_commit(commit, sizeof commit);
    gethostname(host, sizeof host - 1);
    char cmdline[2048] = "";
    for (int i = 0; i < argc; i++) {
        size_t l = strlen(cmdline);
        snprintf(cmdline + l, sizeof cmdline - l, "%s%s", i ? " " : "", argv[i]);
    }
    lnorm__report rp = {runs, nruns, date, device_name(), commit, host, url, b->mix_desc, cmdline,
                        b->params_s, b->wl.stats, b->wl.residual, b->duration, b->warmup, b->tags, b->ntags,
                        b->procs};
    lnorm__report_table(&rp, stdout);
    int status = 0;
    const char *files[3] = {b->json, b->csv, b->plot};
    int (*writers[3])(const lnorm__report *, const char *) = {lnorm__report_json, lnorm__report_csv,
                                                              lnorm__report_svg};
    for (int k = 0; k < 3; k++) {
        if (files[k] && writers[k](&rp, files[k])) {
            fprintf(stderr, "lnorm-bench: cannot write %s\n", files[k]);
            status = 1;
        }
    }
    return status;
}

int main(int argc, char **argv)
{
    bench_opts b;
    opts_defaults(&b);
    int status = parse_args(argc, argv, &b);
    if (status >= 0)
        return status;
    if (b.echo_serve)
        return lnorm__echo_serve(b.echo_serve, b.echo_ctx, b.ready_file, b.lifetime);
    if (validate(&b))
        return 1;
    install_signals();

    status = 0;
    const char *url = b.url;
    lnorm__work *w = NULL;
    lnorm__child lnormd, echod;
    memset(&lnormd, 0, sizeof lnormd);
    memset(&echod, 0, sizeof echod);
    lnorm__runres *runs = calloc((size_t)b.npoints * 2, sizeof(*runs));
    size_t nruns = 0;
    int params_registered = 0;
    char params_prefix[64], err[512];
    lnorm__multi multi;
    memset(&multi, 0, sizeof multi);
    proc_ctx pc = {&b, &w, &url, &lnormd, &echod, &multi};
    snprintf(params_prefix, sizeof params_prefix, "lnorm-bench.%d", (int)getpid());
    if (!runs || lnorm__work_build(&b.wl, params_prefix, &w) != 0) {
        fprintf(stderr, "lnorm-bench: out of memory building the requests\n");
        status = 1;
    } else if ((b.spawn && !b.echo_only && spawn_lnormd(&b, &lnormd, &url)) ||
               ((b.echo || b.echo_only) && start_echo(&b, url, &echod))) {
        status = 1;
    } else if (b.procs > 1 && lnorm__multi_start(&multi, b.procs, proc_body, &pc, err, sizeof err)) {
        /* forked before this process makes any NNG call */
        fprintf(stderr, "lnorm-bench: --procs %d: %s\n", b.procs, err);
        status = 1;
    } else if (!b.echo_only && b.wl.params == LNORM__PARAMS_REGISTERED &&
               lnorm__params_setup(url, w, 0, err, sizeof err)) {
        fprintf(stderr, "lnorm-bench: registering params: %s\n", err);
        status = 1;
    } else {
        params_registered = !b.echo_only && b.wl.params == LNORM__PARAMS_REGISTERED;
        status = run_points(&b, w, url, &lnormd, &echod, b.procs > 1 ? &multi : NULL, runs, &nruns);
    }
    if (b.procs > 1)
        lnorm__multi_stop(&multi);
    if (params_registered && lnorm__params_setup(url, w, 1, err, sizeof err))
        fprintf(stderr, "lnorm-bench: dropping params: %s\n", err);
    lnorm__child_stop(&lnormd);
    lnorm__child_stop(&echod);
    if (nruns && write_reports(&b, argc, argv, b.echo_only ? echod.url : url, runs, nruns))
        status = 1;
    lnorm__work_free(w);
    for (size_t i = 0; i < nruns; i++)
        free(runs[i].parts);
    free(runs);
    return status;
}
