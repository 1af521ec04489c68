/*
 * The oneDNN layer normalization peer of lnorm-cpu-bench (built only when
 * libdnnl is found; see CMakeLists.txt).
 */
#ifndef LNORM_BENCH_PEER_ONEDNN_H
#define LNORM_BENCH_PEER_ONEDNN_H

#include <stdint.h>

typedef struct bench_onednn bench_onednn;

/* Set up a forward-inference layer normalization (scale and shift, f32
 * parameters) of rows x hidden elements of dtype (1 f32, 3 bf16) over the
 * given buffers, with at most threads OpenMP threads. Returns NULL (and a
 * message in *why) when oneDNN refuses the configuration. */
bench_onednn *bench_onednn_create(int dtype, int64_t rows, int64_t hidden, float eps, void *x, void *y,
                                  float *gamma, float *beta, int threads, const char **why);

/* Run it once, synchronously; 0 on success. */
int bench_onednn_run(bench_onednn *b);

/* Free everything bench_onednn_create made (NULL is fine). */
void bench_onednn_destroy(bench_onednn *b);

/* oneDNN's version as "major.minor.patch". */
const char *bench_onednn_version(void);

#endif
