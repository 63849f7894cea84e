/*
 * A minimal reader of the protobuf wire format, enough for SentencePiece's spiece.model.
 *
 * Written for this project (no protobuf library): a message is a sequence of fields, each a
 * varint key (field number << 3 | wire type) and a payload: varint (0), 8 bytes (1), a
 * length-delimited byte run (2) or 4 bytes (5). Nested messages are length-delimited runs
 * read with a second reader. Groups (wire types 3 and 4) are obsolete and rejected.
 */
#ifndef DF_TEXT_PROTOBUF_H
#define DF_TEXT_PROTOBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { DF_PB_VARINT = 0, DF_PB_FIXED64 = 1, DF_PB_BYTES = 2, DF_PB_FIXED32 = 5 };

typedef struct df_pb_reader {
    const uint8_t *begin, *p, *end;
    const char *error; /* what was wrong, after df_pb_next returned -1 */
} df_pb_reader;

typedef struct df_pb_field {
    uint32_t number;
    int wire_type;
    uint64_t value;      /* varint, or the raw bits of a fixed32 / fixed64 */
    const uint8_t *data; /* wire type 2: the payload */
    size_t len;
    size_t offset; /* where the field's key starts, from the reader's begin */
} df_pb_field;

void df_pb_reader_init(df_pb_reader *r, const void *data, size_t len);

/* Reads the next field: 1 when one was read, 0 at the end of the message, -1 when the
 * bytes are malformed (r->error says why; df_pb_offset gives where). */
int df_pb_next(df_pb_reader *r, df_pb_field *f);

/* Byte offset of the reader's position from the start of its message. */
static inline size_t df_pb_offset(const df_pb_reader *r)
{
    return (size_t)(r->p - r->begin);
}

/* Field value conversions. proto2 int32 fields carry negative numbers as 64-bit varints. */
static inline int32_t df_pb_int32(const df_pb_field *f)
{
    return (int32_t)(uint32_t)f->value;
}
static inline bool df_pb_bool(const df_pb_field *f)
{
    return f->value != 0;
}
float df_pb_float(const df_pb_field *f);

#endif
