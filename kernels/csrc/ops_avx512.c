/* Small ops, AVX-512 intrinsics: RMSNorm with a 16-lane sum of squares, SiLU and GELU(erf) with the vector exp /
 * erfc of seq_common.h (libm's expf / erff do not vectorise), masked tails for any width. */
#define SEQ_SUFFIX _avx512
#define SEQ_TAG 2
#include "seq_common.h"

int ops_rmsnorm_avx512(const float *x, const float *w, int64_t dim, int one_plus, float eps, float *out, int64_t r0,
                       int64_t r1) {
    const __m512 add = _mm512_set1_ps(one_plus ? 1.0f : 0.0f);
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * dim;
        float *o = out + r * dim;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0;
        int64_t i = 0;
        for (; i + 32 <= dim; i += 32) {
            const __m512 v0 = _mm512_loadu_ps(xr + i), v1 = _mm512_loadu_ps(xr + i + 16);
            a0 = _mm512_fmadd_ps(v0, v0, a0);
            a1 = _mm512_fmadd_ps(v1, v1, a1);
        }
        for (; i < dim; i += 16) {
            const __m512 v = _mm512_maskz_loadu_ps(seq_tail_mask(dim - i), xr + i);
            a0 = _mm512_fmadd_ps(v, v, a0);
        }
        const __m512 s = _mm512_set1_ps(1.0f / sqrtf(seq_hsum512(_mm512_add_ps(a0, a1)) / (float)dim + eps));
        for (i = 0; i < dim; i += 16) {
            const __mmask16 m = seq_tail_mask(dim - i);
            const __m512 wv = _mm512_add_ps(_mm512_maskz_loadu_ps(m, w + i), add);
            _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), s), wv));
        }
    }
    return SEQ_TAG;
}

int ops_glu_avx512(const float *gate_up, int64_t inter, int gelu, float *out, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const float *g = gate_up + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        for (int64_t i = 0; i < inter; i += 16) {
            const __mmask16 m = seq_tail_mask(inter - i);
            const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
            const __m512 a = gelu ? seq_gelu512(gv) : seq_silu512(gv);
            _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, u + i)));
        }
    }
    return SEQ_TAG;
}

/* Compute-roof probe for the benchmarks: 12 independent FMA chains of 16 lanes, enough to cover the FMA latency
 * (4 cycles) on two FMA ports; writes the FLOPs done to *flops and a checksum to *sink. */
int ops_fma_probe_avx512(int64_t iters, float *sink, int64_t *flops) {
    __m512 acc[12];
    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_ps((float)i * 1e-3f);
    const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < 12; i++) acc[i] = _mm512_fmadd_ps(acc[i], m, a);
    __m512 s = acc[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, acc[i]);
    *sink = seq_hsum512(s);
    *flops = iters * 12 * 16 * 2;
    return SEQ_TAG;
}
