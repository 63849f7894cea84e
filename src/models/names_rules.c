/*
 * Name-map tables (names.h): a diffusers name matched against each rule's pattern, the
 * block index and the last word carried over into the original's name. The FLUX.1 and
 * SD3 maps are such tables; the VAE's, which counts blocks the other way, is code. The
 * probes of diffusers' own names under a prefix live here too.
 */
#include "models/names.h"

#include <stdio.h>
#include <string.h>

/*
 * Matches `name` against `pattern`: '*' takes a block index (digits) into *index; a pattern
 * ending in '.' matches any one remaining word ("weight", "bias") into *rest.
 */
static bool match(const char *pattern, const char *name, char *index, const char **rest)
{
    *rest = "";
    index[0] = '\0';
    for (; *pattern; pattern++) {
        if (*pattern == '*') {
            int n = 0;
            while (name[n] >= '0' && name[n] <= '9' && n < 15)
                n++;
            if (n == 0 || n >= 15)
                return false;
            memcpy(index, name, (size_t)n);
            index[n] = '\0';
            name += n;
        } else if (*name++ != *pattern) {
            return false;
        }
    }
    if (pattern[-1] == '.') {
        if (strcmp(name, "weight") != 0 && strcmp(name, "bias") != 0)
            return false;
        *rest = name;
        return true;
    }
    return *name == '\0';
}

/* Writes `pattern` with '*' replaced by `index`, then `rest`. */
static bool expand(const char *pattern, const char *index, const char *rest, char *out, size_t cap)
{
    size_t n = 0;
    for (; *pattern && n + 16 < cap; pattern++) {
        if (*pattern == '*')
            n += (size_t)snprintf(out + n, cap - n, "%s", index);
        else
            out[n++] = *pattern;
    }
    out[n] = '\0';
    return (size_t)snprintf(out + n, cap - n, "%s", rest) < cap - n && !*pattern;
}

bool df_names_lookup(const df_name_rule *rules, size_t n, const char *diffusers, df_name_src *out)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < n; i++) {
        const df_name_rule *r = &rules[i];
        char index[16];
        const char *rest;
        if (!match(r->diffusers, diffusers, index, &rest))
            continue;
        if (!expand(r->original, index, rest, out->name, sizeof out->name))
            return false;
        out->units = r->units;
        out->n = r->n;
        memcpy(out->part, r->part, sizeof r->part);
        return true;
    }
    return false;
}

/* "single_transformer_blocks.0.attn.to_q.weight" does not end in it: a probe matches after
 * a '.' or at the start of a name. */
const char *df_names_diffusers_transformer_probe(void)
{
    return "transformer_blocks.0.attn.to_q.weight";
}

const char *df_names_diffusers_vae_probe(void)
{
    return "decoder.mid_block.resnets.0.conv1.weight";
}
