/*
 * Things that concern every model class at once: the table of the classes diffuse
 * implements, and their checks.
 *
 * The table has one row per class. Every list of classes reads it: `diffuse inspect`'s
 * checks (df_models_register_checks), the int8 policy's weights kept in f32, the
 * architectures `diffuse make-tiny` writes and the transformer classes diffuse-check runs.
 * Adding a model class is its model file and one row here (src/models/model_classes.c);
 * a unit test (test_model_classes) fails when a row lacks what one of those readers needs.
 */
#ifndef DIFFUSE_MODELS_H
#define DIFFUSE_MODELS_H

#include "layout.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DF_MODEL_TINY_ARCHS 2 /* make-tiny architectures one class may have */

/* One model class diffuse implements. */
typedef struct df_model_class {
    const char *name;        /* the config's "_class_name" (transformers: "architectures"[0]) */
    const char *component;   /* the pipeline folder it fills: "transformer", "vae", ... */
    df_model_check_fn check; /* what `diffuse inspect` runs on a folder of the class */
    /* Weight-name prefixes that int8 compute keeps in higher precision (transformers: the
     * embedders and output layers), NULL-terminated; NULL for none. */
    const char *const *int8_keep;
    /* `diffuse make-tiny --arch` values whose pipeline holds the class (NULL-padded). */
    const char *tiny_arch[DF_MODEL_TINY_ARCHS];
} df_model_class;

/* The table of the model classes, *n rows (n may be NULL). Borrowed, static. */
DF_API const df_model_class *df_model_classes(int *n);

/* The row of class `name`, or NULL when diffuse does not implement it. */
DF_API const df_model_class *df_model_class_find(const char *name);

/* Registers, for `diffuse inspect` (df_model_check_find), the check of every row of the
 * table (df_model_classes): the models, the scheduler and the tokenizers. Each loads the
 * folder as a pipeline would and reports the first missing, unexpected or mis-shaped tensor
 * or bad config key. */
DF_API df_status df_models_register_checks(void);

#ifdef __cplusplus
}
#endif
#endif
