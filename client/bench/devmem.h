/* GPU memory for lnorm-bench's cuda-ipc transport: one allocation a run,
 * its CUDA IPC handle, copies in and out. Built on the CUDA runtime where
 * lnorm-bench is built with CUDA; elsewhere every call fails and says so. */
#ifndef LNORM_BENCH_DEVMEM_H
#define LNORM_BENCH_DEVMEM_H

#include <stddef.h>

#define LNORM__DEVMEM_HANDLE_BYTES 64

/* n bytes of GPU gpu's memory in *d and its IPC handle in handle. 0, or -1
 * with the reason in err. */
int lnorm__devmem_alloc(int gpu, size_t n, void **d, unsigned char handle[LNORM__DEVMEM_HANDLE_BYTES], char *err,
                        size_t errlen);
/* Copies between host and device memory of GPU gpu (synchronous; any
 * thread): 0 or -1. */
int lnorm__devmem_put(int gpu, void *d, const void *h, size_t n);
int lnorm__devmem_get(int gpu, void *h, const void *d, size_t n);
/* Free an allocation of GPU gpu (NULL is a no-op). */
void lnorm__devmem_free(int gpu, void *d);

#endif
