/* Small ops (RMSNorm, gated activations), generic C (see seq_common.h for how this file is compiled). */
#include "seq_common.h"

/* RMSNorm of rows [r0, r1) of x ([rows, dim]): x * rsqrt(mean(x^2) + eps) * (w or 1 + w). */
int SEQ_FN(ops_rmsnorm)(const float *x, const float *w, int64_t dim, int one_plus, float eps, float *out, int64_t r0,
                        int64_t r1) {
    const float add = one_plus ? 1.0f : 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * dim;
        float *o = out + r * dim;
        float ss = 0.0f;
        for (int64_t i = 0; i < dim; i++) ss += xr[i] * xr[i];
        const float s = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int64_t i = 0; i < dim; i++) o[i] = xr[i] * s * (w[i] + add);
    }
    return SEQ_TAG;
}

#ifndef OPS_CUSTOM_GLU
/* act(gate) * up over rows [r0, r1) of gate_up ([rows, 2*inter], gate first); act = SiLU or GELU(erf). */
int SEQ_FN(ops_glu)(const float *gate_up, int64_t inter, int gelu, float *out, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const float *g = gate_up + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        if (gelu)
            for (int64_t i = 0; i < inter; i++) o[i] = 0.5f * g[i] * (1.0f + erff(g[i] * 0.70710678f)) * u[i];
        else
            for (int64_t i = 0; i < inter; i++) o[i] = seq_silu(g[i]) * u[i];
    }
    return SEQ_TAG;
}
#endif

/* Compute-roof probe for the benchmarks: `iters` rounds of 64 independent multiply-adds (the compiler vectorises
 * them at the translation unit's width); writes the FLOPs done to *flops and a checksum to *sink. */
int SEQ_FN(ops_fma_probe)(int64_t iters, float *sink, int64_t *flops) {
    float acc[64];
    for (int i = 0; i < 64; i++) acc[i] = (float)i * 1e-3f;
    const float m = 0.999999f, a = 1e-7f;
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < 64; i++) acc[i] = acc[i] * m + a;
    float s = 0.0f;
    for (int i = 0; i < 64; i++) s += acc[i];
    *sink = s;
    *flops = iters * 64 * 2;
    return SEQ_TAG;
}
