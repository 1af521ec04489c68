/*
 * A CPU stand-in for the part of the CUDA runtime that server/backend_cuda.c
 * uses, for gpu.backend_mock (tests/gpu/CMakeLists.txt): the backend's own
 * logic (staging layout, gather/scatter, parameter de-duplication, slots,
 * locks, completion order, CPU fallback, fault injection) tested on any
 * machine. "Device" memory is host memory; a stream is a thread that runs
 * its queued copies, kernels (the CPU core) and event records in order,
 * after random short delays, so that a host buffer reused before the
 * stream has finished with it shows up as wrong results. Nothing here says
 * anything about real GPU timing or about the kernels themselves.
 */
#ifndef HA_MOCK_CUDA_RUNTIME_API_H
#define HA_MOCK_CUDA_RUNTIME_API_H
#include <stddef.h>
typedef enum cudaError { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorLaunchFailure = 719 } cudaError_t;
typedef struct mock_stream *cudaStream_t;
typedef struct mock_event *cudaEvent_t;
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
#define cudaStreamNonBlocking 1
#define cudaEventDisableTiming 2
#define cudaEventBlockingSync 1
#define cudaDeviceScheduleAuto 0
#define cudaDeviceScheduleSpin 1
#define cudaDeviceScheduleYield 2
#define cudaDeviceScheduleBlockingSync 4
#define cudaDeviceScheduleMask 7
#define cudaDeviceMapHost 8
#define cudaInitDeviceFlagsAreValid 1
#define cudaHostAllocPortable 1
#define cudaHostRegisterPortable 1
#define cudaHostRegisterMapped 2
#define cudaIpcMemLazyEnablePeerAccess 1
#define cudaEnableDefault 0
typedef struct cudaIpcMemHandle_st { char reserved[64]; } cudaIpcMemHandle_t;
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1 };
struct cudaDeviceProp { char name[256]; int major, minor; size_t totalGlobalMem; };
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaInitDevice(int d, unsigned df, unsigned f);
cudaError_t cudaGetDeviceFlags(unsigned *f);
cudaError_t cudaSetDeviceFlags(unsigned f);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned f);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostRegister(void *p, size_t n, unsigned f);
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned f);
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned f);
cudaError_t cudaIpcCloseMemHandle(void *p);
cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned v, unsigned long long f,
                                             enum cudaDriverEntryPointQueryResult *q);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
/* Synchronous: the mock's tests call it only with no work in flight on those buffers. */
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h, enum cudaMemcpyKind k,
                              cudaStream_t st);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
#endif
