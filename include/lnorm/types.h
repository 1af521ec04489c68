/*
 * Element types, operations and options shared by the client API and the
 * normalization core. The numeric values equal the wire enum values in
 * proto/lnorm.proto (lnorm.v1.Op, lnorm.v1.DType, lnorm.v1.EpsMode).
 */
#ifndef LNORM_TYPES_H
#define LNORM_TYPES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which normalization to apply. */
typedef enum lnorm_op {
    LNORM_OP_LAYERNORM = 1, /* y = (x - mean) * rstd * gamma + beta */
    LNORM_OP_RMSNORM = 2    /* y = x * rstd * gamma + beta, no mean subtracted */
} lnorm_op;

/* Element types of tensors. LNORM_DTYPE_NONE means "same as x" where a
 * dtype is optional (output, parameters). */
typedef enum lnorm_dtype {
    LNORM_DTYPE_NONE = 0,
    LNORM_DTYPE_F32 = 1,
    LNORM_DTYPE_F16 = 2,
    LNORM_DTYPE_BF16 = 3
} lnorm_dtype;

/* Where eps goes: inside the square root (PyTorch's convention, default)
 * or added to the standard deviation. */
typedef enum lnorm_eps_mode {
    LNORM_EPS_INSIDE = 0,  /* rstd = 1 / sqrt(var + eps) */
    LNORM_EPS_OUTSIDE = 1  /* rstd = 1 / (sqrt(var) + eps) */
} lnorm_eps_mode;

/* The default eps when a request does not give one. */
#define LNORM_DEFAULT_EPS 1e-5f

/* Size in bytes of one element of a dtype, or 0 for an invalid dtype. */
static inline size_t lnorm_dtype_size(int dt)
{
    return dt == LNORM_DTYPE_F32 ? 4 : (dt == LNORM_DTYPE_F16 || dt == LNORM_DTYPE_BF16) ? 2 : 0;
}

/* A short name ("f32", "f16", "bf16") or "?" for an invalid dtype. */
static inline const char *lnorm_dtype_name(int dt)
{
    return dt == LNORM_DTYPE_F32 ? "f32" : dt == LNORM_DTYPE_F16 ? "f16" : dt == LNORM_DTYPE_BF16 ? "bf16" : "?";
}

#ifdef __cplusplus
}
#endif
#endif /* LNORM_TYPES_H */
