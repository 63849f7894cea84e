/* Library version, for programs and for cache keys. */
#include <diffuse/status.h>

DF_API const char *df_version(void);

const char *df_version(void)
{
    return DF_VERSION;
}
