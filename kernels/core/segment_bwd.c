/* Backward segment defaults and validation, shared by every backend. */
#include <stdint.h>
#include <string.h>

#include "lnorm_core.h"

void lnorm_bwd_segment_init(lnorm_bwd_segment *s, lnorm_op op, lnorm_dtype x_dtype,
                            int64_t rows, int64_t hidden)
{
    memset(s, 0, sizeof *s);
    s->op = op;
    s->x_dtype = s->dy_dtype = s->dx_dtype = s->param_dtype = x_dtype;
    s->eps_mode = LNORM_EPS_INSIDE;
    s->eps = LNORM_DEFAULT_EPS;
    s->rows = rows;
    s->hidden = hidden;
    s->x_stride = s->dy_stride = s->dx_stride = s->dres_stride = hidden;
}

#define LNORM__FAIL(msg)      \
    do {                      \
        if (why)              \
            *why = (msg);     \
        return LNORM_EINVAL;  \
    } while (0)

/* Whether rows x stride elements of size esz (the last row only hidden
 * long) fit in a byte offset that neither int64_t nor size_t overflows. */
static int extent_fits(int64_t rows, int64_t stride, int64_t hidden, size_t esz)
{
    const int64_t lim = (int64_t)((SIZE_MAX < (uint64_t)INT64_MAX ? SIZE_MAX : (uint64_t)INT64_MAX) / 8);
    if (rows - 1 > (lim - hidden) / stride)
        return 0;
    return ((rows - 1) * stride + hidden) <= lim / (int64_t)esz;
}

int lnorm_bwd_segment_validate(const lnorm_bwd_segment *s, const char **why)
{
    if (!s)
        LNORM__FAIL("segment is NULL");
    if (s->op != LNORM_OP_LAYERNORM && s->op != LNORM_OP_RMSNORM)
        LNORM__FAIL("op: unknown operation");
    if (!lnorm_dtype_size(s->x_dtype))
        LNORM__FAIL("x_dtype: unknown dtype");
    if (!lnorm_dtype_size(s->dy_dtype))
        LNORM__FAIL("dy_dtype: unknown dtype");
    if (!lnorm_dtype_size(s->dx_dtype))
        LNORM__FAIL("dx_dtype: unknown dtype");
    if (s->param_dtype != LNORM_DTYPE_F32 && s->param_dtype != s->x_dtype)
        LNORM__FAIL("param_dtype: must be f32 or the dtype of x");
    if (lnorm_eps_validate(s->eps, s->eps_mode, why) != LNORM_OK)
        return LNORM_EINVAL;
    if (s->rows < 1)
        LNORM__FAIL("rows: must be >= 1");
    if (s->hidden < 1)
        LNORM__FAIL("hidden: must be >= 1");
    if (s->hidden > (int64_t)LNORM_CORE_MAX_HIDDEN)
        LNORM__FAIL("hidden: larger than the core's limit");
    if (!s->x)
        LNORM__FAIL("x: NULL");
    if (!s->dy)
        LNORM__FAIL("dy: NULL");
    if (!s->dx)
        LNORM__FAIL("dx: NULL");
    if (s->x_stride < s->hidden)
        LNORM__FAIL("x_stride: smaller than hidden");
    if (s->dy_stride < s->hidden)
        LNORM__FAIL("dy_stride: smaller than hidden");
    if (s->dx_stride < s->hidden)
        LNORM__FAIL("dx_stride: smaller than hidden");
    if (!extent_fits(s->rows, s->x_stride, s->hidden, lnorm_dtype_size(s->x_dtype)))
        LNORM__FAIL("x_stride: rows x stride overflows");
    if (!extent_fits(s->rows, s->dy_stride, s->hidden, lnorm_dtype_size(s->dy_dtype)))
        LNORM__FAIL("dy_stride: rows x stride overflows");
    if (!extent_fits(s->rows, s->dx_stride, s->hidden, lnorm_dtype_size(s->dx_dtype)))
        LNORM__FAIL("dx_stride: rows x stride overflows");
    if (s->dres) {
        if (s->dres_stride < s->hidden)
            LNORM__FAIL("dres_stride: smaller than hidden");
        if (!extent_fits(s->rows, s->dres_stride, s->hidden, lnorm_dtype_size(s->x_dtype)))
            LNORM__FAIL("dres_stride: rows x stride overflows");
    }
    if (s->mean && s->op == LNORM_OP_RMSNORM)
        LNORM__FAIL("mean: RMSNorm has no mean");
    if (s->mean && !s->rstd)
        LNORM__FAIL("mean: given without rstd");
    return LNORM_OK;
}
