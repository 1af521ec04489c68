/* Workload mix and list parsers: see spec.h. */
#include "spec.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lnorm/types.h"

int lnorm__dtype_parse(const char *s)
{
    if (!strcmp(s, "f32") || !strcmp(s, "fp32") || !strcmp(s, "float32"))
        return LNORM_DTYPE_F32;
    if (!strcmp(s, "f16") || !strcmp(s, "fp16") || !strcmp(s, "float16"))
        return LNORM_DTYPE_F16;
    if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16"))
        return LNORM_DTYPE_BF16;
    return -1;
}

int lnorm__op_parse(const char *s)
{
    if (!strcmp(s, "ln") || !strcmp(s, "layernorm"))
        return LNORM_OP_LAYERNORM;
    if (!strcmp(s, "rms") || !strcmp(s, "rmsnorm"))
        return LNORM_OP_RMSNORM;
    if (!strcmp(s, "ln-bwd"))
        return LNORM_OP_LAYERNORM | LNORM__OP_BWD;
    if (!strcmp(s, "rms-bwd"))
        return LNORM_OP_RMSNORM | LNORM__OP_BWD;
    return -1;
}

const char *lnorm__op_name(int op)
{
    switch (op) {
    case LNORM_OP_LAYERNORM: return "ln";
    case LNORM_OP_RMSNORM: return "rms";
    case LNORM_OP_LAYERNORM | LNORM__OP_BWD: return "ln-bwd";
    case LNORM_OP_RMSNORM | LNORM__OP_BWD: return "rms-bwd";
    default: return "?";
    }
}

static int parse_u64(const char *s, uint64_t *out)
{
    if (!*s || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

/* One entry (NUL-terminated, no commas). */
static int parse_entry(char *e, const lnorm__mix_shape *def, lnorm__mix_shape *sh, char *err, size_t errlen)
{
    *sh = *def;
    sh->weight = 1;
    char *save = NULL;
    char *tok = strtok_r(e, ":", &save);
    if (!tok) {
        snprintf(err, errlen, "empty mix entry");
        return -1;
    }
    char *x = strchr(tok, 'x');
    if (!x) {
        snprintf(err, errlen, "mix entry '%s': shape must be ROWSxHIDDEN", tok);
        return -1;
    }
    *x = '\0';
    if (parse_u64(tok, &sh->rows) || parse_u64(x + 1, &sh->hidden) || sh->rows == 0 ||
        sh->hidden == 0) {
        snprintf(err, errlen, "mix entry '%sx%s': rows and hidden must be positive integers", tok,
                 x + 1);
        return -1;
    }
    while ((tok = strtok_r(NULL, ":", &save))) {
        int v;
        uint64_t w;
        if ((v = lnorm__dtype_parse(tok)) > 0) {
            sh->x_dtype = v;
        } else if ((v = lnorm__op_parse(tok)) > 0) {
            sh->op = v;
        } else if (!strncmp(tok, "out=", 4) && (v = lnorm__dtype_parse(tok + 4)) > 0) {
            sh->y_dtype = v;
        } else if (!parse_u64(tok, &w) && w >= 1 && w <= 1000000) {
            sh->weight = (unsigned)w;
        } else {
            snprintf(err, errlen, "mix token '%s': want f32|f16|bf16, ln|rms, out=DTYPE or a weight",
                     tok);
            return -1;
        }
    }
    return 0;
}

int lnorm__mix_parse(const char *s, const lnorm__mix_shape *def, lnorm__mix *out, char *err,
                     size_t errlen)
{
    memset(out, 0, sizeof(*out));
    size_t len = strlen(s);
    char *buf = malloc(len + 1);
    if (!buf) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(buf, s, len + 1);
    int rc = 0;
    char *p = buf;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        if (out->n == LNORM__MIX_MAX) {
            snprintf(err, errlen, "at most %d mix entries", LNORM__MIX_MAX);
            rc = -1;
            break;
        }
        if (parse_entry(p, def, &out->shapes[out->n], err, errlen)) {
            rc = -1;
            break;
        }
        out->total_weight += out->shapes[out->n].weight;
        out->n++;
        if (!comma)
            break;
        p = comma + 1;
    }
    free(buf);
    return rc;
}

size_t lnorm__mix_pick(const lnorm__mix *m, unsigned r)
{
    for (size_t i = 0; i < m->n; i++) {
        if (r < m->shapes[i].weight)
            return i;
        r -= m->shapes[i].weight;
    }
    return m->n ? m->n - 1 : 0;
}

int lnorm__list_parse(const char *s, double *vals, int max)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        if (n == max)
            return -1;
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || !isfinite(v) || v <= 0)
            return -1;
        vals[n++] = v;
        if (*end == ',')
            end++;
        else if (*end)
            return -1;
        p = end;
    }
    return n ? n : -1;
}

int lnorm__size_parse(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!isdigit((unsigned char)*s))
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    unsigned sh = 0;
    if (*end == 'K' || *end == 'k')
        sh = 10, end++;
    else if (*end == 'M' || *end == 'm')
        sh = 20, end++;
    else if (*end == 'G' || *end == 'g')
        sh = 30, end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end || (sh && v > (UINT64_MAX >> sh)))
        return -1;
    *out = (uint64_t)v << sh;
    return 0;
}
