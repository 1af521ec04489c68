/* The lnorm CLI's progress line (progress.h). */
#include "progress.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

static double lnorm__secs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void lnorm__progress_start(lnorm__progress *p, const char *what, uint64_t total)
{
    p->on = total > LNORM__PROGRESS_MIN && isatty(STDERR_FILENO);
    p->what = what;
    p->total = total;
    p->done = 0;
    p->t0 = lnorm__secs();
}

void lnorm__progress_step(lnorm__progress *p, uint64_t bytes)
{
    p->done += bytes;
    if (!p->on)
        return;
    double dt = lnorm__secs() - p->t0;
    fprintf(stderr, "\rlnorm: %s %3.0f%% (%.0f of %.0f MiB, %.0f MiB/s)", p->what,
            100.0 * (double)p->done / (double)p->total, p->done / 1048576.0, p->total / 1048576.0,
            dt > 0 ? p->done / 1048576.0 / dt : 0.0);
    fflush(stderr);
}

void lnorm__progress_end(lnorm__progress *p)
{
    if (p->on)
        fputc('\n', stderr);
    p->on = 0;
}
