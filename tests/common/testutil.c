/* Test utilities: PRNG, fills, poison, the float64 reference and the checker. */
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"

/* ---- PRNG: xoshiro256**, seeded through splitmix64 ---------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t lnorm_test_seed(uint64_t fallback)
{
    const char *env = getenv("LNORM_TEST_SEED");
    uint64_t seed = fallback;
    if (env && *env) {
        char *end;
        unsigned long long v = strtoull(env, &end, 10);
        if (*end == 0)
            seed = v;
        else
            fprintf(stderr, "LNORM_TEST_SEED=%s is not a decimal number; ignored\n", env);
    }
    fprintf(stderr, "seed %llu (LNORM_TEST_SEED=%llu repeats this data)\n", (unsigned long long)seed,
            (unsigned long long)seed);
    return seed;
}

void lnorm_rng_seed(lnorm_rng *g, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        g->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t lnorm_rng_next(lnorm_rng *g)
{
    uint64_t *s = g->s;
    uint64_t r = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

double lnorm_rng_uniform(lnorm_rng *g)
{
    return (double)(lnorm_rng_next(g) >> 11) * 0x1p-53;
}

double lnorm_rng_normal(lnorm_rng *g)
{
    /* Irwin-Hall with 12 terms: mean 0, variance 1, cheap and bounded. */
    double acc = 0.0;
    for (int i = 0; i < 12; i++)
        acc += lnorm_rng_uniform(g);
    return acc - 6.0;
}

/* ---- dtype helpers ------------------------------------------------------ */

/* Mantissa bits (with the hidden one), smallest normal exponent (as in
 * frexp's convention, minus one) and largest finite value of a dtype. */
static void dtype_format(int dt, int *prec, int *emin, double *maxv)
{
    switch (dt) {
    case LNORM_DTYPE_F16:
        *prec = 11, *emin = -14, *maxv = 65504.0;
        break;
    case LNORM_DTYPE_BF16:
        *prec = 8, *emin = -126, *maxv = 0x1.fep127;
        break;
    default:
        *prec = 24, *emin = -126, *maxv = 0x1.fffffep127;
        break;
    }
}

/* The spacing of dtype's numbers around |v| (its ulp), subnormals included. */
static double dtype_ulp(double v, int dt)
{
    int prec, emin, e;
    double maxv;
    dtype_format(dt, &prec, &emin, &maxv);
    if (!isfinite(v))
        return INFINITY;
    frexp(v, &e); /* v = m * 2^e, 0.5 <= |m| < 1, so the exponent is e - 1 */
    if (e - 1 < emin)
        e = emin + 1;
    return ldexp(1.0, e - prec);
}

double lnorm_test_round(double v, int dt)
{
    int prec, emin;
    double maxv;
    if (isnan(v) || isinf(v) || v == 0.0)
        return v;
    dtype_format(dt, &prec, &emin, &maxv);
    double u = dtype_ulp(v, dt);
    double r = rint(v / u) * u; /* exact scaling by a power of two; rint ties to even */
    if (fabs(r) > maxv)
        return v > 0 ? INFINITY : -INFINITY;
    return r;
}

double lnorm_test_get(const void *buf, int dt, size_t i)
{
    switch (dt) {
    case LNORM_DTYPE_F32:
        return ((const float *)buf)[i];
    case LNORM_DTYPE_F16:
        return lnorm_f16_to_f32(((const uint16_t *)buf)[i]);
    case LNORM_DTYPE_BF16:
        return lnorm_bf16_to_f32(((const uint16_t *)buf)[i]);
    default:
        return NAN;
    }
}

void lnorm_test_set(void *buf, int dt, size_t i, double v)
{
    /* Round once in double; the result is exact in f32 and in the dtype,
     * so the conversions below do not round again. */
    double r = lnorm_test_round(v, dt);
    switch (dt) {
    case LNORM_DTYPE_F32:
        ((float *)buf)[i] = (float)r;
        break;
    case LNORM_DTYPE_F16:
        ((uint16_t *)buf)[i] = lnorm_f32_to_f16((float)r);
        break;
    case LNORM_DTYPE_BF16:
        ((uint16_t *)buf)[i] = lnorm_f32_to_bf16((float)r);
        break;
    default:
        break;
    }
}

void lnorm_test_fill(lnorm_rng *g, void *buf, int dt, size_t n, double mean, double spread)
{
    for (size_t i = 0; i < n; i++)
        lnorm_test_set(buf, dt, i, mean + spread * lnorm_rng_normal(g));
}

void lnorm_test_poison(void *buf, size_t bytes)
{
    if (buf)
        memset(buf, 0xFF, bytes);
}

/* Bits of element i of a 16-bit buffer, mapped to a monotonic integer. */
static long ordered16(uint16_t b)
{
    return (b & 0x8000u) ? -(long)(b & 0x7fffu) : (long)b;
}

static uint16_t bits16_of(double v, int dt)
{
    return dt == LNORM_DTYPE_F16 ? lnorm_f32_to_f16((float)v) : lnorm_f32_to_bf16((float)v);
}

/* ---- the float64 reference --------------------------------------------- */

/* h of row r, column c, as the core defines it. */
static double ref_h(const lnorm_segment *s, int64_t r, int64_t c)
{
    double xv = lnorm_test_get(s->x, s->x_dtype, (size_t)(r * s->x_stride + c));
    if (!s->residual)
        return xv;
    double rv = lnorm_test_get(s->residual, s->x_dtype, (size_t)(r * s->res_stride + c));
    float sum = (float)xv + (float)rv; /* fp32 addition, part of the definition */
    return lnorm_test_round((double)sum, s->x_dtype);
}

int lnorm_ref_segment(const lnorm_segment *s, double *y_ref, double *mean_ref,
                      double *rstd_ref, double *res_out_ref)
{
    int err = lnorm_segment_validate(s, NULL);
    if (err)
        return err;
    const int64_t H = s->hidden;
    double *h = malloc((size_t)H * sizeof *h);
    if (!h)
        return LNORM_ENOMEM;
    for (int64_t r = 0; r < s->rows; r++) {
        for (int64_t c = 0; c < H; c++)
            h[c] = ref_h(s, r, c);
        double mean = 0.0, var = 0.0;
        if (s->op == LNORM_OP_LAYERNORM) {
            for (int64_t c = 0; c < H; c++)
                mean += h[c];
            mean /= (double)H;
            for (int64_t c = 0; c < H; c++)
                var += (h[c] - mean) * (h[c] - mean);
        } else {
            for (int64_t c = 0; c < H; c++)
                var += h[c] * h[c];
        }
        var /= (double)H;
        double eps = (double)s->eps;
        double rstd = s->eps_mode == LNORM_EPS_INSIDE ? 1.0 / sqrt(var + eps)
                                                      : 1.0 / (sqrt(var) + eps);
        for (int64_t c = 0; c < H; c++) {
            double g = s->gamma ? lnorm_test_get(s->gamma, s->param_dtype, (size_t)c) : 1.0;
            double b = s->beta ? lnorm_test_get(s->beta, s->param_dtype, (size_t)c) : 0.0;
            if (y_ref)
                y_ref[r * H + c] = (h[c] - mean) * rstd * g + b;
            if (res_out_ref && s->residual)
                res_out_ref[r * H + c] = h[c];
        }
        if (mean_ref)
            mean_ref[r] = mean;
        if (rstd_ref)
            rstd_ref[r] = rstd;
    }
    free(h);
    return LNORM_OK;
}

/* ---- the checker --------------------------------------------------------- */

void lnorm_test_tol_default(lnorm_test_tol *t)
{
    t->y_rtol = 1e-6;
    t->y_ulps = 1;
    t->stat_rtol = 1e-6;
    t->max_report = 5;
}

/* The worst ratio seen, over every thread that checks (test_named's
 * concurrent case checks from several): under g_worst_mu. */
static pthread_mutex_t g_worst_mu = PTHREAD_MUTEX_INITIALIZER;
static double g_worst;
static char g_worst_where[256];

double lnorm_test_worst_ratio(void)
{
    pthread_mutex_lock(&g_worst_mu);
    double w = g_worst;
    pthread_mutex_unlock(&g_worst_mu);
    return w;
}

void lnorm_test_worst_reset(void)
{
    pthread_mutex_lock(&g_worst_mu);
    g_worst = 0.0;
    g_worst_where[0] = 0;
    pthread_mutex_unlock(&g_worst_mu);
}

const char *lnorm_test_worst_where(void)
{
    return g_worst_where;
}

/* Track |got - want| / bound for passing finite elements. */
static void note_ratio(const char *label, const char *what, double got, double want, double bound)
{
    double r = bound > 0 ? fabs(got - want) / bound : (got == want ? 0.0 : INFINITY);
    if (!isfinite(r))
        return;
    pthread_mutex_lock(&g_worst_mu);
    if (r > g_worst) {
        g_worst = r;
        snprintf(g_worst_where, sizeof g_worst_where, "%s of [%s]", what, label ? label : "?");
    }
    pthread_mutex_unlock(&g_worst_mu);
}

typedef struct checkctx {
    const char *label;
    long fails;
    int max_report;
} checkctx;

static void report(checkctx *k, const char *what, int64_t r, int64_t c, double got, double want, double bound)
{
    if (k->fails++ < k->max_report)
        fprintf(stderr, "  [%s] %s mismatch at row %lld col %lld: got %.9g want %.9g (|diff| %.3g, bound %.3g)\n",
                k->label ? k->label : "?", what, (long long)r, (long long)c, got, want,
                fabs(got - want), bound);
}

/* Non-finite reference values: NaN must be NaN, an infinity the same one.
 * Returns 1 when want is non-finite (the caller is then done). */
static int check_nonfinite(checkctx *k, const char *what, int64_t r, int64_t c, double got, double want)
{
    if (isnan(want)) {
        if (!isnan(got))
            report(k, what, r, c, got, want, 0);
        return 1;
    }
    if (isinf(want)) {
        if (got != want)
            report(k, what, r, c, got, want, 0);
        return 1;
    }
    return 0;
}

long lnorm_test_check(const lnorm_segment *s, const double *y_ref, const double *mean_ref,
                      const double *rstd_ref, const double *res_out_ref,
                      const lnorm_test_tol *tol, const char *label)
{
    lnorm_test_tol dt;
    if (!tol) {
        lnorm_test_tol_default(&dt);
        tol = &dt;
    }
    checkctx k = {label, 0, tol->max_report};
    const int64_t H = s->hidden;
    for (int64_t r = 0; r < s->rows; r++) {
        const double mean = s->op == LNORM_OP_LAYERNORM ? mean_ref[r] : 0.0;
        const double rstd = rstd_ref[r];
        /* The row's normalized range R = max |(h - mean) * rstd| (finite ones). */
        double R = 0.0;
        for (int64_t c = 0; c < H; c++) {
            double h = s->residual ? res_out_ref[r * H + c]
                                   : lnorm_test_get(s->x, s->x_dtype, (size_t)(r * s->x_stride + c));
            double n = fabs((h - mean) * rstd);
            if (isfinite(n) && n > R)
                R = n;
        }
        for (int64_t c = 0; c < H; c++) {
            double want = y_ref[r * H + c];
            double got = lnorm_test_get(s->y, s->y_dtype, (size_t)(r * s->y_stride + c));
            if (check_nonfinite(&k, "y", r, c, got, want))
                continue;
            double g = s->gamma ? fabs(lnorm_test_get(s->gamma, s->param_dtype, (size_t)c)) : 1.0;
            double b = s->beta ? fabs(lnorm_test_get(s->beta, s->param_dtype, (size_t)c)) : 0.0;
            double bound = tol->y_rtol * (g * R + b);
            if (s->y_dtype == LNORM_DTYPE_F32) {
                if (!(fabs(got - want) <= bound))
                    report(&k, "y", r, c, got, want, bound);
                else
                    note_ratio(label, "y", got, want, bound);
            } else {
                double rn = lnorm_test_round(want, s->y_dtype);
                uint16_t gb = ((const uint16_t *)s->y)[r * s->y_stride + c];
                long dist = labs(ordered16(gb) - ordered16(bits16_of(rn, s->y_dtype)));
                int ok = !isnan(got) && dist <= tol->y_ulps;
                if (!ok && isfinite(got))
                    ok = fabs(got - want) <= bound + 0.5 * dtype_ulp(want, s->y_dtype);
                if (!ok)
                    report(&k, "y", r, c, got, want, 0.5 * dtype_ulp(want, s->y_dtype) * tol->y_ulps);
            }
        }
        if (s->residual) {
            for (int64_t c = 0; c < H; c++) {
                double want = res_out_ref[r * H + c];
                double got = lnorm_test_get(s->residual_out, s->x_dtype, (size_t)(r * s->res_out_stride + c));
                if (check_nonfinite(&k, "residual_out", r, c, got, want))
                    continue;
                /* Bit-exact (a zero's sign aside: -0 == +0 compares equal). */
                if (!(got == want))
                    report(&k, "residual_out", r, c, got, want, 0);
            }
        }
        if (s->mean) {
            double got = s->mean[r];
            if (!check_nonfinite(&k, "mean", r, -1, got, mean_ref[r])) {
                double bound = tol->stat_rtol * (fabs(mean_ref[r]) + 1.0 / rstd);
                if (!(fabs(got - mean_ref[r]) <= bound))
                    report(&k, "mean", r, -1, got, mean_ref[r], bound);
                else
                    note_ratio(label, "mean", got, mean_ref[r], bound);
            }
        }
        if (s->rstd) {
            double got = s->rstd[r];
            if (!check_nonfinite(&k, "rstd", r, -1, got, rstd)) {
                double bound = tol->stat_rtol * rstd;
                if (!(fabs(got - rstd) <= bound))
                    report(&k, "rstd", r, -1, got, rstd, bound);
                else
                    note_ratio(label, "rstd", got, rstd, bound);
            }
        }
    }
    if (k.fails > k.max_report)
        fprintf(stderr, "  [%s] ... %ld mismatches in all\n", label ? label : "?", k.fails);
    return k.fails;
}

long lnorm_test_check_segment(const lnorm_segment *s, const lnorm_test_tol *tol, const char *label)
{
    if (lnorm_segment_validate(s, NULL))
        return -1;
    size_t n = (size_t)(s->rows * s->hidden);
    double *y = malloc(n * sizeof *y);
    double *m = malloc((size_t)s->rows * sizeof *m);
    double *rs = malloc((size_t)s->rows * sizeof *rs);
    double *ro = s->residual ? malloc(n * sizeof *ro) : NULL;
    long fails = -1;
    if (y && m && rs && (ro || !s->residual) && lnorm_ref_segment(s, y, m, rs, ro) == LNORM_OK)
        fails = lnorm_test_check(s, y, m, rs, ro, tol, label);
    free(y);
    free(m);
    free(rs);
    free(ro);
    return fails;
}

/* Order-preserving integer of a 16-bit float's bits (for ulp distances). */
static long ord16(uint16_t u)
{
    return (u & 0x8000u) ? -(long)(u & 0x7fffu) : (long)u;
}

long lnorm_test_cmp_outputs(const lnorm_segment *g, const lnorm_segment *c, const char *label)
{
    long bad = 0;
    size_t ysz = lnorm_dtype_size(g->y_dtype), xsz = lnorm_dtype_size(g->x_dtype);
    for (int64_t r = 0; r < g->rows; r++) {
        size_t ro = (size_t)(r * g->y_stride);
        double scale = 0;
        for (int64_t k = 0; k < g->hidden; k++) {
            double v = fabs(lnorm_test_get(c->y, g->y_dtype, ro + (size_t)k));
            if (v > scale)
                scale = v;
        }
        for (int64_t k = 0; k < g->hidden; k++) {
            size_t i = ro + (size_t)k;
            double a = lnorm_test_get(g->y, g->y_dtype, i), b = lnorm_test_get(c->y, g->y_dtype, i);
            int ok = fabs(a - b) <= 4e-6 * scale;
            if (!ok && ysz == 2) {
                uint16_t ua, ub;
                memcpy(&ua, (const char *)g->y + i * 2, 2);
                memcpy(&ub, (const char *)c->y + i * 2, 2);
                ok = labs(ord16(ua) - ord16(ub)) <= 2;
            }
            if (!ok) {
                if (bad < 3)
                    fprintf(stderr, "  %s: outputs differ at row %lld col %lld: %.9g vs %.9g\n", label,
                            (long long)r, (long long)k, a, b);
                bad++;
            }
        }
        if (g->residual_out) {
            size_t o = (size_t)(r * g->res_out_stride) * xsz;
            if (memcmp((const char *)g->residual_out + o, (const char *)c->residual_out + o,
                       (size_t)g->hidden * xsz)) {
                fprintf(stderr, "  %s: residual_out differs in row %lld\n", label, (long long)r);
                bad++;
            }
        }
        if (g->rstd) {
            double a = g->rstd[r], b = c->rstd[r];
            if (!(fabs(a - b) <= 4e-6 * fabs(b))) {
                fprintf(stderr, "  %s: rstd differs in row %lld: %.9g vs %.9g\n", label, (long long)r, a, b);
                bad++;
            }
            if (g->mean) {
                double m = g->mean[r], n = c->mean[r];
                if (!(fabs(m - n) <= 4e-6 * (fabs(n) + 1.0 / b))) {
                    fprintf(stderr, "  %s: mean differs in row %lld: %.9g vs %.9g\n", label, (long long)r, m, n);
                    bad++;
                }
            }
        }
    }
    return bad;
}
