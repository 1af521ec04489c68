/* Backward kernel instantiations for x of dtype f16 (one file per dtype so
 * that nvcc compiles them in parallel). */
#include "lnorm_cuda_bwd.cuh"

extern "C" int lnorm__cuda_bwd_launch_f16(int tier, int fast, const lnorm__bparams *p, void *stream)
{
    return lnorm_cuda::launch_bwd_tier<__half>(tier, fast != 0, p, stream);
}
