/*
 * The lnorm CLI's dtypes and progress line, against a real lnormd:
 *  - --out-dtype f16 / bf16 from f32 input, checked against the float64
 *    reference in the output dtype;
 *  - bfloat16 .npy as numpy saves an ml_dtypes.bfloat16 array ('<V2'): the
 *    writer's header is byte for byte numpy's, numpy's file reads as bf16,
 *    and a bf16 .npy normalizes to a bf16 .npy;
 *  - float64 input refused without --convert-f64 (saying so), converted
 *    with it (checked against the reference of x rounded to f32), refused
 *    when an element is beyond float32's range;
 *  - a progress line on stderr when it is a terminal (a pty) and the input
 *    is over 64 MiB, none when it is a file; the results equal.
 *
 *   cli_dtype_test LNORMD_PATH LNORM_CLI_PATH
 */
#include <math.h>
#include <fcntl.h>
#include <pty.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "half.h"
#include "lnorm/types.h"
#include "npy.h"
#include "testdaemon.h"
#include "testutil.h"

static td_daemon d;
static const char *cli;
static char out[16384];

/* Run the CLI (stdout + stderr to a file, read into out); exit status. */
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
    printf("$ lnorm %s\n  -> %d %s%s", args, rc, out, out[0] && out[strlen(out) - 1] != '\n' ? "\n" : "");
    return rc;
}

/* Run the CLI with stderr on a pseudo-terminal (stdout to /dev/null); what
 * the terminal got goes into out. Exit status. */
static int run_tty(char *const argv[])
{
    int m, s;
    out[0] = 0;
    if (openpty(&m, &s, NULL, NULL, NULL) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(m);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(s, 2);
        execv(cli, argv);
        _exit(127);
    }
    close(s);
    size_t n = 0;
    for (;;) {
        ssize_t r = read(m, out + n, sizeof out - 1 - n);
        if (r <= 0)
            break; /* EIO once the child has closed its side */
        n += (size_t)r;
        if (n == sizeof out - 1)
            n = 0; /* keep the tail */
    }
    out[n] = 0;
    close(m);
    int st;
    waitpid(pid, &st, 0);
    printf("$ lnorm (stderr a terminal) ... -> %d, %zu bytes on the terminal, ending '%s'\n",
           WIFEXITED(st) ? WEXITSTATUS(st) : -1, n, n > 120 ? out + n - 120 : out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", d.dir, name);
}

static void write_npy(const char *name, int dtype, uint64_t rows, uint64_t hidden, const void *data)
{
    char p[400], err[300];
    uint64_t shape[2] = {rows, hidden};
    path(p, sizeof p, name);
    if (lnorm__npy_write(p, dtype, 2, shape, data, err, sizeof err) != 0) {
        fprintf(stderr, "write %s: %s\n", p, err);
        exit(1);
    }
}

/* A float64 .npy, written the way numpy does. */
static void write_f64(const char *name, uint64_t rows, uint64_t hidden, const double *x)
{
    char p[400], dict[128];
    path(p, sizeof p, name);
    int dn = snprintf(dict, sizeof dict, "{'descr': '<f8', 'fortran_order': False, 'shape': (%llu, %llu), }",
                      (unsigned long long)rows, (unsigned long long)hidden);
    size_t total = (10 + (size_t)dn + 1 + 63) / 64 * 64, hl = total - 10;
    FILE *f = fopen(p, "wb");
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)hl, (unsigned char)(hl >> 8)};
    fwrite(pre, 1, 10, f);
    fwrite(dict, 1, (size_t)dn, f);
    for (size_t i = 10 + (size_t)dn; i < total - 1; i++)
        fputc(' ', f);
    fputc('\n', f);
    fwrite(x, sizeof *x, rows * hidden, f);
    fclose(f);
}

static int read_out(const char *name, lnorm__npy *a)
{
    char p[400], err[300];
    path(p, sizeof p, name);
    if (lnorm__npy_read(p, a, err, sizeof err) != 0) {
        CHECK_FAIL("read %s: %s", name, err);
        return -1;
    }
    return 0;
}

/* y (of y_dtype) against the reference of x (LayerNorm, eps 1e-5, no affine). */
static void check_y(const char *label, int xdt, int ydt, uint64_t rows, uint64_t hidden, const void *x,
                    const lnorm__npy *y)
{
    CHECK(y->dtype == ydt && y->ndim == 2 && y->shape[0] == rows && y->shape[1] == hidden,
          "%s: output dtype %d shape %llu x %llu, expected %d %llu x %llu", label, y->dtype,
          (unsigned long long)y->shape[0], (unsigned long long)y->shape[1], ydt, (unsigned long long)rows,
          (unsigned long long)hidden);
    if (y->dtype != ydt || y->shape[0] != rows)
        return;
    lnorm_segment s;
    lnorm_segment_init(&s, LNORM_OP_LAYERNORM, (lnorm_dtype)xdt, (int64_t)rows, (int64_t)hidden);
    s.y_dtype = ydt;
    s.x = x;
    s.y = y->data;
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
    td_watchdog(110);
    const char *extra[] = {"--backend", "cpu", "--cpu-threads", "2", NULL};
    if (td_start(&d, argv[1], NULL, extra, TD_ENDPOINTS) != 0)
        return 1;
    const char *url = d.ipc_url, *dir = d.dir;
    lnorm_rng g;
    lnorm_rng_seed(&g, lnorm_test_seed(2028));

    /* --out-dtype from f32. */
    {
        const uint64_t R = 33, H = 257;
        float *x = malloc(R * H * 4);
        lnorm_test_fill(&g, x, LNORM_DTYPE_F32, R * H, 0.3, 2.0);
        write_npy("o_x.npy", LNORM_DTYPE_F32, R, H, x);
        const struct {
            const char *name;
            int dt;
        } outs[] = {{"bf16", LNORM_DTYPE_BF16}, {"f16", LNORM_DTYPE_F16}, {"f32", LNORM_DTYPE_F32}};
        for (size_t i = 0; i < 3; i++) {
            char label[64], file[32];
            snprintf(label, sizeof label, "--out-dtype %s", outs[i].name);
            snprintf(file, sizeof file, "o_y_%s.npy", outs[i].name);
            int rc = run("normalize --url %s --in %s/o_x.npy --out %s/%s --out-dtype %s", url, dir, dir, file,
                         outs[i].name);
            CHECK(rc == 0, "%s: exit %d", label, rc);
            lnorm__npy y;
            if (rc == 0 && read_out(file, &y) == 0) {
                check_y(label, LNORM_DTYPE_F32, outs[i].dt, R, H, x, &y);
                lnorm__npy_free(&y);
            }
        }
        int rc = run("normalize --url %s --in %s/o_x.npy --out %s/o_y.npy --out-dtype f64", url, dir, dir);
        CHECK(rc == 2 && strstr(out, "--out-dtype must be f32, f16 or bf16"), "--out-dtype f64: exit %d", rc);
        free(x);
    }

    /* bfloat16 .npy as numpy saves ml_dtypes.bfloat16: np.save of
     * np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16)
     * (numpy 2.4, ml_dtypes 0.7) writes exactly these bytes. */
    {
        static const char hdr[] = "\x93NUMPY\x01\x00v\x00{'descr': '<V2', 'fortran_order': False, 'shape': (2, 3), }";
        unsigned char file[128 + 12];
        memset(file, ' ', 128);
        memcpy(file, hdr, sizeof hdr - 1);
        file[127] = '\n';
        static const uint16_t vals[6] = {0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0}; /* 0..5 */
        memcpy(file + 128, vals, 12);
        char p[400];
        path(p, sizeof p, "np_bf16.npy");
        FILE *f = fopen(p, "wb");
        fwrite(file, 1, sizeof file, f);
        fclose(f);
        lnorm__npy a;
        char err[300];
        int rc = lnorm__npy_read(p, &a, err, sizeof err);
        CHECK(rc == 0 && a.dtype == LNORM_DTYPE_BF16 && a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3 &&
                  !memcmp(a.data, vals, 12),
              "numpy's bf16 file: %d %s", rc, rc ? err : "");
        if (rc == 0)
            lnorm__npy_free(&a);
        /* our writer: the same bytes */
        uint64_t shape[2] = {2, 3};
        path(p, sizeof p, "our_bf16.npy");
        rc = lnorm__npy_write(p, LNORM_DTYPE_BF16, 2, shape, vals, err, sizeof err);
        unsigned char back[sizeof file + 1];
        f = fopen(p, "rb");
        size_t n = f ? fread(back, 1, sizeof back, f) : 0;
        if (f)
            fclose(f);
        CHECK(rc == 0 && n == sizeof file && !memcmp(back, file, sizeof file),
              "the bf16 .npy written is not numpy's (%zu bytes)", n);

        /* bf16 in, bf16 out (the input's dtype), through lnormd */
        const uint64_t R = 16, H = 512;
        uint16_t *x = malloc(R * H * 2);
        lnorm_test_fill(&g, x, LNORM_DTYPE_BF16, R * H, -0.2, 1.5);
        write_npy("b_x.npy", LNORM_DTYPE_BF16, R, H, x);
        rc = run("normalize --url %s --in %s/b_x.npy --out %s/b_y.npy", url, dir, dir);
        CHECK(rc == 0, "bf16 .npy: exit %d", rc);
        lnorm__npy y;
        if (rc == 0 && read_out("b_y.npy", &y) == 0) {
            check_y("bf16 .npy", LNORM_DTYPE_BF16, LNORM_DTYPE_BF16, R, H, x, &y);
            lnorm__npy_free(&y);
        }
        free(x);
    }

    /* float64 input. */
    {
        const uint64_t R = 9, H = 300;
        double *x = malloc(R * H * 8);
        float *xf = malloc(R * H * 4);
        lnorm_test_fill(&g, xf, LNORM_DTYPE_F32, R * H, 1.0, 3.0);
        for (uint64_t i = 0; i < R * H; i++) {
            x[i] = (double)xf[i] + ldexp((double)xf[i], -30); /* not a float32: rounding is needed */
            xf[i] = (float)x[i];
        }
        write_f64("f_x.npy", R, H, x);
        int rc = run("normalize --url %s --in %s/f_x.npy --out %s/f_y.npy", url, dir, dir);
        CHECK(rc == 2 && strstr(out, "float64") && strstr(out, "--convert-f64"),
              "float64 without --convert-f64: exit %d", rc);
        rc = run("normalize --url %s --in %s/f_x.npy --out %s/f_y.npy --convert-f64", url, dir, dir);
        CHECK(rc == 0, "--convert-f64: exit %d", rc);
        lnorm__npy y;
        if (rc == 0 && read_out("f_y.npy", &y) == 0) {
            check_y("--convert-f64", LNORM_DTYPE_F32, LNORM_DTYPE_F32, R, H, xf, &y);
            lnorm__npy_free(&y);
        }
        x[5] = 1e300;
        write_f64("f_big.npy", R, H, x);
        rc = run("normalize --url %s --in %s/f_big.npy --out %s/f_y2.npy --convert-f64", url, dir, dir);
        CHECK(rc == 2 && strstr(out, "beyond float32's range"), "float64 1e300: exit %d", rc);
        free(x);
        free(xf);
    }

    /* The progress line. */
    {
        const uint64_t R = 18432, H = 1024; /* 72 MiB of f32 */
        float *x = malloc(R * H * 4);
        lnorm_test_fill(&g, x, LNORM_DTYPE_F32, R * H, 0.0, 1.0);
        write_npy("p_x.npy", LNORM_DTYPE_F32, R, H, x);
        char in[400], o1[400];
        path(in, sizeof in, "p_x.npy");
        path(o1, sizeof o1, "p_y_tty.npy");
        char *av[] = {"lnorm", "normalize", "--url", (char *)url, "--in", in, "--out", o1, NULL};
        int rc = run_tty(av);
        CHECK(rc == 0 && strstr(out, "lnorm: normalize") && strstr(out, "100% (72 of 72 MiB"),
              "no progress line on a terminal: exit %d", rc);
        rc = run("normalize --url %s --in %s --out %s/p_y_file.npy", url, in, dir);
        CHECK(rc == 0 && !strstr(out, "MiB/s"), "a progress line into a file: exit %d", rc);
        lnorm__npy y1, y2;
        if (read_out("p_y_tty.npy", &y1) == 0) {
            check_y("progress", LNORM_DTYPE_F32, LNORM_DTYPE_F32, R, H, x, &y1);
            if (read_out("p_y_file.npy", &y2) == 0) {
                CHECK(y1.nbytes == y2.nbytes && !memcmp(y1.data, y2.data, y1.nbytes),
                      "in steps and in one call, y differs");
                lnorm__npy_free(&y2);
            }
            lnorm__npy_free(&y1);
        }
        free(x);
    }

    td_stop_check(&d, "on SIGTERM");
    return check_finish("client.cli_dtypes");
}
