/*
 * lnorm_wire.h: a minimal reader of the protobuf wire format (the encoding
 * of the messages in lnorm.proto), for the places that walk encoded bytes
 * without protobuf-c: lnormd's request splitter (server/codec.c), the
 * client library's zero-copy Response reader (client/lib/wire.c) and
 * lnorm-bench's reply scanner (client/bench/work.c).
 *
 * Internal, header-only (static inline), C11. It never reads at or past the
 * reader's end and rejects, as an error, everything that is not a
 * well-formed field of a proto3 message:
 *  - a varint cut short by the end of the buffer, one longer than 10 bytes,
 *    or a 10-byte one whose value does not fit in 64 bits;
 *  - a key longer than 5 bytes (protobuf-c rejects those too), a field
 *    number of 0 or above 2^29 - 1 (the largest the language allows);
 *  - wire types 3 and 4 (groups, not part of proto3), 6 and 7 (undefined);
 *  - a fixed32 / fixed64 value or a length-delimited payload that runs past
 *    the end of the buffer.
 * Non-canonical (zero-padded) varints within those limits are accepted, as
 * protobuf parsers do. Functions return 0 on success and -1 on error; on
 * error the reader is left where it was and the outputs are not written.
 */
#ifndef LNORM_WIRE_H
#define LNORM_WIRE_H

#include <stddef.h>
#include <stdint.h>

/* Wire types (the low 3 bits of a key). */
enum {
    LNORM__WIRE_VARINT = 0,
    LNORM__WIRE_I64 = 1,
    LNORM__WIRE_LEN = 2,
    LNORM__WIRE_I32 = 5,
};

/* Limits of the encoding: the longest varint, the longest key protobuf-c
 * reads, and the largest field number. */
#define LNORM__WIRE_MAX_VARINT_BYTES 10
#define LNORM__WIRE_MAX_KEY_BYTES 5
#define LNORM__WIRE_MAX_FIELD 536870911u /* 2^29 - 1 */

/* A cursor over encoded bytes: p is the next byte to read, end one past the
 * last; p == end means everything has been read. */
typedef struct lnorm__wire_rd {
    const uint8_t *p, *end;
} lnorm__wire_rd;

/* One field as read by lnorm__wire_next_field: its number (1..2^29-1) and
 * wire type, and its value. v is the varint's value for VARINT, the
 * little-endian value for I64 / I32, the payload's length for LEN. data and
 * len are the payload of a LEN field (pointing into the reader's buffer,
 * nothing copied), NULL and 0 for the other wire types. */
typedef struct lnorm__wire_field {
    uint32_t num;
    int wt;
    uint64_t v;
    const uint8_t *data;
    size_t len;
} lnorm__wire_field;

/* A reader over the n bytes at buf. */
static inline lnorm__wire_rd lnorm__wire_reader(const void *buf, size_t n)
{
    lnorm__wire_rd r = {(const uint8_t *)buf, (const uint8_t *)buf + n};
    return r;
}

/* Read one base-128 varint (least significant group first, high bit set on
 * every byte but the last) into *v. At most 10 bytes; the 10th carries only
 * bit 63, so it must be 0 or 1: a 10th byte with any other bit set (a
 * value beyond 64 bits, or an 11th byte to come) is an error, as is running
 * into the end of the buffer before the last byte. */
static inline int lnorm__wire_varint(lnorm__wire_rd *r, uint64_t *v)
{
    const uint8_t *p = r->p;
    uint64_t x = 0;
    for (int i = 0; i < LNORM__WIRE_MAX_VARINT_BYTES; i++) {
        if (p >= r->end)
            return -1;
        uint8_t b = *p++;
        if (i == LNORM__WIRE_MAX_VARINT_BYTES - 1 && b > 1)
            return -1;
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *v = x;
            r->p = p;
            return 0;
        }
    }
    return -1; /* not reached: the 10th byte either ends the varint or fails above */
}

/* The n (4 or 8) bytes at p as a little-endian unsigned integer, whatever
 * the host's byte order and alignment. */
static inline uint64_t lnorm__wire_le(const uint8_t *p, int n)
{
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--)
        x = x << 8 | p[i];
    return x;
}

/* Read one field: its key (a varint of at most 5 bytes holding the field
 * number and the wire type), then its value as the wire type says: a
 * varint (0), 8 bytes (1), a varint length and that many bytes (2), or 4
 * bytes (5). Fills *f (see lnorm__wire_field) and moves the reader past
 * the field. Field number 0, numbers above 2^29 - 1, wire types 3, 4, 6
 * and 7 and any value that is malformed or runs past the end are errors. */
static inline int lnorm__wire_next_field(lnorm__wire_rd *r, lnorm__wire_field *f)
{
    lnorm__wire_rd s = *r;
    uint64_t key, v = 0;
    if (lnorm__wire_varint(&s, &key) != 0 || s.p - r->p > LNORM__WIRE_MAX_KEY_BYTES)
        return -1;
    uint64_t num = key >> 3;
    int wt = (int)(key & 7);
    if (num == 0 || num > LNORM__WIRE_MAX_FIELD)
        return -1;
    const uint8_t *data = NULL;
    size_t len = 0;
    switch (wt) {
    case LNORM__WIRE_VARINT:
        if (lnorm__wire_varint(&s, &v) != 0)
            return -1;
        break;
    case LNORM__WIRE_I64:
        if (s.end - s.p < 8)
            return -1;
        v = lnorm__wire_le(s.p, 8);
        s.p += 8;
        break;
    case LNORM__WIRE_I32:
        if (s.end - s.p < 4)
            return -1;
        v = lnorm__wire_le(s.p, 4);
        s.p += 4;
        break;
    case LNORM__WIRE_LEN:
        if (lnorm__wire_varint(&s, &v) != 0 || v > (uint64_t)(s.end - s.p))
            return -1;
        data = s.p;
        len = (size_t)v;
        s.p += len;
        break;
    default:
        return -1; /* 3, 4: groups (not in proto3); 6, 7: undefined */
    }
    f->num = (uint32_t)num;
    f->wt = wt;
    f->v = v;
    f->data = data;
    f->len = len;
    *r = s;
    return 0;
}

#endif /* LNORM_WIRE_H */
