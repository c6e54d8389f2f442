/* Shared declarations of the weight kernels (int4 W4A16/W4A8, FP8 block, NVFP4, bf16), one set per ISA.
 *
 * Conventions: x is row-major [m][k] f32 (the Rust side converts bf16 activations), y is row-major [m][n] and
 * y = x W^T. Every kernel computes a range of output columns for all m rows, so threads split the columns and
 * write disjoint parts of y. The Rust side (kernels/src/linear) checks every size before the call; these functions
 * trust their arguments. */
#ifndef EDGEFIT_LINEAR_COMMON_H
#define EDGEFIT_LINEAR_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Decodes e4m3fn without ever making an f32 subnormal: a subnormal code (exponent field 0) is its mantissa times
 * 2^-9, a normal one gets its exponent rebiased by adding 120 (= 127 - 7) to the f32 exponent field. Every finite
 * code is exact; the NaN codes 0x7F/0xFF decode as +-480, checkpoints never contain them. (Multiplying an f32
 * subnormal by 2^120 would be shorter, but x86 cores take a microcode assist on subnormal operands: 50x slower.) */
static inline float ef_e4m3_decode(uint8_t c) {
    uint32_t mag = c & 0x7Fu;
    float f;
    if (mag < 8) {
        f = (float)mag * 0x1p-9f;
    } else {
        uint32_t bits = (mag << 20) + (120u << 23);
        memcpy(&f, &bits, sizeof f);
    }
    return (c & 0x80) ? -f : f;
}

static inline float ef_bf16_decode(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#define EF_DECL(isa)                                                                                               \
    void ef_w4a16_##isa(const float *x, size_t m, size_t k, const uint8_t *packed, const uint16_t *sz,             \
                        size_t npad, size_t group, size_t n, size_t b0, size_t b1, float *y);                      \
    void ef_w4a8_##isa(const int8_t *xq, const float *xs, const int32_t *xsum, size_t m, size_t k,                 \
                       const uint8_t *packed, const uint16_t *sz, size_t npad, size_t group, size_t n, size_t b0,  \
                       size_t b1, float *y);                                                                       \
    void ef_fp8_##isa(const float *x, size_t m, size_t k, const uint8_t *w, const float *sinv, size_t n,           \
                      size_t r0, size_t r1, float *y);                                                             \
    void ef_nvfp4_##isa(const float *x, const float *xp, size_t m, size_t k, const uint8_t *w,                     \
                        const uint8_t *scales, float global, size_t n, size_t r0, size_t r1, float *y);            \
    void ef_bf16_##isa(const float *x, size_t m, size_t k, const uint16_t *w, size_t n, size_t r0, size_t r1,      \
                       float *y);

EF_DECL(scalar)
EF_DECL(avx2)
EF_DECL(avx512)

/* AVX-512 + VBMI variants (linear_avx512.c); same arguments and results as the AVX-512 kernels of the format. */
void ef_w4a8_avx512vbmi(const int8_t *xq, const float *xs, const int32_t *xsum, size_t m, size_t k,
                        const uint8_t *packed, const uint16_t *sz, size_t npad, size_t group, size_t n, size_t b0,
                        size_t b1, float *y);

/* W4A16 GEMV (one activation row) on integer dot products (vpermb + vpdpwssd, see linear_avx512.c): x as int16 per
 * group (xq [k rounded up to even]), the group scales xs [groups] (powers of two) and sums xsum [groups] of xq;
 * blocks b0..b1 of y[n]. ef_w4a16_xq_avx512 builds them from x[k]; 0 where x cannot be held that way. */
void ef_w4a16_avx512vbmi(const int16_t *xq, const float *xs, const int32_t *xsum, size_t k, const uint8_t *packed,
                         const uint16_t *sz, size_t npad, size_t group, size_t n, size_t b0, size_t b1, float *y);
int ef_w4a16_xq_avx512(const float *x, size_t k, size_t group, int16_t *xq, float *xs, int32_t *xsum);

/* Int4 prefill GEMM (m > 1) on integer dot products (int4_gemm_avx512.c): activations as int8 (vpdpbusd) or int16
 * (vpdpwssd) per row and weight group. xq is chunk-major, [ceil(k / KC)][m][256 bytes] with KC = 256 int8 or 128
 * int16 (EF_GEMM_KC8 / EF_GEMM_KC16), the pad zero; xs / xz are [m][groups] (s, s * sum X). Blocks b0..b1 of
 * y[m][n]. The encoders fill rows r0..r1 from x[m][k] and return 0 where x cannot be held that way. */
#define EF_GEMM_KC8 256
#define EF_GEMM_KC16 128
void ef_int4_gemm_a8_avx512vbmi(const int8_t *xq, const float *xs, const float *xz, size_t m, size_t k,
                                const uint8_t *packed, const uint16_t *sz, size_t npad, size_t group, size_t n,
                                size_t b0, size_t b1, float *y);
void ef_int4_gemm_a16_avx512vbmi(const int16_t *xq, const float *xs, const float *xz, size_t m, size_t k,
                                 const uint8_t *packed, const uint16_t *sz, size_t npad, size_t group, size_t n,
                                 size_t b0, size_t b1, float *y);
int ef_int4_gemm_xq8_avx512(const float *x, size_t m, size_t k, size_t group, size_t r0, size_t r1, int8_t *xq,
                            float *xs, float *xz);
int ef_int4_gemm_xq16_avx512(const float *x, size_t m, size_t k, size_t group, size_t r0, size_t r1, int16_t *xq,
                             float *xs, float *xz);

/* NVFP4 GEMV (one activation row) on integer dot products: x as three int8 limbs per 128-element chunk (xq, 384
 * bytes per chunk), the bias correction xnb (16 int32 per chunk) and the per-lane x scales xs (16 per chunk, see linear_avx512.c);
 * x itself (f32, natural order) only for the tail groups past the last full chunk. Rows r0..r1 of y[n]. */
void ef_nvfp4_avx512vbmi(const float *x, const int8_t *xq, const int32_t *xnb, const float *xs, size_t k,
                         const uint8_t *w, const uint8_t *scales, float global, size_t r0, size_t r1, float *y);
/* Builds xq, xnb, xs of ef_nvfp4_avx512vbmi from x[chunks * 128]; 0 where x cannot be held that way. */
int ef_nvfp4_xq_avx512vbmi(const float *x, size_t chunks, int8_t *xq, int32_t *xnb, float *xs);

#if defined(__AVX2__)
#include <immintrin.h>

/* The W4A8 transpose that the AVX2 and AVX-512 kernels share (the AVX2 one follows it with maddubs + madd, the
 * AVX-512 one with vpdpbusd). */

/* Four consecutive k-rows of a block become, per column, one dword of four codes (k, k+1, k+2, k+3), which is the
 * operand shape of vpdpbusd. The unpacks work inside 128-bit lanes, so the 8 outputs hold columns in the order
 * {0-3,16-19}, {4-7,20-23}, {8-11,24-27}, {12-15,28-31} and the same +32 for the high nibbles; ef_w4a8_fix_order
 * restores column order once per group. */
static inline void ef_w4a8_quads(const uint8_t *rows, __m256i quad[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i r0 = _mm256_loadu_si256((const __m256i *)rows), r1 = _mm256_loadu_si256((const __m256i *)(rows + 32));
    __m256i r2 = _mm256_loadu_si256((const __m256i *)(rows + 64)), r3 = _mm256_loadu_si256((const __m256i *)(rows + 96));
    __m256i l[4] = {_mm256_and_si256(r0, m4), _mm256_and_si256(r1, m4), _mm256_and_si256(r2, m4), _mm256_and_si256(r3, m4)};
    __m256i h[4] = {_mm256_and_si256(_mm256_srli_epi16(r0, 4), m4), _mm256_and_si256(_mm256_srli_epi16(r1, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(r2, 4), m4), _mm256_and_si256(_mm256_srli_epi16(r3, 4), m4)};
    for (int half = 0; half < 2; half++) {
        __m256i *v = half ? h : l;
        __m256i a = _mm256_unpacklo_epi8(v[0], v[1]), bb = _mm256_unpacklo_epi8(v[2], v[3]);
        __m256i c = _mm256_unpackhi_epi8(v[0], v[1]), d = _mm256_unpackhi_epi8(v[2], v[3]);
        quad[4 * half + 0] = _mm256_unpacklo_epi16(a, bb);
        quad[4 * half + 1] = _mm256_unpackhi_epi16(a, bb);
        quad[4 * half + 2] = _mm256_unpacklo_epi16(c, d);
        quad[4 * half + 3] = _mm256_unpackhi_epi16(c, d);
    }
}

/* acc in quad order -> 8 vectors of 8 consecutive columns (0-7, 8-15, ..., 56-63). */
static inline void ef_w4a8_fix_order(const __m256i acc[8], __m256i out[8]) {
    for (int half = 0; half < 2; half++) {
        const __m256i *a = acc + 4 * half;
        __m256i *o = out + 4 * half;
        o[0] = _mm256_permute2x128_si256(a[0], a[1], 0x20); /* cols 0-7   */
        o[1] = _mm256_permute2x128_si256(a[2], a[3], 0x20); /* cols 8-15  */
        o[2] = _mm256_permute2x128_si256(a[0], a[1], 0x31); /* cols 16-23 */
        o[3] = _mm256_permute2x128_si256(a[2], a[3], 0x31); /* cols 24-31 */
    }
}

#if defined(__AVX512F__)
/* Mask of the first cnt lanes of a 16-float vector (all of them from 16 up); the AVX-512 files share it. */
static inline __mmask16 ef_mask16(size_t cnt) { return cnt >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cnt) - 1u); }
#endif
#endif

/* FP8 scale blocks are 128 x 128; NVFP4 scales cover 16 elements. */
#define EF_FP8_BLOCK 128
#define EF_NVFP4_GROUP 16

#endif
