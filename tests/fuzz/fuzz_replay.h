/*
 * A main() for fuzz targets built without libFuzzer (-DDF_FUZZ_REPLAY): runs every file
 * named on the command line, and every regular file inside every folder named, through
 * LLVMFuzzerTestOneInput. Each input is copied into a buffer of exactly its size so that
 * the sanitizers see any read past its end. A folder that does not exist is skipped (the
 * crashers folder of a parser may not exist yet); finding no input at all is a failure.
 */
#ifndef DF_FUZZ_REPLAY_H
#define DF_FUZZ_REPLAY_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            uint8_t *bigger = realloc(buf, cap *= 2);
            if (!bigger)
                free(buf);
            buf = bigger;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "out of memory reading %s\n", path);
        return -1;
    }
    uint8_t *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replays the regular files of `dir` in name order; returns how many, or -1. */
static int replay_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    char **names = NULL;
    int n = 0, cap = 0, done = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = realloc(names, sizeof *names * (size_t)cap);
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name);
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
            if (replay_file(path) != 0)
                done = -1;
            else if (done >= 0)
                done++;
        }
        free(names[i]);
    }
    free(names);
    return done;
}

int main(int argc, char **argv)
{
    int total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0)
            continue;
        int n = S_ISDIR(sb.st_mode) ? replay_dir(argv[i]) : (replay_file(argv[i]) == 0);
        if (n < 0)
            return 1;
        printf("%s: %d input%s\n", argv[i], n, n == 1 ? "" : "s");
        total += n;
    }
    if (total == 0) {
        fprintf(stderr, "no inputs found\n");
        return 1;
    }
    printf("replayed %d inputs without a crash\n", total);
    return 0;
}

#endif
