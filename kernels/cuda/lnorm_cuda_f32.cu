/* Kernel instantiations for x of dtype f32 (one file per dtype so that
 * nvcc compiles them in parallel). */
#include "lnorm_cuda_launch.cuh"

extern "C" int lnorm__cuda_launch_f32(int tier, const lnorm__kparams *p, void *stream)
{
    return lnorm_cuda::launch_tier<float>(tier, p, stream);
}
