/* The backward's case builder, float64 reference and checker (testbwd.h). */
#include "testbwd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_RTOL 4e-6

static double worst;

double lnorm_test_bwd_worst(void)
{
    double w = worst;
    worst = 0.0;
    return w;
}

void lnorm_test_bwd_free(lnorm_test_bwd_case *tc)
{
    free(tc->x);
    free(tc->dy);
    free(tc->dx);
    free(tc->dres);
    free(tc->gamma);
    free(tc->mean);
    free(tc->rstd);
    free(tc->dgamma);
    free(tc->dbeta);
    memset(tc, 0, sizeof *tc);
}

void lnorm_test_bwd_repoison(lnorm_test_bwd_case *tc)
{
    lnorm_test_poison(tc->dx, tc->dx_bytes);
    if (tc->dgamma)
        lnorm_test_poison(tc->dgamma, (size_t)tc->seg.hidden * sizeof(float));
    if (tc->dbeta)
        lnorm_test_poison(tc->dbeta, (size_t)tc->seg.hidden * sizeof(float));
}

long lnorm_test_bwd_pad_writes(const lnorm_test_bwd_case *tc)
{
    const lnorm_bwd_segment *s = &tc->seg;
    const size_t esz = lnorm_dtype_size(s->dx_dtype);
    const unsigned char *p = tc->dx;
    long bad = 0;
    for (int64_t r = 0; r < s->rows; r++)
        for (int64_t c = s->hidden; c < s->dx_stride; c++)
            for (size_t b = 0; b < esz; b++)
                bad += p[(size_t)(r * s->dx_stride + c) * esz + b] != 0xFF;
    return bad;
}

int lnorm_test_bwd_make(lnorm_test_bwd_case *tc, const lnorm_test_bwd_cfg *c, lnorm_rng *g, const lnorm_cpu *cpu)
{
    memset(tc, 0, sizeof *tc);
    lnorm_bwd_segment *s = &tc->seg;
    lnorm_bwd_segment_init(s, (lnorm_op)c->op, (lnorm_dtype)c->x_dtype, c->rows, c->hidden);
    if (c->dy_dtype)
        s->dy_dtype = c->dy_dtype;
    if (c->dx_dtype)
        s->dx_dtype = c->dx_dtype;
    if (c->param_dtype)
        s->param_dtype = c->param_dtype;
    s->eps_mode = c->eps_mode;
    if (c->eps != 0.0f)
        s->eps = c->eps;
    const int64_t stride = c->hidden + c->pad;
    s->x_stride = s->dy_stride = s->dx_stride = s->dres_stride = stride;
    const size_t n = (size_t)(c->rows * stride), H = (size_t)c->hidden, R = (size_t)c->rows;
    const size_t xsz = lnorm_dtype_size(s->x_dtype);
    tc->dx_bytes = n * lnorm_dtype_size(s->dx_dtype);
    int ok = (tc->x = malloc(n * xsz)) && (tc->dy = malloc(n * lnorm_dtype_size(s->dy_dtype))) &&
             (tc->dx = malloc(tc->dx_bytes));
    if (ok && c->dres)
        ok = (tc->dres = malloc(n * xsz)) != NULL;
    if (ok && c->gamma)
        ok = (tc->gamma = malloc(H * lnorm_dtype_size(s->param_dtype))) != NULL;
    if (ok && c->stats) {
        ok = (tc->rstd = malloc(R * sizeof(float))) != NULL;
        if (ok && c->op == LNORM_OP_LAYERNORM)
            ok = (tc->mean = malloc(R * sizeof(float))) != NULL;
    }
    if (ok && c->dgamma)
        ok = (tc->dgamma = malloc(H * sizeof(float))) != NULL;
    if (ok && c->dbeta)
        ok = (tc->dbeta = malloc(H * sizeof(float))) != NULL;
    void *y = NULL;
    if (ok && c->stats)
        ok = (y = malloc(n * xsz)) != NULL;
    if (!ok) {
        free(y);
        lnorm_test_bwd_free(tc);
        return LNORM_ENOMEM;
    }
    lnorm_test_fill(g, tc->x, s->x_dtype, n, c->x_mean, c->x_spread != 0.0 ? c->x_spread : 1.0);
    lnorm_test_fill(g, tc->dy, s->dy_dtype, n, 0.0, c->dy_spread != 0.0 ? c->dy_spread : 1.0);
    if (tc->dres)
        lnorm_test_fill(g, tc->dres, s->x_dtype, n, 0.0, 1.0);
    if (tc->gamma)
        lnorm_test_fill(g, tc->gamma, s->param_dtype, H, 1.0, 0.5);
    s->x = tc->x;
    s->dy = tc->dy;
    s->dx = tc->dx;
    s->dres = tc->dres;
    s->gamma = tc->gamma;
    s->dgamma = tc->dgamma;
    s->dbeta = tc->dbeta;
    if (c->stats) {
        lnorm_segment f;
        lnorm_segment_init(&f, (lnorm_op)s->op, (lnorm_dtype)s->x_dtype, s->rows, s->hidden);
        f.eps = s->eps;
        f.eps_mode = s->eps_mode;
        f.x = tc->x;
        f.y = y;
        f.x_stride = f.y_stride = stride;
        f.mean = tc->mean;
        f.rstd = tc->rstd;
        int err = lnorm_cpu_run_segment(cpu, &f, NULL);
        free(y);
        if (err) {
            lnorm_test_bwd_free(tc);
            return err;
        }
        s->mean = tc->mean;
        s->rstd = tc->rstd;
    }
    lnorm_test_bwd_repoison(tc);
    return LNORM_OK;
}

/* Per row of the reference: what the checker's bounds need. */
typedef struct row_ref {
    double mean, rstd, f, mg_abs, mgx_abs;
} row_ref;

/* The reference of every row (rr), plus dx / dgamma / dbeta and the sums
 * of |dy * xhat| and |dy| per column (abs_dg, abs_db) when not NULL. */
static int ref_all(const lnorm_bwd_segment *s, double *dx_ref, double *dg, double *db, row_ref *rr, double *abs_dg,
                   double *abs_db)
{
    const int64_t H = s->hidden;
    const int ln = s->op == LNORM_OP_LAYERNORM;
    double *xh = malloc((size_t)H * sizeof *xh), *gg = malloc((size_t)H * sizeof *gg);
    if (!xh || !gg) {
        free(xh);
        free(gg);
        return LNORM_ENOMEM;
    }
    for (int64_t c = 0; c < H; c++) {
        if (dg)
            dg[c] = 0.0;
        if (db)
            db[c] = 0.0;
        if (abs_dg)
            abs_dg[c] = abs_db[c] = 0.0;
    }
    for (int64_t r = 0; r < s->rows; r++) {
        const size_t xo = (size_t)(r * s->x_stride), yo = (size_t)(r * s->dy_stride);
        double mean = 0.0, var = 0.0;
        if (ln) {
            for (int64_t c = 0; c < H; c++)
                mean += lnorm_test_get(s->x, s->x_dtype, xo + (size_t)c);
            mean /= (double)H;
        }
        for (int64_t c = 0; c < H; c++) {
            double d = lnorm_test_get(s->x, s->x_dtype, xo + (size_t)c) - mean;
            var += d * d;
        }
        var /= (double)H;
        const double sigma = sqrt(var), eps = (double)s->eps;
        const double rstd = s->eps_mode == LNORM_EPS_OUTSIDE ? 1.0 / (sigma + eps) : 1.0 / sqrt(var + eps);
        const double f = s->eps_mode == LNORM_EPS_OUTSIDE ? sigma * rstd : 1.0;
        double mg = 0.0, mgx = 0.0, mga = 0.0, mgxa = 0.0;
        for (int64_t c = 0; c < H; c++) {
            double dy = lnorm_test_get(s->dy, s->dy_dtype, yo + (size_t)c);
            xh[c] = (lnorm_test_get(s->x, s->x_dtype, xo + (size_t)c) - mean) * rstd;
            gg[c] = s->gamma ? dy * lnorm_test_get(s->gamma, s->param_dtype, (size_t)c) : dy;
            mg += gg[c];
            mgx += gg[c] * xh[c];
            mga += fabs(gg[c]);
            mgxa += fabs(gg[c] * xh[c]);
            if (dg)
                dg[c] += dy * xh[c];
            if (db)
                db[c] += dy;
            if (abs_dg) {
                abs_dg[c] += fabs(dy) * (fabs(xh[c]) + 1.0);
                abs_db[c] += fabs(dy);
            }
        }
        mg /= (double)H;
        mgx /= (double)H;
        rr[r] = (row_ref){mean, rstd, f, mga / (double)H, mgxa / (double)H};
        if (!dx_ref)
            continue;
        const double k = f == 0.0 ? 0.0 : mgx / f;
        for (int64_t c = 0; c < H; c++) {
            double v = rstd * ((gg[c] - (ln ? mg : 0.0)) - xh[c] * k);
            if (s->dres)
                v += lnorm_test_get(s->dres, s->x_dtype, (size_t)(r * s->dres_stride + c));
            dx_ref[(size_t)(r * H + c)] = v;
        }
    }
    free(xh);
    free(gg);
    return LNORM_OK;
}

int lnorm_ref_bwd(const lnorm_bwd_segment *s, double *dx_ref, double *dgamma_ref, double *dbeta_ref)
{
    int err = lnorm_bwd_segment_validate(s, NULL);
    if (err)
        return err;
    row_ref *rr = malloc((size_t)s->rows * sizeof *rr);
    if (!rr)
        return LNORM_ENOMEM;
    err = ref_all(s, dx_ref, dgamma_ref, dbeta_ref, rr, NULL, NULL);
    free(rr);
    return err;
}

static double ulp_of(double v, int dt)
{
    const int prec = dt == LNORM_DTYPE_F32 ? 24 : dt == LNORM_DTYPE_F16 ? 11 : 8;
    const int emin = dt == LNORM_DTYPE_F16 ? -14 : -126;
    int e;
    if (!isfinite(v))
        return INFINITY;
    frexp(v, &e);
    if (e - 1 < emin)
        e = emin + 1;
    return ldexp(1.0, e - prec);
}

/* One element: 0 if got matches want within bound, else 1 (reported). */
static int cmp1(double got, double want, double bound, int dt, const char *label, const char *what, int64_t r,
                int64_t c, int *reported)
{
    int ok;
    if (!isfinite(want))
        ok = !isfinite(got);
    else if (isinf(got))
        /* Past the dtype's range: only where want + bound rounds to it. */
        ok = got == lnorm_test_round(want + copysign(bound, want), dt);
    else {
        ok = !isnan(got) && fabs(got - want) <= bound;
        if (bound > 0 && isfinite(got)) {
            double q = fabs(got - want) / bound;
            if (q > worst)
                worst = q;
        }
    }
    if (!ok && (*reported)++ < 5)
        fprintf(stderr, "  %s: %s[%lld, %lld] = %.9g, want %.9g (bound %.3g)\n", label, what, (long long)r,
                (long long)c, got, want, bound);
    return !ok;
}

long lnorm_test_bwd_check(const lnorm_bwd_segment *s, double rtol, const char *label)
{
    if (lnorm_bwd_segment_validate(s, NULL))
        return -1;
    if (rtol <= 0.0)
        rtol = DEFAULT_RTOL;
    const int64_t H = s->hidden, R = s->rows;
    double *dx = malloc((size_t)(R * H) * sizeof *dx), *dg = malloc((size_t)H * sizeof *dg);
    double *db = malloc((size_t)H * sizeof *db), *adg = malloc((size_t)H * sizeof *adg);
    double *adb = malloc((size_t)H * sizeof *adb);
    row_ref *rr = malloc((size_t)R * sizeof *rr);
    long bad = -1;
    if (!dx || !dg || !db || !adg || !adb || !rr || ref_all(s, dx, dg, db, rr, adg, adb))
        goto out;
    bad = 0;
    int reported = 0;
    const int ln = s->op == LNORM_OP_LAYERNORM;
    for (int64_t r = 0; r < R; r++) {
        const row_ref *q = &rr[r];
        for (int64_t c = 0; c < H; c++) {
            double want = dx[(size_t)(r * H + c)];
            double got = lnorm_test_get(s->dx, s->dx_dtype, (size_t)(r * s->dx_stride + c));
            double xh = (lnorm_test_get(s->x, s->x_dtype, (size_t)(r * s->x_stride + c)) - q->mean) * q->rstd;
            double g = lnorm_test_get(s->dy, s->dy_dtype, (size_t)(r * s->dy_stride + c));
            if (s->gamma)
                g *= lnorm_test_get(s->gamma, s->param_dtype, (size_t)c);
            double scale = q->rstd * (fabs(g) + (ln ? q->mg_abs : 0.0) + (q->f == 0.0 ? 0.0 : (fabs(xh) + 1.0) * q->mgx_abs / q->f));
            if (s->dres)
                scale += fabs(lnorm_test_get(s->dres, s->x_dtype, (size_t)(r * s->dres_stride + c)));
            double bound = rtol * scale;
            if (s->dx_dtype != LNORM_DTYPE_F32)
                bound += ulp_of(want, s->dx_dtype);
            bad += cmp1(got, want, bound, s->dx_dtype, label, "dx", r, c, &reported);
        }
    }
    for (int64_t c = 0; c < H; c++) {
        if (s->dgamma)
            bad += cmp1(s->dgamma[c], dg[c], rtol * adg[c] + 1e-30, LNORM_DTYPE_F32, label, "dgamma", 0, c, &reported);
        if (s->dbeta)
            bad += cmp1(s->dbeta[c], db[c], rtol * adb[c] + 1e-30, LNORM_DTYPE_F32, label, "dbeta", 0, c, &reported);
    }
out:
    free(dx);
    free(dg);
    free(db);
    free(adg);
    free(adb);
    free(rr);
    return bad;
}
