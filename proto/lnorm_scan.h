/*
 * lnorm_scan.h: what protobuf-c would keep of a message beyond its schema,
 * found before it unpacks anything (header-only, C11, internal).
 *
 * protobuf-c keeps every field it does not know (in unknown_fields: a
 * struct and a copy of the bytes each) and allocates every entry of a
 * repeated field, so a message of many tiny fields costs some 30 to 45
 * times its size to unpack; and its strings are C strings, cut at the
 * first NUL byte. lnorm__scan_message walks the encoded message with
 * lnorm_wire.h, looks every field up in the message's descriptor, recurses
 * into the known sub-messages, and counts:
 *  - the fields the schema does not have, and their encoded bytes (key,
 *    length and payload);
 *  - the entries of repeated fields (a packed run counts its bytes);
 *  - the first string field holding a NUL byte.
 * lnormd refuses requests, and liblnorm replies, above its limits. It
 * returns -1 on malformed bytes (then the counts are partial: leave the
 * verdict to protobuf-c, which rejects such a message), else 0.
 */
#ifndef LNORM_SCAN_H
#define LNORM_SCAN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>

#include "lnorm_wire.h"

/* Sub-messages deeper than this are not entered (lnorm.v1 nests 3 deep). */
#define LNORM__SCAN_MAX_DEPTH 8

/* What lnormd accepts in a request and liblnorm in a health or info reply:
 * at most this many fields outside the schema (the message and its
 * sub-messages together), of at most this many encoded bytes in all;
 * enough for liblnorm's padding field and a newer peer's few new fields. */
#define LNORM__MAX_UNKNOWN_FIELDS 16u
#define LNORM__MAX_UNKNOWN_BYTES 4096u

typedef struct lnorm__scan {
    unsigned unknown;                         /* fields not in the schema */
    size_t unknown_bytes;                     /* their encoded bytes */
    size_t repeated;                          /* entries of repeated fields */
    const ProtobufCMessageDescriptor *nul_in; /* a string with a NUL: its message */
    const ProtobufCFieldDescriptor *nul;      /* and its field (NULL: none) */
} lnorm__scan;

static inline int lnorm__scan_message(const uint8_t *buf, size_t len, const ProtobufCMessageDescriptor *desc,
                                      int depth, lnorm__scan *sc)
{
    lnorm__wire_rd r = lnorm__wire_reader(buf, len);
    while (r.p < r.end) {
        const uint8_t *f0 = r.p;
        lnorm__wire_field fl;
        if (lnorm__wire_next_field(&r, &fl) != 0)
            return -1;
        const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(desc, fl.num);
        if (!fd) {
            sc->unknown++;
            sc->unknown_bytes += (size_t)(r.p - f0);
            continue;
        }
        int packed = fl.wt == LNORM__WIRE_LEN && fd->type != PROTOBUF_C_TYPE_STRING &&
                     fd->type != PROTOBUF_C_TYPE_BYTES && fd->type != PROTOBUF_C_TYPE_MESSAGE;
        if (fd->label == PROTOBUF_C_LABEL_REPEATED)
            sc->repeated += packed ? fl.len : 1;
        if (fl.wt != LNORM__WIRE_LEN)
            continue;
        if (fd->type == PROTOBUF_C_TYPE_STRING && !sc->nul && memchr(fl.data, 0, fl.len)) {
            sc->nul_in = desc;
            sc->nul = fd;
        } else if (fd->type == PROTOBUF_C_TYPE_MESSAGE && depth < LNORM__SCAN_MAX_DEPTH &&
                   lnorm__scan_message(fl.data, fl.len, (const ProtobufCMessageDescriptor *)fd->descriptor,
                                       depth + 1, sc) != 0) {
            return -1;
        }
    }
    return 0;
}

#endif
