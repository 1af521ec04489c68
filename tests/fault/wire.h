/*
 * Wire helpers for fault tests: build lnorm.v1 Requests with protobuf-c,
 * check Responses against a float64 LayerNorm/RMSNorm reference, talk to
 * lnormd through an NNG REQ socket, or through a raw SP-over-TCP connection
 * written by hand (to send half frames, or never read replies).
 */
#ifndef LNORM_FAULT_WIRE_H
#define LNORM_FAULT_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>

#include "lnorm.pb-c.h"

/* ---- messages ----------------------------------------------------------- */

/* A normalize request of rows x hidden f32 (default eps, no affine) with x
 * deterministic from seed. *x_out (malloc'ed, rows*hidden floats) keeps x
 * for checking; may be NULL. Returns the packed bytes (malloc'ed). */
uint8_t *fw_pack_norm(uint64_t id, int op, uint64_t rows, uint64_t hidden, uint32_t seed,
                      float **x_out, size_t *len);

/* Pack any Request (malloc'ed bytes). */
uint8_t *fw_pack(const Lnorm__V1__Request *req, size_t *len);

/* A Request of id with body msg of the kind body (Normalize..., Health...), packed. */
uint8_t *fw_pack_body(uint64_t id, Lnorm__V1__Request__BodyCase body, void *msg, size_t *len);

/* Health and Info requests, packed. */
uint8_t *fw_pack_health(uint64_t id, size_t *len);

/* Unpack a Response (free with lnorm__v1__response__free_unpacked(r, NULL)). */
Lnorm__V1__Response *fw_unpack(const uint8_t *buf, size_t len);

/* 0 when r is an OK normalize reply whose y matches the reference of x
 * (rows x hidden f32, op, eps 1e-5) within 1e-4 * (1 + |ref|); otherwise
 * -1 and why describes the first difference. */
int fw_check_norm(const Lnorm__V1__Response *r, int op, uint64_t rows, uint64_t hidden,
                  const float *x, char *why, size_t whylen);

/* ---- NNG REQ client ----------------------------------------------------- */

/* Open a REQ socket dialed (non-blocking, redialing) to url, with the given
 * receive timeout and reconnect interval. 0 or an NNG error. */
int fw_req_open(nng_socket *s, const char *url, int recv_timeout_ms, int reconnect_ms);

/* One exchange on a REQ socket: send buf, receive and unpack the reply.
 * 0 (and *out set), or an NNG error (NNG_ETIMEDOUT, ...), or -1 when the
 * reply is not a valid Response. */
int fw_req_call(nng_socket s, const uint8_t *buf, size_t len, Lnorm__V1__Response **out);

/* ---- raw SP over TCP (a hand-written REQ peer) -------------------------- */

/* Connect to tcp://127.0.0.1:PORT (only loopback URLs are accepted).
 * Returns the fd or -1. */
int fw_tcp_connect(const char *url);

/* Write the 8-byte SP header of a REQ peer and read the server's; 0 when
 * the server speaks REP, -1 otherwise. */
int fw_sp_handshake(int fd, int timeout_ms);

/* Write one SP message: 8-byte big-endian length, the 4-byte request id
 * header (high bit set), then body. 0 or -1. */
int fw_sp_send(int fd, uint32_t reqid, const uint8_t *body, size_t len);

/* Read one SP reply within timeout_ms: 0 (id and body set, body malloc'ed),
 * 1 on timeout, -1 when the connection closed or broke. */
int fw_sp_recv(int fd, uint32_t *reqid, uint8_t **body, size_t *len, int timeout_ms);

/* Write all of buf (blocking); 0 or -1. */
int fw_write_all(int fd, const void *buf, size_t len);

#endif /* LNORM_FAULT_WIRE_H */
