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
    "  --url URL              lnormd to load (default ipc:///tmp/lnormd.sock)\n"
    "  --spawn PATH           start the lnormd at PATH on a private ipc path (or\n"
    "                         --spawn-listen URL), wait for its --ready-file, measure,\n"
    "                         stop it; arguments after `--` are passed to it\n"
    "  --spawn-listen URL     listen URL for the spawned lnormd (tcp://127.0.0.1:0 ok)\n"
    "  --allow-remote         allow a URL that is not loopback or ipc (refused otherwise,\n"
    "                         so that a load test cannot hit another machine by mistake)\n"
    "  --driver lib|raw       lib: the client library's async API (default when built\n"
    "                         with it; splits large requests into chunks); raw: one\n"
    "                         NNG message per request over req0 contexts\n"
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
    "\n"
    "Workload\n"
    "  --op ln|rms            operation (default ln)\n"
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
static int url_is_local(const char *url)
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
    O_URL = 256, O_SPAWN, O_SPAWN_LISTEN, O_DRIVER, O_CHUNK, O_PIPE, O_CONC, O_RATE, O_ARR,
    O_MAXIF, O_DUR, O_WARM, O_REQS, O_TIMEOUT, O_GRACE, O_OP, O_DTYPE, O_ODTYPE, O_ROWS,
    O_HIDDEN, O_MIX, O_STATS, O_RESID, O_PARAMS, O_EPS, O_VARIANTS, O_SEED, O_VERIFY, O_ECHO,
    O_ECHO_ONLY, O_ECHO_URL, O_ECHO_CTX, O_JSON, O_CSV, O_PLOT, O_TAG, O_PROGRESS, O_NOPROGRESS,
    O_ECHO_SERVE, O_READY, O_LIFETIME, O_REMOTE
};

static const struct option longopts[] = {
    {"url", 1, 0, O_URL}, {"spawn", 1, 0, O_SPAWN}, {"spawn-listen", 1, 0, O_SPAWN_LISTEN},
    {"driver", 1, 0, O_DRIVER}, {"chunk-bytes", 1, 0, O_CHUNK}, {"pipeline-depth", 1, 0, O_PIPE},
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
    {"echo-lifetime", 1, 0, O_LIFETIME}, {"allow-remote", 0, 0, O_REMOTE},
    {"help", 0, 0, 'h'}, {0, 0, 0, 0}};

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

int main(int argc, char **argv)
{
    const char *url = "ipc:///tmp/lnormd.sock", *spawn = NULL, *spawn_listen = NULL;
    const char *mix_spec = NULL, *json = NULL, *csv = NULL, *plot = NULL, *echo_url_opt = NULL;
    const char *echo_serve = NULL, *ready_file = NULL, *params_s = "none";
    const char *conc_s = NULL, *rate_s = NULL;
    const char *tags[MAX_TAGS];
    size_t ntags = 0;
#ifdef LNORM_BENCH_HAVE_LIB
    int driver = LNORM__DRV_LIB;
#else
    int driver = LNORM__DRV_RAW;
#endif
    int poisson = 0, max_inflight = 512, timeout_ms = 5000, echo = 0, echo_only = 0;
    int echo_ctx = 1024, progress = isatty(2), pipeline = 0, lifetime = 3600, allow_remote = 0;
    double duration = -1, warmup = -1, grace = 2.0, v;
    uint64_t max_requests = 0, chunk = 0, u;
    unsigned verify_n = 0;
    lnorm__wl wl;
    memset(&wl, 0, sizeof wl);
    wl.eps = LNORM_DEFAULT_EPS;
    wl.variants = 4;
    wl.seed = 42;
    lnorm__mix_shape def = {LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, LNORM_DTYPE_NONE, 1, 1024, 1};

    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        const char *name = "";
        for (const struct option *o = longopts; o->name; o++)
            if (o->val == c)
                name = o->name;
        switch (c) {
        case 'h': fputs(usage, stdout); return 0;
        case O_URL: url = optarg; break;
        case O_SPAWN: spawn = optarg; break;
        case O_SPAWN_LISTEN: spawn_listen = optarg; break;
        case O_DRIVER:
            if (!strcmp(optarg, "raw"))
                driver = LNORM__DRV_RAW;
            else if (!strcmp(optarg, "lib")) {
#ifdef LNORM_BENCH_HAVE_LIB
                driver = LNORM__DRV_LIB;
#else
                fprintf(stderr, "lnorm-bench: built without the client library\n");
                return 1;
#endif
            } else
                return bad(name, optarg);
            break;
        case O_CHUNK: if (lnorm__size_parse(optarg, &chunk)) return bad(name, optarg); break;
        case O_PIPE: if (parse_pos(optarg, 1, 1024, &v)) return bad(name, optarg); pipeline = (int)v; break;
        case O_CONC: conc_s = optarg; break;
        case O_RATE: rate_s = optarg; break;
        case O_ARR:
            if (!strcmp(optarg, "poisson")) poisson = 1;
            else if (!strcmp(optarg, "constant")) poisson = 0;
            else return bad(name, optarg);
            break;
        case O_MAXIF: if (parse_pos(optarg, 1, 65536, &v)) return bad(name, optarg); max_inflight = (int)v; break;
        case O_DUR: if (parse_pos(optarg, 0, 86400, &duration)) return bad(name, optarg); break;
        case O_WARM: if (parse_pos(optarg, 0, 3600, &warmup)) return bad(name, optarg); break;
        case O_REQS: if (lnorm__size_parse(optarg, &max_requests) || !max_requests) return bad(name, optarg); break;
        case O_TIMEOUT: if (parse_pos(optarg, 1, 3600000, &v)) return bad(name, optarg); timeout_ms = (int)v; break;
        case O_GRACE: if (parse_pos(optarg, 0, 3600, &grace)) return bad(name, optarg); break;
        case O_OP: if ((def.op = lnorm__op_parse(optarg)) < 0) return bad(name, optarg); break;
        case O_DTYPE: if ((def.x_dtype = lnorm__dtype_parse(optarg)) < 0) return bad(name, optarg); break;
        case O_ODTYPE: if ((def.y_dtype = lnorm__dtype_parse(optarg)) < 0) return bad(name, optarg); break;
        case O_ROWS: if (lnorm__size_parse(optarg, &def.rows) || !def.rows) return bad(name, optarg); break;
        case O_HIDDEN: if (lnorm__size_parse(optarg, &def.hidden) || !def.hidden) return bad(name, optarg); break;
        case O_MIX: mix_spec = optarg; break;
        case O_STATS: wl.stats = 1; break;
        case O_RESID: wl.residual = 1; break;
        case O_PARAMS:
            params_s = optarg;
            if (!strcmp(optarg, "none")) wl.params = LNORM__PARAMS_NONE;
            else if (!strcmp(optarg, "inline")) wl.params = LNORM__PARAMS_INLINE;
            else if (!strcmp(optarg, "registered")) wl.params = LNORM__PARAMS_REGISTERED;
            else return bad(name, optarg);
            break;
        case O_EPS: if (parse_pos(optarg, 1e-30, 1, &v)) return bad(name, optarg); wl.eps = (float)v; break;
        case O_VARIANTS: if (parse_pos(optarg, 1, 1024, &v)) return bad(name, optarg); wl.variants = (unsigned)v; break;
        case O_SEED: if (lnorm__size_parse(optarg, &u)) return bad(name, optarg); wl.seed = u; break;
        case O_VERIFY: if (parse_pos(optarg, 0, 1000000, &v)) return bad(name, optarg); verify_n = (unsigned)v; break;
        case O_ECHO: echo = 1; break;
        case O_ECHO_ONLY: echo_only = 1; break;
        case O_ECHO_URL: echo_url_opt = optarg; break;
        case O_ECHO_CTX: if (parse_pos(optarg, 1, 65536, &v)) return bad(name, optarg); echo_ctx = (int)v; break;
        case O_JSON: json = optarg; break;
        case O_CSV: csv = optarg; break;
        case O_PLOT: plot = optarg; break;
        case O_TAG:
            if (ntags == MAX_TAGS || !strchr(optarg, '=')) return bad(name, optarg);
            tags[ntags++] = optarg;
            break;
        case O_REMOTE: allow_remote = 1; break;
        case O_PROGRESS: progress = 1; break;
        case O_NOPROGRESS: progress = 0; break;
        case O_ECHO_SERVE: echo_serve = optarg; break;
        case O_READY: ready_file = optarg; break;
        case O_LIFETIME: if (parse_pos(optarg, 1, 86400, &v)) return bad(name, optarg); lifetime = (int)v; break;
        default: fputs("see lnorm-bench --help\n", stderr); return 1;
        }
    }
    if (echo_serve)
        return lnorm__echo_serve(echo_serve, echo_ctx, ready_file, lifetime);

    char *extra[MAX_EXTRA];
    int nextra = 0;
    for (int i = optind; i < argc; i++) {
        if (!spawn) {
            fprintf(stderr, "lnorm-bench: unexpected argument '%s' (extra arguments go to --spawn)\n", argv[i]);
            return 1;
        }
        if (nextra == MAX_EXTRA - 8) {
            fprintf(stderr, "lnorm-bench: too many lnormd arguments\n");
            return 1;
        }
        extra[nextra++] = argv[i];
    }
    const char *check[] = {spawn ? spawn_listen : url, echo_url_opt};
    for (int i = 0; i < 2; i++) {
        if (check[i] && !allow_remote && !url_is_local(check[i])) {
            fprintf(stderr, "lnorm-bench: %s is not loopback or ipc; add --allow-remote to load it\n",
                    check[i]);
            return 1;
        }
    }
    if (conc_s && rate_s) {
        fprintf(stderr, "lnorm-bench: give --concurrency (closed loop) or --rate (open loop), not both\n");
        return 1;
    }
    double points[LNORM__LIST_MAX];
    int npoints, open = rate_s != NULL;
    npoints = lnorm__list_parse(open ? rate_s : conc_s ? conc_s : "8", points, LNORM__LIST_MAX);
    if (npoints < 0)
        return bad(open ? "rate" : "concurrency", open ? rate_s : conc_s);
    if (!open)
        for (int i = 0; i < npoints; i++)
            if (points[i] != (int)points[i] || points[i] > 65536)
                return bad("concurrency", conc_s);
    if (duration < 0)
        duration = max_requests ? 600 : 5; /* --requests alone: bounded by 10 minutes */
    if (warmup < 0)
        warmup = max_requests ? 0 : 1;
    char err[512];
    if (mix_spec) {
        if (lnorm__mix_parse(mix_spec, &def, &wl.mix, err, sizeof err)) {
            fprintf(stderr, "lnorm-bench: --mix: %s\n", err);
            return 1;
        }
    } else {
        wl.mix.shapes[0] = def;
        wl.mix.n = 1;
        wl.mix.total_weight = 1;
    }
    char mix_desc[512] = "";
    for (size_t i = 0; i < wl.mix.n; i++) {
        const lnorm__mix_shape *s = &wl.mix.shapes[i];
        size_t l = strlen(mix_desc);
        snprintf(mix_desc + l, sizeof mix_desc - l, "%s%llux%llu:%s:%s%s%s:%u", i ? "," : "",
                 (unsigned long long)s->rows, (unsigned long long)s->hidden,
                 lnorm_dtype_name(s->x_dtype), lnorm__op_name(s->op),
                 s->y_dtype ? ":out=" : "", s->y_dtype ? lnorm_dtype_name(s->y_dtype) : "", s->weight);
    }

    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    int status = 0;
    lnorm__work *w = NULL;
    lnorm__child lnormd, echod;
    memset(&lnormd, 0, sizeof lnormd);
    memset(&echod, 0, sizeof echod);
    lnorm__runres *runs = calloc((size_t)npoints * 2, sizeof(*runs));
    size_t nruns = 0;
    int params_registered = 0;
    char params_prefix[64];
    snprintf(params_prefix, sizeof params_prefix, "lnorm-bench.%d", (int)getpid());
    if (!runs || lnorm__work_build(&wl, params_prefix, &w) != 0) {
        fprintf(stderr, "lnorm-bench: out of memory building the requests\n");
        status = 1;
        goto out;
    }

    if (spawn && !echo_only) {
        char listen[300], ready[256];
        if (spawn_listen)
            snprintf(listen, sizeof listen, "%s", spawn_listen);
        else
            snprintf(listen, sizeof listen, "ipc:///tmp/lnorm-bench-%d.sock", (int)getpid());
        snprintf(ready, sizeof ready, "/tmp/lnorm-bench-%d.ready", (int)getpid());
        snprintf(lnormd.ready_path, sizeof lnormd.ready_path, "%s", ready);
        char *av[MAX_EXTRA + 10];
        int ac = 0;
        av[ac++] = (char *)spawn;
        av[ac++] = "--listen";
        av[ac++] = listen;
        av[ac++] = "--ready-file";
        av[ac++] = ready;
        av[ac++] = "--http";
        av[ac++] = "off";
        for (int i = 0; i < nextra; i++)
            av[ac++] = extra[i];
        av[ac] = NULL;
        if (lnorm__child_start(&lnormd, av, err, sizeof err) ||
            lnorm__child_wait_ready(&lnormd, 15000, err, sizeof err)) {
            fprintf(stderr, "lnorm-bench: --spawn %s: %s\n", spawn, err);
            status = 1;
            goto out;
        }
        url = lnormd.url;
    }
    if (echo || echo_only) {
        char eurl[300];
        if (echo_url_opt)
            snprintf(eurl, sizeof eurl, "%s", echo_url_opt);
        else if (echo_url_for(spawn && !echo_only && spawn_listen ? spawn_listen : url, eurl, sizeof eurl)) {
            fprintf(stderr, "lnorm-bench: cannot derive an echo URL from %s; give --echo-url\n", url);
            status = 1;
            goto out;
        }
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) {
            fprintf(stderr, "lnorm-bench: cannot find my own executable\n");
            status = 1;
            goto out;
        }
        self[n] = '\0';
        snprintf(echod.ready_path, sizeof echod.ready_path, "/tmp/lnorm-bench-echo-%d.ready", (int)getpid());
        char ctx_s[16], life_s[16];
        snprintf(ctx_s, sizeof ctx_s, "%d", echo_ctx);
        snprintf(life_s, sizeof life_s, "%d", (int)(duration + warmup + grace + 60) * (npoints + 1));
        char *av[] = {self, "--echo-serve", eurl, "--ready-file", echod.ready_path,
                      "--echo-contexts", ctx_s, "--echo-lifetime", life_s, NULL};
        if (lnorm__child_start(&echod, av, err, sizeof err) ||
            lnorm__child_wait_ready(&echod, 10000, err, sizeof err)) {
            fprintf(stderr, "lnorm-bench: echo server: %s\n", err);
            status = 1;
            goto out;
        }
    }
    if (!echo_only && wl.params == LNORM__PARAMS_REGISTERED) {
        if (lnorm__params_setup(url, w, 0, err, sizeof err)) {
            fprintf(stderr, "lnorm-bench: registering params: %s\n", err);
            status = 1;
            goto out;
        }
        params_registered = 1;
    }

    for (int i = 0; i < npoints && !lnorm__interrupted; i++) {
        for (int tgt = 0; tgt < 2 && !lnorm__interrupted; tgt++) {
            if (tgt == 0 && echo_only)
                continue;
            if (tgt == 1 && !echo && !echo_only)
                continue;
            lnorm__runcfg cfg;
            memset(&cfg, 0, sizeof cfg);
            cfg.url = tgt ? echod.url : url;
            cfg.label = tgt ? "echo" : "lnormd";
            cfg.target = tgt ? LNORM__TARGET_ECHO : LNORM__TARGET_LNORMD;
            cfg.driver = tgt ? LNORM__DRV_RAW : driver;
            cfg.open_loop = open;
            cfg.concurrency = open ? max_inflight : (int)points[i];
            cfg.rate = open ? points[i] : 0;
            cfg.poisson = poisson;
            cfg.duration_s = duration;
            cfg.warmup_s = warmup;
            cfg.grace_s = grace;
            cfg.max_requests = max_requests;
            cfg.timeout_ms = timeout_ms;
            cfg.verify_n = tgt ? 0 : verify_n;
            cfg.progress = progress;
            cfg.chunk_bytes = (size_t)chunk;
            cfg.pipeline_depth = pipeline;
            cfg.server_pid = tgt ? (int)echod.pid : (spawn ? (int)lnormd.pid : 0);
            if (lnorm__run(&cfg, w, &runs[nruns]) != 0) {
                fprintf(stderr, "lnorm-bench: %s: %s\n", cfg.label, runs[nruns].error);
                status = 1;
            } else if (runs[nruns].errors) {
                if (status == 0)
                    status = 3;
            }
            nruns++;
        }
    }

out:
    if (params_registered && lnorm__params_setup(url, w, 1, err, sizeof err))
        fprintf(stderr, "lnorm-bench: dropping params: %s\n", err);
    lnorm__child_stop(&lnormd);
    lnorm__child_stop(&echod);
    if (nruns) {
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
        lnorm__report rp = {runs, nruns, date, device_name(), commit, host,
                            echo_only ? echod.url : url, mix_desc, cmdline, params_s,
                            wl.stats, wl.residual, duration, warmup, tags, ntags};
        lnorm__report_table(&rp, stdout);
        if (json && lnorm__report_json(&rp, json)) {
            fprintf(stderr, "lnorm-bench: cannot write %s\n", json);
            status = 1;
        }
        if (csv && lnorm__report_csv(&rp, csv)) {
            fprintf(stderr, "lnorm-bench: cannot write %s\n", csv);
            status = 1;
        }
        if (plot && lnorm__report_svg(&rp, plot)) {
            fprintf(stderr, "lnorm-bench: cannot write %s\n", plot);
            status = 1;
        }
    }
    lnorm__work_free(w);
    free(runs);
    return status;
}
