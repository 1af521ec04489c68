/*
 * A small .npy reader/writer for the lnorm CLI: format version 1.0 (2.0 and
 * 3.0 headers are read too), little-endian '<f4' and '<f2', bfloat16 as
 * numpy saves an ml_dtypes.bfloat16 array ('<V2', 2-byte raw elements:
 * np.load(f).view(ml_dtypes.bfloat16) gets it back), and '<f8' (read only,
 * for lnorm__npy_to_f32), C order, 1-D or 2-D. Anything else is rejected
 * with a message saying why.
 */
#ifndef LNORM_CLI_NPY_H
#define LNORM_CLI_NPY_H

#include <stddef.h>
#include <stdint.h>

/* An array read from a .npy file; data is malloc'ed and owned by it. */
/* The dtype of a float64 array read (not a dtype of lnorm's). */
#define LNORM__NPY_F64 64

typedef struct lnorm__npy {
    int dtype;          /* LNORM_DTYPE_F32, _F16, _BF16, or LNORM__NPY_F64 */
    int ndim;           /* 1 or 2 */
    uint64_t shape[2];  /* shape[1] unused for 1-D */
    void *data;
    size_t nbytes;
} lnorm__npy;

/* Read path into *a. Returns 0, or -1 with a message in err. */
int lnorm__npy_read(const char *path, lnorm__npy *a, char *err, size_t errlen);

/* Convert a float64 array to float32 in place (nearest). A finite element
 * beyond float32's range is an error: 0, or -1 with err. Any other dtype
 * is left as it is. */
int lnorm__npy_to_f32(lnorm__npy *a, char *err, size_t errlen);

/* Write an array (dtype F32, F16 or BF16, 1-D or 2-D) to path, atomically
 * (a temporary file renamed into place). Returns 0, or -1 with err. */
int lnorm__npy_write(const char *path, int dtype, int ndim, const uint64_t *shape,
                     const void *data, char *err, size_t errlen);

/* Free an array's data (the struct itself is the caller's). */
void lnorm__npy_free(lnorm__npy *a);

/* Read a whole raw file of exactly nbytes bytes into a malloc'ed buffer. */
int lnorm__raw_read(const char *path, size_t nbytes, void **out, char *err, size_t errlen);

/* Write nbytes raw bytes to path (atomically, as above). */
int lnorm__raw_write(const char *path, const void *data, size_t nbytes, char *err, size_t errlen);

#endif /* LNORM_CLI_NPY_H */
