/*
 * The CPU's answer to "how fast are your f32 and bf16 matrix products" (the device entry
 * matmul_rates), which --dtype auto turns into a compute dtype (df_dtype_auto).
 *
 * Feature flags do not decide it: oneDNN's bf16 products run about twice its f32 rate on an
 * AMD EPYC with AVX512-BF16 (961 against 470 GFLOP/s) but 0.6x on an Intel Xeon with the
 * same flag and no AMX (145 against 231). So the backend measures: one product of a FLUX-
 * sized linear (512 x 2048 x 2048) in each dtype through the same oneDNN plans the models
 * use (df_cpu_gemm_rate: weights pre-packed, best of 5 runs after a warm-up), on the
 * device's threads. That takes well under a second, once: the result is kept in
 * $DIFFUSE_CACHE_DIR (else $XDG_CACHE_HOME/diffuse, else ~/.cache/diffuse) in a small text
 * file named by a hash of what decides the rates - the CPU model, oneDNN's effective ISA and
 * version, and the thread count - and holding that key in full, so another CPU, a capped ISA
 * (ONEDNN_MAX_CPU_ISA) or another thread count measures again. A cache file that cannot be
 * read back exactly (damaged, another key, a rate that is not a positive number) is
 * measured over and replaced; a cache folder that cannot be written only costs the probe
 * next time.
 *
 * DIFFUSE_MATMUL_RATES="f32=470,bf16=961" answers instead of measuring (tests, and users
 * who know better); a malformed value is an error naming the variable.
 */
#include <dnnl.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <diffuse/cpu.h>

#include "backend/cpu/cpu_cache.h"
#include "backend/cpu/gemm.h"
#include "core/status.h"

#define PROBE_M     512
#define PROBE_N     2048
#define PROBE_K     2048
#define PROBE_REPS  5
#define CACHE_MAGIC "diffuse matmul rates 1"

df_status df_matmul_rates_parse(const char *var, const char *v, double *f32, double *bf16)
{
    double r[2] = {-1, -1};
    const char *p = v;
    while (*p) {
        int which = strncmp(p, "f32=", 4) == 0 ? 0 : strncmp(p, "bf16=", 5) == 0 ? 1 : -1;
        if (which < 0)
            break;
        p += which ? 5 : 4;
        char *end;
        errno = 0;
        r[which] = strtod(p, &end);
        if (end == p || errno || !isfinite(r[which]) || r[which] < 0)
            break;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            break;
    }
    if (*p || r[0] <= 0 || r[1] < 0)
        return df_errorf(DF_E_ARG,
                         "%s='%.64s': expected "
                         "\"f32=GFLOPS,bf16=GFLOPS\" with a positive f32 rate (bf16 may be 0)",
                         var, v);
    *f32 = r[0];
    *bf16 = r[1];
    return DF_OK;
}

void df_cpu_cache_key(int threads, char *out, size_t cap)
{
    char model[128] = "unknown CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *colon = strchr(line, ':');
        if (colon) {
            colon += colon[1] == ' ' ? 2 : 1;
            snprintf(model, sizeof model, "%.*s", (int)strcspn(colon, "\n"), colon);
        }
        break;
    }
    if (f)
        fclose(f);
    for (char *c = model; *c; c++)
        if (*c == '|' || (unsigned char)*c < 0x20)
            *c = ' ';
    const dnnl_version_t *v = dnnl_version();
    snprintf(out, cap, "%s|isa %#x|oneDNN %d.%d.%d|threads %d", model,
             (unsigned)dnnl_get_effective_cpu_isa(), v->major, v->minor, v->patch, threads);
}

void df_cpu_cache_path(const char *stem, const char *key, char *out, size_t cap)
{
    const char *dir = getenv("DIFFUSE_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[3072];
    if (dir && *dir)
        snprintf(base, sizeof base, "%s", dir);
    else if (xdg && *xdg)
        snprintf(base, sizeof base, "%s/diffuse", xdg);
    else if (home && *home)
        snprintf(base, sizeof base, "%s/.cache/diffuse", home);
    else
        base[0] = '\0';
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *c = key; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    if (base[0])
        snprintf(out, cap, "%s/%s-%016llx.txt", base, stem, (unsigned long long)h);
    else
        out[0] = '\0';
}

/* The cached rates for `key`, when the file holds exactly that. */
static bool cache_read(const char *path, const char *key, double *f32, double *bf16)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char magic[64] = "", line[1024] = "", tail[8];
    double a = -1, b = -1;
    bool ok = fgets(magic, sizeof magic, f) && strcmp(magic, CACHE_MAGIC "\n") == 0 &&
              fgets(line, sizeof line, f) && strncmp(line, "key ", 4) == 0 &&
              strcspn(line + 4, "\n") == strlen(key) && strncmp(line + 4, key, strlen(key)) == 0 &&
              fscanf(f, "f32 %lf\nbf16 %lf\n", &a, &b) == 2 && fscanf(f, "%7s", tail) == EOF &&
              isfinite(a) && isfinite(b) && a > 0 && b >= 0;
    fclose(f);
    if (ok) {
        *f32 = a;
        *bf16 = b;
    }
    return ok;
}

bool df_cpu_cache_write(const char *path, const char *text)
{
    char dir[4096], tmp[4200];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        return false;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(dir, 0755);
            *p = '/';
        }
    mkdir(dir, 0755);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return false;
    bool ok = fputs(text, f) >= 0;
    ok = fclose(f) == 0 && ok;
    if (ok && rename(tmp, path) == 0)
        return true;
    unlink(tmp);
    return false;
}

/* Writes the rates' cache file; false when it cannot. */
static bool cache_write(const char *path, const char *key, double f32, double bf16)
{
    char text[1024];
    snprintf(text, sizeof text, CACHE_MAGIC "\nkey %s\nf32 %.1f\nbf16 %.1f\n", key, f32, bf16);
    return df_cpu_cache_write(path, text);
}

static df_status measure(int threads, double *f32, double *bf16)
{
    DF_TRY(df_cpu_gemm_rate(DF_DTYPE_F32, threads, PROBE_M, PROBE_N, PROBE_K, PROBE_REPS, f32));
    *bf16 = 0;
    if (df_gemm_compute_dtype(DF_DTYPE_BF16) != DF_DTYPE_BF16)
        return DF_OK; /* oneDNN has no bf16 products below AVX-512: bf16 would run as f32 */
    return df_cpu_gemm_rate(DF_DTYPE_BF16, threads, PROBE_M, PROBE_N, PROBE_K, PROBE_REPS, bf16);
}

df_status df_cpu_matmul_rates(int threads, double *f32, double *bf16, char *how, size_t cap)
{
    *f32 = *bf16 = 0;
    const char *env = getenv("DIFFUSE_MATMUL_RATES");
    if (env && *env) {
        DF_TRY(df_matmul_rates_parse("DIFFUSE_MATMUL_RATES", env, f32, bf16));
        snprintf(how, cap, "given by DIFFUSE_MATMUL_RATES");
        return DF_OK;
    }
    char key[512], path[4096];
    df_cpu_cache_key(threads, key, sizeof key);
    df_cpu_cache_path("matmul-rates", key, path, sizeof path);
    if (path[0] && cache_read(path, key, f32, bf16)) {
        snprintf(how, cap, "measured earlier on %d threads, cached in %s", threads, path);
        return DF_OK;
    }
    DF_TRY(measure(threads, f32, bf16));
    bool kept = path[0] && cache_write(path, key, *f32, *bf16);
    snprintf(how, cap, "measured now on %d threads (%dx%dx%d products)%s%s", threads, PROBE_M,
             PROBE_N, PROBE_K, kept ? ", cached in " : ", not cached", kept ? path : "");
    return DF_OK;
}
