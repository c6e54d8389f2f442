/* AVX2 + FMA + F16C paths of every weight kernel (see linear_common.h). Every row of x is a GEMV here (no tiled
 * GEMM), which is right for decode and correct but slow for prefill on such CPUs; the AVX-512 file has the tiled
 * GEMM. */
#include <immintrin.h>

#include "linear_common.h"

static inline size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

void ef_w4a16_avx2(const float *x, size_t m, size_t k, const uint8_t *packed, const uint16_t *sz, size_t npad,
                   size_t group, size_t n, size_t b0, size_t b1, float *y) {
    size_t groups = (k + group - 1) / group;
    const __m256i m4 = _mm256_set1_epi32(15);
    const __m256i hi_mask = _mm256_set1_epi32((int)0xFFFF0000u);
    for (size_t b = b0; b < b1; b++) {
        const uint8_t *blk = packed + b * k * 32;
        size_t cols = min_sz(n - b * 64, 64);
        for (size_t i = 0; i < m; i++) {
            const float *xr = x + i * k;
            float out[64] __attribute__((aligned(32))) = {0};
            for (size_t g = 0; g < groups; g++) {
                size_t k0 = g * group, k1 = min_sz(k0 + group, k);
                /* acc[q] covers columns 8q..8q+7 (low nibbles of bytes 8q..) and acc[4 + q] columns 32 + 8q.. */
                __m256 acc[8];
                for (int q = 0; q < 8; q++) acc[q] = _mm256_setzero_ps();
                float sx = 0.0f;
                for (size_t kk = k0; kk < k1; kk++) {
                    __m256 xb = _mm256_set1_ps(xr[kk]);
                    sx += xr[kk];
                    for (int q = 0; q < 4; q++) {
                        __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + kk * 32 + 8 * q)));
                        acc[q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, m4)), xb, acc[q]);
                        acc[4 + q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), xb, acc[4 + q]);
                    }
                }
                /* w = (q - 8) s + z, so sum x w = s sum x q + (z - 8 s) sum x. */
                const uint16_t *s = sz + (g * npad + b * 64) * 2;
                __m256 vsx = _mm256_set1_ps(sx);
                for (int q = 0; q < 8; q++) {
                    __m256i p = _mm256_loadu_si256((const __m256i *)(s + 16 * q));
                    __m256 sc = _mm256_castsi256_ps(_mm256_slli_epi32(p, 16));
                    __m256 ze = _mm256_castsi256_ps(_mm256_and_si256(p, hi_mask));
                    __m256 off = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), sc, ze);
                    __m256 o = _mm256_load_ps(out + 8 * q);
                    o = _mm256_fmadd_ps(sc, acc[q], o);
                    _mm256_store_ps(out + 8 * q, _mm256_fmadd_ps(off, vsx, o));
                }
            }
            for (size_t c = 0; c < cols; c++) y[i * n + b * 64 + c] = out[c];
        }
    }
}

/* 8 e4m3 codes (low 8 bytes) -> f32 times 2^-8, through fp16 and F16C (see e4m3x16_s8 in linear_avx512.c for why
 * not a direct f32 build: subnormal codes would cost microcode assists). */
static inline __m256 e4m3x8_s8(__m128i codes8) {
    __m128i h = _mm_cvtepi8_epi16(codes8);
    h = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16((short)0xBFFF));
    return _mm256_cvtph_ps(h);
}

void ef_fp8_avx2(const float *x, size_t m, size_t k, const uint8_t *w, const float *sinv, size_t n, size_t r0,
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
                __m256 a0 = _mm256_setzero_ps(), a1 = a0;
                size_t kk = k0;
                for (; kk + 16 <= k1; kk += 16) {
                    a0 = _mm256_fmadd_ps(e4m3x8_s8(_mm_loadl_epi64((const __m128i *)(wr + kk))), _mm256_loadu_ps(xr + kk), a0);
                    a1 = _mm256_fmadd_ps(e4m3x8_s8(_mm_loadl_epi64((const __m128i *)(wr + kk + 8))), _mm256_loadu_ps(xr + kk + 8), a1);
                }
                float acc = hsum8(_mm256_add_ps(a0, a1)) * 256.0f;
                for (; kk < k1; kk++) acc += xr[kk] * ef_e4m3_decode(wr[kk]);
                out += acc * s[blk];
            }
            y[i * n + r] = out;
        }
    }
}

void ef_bf16_avx2(const float *x, size_t m, size_t k, const uint16_t *w, size_t n, size_t r0, size_t r1, float *y) {
    for (size_t r = r0; r < r1; r++) {
        const uint16_t *wr = w + r * k;
        for (size_t i = 0; i < m; i++) {
            const float *xr = x + i * k;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0;
            size_t kk = 0;
            for (; kk + 16 <= k; kk += 16) {
                __m256 w0 = _mm256_castsi256_ps(
                    _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(wr + kk))), 16));
                __m256 w1 = _mm256_castsi256_ps(
                    _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(wr + kk + 8))), 16));
                a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr + kk), a0);
                a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + kk + 8), a1);
            }
            float acc = hsum8(_mm256_add_ps(a0, a1));
            for (; kk < k; kk++) acc += xr[kk] * ef_bf16_decode(wr[kk]);
            y[i * n + r] = acc;
        }
    }
}

/* W4A8 without VNNI: the four-row transpose of the AVX-512 path (ef_w4a8_quads, linear_common.h), then
 * maddubs (u8 codes x s8 activations -> i16 pair sums, at most 2 * 15 * 127, no saturation) and madd with ones
 * (-> i32), which is what vpdpbusd does in one instruction. */
void ef_w4a8_avx2(const int8_t *xq, const float *xs, const int32_t *xsum, size_t m, size_t k, const uint8_t *packed,
                  const uint16_t *sz, size_t npad, size_t group, size_t n, size_t b0, size_t b1, float *y) {
    size_t groups = (k + group - 1) / group;
    const __m256i ones = _mm256_set1_epi16(1);
    for (size_t b = b0; b < b1; b++) {
        const uint8_t *blk = packed + b * k * 32;
        size_t cols = min_sz(n - b * 64, 64);
        for (size_t i = 0; i < m; i++) {
            const int8_t *xr = xq + i * k;
            float out[64] __attribute__((aligned(32))) = {0};
            for (size_t g = 0; g < groups; g++) {
                size_t k0 = g * group, k1 = min_sz(k0 + group, k);
                __m256i acc[8];
                for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_si256();
                for (size_t kk = k0; kk < k1; kk += 4) {
                    /* A short final quad copies the rows that exist and pads with code 0 and x 0. */
                    uint8_t tail[128] = {0};
                    int8_t xt[4] = {0, 0, 0, 0};
                    size_t rows = min_sz(4, k1 - kk);
                    const uint8_t *src = blk + kk * 32;
                    if (rows < 4) {
                        memcpy(tail, src, rows * 32);
                        src = tail;
                    }
                    memcpy(xt, xr + kk, rows);
                    int32_t xw;
                    memcpy(&xw, xt, 4);
                    __m256i xb = _mm256_set1_epi32(xw);
                    __m256i quad[8];
                    ef_w4a8_quads(src, quad);
                    for (int j = 0; j < 8; j++)
                        acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(quad[j], xb), ones));
                }
                /* Back to column order, then (sum x q - 8 sum x) * scale. */
                __m256i ord[8];
                ef_w4a8_fix_order(acc, ord);
                __m256i corr = _mm256_set1_epi32(8 * xsum[i * groups + g]);
                const uint16_t *s = sz + (g * npad + b * 64) * 2;
                for (int q = 0; q < 8; q++) {
                    __m256i p = _mm256_loadu_si256((const __m256i *)(s + 16 * q));
                    __m256 sc = _mm256_castsi256_ps(_mm256_slli_epi32(p, 16));
                    __m256 af = _mm256_cvtepi32_ps(_mm256_sub_epi32(ord[q], corr));
                    _mm256_store_ps(out + 8 * q, _mm256_fmadd_ps(sc, af, _mm256_load_ps(out + 8 * q)));
                }
            }
            for (size_t c = 0; c < cols; c++) y[i * n + b * 64 + c] = out[c] * xs[i];
        }
    }
}

/* 8 e2m1 codes (low 4 bits of each 32-bit lane; higher bits ignored) -> f32: the magnitude from an 8-entry table
 * (permutevar8x32 reads the low 3 bits), the sign from bit 3. */
static inline __m256 e2m1x8(__m256i idx) {
    const __m256 lut = _mm256_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f);
    __m256 mag = _mm256_permutevar8x32_ps(lut, idx);
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(idx, _mm256_set1_epi32(8)), 28);
    return _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
}

void ef_nvfp4_avx2(const float *x, const float *xp, size_t m, size_t k, const uint8_t *w, const uint8_t *scales,
                   float global, size_t n, size_t r0, size_t r1, float *y) {
    (void)xp; /* only the AVX-512 path reads the permuted activations */
    size_t groups = k / EF_NVFP4_GROUP;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * (k / 2);
        const uint8_t *sr = scales + r * groups;
        for (size_t i = 0; i < m; i++) {
            const float *xr = x + i * k;
            __m256 tot = _mm256_setzero_ps();
            for (size_t g = 0; g < groups; g++) {
                /* Byte j holds elements 2j (low) and 2j+1 (high); unpacking the two decoded vectors gives elements
                 * {0-3, 8-11} and {4-7, 12-15}, so x is loaded in that order instead of being shuffled. */
                __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(wr + g * 8)));
                __m256 lo = e2m1x8(b), hi = e2m1x8(_mm256_srli_epi32(b, 4));
                __m256 wa = _mm256_unpacklo_ps(lo, hi), wb = _mm256_unpackhi_ps(lo, hi);
                const float *xg = xr + g * 16;
                __m256 xa = _mm256_loadu2_m128(xg + 8, xg), xb = _mm256_loadu2_m128(xg + 12, xg + 4);
                __m256 t = _mm256_fmadd_ps(wb, xb, _mm256_mul_ps(wa, xa));
                tot = _mm256_fmadd_ps(t, _mm256_set1_ps(ef_e4m3_decode(sr[g])), tot);
            }
            y[i * n + r] = hsum8(tot) * global;
        }
    }
}
