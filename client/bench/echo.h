/*
 * The echo baseline: an NNG rep0 server that sends every message back
 * unchanged, with many contexts (one receive outstanding each), so the
 * transport is measured alone. lnorm-bench runs it as a separate process
 * (`lnorm-bench --echo-serve URL`), like lnormd.
 */
#ifndef LNORM_BENCH_ECHO_H
#define LNORM_BENCH_ECHO_H

/* Serve url with ncontexts contexts until SIGTERM/SIGINT or max_seconds.
 * Writes "listen <url with real port>" to ready_file (atomically) once
 * listening. Returns a process exit status. */
int lnorm__echo_serve(const char *url, int ncontexts, const char *ready_file, int max_seconds);

#endif /* LNORM_BENCH_ECHO_H */
