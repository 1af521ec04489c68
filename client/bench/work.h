/*
 * The requests lnorm-bench sends: prepared once per run (inputs, the
 * encoded lnorm.v1.Request), a zero-copy scan of replies, and the f64
 * reference check of sampled replies.
 */
#ifndef LNORM_BENCH_WORK_H
#define LNORM_BENCH_WORK_H

#include <stddef.h>
#include <stdint.h>

#include "spec.h"

enum { LNORM__PARAMS_NONE = 0, LNORM__PARAMS_INLINE = 1, LNORM__PARAMS_REGISTERED = 2 };

/* What every request of a run looks like besides its shape. */
typedef struct lnorm__wl {
    lnorm__mix mix;
    int params;       /* LNORM__PARAMS_* */
    int stats;        /* want mean/rstd */
    int residual;     /* send a residual */
    float eps;
    unsigned variants; /* distinct inputs per shape (>= 1) */
    uint64_t seed;
} lnorm__wl;

/* One prepared request. */
typedef struct lnorm__tmpl {
    lnorm__mix_shape sh;   /* y_dtype resolved (never NONE) */
    size_t shape_idx;      /* index into the mix */
    void *x, *residual;    /* rows*hidden of x_dtype (a backward's residual is its dres) */
    void *dy;              /* a backward's: rows*hidden of x_dtype */
    float *gamma, *beta;   /* hidden f32 (params != NONE) */
    char params_id[64];    /* registered params id, or "" */
    size_t x_bytes, y_bytes; /* a backward's y is its dx */
    void *msg;             /* encoded lnorm.v1.Request */
    size_t msg_len;
} lnorm__tmpl;

typedef struct lnorm__work {
    lnorm__wl wl;
    lnorm__tmpl *t;
    size_t nt;             /* = mix.n * variants */
    size_t max_y_bytes, max_x_bytes;
    uint64_t max_rows;
} lnorm__work;

/* Build every template (random inputs from wl->seed, encoded requests).
 * params_prefix names registered params ("<prefix>.<hidden>"). */
int lnorm__work_build(const lnorm__wl *wl, const char *params_prefix, lnorm__work **out);
void lnorm__work_free(lnorm__work *w);
/* The template for a uniform random number r (weights, then variant). */
size_t lnorm__work_pick(const lnorm__work *w, uint64_t r);

/* Encoded RegisterParams / DropParams requests for template i's params
 * (malloc'd into *buf; free it). 0 or -1. */
int lnorm__encode_register(const lnorm__tmpl *t, void **buf, size_t *len);
int lnorm__encode_drop(const char *id, void **buf, size_t *len);

/* What a reply says, found without copying payloads. */
typedef struct lnorm__reply {
    int code;              /* lnorm.v1.Code; 0 when absent */
    uint64_t queue_us, compute_us;
    uint32_t batch_rows, batch_requests;
    int has_timings;
    /* a NormalizeBackwardResponse's dx, dgamma, dbeta are y, mean, rstd */
    const uint8_t *y, *mean, *rstd, *res_out;
    size_t y_len, mean_len, rstd_len, res_out_len;
} lnorm__reply;

/* Scan an encoded lnorm.v1.Response. 0, or -1 if malformed. */
int lnorm__reply_scan(const void *buf, size_t len, lnorm__reply *r);

/* Check a reply's outputs against the f64 reference of template t (a
 * backward's: dx in y, dgamma in mean, dbeta in rstd).
 * Returns 0 if they match within the dtype's tolerance, else -1 with a
 * reason in why. mean/rstd/res_out may be NULL when not requested. */
int lnorm__verify(const lnorm__work *w, const lnorm__tmpl *t, const void *y, size_t y_len,
                  const void *mean, size_t mean_len, const void *rstd, size_t rstd_len,
                  const void *res_out, size_t res_out_len, char *why, size_t whylen);

#endif /* LNORM_BENCH_WORK_H */
