/* The test case builder (see testcase.h). */
#include "testcase.h"

#include <stdlib.h>
#include <string.h>

void lnorm_test_case_free(lnorm_test_case *tc)
{
    free(tc->x);
    free(tc->y);
    free(tc->residual);
    free(tc->residual_out);
    free(tc->gamma);
    free(tc->beta);
    free(tc->mean);
    free(tc->rstd);
    memset(tc, 0, sizeof *tc);
}

void lnorm_test_case_repoison(lnorm_test_case *tc)
{
    lnorm_test_poison(tc->y, tc->y_bytes);
    lnorm_test_poison(tc->residual_out, tc->residual_out ? tc->res_bytes : 0);
    lnorm_test_poison(tc->mean, tc->mean ? (size_t)tc->seg.rows * sizeof(float) : 0);
    lnorm_test_poison(tc->rstd, tc->rstd ? (size_t)tc->seg.rows * sizeof(float) : 0);
}

int lnorm_test_case_make(lnorm_test_case *tc, const lnorm_test_case_cfg *c, lnorm_rng *g)
{
    memset(tc, 0, sizeof *tc);
    lnorm_segment *s = &tc->seg;
    lnorm_segment_init(s, (lnorm_op)c->op, (lnorm_dtype)c->x_dtype, c->rows, c->hidden);
    if (c->y_dtype)
        s->y_dtype = c->y_dtype;
    if (c->param_dtype)
        s->param_dtype = c->param_dtype;
    s->eps_mode = c->eps_mode;
    if (c->eps != 0.0f)
        s->eps = c->eps;
    int64_t stride = c->hidden + c->pad;
    s->x_stride = s->y_stride = s->res_stride = s->res_out_stride = stride;
    size_t n = (size_t)(c->rows * stride); /* padding after the last row too */
    size_t xsz = lnorm_dtype_size(s->x_dtype), ysz = lnorm_dtype_size(s->y_dtype);
    size_t psz = lnorm_dtype_size(s->param_dtype);
    tc->x_bytes = n * xsz;
    tc->y_bytes = n * ysz;
    tc->res_bytes = n * xsz;
    int ok = (tc->x = malloc(tc->x_bytes)) && (tc->y = malloc(tc->y_bytes));
    if (ok && c->residual)
        ok = (tc->residual = malloc(tc->res_bytes)) && (tc->residual_out = malloc(tc->res_bytes));
    if (ok && c->gamma)
        ok = (tc->gamma = malloc((size_t)c->hidden * psz)) != NULL;
    if (ok && c->beta)
        ok = (tc->beta = malloc((size_t)c->hidden * psz)) != NULL;
    if (ok && c->stats) {
        ok = (tc->rstd = malloc((size_t)c->rows * sizeof(float))) != NULL;
        if (ok && c->op == LNORM_OP_LAYERNORM)
            ok = (tc->mean = malloc((size_t)c->rows * sizeof(float))) != NULL;
    }
    if (!ok) {
        lnorm_test_case_free(tc);
        return LNORM_ENOMEM;
    }
    double spread = c->x_spread != 0.0 ? c->x_spread : 1.0;
    lnorm_test_fill(g, tc->x, s->x_dtype, n, c->x_mean, spread);
    if (tc->residual)
        lnorm_test_fill(g, tc->residual, s->x_dtype, n, 0.0, c->r_spread != 0.0 ? c->r_spread : 1.0);
    if (tc->gamma)
        lnorm_test_fill(g, tc->gamma, s->param_dtype, (size_t)c->hidden, 1.0, 0.5);
    if (tc->beta)
        lnorm_test_fill(g, tc->beta, s->param_dtype, (size_t)c->hidden, 0.0, 0.5);
    s->x = tc->x;
    s->y = tc->y;
    s->residual = tc->residual;
    s->residual_out = tc->residual_out;
    s->gamma = tc->gamma;
    s->beta = tc->beta;
    s->mean = tc->mean;
    s->rstd = tc->rstd;
    lnorm_test_case_repoison(tc);
    return LNORM_OK;
}

/* Bytes of buf (rows x stride elements of size sz) outside the first
 * hidden elements of each row that are not 0xFF. */
static long pad_writes(const void *buf, size_t sz, int64_t rows, int64_t hidden, int64_t stride)
{
    long bad = 0;
    const unsigned char *p = buf;
    for (int64_t r = 0; r < rows; r++)
        for (size_t i = (size_t)(r * stride + hidden) * sz; i < (size_t)((r + 1) * stride) * sz; i++)
            bad += p[i] != 0xFF;
    return bad;
}

long lnorm_test_case_pad_writes(const lnorm_test_case *tc)
{
    const lnorm_segment *s = &tc->seg;
    long bad = pad_writes(tc->y, lnorm_dtype_size(s->y_dtype), s->rows, s->hidden, s->y_stride);
    if (tc->residual_out)
        bad += pad_writes(tc->residual_out, lnorm_dtype_size(s->x_dtype), s->rows, s->hidden,
                          s->res_out_stride);
    return bad;
}

void lnorm_test_matrix(const int64_t *hs, size_t nh, lnorm_test_matrix_fn fn, void *arg)
{
    static const int dts[] = {LNORM_DTYPE_F32, LNORM_DTYPE_F16, LNORM_DTYPE_BF16};
    long idx = 0;
    for (int op = LNORM_OP_LAYERNORM; op <= LNORM_OP_RMSNORM; op++)
        for (int xi = 0; xi < 3; xi++)
            for (int yi = 0; yi < 2; yi++)
                for (int aff = 0; aff < 3; aff++)
                    for (int pi = 0; pi < 2; pi++)
                        for (int res = 0; res < 2; res++)
                            for (int st = 0; st < 2; st++) {
                                int xdt = dts[xi];
                                if (aff == 0 && pi == 1)
                                    continue; /* no params: param dtype is moot */
                                lnorm_test_case_cfg c = {0};
                                c.op = op;
                                c.x_dtype = xdt;
                                c.y_dtype = yi == 0 ? xdt : (xdt == LNORM_DTYPE_F32 ? LNORM_DTYPE_BF16 : LNORM_DTYPE_F32);
                                c.param_dtype = pi == 0 ? LNORM_DTYPE_F32 : xdt;
                                c.gamma = aff >= 1;
                                c.beta = aff >= 2;
                                c.residual = res;
                                c.stats = st;
                                c.x_mean = (idx % 3) * 0.75;
                                c.x_spread = 1.0 + (idx % 5) * 0.5;
                                c.eps_mode = (idx % 7 == 3) ? LNORM_EPS_OUTSIDE : LNORM_EPS_INSIDE;
                                for (size_t hi = 0; hi < nh; hi++) {
                                    c.hidden = hs[hi];
                                    c.rows = c.hidden >= 4096 ? 3 : 5 + (int64_t)(idx % 4);
                                    c.pad = (idx + (long)hi) % 3 == 0 ? 0 : (int64_t)((idx + (long)hi) % 3) * 7 - 4;
                                    fn(&c, idx, hi, arg);
                                }
                                idx++;
                            }
}
