/* GPU memory for the cuda-ipc transport (devmem.h). */
#include "devmem.h"

#include <stdio.h>
#include <string.h>

#ifdef LNORM_BENCH_HAVE_CUDA
#include <cuda_runtime_api.h>

int lnorm__devmem_alloc(int gpu, size_t n, void **d, unsigned char handle[LNORM__DEVMEM_HANDLE_BYTES], char *err,
                        size_t errlen)
{
    cudaIpcMemHandle_t h;
    cudaError_t e = cudaSetDevice(gpu);
    *d = NULL;
    if (e == cudaSuccess)
        e = cudaMalloc(d, n);
    if (e == cudaSuccess)
        e = cudaIpcGetMemHandle(&h, *d);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "GPU %d: %zu bytes of GPU memory and their IPC handle: %s", gpu, n,
                 cudaGetErrorString(e));
        if (*d)
            cudaFree(*d);
        *d = NULL;
        (void)cudaGetLastError();
        return -1;
    }
    _Static_assert(sizeof h == LNORM__DEVMEM_HANDLE_BYTES, "cudaIpcMemHandle_t is 64 bytes");
    memcpy(handle, &h, sizeof h);
    return 0;
}

/* (The calling thread's current GPU is set first: otherwise a thread that
 * never chose one would use, and create a context on, GPU 0.) */
int lnorm__devmem_put(int gpu, void *d, const void *h, size_t n)
{
    return cudaSetDevice(gpu) == cudaSuccess && cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
}

int lnorm__devmem_get(int gpu, void *h, const void *d, size_t n)
{
    return cudaSetDevice(gpu) == cudaSuccess && cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

void lnorm__devmem_free(int gpu, void *d)
{
    if (d && cudaSetDevice(gpu) == cudaSuccess)
        cudaFree(d);
}

#else

int lnorm__devmem_alloc(int gpu, size_t n, void **d, unsigned char handle[LNORM__DEVMEM_HANDLE_BYTES], char *err,
                        size_t errlen)
{
    (void)gpu;
    (void)n;
    (void)handle;
    *d = NULL;
    snprintf(err, errlen, "this lnorm-bench was built without CUDA: --transport cuda-ipc needs a build with the "
                          "CUDA toolkit");
    return -1;
}

int lnorm__devmem_put(int gpu, void *d, const void *h, size_t n)
{
    (void)gpu;
    (void)d;
    (void)h;
    (void)n;
    return -1;
}

int lnorm__devmem_get(int gpu, void *h, const void *d, size_t n)
{
    (void)gpu;
    (void)h;
    (void)d;
    (void)n;
    return -1;
}

void lnorm__devmem_free(int gpu, void *d)
{
    (void)gpu;
    (void)d;
}

#endif
