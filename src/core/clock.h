/* A monotonic clock for timings (step times, compile times, profiles). */
#ifndef DF_CORE_CLOCK_H
#define DF_CORE_CLOCK_H

/* Seconds since an arbitrary fixed point, monotonic. */
double df_now(void);

#endif
