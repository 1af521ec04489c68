/*
 * lnorm backward: the gradients of a LayerNorm / RMSNorm through lnormd,
 * from .npy files (x, dy and optionally gamma, mean, rstd, dres) to .npy
 * files (dx, dgamma, dbeta).
 */
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

const char *const lnorm__usage_backward =
    "usage: lnorm backward --x x.npy --dy dy.npy --dx-out dx.npy [options]\n"
    "  --x FILE           what the forward normalized (x + residual when it fused one), .npy\n"
    "                     float32 or float16, 1-D or 2-D\n"
    "  --dy FILE          the gradient of the forward's output: x's shape, float32 or float16\n"
    "  --dx-out FILE      dx (x's dtype); with --dres, the gradient of x and of the residual\n"
    "  --dgamma-out FILE  dgamma, 1-D float32\n"
    "  --dbeta-out FILE   dbeta, 1-D float32\n"
    "                     (at least one of the three outputs)\n"
    "  --op ln|rms        LayerNorm (default) or RMSNorm\n"
    "  --eps E, --eps-outside  the forward's eps and its placement\n"
    "  --gamma FILE       1-D .npy of hidden elements (or --params-id ID)\n"
    "  --params-id ID     gamma of parameters registered under ID\n"
    "  --mean FILE, --rstd FILE  the forward's statistics, 1-D float32 of rows elements\n"
    "                     (LayerNorm: both or neither; RMSNorm: --rstd only); recomputed if absent\n"
    "  --dres FILE        the gradient that reached the forward's residual_out (x's shape and dtype)\n"
    "  --chunk-bytes N    client chunk size (x and dy per request)\n"
    "  --url URL (repeatable), --timeout-ms MS\n";

enum { B_URL = 1, B_TIMEOUT, B_X, B_DY, B_DX, B_DG, B_DB, B_OP, B_EPS, B_EPS_OUT, B_GAMMA, B_PID, B_MEAN, B_RSTD,
       B_DRES, B_CHUNK, B_HELP };

static const struct option opts[] = {
    {"url", required_argument, 0, B_URL},          {"timeout-ms", required_argument, 0, B_TIMEOUT},
    {"x", required_argument, 0, B_X},              {"dy", required_argument, 0, B_DY},
    {"dx-out", required_argument, 0, B_DX},        {"dgamma-out", required_argument, 0, B_DG},
    {"dbeta-out", required_argument, 0, B_DB},     {"op", required_argument, 0, B_OP},
    {"eps", required_argument, 0, B_EPS},          {"eps-outside", no_argument, 0, B_EPS_OUT},
    {"gamma", required_argument, 0, B_GAMMA},      {"params-id", required_argument, 0, B_PID},
    {"mean", required_argument, 0, B_MEAN},        {"rstd", required_argument, 0, B_RSTD},
    {"dres", required_argument, 0, B_DRES},        {"chunk-bytes", required_argument, 0, B_CHUNK},
    {"help", no_argument, 0, B_HELP},              {0, 0, 0, 0}};

static int usage(const char *msg)
{
    fprintf(stderr, "lnorm: %s\n%s", msg, lnorm__usage_backward);
    return 2;
}

static int read_npy(const char *path, lnorm__npy *a)
{
    char err[300];
    if (lnorm__npy_read(path, a, err, sizeof err) != 0) {
        fprintf(stderr, "lnorm: %s\n", err);
        return 2;
    }
    return 0;
}

/* The elements of a 1-D (or 1 x n) array, or 0 when it is not one. */
static uint64_t vec_len(const lnorm__npy *a)
{
    if (a->ndim == 1)
        return a->shape[0];
    return a->shape[0] == 1 ? a->shape[1] : 0;
}

/* An f16 array converted to f32 in place. 0, or 2 when out of memory. */
static int to_f32(lnorm__npy *a, uint64_t n)
{
    if (a->dtype == LNORM_DTYPE_F32)
        return 0;
    float *f = malloc(n * sizeof *f);
    if (!f)
        return 2;
    const uint16_t *h = a->data;
    for (uint64_t i = 0; i < n; i++)
        f[i] = lnorm_f16_to_f32(h[i]);
    free(a->data);
    a->data = f;
    a->dtype = LNORM_DTYPE_F32;
    a->nbytes = n * 4;
    return 0;
}

int lnorm__cmd_backward(int argc, char **argv)
{
    const char *urls[16], *fx = NULL, *fdy = NULL, *fdx = NULL, *fdg = NULL, *fdb = NULL, *fg = NULL, *pid = NULL;
    const char *fm = NULL, *fr = NULL, *fdres = NULL;
    size_t nurls = 0, chunk = 0;
    int op = LNORM_OP_LAYERNORM, outside = 0, timeout_ms = 0;
    float eps = LNORM_DEFAULT_EPS;
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        char *end;
        switch (ch) {
        case B_URL:
            if (nurls == 16)
                return usage("too many --url");
            urls[nurls++] = optarg;
            break;
        case B_TIMEOUT: {
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno || *end || v < 1 || v > 86400000)
                return usage("--timeout-ms must be 1..86400000");
            timeout_ms = (int)v;
            break;
        }
        case B_X: fx = optarg; break;
        case B_DY: fdy = optarg; break;
        case B_DX: fdx = optarg; break;
        case B_DG: fdg = optarg; break;
        case B_DB: fdb = optarg; break;
        case B_OP:
            if (!strcmp(optarg, "ln") || !strcmp(optarg, "layernorm"))
                op = LNORM_OP_LAYERNORM;
            else if (!strcmp(optarg, "rms") || !strcmp(optarg, "rmsnorm"))
                op = LNORM_OP_RMSNORM;
            else
                return usage("--op must be ln or rms");
            break;
        case B_EPS: {
            errno = 0;
            double e = strtod(optarg, &end);
            if (errno || *end || !((float)e > 0) || !isfinite((float)e))
                return usage("--eps must be a finite number > 0 (as a float)");
            eps = (float)e;
            break;
        }
        case B_EPS_OUT: outside = 1; break;
        case B_GAMMA: fg = optarg; break;
        case B_PID: pid = optarg; break;
        case B_MEAN: fm = optarg; break;
        case B_RSTD: fr = optarg; break;
        case B_DRES: fdres = optarg; break;
        case B_CHUNK: {
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (errno || *end || v == 0 || optarg[0] == '-')
                return usage("--chunk-bytes must be a positive integer");
            chunk = (size_t)v;
            break;
        }
        case B_HELP: fputs(lnorm__usage_backward, stdout); return 0;
        default: {
            char msg[200];
            snprintf(msg, sizeof msg, "%s option '%s'", ch == ':' ? "missing value for" : "unknown", argv[optind - 1]);
            return usage(msg);
        }
        }
    }
    if (optind < argc)
        return usage("unexpected argument");
    if (!fx || !fdy)
        return usage("--x and --dy are required");
    if (!fdx && !fdg && !fdb)
        return usage("no output: give --dx-out, --dgamma-out or --dbeta-out");
    if (fg && pid)
        return usage("--params-id excludes --gamma");
    const char *outs[3] = {fdx, fdg, fdb};
    for (int i = 0; i < 3; i++)
        for (int k = i + 1; k < 3; k++)
            if (outs[i] && outs[k] && !strcmp(outs[i], outs[k]))
                return usage("two outputs name the same file");

    lnorm__npy x = {0}, dy = {0}, g = {0}, m = {0}, r = {0}, dres = {0};
    void *dx = NULL;
    float *dgamma = NULL, *dbeta = NULL;
    lnorm_client *c = NULL;
    int rc = 2;
    if (read_npy(fx, &x) || read_npy(fdy, &dy))
        goto out;
    const uint64_t rows = x.ndim == 2 ? x.shape[0] : 1, hidden = x.ndim == 2 ? x.shape[1] : x.shape[0];
    if (dy.ndim != x.ndim || dy.shape[0] != x.shape[0] || (x.ndim == 2 && dy.shape[1] != x.shape[1])) {
        fprintf(stderr, "lnorm: %s: dy must have the shape of %s\n", fdy, fx);
        goto out;
    }
    if (fdres) {
        if (read_npy(fdres, &dres))
            goto out;
        if (dres.dtype != x.dtype || dres.nbytes != x.nbytes) {
            fprintf(stderr, "lnorm: %s: dres must have the shape and dtype of %s\n", fdres, fx);
            goto out;
        }
    }
    if (fg) {
        if (read_npy(fg, &g))
            goto out;
        if (vec_len(&g) != hidden) {
            fprintf(stderr, "lnorm: %s: expected a 1-D array of %llu elements\n", fg, (unsigned long long)hidden);
            goto out;
        }
        if (g.dtype != x.dtype && to_f32(&g, hidden))
            goto out;
    }
    const char *sf[2] = {fm, fr};
    lnorm__npy *sa[2] = {&m, &r};
    for (int k = 0; k < 2; k++) {
        if (!sf[k])
            continue;
        if (read_npy(sf[k], sa[k]))
            goto out;
        if (sa[k]->dtype != LNORM_DTYPE_F32 || vec_len(sa[k]) != rows) {
            fprintf(stderr, "lnorm: %s: expected a 1-D float32 array of %llu elements\n", sf[k],
                    (unsigned long long)rows);
            goto out;
        }
    }
    if ((fdx && !(dx = malloc(x.nbytes))) || (fdg && !(dgamma = malloc(hidden * 4))) ||
        (fdb && !(dbeta = malloc(hidden * 4)))) {
        fprintf(stderr, "lnorm: out of memory\n");
        goto out;
    }
    if (nurls == 0) {
        const char *env = getenv("LNORM_URL");
        urls[nurls++] = env && *env ? env : "tcp://127.0.0.1:7878";
    }
    lnorm_client_opts o;
    lnorm_client_opts_init(&o);
    if (timeout_ms)
        o.recv_timeout_ms = o.send_timeout_ms = timeout_ms;
    int rv = lnorm_client_open(&c, urls, nurls, &o);
    if (rv != LNORM_OK) {
        fprintf(stderr, "lnorm: cannot open client for %s: %s\n", urls[0], lnorm_strerror(rv));
        rc = 1;
        goto out;
    }
    lnorm_normalize_backward_req q;
    lnorm_normalize_backward_req_init(&q, (lnorm_op)op, (lnorm_dtype)x.dtype, rows, hidden);
    q.dy_dtype = (lnorm_dtype)dy.dtype;
    q.eps = eps;
    q.eps_mode = outside ? LNORM_EPS_OUTSIDE : LNORM_EPS_INSIDE;
    q.x = x.data;
    q.dy = dy.data;
    q.dres = fdres ? dres.data : NULL;
    q.gamma = fg ? g.data : NULL;
    q.param_dtype = fg ? (lnorm_dtype)g.dtype : LNORM_DTYPE_NONE;
    q.params_id = pid;
    q.mean = fm ? m.data : NULL;
    q.rstd = fr ? r.data : NULL;
    q.dx = dx;
    q.dgamma = dgamma;
    q.dbeta = dbeta;
    q.chunk_bytes = chunk;
    lnorm_result res;
    rv = lnorm_normalize_backward(c, &q, &res);
    if (rv != LNORM_OK) {
        fprintf(stderr, "lnorm: backward failed: %s (%s)%s%s\n", lnorm_strerror(rv), lnorm_errname(rv),
                res.message[0] ? ": " : "", res.message);
        rc = rv == LNORM_EINVAL && res.status == -1 ? 2 : 1;
        goto out;
    }
    char err[300];
    uint64_t vshape[1] = {hidden};
    if ((fdx && lnorm__npy_write(fdx, x.dtype, x.ndim, x.shape, dx, err, sizeof err)) ||
        (fdg && lnorm__npy_write(fdg, LNORM_DTYPE_F32, 1, vshape, dgamma, err, sizeof err)) ||
        (fdb && lnorm__npy_write(fdb, LNORM_DTYPE_F32, 1, vshape, dbeta, err, sizeof err))) {
        fprintf(stderr, "lnorm: %s\n", err);
        rc = 1;
        goto out;
    }
    rc = 0;
out:
    lnorm_client_close(c);
    lnorm__npy_free(&x);
    lnorm__npy_free(&dy);
    lnorm__npy_free(&g);
    lnorm__npy_free(&m);
    lnorm__npy_free(&r);
    lnorm__npy_free(&dres);
    free(dx);
    free(dgamma);
    free(dbeta);
    return rc;
}
