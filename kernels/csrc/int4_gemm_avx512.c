/* Int4 prefill GEMM on integer dot products (AVX-512 VNNI + VBMI): y[m][n] = x W^T for m > 1, W in the chunked
 * int4 pack ([Npad/64][K][32], scales and zeros [groups][Npad][2] bf16; see kernels/src/linear/int4.rs).
 *
 * The activations are integers per row and weight group (built once per call by ef_int4_gemm_xq8 / _xq16 below):
 * x[r][k] ~ X[r][k] * s[r][g]. A weight is (c - 8) * scale + zero = c * scale + zp with zp = zero - 8 * scale, so
 * one group's contribution to y[r][col] is
 *     s[r][g] * scale[g][col] * sum_k X c  +  zp[g][col] * (s[r][g] * sum_k X),
 * an integer dot product of the unsigned codes with X, rescaled once per group in f32. The code is the unsigned
 * operand, so no zero point enters the integer sums.
 *
 * Two activation widths share the loop nest (`wide`):
 *  - int8 (wide = 0): X = round(x / s), s = max|x_g| / 127 per row and group (llama.cpp's Q8_0 class of
 *    activation precision, its block being the weight group here). vpdpbusd takes four k of 16 columns per
 *    instruction: 64 multiply-adds.
 *  - int16 (wide = 1): the W4A16 GEMV's encoding (ef_w4a16_xq_avx512: s a power of two at or above
 *    max|x_g| / 32767, bf16 activations exactly unless a group spans more than 2^7). vpdpwssd takes two k: 32.
 *
 * Loop nest, per thread (a range of 64-column blocks): for each block and each chunk of KC k-rows, the chunk's
 * codes are unpacked once into an L1 panel of whole dot-product operands (int8: [KC/4][64 cols][4 k] bytes, 16 KiB;
 * int16: [KC/2][64][2] words, 32 KiB), plus the chunk's scales and zp as f32; then every row tile of MR rows
 * walks the panel, 32 columns at a time: 2 x MR integer accumulators for one group, 2 x MR f32 results for the
 * chunk (loaded from y after the first chunk), rescaled at every group end. MR = 6: 12 + 12 accumulators, 2 weight
 * registers, one activation broadcast: 27 of the 32 zmm registers. Each unpacked weight is reused by every row
 * of the call, so the unpack (2 loads, 2 byte permutes, 6 logic ops per 128 codes) is negligible at m >= 16.
 *
 * Integer sums are exact: per group and lane, |sum X c| <= 128 * 127 * 15 < 2^18 (int8) and
 * 128 * 32767 * 15 < 2^26 (int16). The rescale is f32 (cvt, one multiply, two FMAs per accumulator per group). */
#include <immintrin.h>

#include "linear_common.h"

#define GEMM_MR 6
/* k-rows per chunk: the panel stays in L1 while every row tile walks it (int8 16 KiB, int16 32 KiB). A multiple
 * of every group (32, 64, 128). */
#define GEMM_KC8 EF_GEMM_KC8
#define GEMM_KC16 EF_GEMM_KC16
#define GEMM_GROUPS_MAX (GEMM_KC8 / 32)

/* acc += dot(w, x) in place. GCC 12 compiles the _mm512_dpbusd_epi32 / _mm512_dpwssd_epi32 intrinsics in this
 * loop with two register copies per instruction (it does not tie the accumulator to the destination): 44
 * instructions per 12 dot products, which bound the tile at ~180 GMAC/s per core; inline asm keeps them in place. */
#define DPBUSD(acc, w, x) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x))
#define DPWSSD(acc, w, x) __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x))

static inline size_t gmin(size_t a, size_t b) { return a < b ? a : b; }

/* Unpacks k-rows k0..k0+kc of block `blk` (rows past k read as code 0; their activations are 0) into the panel.
 * int8: per 4 rows, zmm q holds columns 16q..16q+15, each dword the codes of rows k..k+3.
 * int16: per 2 rows, zmm q holds columns 16q..16q+15, each dword the codes of rows k, k+1 as two words. */
__attribute__((target("avx512vbmi"))) static void unpack_panel(const uint8_t *blk, size_t k, size_t k0, size_t kc,
                                                               int wide, __m512i *panel) {
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    if (!wide) {
        /* output byte 4c + j <- table byte 32 j + c (rows k+j, column c; the table is 4 rows = 128 bytes) */
        const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i idx0 = _mm512_add_epi32(_mm512_mullo_epi32(iota, _mm512_set1_epi32(0x01010101)),
                                              _mm512_set1_epi32(0x60402000));
        const __m512i idx1 = _mm512_add_epi32(idx0, _mm512_set1_epi32(0x10101010));
        for (size_t kk = 0; kk < kc; kk += 4) {
            size_t r = k0 + kk, left = r < k ? k - r : 0; /* rows of this quad inside the matrix */
            const uint8_t *src = blk + r * 32;
            __mmask64 m0 = left >= 2 ? ~(__mmask64)0 : left == 1 ? (__mmask64)0xFFFFFFFFu : 0;
            __mmask64 m1 = left >= 4 ? ~(__mmask64)0 : left == 3 ? (__mmask64)0xFFFFFFFFu : 0;
            __m512i a = _mm512_maskz_loadu_epi8(m0, src), b = _mm512_maskz_loadu_epi8(m1, src + 64);
            __m512i p0 = _mm512_permutex2var_epi8(a, idx0, b), p1 = _mm512_permutex2var_epi8(a, idx1, b);
            __m512i *o = panel + (kk / 4) * 4;
            o[0] = _mm512_and_si512(p0, lo4);
            o[1] = _mm512_and_si512(p1, lo4);
            o[2] = _mm512_and_si512(_mm512_srli_epi16(p0, 4), lo4);
            o[3] = _mm512_and_si512(_mm512_srli_epi16(p1, 4), lo4);
        }
    } else {
        /* output dword d <- (row k byte c0 + d, 0, row k+1 byte c0 + d, 0): the word is lo + 16 hi */
        const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i idx0 = _mm512_add_epi32(_mm512_or_si512(iota, _mm512_slli_epi32(iota, 16)),
                                              _mm512_set1_epi32(0x00200000));
        const __m512i idx1 = _mm512_add_epi32(idx0, _mm512_set1_epi32(0x00100010));
        const __mmask64 mk = 0x5555555555555555ull;
        const __m512i lo4w = _mm512_set1_epi16(0x0F);
        for (size_t kk = 0; kk < kc; kk += 2) {
            size_t r = k0 + kk, left = r < k ? k - r : 0;
            __mmask64 ml = left >= 2 ? ~(__mmask64)0 : left == 1 ? (__mmask64)0xFFFFFFFFu : 0;
            __m512i v = _mm512_maskz_loadu_epi8(ml, blk + r * 32);
            __m512i p0 = _mm512_maskz_permutexvar_epi8(mk, idx0, v), p1 = _mm512_maskz_permutexvar_epi8(mk, idx1, v);
            __m512i *o = panel + (kk / 2) * 4;
            o[0] = _mm512_and_si512(p0, lo4w);
            o[1] = _mm512_and_si512(p1, lo4w);
            o[2] = _mm512_srli_epi16(p0, 4);
            o[3] = _mm512_srli_epi16(p1, 4);
        }
    }
    (void)lo4;
}

/* One row tile (mr rows) against half a block's panel (32 columns: panel vectors h and h + 1 of each step) for
 * the chunk's groups. xq points at the tile's first row in the chunk's encoded activations (row stride
 * xstride = 256 bytes); xs / xz are the tile's
 * first row's per-group scale s and s * sum X at the chunk's first group (row stride groups). */
static inline __attribute__((always_inline)) void
tile(const __m512i *panel, int h, size_t steps_per_group, size_t chunk_groups, size_t last_steps, int wide,
     const uint8_t *xq, size_t xstride, const float *xs, const float *xz, size_t groups, const float *sc,
     const float *zp, float *y, size_t n, size_t c0, size_t cols, int first, const int mr) {
    __m512 res[GEMM_MR][2];
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < 2; j++) {
            size_t cj = cols > (size_t)(16 * j) ? cols - 16 * j : 0;
            res[r][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(ef_mask16(cj), y + r * n + c0 + 16 * j);
        }
    const size_t kstep = 4; /* bytes of activations per dot-product step: 4 int8 or 2 int16 */
    const __m512i *w = panel + h;
    const uint8_t *xp = xq;
    for (size_t gl = 0; gl < chunk_groups; gl++) {
        __m512i acc[GEMM_MR][2];
        for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
        size_t steps = gl + 1 == chunk_groups ? last_steps : steps_per_group;
        for (size_t s = 0; s < steps; s++) {
            __m512i w0 = _mm512_load_si512(w), w1 = _mm512_load_si512(w + 1);
            w += 4;
            for (int r = 0; r < mr; r++) {
                int32_t xv;
                memcpy(&xv, xp + r * xstride, 4);
                __m512i xb = _mm512_set1_epi32(xv);
                if (wide) {
                    DPWSSD(acc[r][0], w0, xb);
                    DPWSSD(acc[r][1], w1, xb);
                } else {
                    DPBUSD(acc[r][0], w0, xb);
                    DPBUSD(acc[r][1], w1, xb);
                }
            }
            xp += kstep;
        }
        if (steps < steps_per_group) {
            /* the matrix's short last group: skip the rest of its (never-unpacked) panel and activations */
            w += 4 * (steps_per_group - steps);
            xp += kstep * (steps_per_group - steps);
        }
        __m512 s0 = _mm512_load_ps(sc + gl * 64), s1 = _mm512_load_ps(sc + gl * 64 + 16);
        __m512 z0 = _mm512_load_ps(zp + gl * 64), z1 = _mm512_load_ps(zp + gl * 64 + 16);
        for (int r = 0; r < mr; r++) {
            __m512 vs = _mm512_set1_ps(xs[r * groups + gl]), vz = _mm512_set1_ps(xz[r * groups + gl]);
            res[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][0]), _mm512_mul_ps(s0, vs), res[r][0]);
            res[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][1]), _mm512_mul_ps(s1, vs), res[r][1]);
            res[r][0] = _mm512_fmadd_ps(z0, vz, res[r][0]);
            res[r][1] = _mm512_fmadd_ps(z1, vz, res[r][1]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < 2; j++) {
            size_t cj = cols > (size_t)(16 * j) ? cols - 16 * j : 0;
            _mm512_mask_storeu_ps(y + r * n + c0 + 16 * j, ef_mask16(cj), res[r][j]);
        }
}

/* The loop nest for one width. xq: chunk-major [ceil(k / KC)][m][256 bytes] (see the encoders below), xs, xz:
 * [m][groups]. Blocks b0..b1 of y[m][n]. */
__attribute__((target("avx512vbmi"))) static inline __attribute__((always_inline)) void
gemm(const uint8_t *xq, const float *xs, const float *xz, size_t m, size_t k, const uint8_t *packed,
     const uint16_t *sz, size_t npad, size_t group, size_t n, size_t b0, size_t b1, float *y, const int wide) {
    static _Thread_local __m512i panel[GEMM_KC8 / 4 * 4]; /* int8: KC8/4 steps x 4; int16: KC16/2 steps x 4 */
    static _Thread_local float sc[GEMM_GROUPS_MAX * 64] __attribute__((aligned(64)));
    static _Thread_local float zp[GEMM_GROUPS_MAX * 64] __attribute__((aligned(64)));
    const size_t kc_max = wide ? GEMM_KC16 : GEMM_KC8, per = wide ? 2 : 4;
    const size_t groups = (k + group - 1) / group, spg = group / per;
    for (size_t b = b0; b < b1; b++) {
        const uint8_t *blk = packed + b * k * 32;
        size_t cols = gmin(n - b * 64, 64);
        for (size_t k0 = 0; k0 < k; k0 += kc_max) {
            size_t kc = gmin(kc_max, k - k0);
            size_t g0 = k0 / group, cg = (kc + group - 1) / group;
            /* steps of the chunk's last group: whole unless it is the matrix's short last group */
            size_t last_len = kc - (cg - 1) * group, last_steps = (last_len + per - 1) / per;
            unpack_panel(blk, k, k0, cg * group, wide, panel);
            for (size_t gl = 0; gl < cg; gl++) {
                const uint16_t *s = sz + ((g0 + gl) * npad + b * 64) * 2;
                for (int q = 0; q < 4; q++) {
                    __m512i v = _mm512_loadu_si512((const void *)(s + 32 * q));
                    __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                    __m512 zero = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
                    _mm512_store_ps(sc + gl * 64 + 16 * q, scale);
                    _mm512_store_ps(zp + gl * 64 + 16 * q, _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), scale, zero));
                }
            }
            int first = k0 == 0;
            const uint8_t *xk = xq + (k0 / kc_max) * m * 256;
            for (int h = 0; h < 2; h++) {
                size_t c0 = b * 64 + 32 * (size_t)h;
                if (32 * (size_t)h >= cols) break;
                size_t hc = gmin(cols - 32 * (size_t)h, 32);
                size_t i = 0;
                for (; i + GEMM_MR <= m; i += GEMM_MR)
                    tile(panel, 2 * h, spg, cg, last_steps, wide, xk + i * 256, 256, xs + i * groups + g0,
                         xz + i * groups + g0, groups, sc + 32 * h, zp + 32 * h, y + i * n, n, c0, hc, first,
                         GEMM_MR);
                switch (m - i) {
#define REM(R)                                                                                                     \
    case R:                                                                                                        \
        tile(panel, 2 * h, spg, cg, last_steps, wide, xk + i * 256, 256, xs + i * groups + g0,             \
             xz + i * groups + g0, groups, sc + 32 * h, zp + 32 * h, y + i * n, n, c0, hc, first, R);              \
        break;
                    REM(1)
                    REM(2)
                    REM(3)
                    REM(4)
                    REM(5)
#undef REM
                default:
                    break;
                }
            }
        }
    }
}

__attribute__((target("avx512vbmi"))) void ef_int4_gemm_a8_avx512vbmi(const int8_t *xq,
                                                                      const float *xs, const float *xz, size_t m,
                                                                      size_t k, const uint8_t *packed,
                                                                      const uint16_t *sz, size_t npad, size_t group,
                                                                      size_t n, size_t b0, size_t b1, float *y) {
    gemm((const uint8_t *)xq, xs, xz, m, k, packed, sz, npad, group, n, b0, b1, y, 0);
}

__attribute__((target("avx512vbmi"))) void ef_int4_gemm_a16_avx512vbmi(const int16_t *xq,
                                                                       const float *xs, const float *xz, size_t m,
                                                                       size_t k, const uint8_t *packed,
                                                                       const uint16_t *sz, size_t npad, size_t group,
                                                                       size_t n, size_t b0, size_t b1, float *y) {
    gemm((const uint8_t *)xq, xs, xz, m, k, packed, sz, npad, group, n, b0, b1, y, 1);
}

/* Activation encoders. Layout of xq: chunk-major, [ceil(k / KC)][m][256 bytes] (KC = 256 int8 or 128 int16 per
 * row and chunk, the pad past k zero), so one row tile's activations for a chunk are one contiguous run and the
 * tiles of a chunk follow each other: the hardware prefetcher streams them (a row-major xq made every tile pass
 * wait on six short row streams from L3 once m * k outgrew L2). xs, xz: [m][groups] (s and s * sum X).
 * Each encodes rows r0..r1 of x[m][k], so threads can split the rows. */

/* int8: per row and group, s = max|x| / 127 (0 for an all-zero group), X = round-to-nearest-even(x / s) in
 * -127..127. Returns 0 (the caller runs the f32 kernel) where a value is not finite; 1 otherwise. */
int ef_int4_gemm_xq8_avx512(const float *x, size_t m, size_t k, size_t group, size_t r0, size_t r1, int8_t *xq,
                            float *xs, float *xz) {
    size_t groups = (k + group - 1) / group, chunks = (k + GEMM_KC8 - 1) / GEMM_KC8;
    for (size_t r = r0; r < r1; r++) {
        const float *xr = x + r * k;
        /* zero the last chunk's pad first; the groups below overwrite its live part */
        memset(xq + ((chunks - 1) * m + r) * 256, 0, 256);
        for (size_t g = 0; g < groups; g++) {
            size_t k0 = g * group, k1 = gmin(k0 + group, k);
            int8_t *dst = xq + ((k0 / GEMM_KC8) * m + r) * 256 + k0 % GEMM_KC8;
            __m512 amax = _mm512_setzero_ps();
            for (size_t kk = k0; kk < k1; kk += 16) {
                __mmask16 mk = ef_mask16(k1 - kk);
                __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(mk, xr + kk));
                if (_mm512_mask_cmp_ps_mask(mk, a, _mm512_set1_ps(3.4028234663852886e38f), _CMP_LE_OQ) != mk)
                    return 0;
                amax = _mm512_max_ps(amax, a);
            }
            float mx = _mm512_reduce_max_ps(amax);
            float s = mx / 127.0f, inv = mx > 0.0f ? 127.0f / mx : 0.0f;
            __m512i sum = _mm512_setzero_si512();
            const __m512 vinv = _mm512_set1_ps(inv);
            for (size_t kk = k0; kk < k1; kk += 16) {
                __mmask16 mk = ef_mask16(k1 - kk);
                __m512i X = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, xr + kk), vinv),
                                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                X = _mm512_max_epi32(_mm512_min_epi32(X, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
                _mm_mask_storeu_epi8(dst + (kk - k0), mk, _mm512_cvtepi32_epi8(X));
                sum = _mm512_add_epi32(sum, _mm512_maskz_mov_epi32(mk, X));
            }
            xs[r * groups + g] = s;
            xz[r * groups + g] = s * (float)_mm512_reduce_add_epi32(sum);
        }
    }
    return 1;
}

/* int16: the W4A16 GEMV's encoding (ef_w4a16_xq_avx512) group by group. Returns 0 where a group cannot be held
 * that way (the caller runs the f32 kernel); 1 otherwise. */
int ef_int4_gemm_xq16_avx512(const float *x, size_t m, size_t k, size_t group, size_t r0, size_t r1, int16_t *xq,
                             float *xs, float *xz) {
    size_t groups = (k + group - 1) / group, chunks = (k + GEMM_KC16 - 1) / GEMM_KC16;
    for (size_t r = r0; r < r1; r++) {
        memset(xq + ((chunks - 1) * m + r) * 128, 0, 256);
        for (size_t g = 0; g < groups; g++) {
            size_t k0 = g * group, len = gmin(group, k - k0);
            /* a short last group of odd length gets one zero past its end, inside the chunk's pad */
            int16_t *dst = xq + ((k0 / GEMM_KC16) * m + r) * 128 + k0 % GEMM_KC16;
            int32_t sum;
            if (!ef_w4a16_xq_avx512(x + r * k + k0, len, len, dst, xs + r * groups + g, &sum)) return 0;
            xz[r * groups + g] = xs[r * groups + g] * (float)sum;
        }
    }
    return 1;
}
