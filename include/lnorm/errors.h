/*
 * lnorm error codes: one enum with fixed numbers, shared by the daemon, the
 * client library and the normalization core. Generated from one X-macro
 * table so that the enum, lnorm_strerror() and the mapping to wire status
 * codes never disagree (the functions: common/errors.c). Numbers are part
 * of the ABI: never renumber.
 */
#ifndef LNORM_ERRORS_H
#define LNORM_ERRORS_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, number, wire status code (lnorm.v1.Code), message) */
#define LNORM_ERRNO_MAP(X)                                                   \
    X(OK, 0, 0, "success")                                                   \
    X(EINVAL, 1, 3, "invalid argument")                                      \
    X(ENOMEM, 2, 8, "out of memory")                                         \
    X(ENOTFOUND, 3, 5, "not found")                                          \
    X(EEXIST, 4, 6, "already exists")                                        \
    X(ELIMIT, 5, 8, "resource limit exceeded")                               \
    X(EQUEUEFULL, 6, 8, "queue full")                                        \
    X(ETIMEDOUT, 7, 4, "deadline exceeded")                                  \
    X(EUNAVAIL, 8, 14, "service unavailable")                                \
    X(ECLOSED, 9, 14, "object closed")                                       \
    X(EPROTO, 10, 13, "protocol error")                                      \
    X(ETRANSPORT, 11, 14, "transport error")                                 \
    X(EBACKEND, 12, 13, "backend failure")                                   \
    X(ENOTSUP, 13, 12, "not supported")                                      \
    X(EINTERNAL, 14, 13, "internal error")                                   \
    X(EIO, 15, 13, "input/output error")                                     \
    X(ECANCELED, 16, 1, "operation canceled")                                \
    X(ENODEV, 17, 14, "no such device")                                      \
    X(ECUDA, 18, 13, "CUDA error")                                           \
    X(EPERM, 19, 7, "permission denied")

/* The error codes returned by every lnorm function (0 is success). */
typedef enum lnorm_err {
#define LNORM__ERR_ENUM(name, num, code, msg) LNORM_##name = num,
    LNORM_ERRNO_MAP(LNORM__ERR_ENUM)
#undef LNORM__ERR_ENUM
    LNORM_ERR_COUNT
} lnorm_err;

/* A static, human-readable description of an lnorm error code; never NULL.
 * Unknown codes give "unknown error". */
const char *lnorm_strerror(int err);

/* The symbolic name of an error code ("LNORM_EINVAL"), or "LNORM_UNKNOWN". */
const char *lnorm_errname(int err);

/* The lnorm.v1.Code wire status that an error code maps to. */
int lnorm_err_to_status(int err);

/* The lnorm error code that best matches a wire status code. */
int lnorm_status_to_err(int status);

#ifdef __cplusplus
}
#endif
#endif /* LNORM_ERRORS_H */
