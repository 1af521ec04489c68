/*
 * Workload description of lnorm-bench: the shapes to send (a weighted mix)
 * and the small list parsers of the command line.
 */
#ifndef LNORM_BENCH_SPEC_H
#define LNORM_BENCH_SPEC_H

#include <stddef.h>
#include <stdint.h>

#define LNORM__MIX_MAX 16
#define LNORM__LIST_MAX 32

/* lnorm-bench's backward ops (ln-bwd, rms-bwd): the forward's lnorm_op
 * with this bit; such a request is a NormalizeBackward of the shape (x and
 * dy of x's dtype, dx of the out dtype, dgamma and dbeta asked for). */
#define LNORM__OP_BWD 0x10
#define LNORM__OP_BASE(op) ((op) & ~LNORM__OP_BWD)
#define LNORM__OP_IS_BWD(op) (((op) & LNORM__OP_BWD) != 0)

/* One request shape of the mix. */
typedef struct lnorm__mix_shape {
    int op;           /* lnorm_op, with LNORM__OP_BWD for a backward */
    int x_dtype;      /* lnorm_dtype */
    int y_dtype;      /* lnorm_dtype (NONE: same as x) */
    uint64_t rows;
    uint64_t hidden;
    unsigned weight;  /* relative frequency, >= 1 */
} lnorm__mix_shape;

typedef struct lnorm__mix {
    lnorm__mix_shape shapes[LNORM__MIX_MAX];
    size_t n;
    unsigned total_weight;
} lnorm__mix;

/* Parse "ROWSxHIDDEN[:TOKEN]..." entries separated by commas. Tokens, in
 * any order: a dtype (f32, f16, bf16), an op (ln, rms, ln-bwd, rms-bwd), out=DTYPE, or a
 * weight (a positive integer). What a token does not set comes from def.
 * Returns 0, or -1 with a message in err (errlen bytes). */
int lnorm__mix_parse(const char *s, const lnorm__mix_shape *def, lnorm__mix *out, char *err,
                     size_t errlen);

/* Pick a shape by a uniform random number r in [0, total_weight). */
size_t lnorm__mix_pick(const lnorm__mix *m, unsigned r);

/* "f32" -> LNORM_DTYPE_F32 ...; -1 if unknown. */
int lnorm__dtype_parse(const char *s);
/* "ln"/"layernorm" -> LNORM_OP_LAYERNORM, "rms"/"rmsnorm" -> RMSNORM,
 * "ln-bwd" / "rms-bwd" -> the same | LNORM__OP_BWD; -1. */
int lnorm__op_parse(const char *s);
const char *lnorm__op_name(int op);

/* Parse a comma list of positive numbers ("1,8,64", "1000,2500.5").
 * Returns the count (1..max) or -1. */
int lnorm__list_parse(const char *s, double *vals, int max);

/* "4096", "64M", "1G" ("K"/"M"/"G" = 2^10/2^20/2^30). Returns 0 or -1. */
int lnorm__size_parse(const char *s, uint64_t *out);

#endif /* LNORM_BENCH_SPEC_H */
