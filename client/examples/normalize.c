/*
 * normalize: the smallest useful liblnorm program. LayerNorm of a small
 * random f32 tensor through lnormd, checked against a local computation.
 *
 *   normalize URL        (e.g. tcp://127.0.0.1:7878)
 *
 * Exit status 0 when the server's answer matches, 1 otherwise.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <lnorm/lnorm.h>

enum { ROWS = 4, HIDDEN = 64 };

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s URL\n", argv[0]);
        return 2;
    }
    static float x[ROWS * HIDDEN], y[ROWS * HIDDEN], gamma[HIDDEN], beta[HIDDEN];
    float mean[ROWS], rstd[ROWS];
    srand(7);
    for (int i = 0; i < ROWS * HIDDEN; i++)
        x[i] = (float)rand() / (float)RAND_MAX * 6.0f - 2.0f;
    for (int c = 0; c < HIDDEN; c++) {
        gamma[c] = 0.5f + (float)c / HIDDEN;
        beta[c] = (float)c / HIDDEN - 0.5f;
    }

    const char *url = argv[1];
    lnorm_client *client;
    int rv = lnorm_client_open(&client, &url, 1, NULL);
    if (rv != LNORM_OK) {
        fprintf(stderr, "open %s: %s\n", url, lnorm_strerror(rv));
        return 1;
    }
    lnorm_normalize_req req;
    lnorm_normalize_req_init(&req, LNORM_OP_LAYERNORM, LNORM_DTYPE_F32, ROWS, HIDDEN);
    req.x = x;
    req.gamma = gamma;
    req.beta = beta;
    req.y = y;
    req.mean = mean;
    req.rstd = rstd;
    lnorm_result res;
    rv = lnorm_normalize(client, &req, &res);
    lnorm_client_close(client);
    if (rv != LNORM_OK) {
        fprintf(stderr, "normalize: %s: %s\n", lnorm_strerror(rv), res.message);
        return 1;
    }

    /* The same LayerNorm computed here, in double. */
    double worst = 0;
    for (int r = 0; r < ROWS; r++) {
        double m = 0, v = 0;
        for (int c = 0; c < HIDDEN; c++)
            m += x[r * HIDDEN + c];
        m /= HIDDEN;
        for (int c = 0; c < HIDDEN; c++)
            v += (x[r * HIDDEN + c] - m) * (x[r * HIDDEN + c] - m);
        v /= HIDDEN;
        double rs = 1.0 / sqrt(v + LNORM_DEFAULT_EPS);
        for (int c = 0; c < HIDDEN; c++) {
            double want = (x[r * HIDDEN + c] - m) * rs * gamma[c] + beta[c];
            double err = fabs(y[r * HIDDEN + c] - want);
            if (!(err <= worst))
                worst = err;
        }
        if (!(fabs(mean[r] - m) < 1e-5) || !(fabs(rstd[r] - rs) < 1e-5 * rs))
            worst = INFINITY;
    }
    printf("lnorm %s: %d x %d LayerNorm, max |error| %.3g, server queue %llu us, compute %llu us\n",
           lnorm_client_version(), ROWS, HIDDEN, worst, (unsigned long long)res.queue_us,
           (unsigned long long)res.compute_us);
    return worst < 1e-5 ? 0 : 1;
}
