/* The CPU backend adapter (backend_cpu.c): lnormd's batches run on the
 * kernels' CPU runner (kernels/cpu). Contract: backend.h. */
#ifndef LNORM_SERVER_BACKEND_CPU_H
#define LNORM_SERVER_BACKEND_CPU_H

#include "backend.h"

/* nthreads: workers of the CPU runner's pool (0: cores); njobs: batches run
 * at once, 1..64 (each on its own job thread, sharing the pool). */
int lnorm__backend_cpu_create(lnorm__backend **out, int nthreads, int njobs);

#endif
