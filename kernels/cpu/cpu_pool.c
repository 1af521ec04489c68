/* The CPU runner's persistent worker pool (see cpu_pool.h). */
#include "cpu_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "lnorm/errors.h"

typedef struct pool_job {
    lnorm__pool_task_fn *fn;
    void *arg;
    int64_t ntasks;
    atomic_int_fast64_t next;  /* next task to hand out */
    atomic_int_fast64_t done;  /* tasks finished */
    int helpers;               /* workers inside this job (under the pool lock) */
    struct pool_job *link;     /* next job in the pool's list */
} pool_job;

struct lnorm__pool {
    pthread_mutex_t mu;
    pthread_cond_t work;  /* a job was added, or stop */
    pthread_cond_t idle;  /* a helper left a job, or a job finished */
    pool_job *jobs;       /* jobs with tasks left to hand out, oldest first */
    int stop;
    int nworkers;
    pthread_t *threads;
};

/* Take and run tasks of j until none are left to hand out. */
static void work_on(pool_job *j)
{
    for (;;) {
        int64_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->ntasks)
            return;
        j->fn(j->arg, i);
        atomic_fetch_add(&j->done, 1);
    }
}

/* Unlink j from the pool's list (under the lock). */
static void unlink_job(lnorm__pool *p, pool_job *j)
{
    for (pool_job **pp = &p->jobs; *pp; pp = &(*pp)->link) {
        if (*pp == j) {
            *pp = j->link;
            return;
        }
    }
}

static void *worker_main(void *arg)
{
    lnorm__pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && !p->jobs)
            pthread_cond_wait(&p->work, &p->mu);
        if (p->stop)
            break;
        pool_job *j = p->jobs;
        if (atomic_load(&j->next) >= j->ntasks) {
            unlink_job(p, j); /* exhausted: nothing more to take */
            continue;
        }
        j->helpers++;
        pthread_mutex_unlock(&p->mu);
        work_on(j);
        pthread_mutex_lock(&p->mu);
        unlink_job(p, j);
        j->helpers--;
        pthread_cond_broadcast(&p->idle);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int lnorm__pool_create(lnorm__pool **out, int nworkers)
{
    lnorm__pool *p = calloc(1, sizeof *p);
    if (!p)
        return LNORM_ENOMEM;
    p->threads = nworkers > 0 ? calloc((size_t)nworkers, sizeof *p->threads) : NULL;
    if (nworkers > 0 && !p->threads) {
        free(p);
        return LNORM_ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->idle, NULL);
    for (int i = 0; i < nworkers; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            p->nworkers = i;
            lnorm__pool_destroy(p);
            return LNORM_ENOMEM;
        }
        p->nworkers = i + 1;
        pthread_setname_np(p->threads[i], "lnorm:cpu-pool");
    }
    *out = p;
    return LNORM_OK;
}

void lnorm__pool_destroy(lnorm__pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nworkers; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->idle);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

void lnorm__pool_run(lnorm__pool *p, lnorm__pool_task_fn *fn, void *arg, int64_t ntasks)
{
    if (ntasks <= 0)
        return;
    pool_job j = {.fn = fn, .arg = arg, .ntasks = ntasks, .helpers = 0, .link = NULL};
    atomic_init(&j.next, 0);
    atomic_init(&j.done, 0);
    if (p->nworkers == 0 || ntasks == 1) {
        work_on(&j);
        return;
    }
    pthread_mutex_lock(&p->mu);
    pool_job **tail = &p->jobs;
    while (*tail)
        tail = &(*tail)->link;
    *tail = &j;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);

    work_on(&j);

    /* Every task handed out; wait for the helpers to finish theirs and to
     * let go of j (it lives on this stack). */
    pthread_mutex_lock(&p->mu);
    unlink_job(p, &j);
    while (j.helpers > 0 || atomic_load(&j.done) < j.ntasks)
        pthread_cond_wait(&p->idle, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
