/*
 * Shared by the standalone device experiments (bench/gpu/kexp.cu,
 * bench/gpu/xchg.cu): they include the kernel header directly, so they
 * define the tuning knobs and counters that kernels/cuda/lnorm_cuda_run.c
 * defines for the library (the same names, at the library's plain
 * defaults), and a CUDA error check that exits. (Their cluster launches
 * take cluster_config() from the kernel header.)
 */
#ifndef LNORM_BENCH_GPU_HARNESS_CUH
#define LNORM_BENCH_GPU_HARNESS_CUH

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

extern "C" {
int lnorm__bulk_enabled = 1;
int lnorm__bulk_stages_override = 0;
int lnorm__bulk_ctas_override = 0;
int lnorm__bulk_smem_kb = 64;
int lnorm__fast_grid = 0;
int lnorm__fast_aligned = 0;
int lnorm__fast_reread = 0;
int lnorm__bulk_dynamic = 1;
long lnorm__al_launches = 0;
long lnorm__rr_launches = 0;
long lnorm__bulk_launches = 0;
long lnorm__bulk_fallbacks = 0;
long lnorm__dyn_launches = 0;
}

#define CK(e)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (e);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));          \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

#endif
