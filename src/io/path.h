/*
 * Files and paths for the io layer: opening only regular files, reading or mapping a whole
 * file, copying one, and joining a folder with a name read from a file without letting the
 * name escape the folder.
 */
#ifndef DF_IO_PATH_H
#define DF_IO_PATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <diffuse/status.h>

/* Opens `path` read-only. DF_E_IO when it cannot be opened or is not a regular file (a
 * folder, a FIFO, a device: opening never blocks). *out_size receives the file size. */
df_status df_file_open_regular(const char *path, int *out_fd, uint64_t *out_size);

/* df_file_open_regular for a file that is mapped whole: DF_E_IO too when it is larger than
 * this process can map. */
df_status df_file_open_mappable(const char *path, int *out_fd, size_t *out_size);

/* Maps `size` bytes (> 0) of the open file `fd` read-only into *out; DF_E_IO naming `path`
 * when mmap fails (*out is left as it was). Unmap with munmap. */
df_status df_file_map(int fd, size_t size, const char *path, const uint8_t **out);

/* Drops the pages of bytes [begin, end) of a read-only file mapping of `size` bytes at
 * `base` (whole pages: begin rounded down, end up, no further than the mapping's last
 * page); touching them again reads them from the file. False when madvise refuses. */
bool df_map_release_pages(const uint8_t *base, size_t size, uint64_t begin, uint64_t end);

/* Reads the whole regular file into a df_malloc'd buffer with a NUL after the last byte.
 * DF_E_FORMAT when the file is larger than `max` bytes. */
df_status df_file_read_all(const char *path, size_t max, char **out, size_t *out_len);

/* Copies the file `from` to `to` (created or truncated). DF_E_IO when either cannot be
 * opened or a read or write fails. */
df_status df_file_copy(const char *from, const char *to);

/* Creates the folder `path` (mode 0755); an existing one is fine. DF_E_IO otherwise. */
df_status df_dir_make(const char *path);

/* Whether `path` names an existing folder / regular file (symbolic links followed). */
bool df_path_is_dir(const char *path);
bool df_path_is_file(const char *path);

/* "dir/name" in a df_malloc'd string (dir may be "" or end with '/'). */
df_status df_path_join(const char *dir, const char *name, char **out);

/* The folder part of `path` ("a/b/c.json" -> "a/b", "c.json" -> "."), df_malloc'd. */
df_status df_path_dirname(const char *path, char **out);

/*
 * Checks a relative path read from `source` (a shard name, a component name) before it is
 * joined to the folder of `source`: DF_E_FORMAT when it is empty, absolute, has a ".."
 * component, or (when `plain_name`) has any '/' at all. `what` names the value in the
 * message ("shard", "component").
 */
df_status df_path_check_inside(const char *rel, bool plain_name, const char *source,
                               const char *what);

/* Whether `s` ends with `suffix`. */
bool df_str_ends_with(const char *s, const char *suffix);

#endif
