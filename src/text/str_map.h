/*
 * A hash map from byte strings to 32-bit values, for vocabularies and merge tables.
 *
 * Keys are copied into one growing byte arena (NUL-terminated, so a stored key can be handed
 * out as a C string); entries keep offsets into it. Open addressing with linear probing over
 * a power-of-two slot table kept at most half full. Lookups take a precomputed hash too, so
 * a caller that extends a key byte by byte (a trie walk) hashes incrementally.
 */
#ifndef DF_TEXT_STR_MAP_H
#define DF_TEXT_STR_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct df_str_map_entry {
    uint32_t off; /* key offset in the arena */
    uint32_t len; /* key length in bytes */
    uint32_t hash;
    int32_t value;
} df_str_map_entry;

typedef struct df_str_map {
    uint32_t *slots;           /* entry index + 1; 0 = empty */
    size_t nslots;             /* power of two, or 0 before the first insert */
    df_str_map_entry *entries; /* in insertion order */
    size_t count, entries_cap;
    char *arena;
    size_t arena_len, arena_cap;
} df_str_map;

#define DF_STR_HASH_INIT 2166136261u

/* FNV-1a, one byte at a time: h = df_str_hash_step(h, byte), starting from DF_STR_HASH_INIT. */
static inline uint32_t df_str_hash_step(uint32_t h, uint8_t byte)
{
    return (h ^ byte) * 16777619u;
}

static inline uint32_t df_str_hash(const char *s, size_t len)
{
    uint32_t h = DF_STR_HASH_INIT;
    for (size_t i = 0; i < len; i++)
        h = df_str_hash_step(h, (uint8_t)s[i]);
    return h;
}

void df_str_map_init(df_str_map *m);
void df_str_map_deinit(df_str_map *m);

/* Inserts key -> value, or replaces the value when the key is present. Returns the entry
 * index through *out_index (may be NULL). False when memory ran out or the map would pass
 * 2^31 entries / 4 GiB of keys; the map is unchanged then. */
bool df_str_map_put(df_str_map *m, const char *key, size_t len, int32_t value, size_t *out_index);

/* Looks a key up; `hash` must be df_str_hash(key, len). Returns the entry or NULL. */
const df_str_map_entry *df_str_map_find(const df_str_map *m, const char *key, size_t len,
                                        uint32_t hash);

/* Convenience: true and *value when present. */
bool df_str_map_get(const df_str_map *m, const char *key, size_t len, int32_t *value);

/* The NUL-terminated key of an entry; valid until the next put. */
static inline const char *df_str_map_key(const df_str_map *m, const df_str_map_entry *e)
{
    return m->arena + e->off;
}

#endif
