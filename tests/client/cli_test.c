/*
 * Round trips through the lnorm CLI against a real lnormd: .npy in, .npy
 * out (f32, f16, 1-D and 2-D), raw bf16, stats files, registered params,
 * health/info, and the exit codes and messages of bad input.
 *
 *   cli_test LNORMD_PATH LNORM_CLI_PATH
 */
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "check.h"
#include "testdaemon.h"
#include "lnorm/types.h"
#include "npy.h"
#include "testutil.h"

static td_daemon d;
static const char *cli;
static char out[8192];

/* Run the CLI with arguments; its stdout+stderr land in `out`. Returns the
 * exit status (or -1). */
static int run(const char *fmt, ...)
{
    char args[4096], cmd[8192], log[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(log, sizeof log, "%s/cli.log", d.dir);
    snprintf(cmd, sizeof cmd, "timeout 60 %s %s >%s 2>&1", cli, args, log);
    int st = system(cmd);
    out[0] = 0;
    FILE *fp = fopen(log, "r");
    if (fp) {
        size_t n = fread(out, 1, sizeof out - 1, fp);
        out[n] = 0;
        fclose(fp);
    }
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    printf("$ lnorm %s\n  -> %d %s", args, rc, out);
    if (out[0] && out[strlen(out) - 1] != '\n')
        printf("\n");
    return rc;
}

static void path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", d.dir, name);
}

static void write_npy(const char *name, int dtype, int ndim, uint64_t a, uint64_t b,
                      const void *data)
{
    char p[400], err[300];
    uint64_t shape[2] = {a, b};
    path(p, sizeof p, name);
    if (lnorm__npy_write(p, dtype, ndim, shape, data, err, sizeof err) != 0) {
        fprintf(stderr, "write %s: %s\n", p, err);
        exit(1);
    }
}

static int read_npy(const char *name, lnorm__npy *a)
{
    char p[400], err[300];
    path(p, sizeof p, name);
    if (lnorm__npy_read(p, a, err, sizeof err) != 0) {
        fprintf(stderr, "read: %s\n", err);
        return -1;
    }
    return 0;
}

static void *alloc_fill(lnorm_rng *g, int dtype, size_t n, double mean, double spread)
{
    void *p = malloc(n * lnorm_dtype_size(dtype));
    lnorm_test_fill(g, p, dtype, n, mean, spread);
    return p;
}

/* Check y (and stats) of one CLI run against the reference. */
static void check_run(const char *label, int op, int dt, int pdt, int64_t rows, int64_t hidden,
                      float eps, int eps_mode, const void *x, const void *res, const void *gamma,
                      const void *beta, const void *y, const void *res_out, float *mean,
                      float *rstd)
{
    lnorm_segment s;
    lnorm_segment_init(&s, (lnorm_op)op, (lnorm_dtype)dt, rows, hidden);
    s.param_dtype = pdt;
    s.eps = eps;
    s.eps_mode = eps_mode;
    s.x = x;
    s.residual = res;
    s.residual_out = (void *)res_out;
    s.gamma = gamma;
    s.beta = beta;
    s.y = (void *)y;
    s.mean = mean;
    s.rstd = rstd;
    long bad = lnorm_test_check_segment(&s, NULL, label);
    CHECK(bad == 0, "%s: %ld mismatches", label, bad);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s LNORMD LNORM_CLI\n", argv[0]);
        return 2;
    }
    cli = argv[2];
    const char *extra[] = {"--backend", "cpu", "--cpu-threads", "2", "--allow-shm", NULL};
    if (td_start(&d, argv[1], NULL, extra, TD_ENDPOINTS) != 0)
        return 1;
    const char *url = d.tcp_url;
    char dir[300];
    snprintf(dir, sizeof dir, "%s", d.dir);
    lnorm_rng g;
    lnorm_rng_seed(&g, 2026);

    /* A: f32 2-D LayerNorm, gamma + beta, stats */
    {
        int64_t R = 37, H = 300;
        float *x = alloc_fill(&g, LNORM_DTYPE_F32, (size_t)(R * H), 0.7, 2.0);
        float *gm = alloc_fill(&g, LNORM_DTYPE_F32, (size_t)H, 1.0, 0.3);
        float *bt = alloc_fill(&g, LNORM_DTYPE_F32, (size_t)H, 0.0, 0.5);
        write_npy("a_x.npy", LNORM_DTYPE_F32, 2, (uint64_t)R, (uint64_t)H, x);
        write_npy("a_g.npy", LNORM_DTYPE_F32, 1, (uint64_t)H, 0, gm);
        write_npy("a_b.npy", LNORM_DTYPE_F32, 1, (uint64_t)H, 0, bt);
        int rc = run("normalize --url %s --in %s/a_x.npy --out %s/a_y.npy --gamma %s/a_g.npy "
                     "--beta %s/a_b.npy --stats-out %s/a_st --eps 1e-4",
                     url, dir, dir, dir, dir, dir);
        CHECK(rc == 0, "A exit %d", rc);
        lnorm__npy y = {0}, m = {0}, s = {0};
        if (rc == 0 && read_npy("a_y.npy", &y) == 0 && read_npy("a_st.mean.npy", &m) == 0 &&
            read_npy("a_st.rstd.npy", &s) == 0) {
            CHECK(y.dtype == LNORM_DTYPE_F32 && y.ndim == 2 && y.shape[0] == (uint64_t)R &&
                      y.shape[1] == (uint64_t)H,
                  "A output shape");
            CHECK(m.ndim == 1 && m.shape[0] == (uint64_t)R && s.shape[0] == (uint64_t)R,
                  "A stats shape");
            check_run("cli A f32 ln", LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, LNORM_DTYPE_F32, R, H,
                      1e-4f, 0, x, NULL, gm, bt, y.data, NULL, m.data, s.data);
        } else {
            CHECK_FAIL("A outputs missing");
        }
        lnorm__npy_free(&y);
        lnorm__npy_free(&m);
        lnorm__npy_free(&s);
        /* A again with --shm over ipc: through a shared-memory region (lnormd
         * logs its registration), the same outputs. */
        CHECK(!td_log_contains(&d, "registered:"), "no region registered before --shm");
        rc = run("normalize --shm --url %s --in %s/a_x.npy --out %s/a_y_shm.npy --gamma %s/a_g.npy "
                 "--beta %s/a_b.npy --stats-out %s/a_sts --eps 1e-4",
                 d.ipc_url, dir, dir, dir, dir, dir);
        CHECK(rc == 0, "A --shm exit %d: %s", rc, out);
        if (rc == 0 && read_npy("a_y_shm.npy", &y) == 0 && read_npy("a_sts.mean.npy", &m) == 0 &&
            read_npy("a_sts.rstd.npy", &s) == 0) {
            check_run("cli A --shm", LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, LNORM_DTYPE_F32, R, H, 1e-4f, 0, x, NULL,
                      gm, bt, y.data, NULL, m.data, s.data);
        } else {
            CHECK_FAIL("A --shm outputs missing");
        }
        CHECK(td_wait_log(&d, "registered:", 2000), "--shm: lnormd registered a region");
        lnorm__npy_free(&y);
        lnorm__npy_free(&m);
        lnorm__npy_free(&s);
        free(x);
        free(gm);
        free(bt);
    }
    /* B: f16 1-D RMSNorm, eps outside, f16 gamma, rstd only */
    {
        int64_t H = 513;
        void *x = alloc_fill(&g, LNORM_DTYPE_F16, (size_t)H, 0.0, 1.5);
        void *gm = alloc_fill(&g, LNORM_DTYPE_F16, (size_t)H, 1.0, 0.2);
        write_npy("b_x.npy", LNORM_DTYPE_F16, 1, (uint64_t)H, 0, x);
        write_npy("b_g.npy", LNORM_DTYPE_F16, 1, (uint64_t)H, 0, gm);
        int rc = run("normalize --url %s --in %s/b_x.npy --out %s/b_y.npy --op rms --gamma "
                     "%s/b_g.npy --eps 1e-3 --eps-outside --stats-out %s/b_st",
                     d.ipc_url, dir, dir, dir, dir);
        CHECK(rc == 0, "B exit %d", rc);
        lnorm__npy y = {0}, s = {0};
        char mp[400];
        struct stat sb;
        path(mp, sizeof mp, "b_st.mean.npy");
        CHECK(stat(mp, &sb) != 0, "RMSNorm wrote a mean file");
        if (rc == 0 && read_npy("b_y.npy", &y) == 0 && read_npy("b_st.rstd.npy", &s) == 0) {
            CHECK(y.dtype == LNORM_DTYPE_F16 && y.ndim == 1 && y.shape[0] == (uint64_t)H,
                  "B output shape/dtype");
            check_run("cli B f16 rms", LNORM_OP_RMSNORM, LNORM_DTYPE_F16, LNORM_DTYPE_F16, 1, H,
                      1e-3f, 1, x, NULL, gm, NULL, y.data, NULL, NULL, s.data);
        } else {
            CHECK_FAIL("B outputs missing");
        }
        lnorm__npy_free(&y);
        lnorm__npy_free(&s);
        free(x);
        free(gm);
    }
    /* C: raw bf16 LayerNorm with residual, f32 gamma */
    {
        int64_t R = 5, H = 96;
        void *x = alloc_fill(&g, LNORM_DTYPE_BF16, (size_t)(R * H), 1.0, 1.0);
        void *r = alloc_fill(&g, LNORM_DTYPE_BF16, (size_t)(R * H), 0.0, 1.0);
        float *gm = alloc_fill(&g, LNORM_DTYPE_F32, (size_t)H, 1.0, 0.3);
        char p[400], err[300];
        path(p, sizeof p, "c_x.bf16");
        lnorm__raw_write(p, x, (size_t)(R * H * 2), err, sizeof err);
        path(p, sizeof p, "c_r.bf16");
        lnorm__raw_write(p, r, (size_t)(R * H * 2), err, sizeof err);
        write_npy("c_g.npy", LNORM_DTYPE_F32, 1, (uint64_t)H, 0, gm);
        int rc = run("normalize --url %s --raw-bf16 --rows 5 --hidden 96 --in %s/c_x.bf16 --out "
                     "%s/c_y.bf16 --residual %s/c_r.bf16 --residual-out %s/c_h.bf16 --gamma %s/c_g.npy",
                     url, dir, dir, dir, dir, dir);
        CHECK(rc == 0, "C exit %d", rc);
        void *y = NULL, *h = NULL;
        path(p, sizeof p, "c_y.bf16");
        int ok = rc == 0 && lnorm__raw_read(p, (size_t)(R * H * 2), &y, err, sizeof err) == 0;
        path(p, sizeof p, "c_h.bf16");
        ok = ok && lnorm__raw_read(p, (size_t)(R * H * 2), &h, err, sizeof err) == 0;
        CHECK(ok, "C outputs missing");
        if (ok)
            check_run("cli C bf16 ln residual", LNORM_OP_LAYERNORM, LNORM_DTYPE_BF16,
                      LNORM_DTYPE_F32, R, H, LNORM_DEFAULT_EPS, 0, x, r, gm, NULL, y, h, NULL,
                      NULL);
        free(y);
        free(h);
        free(x);
        free(r);
        free(gm);
    }
    /* D: register (f32 gamma + f16 beta -> sent as f32), use by id, drop */
    {
        int64_t R = 9, H = 128;
        float *x = alloc_fill(&g, LNORM_DTYPE_F32, (size_t)(R * H), 0.0, 1.0);
        float *gm = alloc_fill(&g, LNORM_DTYPE_F32, (size_t)H, 1.0, 0.3);
        void *bt16 = alloc_fill(&g, LNORM_DTYPE_F16, (size_t)H, 0.0, 0.5);
        float *bt = malloc((size_t)H * 4);
        for (int64_t i = 0; i < H; i++)
            bt[i] = (float)lnorm_test_get(bt16, LNORM_DTYPE_F16, (size_t)i);
        write_npy("d_x.npy", LNORM_DTYPE_F32, 2, (uint64_t)R, (uint64_t)H, x);
        write_npy("d_g.npy", LNORM_DTYPE_F32, 1, (uint64_t)H, 0, gm);
        write_npy("d_b.npy", LNORM_DTYPE_F16, 1, (uint64_t)H, 0, bt16);
        int rc = run("register --url %s --id cli.params-1 --gamma %s/d_g.npy --beta %s/d_b.npy",
                     url, dir, dir);
        CHECK(rc == 0 && strstr(out, "registered"), "register exit %d", rc);
        rc = run("register --url %s --id cli.params-1 --gamma %s/d_g.npy", url, dir);
        CHECK(rc == 1 && strstr(out, "LNORM_EEXIST"), "re-register exit %d", rc);
        rc = run("normalize --url %s --in %s/d_x.npy --out %s/d_y.npy --params-id cli.params-1",
                 url, dir, dir);
        CHECK(rc == 0, "normalize by id exit %d", rc);
        lnorm__npy y = {0};
        if (rc == 0 && read_npy("d_y.npy", &y) == 0)
            check_run("cli D params id", LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, LNORM_DTYPE_F32, R, H,
                      LNORM_DEFAULT_EPS, 0, x, NULL, gm, bt, y.data, NULL, NULL, NULL);
        lnorm__npy_free(&y);
        rc = run("drop --url %s --id cli.params-1", url);
        CHECK(rc == 0, "drop exit %d", rc);
        rc = run("normalize --url %s --in %s/d_x.npy --out %s/d_y2.npy --params-id cli.params-1",
                 url, dir, dir);
        CHECK(rc == 1 && strstr(out, "LNORM_ENOTFOUND"), "use after drop exit %d", rc);
        rc = run("drop --url %s --id cli.params-1", url);
        CHECK(rc == 1, "drop twice exit %d", rc);
        free(x);
        free(gm);
        free(bt16);
        free(bt);
    }
    /* E: health, info, help, and bad input */
    int rc = run("health --url %s", url);
    CHECK(rc == 0 && strstr(out, "serving"), "health exit %d", rc);
    rc = run("info --url %s", d.ipc_url);
    CHECK(rc == 0 && strstr(out, "version:") && strstr(out, "max_message_bytes:"), "info exit %d",
          rc);
    rc = run("--help");
    CHECK(rc == 0 && strstr(out, "normalize"), "--help exit %d", rc);
    rc = run("normalize --help");
    CHECK(rc == 0 && strstr(out, "--stats-out"), "normalize --help exit %d", rc);
    rc = run("--version");
    CHECK(rc == 0 && strstr(out, "lnorm "), "--version exit %d", rc);
    rc = run("frobnicate");
    CHECK(rc == 2 && strstr(out, "unknown command"), "unknown command exit %d", rc);
    rc = run("normalize --url %s --out %s/z.npy", url, dir);
    CHECK(rc == 2 && strstr(out, "--in"), "missing --in exit %d", rc);
    rc = run("normalize --url %s --in %s/nope.npy --out %s/z.npy", url, dir, dir);
    CHECK(rc == 2 && strstr(out, "No such file"), "missing file exit %d", rc);
    rc = run("normalize --url %s --in %s/a_x.npy --out %s/z.npy --eps -1", url, dir, dir);
    CHECK(rc == 2 && strstr(out, "eps"), "eps -1 exit %d", rc);
    rc = run("normalize --url %s --in %s/a_x.npy --out %s/z.npy --bogus", url, dir, dir);
    CHECK(rc == 2 && strstr(out, "unknown option"), "unknown option exit %d", rc);
    rc = run("normalize --url %s --in %s/a_x.npy --out %s/z.npy --eps 1e-50", url, dir, dir);
    CHECK(rc == 2 && strstr(out, "as a float"), "eps 1e-50 (0 as a float) exit %d", rc);
    rc = run("normalize --url %s --in %s/a_x.npy --out %s/z.npy --params-id 'bad id!'", url, dir, dir);
    CHECK(rc == 2 && strstr(out, "--params-id must be"), "bad params id exit %d", rc);
    rc = run("drop --url %s --id 'a b'", url);
    CHECK(rc == 2 && strstr(out, "--id must be"), "drop: bad id exit %d", rc);
    /* --priority and --max-queue-us reach lnormd (1 priority level) */
    rc = run("normalize --url %s --in %s/a_x.npy --out %s/z.npy --priority 1 --max-queue-us 5000000", url, dir, dir);
    CHECK(rc == 0, "--priority 1 --max-queue-us 5000000 exit %d: %s", rc, out);
    rc = run("normalize --url %s --in %s/a_x.npy --out %s/z.npy --priority 2", url, dir, dir);
    CHECK(rc == 1 && strstr(out, "normalize.priority: 2 is out of range"), "--priority 2 of 1 exit %d: %s", rc, out);
    rc = run("normalize --url %s --in %s/a_x.npy --out %s/z.npy --priority -1", url, dir, dir);
    CHECK(rc == 2 && strstr(out, "--priority must be"), "--priority -1 exit %d", rc);
    rc = run("normalize --url %s --raw-bf16 --rows 4611686018427387905 --hidden 4 --in %s/a_x.npy --out %s/z.bf16",
             url, dir, dir);
    CHECK(rc == 2 && strstr(out, "too large"), "raw bf16 rows x hidden wrapping exit %d", rc);
    rc = run("normalize --url %s --in %s/a_x.npy --out %s/z.npy --residual %s/a_x.npy --residual-out %s/z.npy", url,
             dir, dir, dir, dir);
    CHECK(rc == 2 && strstr(out, "same file"), "--out = --residual-out exit %d", rc);
    rc = run("normalize --url %s --in %s/a_x.npy --out %s/s.rstd.npy --stats-out %s/s", url, dir, dir, dir);
    CHECK(rc == 2 && strstr(out, "same file"), "--out = a stats file exit %d", rc);
    {
        /* a float64 .npy, a Fortran-order one, a 3-D one, a truncated one;
         * headers numpy reads otherwise or refuses: a key twice, a key
         * hidden in a string, a word that starts with False, a key missing;
         * last, a valid header in double quotes (numpy's reader takes it) */
        char p[400];
        const char *hdrs[] = {"{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
                              "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 1), }",
                              "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 2), }",
                              "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }",
                              "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), 'shape': (4,), }",
                              "{'x': \"'shape': (4,)\", 'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }",
                              "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (4,), }",
                              "{'descr': '<f4', 'shape': (4,), }",
                              "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (4,)}"};
        const char *want[] = {"not supported", "Fortran",       "1-D and 2-D",         "does not match",
                              "twice",         "unexpected key", "malformed 'fortran_order'", "no 'fortran_order'",
                              NULL};
        for (int k = 0; k < 9; k++) {
            snprintf(p, sizeof p, "%s/bad%d.npy", dir, k);
            FILE *fp = fopen(p, "wb");
            char h[128];
            size_t hl = strlen(hdrs[k]);
            memset(h, ' ', sizeof h);
            memcpy(h, hdrs[k], hl);
            h[117] = '\n';
            fwrite("\x93NUMPY\x01\x00\x76\x00", 1, 10, fp);
            fwrite(h, 1, 118, fp);
            float v[4] = {0.5f, -1.25f, 2.0f, 0.75f}; /* the valid file's result is checked */
            fwrite(v, 1, 16 - (k == 3 ? 4 : 0) * 2, fp);
            fclose(fp);
            rc = run("normalize --url %s --in %s --out %s/z.npy", url, p, dir);
            if (want[k])
                CHECK(rc == 2 && strstr(out, want[k]), "bad npy %d exit %d: %s", k, rc, out);
            else {
                CHECK(rc == 0, "double-quoted npy header exit %d: %s", rc, out);
                /* LayerNorm of v (eps 1e-5) against float64 */
                lnorm__npy zy = {0};
                double mu = (0.5 - 1.25 + 2.0 + 0.75) / 4, var = 0;
                for (int e = 0; e < 4; e++)
                    var += (v[e] - mu) * (v[e] - mu) / 4;
                if (rc == 0 && read_npy("z.npy", &zy) == 0) {
                    CHECK(zy.dtype == LNORM_DTYPE_F32 && zy.ndim == 1 && zy.shape[0] == 4, "valid npy: y shape");
                    for (int e = 0; e < 4 && zy.ndim == 1 && zy.shape[0] == 4; e++) {
                        double want_y = (v[e] - mu) / sqrt(var + 1e-5);
                        CHECK(fabs(((const float *)zy.data)[e] - want_y) < 1e-5, "valid npy: y[%d] %g, want %g", e,
                              ((const float *)zy.data)[e], want_y);
                    }
                }
                lnorm__npy_free(&zy);
            }
        }
    }
    /* Nobody listening: said at once (a synchronous dial), whatever the timeout. */
    int64_t t0 = td_now_ms();
    rc = run("health --url ipc://%s/nobody.sock --timeout-ms 10000", dir);
    int64_t dt = td_now_ms() - t0;
    CHECK(rc == 1 && strstr(out, "LNORM_EUNAVAIL") && strstr(out, "no lnormd is listening at ipc://"),
          "health on no server: exit %d: %s", rc, out);
    CHECK(dt < 1000, "health on no server took %lld ms, want < 1 s", (long long)dt);

    td_stop_check(&d, "on SIGTERM");
    return check_finish("client.cli");
}
