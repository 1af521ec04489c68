/* Kernel instantiations for x of dtype f16 (one file per dtype so that
 * nvcc compiles them in parallel). */
#include "lnorm_cuda_launch.cuh"

extern "C" int lnorm__cuda_launch_f16(int tier, const lnorm__kparams *p, void *stream)
{
    return lnorm_cuda::launch_tier<__half>(tier, p, stream);
}
