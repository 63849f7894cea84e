/* Workgroup reductions over WG invocations through shared memory. */
shared float red_buf[WG];

float wg_sum(float v)
{
    uint t = gl_LocalInvocationID.x;
    red_buf[t] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (t < s)
            red_buf[t] += red_buf[t + s];
        barrier();
    }
    float r = red_buf[0];
    barrier();
    return r;
}

float wg_max(float v)
{
    uint t = gl_LocalInvocationID.x;
    red_buf[t] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (t < s)
            red_buf[t] = max(red_buf[t], red_buf[t + s]);
        barrier();
    }
    float r = red_buf[0];
    barrier();
    return r;
}
