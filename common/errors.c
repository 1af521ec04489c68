/* lnorm_strerror() and friends, generated from LNORM_ERRNO_MAP (include/lnorm/errors.h). */
#include "lnorm/errors.h"

static const struct {
    const char *name;
    const char *msg;
    int status;
} lnorm__errtab[] = {
#define LNORM__ERR_ROW(name, num, code, msg) [num] = {"LNORM_" #name, msg, code},
    LNORM_ERRNO_MAP(LNORM__ERR_ROW)
#undef LNORM__ERR_ROW
};

#define LNORM__NERR ((int)(sizeof lnorm__errtab / sizeof lnorm__errtab[0]))

const char *lnorm_strerror(int err)
{
    if (err < 0 || err >= LNORM__NERR || !lnorm__errtab[err].msg)
        return "unknown error";
    return lnorm__errtab[err].msg;
}

const char *lnorm_errname(int err)
{
    if (err < 0 || err >= LNORM__NERR || !lnorm__errtab[err].name)
        return "LNORM_UNKNOWN";
    return lnorm__errtab[err].name;
}

int lnorm_err_to_status(int err)
{
    if (err < 0 || err >= LNORM__NERR || !lnorm__errtab[err].msg)
        return 2; /* UNKNOWN */
    return lnorm__errtab[err].status;
}

int lnorm_status_to_err(int status)
{
    switch (status) {
    case 0: return LNORM_OK;
    case 1: return LNORM_ECANCELED;
    case 3: case 11: return LNORM_EINVAL;
    case 4: return LNORM_ETIMEDOUT;
    case 5: return LNORM_ENOTFOUND;
    case 6: return LNORM_EEXIST;
    case 7: case 16: return LNORM_EPERM;
    case 8: return LNORM_ELIMIT;
    case 12: return LNORM_ENOTSUP;
    case 14: return LNORM_EUNAVAIL;
    default: return LNORM_EINTERNAL;
    }
}
