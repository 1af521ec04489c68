/*
 * The lnorm CLI's progress line: on stderr, only when stderr is a terminal
 * and the work is over LNORM__PROGRESS_MIN bytes; rewritten in place
 * ("\r") after each step, ended with a newline.
 */
#ifndef LNORM_CLI_PROGRESS_H
#define LNORM_CLI_PROGRESS_H

#include <stdint.h>

#define LNORM__PROGRESS_MIN (64ull << 20)

typedef struct lnorm__progress {
    int on;
    const char *what;
    uint64_t total, done;
    double t0;
} lnorm__progress;

/* Start: shown when stderr is a terminal and total (bytes) is over
 * LNORM__PROGRESS_MIN. */
void lnorm__progress_start(lnorm__progress *p, const char *what, uint64_t total);

/* bytes more are done. */
void lnorm__progress_step(lnorm__progress *p, uint64_t bytes);

/* End the line (if shown). */
void lnorm__progress_end(lnorm__progress *p);

#endif
