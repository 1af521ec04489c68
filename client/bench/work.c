/* Request templates, reply scanning and the f64 reference: see work.h. */
#include "work.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "lnorm.pb-c.h"
#include "lnorm_wire.h"
#include "lnorm/types.h"

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double unif(uint64_t *s)
{
    return ((double)(splitmix(s) >> 11) + 0.5) / 9007199254740992.0;
}

/* Approximately normal: sum of 4 uniforms, centred and scaled. */
static double gauss(uint64_t *s)
{
    return (unif(s) + unif(s) + unif(s) + unif(s) - 2.0) * 1.7320508;
}

static float load_el(const void *p, int dt, size_t i)
{
    if (dt == LNORM_DTYPE_F32) {
        float f;
        memcpy(&f, (const char *)p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)p + 2 * i, 2);
    return dt == LNORM_DTYPE_F16 ? lnorm_f16_to_f32(h) : lnorm_bf16_to_f32(h);
}

static void store_el(void *p, int dt, size_t i, float v)
{
    if (dt == LNORM_DTYPE_F32) {
        memcpy((char *)p + 4 * i, &v, 4);
        return;
    }
    uint16_t h = dt == LNORM_DTYPE_F16 ? lnorm_f32_to_f16(v) : lnorm_f32_to_bf16(v);
    memcpy((char *)p + 2 * i, &h, 2);
}

static float round_to(int dt, float v)
{
    if (dt == LNORM_DTYPE_F16)
        return lnorm_f16_to_f32(lnorm_f32_to_f16(v));
    if (dt == LNORM_DTYPE_BF16)
        return lnorm_bf16_to_f32(lnorm_f32_to_bf16(v));
    return v;
}

/* A backward template's request: x, dy, dres (--residual), gamma (f32,
 * inline or registered), dgamma and dbeta asked for, stats recomputed. */
static int encode_backward(const lnorm__work *w, lnorm__tmpl *t)
{
    Lnorm__V1__Request rq = LNORM__V1__REQUEST__INIT;
    Lnorm__V1__NormalizeBackwardRequest b = LNORM__V1__NORMALIZE_BACKWARD_REQUEST__INIT;
    Lnorm__V1__Affine af = LNORM__V1__AFFINE__INIT;
    b.op = (Lnorm__V1__Op)LNORM__OP_BASE(t->sh.op);
    b.x_dtype = (Lnorm__V1__DType)t->sh.x_dtype;
    b.dy_dtype = (Lnorm__V1__DType)t->sh.x_dtype;
    b.dx_dtype = (Lnorm__V1__DType)t->sh.y_dtype;
    b.rows = t->sh.rows;
    b.hidden = t->sh.hidden;
    b.eps_present_case = LNORM__V1__NORMALIZE_BACKWARD_REQUEST__EPS_PRESENT_EPS;
    b.eps = w->wl.eps;
    b.x.data = t->x;
    b.x.len = t->x_bytes;
    b.dy.data = t->dy;
    b.dy.len = t->x_bytes;
    if (t->residual) {
        b.dres.data = t->residual;
        b.dres.len = t->x_bytes;
    }
    if (w->wl.params == LNORM__PARAMS_INLINE) {
        af.dtype = LNORM__V1__DTYPE__DTYPE_F32;
        af.gamma.data = (uint8_t *)t->gamma;
        af.gamma.len = t->sh.hidden * 4;
        b.affine = &af;
    } else if (w->wl.params == LNORM__PARAMS_REGISTERED) {
        af.params_id = t->params_id;
        b.affine = &af;
    }
    b.want_dgamma = 1;
    b.want_dbeta = 1;
    rq.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE_BACKWARD;
    rq.normalize_backward = &b;
    t->msg_len = lnorm__v1__request__get_packed_size(&rq);
    t->msg = malloc(t->msg_len ? t->msg_len : 1);
    if (!t->msg)
        return -1;
    lnorm__v1__request__pack(&rq, t->msg);
    return 0;
}

static int encode_normalize(const lnorm__work *w, lnorm__tmpl *t)
{
    if (LNORM__OP_IS_BWD(t->sh.op))
        return encode_backward(w, t);
    Lnorm__V1__Request rq = LNORM__V1__REQUEST__INIT;
    Lnorm__V1__NormalizeRequest nr = LNORM__V1__NORMALIZE_REQUEST__INIT;
    Lnorm__V1__Affine af = LNORM__V1__AFFINE__INIT;
    nr.op = (Lnorm__V1__Op)t->sh.op;
    nr.x_dtype = (Lnorm__V1__DType)t->sh.x_dtype;
    nr.y_dtype = (Lnorm__V1__DType)t->sh.y_dtype;
    nr.rows = t->sh.rows;
    nr.hidden = t->sh.hidden;
    nr.eps_present_case = LNORM__V1__NORMALIZE_REQUEST__EPS_PRESENT_EPS;
    nr.eps = w->wl.eps;
    nr.x.data = t->x;
    nr.x.len = t->x_bytes;
    if (t->residual) {
        nr.residual.data = t->residual;
        nr.residual.len = t->x_bytes;
    }
    nr.want_stats = w->wl.stats != 0;
    if (w->wl.params == LNORM__PARAMS_INLINE) {
        af.dtype = LNORM__V1__DTYPE__DTYPE_F32;
        af.gamma.data = (uint8_t *)t->gamma;
        af.gamma.len = t->sh.hidden * 4;
        af.beta.data = (uint8_t *)t->beta;
        af.beta.len = t->sh.hidden * 4;
        nr.affine = &af;
    } else if (w->wl.params == LNORM__PARAMS_REGISTERED) {
        af.params_id = t->params_id;
        nr.affine = &af;
    }
    rq.body_case = LNORM__V1__REQUEST__BODY_NORMALIZE;
    rq.normalize = &nr;
    t->msg_len = lnorm__v1__request__get_packed_size(&rq);
    t->msg = malloc(t->msg_len ? t->msg_len : 1);
    if (!t->msg)
        return -1;
    lnorm__v1__request__pack(&rq, t->msg);
    return 0;
}

static int build_one(lnorm__work *w, lnorm__tmpl *t, const lnorm__mix_shape *sh, uint64_t *rng,
                     const char *prefix)
{
    t->sh = *sh;
    if (t->sh.y_dtype == LNORM_DTYPE_NONE)
        t->sh.y_dtype = t->sh.x_dtype;
    uint64_t n = sh->rows * sh->hidden;
    t->x_bytes = n * lnorm_dtype_size(sh->x_dtype);
    t->y_bytes = n * lnorm_dtype_size(t->sh.y_dtype);
    t->x = malloc(t->x_bytes);
    if (!t->x)
        return -1;
    for (uint64_t r = 0; r < sh->rows; r++) {
        double mu = 4.0 * unif(rng) - 2.0, sd = 0.5 + 1.5 * unif(rng);
        for (uint64_t c = 0; c < sh->hidden; c++)
            store_el(t->x, sh->x_dtype, r * sh->hidden + c, (float)(mu + sd * gauss(rng)));
    }
    if (LNORM__OP_IS_BWD(sh->op)) {
        t->dy = malloc(t->x_bytes);
        if (!t->dy)
            return -1;
        for (uint64_t i = 0; i < n; i++)
            store_el(t->dy, sh->x_dtype, i, (float)gauss(rng));
    }
    if (w->wl.residual) {
        t->residual = malloc(t->x_bytes);
        if (!t->residual)
            return -1;
        for (uint64_t i = 0; i < n; i++)
            store_el(t->residual, sh->x_dtype, i, (float)(0.5 * gauss(rng)));
    }
    if (w->wl.params != LNORM__PARAMS_NONE) {
        /* the same parameters for every template of one hidden size */
        uint64_t ps = 0x5eedull ^ (sh->hidden * 0x100000001b3ull);
        t->gamma = malloc(sh->hidden * 4);
        t->beta = malloc(sh->hidden * 4);
        if (!t->gamma || !t->beta)
            return -1;
        for (uint64_t c = 0; c < sh->hidden; c++) {
            t->gamma[c] = (float)(1.0 + 0.2 * gauss(&ps));
            t->beta[c] = (float)(0.1 * gauss(&ps));
        }
        if (w->wl.params == LNORM__PARAMS_REGISTERED)
            snprintf(t->params_id, sizeof t->params_id, "%s.%llu", prefix,
                     (unsigned long long)sh->hidden);
    }
    return encode_normalize(w, t);
}

int lnorm__work_build(const lnorm__wl *wl, const char *params_prefix, lnorm__work **out)
{
    lnorm__work *w = calloc(1, sizeof(*w));
    if (!w)
        return -1;
    w->wl = *wl;
    if (w->wl.variants < 1)
        w->wl.variants = 1;
    w->nt = wl->mix.n * w->wl.variants;
    w->t = calloc(w->nt ? w->nt : 1, sizeof(*w->t));
    if (!w->t) {
        free(w);
        return -1;
    }
    uint64_t rng = wl->seed ? wl->seed : 42;
    for (size_t s = 0; s < wl->mix.n; s++) {
        for (unsigned v = 0; v < w->wl.variants; v++) {
            lnorm__tmpl *t = &w->t[s * w->wl.variants + v];
            t->shape_idx = s;
            if (build_one(w, t, &wl->mix.shapes[s], &rng, params_prefix)) {
                lnorm__work_free(w);
                return -1;
            }
            if (t->y_bytes > w->max_y_bytes)
                w->max_y_bytes = t->y_bytes;
            if (t->x_bytes > w->max_x_bytes)
                w->max_x_bytes = t->x_bytes;
            if (t->sh.rows > w->max_rows)
                w->max_rows = t->sh.rows;
        }
    }
    *out = w;
    return 0;
}

void lnorm__work_free(lnorm__work *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->nt; i++) {
        free(w->t[i].x);
        free(w->t[i].residual);
        free(w->t[i].dy);
        free(w->t[i].gamma);
        free(w->t[i].beta);
        free(w->t[i].msg);
    }
    free(w->t);
    free(w);
}

size_t lnorm__work_pick(const lnorm__work *w, uint64_t r)
{
    size_t s = lnorm__mix_pick(&w->wl.mix, (unsigned)(r % w->wl.mix.total_weight));
    size_t v = (size_t)((r >> 32) % w->wl.variants);
    return s * w->wl.variants + v;
}

int lnorm__encode_register(const lnorm__tmpl *t, void **buf, size_t *len)
{
    Lnorm__V1__Request rq = LNORM__V1__REQUEST__INIT;
    Lnorm__V1__RegisterParamsRequest rp = LNORM__V1__REGISTER_PARAMS_REQUEST__INIT;
    rp.params_id = (char *)t->params_id;
    rp.dtype = LNORM__V1__DTYPE__DTYPE_F32;
    rp.hidden = t->sh.hidden;
    rp.gamma.data = (uint8_t *)t->gamma;
    rp.gamma.len = t->sh.hidden * 4;
    rp.beta.data = (uint8_t *)t->beta;
    rp.beta.len = t->sh.hidden * 4;
    rq.body_case = LNORM__V1__REQUEST__BODY_REGISTER_PARAMS;
    rq.register_params = &rp;
    *len = lnorm__v1__request__get_packed_size(&rq);
    *buf = malloc(*len);
    if (!*buf)
        return -1;
    lnorm__v1__request__pack(&rq, *buf);
    return 0;
}

int lnorm__encode_drop(const char *id, void **buf, size_t *len)
{
    Lnorm__V1__Request rq = LNORM__V1__REQUEST__INIT;
    Lnorm__V1__DropParamsRequest dp = LNORM__V1__DROP_PARAMS_REQUEST__INIT;
    dp.params_id = (char *)id;
    rq.body_case = LNORM__V1__REQUEST__BODY_DROP_PARAMS;
    rq.drop_params = &dp;
    *len = lnorm__v1__request__get_packed_size(&rq);
    *buf = malloc(*len);
    if (!*buf)
        return -1;
    lnorm__v1__request__pack(&rq, *buf);
    return 0;
}

/* ---- reply scanning: the fields a reply needs (proto/lnorm_wire.h) ------ */

int lnorm__reply_scan(const void *buf, size_t len, lnorm__reply *out)
{
    memset(out, 0, sizeof(*out));
    lnorm__wire_rd r = lnorm__wire_reader(buf, len);
    while (r.p < r.end) {
        lnorm__wire_field f;
        if (lnorm__wire_next_field(&r, &f))
            return -1;
        if (f.wt != LNORM__WIRE_LEN)
            continue;
        lnorm__wire_rd s = lnorm__wire_reader(f.data, f.len);
        if (f.num == 2) { /* Status */
            while (s.p < s.end) {
                lnorm__wire_field g;
                if (lnorm__wire_next_field(&s, &g))
                    return -1;
                if (g.num == 1 && g.wt == LNORM__WIRE_VARINT)
                    out->code = (int)g.v;
            }
        } else if (f.num == 3) { /* Timings */
            out->has_timings = 1;
            while (s.p < s.end) {
                lnorm__wire_field g;
                if (lnorm__wire_next_field(&s, &g))
                    return -1;
                if (g.wt != LNORM__WIRE_VARINT)
                    continue;
                if (g.num == 1)
                    out->queue_us = g.v;
                else if (g.num == 2)
                    out->compute_us = g.v;
                else if (g.num == 3)
                    out->batch_rows = (uint32_t)g.v;
                else if (g.num == 4)
                    out->batch_requests = (uint32_t)g.v;
            }
        } else if (f.num == 10 || f.num == 19) { /* NormalizeResponse, NormalizeBackwardResponse */
            while (s.p < s.end) {
                lnorm__wire_field g;
                if (lnorm__wire_next_field(&s, &g))
                    return -1;
                if (g.wt != LNORM__WIRE_LEN)
                    continue;
                if (g.num == 1)
                    out->y = g.data, out->y_len = g.len;
                else if (g.num == 2)
                    out->mean = g.data, out->mean_len = g.len;
                else if (g.num == 3)
                    out->rstd = g.data, out->rstd_len = g.len;
                else if (g.num == 4)
                    out->res_out = g.data, out->res_out_len = g.len;
            }
        }
    }
    return 0;
}

/* ---- the f64 reference -------------------------------------------------- */

static double tol_for(int dt, uint64_t hidden)
{
    double grow = 1.0 + (double)hidden / 65536.0; /* fp32 sums over long rows */
    return dt == LNORM_DTYPE_BF16 ? 1.6e-2 * grow : dt == LNORM_DTYPE_F16 ? 2e-3 * grow : 2e-4 * grow;
}

/* The backward's reference: dx (against the reply's y) per row, dgamma and
 * dbeta over the rows; bounds scaled as tests/common/testbwd.h's, with the
 * dtype's tolerance of tol_for. */
static int verify_backward(const lnorm__work *w, const lnorm__tmpl *t, const void *dx, size_t dx_len,
                           const void *dgamma, size_t dg_len, const void *dbeta, size_t db_len, char *why,
                           size_t whylen)
{
    const lnorm__mix_shape *sh = &t->sh;
    const uint64_t H = sh->hidden;
    const int is_ln = LNORM__OP_BASE(sh->op) == LNORM_OP_LAYERNORM;
    if (dx_len != t->y_bytes || dg_len != H * 4 || db_len != H * 4) {
        snprintf(why, whylen, "dx / dgamma / dbeta are %zu / %zu / %zu bytes, want %zu / %llu / %llu", dx_len,
                 dg_len, db_len, t->y_bytes, (unsigned long long)(H * 4), (unsigned long long)(H * 4));
        return -1;
    }
    double *buf = malloc(6 * H * sizeof(double));
    if (!buf) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    double *xh = buf, *g = buf + H, *dg = buf + 2 * H, *db = buf + 3 * H, *adg = buf + 4 * H, *adb = buf + 5 * H;
    memset(dg, 0, 4 * H * sizeof(double));
    const double tol = tol_for(sh->y_dtype, H), stol = tol_for(LNORM_DTYPE_F32, H);
    int rc = 0;
    for (uint64_t r = 0; r < sh->rows && rc == 0; r++) {
        const size_t base = r * H;
        double mu = 0, var = 0;
        if (is_ln) {
            for (uint64_t c = 0; c < H; c++)
                mu += load_el(t->x, sh->x_dtype, base + c);
            mu /= (double)H;
        }
        for (uint64_t c = 0; c < H; c++) {
            double d = load_el(t->x, sh->x_dtype, base + c) - mu;
            var += d * d;
        }
        var /= (double)H;
        const double rs = 1.0 / sqrt(var + w->wl.eps);
        double mg = 0, mgx = 0, mga = 0, mgxa = 0;
        for (uint64_t c = 0; c < H; c++) {
            const double dy = load_el(t->dy, sh->x_dtype, base + c);
            xh[c] = (load_el(t->x, sh->x_dtype, base + c) - mu) * rs;
            g[c] = t->gamma ? dy * t->gamma[c] : dy;
            mg += g[c], mgx += g[c] * xh[c], mga += fabs(g[c]), mgxa += fabs(g[c] * xh[c]);
            dg[c] += dy * xh[c], db[c] += dy;
            adg[c] += fabs(dy) * (fabs(xh[c]) + 1.0), adb[c] += fabs(dy);
        }
        mg /= (double)H, mgx /= (double)H, mga /= (double)H, mgxa /= (double)H;
        for (uint64_t c = 0; c < H; c++) {
            double ref = rs * (g[c] - (is_ln ? mg : 0.0) - xh[c] * mgx);
            double scale = rs * (fabs(g[c]) + mga + (fabs(xh[c]) + 1.0) * mgxa);
            if (t->residual) {
                double dr = load_el(t->residual, sh->x_dtype, base + c);
                ref += dr;
                scale += fabs(dr);
            }
            double got = load_el(dx, sh->y_dtype, base + c);
            if (!(fabs(got - ref) <= tol * (scale + fabs(ref)))) {
                snprintf(why, whylen, "dx[%llu,%llu] = %.7g, reference %.7g (tol %.2g)", (unsigned long long)r,
                         (unsigned long long)c, got, ref, tol);
                rc = -1;
                break;
            }
        }
    }
    for (uint64_t c = 0; c < H && rc == 0; c++) {
        float gg, gb;
        memcpy(&gg, (const char *)dgamma + 4 * c, 4);
        memcpy(&gb, (const char *)dbeta + 4 * c, 4);
        if (!(fabs(gg - dg[c]) <= stol * adg[c] + 1e-30) || !(fabs(gb - db[c]) <= stol * adb[c] + 1e-30)) {
            snprintf(why, whylen, "dgamma / dbeta[%llu] = %.7g / %.7g, reference %.7g / %.7g",
                     (unsigned long long)c, gg, gb, dg[c], db[c]);
            rc = -1;
        }
    }
    free(buf);
    return rc;
}

int lnorm__verify(const lnorm__work *w, const lnorm__tmpl *t, const void *y, size_t y_len,
                  const void *mean, size_t mean_len, const void *rstd, size_t rstd_len,
                  const void *res_out, size_t res_out_len, char *why, size_t whylen)
{
    if (LNORM__OP_IS_BWD(t->sh.op))
        return verify_backward(w, t, y, y_len, mean, mean_len, rstd, rstd_len, why, whylen);
    const lnorm__mix_shape *sh = &t->sh;
    uint64_t H = sh->hidden;
    int is_ln = sh->op == LNORM_OP_LAYERNORM;
    if (y_len != t->y_bytes) {
        snprintf(why, whylen, "y is %zu bytes, want %zu", y_len, t->y_bytes);
        return -1;
    }
    if (w->wl.stats) {
        if (rstd_len != sh->rows * 4 || (is_ln && mean_len != sh->rows * 4) ||
            (!is_ln && mean_len != 0)) {
            snprintf(why, whylen, "stats sizes mean %zu rstd %zu for %llu rows", mean_len, rstd_len,
                     (unsigned long long)sh->rows);
            return -1;
        }
    }
    if (t->residual && res_out_len != t->x_bytes) {
        snprintf(why, whylen, "residual_out is %zu bytes, want %zu", res_out_len, t->x_bytes);
        return -1;
    }
    double *h = malloc(H * sizeof(double));
    if (!h) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    double tol = tol_for(sh->y_dtype, H), stol = tol_for(LNORM_DTYPE_F32, H);
    int rc = 0;
    for (uint64_t r = 0; r < sh->rows && rc == 0; r++) {
        size_t base = r * H;
        for (uint64_t c = 0; c < H; c++) {
            float xv = load_el(t->x, sh->x_dtype, base + c);
            if (t->residual) {
                float hv = round_to(sh->x_dtype, xv + load_el(t->residual, sh->x_dtype, base + c));
                float got = load_el(res_out, sh->x_dtype, base + c);
                if (memcmp(&hv, &got, 4) != 0 && !(hv == got)) {
                    snprintf(why, whylen, "residual_out[%llu,%llu] = %g, want %g",
                             (unsigned long long)r, (unsigned long long)c, got, hv);
                    rc = -1;
                    break;
                }
                xv = hv;
            }
            h[c] = xv;
        }
        if (rc)
            break;
        double mu = 0, var = 0;
        if (is_ln) {
            for (uint64_t c = 0; c < H; c++)
                mu += h[c];
            mu /= (double)H;
        }
        for (uint64_t c = 0; c < H; c++)
            var += (h[c] - mu) * (h[c] - mu);
        var /= (double)H;
        double rs = w->wl.eps > 0 ? 1.0 / sqrt(var + w->wl.eps) : 1.0 / sqrt(var);
        for (uint64_t c = 0; c < H; c++) {
            double g = t->gamma ? t->gamma[c] : 1.0, b = t->beta ? t->beta[c] : 0.0;
            double ref = (h[c] - mu) * rs * g + b;
            double got = load_el(y, sh->y_dtype, base + c);
            if (!(fabs(got - ref) <= tol * (1.0 + fabs(ref)))) {
                snprintf(why, whylen, "y[%llu,%llu] = %.7g, reference %.7g (tol %.2g)",
                         (unsigned long long)r, (unsigned long long)c, got, ref, tol);
                rc = -1;
                break;
            }
        }
        if (rc == 0 && w->wl.stats) {
            float gr, gm = 0;
            memcpy(&gr, (const char *)rstd + 4 * r, 4);
            if (is_ln)
                memcpy(&gm, (const char *)mean + 4 * r, 4);
            if (!(fabs(gr - rs) <= stol * rs) || (is_ln && !(fabs(gm - mu) <= stol * (1 + fabs(mu))))) {
                snprintf(why, whylen, "row %llu stats mean %g rstd %g, reference %g %g",
                         (unsigned long long)r, gm, gr, mu, rs);
                rc = -1;
            }
        }
    }
    free(h);
    return rc;
}
