/* Backward kernel instantiations for x of dtype f32 (one file per dtype so
 * that nvcc compiles them in parallel). */
#include "lnorm_cuda_bwd.cuh"

extern "C" int lnorm__cuda_bwd_launch_f32(int tier, int fast, const lnorm__bparams *p, void *stream)
{
    return lnorm_cuda::launch_bwd_tier<float>(tier, fast != 0, p, stream);
}

/* The dgamma/dbeta reduction (partials are f32 whatever x's dtype): one
 * CTA a block of LNORM__BWD_RCOLS columns. */
extern "C" int lnorm__cuda_bwd_reduce(const lnorm__bparams *p, void *stream)
{
    int64_t n = p->total < (1 << 26) ? p->total : (1 << 26);
    lnorm_cuda::k_bwd_reduce<LNORM__BWD_RCOLS><<<(unsigned)n, 1024, 0, (cudaStream_t)stream>>>(*p);
    return (int)cudaGetLastError();
}
