/*
 * Internal to the CPU runner: a persistent pthread pool that runs "jobs"
 * made of independent tasks numbered 0..ntasks-1. The submitting thread
 * works on its own job too and returns when every task of it is done.
 * Several threads may submit jobs at once; workers help whichever job is
 * oldest.
 */
#ifndef LNORM_CPU_POOL_H
#define LNORM_CPU_POOL_H

#include <stdint.h>

typedef struct lnorm__pool lnorm__pool;

/* Run task i of a job (arg is the job's). */
typedef void lnorm__pool_task_fn(void *arg, int64_t i);

/* Start a pool of nworkers background threads (0 is allowed: then every
 * job runs on its submitter). Returns LNORM_OK and sets *out, or an error. */
int lnorm__pool_create(lnorm__pool **out, int nworkers);

/* Stop the workers and free the pool (no job may be in flight). */
void lnorm__pool_destroy(lnorm__pool *p);

/* Run fn(arg, i) for i in [0, ntasks), on the caller and the workers;
 * returns when all are done. */
void lnorm__pool_run(lnorm__pool *p, lnorm__pool_task_fn *fn, void *arg, int64_t ntasks);

#endif /* LNORM_CPU_POOL_H */
