/* Portable reference-speed paths of the weight kernels (see linear_common.h). They follow the format definitions
 * directly and are the fallback on CPUs without AVX2; the accumulation order matches the vector paths (per group /
 * per scale block, then scaled), so the three paths agree to f32 rounding. */
#include "linear_common.h"

static const float E2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

void ef_w4a16_scalar(const float *x, size_t m, size_t k, const uint8_t *packed, const uint16_t *sz, size_t npad,
                     size_t group, size_t n, size_t b0, size_t b1, float *y) {
    size_t groups = (k + group - 1) / group;
    for (size_t b = b0; b < b1; b++) {
        const uint8_t *blk = packed + b * k * 32;
        size_t cols = min_sz(n - b * 64, 64);
        for (size_t i = 0; i < m; i++) {
            const float *xr = x + i * k;
            float out[64] = {0};
            for (size_t g = 0; g < groups; g++) {
                size_t k0 = g * group, k1 = min_sz(k0 + group, k);
                float acc[64] = {0};
                float sx = 0.0f;
                for (size_t kk = k0; kk < k1; kk++) {
                    float xv = xr[kk];
                    const uint8_t *row = blk + kk * 32;
                    sx += xv;
                    for (int d = 0; d < 32; d++) {
                        acc[d] += xv * (float)((int)(row[d] & 15) - 8);
                        acc[d + 32] += xv * (float)((int)(row[d] >> 4) - 8);
                    }
                }
                const uint16_t *s = sz + (g * npad + b * 64) * 2;
                for (int c = 0; c < 64; c++) out[c] += ef_bf16_decode(s[2 * c]) * acc[c] + ef_bf16_decode(s[2 * c + 1]) * sx;
            }
            for (size_t c = 0; c < cols; c++) y[i * n + b * 64 + c] = out[c];
        }
    }
}

void ef_w4a8_scalar(const int8_t *xq, const float *xs, const int32_t *xsum, size_t m, size_t k, const uint8_t *packed,
                    const uint16_t *sz, size_t npad, size_t group, size_t n, size_t b0, size_t b1, float *y) {
    (void)xsum; /* the scalar path subtracts the zero point per element */
    size_t groups = (k + group - 1) / group;
    for (size_t b = b0; b < b1; b++) {
        const uint8_t *blk = packed + b * k * 32;
        size_t cols = min_sz(n - b * 64, 64);
        for (size_t i = 0; i < m; i++) {
            const int8_t *xr = xq + i * k;
            float out[64] = {0};
            for (size_t g = 0; g < groups; g++) {
                size_t k0 = g * group, k1 = min_sz(k0 + group, k);
                int32_t acc[64] = {0};
                for (size_t kk = k0; kk < k1; kk++) {
                    int32_t xv = xr[kk];
                    const uint8_t *row = blk + kk * 32;
                    for (int d = 0; d < 32; d++) {
                        acc[d] += xv * ((int32_t)(row[d] & 15) - 8);
                        acc[d + 32] += xv * ((int32_t)(row[d] >> 4) - 8);
                    }
                }
                const uint16_t *s = sz + (g * npad + b * 64) * 2;
                for (int c = 0; c < 64; c++) out[c] += ef_bf16_decode(s[2 * c]) * (float)acc[c];
            }
            for (size_t c = 0; c < cols; c++) y[i * n + b * 64 + c] = out[c] * xs[i];
        }
    }
}

void ef_fp8_scalar(const float *x, size_t m, size_t k, const uint8_t *w, const float *sinv, size_t n, size_t r0,
                   size_t r1, float *y) {
    size_t kb = (k + EF_FP8_BLOCK - 1) / EF_FP8_BLOCK;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * k;
        const float *s = sinv + (r / EF_FP8_BLOCK) * kb;
        for (size_t i = 0; i < m; i++) {
            const float *xr = x + i * k;
            float out = 0.0f;
            for (size_t blk = 0; blk < kb; blk++) {
                size_t k0 = blk * EF_FP8_BLOCK, k1 = min_sz(k0 + EF_FP8_BLOCK, k);
                float acc = 0.0f;
                for (size_t kk = k0; kk < k1; kk++) acc += xr[kk] * ef_e4m3_decode(wr[kk]);
                out += acc * s[blk];
            }
            y[i * n + r] = out;
        }
    }
}

void ef_nvfp4_scalar(const float *x, const float *xp, size_t m, size_t k, const uint8_t *w, const uint8_t *scales,
                     float global, size_t n, size_t r0, size_t r1, float *y) {
    (void)xp; /* only the AVX-512 path reads the permuted activations */
    size_t groups = k / EF_NVFP4_GROUP;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * (k / 2);
        const uint8_t *sr = scales + r * groups;
        for (size_t i = 0; i < m; i++) {
            const float *xr = x + i * k;
            float out = 0.0f;
            for (size_t g = 0; g < groups; g++) {
                float acc = 0.0f;
                for (size_t j = 0; j < EF_NVFP4_GROUP / 2; j++) {
                    uint8_t byte = wr[g * 8 + j];
                    acc += xr[g * 16 + 2 * j] * E2M1[byte & 15] + xr[g * 16 + 2 * j + 1] * E2M1[byte >> 4];
                }
                out += acc * ef_e4m3_decode(sr[g]);
            }
            y[i * n + r] = out * global;
        }
    }
}

void ef_bf16_scalar(const float *x, size_t m, size_t k, const uint16_t *w, size_t n, size_t r0, size_t r1, float *y) {
    for (size_t r = r0; r < r1; r++) {
        const uint16_t *wr = w + r * k;
        for (size_t i = 0; i < m; i++) {
            const float *xr = x + i * k;
            float acc = 0.0f;
            for (size_t kk = 0; kk < k; kk++) acc += xr[kk] * ef_bf16_decode(wr[kk]);
            y[i * n + r] = acc;
        }
    }
}
