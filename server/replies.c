/* The reply pool (replies.h): one queue under one lock, workers take a
 * share of it at a time so that a batch's replies spread over them. */
#include <pthread.h>
#include <stdlib.h>

#include "lnorm/errors.h"
#include "replies.h"

/* Most requests a worker takes at once: enough to make the lock cheap,
 * few enough that a batch of ~100 replies still spreads over the pool. */
#define LNORM__REPLIES_TAKE 16

struct lnorm__replies {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* requests queued, or stopping */
    pthread_cond_t idle_cv;  /* pending reached 0 */
    lnorm__req *head, *tail;
    size_t queued;
    size_t pending;          /* queued + being finished */
    int idle;                /* workers waiting on work_cv */
    int stopping;
    int nthreads;
    pthread_t *threads;
    lnorm__replies_fn fn;
    void *arg;
};

static void *lnorm__replies_main(void *arg)
{
    lnorm__replies *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->stopping) {
            p->idle++;
            pthread_cond_wait(&p->work_cv, &p->mu);
            p->idle--;
        }
        if (!p->head)
            break; /* stopping, and the queue is empty */
        /* A fair share of what is queued, at most LNORM__REPLIES_TAKE. */
        size_t take = p->queued / (size_t)p->nthreads;
        take = take < 1 ? 1 : take > LNORM__REPLIES_TAKE ? LNORM__REPLIES_TAKE : take;
        lnorm__req *list = p->head, *last = list;
        for (size_t i = 1; i < take && last->next; i++)
            last = last->next;
        p->head = last->next;
        if (!p->head)
            p->tail = NULL;
        last->next = NULL;
        size_t n = 0;
        for (lnorm__req *r = list; r; r = r->next)
            n++;
        p->queued -= n;
        if (p->head && p->idle)
            pthread_cond_signal(&p->work_cv); /* more left: pass it on */
        pthread_mutex_unlock(&p->mu);
        while (list) {
            lnorm__req *r = list;
            list = r->next;
            r->next = NULL;
            p->fn(p->arg, r);
        }
        pthread_mutex_lock(&p->mu);
        p->pending -= n;
        if (p->pending == 0)
            pthread_cond_broadcast(&p->idle_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int lnorm__replies_create(lnorm__replies **out, int nthreads, lnorm__replies_fn fn, void *arg)
{
    *out = NULL;
    if (nthreads < 1 || !fn)
        return LNORM_EINVAL;
    lnorm__replies *p = calloc(1, sizeof *p);
    if (!p)
        return LNORM_ENOMEM;
    p->threads = calloc((size_t)nthreads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return LNORM_ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->idle_cv, NULL);
    p->fn = fn;
    p->arg = arg;
    for (int i = 0; i < nthreads; i++) {
        if (pthread_create(&p->threads[i], NULL, lnorm__replies_main, p) != 0)
            break;
        pthread_setname_np(p->threads[i], "lnorm:reply"); /* per-thread CPU in top / /proc */
        p->nthreads++;
    }
    if (p->nthreads == 0) {
        lnorm__replies_destroy(p);
        return LNORM_EINTERNAL;
    }
    *out = p;
    return LNORM_OK;
}

void lnorm__replies_push(lnorm__replies *p, lnorm__req *head, lnorm__req *tail, size_t n)
{
    if (!head)
        return;
    tail->next = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->tail)
        p->tail->next = head;
    else
        p->head = head;
    p->tail = tail;
    p->queued += n;
    p->pending += n;
    /* One waiter is woken; it wakes the next while work is left. */
    if (p->idle)
        pthread_cond_signal(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
}

size_t lnorm__replies_pending(lnorm__replies *p)
{
    pthread_mutex_lock(&p->mu);
    size_t n = p->pending;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void lnorm__replies_wait_idle(lnorm__replies *p)
{
    pthread_mutex_lock(&p->mu);
    while (p->pending)
        pthread_cond_wait(&p->idle_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void lnorm__replies_destroy(lnorm__replies *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL); /* each leaves once the queue is empty */
    pthread_cond_destroy(&p->idle_cv);
    pthread_cond_destroy(&p->work_cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}
