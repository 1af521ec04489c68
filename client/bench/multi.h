/*
 * Load from many processes (lnorm-bench --procs N): NNG runs all socket I/O
 * of a process on one poller thread, so one load process measures itself
 * beyond some tens of thousands of messages/s. N children, forked before
 * the parent makes any NNG call, each run every point with their share of
 * the load. Per point: each child opens its transport and says so on its
 * status pipe ('R'); once all are ready the parent releases them together
 * ('G' on their go pipes), so their measured windows coincide; each writes
 * its result and histogram to a file and says 'D'. The parent merges the
 * files into one result. A child that dies or does not answer in time is
 * an error of that point, and every child is then killed: the parent never
 * hangs on one.
 */
#ifndef LNORM_BENCH_MULTI_H
#define LNORM_BENCH_MULTI_H

#include <stddef.h>
#include <sys/types.h>

#include "hist.h"
#include "load.h"

#define LNORM__PROCS_MAX 256

/* The body of child `index`: runs every point, each through
 * lnorm__multi_child_ready (as the run's before_start) and
 * lnorm__multi_child_done. Returns its exit status. */
typedef int (*lnorm__multi_body)(void *arg, int index);

typedef struct lnorm__multi {
    int n;
    pid_t pid[LNORM__PROCS_MAX];   /* 0 once reaped */
    int go_fd[LNORM__PROCS_MAX];   /* parent -> child i */
    int st_fd[LNORM__PROCS_MAX];   /* child i -> parent */
    char dir[256];                 /* private folder of the result files */
    int failed;                    /* a child died or hung: the rest are killed */
} lnorm__multi;

/* Fork n children running body(arg, i). 0, or -1 with a message in err
 * (children already started are stopped). */
int lnorm__multi_start(lnorm__multi *m, int n, lnorm__multi_body body, void *arg, char *err,
                       size_t errlen);

/* One point on the parent's side: wait up to ready_ms for every child to
 * be ready, release them together, wait up to done_ms for every result,
 * and merge them into res (res->parts: the n children's own results,
 * malloc'd; free it). server_pid > 0: that process's CPU over the point is
 * measured here. Returns 0; res->error is set when the point failed. */
int lnorm__multi_point(lnorm__multi *m, int server_pid, int ready_ms, int done_ms, lnorm__runres *res);

/* Close the go pipes (children end), wait up to 5 s, kill what is left,
 * remove the folder. */
void lnorm__multi_stop(lnorm__multi *m);

/* In child i: the barrier (a before_start hook; arg is the lnorm__multi):
 * 0 when released, -1 when the parent is gone or ends the run. */
int lnorm__multi_child_ready(void *arg);
/* In child i: hand res and its histogram to the parent. 0 or -1. */
int lnorm__multi_child_done(lnorm__multi *m, const lnorm__runres *res, const lnorm__hist *h);
/* In a child: its index (set before body runs). */
extern int lnorm__multi_index;

/* Merge n per-process results (label, load, counts, rates, verification,
 * client CPU) into out, the latencies from hist (the children's
 * histograms summed). Server CPU is left unknown (-1): the caller measures
 * it. */
void lnorm__runres_merge(lnorm__runres *out, const lnorm__runres *parts, int n, const lnorm__hist *hist);

#endif /* LNORM_BENCH_MULTI_H */
