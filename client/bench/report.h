/*
 * lnorm-bench results: the table on stdout, JSON, CSV and the SVG plot.
 */
#ifndef LNORM_BENCH_REPORT_H
#define LNORM_BENCH_REPORT_H

#include <stddef.h>
#include <stdio.h>

#include "load.h"

typedef struct lnorm__report {
    const lnorm__runres *runs;
    size_t n;
    const char *date;      /* ISO 8601 UTC */
    const char *device;    /* CPU model */
    const char *commit;
    const char *host;
    const char *url;
    const char *workload;  /* the mix, as given */
    const char *cmdline;
    const char *params;    /* none | inline | registered */
    int stats, residual;
    double duration_s, warmup_s;
    const char *const *tags; /* "KEY=VALUE" */
    size_t ntags;
    int procs;             /* load processes (--procs) */
} lnorm__report;

/* lnormd / echo at the same load: throughput and latency ratios. Returns
 * the echo run matching runs[i] (same load, other label), or NULL. */
const lnorm__runres *lnorm__report_echo_peer(const lnorm__report *rp, size_t i);

void lnorm__report_table(const lnorm__report *rp, FILE *out);
int lnorm__report_json(const lnorm__report *rp, const char *path);
int lnorm__report_csv(const lnorm__report *rp, const char *path);
int lnorm__report_svg(const lnorm__report *rp, const char *path);

#endif /* LNORM_BENCH_REPORT_H */
