/*
 * A device mirror of a host test case (tests/common/testcase.h): every
 * buffer copied to the GPU (inputs random, outputs still poisoned), a
 * segment with device pointers, and the copy back of the outputs.
 */
#ifndef LNORM_GPU_CASE_H
#define LNORM_GPU_CASE_H

#include <stddef.h>

#include "testcase.h"

/* Device buffers of one case; one element added to the base pointers that
 * lnorm_gpu_case_make's misalign shifts. */
typedef struct lnorm_gpu_case {
    lnorm_segment seg; /* device pointers */
    void *raw[8];      /* cudaMalloc'ed blocks (x, y, res, res_out, g, b, mean, rstd) */
} lnorm_gpu_case;

/* Mirror tc on the current device; misalign 1: shift every tensor by one
 * element, 2: y alone (x aligned, so the bulk kernels still run, with a
 * misaligned output). Returns LNORM_OK or LNORM_ECUDA (nothing left
 * allocated). */
int lnorm_gpu_case_make(lnorm_gpu_case *gc, const lnorm_test_case *tc, int misalign);

/* Copy the device outputs (y, residual_out, mean, rstd, padding included)
 * back into tc's buffers. Returns LNORM_OK or LNORM_ECUDA. */
int lnorm_gpu_case_fetch(const lnorm_gpu_case *gc, lnorm_test_case *tc);

/* Free the device buffers (a zeroed mirror is fine). */
void lnorm_gpu_case_free(lnorm_gpu_case *gc);

#endif /* LNORM_GPU_CASE_H */
