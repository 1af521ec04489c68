/* bench.spec: the workload mix and list parsers. */
#include "check.h"
#include "spec.h"

#include <stdio.h>
#include <string.h>

#include "lnorm/types.h"

int main(void)
{
    lnorm__mix_shape def = {LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, LNORM_DTYPE_NONE, 1, 1024, 1};
    lnorm__mix m;
    char err[256];

    CHECK(lnorm__mix_parse("1x1024:f32:ln:70,8x4096:bf16:rms:30", &def, &m, err, sizeof err) == 0,
          "%s", err);
    CHECK(m.n == 2 && m.total_weight == 100, "two entries, weight 100");
    CHECK(m.shapes[0].rows == 1 && m.shapes[0].hidden == 1024 && m.shapes[0].weight == 70 &&
              m.shapes[0].op == LNORM_OP_LAYERNORM && m.shapes[0].x_dtype == LNORM_DTYPE_F32,
          "entry 0");
    CHECK(m.shapes[1].rows == 8 && m.shapes[1].hidden == 4096 && m.shapes[1].weight == 30 &&
              m.shapes[1].op == LNORM_OP_RMSNORM && m.shapes[1].x_dtype == LNORM_DTYPE_BF16,
          "entry 1");
    CHECK(lnorm__mix_pick(&m, 0) == 0 && lnorm__mix_pick(&m, 69) == 0 &&
              lnorm__mix_pick(&m, 70) == 1 && lnorm__mix_pick(&m, 99) == 1,
          "pick by weight");

    /* defaults and any token order */
    CHECK(lnorm__mix_parse("4x512", &def, &m, err, sizeof err) == 0, "%s", err);
    CHECK(m.n == 1 && m.shapes[0].weight == 1 && m.shapes[0].x_dtype == LNORM_DTYPE_F32 &&
              m.shapes[0].op == LNORM_OP_LAYERNORM,
          "defaults");
    CHECK(lnorm__mix_parse("2x64:5:rms:out=f32:f16", &def, &m, err, sizeof err) == 0, "%s", err);
    CHECK(m.shapes[0].weight == 5 && m.shapes[0].op == LNORM_OP_RMSNORM &&
              m.shapes[0].x_dtype == LNORM_DTYPE_F16 && m.shapes[0].y_dtype == LNORM_DTYPE_F32,
          "token order");

    /* rejects */
    static const char *bad[] = {"", "x1024", "1x", "0x10", "1x0", "1024", "1x8:f64", "1x8:0",
                                "1x8,,2x8", "1x8:ln:rms:zz", "ax8", "1x8:out=q"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        int rc = lnorm__mix_parse(bad[i], &def, &m, err, sizeof err);
        CHECK(rc == -1 && err[0], "%s", bad[i]);
    }
    char many[512] = "";
    for (int i = 0; i < LNORM__MIX_MAX + 1; i++)
        strcat(many, i ? ",1x8" : "1x8");
    CHECK(lnorm__mix_parse(many, &def, &m, err, sizeof err) == -1, "too many entries");

    double v[LNORM__LIST_MAX];
    CHECK(lnorm__list_parse("1,8,64", v, LNORM__LIST_MAX) == 3 && v[0] == 1 && v[2] == 64, "list");
    CHECK(lnorm__list_parse("1000.5", v, LNORM__LIST_MAX) == 1 && v[0] == 1000.5, "list one");
    CHECK(lnorm__list_parse("1,,2", v, LNORM__LIST_MAX) == -1, "list empty item");
    CHECK(lnorm__list_parse("1,-2", v, LNORM__LIST_MAX) == -1, "list negative");
    CHECK(lnorm__list_parse("", v, LNORM__LIST_MAX) == -1, "list empty");
    CHECK(lnorm__list_parse("1,2,3", v, 2) == -1, "list too long");

    uint64_t s;
    CHECK(lnorm__size_parse("64M", &s) == 0 && s == 64ull << 20, "64M");
    CHECK(lnorm__size_parse("4096", &s) == 0 && s == 4096, "4096");
    CHECK(lnorm__size_parse("1GB", &s) == 0 && s == 1ull << 30, "1GB");
    CHECK(lnorm__size_parse("12Q", &s) == -1 && lnorm__size_parse("-1", &s) == -1, "bad size");

    CHECK(lnorm__dtype_parse("bf16") == LNORM_DTYPE_BF16 && lnorm__dtype_parse("x") == -1, "dtype");
    CHECK(lnorm__op_parse("rms") == LNORM_OP_RMSNORM && lnorm__op_parse("x") == -1, "op");
    return check_finish("bench.spec");
}
