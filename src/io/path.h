/*
 * Files and paths for the io layer: opening only regular files, reading a whole file, and
 * joining a folder with a name read from a file without letting the name escape the folder.
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

/* Reads the whole regular file into a df_malloc'd buffer with a NUL after the last byte.
 * DF_E_FORMAT when the file is larger than `max` bytes. */
df_status df_file_read_all(const char *path, size_t max, char **out, size_t *out_len);

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
