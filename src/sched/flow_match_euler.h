/*
 * Internal side of the flow-match Euler scheduler (public API: <diffuse/scheduler.h>):
 * the pieces a device-side step needs, so that it uses exactly the host step's dt.
 */
#ifndef DF_SCHED_FLOW_MATCH_EULER_H
#define DF_SCHED_FLOW_MATCH_EULER_H

#include <diffuse/runtime.h>
#include <diffuse/scheduler.h>

/* dt = float32(sigma_next - sigma) of the step about to run; DF_E_STATE when none is left. */
df_status df_scheduler_current_dt(const df_scheduler *s, float *out);

/* Moves to the next step without touching any data (after a device-side update made with
 * df_scheduler_current_dt). DF_E_STATE when no step is left. */
df_status df_scheduler_advance(df_scheduler *s);

/*
 * The step on the device: *sample = *sample + float32(dt * model_output), each op rounding
 * to float32 as df_scheduler_step does on the host, so the latents are the same bits (the
 * product is a scale by dt with offset -0.0, which adds nothing, not even to a zero's
 * sign). model_output may be bf16 (read as float32); the new sample is a float32 tensor of
 * the current scope. Advances the schedule. DF_E_STATE when no step is left, DF_E_ARG for
 * tensors whose shapes differ; otherwise the context's error.
 */
df_status df_scheduler_step_tensor(df_scheduler *s, df_ctx *ctx, df_tensor *model_output,
                                   df_tensor **sample);

/* Whether the denoising loops step on the host (DIFFUSE_HOST_STEP=1: the reference path,
 * read back and uploaded every step) instead of on the device. */
bool df_scheduler_host_step(void);

#endif
