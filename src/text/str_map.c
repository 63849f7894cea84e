/*
 * String -> int32 hash map (see str_map.h).
 *
 * FNV-1a hashing, linear probing, table doubled when half full. Keys live in one arena so a
 * vocabulary of tens of thousands of tokens costs three allocations, not one per token.
 */
#include "text/str_map.h"

#include <string.h>

#include "core/alloc.h"
#include "text/text_util.h"

void df_str_map_init(df_str_map *m)
{
    memset(m, 0, sizeof *m);
}

void df_str_map_deinit(df_str_map *m)
{
    if (!m)
        return;
    df_free(m->slots);
    df_free(m->entries);
    df_free(m->arena);
    memset(m, 0, sizeof *m);
}

const df_str_map_entry *df_str_map_find(const df_str_map *m, const char *key, size_t len,
                                        uint32_t hash)
{
    if (m->nslots == 0)
        return NULL;
    size_t mask = m->nslots - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        uint32_t s = m->slots[i];
        if (s == 0)
            return NULL;
        const df_str_map_entry *e = &m->entries[s - 1];
        if (e->hash == hash && e->len == len && memcmp(m->arena + e->off, key, len) == 0)
            return e;
    }
}

bool df_str_map_get(const df_str_map *m, const char *key, size_t len, int32_t *value)
{
    const df_str_map_entry *e = df_str_map_find(m, key, len, df_str_hash(key, len));
    if (e && value)
        *value = e->value;
    return e != NULL;
}

static bool grow_slots(df_str_map *m)
{
    size_t n = m->nslots ? m->nslots * 2 : 64;
    uint32_t *slots = df_calloc(n, sizeof *slots);
    if (!slots)
        return false;
    for (size_t k = 0; k < m->count; k++) {
        size_t i = m->entries[k].hash & (n - 1);
        while (slots[i])
            i = (i + 1) & (n - 1);
        slots[i] = (uint32_t)(k + 1);
    }
    df_free(m->slots);
    m->slots = slots;
    m->nslots = n;
    return true;
}

bool df_str_map_put(df_str_map *m, const char *key, size_t len, int32_t value, size_t *out_index)
{
    uint32_t hash = df_str_hash(key, len);
    const df_str_map_entry *found = df_str_map_find(m, key, len, hash);
    if (found) {
        size_t k = (size_t)(found - m->entries);
        m->entries[k].value = value;
        if (out_index)
            *out_index = k;
        return true;
    }
    if (m->count >= INT32_MAX || len >= UINT32_MAX - m->arena_len - 1)
        return false;
    if ((m->count + 1) * 2 > m->nslots && !grow_slots(m))
        return false;
    if (!df_array_reserve((void **)&m->entries, &m->entries_cap, m->count + 1, sizeof *m->entries))
        return false;
    if (!df_array_reserve((void **)&m->arena, &m->arena_cap, m->arena_len + len + 1, 1))
        return false;

    df_str_map_entry *e = &m->entries[m->count];
    e->off = (uint32_t)m->arena_len;
    e->len = (uint32_t)len;
    e->hash = hash;
    e->value = value;
    if (len)
        memcpy(m->arena + m->arena_len, key, len);
    m->arena[m->arena_len + len] = '\0';
    m->arena_len += len + 1;

    size_t mask = m->nslots - 1;
    size_t i = hash & mask;
    while (m->slots[i])
        i = (i + 1) & mask;
    m->slots[i] = (uint32_t)(m->count + 1);
    if (out_index)
        *out_index = m->count;
    m->count++;
    return true;
}
