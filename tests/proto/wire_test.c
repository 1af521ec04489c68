/* proto.wire: the wire reader of lnorm_wire.h on its own. Varints of every
 * length 1..10 (2^64 - 1 included) and the ones it must reject (11 bytes, a
 * 10th byte beyond 64 bits, every truncation), then fields of each wire
 * type: values, payloads, lengths past the end, wire types 3/4/6/7, field
 * numbers 0 and beyond 2^29 - 1, over-long keys. Every input sits in a
 * heap buffer of exactly its size, so under `make test-asan` a read past
 * the end is a report; after every error the reader must not have moved. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lnorm_wire.h"


/* n bytes copied into a heap block of exactly n bytes (1 if n is 0). */
static uint8_t *exact(const uint8_t *src, size_t n)
{
    uint8_t *b = malloc(n ? n : 1);
    if (!b) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    if (n)
        memcpy(b, src, n);
    return b;
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* Decode a varint alone in a buffer of exactly its n bytes: 0 and the value
 * when it must be accepted with all n bytes consumed. */
static int varint_alone(const uint8_t *src, size_t n, uint64_t *v)
{
    uint8_t *b = exact(src, n);
    lnorm__wire_rd r = lnorm__wire_reader(b, n);
    int rc = lnorm__wire_varint(&r, v);
    if (rc == 0 && r.p != b + n)
        rc = -2; /* accepted but did not consume exactly the varint */
    if (rc == -1 && r.p != b)
        rc = -3; /* rejected but moved */
    free(b);
    return rc;
}

static void test_varints(void)
{
    uint8_t enc[16];
    /* The smallest and largest value of each length. */
    for (int len = 1; len <= 10; len++) {
        uint64_t lo = len == 1 ? 0 : (uint64_t)1 << (7 * (len - 1));
        uint64_t hi = len == 10 ? UINT64_MAX : ((uint64_t)1 << (7 * len)) - 1;
        uint64_t vals[2] = {lo, hi};
        for (int k = 0; k < 2; k++) {
            size_t n = put_varint(enc, vals[k]);
            CHECK(n == (size_t)len, "value %llu encodes to %zu bytes, want %d", (unsigned long long)vals[k], n,
                  len);
            uint64_t got = 0;
            int rc = varint_alone(enc, n, &got);
            CHECK(rc == 0 && got == vals[k], "%d-byte varint %llu: rc %d, got %llu", len,
                  (unsigned long long)vals[k], rc, (unsigned long long)got);
            /* Every proper prefix is truncated. */
            for (size_t cut = 0; cut < n; cut++)
                CHECK(varint_alone(enc, cut, &got) == -1, "%d-byte varint cut to %zu bytes accepted", len, cut);
        }
    }
    /* 2^64 - 1 spelled out: nine 0xff and 0x01. */
    static const uint8_t max64[10] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    uint64_t got = 0;
    CHECK(varint_alone(max64, 10, &got) == 0 && got == UINT64_MAX, "2^64-1 got %llu", (unsigned long long)got);
    /* 2^63, zero-padded forms (non-canonical, accepted), and 0 in 10 bytes. */
    static const uint8_t p63[10] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01};
    CHECK(varint_alone(p63, 10, &got) == 0 && got == (uint64_t)1 << 63, "2^63 got %llu", (unsigned long long)got);
    static const uint8_t zero10[10] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00};
    CHECK(varint_alone(zero10, 10, &got) == 0 && got == 0, "10-byte zero got %llu", (unsigned long long)got);
    static const uint8_t one2[2] = {0x81, 0x00};
    CHECK(varint_alone(one2, 2, &got) == 0 && got == 1, "padded 1 got %llu", (unsigned long long)got);

    /* 11 bytes: rejected, whatever the 11th byte. */
    static const uint8_t long11[11] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00};
    CHECK(varint_alone(long11, 11, &got) == -1, "11-byte varint accepted");
    static const uint8_t zero11[11] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00};
    CHECK(varint_alone(zero11, 11, &got) == -1, "11-byte zero accepted");
    CHECK(varint_alone(long11, 10, &got) == -1, "10 bytes all continuing accepted");
    /* A 10th byte with bits beyond 64: rejected. */
    for (int b = 2; b < 0x80; b++) {
        uint8_t over[10] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, (uint8_t)b};
        CHECK(varint_alone(over, 10, &got) == -1, "10th byte 0x%02x accepted", b);
    }
    /* Empty input. */
    CHECK(varint_alone(NULL, 0, &got) == -1, "empty input accepted");
}

/* Read one field from exactly the n bytes at src: the return code, and in
 * *f the field; -2 when accepted without consuming all n bytes, -3 when
 * rejected after moving the reader. */
static int field_alone(const uint8_t *src, size_t n, lnorm__wire_field *f, size_t *data_off)
{
    uint8_t *b = exact(src, n);
    lnorm__wire_rd r = lnorm__wire_reader(b, n);
    memset(f, 0xa5, sizeof *f);
    int rc = lnorm__wire_next_field(&r, f);
    if (rc == 0 && r.p != b + n)
        rc = -2;
    if (rc == -1 && r.p != b)
        rc = -3;
    if (rc == 0 && data_off)
        *data_off = f->data ? (size_t)(f->data - b) : (size_t)-1;
    free(b);
    return rc;
}

static size_t key(uint8_t *p, uint64_t num, int wt)
{
    return put_varint(p, num << 3 | (uint64_t)wt);
}

static void test_fields(void)
{
    uint8_t m[64];
    lnorm__wire_field f;
    size_t n, off;

    /* Varint field, up to 2^64 - 1. */
    static const uint64_t vv[] = {0, 1, 150, 300, UINT64_MAX};
    for (size_t i = 0; i < sizeof vv / sizeof vv[0]; i++) {
        n = key(m, 1, 0);
        n += put_varint(m + n, vv[i]);
        int rc = field_alone(m, n, &f, &off);
        CHECK(rc == 0 && f.num == 1 && f.wt == LNORM__WIRE_VARINT && f.v == vv[i] && f.data == NULL && f.len == 0,
              "varint field %llu: rc %d v %llu", (unsigned long long)vv[i], rc, (unsigned long long)f.v);
        for (size_t cut = 0; cut < n; cut++)
            CHECK(field_alone(m, cut, &f, NULL) == -1, "varint field cut to %zu accepted", cut);
    }

    /* fixed64 (wire type 1): 8 bytes, little-endian. */
    n = key(m, 7, 1);
    static const uint8_t le8[8] = {0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};
    memcpy(m + n, le8, 8);
    n += 8;
    CHECK(field_alone(m, n, &f, NULL) == 0 && f.num == 7 && f.wt == LNORM__WIRE_I64 &&
              f.v == 0xefcdab8967452301ull && f.data == NULL && f.len == 0,
          "fixed64 v %llx", (unsigned long long)f.v);
    for (size_t cut = 0; cut < n; cut++)
        CHECK(field_alone(m, cut, &f, NULL) == -1, "fixed64 cut to %zu accepted", cut);

    /* fixed32 (wire type 5): 4 bytes, little-endian (a float's bits). */
    n = key(m, 3, 5);
    static const uint8_t le4[4] = {0x00, 0x00, 0x80, 0x3f}; /* 1.0f */
    memcpy(m + n, le4, 4);
    n += 4;
    CHECK(field_alone(m, n, &f, NULL) == 0 && f.num == 3 && f.wt == LNORM__WIRE_I32 && f.v == 0x3f800000u &&
              f.data == NULL && f.len == 0,
          "fixed32 v %llx", (unsigned long long)f.v);
    for (size_t cut = 0; cut < n; cut++)
        CHECK(field_alone(m, cut, &f, NULL) == -1, "fixed32 cut to %zu accepted", cut);

    /* Length-delimited: the payload in place, its length in v. */
    n = key(m, 10, 2);
    n += put_varint(m + n, 5);
    memcpy(m + n, "hello", 5);
    n += 5;
    CHECK(field_alone(m, n, &f, &off) == 0 && f.num == 10 && f.wt == LNORM__WIRE_LEN && f.len == 5 && f.v == 5 &&
              off == n - 5,
          "bytes field: len %zu off %zu", f.len, off);
    for (size_t cut = 0; cut < n; cut++)
        CHECK(field_alone(m, cut, &f, NULL) == -1, "bytes field cut to %zu accepted", cut);
    /* Empty payload. */
    n = key(m, 4, 2);
    m[n++] = 0;
    CHECK(field_alone(m, n, &f, &off) == 0 && f.len == 0 && off == n, "empty bytes field: len %zu", f.len);
    /* A length one past the buffer, and lengths far beyond it. */
    static const uint64_t bad_len[] = {6, 7, 1u << 20, (uint64_t)1 << 32, UINT64_MAX};
    for (size_t i = 0; i < sizeof bad_len / sizeof bad_len[0]; i++) {
        n = key(m, 10, 2);
        n += put_varint(m + n, bad_len[i]);
        memcpy(m + n, "hello", 5);
        n += 5;
        CHECK(field_alone(m, n, &f, NULL) == -1, "length %llu over 5 bytes accepted", (unsigned long long)bad_len[i]);
    }
    /* A length given as an 11-byte varint. */
    n = key(m, 10, 2);
    memset(m + n, 0x80, 10);
    n += 10;
    m[n++] = 0;
    CHECK(field_alone(m, n, &f, NULL) == -1, "11-byte length accepted");

    /* Wire types 3 and 4 (groups), 6 and 7: rejected, with or without bytes after. */
    static const int bad_wt[] = {3, 4, 6, 7};
    for (size_t i = 0; i < 4; i++) {
        n = key(m, 1, bad_wt[i]);
        CHECK(field_alone(m, n, &f, NULL) == -1, "wire type %d accepted", bad_wt[i]);
        memset(m + n, 0, 8);
        CHECK(field_alone(m, n + 8, &f, NULL) == -1, "wire type %d with bytes after accepted", bad_wt[i]);
    }

    /* Field number 0 is rejected for every wire type (as the three readers
     * that preceded this header did, or the two that checked it). */
    for (int wt = 0; wt < 8; wt++) {
        n = key(m, 0, wt);
        memset(m + n, 0, 8);
        CHECK(field_alone(m, n + 8, &f, NULL) == -1, "field 0 wire type %d accepted", wt);
    }
    /* ... also spelled as a padded key (0x80 0x00: number 0, wire type 0). */
    static const uint8_t zero_padded[3] = {0x80, 0x00, 0x00};
    CHECK(field_alone(zero_padded, 3, &f, NULL) == -1, "padded field 0 accepted");

    /* The largest field number, 2^29 - 1, in a 5-byte key; 2^29 rejected. */
    n = key(m, LNORM__WIRE_MAX_FIELD, 0);
    CHECK(n == 5, "max key is %zu bytes", n);
    m[n++] = 42;
    CHECK(field_alone(m, n, &f, NULL) == 0 && f.num == LNORM__WIRE_MAX_FIELD && f.v == 42, "max field: num %u",
          (unsigned)f.num);
    n = key(m, (uint64_t)LNORM__WIRE_MAX_FIELD + 1, 0);
    m[n++] = 42;
    CHECK(field_alone(m, n, &f, NULL) == -1, "field 2^29 accepted");
    /* A number whose low 32 bits are 1 (a uint32 would alias it to field 1). */
    n = key(m, ((uint64_t)1 << 32) + 1, 0);
    m[n++] = 42;
    CHECK(field_alone(m, n, &f, NULL) == -1, "field 2^32+1 accepted");

    /* Keys: a zero-padded 5-byte key of field 1 is accepted, 6 bytes are not. */
    static const uint8_t key5[6] = {0x88, 0x80, 0x80, 0x80, 0x00, 0x2a};
    CHECK(field_alone(key5, 6, &f, NULL) == 0 && f.num == 1 && f.wt == 0 && f.v == 42, "5-byte key: num %u",
          (unsigned)f.num);
    static const uint8_t key6[7] = {0x88, 0x80, 0x80, 0x80, 0x80, 0x00, 0x2a};
    CHECK(field_alone(key6, 7, &f, NULL) == -1, "6-byte key accepted");
}

/* A whole message walked field by field, and a nested one inside it. */
static void test_walk(void)
{
    uint8_t m[64];
    size_t n = 0;
    n += key(m + n, 1, 0);
    n += put_varint(m + n, 1234567);
    n += key(m + n, 3, 2);
    uint8_t *inner_len = m + n;
    n += 1;
    size_t inner0 = n;
    n += key(m + n, 1, 0);
    n += put_varint(m + n, 9);
    n += key(m + n, 2, 5);
    memset(m + n, 0xff, 4);
    n += 4;
    *inner_len = (uint8_t)(n - inner0);
    n += key(m + n, 9, 1);
    memset(m + n, 0, 8);
    n += 8;

    uint8_t *b = exact(m, n);
    lnorm__wire_rd r = lnorm__wire_reader(b, n);
    lnorm__wire_field f;
    uint32_t nums[8];
    int k = 0;
    while (r.p < r.end && k < 8) {
        if (lnorm__wire_next_field(&r, &f) != 0)
            break;
        nums[k++] = f.num;
        if (f.num == 3) {
            lnorm__wire_rd s = lnorm__wire_reader(f.data, f.len);
            lnorm__wire_field g;
            CHECK(lnorm__wire_next_field(&s, &g) == 0 && g.num == 1 && g.v == 9, "inner field 1");
            CHECK(lnorm__wire_next_field(&s, &g) == 0 && g.num == 2 && g.wt == LNORM__WIRE_I32 && g.v == 0xffffffffu,
                  "inner field 2");
            CHECK(s.p == s.end, "inner message not used up");
            CHECK(lnorm__wire_next_field(&s, &g) == -1 && s.p == s.end, "read past the inner end");
        }
    }
    CHECK(r.p == r.end && k == 3 && nums[0] == 1 && nums[1] == 3 && nums[2] == 9, "walk: %d fields", k);
    free(b);
}

int main(void)
{
    test_varints();
    test_fields();
    test_walk();
    return check_finish("proto.wire");
}
