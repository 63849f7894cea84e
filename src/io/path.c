/*
 * Files and paths for the io layer.
 *
 * Every file that diffuse reads is opened through df_file_open_regular: it opens with
 * O_NONBLOCK so that a FIFO named by a hostile index cannot hang us, then refuses anything
 * that fstat does not call a regular file. Names read from files (shard names in an index,
 * component names in model_index.json) pass df_path_check_inside before they are joined to
 * a folder; symbolic links inside the folder are followed, as a Hugging Face cache snapshot
 * is made of them. The readers of large files (safetensors, GGUF) map them read-only and
 * give the pages of a tensor back once it has been copied out (df_map_release_pages).
 */
#include "io/path.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/status.h"

df_status df_file_open_regular(const char *path, int *out_fd, uint64_t *out_size)
{
    *out_fd = -1;
    *out_size = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return df_errorf(DF_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return df_errorf(DF_E_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return df_errorf(DF_E_IO, "%s: not a regular file", path);
    }
    /* Regular files ignore O_NONBLOCK for reads, but clear it anyway. */
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0)
        (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *out_fd = fd;
    *out_size = (uint64_t)sb.st_size;
    return DF_OK;
}

df_status df_file_open_mappable(const char *path, int *out_fd, size_t *out_size)
{
    *out_size = 0;
    uint64_t size;
    DF_TRY(df_file_open_regular(path, out_fd, &size));
    if (size > SIZE_MAX / 2) {
        close(*out_fd);
        *out_fd = -1;
        return df_errorf(DF_E_IO, "%s: file too large to map", path);
    }
    *out_size = (size_t)size;
    return DF_OK;
}

df_status df_file_map(int fd, size_t size, const char *path, const uint8_t **out)
{
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED)
        return df_errorf(DF_E_IO, "%s: cannot map %zu bytes: %s", path, size, strerror(errno));
    *out = m;
    return DF_OK;
}

bool df_map_release_pages(const uint8_t *base, size_t size, uint64_t begin, uint64_t end)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t last = ((uint64_t)size + page - 1) / page * page;
    begin = begin / page * page;
    end = (end + page - 1) / page * page;
    if (end > last)
        end = last;
    return madvise((void *)(base + begin), (size_t)(end - begin), MADV_DONTNEED) == 0;
}

df_status df_file_read_all(const char *path, size_t max, char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    int fd;
    uint64_t size;
    DF_TRY(df_file_open_regular(path, &fd, &size));
    if (size > max) {
        close(fd);
        return df_errorf(DF_E_FORMAT, "%s: file has %llu bytes; at most %zu are read", path,
                         (unsigned long long)size, max);
    }
    char *buf = df_malloc((size_t)size + 1);
    if (!buf) {
        close(fd);
        return df_errorf(DF_E_OOM, "%s: out of memory reading %llu bytes", path,
                         (unsigned long long)size);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, (size_t)size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            df_free(buf);
            return df_errorf(DF_E_IO, "%s: read failed: %s", path, strerror(e));
        }
        if (r == 0)
            break; /* the file shrank while we read it: take what is there */
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    *out_len = got;
    return DF_OK;
}

df_status df_file_copy(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb");
    if (!in)
        return df_errorf(DF_E_IO, "%s: cannot open: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return df_errorf(DF_E_IO, "%s: cannot create: %s", to, strerror(errno));
    }
    char buf[65536];
    size_t n;
    bool ok = true;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    fclose(in);
    ok = fclose(out) == 0 && ok;
    return ok ? DF_OK : df_errorf(DF_E_IO, "copying %s to %s failed", from, to);
}

df_status df_dir_make(const char *path)
{
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return df_errorf(DF_E_IO, "%s: cannot create the folder: %s", path, strerror(errno));
    return DF_OK;
}

bool df_path_is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

bool df_path_is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

df_status df_path_join(const char *dir, const char *name, char **out)
{
    *out = NULL;
    size_t a = strlen(dir), b = strlen(name);
    bool slash = a > 0 && dir[a - 1] != '/';
    size_t n;
    if (!df_size_add(a, b, &n) || !df_size_add(n, 2, &n))
        return df_errorf(DF_E_ARG, "path too long");
    char *p = df_malloc(n);
    if (!p)
        return df_errorf(DF_E_OOM, "out of memory joining '%s' and '%s'", dir, name);
    memcpy(p, dir, a);
    if (slash)
        p[a++] = '/';
    memcpy(p + a, name, b + 1);
    *out = p;
    return DF_OK;
}

df_status df_path_dirname(const char *path, char **out)
{
    *out = NULL;
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (slash && n == 0)
        n = 1; /* "/x" -> "/" */
    char *p = df_malloc(n + 2);
    if (!p)
        return df_errorf(DF_E_OOM, "out of memory");
    if (slash) {
        memcpy(p, path, n);
        p[n] = '\0';
    } else {
        strcpy(p, ".");
    }
    *out = p;
    return DF_OK;
}

df_status df_path_check_inside(const char *rel, bool plain_name, const char *source,
                               const char *what)
{
    if (rel[0] == '\0')
        return df_errorf(DF_E_FORMAT, "%s: %s name is empty", source, what);
    if (rel[0] == '/')
        return df_errorf(DF_E_FORMAT, "%s: %s '%s' is an absolute path; it must name a file "
                         "inside the folder", source, what, rel);
    if (plain_name && strchr(rel, '/'))
        return df_errorf(DF_E_FORMAT, "%s: %s '%s' contains '/'; it must be a plain name",
                         source, what, rel);
    for (const char *p = rel; *p;) {
        const char *end = strchr(p, '/');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return df_errorf(DF_E_FORMAT, "%s: %s '%s' has a '..' component; it must stay "
                             "inside the folder", source, what, rel);
        if (plain_name && n == 1 && p[0] == '.')
            return df_errorf(DF_E_FORMAT, "%s: %s '.' does not name an entry of the folder",
                             source, what);
        p += n;
        if (*p == '/')
            p++;
    }
    return DF_OK;
}

bool df_str_ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && memcmp(s + a - b, suffix, b) == 0;
}
