/* lnormd built without CUDA: the CUDA backend does not exist. */
#include "backend_cuda.h"

int lnorm__backend_cuda_create_opts(lnorm__backend **out, const lnorm__cuda_opts *o)
{
    (void)o;
    if (out)
        *out = NULL;
    return LNORM_ENOTSUP;
}

int lnorm__backend_cuda_create(lnorm__backend **out, const char *devices, size_t slot_bytes, int slots_per_gpu)
{
    (void)devices;
    (void)slot_bytes;
    (void)slots_per_gpu;
    if (out)
        *out = NULL;
    return LNORM_ENOTSUP;
}
