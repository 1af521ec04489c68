/* The .npy reader/writer of the lnorm CLI (see npy.h). */
#include "npy.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lnorm/types.h"

static int failf(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

void lnorm__npy_free(lnorm__npy *a)
{
    if (a) {
        free(a->data);
        a->data = NULL;
    }
}

/* The header is a Python dict literal, as numpy writes it:
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }
 * read by a small tokenizer: exactly the keys descr, fortran_order and
 * shape, each once (numpy requires these three; a duplicate key, which
 * numpy would resolve to its last value, is refused rather than guessed),
 * string values in quotes without escapes, True/False, a tuple of decimal
 * integers (a trailing L, as Python 2 wrote, allowed); then only
 * whitespace. */
static void skip_ws(const char **s)
{
    while (**s == ' ' || **s == '\t' || **s == '\n' || **s == '\r')
        (*s)++;
}

/* A quoted string (either quote, no backslash) into out (cap bytes). */
static int quoted(const char **s, char *out, size_t cap)
{
    char q = **s;
    if (q != '\'' && q != '"')
        return -1;
    const char *b = ++*s, *e = b;
    while (*e && *e != q && *e != '\\')
        e++;
    if (*e != q || (size_t)(e - b) >= cap)
        return -1;
    memcpy(out, b, (size_t)(e - b));
    out[e - b] = 0;
    *s = e + 1;
    return 0;
}

static int parse_shape(const char **sp, lnorm__npy *a, char *err, size_t n)
{
    const char *s = *sp;
    if (*s != '(')
        return failf(err, n, "malformed 'shape'");
    s++;
    a->ndim = 0;
    for (;;) {
        skip_ws(&s);
        if (*s == ')')
            break;
        if (!isdigit((unsigned char)*s))
            return failf(err, n, "malformed 'shape'");
        errno = 0;
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno)
            return failf(err, n, "shape dimension out of range");
        if (a->ndim >= 2)
            return failf(err, n, "only 1-D and 2-D arrays are supported");
        a->shape[a->ndim++] = v;
        s = end;
        if (*s == 'L')
            s++;
        skip_ws(&s);
        if (*s == ',')
            s++;
        else if (*s != ')')
            return failf(err, n, "malformed 'shape'");
    }
    *sp = s + 1;
    if (a->ndim == 0)
        return failf(err, n, "0-D (scalar) arrays are not supported");
    return 0;
}

static int parse_header(const char *h, lnorm__npy *a, char *err, size_t n)
{
    const char *s = h;
    int have_descr = 0, have_order = 0, have_shape = 0;
    skip_ws(&s);
    if (*s++ != '{')
        return failf(err, n, "header is not a dict");
    for (;;) {
        skip_ws(&s);
        if (*s == '}')
            break;
        char key[32];
        if (quoted(&s, key, sizeof key) != 0)
            return failf(err, n, "malformed header (a key in quotes expected)");
        skip_ws(&s);
        if (*s++ != ':')
            return failf(err, n, "malformed header (':' expected after '%s')", key);
        skip_ws(&s);
        if (!strcmp(key, "descr")) {
            char descr[17];
            if (have_descr++)
                return failf(err, n, "header gives 'descr' twice");
            if (quoted(&s, descr, sizeof descr) != 0)
                return failf(err, n, "malformed 'descr'");
            if (strcmp(descr, "<f4") == 0)
                a->dtype = LNORM_DTYPE_F32;
            else if (strcmp(descr, "<f2") == 0)
                a->dtype = LNORM_DTYPE_F16;
            else if (strcmp(descr, "<V2") == 0 || strcmp(descr, "|V2") == 0)
                a->dtype = LNORM_DTYPE_BF16; /* what np.save writes for ml_dtypes.bfloat16 */
            else if (strcmp(descr, "<f8") == 0)
                a->dtype = LNORM__NPY_F64;
            else
                return failf(err, n,
                             "dtype '%s' is not supported (little-endian float32 '<f4', float16 '<f2', "
                             "ml_dtypes.bfloat16 '<V2', float64 '<f8' with --convert-f64)",
                             descr);
        } else if (!strcmp(key, "fortran_order")) {
            if (have_order++)
                return failf(err, n, "header gives 'fortran_order' twice");
            if (strncmp(s, "True", 4) == 0 && !isalnum((unsigned char)s[4]) && s[4] != '_')
                return failf(err, n, "Fortran-order arrays are not supported (use np.ascontiguousarray)");
            if (strncmp(s, "False", 5) != 0 || isalnum((unsigned char)s[5]) || s[5] == '_')
                return failf(err, n, "malformed 'fortran_order'");
            s += 5;
        } else if (!strcmp(key, "shape")) {
            if (have_shape++)
                return failf(err, n, "header gives 'shape' twice");
            if (parse_shape(&s, a, err, n) != 0)
                return -1;
        } else {
            return failf(err, n, "unexpected key '%s' in the header (numpy writes descr, fortran_order, shape)",
                         key);
        }
        skip_ws(&s);
        if (*s == ',')
            s++;
        else if (*s != '}')
            return failf(err, n, "malformed header (',' or '}' expected)");
    }
    s++;
    skip_ws(&s);
    if (*s)
        return failf(err, n, "malformed header (text after the dict)");
    if (!have_descr)
        return failf(err, n, "header has no 'descr'");
    if (!have_order)
        return failf(err, n, "header has no 'fortran_order'");
    if (!have_shape)
        return failf(err, n, "header has no 'shape'");
    return 0;
}

int lnorm__npy_read(const char *path, lnorm__npy *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return failf(err, errlen, "%s: %s", path, strerror(errno));
    unsigned char pre[12];
    char *hdr = NULL;
    int rv = -1;
    if (fread(pre, 1, 10, fp) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        failf(err, errlen, "%s: not a .npy file (bad magic)", path);
        goto out;
    }
    size_t hlen, pre_len;
    if (pre[6] == 1) {
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
        pre_len = 10;
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 10, 1, 2, fp) != 2) {
            failf(err, errlen, "%s: truncated header", path);
            goto out;
        }
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)pre[10] << 16) |
               ((size_t)pre[11] << 24);
        pre_len = 12;
    } else {
        failf(err, errlen, "%s: unsupported .npy version %d.%d", path, pre[6], pre[7]);
        goto out;
    }
    if (hlen > (1u << 20)) {
        failf(err, errlen, "%s: header too large", path);
        goto out;
    }
    hdr = malloc(hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, fp) != hlen) {
        failf(err, errlen, "%s: truncated header", path);
        goto out;
    }
    hdr[hlen] = 0;
    char why[200];
    if (parse_header(hdr, a, why, sizeof why) != 0) {
        failf(err, errlen, "%s: %s", path, why);
        goto out;
    }
    uint64_t count = a->shape[0];
    if (a->ndim == 2) {
        if (a->shape[1] != 0 && count > UINT64_MAX / a->shape[1]) {
            failf(err, errlen, "%s: shape too large", path);
            goto out;
        }
        count *= a->shape[1];
    }
    if (count == 0) {
        failf(err, errlen, "%s: empty array", path);
        goto out;
    }
    size_t es = a->dtype == LNORM__NPY_F64 ? 8 : lnorm_dtype_size(a->dtype);
    if (count > (SIZE_MAX / es)) {
        failf(err, errlen, "%s: shape too large", path);
        goto out;
    }
    a->nbytes = (size_t)count * es;
    if (fseeko(fp, 0, SEEK_END) != 0) {
        failf(err, errlen, "%s: %s", path, strerror(errno));
        goto out;
    }
    off_t fsz = ftello(fp);
    if (fsz < 0 || (uint64_t)fsz != pre_len + hlen + a->nbytes) {
        failf(err, errlen, "%s: file size %lld does not match the header (%zu data bytes expected)",
              path, (long long)fsz, a->nbytes);
        goto out;
    }
    fseeko(fp, (off_t)(pre_len + hlen), SEEK_SET);
    a->data = malloc(a->nbytes);
    if (!a->data) {
        failf(err, errlen, "%s: out of memory (%zu bytes)", path, a->nbytes);
        goto out;
    }
    if (fread(a->data, 1, a->nbytes, fp) != a->nbytes) {
        failf(err, errlen, "%s: short read", path);
        goto out;
    }
    rv = 0;
out:
    if (rv != 0)
        lnorm__npy_free(a);
    free(hdr);
    fclose(fp);
    return rv;
}

/* Write prefix bytes + data to path via a temporary file beside it, then
 * rename it over path. The temporary file is made by mkstemp (a new file,
 * O_EXCL, never through a link someone planted), then given the mode a
 * new file would have (0666 less the umask). */
static int write_atomic(const char *path, const void *pre, size_t prelen, const void *data,
                        size_t nbytes, char *err, size_t errlen)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp)
        return failf(err, errlen, "out of memory");
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        failf(err, errlen, "%s: %s", path, strerror(errno));
        free(tmp);
        return -1;
    }
    mode_t um = umask(0);
    umask(um);
    FILE *fp = fchmod(fd, 0666 & ~um) == 0 ? fdopen(fd, "wb") : NULL;
    if (!fp) {
        failf(err, errlen, "%s: %s", tmp, strerror(errno));
        close(fd);
        remove(tmp);
        free(tmp);
        return -1;
    }
    int ok = (prelen == 0 || fwrite(pre, 1, prelen, fp) == prelen) &&
             fwrite(data, 1, nbytes, fp) == nbytes;
    ok = (fclose(fp) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        failf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        remove(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

int lnorm__npy_to_f32(lnorm__npy *a, char *err, size_t errlen)
{
    if (a->dtype != LNORM__NPY_F64)
        return 0;
    const size_t n = a->nbytes / 8;
    const double *d = a->data;
    float *f = a->data; /* in place: f[i] is written after d[i] and d[<i] are read */
    for (size_t i = 0; i < n; i++) {
        double v = d[i];
        if (isfinite(v) && fabs(v) > FLT_MAX && !isfinite((float)v))
            return failf(err, errlen, "element %zu, %g, is beyond float32's range", i, v);
        f[i] = (float)v;
    }
    a->dtype = LNORM_DTYPE_F32;
    a->nbytes = n * 4;
    return 0;
}

int lnorm__npy_write(const char *path, int dtype, int ndim, const uint64_t *shape,
                     const void *data, char *err, size_t errlen)
{
    const char *descr = dtype == LNORM_DTYPE_F32 ? "<f4" : dtype == LNORM_DTYPE_F16 ? "<f2" : "<V2";
    if (dtype != LNORM_DTYPE_F32 && dtype != LNORM_DTYPE_F16 && dtype != LNORM_DTYPE_BF16)
        return failf(err, errlen, "%s: only f32, f16 and bf16 can be written as .npy", path);
    if (ndim != 1 && ndim != 2)
        return failf(err, errlen, "%s: only 1-D and 2-D arrays", path);
    char dict[160];
    int dn;
    if (ndim == 1)
        dn = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%llu,), }", descr,
                      (unsigned long long)shape[0]);
    else
        dn = snprintf(dict, sizeof dict,
                      "{'descr': '%s', 'fortran_order': False, 'shape': (%llu, %llu), }", descr,
                      (unsigned long long)shape[0], (unsigned long long)shape[1]);
    /* magic(6) + version(2) + len(2) + dict + spaces + '\n', total % 64 == 0 */
    size_t total = 10 + (size_t)dn + 1;
    total = (total + 63) / 64 * 64;
    size_t hlen = total - 10;
    unsigned char pre[256];
    memcpy(pre, "\x93NUMPY\x01\x00", 8);
    pre[8] = (unsigned char)(hlen & 0xff);
    pre[9] = (unsigned char)(hlen >> 8);
    memcpy(pre + 10, dict, (size_t)dn);
    memset(pre + 10 + dn, ' ', hlen - (size_t)dn - 1);
    pre[total - 1] = '\n';
    uint64_t count = shape[0] * (ndim == 2 ? shape[1] : 1);
    return write_atomic(path, pre, total, data, (size_t)count * lnorm_dtype_size(dtype), err,
                        errlen);
}

int lnorm__raw_read(const char *path, size_t nbytes, void **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return failf(err, errlen, "%s: %s", path, strerror(errno));
    fseeko(fp, 0, SEEK_END);
    off_t fsz = ftello(fp);
    fseeko(fp, 0, SEEK_SET);
    if (fsz < 0 || (uint64_t)fsz != nbytes) {
        fclose(fp);
        return failf(err, errlen, "%s: size %lld bytes, expected %zu (rows * hidden * 2)", path,
                     (long long)fsz, nbytes);
    }
    void *p = malloc(nbytes ? nbytes : 1);
    if (!p || fread(p, 1, nbytes, fp) != nbytes) {
        free(p);
        fclose(fp);
        return failf(err, errlen, "%s: read failed", path);
    }
    fclose(fp);
    *out = p;
    return 0;
}

int lnorm__raw_write(const char *path, const void *data, size_t nbytes, char *err, size_t errlen)
{
    return write_atomic(path, NULL, 0, data, nbytes, err, errlen);
}
