/*
 * sin and cos of an angle held as an unevaluated sum of two f32 (hi + lo, about 48 bits),
 * nearly correctly rounded to f32: what the CPU gets from libm's sinf / cosf of an f32
 * angle, or from sin / cos in double rounded to f32.
 *
 * The GLSL built-ins are not used: their precision is the driver's (Vulkan asks for an
 * absolute error of 2^-11 in [-pi, pi] and nothing outside), and the angles here reach
 * thousands of radians. Only correctly rounded f32 add, sub and mul are used (Vulkan's
 * rule for them), every value `precise` so that no compiler contracts or reassociates
 * them; products are exact by Dekker's split, so no fused multiply-add is assumed.
 *
 *  - reduction: j = round(angle * 2/pi); r = angle - j * pi/2 with pi/2 in three f32
 *    (72 bits), each product exact and the sum carried in two f32: the error is about
 *    |angle| * 2^-48 from the angle itself, 2e-12 at 500 radians;
 *  - |r| <= pi/4: sin r = r + r^3 (-1/6 + r^2/120 - ...) and cos r = 1 - r^2/2 + r^4/24
 *    - ... up to r^13 and r^12 (the next terms are below 2e-14), the leading terms (r and
 *    1 - r^2/2) in two f32 and the rest in f32, which is 1/6 of the result at most;
 *  - the quadrant j mod 4 picks and signs them.
 */

/* a * b = hi + lo exactly (Dekker: a and b split into 12-bit halves). */
void dd_mul(float a, float b, out precise float hi, out precise float lo)
{
    precise float ta = 4097.0 * a, tb = 4097.0 * b;
    precise float ah = ta - (ta - a), bh = tb - (tb - b);
    precise float al = a - ah, bl = b - bh;
    hi = a * b;
    lo = ((ah * bh - hi) + ah * bl + al * bh) + al * bl;
}

/* a + b = hi + lo exactly (Knuth's two-sum: no order of magnitudes assumed). */
void dd_add(float a, float b, out precise float hi, out precise float lo)
{
    hi = a + b;
    precise float bb = hi - a;
    lo = (a - (hi - bb)) + (b - bb);
}

/* sin and cos of hi + lo. */
void sincos_dd(float hi, float lo, out float s_out, out float c_out)
{
    const float HALF_PI_1 = 1.5707963705062866;
    const float HALF_PI_2 = -4.371138828673793e-08;
    const float HALF_PI_3 = -1.7151245100058819e-15;
    precise float j = roundEven(hi * 0.6366197466850281);
    precise float p1, e1, p2, e2, s, t, s2, t2;
    dd_mul(j, HALF_PI_1, p1, e1);
    dd_add(hi, -p1, s, t);
    t = t + (lo - e1);
    dd_mul(j, HALF_PI_2, p2, e2);
    dd_add(s, -p2, s2, t2);
    t = (t + t2) - e2 - j * HALF_PI_3;
    precise float rh = s2 + t, rl = t - (rh - s2); /* |s2| >= |t| */
    precise float z = rh * rh;
    /* sin r = rh + (rl + rh^3 P(z) - rh^2 rl / 2) */
    precise float ps = -0.1666666716337204 + z * (0.008333333767950535 +
                       z * (-0.00019841270113829523 + z * (2.7557318844628753e-06 +
                       z * (-2.505210794367940e-08 + z * 1.6059044372074283e-10))));
    precise float sn = rh + (rl + (rh * z * ps - 0.5 * z * rl));
    /* cos r = 1 - w + z^2 Q(z), w = r^2 / 2 in two f32 */
    precise float wh, wl, ch, cl;
    dd_mul(rh, rh, wh, wl);
    wh = 0.5 * wh;
    wl = 0.5 * wl + rh * rl;
    dd_add(1.0, -wh, ch, cl);
    precise float pc = 0.0416666679084301 + z * (-0.0013888889225199819 +
                       z * (2.4801587642286904e-05 + z * (-2.755731998149713e-07 +
                       z * (2.0876755879584152e-09 + z * -1.147074536050896e-11))));
    precise float cs = ch + ((cl - wl) + z * z * pc);
    int q = int(j) & 3;
    float sv = (q & 1) != 0 ? cs : sn, cv = (q & 1) != 0 ? sn : cs;
    s_out = (q & 2) != 0 ? -sv : sv;
    c_out = (q == 1 || q == 2) ? -cv : cv;
}
