/*
 * lnorm: command-line client of lnormd.
 *
 *   lnorm normalize --in x.npy --out y.npy [options]
 *   lnorm backward --x x.npy --dy dy.npy --dx-out dx.npy [options]
 *   lnorm health | info | register | drop
 *
 * Exit status: 0 success, 1 the request failed, 2 bad usage or bad input.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backward.h"
#include "half.h"
#include "lnorm/lnorm.h"
#include "npy.h"
#include "progress.h"

#define DEFAULT_URL "tcp://127.0.0.1:7878" /* lnormd's default listen URL */

static const char *usage_main =
    "usage: lnorm COMMAND [options]\n"
    "\n"
    "Commands:\n"
    "  normalize   LayerNorm / RMSNorm a .npy tensor through lnormd\n"
    "  backward    the gradients dx, dgamma, dbeta of a LayerNorm / RMSNorm\n"
    "  health      ask whether the server is serving\n"
    "  info        print the server's version, backends, devices and limits\n"
    "  register    register gamma/beta under an id\n"
    "  drop        drop registered parameters\n"
    "\n"
    "Every command takes --url URL (repeatable; default $LNORM_URL or " DEFAULT_URL ")\n"
    "and --timeout-ms MS. 'lnorm COMMAND --help' describes a command.\n"
    "  --version   print the version\n";

static const char *usage_normalize =
    "usage: lnorm normalize --in x.npy --out y.npy [options]\n"
    "  --in FILE          input, .npy float32 ('<f4'), float16 ('<f2') or bfloat16 (ml_dtypes,\n"
    "                     saved by numpy as '<V2'), 1-D or 2-D; float64 with --convert-f64\n"
    "  --out FILE         output, .npy of the input's shape, in --out-dtype (bf16: '<V2';\n"
    "                     np.load(f).view(ml_dtypes.bfloat16))\n"
    "  --out-dtype T      f32, f16 or bf16 (default: the input's dtype)\n"
    "  --convert-f64      float64 .npy inputs are converted to float32 (else refused)\n"
    "  --op ln|rms        LayerNorm (default) or RMSNorm\n"
    "  --eps E            epsilon, > 0 (default 1e-5)\n"
    "  --eps-outside      rstd = 1/(sqrt(var)+eps) instead of 1/sqrt(var+eps)\n"
    "  --gamma FILE       1-D .npy of hidden elements\n"
    "  --beta FILE        1-D .npy of hidden elements\n"
    "  --params-id ID     use parameters registered under ID (not with --gamma/--beta)\n"
    "  --residual FILE    add this tensor (same shape/dtype) first; needs --residual-out\n"
    "  --residual-out F   where x + residual goes\n"
    "  --stats-out PREFIX write PREFIX.mean.npy (LayerNorm) and PREFIX.rstd.npy (f32)\n"
    "  --raw-bf16         --in/--out/--residual are raw little-endian bfloat16 files\n"
    "  --rows R --hidden H  the shape of raw bf16 input\n"
    "  --chunk-bytes N    client chunk size (default: the library's)\n"
    "  --priority P       batching priority level, 1..the server's priority-levels (0: its default)\n"
    "  --max-queue-us US  longest wait in the server's queue (0: the server's max-queue-wait-us)\n"
    "  --shm              through shared memory when lnormd is local (ipc:// URL) and allows it\n"
    "                     (allow-shm); otherwise over the socket as usual\n"
    "  --url URL, --timeout-ms MS\n"
    "A progress line goes to stderr when it is a terminal and the input is over 64 MiB.\n";

static const char *usage_register =
    "usage: lnorm register --id ID --gamma g.npy [--beta b.npy] [--convert-f64] [--url URL]\n"
    "  gamma and beta: 1-D .npy, float32, float16 or bfloat16 (mixed dtypes are sent as float32;\n"
    "  float64 with --convert-f64)\n";

static const char *usage_drop = "usage: lnorm drop --id ID [--url URL]\n";
static const char *usage_health = "usage: lnorm health [--url URL]\n";
static const char *usage_info = "usage: lnorm info [--url URL]\n";

/* Options common to every command. */
typedef struct common {
    const char *urls[16];
    size_t nurls;
    int timeout_ms;
} common;

static int die_usage(const char *msg, const char *usage)
{
    fprintf(stderr, "lnorm: %s\n%s", msg, usage);
    return 2;
}

/* A params id as lnormd takes it: 1..128 bytes of [A-Za-z0-9_.:-]. */
static int id_ok(const char *id)
{
    size_t n = strlen(id);
    if (n < 1 || n > 128)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)id[i]) && !strchr("_.:-", id[i]))
            return 0;
    return 1;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

static int add_url(common *cm, const char *u)
{
    if (cm->nurls >= 16)
        return -1;
    cm->urls[cm->nurls++] = u;
    return 0;
}

/* --shm: tensors through shared memory when lnormd is local (ipc://) and
 * allows it (lnorm_client_opts.auto_shm_bytes). */
static int g_shm;

static int open_client(common *cm, lnorm_client **c, size_t chunk_bytes)
{
    if (cm->nurls == 0) {
        const char *env = getenv("LNORM_URL");
        cm->urls[cm->nurls++] = env && *env ? env : DEFAULT_URL;
    }
    lnorm_client_opts o;
    lnorm_client_opts_init(&o);
    if (cm->timeout_ms) {
        o.recv_timeout_ms = cm->timeout_ms;
        o.send_timeout_ms = cm->timeout_ms;
    }
    if (chunk_bytes)
        o.chunk_bytes = chunk_bytes;
    if (g_shm)
        o.auto_shm_bytes = 1;
    int rv = lnorm_client_open(c, cm->urls, cm->nurls, &o);
    if (rv != LNORM_OK)
        fprintf(stderr, "lnorm: cannot open client for %s: %s\n", cm->urls[0], lnorm_strerror(rv));
    return rv;
}

static int report(const char *what, int rv, const lnorm_result *res)
{
    fprintf(stderr, "lnorm: %s failed: %s (%s)%s%s\n", what, lnorm_strerror(rv), lnorm_errname(rv),
            res->message[0] ? ": " : "", res->message);
    return 1;
}

enum {
    O_URL = 1000, O_TIMEOUT, O_IN, O_OUT, O_OP, O_EPS, O_EPS_OUT, O_GAMMA, O_BETA, O_PID,
    O_STATS, O_RAWBF16, O_ROWS, O_HIDDEN, O_RES, O_RESOUT, O_CHUNK, O_ID, O_HELP,
    O_PRIO, O_MAXQ,
    O_OUTDT, O_F64, O_SHM
};

static const struct option long_opts[] = {
    {"url", required_argument, 0, O_URL},       {"timeout-ms", required_argument, 0, O_TIMEOUT},
    {"in", required_argument, 0, O_IN},         {"out", required_argument, 0, O_OUT},
    {"op", required_argument, 0, O_OP},         {"eps", required_argument, 0, O_EPS},
    {"eps-outside", no_argument, 0, O_EPS_OUT}, {"gamma", required_argument, 0, O_GAMMA},
    {"beta", required_argument, 0, O_BETA},     {"params-id", required_argument, 0, O_PID},
    {"stats-out", required_argument, 0, O_STATS}, {"raw-bf16", no_argument, 0, O_RAWBF16},
    {"rows", required_argument, 0, O_ROWS},     {"hidden", required_argument, 0, O_HIDDEN},
    {"residual", required_argument, 0, O_RES},  {"residual-out", required_argument, 0, O_RESOUT},
    {"chunk-bytes", required_argument, 0, O_CHUNK}, {"id", required_argument, 0, O_ID},
    {"priority", required_argument, 0, O_PRIO}, {"max-queue-us", required_argument, 0, O_MAXQ},
    {"out-dtype", required_argument, 0, O_OUTDT}, {"convert-f64", no_argument, 0, O_F64},
    {"shm", no_argument, 0, O_SHM},
    {"help", no_argument, 0, O_HELP},           {0, 0, 0, 0}};

/* Everything the commands may be given. */
typedef struct args {
    common cm;
    const char *in, *out, *gamma, *beta, *params_id, *stats, *res, *resout, *id;
    int op, eps_outside, raw_bf16, help, eps_set;
    float eps;
    uint64_t rows, hidden, chunk, priority, max_queue_us;
    int out_dtype; /* 0: the input's */
} args;

/* --convert-f64: float64 .npy files are read as float32 (else refused). */
static int g_convert_f64;

/* Read a .npy file; float64 converted to float32 with --convert-f64, else
 * refused. 0, or -1 with err. */
static int read_npy(const char *path, lnorm__npy *a, char *err, size_t errlen)
{
    if (lnorm__npy_read(path, a, err, errlen) != 0)
        return -1;
    if (a->dtype != LNORM__NPY_F64)
        return 0;
    char why[200];
    if (!g_convert_f64)
        snprintf(err, errlen,
                 "%s: float64 is not supported by lnormd (f32, f16, bf16): --convert-f64 converts it to float32",
                 path);
    else if (lnorm__npy_to_f32(a, why, sizeof why) == 0)
        return 0;
    else
        snprintf(err, errlen, "%s: --convert-f64: %s", path, why);
    lnorm__npy_free(a);
    return -1;
}

/* --out-dtype: f32 / f16 / bf16 (or float32 / float16 / bfloat16); 0 else. */
static int parse_dtype(const char *s)
{
    if (!strcmp(s, "f32") || !strcmp(s, "float32"))
        return LNORM_DTYPE_F32;
    if (!strcmp(s, "f16") || !strcmp(s, "float16"))
        return LNORM_DTYPE_F16;
    if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16"))
        return LNORM_DTYPE_BF16;
    return 0;
}

/* --op: ln / layernorm or rms / rmsnorm; -1 for anything else. */
static int parse_op(const char *s)
{
    if (strcmp(s, "ln") == 0 || strcmp(s, "layernorm") == 0)
        return LNORM_OP_LAYERNORM;
    if (strcmp(s, "rms") == 0 || strcmp(s, "rmsnorm") == 0)
        return LNORM_OP_RMSNORM;
    return -1;
}

/* --eps: > 0 also as the float the server gets (1e-50 is 0 there). */
static int parse_eps(const char *s, float *out)
{
    char *end;
    errno = 0;
    double e = strtod(s, &end);
    if (errno || *end || !(e > 0) || !isfinite((float)e) || !((float)e > 0))
        return -1;
    *out = (float)e;
    return 0;
}

/* Parse argv for command cmd, allowing only the options in `allowed`. */
static int parse_args(int argc, char **argv, args *a, const int *allowed, const char *usage)
{
    memset(a, 0, sizeof *a);
    a->op = LNORM_OP_LAYERNORM;
    a->eps = LNORM_DEFAULT_EPS;
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, ":", long_opts, NULL)) != -1) {
        if (ch == '?' || ch == ':') {
            char msg[200];
            snprintf(msg, sizeof msg, "%s option '%s'", ch == ':' ? "missing value for" : "unknown",
                     argv[optind - 1]);
            return die_usage(msg, usage);
        }
        int ok = ch == O_HELP || ch == O_URL || ch == O_TIMEOUT;
        for (const int *p = allowed; *p; p++)
            ok |= *p == ch;
        if (!ok) {
            char msg[200];
            snprintf(msg, sizeof msg, "option '%s' does not apply to this command", argv[optind - 1]);
            return die_usage(msg, usage);
        }
        uint64_t v;
        switch (ch) {
        case O_HELP: a->help = 1; break;
        case O_URL:
            if (add_url(&a->cm, optarg))
                return die_usage("too many --url", usage);
            break;
        case O_TIMEOUT:
            if (parse_u64(optarg, &v) || v == 0 || v > 86400000)
                return die_usage("--timeout-ms must be 1..86400000", usage);
            a->cm.timeout_ms = (int)v;
            break;
        case O_IN: a->in = optarg; break;
        case O_OUT: a->out = optarg; break;
        case O_OP:
            if ((a->op = parse_op(optarg)) < 0)
                return die_usage("--op must be ln or rms", usage);
            break;
        case O_EPS:
            if (parse_eps(optarg, &a->eps))
                return die_usage("--eps must be a finite number > 0 (as a float)", usage);
            a->eps_set = 1;
            break;
        case O_EPS_OUT: a->eps_outside = 1; break;
        case O_GAMMA: a->gamma = optarg; break;
        case O_BETA: a->beta = optarg; break;
        case O_PID: a->params_id = optarg; break;
        case O_STATS: a->stats = optarg; break;
        case O_RAWBF16: a->raw_bf16 = 1; break;
        case O_ROWS:
            if (parse_u64(optarg, &a->rows) || a->rows == 0)
                return die_usage("--rows must be a positive integer", usage);
            break;
        case O_HIDDEN:
            if (parse_u64(optarg, &a->hidden) || a->hidden == 0)
                return die_usage("--hidden must be a positive integer", usage);
            break;
        case O_RES: a->res = optarg; break;
        case O_RESOUT: a->resout = optarg; break;
        case O_CHUNK:
            if (parse_u64(optarg, &a->chunk) || a->chunk == 0)
                return die_usage("--chunk-bytes must be a positive integer", usage);
            break;
        case O_ID: a->id = optarg; break;
        case O_PRIO:
            if (parse_u64(optarg, &a->priority) || a->priority > UINT32_MAX)
                return die_usage("--priority must be an integer 0..4294967295", usage);
            break;
        case O_MAXQ:
            if (parse_u64(optarg, &a->max_queue_us))
                return die_usage("--max-queue-us must be a non-negative integer", usage);
            break;
        case O_OUTDT:
            if (!(a->out_dtype = parse_dtype(optarg)))
                return die_usage("--out-dtype must be f32, f16 or bf16", usage);
            break;
        case O_F64: g_convert_f64 = 1; break;
        case O_SHM: g_shm = 1; break;
        }
    }
    if (optind < argc)
        return die_usage("unexpected argument", usage);
    return 0;
}

/* Load a 1-D parameter vector of hidden elements, as dtype want (F32 or
 * the file's own dtype if want is 0). */
static int load_param(const char *path, uint64_t hidden, int want, lnorm__npy *a)
{
    char err[300];
    if (read_npy(path, a, err, sizeof err) != 0) {
        fprintf(stderr, "lnorm: %s\n", err);
        return 2;
    }
    uint64_t n = a->shape[0] * (a->ndim == 2 ? a->shape[1] : 1);
    if (!(a->ndim == 1 || (a->ndim == 2 && a->shape[0] == 1)) || n != hidden) {
        fprintf(stderr, "lnorm: %s: expected a 1-D array of %llu elements\n", path,
                (unsigned long long)hidden);
        lnorm__npy_free(a);
        return 2;
    }
    if (want == LNORM_DTYPE_F32 && (a->dtype == LNORM_DTYPE_F16 || a->dtype == LNORM_DTYPE_BF16)) {
        float *f = malloc(n * sizeof *f);
        if (!f) {
            lnorm__npy_free(a);
            return 2;
        }
        const uint16_t *h = a->data;
        for (uint64_t i = 0; i < n; i++)
            f[i] = a->dtype == LNORM_DTYPE_F16 ? lnorm_f16_to_f32(h[i]) : lnorm_bf16_to_f32(h[i]);
        free(a->data);
        a->data = f;
        a->dtype = LNORM_DTYPE_F32;
        a->nbytes = n * 4;
    }
    return 0;
}

/* The checks of normalize's options that need no file: 0, or 2 after the
 * usage. */
static int normalize_args_check(const args *a)
{
    if (!a->in || !a->out)
        return die_usage("--in and --out are required", usage_normalize);
    if (a->params_id && (a->gamma || a->beta))
        return die_usage("--params-id excludes --gamma/--beta", usage_normalize);
    if (a->params_id && !id_ok(a->params_id))
        return die_usage("--params-id must be 1..128 characters of [A-Za-z0-9_.:-]", usage_normalize);
    /* Two outputs into one file would keep only the last written. */
    if (a->resout && !strcmp(a->resout, a->out))
        return die_usage("--out and --residual-out name the same file", usage_normalize);
    if (a->stats) {
        char sp[2][4096];
        snprintf(sp[0], sizeof sp[0], "%s.mean.npy", a->stats);
        snprintf(sp[1], sizeof sp[1], "%s.rstd.npy", a->stats);
        for (int k = 0; k < 2; k++)
            if (!strcmp(sp[k], a->out) || (a->resout && !strcmp(sp[k], a->resout)))
                return die_usage("--stats-out's files and --out / --residual-out name the same file",
                                 usage_normalize);
    }
    if (!a->res != !a->resout)
        return die_usage("--residual and --residual-out go together", usage_normalize);
    if (a->raw_bf16 != (a->rows && a->hidden) || (!a->raw_bf16 && (a->rows || a->hidden)))
        return die_usage("--raw-bf16 needs --rows and --hidden (and only it takes them)",
                         usage_normalize);
    /* the library's own bound; rows * hidden * 2 must not wrap */
    if (a->raw_bf16 && a->hidden > ((uint64_t)1 << 60) / a->rows)
        return die_usage("--rows x --hidden is too large", usage_normalize);
    return 0;
}

/* One normalize: its inputs as read, its outputs as received. */
typedef struct norm_job {
    lnorm__npy x, r, g, b;   /* .npy inputs: x, residual, gamma, beta */
    void *raw_x, *raw_r;     /* raw bf16 inputs */
    const void *xp, *rp;     /* x and the residual (NULL: none), either form */
    int dtype, ndim;
    int ydt;                 /* dtype of y */
    int pdt;                 /* dtype of gamma/beta (0: none given) */
    uint64_t rows, hidden, shape[2];
    void *y, *resout;
    float *mean, *rstd;
} norm_job;

static void norm_job_free(norm_job *j)
{
    lnorm__npy_free(&j->x);
    lnorm__npy_free(&j->r);
    lnorm__npy_free(&j->g);
    lnorm__npy_free(&j->b);
    free(j->raw_x);
    free(j->raw_r);
    free(j->y);
    free(j->resout);
    free(j->mean);
    free(j->rstd);
}

/* Read --in and --residual as raw bf16 of --rows x --hidden. 0 or 2. */
static int read_raw_inputs(const args *a, norm_job *j)
{
    char err[300];
    j->dtype = LNORM_DTYPE_BF16;
    j->rows = a->rows;
    j->hidden = a->hidden;
    j->ndim = 2;
    uint64_t n = j->rows * j->hidden * 2;
    if (lnorm__raw_read(a->in, n, &j->raw_x, err, sizeof err) != 0 ||
        (a->res && lnorm__raw_read(a->res, n, &j->raw_r, err, sizeof err) != 0)) {
        fprintf(stderr, "lnorm: %s\n", err);
        return 2;
    }
    j->xp = j->raw_x;
    j->rp = j->raw_r;
    return 0;
}

/* Read --in and --residual as .npy files of one shape and dtype. 0 or 2. */
static int read_npy_inputs(const args *a, norm_job *j)
{
    char err[300];
    lnorm__npy *x = &j->x, *r = &j->r;
    if (read_npy(a->in, x, err, sizeof err) != 0) {
        fprintf(stderr, "lnorm: %s\n", err);
        return 2;
    }
    j->dtype = x->dtype;
    j->ndim = x->ndim;
    j->rows = x->ndim == 2 ? x->shape[0] : 1;
    j->hidden = x->ndim == 2 ? x->shape[1] : x->shape[0];
    j->xp = x->data;
    if (!a->res)
        return 0;
    if (read_npy(a->res, r, err, sizeof err) != 0) {
        fprintf(stderr, "lnorm: %s\n", err);
        return 2;
    }
    if (r->dtype != x->dtype || r->ndim != x->ndim || r->shape[0] != x->shape[0] ||
        (x->ndim == 2 && r->shape[1] != x->shape[1])) {
        fprintf(stderr, "lnorm: %s: residual must have the shape and dtype of %s\n", a->res, a->in);
        return 2;
    }
    j->rp = r->data;
    return 0;
}

/* Read --gamma / --beta: in the dtype of x when both files have it, else
 * as f32. 0 or 2. */
static int read_params(const args *a, norm_job *j)
{
    if (!a->gamma && !a->beta)
        return 0;
    char err[300];
    lnorm__npy probe = {0};
    int all_x = 1;
    const char *files[2] = {a->gamma, a->beta};
    for (int k = 0; k < 2; k++) {
        if (!files[k])
            continue;
        if (read_npy(files[k], &probe, err, sizeof err) != 0) {
            fprintf(stderr, "lnorm: %s\n", err);
            return 2;
        }
        all_x &= probe.dtype == j->dtype;
        lnorm__npy_free(&probe);
    }
    j->pdt = all_x ? j->dtype : LNORM_DTYPE_F32;
    if ((a->gamma && load_param(a->gamma, j->hidden, j->pdt, &j->g)) ||
        (a->beta && load_param(a->beta, j->hidden, j->pdt, &j->b)))
        return 2;
    return 0;
}

/* Room for y, residual_out and the statistics. 0 or 2. */
static int alloc_outputs(const args *a, norm_job *j)
{
    size_t n = j->rows * j->hidden * lnorm_dtype_size(j->dtype);
    j->ydt = a->out_dtype ? a->out_dtype : j->dtype;
    j->y = malloc(j->rows * j->hidden * lnorm_dtype_size(j->ydt));
    if (a->res)
        j->resout = malloc(n);
    if (a->stats) {
        j->rstd = malloc(j->rows * sizeof *j->rstd);
        if (a->op == LNORM_OP_LAYERNORM)
            j->mean = malloc(j->rows * sizeof *j->mean);
    }
    if (!j->y || (a->res && !j->resout) ||
        (a->stats && (!j->rstd || (a->op == LNORM_OP_LAYERNORM && !j->mean)))) {
        fprintf(stderr, "lnorm: out of memory\n");
        return 2;
    }
    return 0;
}

/* Send the job through c. 0, or 1 after the failure is printed. */
static int run_normalize(const args *a, norm_job *j, lnorm_client *c)
{
    lnorm_normalize_req q;
    lnorm_normalize_req_init(&q, (lnorm_op)a->op, (lnorm_dtype)j->dtype, j->rows, j->hidden);
    q.y_dtype = (lnorm_dtype)j->ydt;
    q.eps = a->eps;
    q.eps_mode = a->eps_outside ? LNORM_EPS_OUTSIDE : LNORM_EPS_INSIDE;
    q.x = j->xp;
    q.residual = j->rp;
    q.residual_out = j->resout;
    q.param_dtype = (lnorm_dtype)(j->pdt ? j->pdt : j->dtype);
    q.gamma = j->g.data;
    q.beta = j->b.data;
    q.params_id = a->params_id;
    q.want_stats = a->stats != NULL;
    q.mean = j->mean;
    q.rstd = j->rstd;
    q.y = j->y;
    q.priority = (uint32_t)a->priority;
    q.max_queue_us = a->max_queue_us;
    /* With a progress line (a terminal, over 64 MiB), the rows go in steps
     * of about 1% (at least 8 MiB); else in one call. */
    const uint64_t xrow = j->hidden * lnorm_dtype_size(j->dtype), yrow = j->hidden * lnorm_dtype_size(j->ydt);
    lnorm__progress pg;
    lnorm__progress_start(&pg, "normalize", j->rows * xrow);
    uint64_t step = j->rows;
    if (pg.on) {
        uint64_t bytes = j->rows * xrow / 100 > (8u << 20) ? j->rows * xrow / 100 : (8u << 20);
        step = bytes / xrow ? bytes / xrow : 1;
    }
    lnorm_result res;
    int rv = LNORM_OK;
    for (uint64_t r0 = 0; r0 < j->rows && rv == LNORM_OK; r0 += step) {
        lnorm_normalize_req s = q;
        s.rows = j->rows - r0 < step ? j->rows - r0 : step;
        s.x = (const char *)q.x + r0 * xrow;
        s.residual = q.residual ? (const char *)q.residual + r0 * xrow : NULL;
        s.residual_out = q.residual_out ? (char *)q.residual_out + r0 * xrow : NULL;
        s.y = (char *)q.y + r0 * yrow;
        s.mean = q.mean ? q.mean + r0 : NULL;
        s.rstd = q.rstd ? q.rstd + r0 : NULL;
        rv = lnorm_normalize(c, &s, &res);
        if (rv == LNORM_OK)
            lnorm__progress_step(&pg, s.rows * xrow);
    }
    lnorm__progress_end(&pg);
    return rv == LNORM_OK ? 0 : report("normalize", rv, &res);
}

/* Write PREFIX.mean.npy (LayerNorm) and PREFIX.rstd.npy. 0 or -1 (err). */
static int write_stats(const args *a, const norm_job *j, char *err, size_t errlen)
{
    size_t plen = strlen(a->stats) + 16;
    char *p = malloc(plen);
    uint64_t sshape[1] = {j->rows};
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int werr = 0;
    if (j->mean) {
        snprintf(p, plen, "%s.mean.npy", a->stats);
        werr |= lnorm__npy_write(p, LNORM_DTYPE_F32, 1, sshape, j->mean, err, errlen);
    }
    snprintf(p, plen, "%s.rstd.npy", a->stats);
    if (!werr)
        werr |= lnorm__npy_write(p, LNORM_DTYPE_F32, 1, sshape, j->rstd, err, errlen);
    free(p);
    return werr;
}

/* Write y, residual_out and the statistics. 0, or 1 after the error. */
static int write_outputs(const args *a, const norm_job *j)
{
    char err[300];
    int werr = 0;
    if (a->raw_bf16) {
        uint64_t n = j->rows * j->hidden * 2;
        werr |= lnorm__raw_write(a->out, j->y, j->rows * j->hidden * lnorm_dtype_size(j->ydt), err, sizeof err);
        if (!werr && a->res)
            werr |= lnorm__raw_write(a->resout, j->resout, n, err, sizeof err);
    } else {
        werr |= lnorm__npy_write(a->out, j->ydt, j->ndim, j->shape, j->y, err, sizeof err);
        if (!werr && a->res)
            werr |= lnorm__npy_write(a->resout, j->dtype, j->ndim, j->shape, j->resout, err, sizeof err);
    }
    if (!werr && a->stats)
        werr |= write_stats(a, j, err, sizeof err);
    if (werr) {
        fprintf(stderr, "lnorm: %s\n", err);
        return 1;
    }
    return 0;
}

static int cmd_normalize(int argc, char **argv)
{
    static const int allowed[] = {O_IN, O_OUT, O_OP, O_EPS, O_EPS_OUT, O_GAMMA, O_BETA, O_PID,
                                  O_STATS, O_RAWBF16, O_ROWS, O_HIDDEN, O_RES, O_RESOUT, O_CHUNK,
                                  O_PRIO, O_MAXQ, O_OUTDT, O_F64, O_SHM, 0};
    args a;
    int status = parse_args(argc, argv, &a, allowed, usage_normalize);
    if (status)
        return status;
    if (a.help) {
        fputs(usage_normalize, stdout);
        return 0;
    }
    if ((status = normalize_args_check(&a)) != 0)
        return status;
    norm_job j;
    memset(&j, 0, sizeof j);
    lnorm_client *c = NULL;
    status = a.raw_bf16 ? read_raw_inputs(&a, &j) : read_npy_inputs(&a, &j);
    if (status == 0) {
        j.shape[0] = j.ndim == 2 ? j.rows : j.hidden;
        j.shape[1] = j.hidden;
        status = read_params(&a, &j);
    }
    if (status == 0)
        status = alloc_outputs(&a, &j);
    if (status == 0 && open_client(&a.cm, &c, a.chunk) != LNORM_OK)
        status = 2;
    if (status == 0)
        status = run_normalize(&a, &j, c);
    if (status == 0)
        status = write_outputs(&a, &j);
    lnorm_client_close(c);
    norm_job_free(&j);
    return status;
}

static int cmd_register(int argc, char **argv)
{
    static const int allowed[] = {O_ID, O_GAMMA, O_BETA, O_F64, 0};
    args a;
    int rv = parse_args(argc, argv, &a, allowed, usage_register);
    if (rv)
        return rv;
    if (a.help) {
        fputs(usage_register, stdout);
        return 0;
    }
    if (!a.id || (!a.gamma && !a.beta))
        return die_usage("--id and --gamma (or --beta) are required", usage_register);
    if (!id_ok(a.id))
        return die_usage("--id must be 1..128 characters of [A-Za-z0-9_.:-]", usage_register);
    char err[300];
    lnorm__npy g = {0}, b = {0};
    const char *first = a.gamma ? a.gamma : a.beta;
    if (read_npy(first, &g, err, sizeof err) != 0) {
        fprintf(stderr, "lnorm: %s\n", err);
        return 2;
    }
    uint64_t hidden = g.shape[0] * (g.ndim == 2 ? g.shape[1] : 1);
    int dt = g.dtype;
    lnorm__npy_free(&g);
    if (a.gamma && a.beta) {
        if (read_npy(a.beta, &b, err, sizeof err) != 0) {
            fprintf(stderr, "lnorm: %s\n", err);
            return 2;
        }
        if (b.dtype != dt)
            dt = LNORM_DTYPE_F32;
        lnorm__npy_free(&b);
    }
    int status = 2;
    lnorm_client *c = NULL;
    if ((a.gamma && load_param(a.gamma, hidden, dt, &g)) ||
        (a.beta && load_param(a.beta, hidden, dt, &b)))
        goto out;
    if (open_client(&a.cm, &c, 0) != LNORM_OK)
        goto out;
    lnorm_params_desc p = {a.id, (lnorm_dtype)dt, hidden, g.data, b.data};
    lnorm_result res;
    rv = lnorm_register_params(c, &p, &res);
    if (rv != LNORM_OK) {
        status = report("register", rv, &res);
        goto out;
    }
    printf("registered %s: %s, hidden %llu%s%s\n", a.id, lnorm_dtype_name(dt),
           (unsigned long long)hidden, g.data ? ", gamma" : "", b.data ? ", beta" : "");
    status = 0;
out:
    lnorm_client_close(c);
    lnorm__npy_free(&g);
    lnorm__npy_free(&b);
    return status;
}

static int cmd_drop(int argc, char **argv)
{
    static const int allowed[] = {O_ID, 0};
    args a;
    int rv = parse_args(argc, argv, &a, allowed, usage_drop);
    if (rv)
        return rv;
    if (a.help) {
        fputs(usage_drop, stdout);
        return 0;
    }
    if (!a.id)
        return die_usage("--id is required", usage_drop);
    if (!id_ok(a.id))
        return die_usage("--id must be 1..128 characters of [A-Za-z0-9_.:-]", usage_drop);
    lnorm_client *c;
    if (open_client(&a.cm, &c, 0) != LNORM_OK)
        return 1;
    lnorm_result res;
    rv = lnorm_drop_params(c, a.id, &res);
    lnorm_client_close(c);
    if (rv != LNORM_OK)
        return report("drop", rv, &res);
    printf("dropped %s\n", a.id);
    return 0;
}

static int cmd_health(int argc, char **argv)
{
    static const int allowed[] = {0};
    args a;
    int rv = parse_args(argc, argv, &a, allowed, usage_health);
    if (rv)
        return rv;
    if (a.help) {
        fputs(usage_health, stdout);
        return 0;
    }
    lnorm_client *c;
    if (open_client(&a.cm, &c, 0) != LNORM_OK)
        return 1;
    lnorm_result res;
    int serving = 0;
    rv = lnorm_health(c, &serving, &res);
    lnorm_client_close(c);
    if (rv != LNORM_OK)
        return report("health", rv, &res);
    printf("%s\n", serving ? "serving" : "not serving");
    return serving ? 0 : 1;
}

static int cmd_info(int argc, char **argv)
{
    static const int allowed[] = {0};
    args a;
    int rv = parse_args(argc, argv, &a, allowed, usage_info);
    if (rv)
        return rv;
    if (a.help) {
        fputs(usage_info, stdout);
        return 0;
    }
    lnorm_client *c;
    if (open_client(&a.cm, &c, 0) != LNORM_OK)
        return 1;
    lnorm_result res;
    lnorm_server_info in;
    rv = lnorm_info(c, &in, &res);
    lnorm_client_close(c);
    if (rv != LNORM_OK)
        return report("info", rv, &res);
    printf("version: %s\nbackends:", in.version);
    for (int i = 0; i < in.nbackends; i++)
        printf(" %s", in.backends[i]);
    printf("\n");
    for (int i = 0; i < in.ndevices; i++)
        printf("device %u: %s %s, %llu bytes\n", in.devices[i].index, in.devices[i].backend,
               in.devices[i].name, (unsigned long long)in.devices[i].memory_bytes);
    printf("max_message_bytes: %llu\nmax_rows: %llu\nmax_hidden: %llu\nmax_batch_rows: %llu\n"
           "max_batch_bytes: %llu\nmax_queue_requests: %llu\nmax_params_bytes: %llu\nmax_inflight_bytes: %llu\n",
           (unsigned long long)in.max_message_bytes, (unsigned long long)in.max_rows,
           (unsigned long long)in.max_hidden, (unsigned long long)in.max_batch_rows,
           (unsigned long long)in.max_batch_bytes, (unsigned long long)in.max_queue_requests,
           (unsigned long long)in.max_params_bytes, (unsigned long long)in.max_inflight_bytes);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return die_usage("no command", usage_main);
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage_main, stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("lnorm %s\n", lnorm_client_version());
        return 0;
    }
    argv[1] = argv[0];
    if (strcmp(cmd, "normalize") == 0)
        return cmd_normalize(argc - 1, argv + 1);
    if (strcmp(cmd, "backward") == 0)
        return lnorm__cmd_backward(argc - 1, argv + 1);
    if (strcmp(cmd, "register") == 0)
        return cmd_register(argc - 1, argv + 1);
    if (strcmp(cmd, "drop") == 0)
        return cmd_drop(argc - 1, argv + 1);
    if (strcmp(cmd, "health") == 0)
        return cmd_health(argc - 1, argv + 1);
    if (strcmp(cmd, "info") == 0)
        return cmd_info(argc - 1, argv + 1);
    fprintf(stderr, "lnorm: unknown command '%s'\n%s", cmd, usage_main);
    return 2;
}
