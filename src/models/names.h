/*
 * Name maps: where a diffusers tensor lives in a checkpoint written with other names
 * (Black Forest Labs' originals, ComfyUI's prefixed files, city96's GGUFs). Each model
 * owns its map (names_<model>.c); the loader (single_file.c) applies it while binding, so
 * nothing is converted or copied on disk.
 */
#ifndef DF_MODELS_NAMES_H
#define DF_MODELS_NAMES_H

#include <stdbool.h>

/* A diffusers tensor as rows of an original one: the original's first dimension cut in
 * `units` equal parts, and parts [part[i][0], part[i][1]) for i < n concatenated. */
typedef struct df_name_src {
    char name[256];
    int units;
    int n;
    int part[2][2];
} df_name_src;

/* Fills *out for diffusers tensor `diffusers`; false when the map has no such name. */
typedef bool (*df_name_map)(const char *diffusers, df_name_src *out);

/* FLUX.1 (FluxTransformer2DModel) in BFL's layout, and a name every such file holds. */
bool df_names_flux_bfl(const char *diffusers, df_name_src *out);
const char *df_names_flux_probe(void);

#endif
