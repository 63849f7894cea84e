/*
 * Measurements of this CPU kept on disk (matmul_rates.c): the f32 / bf16 rates and the
 * int8 products' choice of path (int8_choice.c) are measured once per CPU and read back.
 *
 * The folder is $DIFFUSE_CACHE_DIR, else $XDG_CACHE_HOME/diffuse, else ~/.cache/diffuse;
 * each measurement is one small text file named by a hash of its key, and holding the key
 * in full, so that a file for another CPU, ISA, oneDNN or thread count is never taken.
 */
#ifndef DF_BACKEND_CPU_CPU_CACHE_H
#define DF_BACKEND_CPU_CPU_CACHE_H

#include <stdbool.h>
#include <stddef.h>

/* What decides a measurement, as one line: the CPU model, oneDNN's effective ISA and
 * version, and the thread count ("Intel(R) Xeon(R) ...|isa 0x..|oneDNN 2.6.0|threads 2"). */
void df_cpu_cache_key(int threads, char *out, size_t cap);
/* The file for `key` in the cache folder, "<folder>/<stem>-<hash of key>.txt"; "" when
 * there is no folder (no variable names one and no HOME). */
void df_cpu_cache_path(const char *stem, const char *key, char *out, size_t cap);
/* Writes `text` as the file at path whole (a temporary name, then rename), making its
 * folder; false when it cannot. */
bool df_cpu_cache_write(const char *path, const char *text);

#endif
