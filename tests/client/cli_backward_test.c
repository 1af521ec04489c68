/*
 * lnorm backward against a real lnormd: .npy in (x, dy, gamma, mean/rstd,
 * dres; f32 and f16), .npy out (dx, dgamma, dbeta) checked against the
 * float64 reference of tests/common/testbwd.h; exit codes and messages of
 * bad usage and bad input.
 *
 *   cli_backward_test LNORMD_PATH LNORM_CLI_PATH
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "check.h"
#include "npy.h"
#include "testbwd.h"
#include "testdaemon.h"
#include "testutil.h"

static td_daemon d;
static const char *cli;
static char out[8192];

static int run(const char *fmt, ...)
{
    char args[4096], cmd[8192], log[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(log, sizeof log, "%s/cli.log", d.dir);
    snprintf(cmd, sizeof cmd, "cd %s && timeout 60 %s %s --url %s >%s 2>&1", d.dir, cli, args, d.ipc_url, log);
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
    return rc;
}

static void put(const char *name, int dtype, int ndim, uint64_t a, uint64_t b, const void *data)
{
    char p[400], err[300];
    uint64_t shape[2] = {a, b};
    snprintf(p, sizeof p, "%s/%s", d.dir, name);
    if (lnorm__npy_write(p, dtype, ndim, shape, data, err, sizeof err) != 0)
        CHECK_FAIL("write %s: %s", p, err);
}

static int get(const char *name, lnorm__npy *a)
{
    char p[400], err[300];
    snprintf(p, sizeof p, "%s/%s", d.dir, name);
    int rc = lnorm__npy_read(p, a, err, sizeof err);
    CHECK(rc == 0, "read %s: %s", name, err);
    return rc;
}

/* One round trip of a case through the CLI; its outputs checked. */
static void round_trip(lnorm_test_bwd_case *tc, const char *extra, const char *label)
{
    lnorm_bwd_segment *s = &tc->seg;
    const uint64_t R = (uint64_t)s->rows, H = (uint64_t)s->hidden;
    put("x.npy", s->x_dtype, 2, R, H, s->x);
    put("dy.npy", s->dy_dtype, 2, R, H, s->dy);
    char opt[1024] = "";
    size_t n = 0;
    if (s->gamma) {
        put("g.npy", s->param_dtype, 1, H, 0, s->gamma);
        n += (size_t)snprintf(opt + n, sizeof opt - n, " --gamma g.npy");
    }
    if (s->dres) {
        put("dres.npy", s->x_dtype, 2, R, H, s->dres);
        n += (size_t)snprintf(opt + n, sizeof opt - n, " --dres dres.npy");
    }
    if (s->rstd) {
        put("rstd.npy", LNORM_DTYPE_F32, 1, R, 0, s->rstd);
        n += (size_t)snprintf(opt + n, sizeof opt - n, " --rstd rstd.npy");
    }
    if (s->mean) {
        put("mean.npy", LNORM_DTYPE_F32, 1, R, 0, s->mean);
        n += (size_t)snprintf(opt + n, sizeof opt - n, " --mean mean.npy");
    }
    int rc = run("backward --x x.npy --dy dy.npy --dx-out dx.npy --dgamma-out dg.npy --dbeta-out db.npy "
                 "--op %s --eps %.9g%s%s %s",
                 s->op == LNORM_OP_LAYERNORM ? "ln" : "rms", (double)s->eps,
                 s->eps_mode == LNORM_EPS_OUTSIDE ? " --eps-outside" : "", opt, extra);
    CHECK(rc == 0, "%s: exit %d", label, rc);
    lnorm__npy dx = {0}, dg = {0}, db = {0};
    if (rc == 0 && !get("dx.npy", &dx) && !get("dg.npy", &dg) && !get("db.npy", &db)) {
        CHECK(dx.dtype == s->x_dtype && dx.ndim == 2 && dx.shape[0] == R && dx.shape[1] == H, "%s: dx shape", label);
        CHECK(dg.dtype == LNORM_DTYPE_F32 && dg.ndim == 1 && dg.shape[0] == H, "%s: dgamma shape", label);
        CHECK(db.dtype == LNORM_DTYPE_F32 && db.ndim == 1 && db.shape[0] == H, "%s: dbeta shape", label);
        if (dx.nbytes == tc->dx_bytes && dg.nbytes == H * 4 && db.nbytes == H * 4) {
            memcpy(tc->dx, dx.data, dx.nbytes);
            memcpy(tc->dgamma, dg.data, H * 4);
            memcpy(tc->dbeta, db.data, H * 4);
            CHECK(lnorm_test_bwd_check(s, 0, label) == 0, "%s: results vs reference", label);
        }
    }
    lnorm__npy_free(&dx);
    lnorm__npy_free(&dg);
    lnorm__npy_free(&db);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s LNORMD_PATH LNORM_CLI_PATH\n", argv[0]);
        return 2;
    }
    cli = argv[2];
    const char *args[] = {"--backend", "cpu", "--cpu-threads", "2", NULL};
    if (td_start(&d, argv[1], NULL, args, TD_ENDPOINTS) != 0)
        return 1;
    lnorm_rng g;
    lnorm_rng_seed(&g, lnorm_test_seed(0xC11));
    const int dts[2] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16};
    for (int k = 0; k < 6; k++) {
        lnorm_test_bwd_cfg c = {.op = 1 + k % 2, .x_dtype = dts[k % 2], .dy_dtype = dts[(k / 2) % 2],
                                .dx_dtype = 0, .rows = 3 + k, .hidden = k < 3 ? 96 : 1000, .gamma = k != 2,
                                .dres = k % 3 == 1, .stats = k >= 3, .dgamma = 1, .dbeta = 1, .eps_mode = k == 4,
                                .eps = k == 5 ? 1e-3f : 0.0f};
        lnorm_test_bwd_case tc;
        if (lnorm_test_bwd_make(&tc, &c, &g, NULL)) {
            CHECK_FAIL("make");
            break;
        }
        round_trip(&tc, k == 3 ? "--chunk-bytes 4096" : "", "cli backward");
        lnorm_test_bwd_free(&tc);
    }
    /* Bad usage and bad input: exit 2 with a message naming the problem. */
    float v[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    put("a.npy", LNORM_DTYPE_F32, 2, 3, 4, v);
    put("b.npy", LNORM_DTYPE_F32, 2, 4, 3, v);
    put("v3.npy", LNORM_DTYPE_F32, 1, 3, 0, v);
    struct {
        const char *args, *word;
    } bad[] = {
        {"backward --dy a.npy --dx-out o.npy", "--x and --dy"},
        {"backward --x a.npy --dy a.npy", "no output"},
        {"backward --x a.npy --dy b.npy --dx-out o.npy", "shape"},
        {"backward --x a.npy --dy a.npy --dx-out o.npy --gamma v3.npy", "4 elements"},
        {"backward --x a.npy --dy a.npy --dx-out o.npy --mean v3.npy", "LayerNorm"},
        {"backward --x a.npy --dy a.npy --dx-out o.npy --op rms --rstd v3.npy --mean v3.npy", "RMSNorm"},
        {"backward --x a.npy --dy a.npy --dx-out o.npy --op foo", "--op"},
        {"backward --x a.npy --dy a.npy --dx-out o.npy --eps -1", "--eps"},
        {"backward --x a.npy --dy a.npy --dx-out o.npy --dgamma-out o.npy", "same file"},
        {"backward --x missing.npy --dy a.npy --dx-out o.npy", "missing.npy"},
        {"backward --x a.npy --dy a.npy --dx-out o.npy --bogus", "unknown option"},
    };
    /* Refused by lnormd: exit 1 with its message. */
    int rc = run("backward --x a.npy --dy a.npy --dx-out o.npy --params-id nobody");
    CHECK(rc == 1 && strstr(out, "nobody"), "unknown params id: exit %d", rc);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = run("%s", bad[i].args);
        CHECK(rc == 2, "'%s': exit %d, want 2", bad[i].args, rc);
        CHECK(strstr(out, bad[i].word) != NULL, "'%s': message lacks '%s'", bad[i].args, bad[i].word);
    }
    td_stop_check(&d, "on SIGTERM");
    return check_finish("client.cli_backward");
}
