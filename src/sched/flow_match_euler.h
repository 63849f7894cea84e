/*
 * Internal side of the flow-match Euler scheduler (public API: <diffuse/scheduler.h>):
 * the pieces a device-side step needs, so that it uses exactly the host step's dt.
 */
#ifndef DF_SCHED_FLOW_MATCH_EULER_H
#define DF_SCHED_FLOW_MATCH_EULER_H

#include <diffuse/scheduler.h>

/* dt = float32(sigma_next - sigma) of the step about to run; DF_E_STATE when none is left. */
df_status df_scheduler_current_dt(const df_scheduler *s, float *out);

/* Moves to the next step without touching any data (after a device-side update made with
 * df_scheduler_current_dt). DF_E_STATE when no step is left. */
df_status df_scheduler_advance(df_scheduler *s);

#endif
