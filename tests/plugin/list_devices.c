/*
 * Lists every device the library finds, one name a line (`sim` included). Linked to the
 * shared library without a build RPATH, so that tests/cli/installed_plugins.sh runs it
 * against an installed libdiffuse.so (LD_LIBRARY_PATH) and checks that the plugins
 * installed beside it are found without DIFFUSE_BACKEND_DIR.
 */
#include <stdio.h>

#include <diffuse/diffuse.h>

int main(void)
{
    df_device_desc d[32];
    int n = df_device_list(d, 32, true);
    for (int i = 0; i < n && i < 32; i++)
        printf("%s\n", d[i].device);
    return n > 0 ? 0 : 1;
}
