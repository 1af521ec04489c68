/* Device mirrors of host test cases (see gpu_case.h). */
#include "gpu_case.h"

#include <string.h>

#include <cuda_runtime_api.h>

/* Allocate bytes (+ shift) on the device, upload src there; *dev is the
 * shifted pointer. */
static int up(void **raw, void **dev, const void *src, size_t bytes, size_t shift)
{
    *raw = NULL;
    *dev = NULL;
    if (!src)
        return 0;
    if (cudaMalloc(raw, bytes + 16) != cudaSuccess) {
        *raw = NULL;
        return -1;
    }
    *dev = (char *)*raw + shift;
    return cudaMemcpy(*dev, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
}

int lnorm_gpu_case_make(lnorm_gpu_case *gc, const lnorm_test_case *tc, int misalign)
{
    memset(gc, 0, sizeof *gc);
    const lnorm_segment *s = &tc->seg;
    size_t xs = lnorm_dtype_size(s->x_dtype), ys = lnorm_dtype_size(s->y_dtype);
    size_t ps = lnorm_dtype_size(s->param_dtype), rows = (size_t)s->rows, h = (size_t)s->hidden;
    gc->seg = *s;
    void *d[8];
    int rc = 0;
    const int all = misalign == 1;
    rc |= up(&gc->raw[0], &d[0], tc->x, tc->x_bytes, all ? xs : 0);
    rc |= up(&gc->raw[1], &d[1], tc->y, tc->y_bytes, misalign ? ys : 0);
    rc |= up(&gc->raw[2], &d[2], tc->residual, tc->res_bytes, all ? xs : 0);
    rc |= up(&gc->raw[3], &d[3], tc->residual_out, tc->res_bytes, all ? xs : 0);
    rc |= up(&gc->raw[4], &d[4], tc->gamma, h * ps, all ? ps : 0);
    rc |= up(&gc->raw[5], &d[5], tc->beta, h * ps, all ? ps : 0);
    rc |= up(&gc->raw[6], &d[6], tc->mean, rows * 4, all ? 4 : 0);
    rc |= up(&gc->raw[7], &d[7], tc->rstd, rows * 4, all ? 4 : 0);
    if (rc) {
        lnorm_gpu_case_free(gc);
        return LNORM_ECUDA;
    }
    gc->seg.x = d[0];
    gc->seg.y = d[1];
    gc->seg.residual = d[2];
    gc->seg.residual_out = d[3];
    gc->seg.gamma = d[4];
    gc->seg.beta = d[5];
    gc->seg.mean = d[6];
    gc->seg.rstd = d[7];
    return LNORM_OK;
}

int lnorm_gpu_case_fetch(const lnorm_gpu_case *gc, lnorm_test_case *tc)
{
    size_t rows = (size_t)tc->seg.rows;
    if (cudaDeviceSynchronize() != cudaSuccess)
        return LNORM_ECUDA;
    if (cudaMemcpy(tc->y, gc->seg.y, tc->y_bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
        return LNORM_ECUDA;
    if (tc->residual_out &&
        cudaMemcpy(tc->residual_out, gc->seg.residual_out, tc->res_bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
        return LNORM_ECUDA;
    if (tc->mean && cudaMemcpy(tc->mean, gc->seg.mean, rows * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
        return LNORM_ECUDA;
    if (tc->rstd && cudaMemcpy(tc->rstd, gc->seg.rstd, rows * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
        return LNORM_ECUDA;
    return LNORM_OK;
}

void lnorm_gpu_case_free(lnorm_gpu_case *gc)
{
    for (int i = 0; i < 8; i++)
        if (gc->raw[i])
            cudaFree(gc->raw[i]);
    memset(gc, 0, sizeof *gc);
}
