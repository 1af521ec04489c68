/*
 * Background load for fault tests: N client threads, each with its own NNG
 * REQ socket, sending normalize requests back to back and checking every
 * reply against the reference. Used to show that "other clients are
 * unaffected" while a test misbehaves, and by the soak test.
 */
#ifndef LNORM_FAULT_LOADGEN_H
#define LNORM_FAULT_LOADGEN_H

#include <stdint.h>

typedef struct fl_stats {
    long ok;          /* correct replies */
    long wrong;       /* replies that were not OK or not correct */
    long failed;      /* transport errors (timeouts, ...) */
    int64_t max_ms;   /* slowest exchange */
    char first_problem[256];
} fl_stats;

typedef struct fl_load fl_load;

/* Start nclients threads against url with requests of rows x hidden f32
 * (LayerNorm and RMSNorm alternating); timeout_ms bounds one exchange.
 * NULL on failure. */
fl_load *fl_start(const char *url, int nclients, uint64_t rows, uint64_t hidden, int timeout_ms);

/* A snapshot of the totals so far. */
void fl_peek(fl_load *l, fl_stats *out);

/* Add the totals s to *tot (the slowest exchange and the first problem
 * kept). */
void fl_stats_add(fl_stats *tot, const fl_stats *s);

/* Stop the threads (each finishes its exchange in progress), join, free,
 * and give the totals. */
void fl_stop(fl_load *l, fl_stats *out);

#endif /* LNORM_FAULT_LOADGEN_H */
