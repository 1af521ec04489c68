/*
 * Several lnormd processes on one host (--workers N). NNG 1.5.2 does every
 * socket's I/O of a process on one poller thread and sends a rep0 socket's
 * replies under one lock, so one process serves some 50k messages/s
 * whatever the GPU can do. With workers > 1 the process started becomes a
 * supervisor: it forks N workers, each a whole lnormd (its own NNG, batcher
 * and backend, sharing the GPUs) on its own addresses, and forwards
 * signals to them. Clients spread over the workers by dialing all their
 * addresses (liblnorm takes several URLs). docs/ARCHITECTURE.md says why
 * this form and what it costs.
 */
#ifndef LNORM_SERVER_WORKERS_H
#define LNORM_SERVER_WORKERS_H

#include <stddef.h>

#include "config.h"

/* Worker i's configuration from cfg: worker 0 keeps every address; worker
 * i > 0 listens on ipc paths with ".i" appended and tcp / tls+tcp ports
 * plus i (port 0 stays 0), serves http on its port plus i, and writes its
 * ready file at ready-file ".wI". LNORM_EINVAL (errbuf says which) for an
 * address that cannot be offset. */
int lnorm__workers_config(const lnorm__config *cfg, int i, lnorm__config *out, char *errbuf, size_t errlen);

/* Start cfg->workers workers. In a worker it returns -1 with *cfg replaced
 * by that worker's configuration (the caller goes on as lnormd); in the
 * supervisor it returns only when every worker has exited, with lnormd's
 * exit code (0 after a clean drain, 2 when a worker could not start for its
 * configuration, 1 otherwise). */
int lnorm__workers_run(lnorm__config *cfg);

#endif
