/* Placeholders until the kernels are written; each reports the op as unsupported. */
#include "backend/cpu/cpu_kernels.h"
#include "core/status.h"

#define STUB(name)                                                                         \
    DF_CPU_KERNEL(name)                                                                    \
    {                                                                                      \
        return df_errorf(DF_E_UNSUPPORTED, "cpu: op '%s' has no kernel yet", df_op_name(n->op)); \
    }
STUB(softmax)
STUB(layer_norm)
STUB(rms_norm)
STUB(group_norm)
STUB(timestep_embed)
STUB(rope_table)
STUB(rope)
STUB(upsample2x)
STUB(concat)
STUB(gather)
