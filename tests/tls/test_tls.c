/*
 * tls.server_and_client_certs: lnormd over tls+tcp:// with certificates the
 * test generates (scripts/gen-certs.sh: CA, server, client, and a rogue
 * client signed by another CA).
 *
 *   tls_test LNORMD GEN_CERTS_SCRIPT
 *
 * 1. Server certificate only (--tls-cert/--tls-key):
 *    - a liblnorm client trusting the CA gets correct results;
 *    - a client trusting only the rogue CA gets nothing (server rejected);
 *    - a plain tcp:// client on the TLS port gets nothing.
 * 2. Client certificates required (--tls-ca ca.crt --tls-verify-peer):
 *    - a client with the CA-signed certificate gets correct results;
 *    - a client without a certificate is refused;
 *    - a client with the rogue certificate is refused;
 *    - the good client still works after those attempts; lnormd exits 0.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "check.h"
#include "testclient.h"
#include "testdaemon.h"
#include "lnorm/lnorm.h"

#define ROWS 4
#define HIDDEN 128

static char g_pki[400];

static const char *pki(const char *name)
{
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_pki, name);
    return buf[k];
}

/* One normalize through a fresh client: LNORM_OK only with correct results. */
static int try_client(const char *url, const char *ca, const char *cert_key, const char *label)
{
    lnorm_client_opts o;
    tc_client_opts(&o, 3000, 100, 500);
    o.tls_ca_file = ca;
    o.tls_cert_key_file = cert_key;
    o.tls_server_name = "localhost";
    lnorm_client *c;
    int rv = lnorm_client_open(&c, &url, 1, &o);
    if (rv != LNORM_OK) {
        printf("tls: %s: open: %s\n", label, lnorm_strerror(rv));
        return rv;
    }
    float x[ROWS * HIDDEN], y[ROWS * HIDDEN];
    for (int i = 0; i < ROWS * HIDDEN; i++)
        x[i] = (float)((i * 29) % 97) / 24.0f - 2.0f;
    lnorm_normalize_req r;
    lnorm_normalize_req_init(&r, LNORM_OP_RMSNORM, LNORM_DTYPE_F32, ROWS, HIDDEN);
    r.x = x;
    r.y = y;
    lnorm_result res;
    rv = lnorm_normalize(c, &r, &res);
    if (rv == LNORM_OK) {
        for (int i = 0; i < ROWS && rv == LNORM_OK; i++) {
            double ms = 0;
            for (int k = 0; k < HIDDEN; k++)
                ms += (double)x[i * HIDDEN + k] * x[i * HIDDEN + k];
            double rstd = 1.0 / sqrt(ms / HIDDEN + 1e-5);
            for (int k = 0; k < HIDDEN; k++)
                if (fabs(y[i * HIDDEN + k] - x[i * HIDDEN + k] * rstd) > 1e-4 * (1 + fabs(x[i * HIDDEN + k] * rstd)))
                    rv = LNORM_EPROTO;
        }
    }
    printf("tls: %s: %s%s%s\n", label, rv == LNORM_OK ? "correct result" : lnorm_strerror(rv),
           rv == LNORM_OK ? "" : " - ", rv == LNORM_OK ? "" : res.message);
    lnorm_client_close(c);
    return rv;
}

static int start(td_daemon *d, const char *lnormd, const char *dir, int verify)
{
    const char *plain[] = {"--listen", "tls+tcp://127.0.0.1:0", "--http", "off", "--backend", "cpu",
                           "--cpu-threads", "1", "--tls-cert", pki("server.crt"), "--tls-key",
                           pki("server.key"), NULL};
    const char *mtls[] = {"--listen", "tls+tcp://127.0.0.1:0", "--http", "off", "--backend", "cpu",
                          "--cpu-threads", "1", "--tls-cert", pki("server.crt"), "--tls-key",
                          pki("server.key"), "--tls-ca", pki("ca.crt"), "--tls-verify-peer", NULL};
    return td_start(d, lnormd, dir, verify ? mtls : plain, 0);
}

int main(int argc, char **argv)
{
    if (!td_usage(argc, argv, 3, "LNORMD GEN_CERTS_SCRIPT"))
        return 2;
    char dir[256], cmd[1200];
    if (td_tmpdir(dir, sizeof dir, "tls") != 0)
        return 1;
    snprintf(g_pki, sizeof g_pki, "%s/pki", dir);
    snprintf(cmd, sizeof cmd, "bash '%s' '%s' >/dev/null", argv[2], g_pki);
    if (system(cmd) != 0) {
        fprintf(stderr, "tls: %s failed\n", cmd);
        return 1;
    }
    td_daemon d;
    if (start(&d, argv[1], dir, 0) != 0)
        return 1;
    const char *url = td_url(&d, "tls+tcp://");
    CHECK(url != NULL, "no tls+tcp listen line");
    if (url) {
        char plain[512];
        snprintf(plain, sizeof plain, "tcp://%s", url + strlen("tls+tcp://"));
        CHECK(try_client(url, pki("ca.crt"), NULL, "server auth, client trusts the CA") == LNORM_OK,
              "a client trusting the CA got no correct result");
        CHECK(try_client(url, pki("rogue-ca.crt"), NULL, "client trusts only the rogue CA") != LNORM_OK,
              "a client that does not trust the server's CA got a result");
        CHECK(try_client(plain, NULL, NULL, "plain tcp:// to the TLS port") != LNORM_OK,
              "plain TCP on the TLS port got a result");
        CHECK(try_client(url, pki("ca.crt"), NULL, "server auth, again") == LNORM_OK,
              "the good client failed after the bad ones");
    }
    td_stop_check(&d, "(server auth) on SIGTERM");

    td_daemon m;
    if (start(&m, argv[1], dir, 1) != 0)
        return 1;
    url = td_url(&m, "tls+tcp://");
    CHECK(url != NULL, "no tls+tcp listen line");
    if (url) {
        CHECK(try_client(url, pki("ca.crt"), pki("client.pem"), "mTLS, CA-signed client cert") ==
                  LNORM_OK,
              "a client with a valid certificate got no correct result");
        CHECK(try_client(url, pki("ca.crt"), NULL, "mTLS, no client cert") != LNORM_OK,
              "a client without a certificate was served");
        CHECK(try_client(url, pki("ca.crt"), pki("rogue.pem"), "mTLS, rogue client cert") != LNORM_OK,
              "a client with a certificate from another CA was served");
        CHECK(try_client(url, pki("ca.crt"), pki("client.pem"), "mTLS, valid cert again") == LNORM_OK,
              "the good client failed after the refused ones");
    }
    td_stop_check(&m, "(mTLS) on SIGTERM");
    return check_finish("tls.server_and_client_certs");
}
