/* Placeholders until the kernels are written; each reports the op as unsupported. */
#include "backend/cpu/cpu_kernels.h"
#include "core/status.h"

#define STUB(name)                                                                         \
    DF_CPU_KERNEL(name)                                                                    \
    {                                                                                      \
        return df_errorf(DF_E_UNSUPPORTED, "cpu: op '%s' has no kernel yet", df_op_name(n->op)); \
    }
STUB(linear)
STUB(matmul)
STUB(attention)
STUB(conv2d)
