/* The CPU backend adapter's extra constructor (see backend.h for the rest). */
#ifndef LNORM_SERVER_BACKEND_CPU_H
#define LNORM_SERVER_BACKEND_CPU_H

#include "backend.h"

/* nthreads: workers of the core's pool (0: cores); njobs: batches run at
 * once (each on its own job thread, sharing the pool). */
int lnorm__backend_cpu_create_ex(lnorm__backend **out, int nthreads, int njobs);

#endif
