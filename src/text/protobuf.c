/*
 * Protobuf wire-format reader (see protobuf.h). Written for this project rather than taken
 * from a protobuf library: spiece.model needs only field iteration, varints, fixed32 floats
 * and nested length-delimited messages.
 *
 * Every length is checked against the bytes left before it is used, so a truncated or
 * hostile file ends in an error, never in a read past the buffer.
 */
#include "text/protobuf.h"

#include <string.h>

void df_pb_reader_init(df_pb_reader *r, const void *data, size_t len)
{
    r->begin = data;
    r->p = data;
    r->end = r->begin + len;
    r->error = NULL;
}

static bool read_varint(df_pb_reader *r, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) {
            r->error = "varint runs past the end";
            return false;
        }
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return true;
        }
    }
    r->error = "varint longer than 10 bytes";
    return false;
}

static bool take(df_pb_reader *r, size_t n, const uint8_t **out)
{
    if ((size_t)(r->end - r->p) < n) {
        r->error = "field runs past the end";
        return false;
    }
    *out = r->p;
    r->p += n;
    return true;
}

/* An n-byte little-endian value, shifted in after what *v holds. */
static bool read_fixed(df_pb_reader *r, size_t n, uint64_t *v)
{
    const uint8_t *bytes;
    if (!take(r, n, &bytes))
        return false;
    for (size_t i = n; i-- > 0;)
        *v = (*v << 8) | bytes[i];
    return true;
}

int df_pb_next(df_pb_reader *r, df_pb_field *f)
{
    memset(f, 0, sizeof *f);
    if (r->p >= r->end)
        return 0;
    f->offset = df_pb_offset(r);
    uint64_t key;
    if (!read_varint(r, &key))
        return -1;
    f->number = (uint32_t)(key >> 3);
    f->wire_type = (int)(key & 7);
    if (key >> 3 == 0 || key >> 3 > 0x1fffffff) {
        r->error = "field number out of range";
        return -1;
    }
    switch (f->wire_type) {
    case DF_PB_VARINT:
        return read_varint(r, &f->value) ? 1 : -1;
    case DF_PB_FIXED64:
        return read_fixed(r, 8, &f->value) ? 1 : -1;
    case DF_PB_FIXED32:
        return read_fixed(r, 4, &f->value) ? 1 : -1;
    case DF_PB_BYTES: {
        uint64_t n;
        if (!read_varint(r, &n))
            return -1;
        if (n > (uint64_t)(r->end - r->p)) {
            r->error = "length-delimited field runs past the end";
            return -1;
        }
        f->data = r->p;
        f->len = (size_t)n;
        r->p += n;
        return 1;
    }
    default:
        r->error = "unsupported wire type (groups or invalid)";
        return -1;
    }
}

float df_pb_float(const df_pb_field *f)
{
    uint32_t bits = (uint32_t)f->value;
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}
