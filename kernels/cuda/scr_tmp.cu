#include "lnorm_cuda_kernels.cuh"
template __global__ void lnorm_cuda::k_fast<float, float, false, 256, 4, false, true, true>(const __grid_constant__ lnorm__kparams);
template __global__ void lnorm_cuda::k_fast<float, float, true, 256, 4, false, true, true>(const __grid_constant__ lnorm__kparams);
template __global__ void lnorm_cuda::k_fast<float, float, true, 1024, 4, false, true, true>(const __grid_constant__ lnorm__kparams);
template __global__ void lnorm_cuda::k_fast<float, float, false, 1024, 4, false, true, true>(const __grid_constant__ lnorm__kparams);
template __global__ void lnorm_cuda::k_fast<__nv_bfloat16, __nv_bfloat16, false, 512, 4, false, true, true>(const __grid_constant__ lnorm__kparams);
template __global__ void lnorm_cuda::k_fast<__nv_bfloat16, __nv_bfloat16, true, 512, 4, true, true, true>(const __grid_constant__ lnorm__kparams);
template __global__ void lnorm_cuda::k_fast<__nv_bfloat16, float, false, 1024, 4, true, true, true>(const __grid_constant__ lnorm__kparams);
