/*
 * Inside of df_json documents, shared by json.c (parsing, navigation) and json_get.c
 * (typed getters).
 *
 * A document is one df_malloc'd block: the nodes (the root first, each container's children
 * side by side), then each object's members sorted by key, then every string. Freeing the
 * root frees the block.
 */
#ifndef DF_IO_JSON_H
#define DF_IO_JSON_H

#include <diffuse/json.h>

/* Largest file df_json_parse_file reads (tokenizer.json files of large vocabularies are
 * tens of MB). */
#define DF_JSON_MAX_FILE ((size_t)512 << 20)

struct df_json {
    df_json_type type;
    int64_t index;         /* position in the parent: array index or member order */
    const df_json *parent; /* NULL for the root */
    const char *key;       /* the member's key; NULL for array elements and the root */
    const char *source;    /* the document's file name */
    union {
        struct {
            double value;       /* the nearest double */
            uint64_t magnitude; /* |value| exactly, when `integer` */
            bool negative;
            bool integer; /* written without fraction or exponent, |value| < 2^64 */
        } number;
        bool boolean;
        const char *string;
        struct {
            df_json *items;         /* n children in file order */
            const df_json **sorted; /* objects: the same children sorted by key */
            int64_t n;
        } list;
    } v;
};

#endif
