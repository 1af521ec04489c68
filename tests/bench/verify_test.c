/* bench.verify: lnorm-bench's f64 reference check accepts what the CPU
 * backend (lnorm_cpu_run_segment) computes for every op/dtype/option, and
 * rejects outputs with one element, one statistic or one residual_out
 * element changed; the same for the backward ops (lnorm_cpu_run_bwd: dx,
 * dgamma, dbeta). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "half.h"
#include "lnorm_core.h"
#include "work.h"

/* Change element i of a dtype buffer by a clearly visible amount. */
static void bump(void *p, int dt, size_t i)
{
    if (dt == LNORM_DTYPE_F32) {
        float f;
        memcpy(&f, (char *)p + 4 * i, 4);
        f += 0.05f + 0.05f * (f < 0 ? -f : f);
        memcpy((char *)p + 4 * i, &f, 4);
    } else {
        uint16_t h;
        memcpy(&h, (char *)p + 2 * i, 2);
        float f = dt == LNORM_DTYPE_F16 ? lnorm_f16_to_f32(h) : lnorm_bf16_to_f32(h);
        f += 0.1f + 0.1f * (f < 0 ? -f : f);
        h = dt == LNORM_DTYPE_F16 ? lnorm_f32_to_f16(f) : lnorm_f32_to_bf16(f);
        memcpy((char *)p + 2 * i, &h, 2);
    }
}

static void one(const char *mix, int params, int stats, int residual)
{
    lnorm__mix_shape def = {LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, LNORM_DTYPE_NONE, 1, 64, 1};
    lnorm__wl wl;
    memset(&wl, 0, sizeof wl);
    char err[256];
    if (lnorm__mix_parse(mix, &def, &wl.mix, err, sizeof err)) {
        CHECK_FAIL("mix %s: %s", mix, err);
        return;
    }
    wl.params = params;
    wl.stats = stats;
    wl.residual = residual;
    wl.eps = 1e-5f;
    wl.variants = 2;
    wl.seed = 7;
    lnorm__work *w;
    if (lnorm__work_build(&wl, "t", &w)) {
        CHECK_FAIL("build");
        return;
    }
    for (size_t i = 0; i < w->nt; i++) {
        const lnorm__tmpl *t = &w->t[i];
        int ln = t->sh.op == LNORM_OP_LAYERNORM;
        void *y = calloc(1, t->y_bytes), *ro = residual ? calloc(1, t->x_bytes) : NULL;
        float *mean = calloc(t->sh.rows, 4), *rstd = calloc(t->sh.rows, 4);
        lnorm_segment s;
        lnorm_segment_init(&s, (lnorm_op)t->sh.op, (lnorm_dtype)t->sh.x_dtype, (int64_t)t->sh.rows,
                           (int64_t)t->sh.hidden);
        s.y_dtype = t->sh.y_dtype;
        s.eps = wl.eps;
        s.x = t->x;
        s.y = y;
        if (residual) {
            s.residual = t->residual;
            s.residual_out = ro;
        }
        if (params) {
            s.param_dtype = LNORM_DTYPE_F32;
            s.gamma = t->gamma;
            s.beta = t->beta;
        }
        if (stats) {
            s.rstd = rstd;
            s.mean = ln ? mean : NULL;
        }
        const char *why = NULL;
        int rc = lnorm_cpu_run_segment(NULL, &s, &why);
        CHECK(rc == LNORM_OK, "%s: cpu run: %s", mix, why ? why : "?");
        size_t sb = stats ? t->sh.rows * 4 : 0;
        char msg[200];
        int v = lnorm__verify(w, t, y, t->y_bytes, ln ? mean : NULL, ln ? sb : 0, rstd, sb, ro,
                              residual ? t->x_bytes : 0, msg, sizeof msg);
        CHECK(v == 0, "%s params=%d stats=%d residual=%d: CPU output rejected: %s", mix, params,
              stats, residual, msg);
        /* one changed element of y */
        size_t n = t->sh.rows * t->sh.hidden, k = n / 2;
        bump(y, t->sh.y_dtype, k);
        CHECK(lnorm__verify(w, t, y, t->y_bytes, ln ? mean : NULL, ln ? sb : 0, rstd, sb, ro,
                            residual ? t->x_bytes : 0, msg, sizeof msg) != 0,
              "%s: changed y accepted", mix);
        bump(y, t->sh.y_dtype, k); /* leave it wrong; restore by recomputing */
        lnorm_cpu_run_segment(NULL, &s, &why);
        if (stats) {
            rstd[t->sh.rows - 1] *= 1.01f;
            CHECK(lnorm__verify(w, t, y, t->y_bytes, ln ? mean : NULL, ln ? sb : 0, rstd, sb, ro,
                                residual ? t->x_bytes : 0, msg, sizeof msg) != 0,
                  "%s: changed rstd accepted", mix);
            lnorm_cpu_run_segment(NULL, &s, &why);
        }
        if (residual) {
            bump(ro, t->sh.x_dtype, 0);
            CHECK(lnorm__verify(w, t, y, t->y_bytes, ln ? mean : NULL, ln ? sb : 0, rstd, sb, ro,
                                t->x_bytes, msg, sizeof msg) != 0,
                  "%s: changed residual_out accepted", mix);
        }
        CHECK(lnorm__verify(w, t, y, t->y_bytes - 1, NULL, 0, NULL, 0, NULL, 0, msg, sizeof msg) != 0,
              "%s: short y accepted", mix);
        free(y);
        free(ro);
        free(mean);
        free(rstd);
    }
    lnorm__work_free(w);
}

static void one_bwd(const char *mix, int params, int residual)
{
    lnorm__mix_shape def = {LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, LNORM_DTYPE_NONE, 1, 64, 1};
    lnorm__wl wl;
    memset(&wl, 0, sizeof wl);
    char err[256];
    if (lnorm__mix_parse(mix, &def, &wl.mix, err, sizeof err)) {
        CHECK_FAIL("mix %s: %s", mix, err);
        return;
    }
    wl.params = params;
    wl.residual = residual;
    wl.eps = 1e-5f;
    wl.variants = 2;
    wl.seed = 9;
    lnorm__work *w;
    if (lnorm__work_build(&wl, "t", &w)) {
        CHECK_FAIL("build");
        return;
    }
    for (size_t i = 0; i < w->nt; i++) {
        const lnorm__tmpl *t = &w->t[i];
        const size_t H = t->sh.hidden;
        void *dx = calloc(1, t->y_bytes);
        float *dg = calloc(H, 4), *db = calloc(H, 4);
        lnorm_bwd_segment s;
        lnorm_bwd_segment_init(&s, (lnorm_op)LNORM__OP_BASE(t->sh.op), (lnorm_dtype)t->sh.x_dtype,
                               (int64_t)t->sh.rows, (int64_t)H);
        s.dx_dtype = t->sh.y_dtype;
        s.eps = wl.eps;
        s.x = t->x;
        s.dy = t->dy;
        s.dx = dx;
        s.dres = residual ? t->residual : NULL;
        if (params) {
            s.param_dtype = LNORM_DTYPE_F32;
            s.gamma = t->gamma;
        }
        s.dgamma = dg;
        s.dbeta = db;
        lnorm_bwd_batch b = {&s, 1};
        lnorm_cpu *cpu = NULL;
        CHECK(lnorm_cpu_create(&cpu, 1) == LNORM_OK && lnorm_cpu_run_bwd(cpu, &b, NULL) == LNORM_OK, "%s: cpu run",
              mix);
        char msg[200];
        CHECK(lnorm__verify(w, t, dx, t->y_bytes, dg, H * 4, db, H * 4, NULL, 0, msg, sizeof msg) == 0,
              "%s params=%d residual=%d: CPU backward rejected: %s", mix, params, residual, msg);
        size_t k = t->sh.rows * H / 2;
        bump(dx, t->sh.y_dtype, k);
        CHECK(lnorm__verify(w, t, dx, t->y_bytes, dg, H * 4, db, H * 4, NULL, 0, msg, sizeof msg) != 0,
              "%s: changed dx accepted", mix);
        bump(dx, t->sh.y_dtype, k);
        lnorm_cpu_run_bwd(cpu, &b, NULL);
        dg[H - 1] += 0.01f * (1.0f + (dg[H - 1] < 0 ? -dg[H - 1] : dg[H - 1]));
        CHECK(lnorm__verify(w, t, dx, t->y_bytes, dg, H * 4, db, H * 4, NULL, 0, msg, sizeof msg) != 0,
              "%s: changed dgamma accepted", mix);
        lnorm_cpu_run_bwd(cpu, &b, NULL);
        db[0] += 0.01f * (1.0f + (db[0] < 0 ? -db[0] : db[0]));
        CHECK(lnorm__verify(w, t, dx, t->y_bytes, dg, H * 4, db, H * 4, NULL, 0, msg, sizeof msg) != 0,
              "%s: changed dbeta accepted", mix);
        CHECK(lnorm__verify(w, t, dx, t->y_bytes, dg, H * 4 - 4, db, H * 4, NULL, 0, msg, sizeof msg) != 0,
              "%s: short dgamma accepted", mix);
        lnorm_cpu_destroy(cpu);
        free(dx);
        free(dg);
        free(db);
    }
    lnorm__work_free(w);
}

int main(void)
{
    static const char *bmixes[] = {"3x1024:f32:ln-bwd", "3x1024:f32:rms-bwd", "2x4096:bf16:ln-bwd",
                                   "4x768:f16:rms-bwd:out=f32", "5x33:bf16:ln-bwd:out=f16", "1x100000:f32:rms-bwd"};
    for (size_t i = 0; i < sizeof(bmixes) / sizeof(bmixes[0]); i++)
        for (int p = 0; p <= 1; p++)
            for (int res = 0; res <= 1; res++)
                one_bwd(bmixes[i], p, res);
    static const char *mixes[] = {"3x1024:f32:ln", "3x1024:f32:rms", "2x4096:bf16:ln",
                                  "2x4096:bf16:rms", "4x768:f16:ln", "4x768:f16:rms:out=f32",
                                  "2x512:f32:ln:out=bf16", "1x100000:f32:ln", "5x33:bf16:ln:out=f16"};
    for (size_t i = 0; i < sizeof(mixes) / sizeof(mixes[0]); i++)
        for (int p = 0; p <= 1; p++)
            for (int st = 0; st <= 1; st++)
                for (int res = 0; res <= 1; res++)
                    one(mixes[i], p, st, res);
    return check_finish("bench.verify");
}
