/* AVX-512 (F/BW/VL/DQ + VNNI) paths of the weight kernels (see linear_common.h).
 *
 * One row of activations (decode) streams the weights once and decodes them in registers: int4 nibbles index a
 * 16-entry table with _mm512_permutexvar_ps (which reads only the low 4 bits of each index, so a shift replaces a
 * mask), e4m3 is rebuilt with shifts and a 2^120 multiply, e2m1 is a second 16-entry table, bf16 is a shift.
 * Several rows (prefill) dequantise a tile of weights to f32 once and run a register-blocked FMA kernel over it,
 * so the decode cost is paid once per tile instead of once per row. */
#include <immintrin.h>

#include "linear_common.h"

/* Software prefetch for the weight streams of the GEMVs: distance in bytes and target level. One core streaming
 * from DRAM while it decodes does not keep enough lines in flight on its own. On the 2-core development VM (a
 * scratch harness timing the safe API, best of 25, 1.3 GB of weights): W4A16 went from 2.6-4.3 GB/s without
 * prefetch to 7.4-8.3 with 1 KiB into L1; FP8 from 9.5 (2 KiB into L1) to 10.4 (2 KiB into L2) and 11.1 (4 KiB
 * into L2, 8 KiB the same); W4A16 was flat across these once it read four blocks side by side. In-cache speed
 * was unchanged by all of them. */
#define EF_PREFETCH 4096
#define EF_PREFETCH_HINT _MM_HINT_T1

static inline size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* ----------------------------------------------------------------------------------------------------------------
 * int4, tinygemm layout [Npad/64][K][32] */

/* The 16 int4 codes minus the zero point 8, so a group's sum needs no correction term for it. */
static inline __m512 lut_q8(void) {
    return _mm512_setr_ps(-8.f, -7.f, -6.f, -5.f, -4.f, -3.f, -2.f, -1.f, 0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f);
}

/* Scale and zero of 16 consecutive columns: each dword of the bf16 pairs is scale | zero << 16. */
static inline void load_sz16(const uint16_t *p, __m512 *scale, __m512 *zero) {
    __m512i v = _mm512_loadu_si512((const void *)p);
    *scale = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *zero = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
}

/* One k-row of a block (32 bytes, 64 columns) times x[kk], into four accumulators of 16 columns. */
#define W4_ROW(ptr, xv, c0, c1, c2, c3)                                                                             \
    do {                                                                                                           \
        __m512i lo_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ptr)));                              \
        __m512i hi_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((ptr) + 16)));                       \
        c0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(lo_, lut), xv, c0);                                             \
        c1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(hi_, lut), xv, c1);                                             \
        c2 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(lo_, 4), lut), xv, c2);                       \
        c3 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(hi_, 4), lut), xv, c3);                       \
    } while (0)

/* The scales and zeros of group g of block b are a whole row of scales (npad * 4 bytes) away from the previous
 * group's, so no hardware prefetcher sees them coming; this fetches the next group's while the current one runs.
 * It measured within noise on the development VM (9.9 against 10.1 GB/s) and costs four instructions a group. */
static inline void prefetch_sz(const uint16_t *sz, size_t g, size_t groups, size_t npad, size_t b) {
    if (g >= groups) return;
    const char *p = (const char *)(sz + (g * npad + b * 64) * 2);
    for (int l = 0; l < 4; l++) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
}

/* Sum of x[k0..k1). */
static inline float sum_range(const float *x, size_t k0, size_t k1) {
    __m512 s = _mm512_setzero_ps();
    for (size_t kk = k0; kk < k1; kk += 16) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(ef_mask16(k1 - kk), x + kk));
    return _mm512_reduce_add_ps(s);
}

/* One row of x against one 64-column block, whole K. Two k-rows per iteration into two sets of accumulators, so
 * eight FMA chains are in flight; the group sum of x comes from a separate vector pass, not a scalar chain. */
static void w4a16_gemv_block(const float *xr, size_t k, const uint8_t *blk, const uint16_t *sz, size_t npad,
                             size_t group, size_t b, __m512 out[4]) {
    const __m512 lut = lut_q8();
    size_t groups = (k + group - 1) / group;
    for (int q = 0; q < 4; q++) out[q] = _mm512_setzero_ps();
    for (size_t g = 0; g < groups; g++) {
        size_t k0 = g * group, k1 = min_sz(k0 + group, k);
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        prefetch_sz(sz, g + 1, groups, npad, b);
        size_t kk = k0;
        for (; kk + 2 <= k1; kk += 2) {
            const uint8_t *p = blk + kk * 32;
            _mm_prefetch((const char *)(p + EF_PREFETCH), EF_PREFETCH_HINT);
            __m512 x0 = _mm512_set1_ps(xr[kk]), x1 = _mm512_set1_ps(xr[kk + 1]);
            W4_ROW(p, x0, a0, a1, a2, a3);
            W4_ROW(p + 32, x1, b0, b1, b2, b3);
        }
        if (kk < k1) W4_ROW(blk + kk * 32, _mm512_set1_ps(xr[kk]), a0, a1, a2, a3);
        const uint16_t *s = sz + (g * npad + b * 64) * 2;
        __m512 acc[4] = {_mm512_add_ps(a0, b0), _mm512_add_ps(a1, b1), _mm512_add_ps(a2, b2), _mm512_add_ps(a3, b3)};
        __m512 vsx = _mm512_set1_ps(sum_range(xr, k0, k1));
        for (int q = 0; q < 4; q++) {
            __m512 sc, ze;
            load_sz16(s + 32 * q, &sc, &ze);
            out[q] = _mm512_fmadd_ps(sc, acc[q], out[q]);
            out[q] = _mm512_fmadd_ps(ze, vsx, out[q]);
        }
    }
}

/* NB blocks side by side, one k-row of each per step: NB weight streams in flight instead of one. From DRAM on
 * one core of the development VM (scratch harness, 1.3 GB of weights, best of 25): one block at a time 10.0 GB/s,
 * two 12.1-12.4, four 13.4-13.7 against a 16.2 GB/s streaming read; in cache all run at 19 GB/s. */
static inline __attribute__((always_inline)) void w4a16_gemv_blocks(const float *xr, size_t k, const uint8_t *packed,
                                                                    const uint16_t *sz, size_t npad, size_t group,
                                                                    size_t b, __m512 out[][4], const int nb) {
    const __m512 lut = lut_q8();
    size_t groups = (k + group - 1) / group;
    for (int j = 0; j < nb; j++)
        for (int q = 0; q < 4; q++) out[j][q] = _mm512_setzero_ps();
    for (size_t g = 0; g < groups; g++) {
        size_t k0 = g * group, k1 = min_sz(k0 + group, k);
        __m512 a[4][4];
        for (int j = 0; j < nb; j++) {
            for (int q = 0; q < 4; q++) a[j][q] = _mm512_setzero_ps();
            prefetch_sz(sz, g + 1, groups, npad, b + (size_t)j);
        }
        for (size_t kk = k0; kk < k1; kk++) {
            __m512 xv = _mm512_set1_ps(xr[kk]);
            for (int j = 0; j < nb; j++) {
                const uint8_t *p = packed + (b + (size_t)j) * k * 32 + kk * 32;
                if ((kk & 1) == 0) _mm_prefetch((const char *)(p + EF_PREFETCH), EF_PREFETCH_HINT);
                W4_ROW(p, xv, a[j][0], a[j][1], a[j][2], a[j][3]);
            }
        }
        __m512 vsx = _mm512_set1_ps(sum_range(xr, k0, k1));
        for (int j = 0; j < nb; j++) {
            const uint16_t *s = sz + (g * npad + (b + (size_t)j) * 64) * 2;
            for (int q = 0; q < 4; q++) {
                __m512 sc, ze;
                load_sz16(s + 32 * q, &sc, &ze);
                out[j][q] = _mm512_fmadd_ps(sc, a[j][q], out[j][q]);
                out[j][q] = _mm512_fmadd_ps(ze, vsx, out[j][q]);
            }
        }
    }
}

/* Rows of the tile-times-activations product: acc[r][c] += sum_kk x[r][kk] * tile[kk][c], MR rows at once. */
static inline __attribute__((always_inline)) void axpy_rows(const float *x, size_t k, size_t k0, size_t kc,
                                                            const float *tile, float *y, size_t n, size_t c0,
                                                            size_t cols, int first, const int mr) {
    __m512 acc[4][4];
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < 4; j++) {
            size_t cj = cols > (size_t)(16 * j) ? cols - 16 * j : 0;
            acc[r][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(ef_mask16(cj), y + r * n + c0 + 16 * j);
        }
    for (size_t kk = 0; kk < kc; kk++) {
        __m512 t0 = _mm512_loadu_ps(tile + kk * 64), t1 = _mm512_loadu_ps(tile + kk * 64 + 16);
        __m512 t2 = _mm512_loadu_ps(tile + kk * 64 + 32), t3 = _mm512_loadu_ps(tile + kk * 64 + 48);
        for (int r = 0; r < mr; r++) {
            __m512 xb = _mm512_set1_ps(x[r * k + k0 + kk]);
            acc[r][0] = _mm512_fmadd_ps(xb, t0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(xb, t1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(xb, t2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(xb, t3, acc[r][3]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < 4; j++) {
            size_t cj = cols > (size_t)(16 * j) ? cols - 16 * j : 0;
            _mm512_mask_storeu_ps(y + r * n + c0 + 16 * j, ef_mask16(cj), acc[r][j]);
        }
}

#define W4_KC 256
#ifndef W4_NB
#define W4_NB 4
#endif

void ef_w4a16_avx512(const float *x, size_t m, size_t k, const uint8_t *packed, const uint16_t *sz, size_t npad,
                     size_t group, size_t n, size_t b0, size_t b1, float *y) {
    if (m == 1) {
        size_t b = b0;
        for (; b + W4_NB <= b1; b += W4_NB) {
            __m512 out[W4_NB][4];
            w4a16_gemv_blocks(x, k, packed, sz, npad, group, b, out, W4_NB);
            for (int j = 0; j < W4_NB; j++) {
                size_t bj = b + (size_t)j, cols = min_sz(n - bj * 64, 64);
                for (int q = 0; q < 4; q++) {
                    size_t cq = cols > (size_t)(16 * q) ? cols - 16 * q : 0;
                    _mm512_mask_storeu_ps(y + bj * 64 + 16 * q, ef_mask16(cq), out[j][q]);
                }
            }
        }
        for (; b < b1; b++) {
            __m512 out[4];
            w4a16_gemv_block(x, k, packed + b * k * 32, sz, npad, group, b, out);
            size_t cols = min_sz(n - b * 64, 64);
            for (int q = 0; q < 4; q++) {
                size_t cq = cols > (size_t)(16 * q) ? cols - 16 * q : 0;
                _mm512_mask_storeu_ps(y + b * 64 + 16 * q, ef_mask16(cq), out[q]);
            }
        }
        return;
    }
    /* Several rows: dequantise W4_KC x 64 of the block to f32 (64 KiB, stays in L2), then FMA every row over it. */
    static _Thread_local float tile[W4_KC * 64] __attribute__((aligned(64)));
    const __m512 lut = lut_q8();
    for (size_t b = b0; b < b1; b++) {
        const uint8_t *blk = packed + b * k * 32;
        size_t cols = min_sz(n - b * 64, 64);
        for (size_t k0 = 0; k0 < k; k0 += W4_KC) {
            size_t kc = min_sz(W4_KC, k - k0);
            for (size_t kk = 0; kk < kc; kk++) {
                size_t g = (k0 + kk) / group;
                const uint16_t *s = sz + (g * npad + b * 64) * 2;
                __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + (k0 + kk) * 32)));
                __m512i hi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + (k0 + kk) * 32 + 16)));
                __m512i idx[4] = {lo, hi, _mm512_srli_epi32(lo, 4), _mm512_srli_epi32(hi, 4)};
                for (int q = 0; q < 4; q++) {
                    __m512 sc, ze;
                    load_sz16(s + 32 * q, &sc, &ze);
                    _mm512_store_ps(tile + kk * 64 + 16 * q, _mm512_fmadd_ps(_mm512_permutexvar_ps(idx[q], lut), sc, ze));
                }
            }
            size_t i = 0;
            for (; i + 4 <= m; i += 4) axpy_rows(x + i * k, k, k0, kc, tile, y + i * n, n, b * 64, cols, k0 == 0, 4);
            for (; i < m; i++) axpy_rows(x + i * k, k, k0, kc, tile, y + i * n, n, b * 64, cols, k0 == 0, 1);
        }
    }
}

/* ---- W4A16 GEMV with AVX512-VBMI + VNNI: integer dot products on int16 activations ----
 *
 * Per group g, x becomes X = round(x / s_g) with s_g the power of two at or above max|x_g| / 32767, so |X| <= 32767
 * fits an int16 (ef_w4a16_xq_avx512, once per call; xq is int16 [k rounded up to even], zero-padded, xs[g] = s_g,
 * xsum[g] = sum of X over the group). Two consecutive k-rows of a block are 64 contiguous bytes; one zero-masked
 * vpermb per 16 byte-columns d puts, in dword d, row kk's byte d in the low word and row kk+1's byte d in the high
 * word (the other two bytes zeroed). That word is lo + 16 hi (column d in the low nibble, d + 32 in the high), a
 * shift right by 4 leaves hi, and the broadcast dword X[kk] | X[kk+1] << 16 is the other operand of vpdpwssd. So
 * each of the two dot products per vpermb gives, per dword lane: F += X (lo + 16 hi) and H += X hi. At the end of
 * the group, sum X (hi - 8) = H and sum X (lo - 8) = F - 16 H when F starts at -136 sum X and H at -8 sum X (the
 * zero point 8 removed in the integers, no mask for the low nibbles). Per 2 k-rows x 64 columns: 1 load, 2 vpermb,
 * 2 shifts, 4 vpdpwssd (+ the activation broadcast, shared by the blocks), against 4 widening loads, 8 vpermps
 * (port 5), 4 shifts and 8 FMAs in the f32 kernel. Four blocks side by side hold 16 int32 accumulators, four weight
 * streams in flight as in the f32 kernel.
 *
 * Exactness: every integer step is exact. vpdpwssd, vpaddd and vpsubd wrap modulo 2^32, so only the final lane sums
 * must fit an int32, and they are far inside it: |sum X (c - 8)| <= 128 * 32767 * 8 < 2^25 for a group of 128; the
 * running F stays below 64 * 2 * 255 * 32767 + 136 * 128 * 32767 < 1.64e9 < 2^31 even before wrapping is counted on,
 * and int -> f32 rounds once (2^-24 relative). The representation error of x is at most s_g / 2 <= max|x_g| / 32767
 * (about 2^-15 of the group's largest |x|), zero for values with at most 8 significant bits that are at least 2^-7
 * of the power of two at or below the group's max|x| (bf16 activations whose nonzero values in a group span less
 * than 2^7). The result per group is
 * (sum X (c - 8)) * (scale * s_g) + zero * (sum X) * s_g, the f32 kernel's formula on the rounded x.
 *
 * Measured on the development VM (benchmarks/cpu-avx512-2core.md, cpu session): in cache (scratch harness, one
 * core, 8 blocks x 5120 in L2, best of 400) 48.2 GB/s against 19.8 for the f32 kernel; from DRAM (cargo bench
 * cpu_gemv, 17408 x 5120, 1.5 GiB, shared machine, quiet minutes, 05:08-05:13 UTC) 0.89-0.93 of the read probe
 * on 1 thread and 0.88-0.92 on 2 against 0.74-0.83 / 0.75-0.83 for the f32 kernel in the same runs. The f32 kernel stays the
 * Base path (Ext::Base), the path for CPUs without VBMI, for several activation rows and for inputs the int16
 * form cannot hold.
 *
 * VBMI is not among build.rs's AVX-512 flags; the kernel carries it as a target attribute and the Rust side calls
 * it only where kernels::cpu::has_avx512_vbmi() (the activation encoder below needs only the base AVX-512 set). One
 * activation row only (the several-row path is the tiled f32 GEMM above). */
#define W4I_NB 4
/* Each stream prefetches 3 KiB ahead into L1, where the other GEMVs prefetch 4 KiB into L2: this kernel spends
 * less than half the core time per line, so lines are wanted sooner. From DRAM (cargo bench cpu_gemv, shared machine,
 * 04:56-04:59 UTC, same runs as the base kernel): 0.90-0.93 of the read probe on 1 thread against 0.84-0.89 with
 * 4 KiB into L2; the scratch harness (1 thread, 3 repetitions each) gave 0.88-0.91 for 3 KiB into L1, 0.83-0.85
 * for 4 KiB into L2, 0.86-0.93 for 2 KiB into L1, 0.84-0.94 for 1 KiB into L1 (noisier). */
#define W4I_PREFETCH 3072
__attribute__((target("avx512vbmi"))) static inline __attribute__((always_inline)) void
w4a16i_blocks(const int16_t *xq, const float *xs, const int32_t *xsum, size_t k, const uint8_t *packed,
              const uint16_t *sz, size_t npad, size_t group, size_t n, size_t b, float *y, const int nb) {
    /* output dword d <- bytes (row kk byte c0 + d, -, row kk+1 byte c0 + d, -); the '-' bytes are zeroed by mk */
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i idx0 = _mm512_add_epi32(_mm512_or_si512(iota, _mm512_slli_epi32(iota, 16)),
                                          _mm512_set1_epi32(0x00200000));
    const __m512i idx1 = _mm512_add_epi32(idx0, _mm512_set1_epi32(0x00100010));
    const __mmask64 mk = 0x5555555555555555ull;
    size_t groups = (k + group - 1) / group;
    __m512 out[W4I_NB][4];
    for (int j = 0; j < nb; j++)
        for (int q = 0; q < 4; q++) out[j][q] = _mm512_setzero_ps();
    for (size_t g = 0; g < groups; g++) {
        size_t k0 = g * group, k1 = min_sz(k0 + group, k);
        __m512i f[W4I_NB][2], h[W4I_NB][2];
        const __m512i f0 = _mm512_set1_epi32(-136 * xsum[g]), h0 = _mm512_set1_epi32(-8 * xsum[g]);
        for (int j = 0; j < nb; j++) {
            f[j][0] = f[j][1] = f0;
            h[j][0] = h[j][1] = h0;
            prefetch_sz(sz, g + 1, groups, npad, b + (size_t)j);
        }
        for (size_t kk = k0; kk < k1; kk += 2) {
            int32_t xw;
            memcpy(&xw, xq + kk, 4);
            __m512i xb = _mm512_set1_epi32(xw);
            /* k odd: the last pair has one row; its second half is not loaded (and X[k] is 0) */
            __mmask64 ml = kk + 1 < k ? ~(__mmask64)0 : (__mmask64)0xFFFFFFFFu;
            for (int j = 0; j < nb; j++) {
                const uint8_t *src = packed + (b + (size_t)j) * k * 32 + kk * 32;
                _mm_prefetch((const char *)src + W4I_PREFETCH, _MM_HINT_T0);
                __m512i v = _mm512_maskz_loadu_epi8(ml, src);
                __m512i p0 = _mm512_maskz_permutexvar_epi8(mk, idx0, v), p1 = _mm512_maskz_permutexvar_epi8(mk, idx1, v);
                f[j][0] = _mm512_dpwssd_epi32(f[j][0], p0, xb);
                h[j][0] = _mm512_dpwssd_epi32(h[j][0], _mm512_srli_epi16(p0, 4), xb);
                f[j][1] = _mm512_dpwssd_epi32(f[j][1], p1, xb);
                h[j][1] = _mm512_dpwssd_epi32(h[j][1], _mm512_srli_epi16(p1, 4), xb);
            }
        }
        const __m512 vs = _mm512_set1_ps(xs[g]), vsx = _mm512_set1_ps((float)xsum[g] * xs[g]);
        for (int j = 0; j < nb; j++) {
            const uint16_t *s = sz + (g * npad + (b + (size_t)j) * 64) * 2;
            __m512i a[4] = {_mm512_sub_epi32(f[j][0], _mm512_slli_epi32(h[j][0], 4)),
                            _mm512_sub_epi32(f[j][1], _mm512_slli_epi32(h[j][1], 4)), h[j][0], h[j][1]};
            for (int q = 0; q < 4; q++) {
                __m512 sc, ze;
                load_sz16(s + 32 * q, &sc, &ze);
                out[j][q] = _mm512_fmadd_ps(_mm512_mul_ps(sc, vs), _mm512_cvtepi32_ps(a[q]), out[j][q]);
                out[j][q] = _mm512_fmadd_ps(ze, vsx, out[j][q]);
            }
        }
    }
    for (int j = 0; j < nb; j++) {
        size_t bj = b + (size_t)j, cols = min_sz(n - bj * 64, 64);
        for (int q = 0; q < 4; q++) {
            size_t cq = cols > (size_t)(16 * q) ? cols - 16 * q : 0;
            _mm512_mask_storeu_ps(y + bj * 64 + 16 * q, ef_mask16(cq), out[j][q]);
        }
    }
}

__attribute__((target("avx512vbmi"))) void ef_w4a16_avx512vbmi(const int16_t *xq, const float *xs, const int32_t *xsum,
                                                                size_t k, const uint8_t *packed, const uint16_t *sz,
                                                                size_t npad, size_t group, size_t n, size_t b0,
                                                                size_t b1, float *y) {
    size_t b = b0;
    for (; b + W4I_NB <= b1; b += W4I_NB) w4a16i_blocks(xq, xs, xsum, k, packed, sz, npad, group, n, b, y, W4I_NB);
    for (; b < b1; b++) w4a16i_blocks(xq, xs, xsum, k, packed, sz, npad, group, n, b, y, 1);
}

/* Builds xq, xs, xsum of ef_w4a16_avx512vbmi from x[k]: per group, s = the power of two at or above
 * max|x| / 32767 and X = round-to-nearest-even(x / s), saturated to int16 (it never needs to be: |x / s| <= 32767
 * up to the rounding of the division); a group of zeros gets s = 0 and X = 0. Returns 0 (the caller runs the f32
 * kernel) when a value is not finite or s would be below the smallest normal f32 (0 < max|x| < ~3.9e-34); 1
 * otherwise. */
int ef_w4a16_xq_avx512(const float *x, size_t k, size_t group, int16_t *xq, float *xs, int32_t *xsum) {
    size_t groups = (k + group - 1) / group;
    for (size_t g = 0; g < groups; g++) {
        size_t k0 = g * group, k1 = min_sz(k0 + group, k);
        __m512 amax = _mm512_setzero_ps();
        for (size_t kk = k0; kk < k1; kk += 16) {
            __mmask16 mk = ef_mask16(k1 - kk);
            __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(mk, x + kk));
            if (_mm512_mask_cmp_ps_mask(mk, a, _mm512_set1_ps(3.4028234663852886e38f), _CMP_LE_OQ) != mk) return 0;
            amax = _mm512_max_ps(amax, a);
        }
        float m = _mm512_reduce_max_ps(amax), s = 0.0f;
        __m512i sum = _mm512_setzero_si512();
        if (m > 0.0f) {
            s = m / 32767.0f;
            if (s < 1.17549435e-38f) return 0;
            uint32_t sb;
            memcpy(&sb, &s, sizeof sb);
            if (sb & 0x7FFFFFu) sb = (sb & 0x7F800000u) + 0x00800000u;
            memcpy(&s, &sb, sizeof s);
            const __m512 inv = _mm512_set1_ps(1.0f / s);
            for (size_t kk = k0; kk < k1; kk += 16) {
                __mmask16 mk = ef_mask16(k1 - kk);
                __m512i X = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + kk), inv),
                                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                __m256i X16 = _mm512_cvtsepi32_epi16(X);
                _mm256_mask_storeu_epi16(xq + kk, mk, X16);
                sum = _mm512_add_epi32(sum, _mm512_cvtepi16_epi32(_mm256_maskz_mov_epi16(mk, X16)));
            }
        } else {
            for (size_t kk = k0; kk < k1; kk += 16) _mm256_mask_storeu_epi16(xq + kk, ef_mask16(k1 - kk), _mm256_setzero_si256());
        }
        xs[g] = s;
        xsum[g] = _mm512_reduce_add_epi32(sum);
    }
    if (k & 1) xq[k] = 0;
    return 1;
}

/* ----------------------------------------------------------------------------------------------------------------
 * W4A8: the same packed layout on the symmetric grid, int8 activations, VNNI dot products. */

/* One row of int8 activations against NB blocks side by side (NB weight streams in flight, as in the W4A16 GEMV):
 * y[b + j] columns for j < nb. */
static inline __attribute__((always_inline)) void w4a8_row_blocks(const int8_t *xr, const float xs,
                                                                  const int32_t *xsum, size_t k, const uint8_t *packed,
                                                                  const uint16_t *sz, size_t npad, size_t group,
                                                                  size_t n, size_t b, float *yr, const int nb) {
    size_t groups = (k + group - 1) / group;
    __m512 out[2][4];
    for (int j = 0; j < nb; j++)
        for (int q = 0; q < 4; q++) out[j][q] = _mm512_setzero_ps();
    for (size_t g = 0; g < groups; g++) {
        size_t k0 = g * group, k1 = min_sz(k0 + group, k);
        __m256i acc[2][8];
        for (int j = 0; j < nb; j++) {
            for (int q = 0; q < 8; q++) acc[j][q] = _mm256_setzero_si256();
            prefetch_sz(sz, g + 1, groups, npad, b + (size_t)j);
        }
        for (size_t kk = k0; kk < k1; kk += 4) {
            /* A short final quad (k not a multiple of 4) copies the rows that exist and pads with code 0 and x 0,
             * so nothing past the matrix is read and the padding adds nothing. */
            size_t rows = min_sz(4, k1 - kk);
            int32_t xw;
            if (rows == 4) {
                memcpy(&xw, xr + kk, 4);
            } else {
                int8_t xt[4] = {0, 0, 0, 0};
                memcpy(xt, xr + kk, rows);
                memcpy(&xw, xt, 4);
            }
            __m256i xb = _mm256_set1_epi32(xw);
            for (int j = 0; j < nb; j++) {
                const uint8_t *src = packed + (b + (size_t)j) * k * 32 + kk * 32;
                uint8_t tail[128];
                if (rows < 4) {
                    memset(tail, 0, sizeof tail);
                    memcpy(tail, src, rows * 32);
                    src = tail;
                } else {
                    _mm_prefetch((const char *)src + EF_PREFETCH, EF_PREFETCH_HINT);
                    _mm_prefetch((const char *)src + EF_PREFETCH + 64, EF_PREFETCH_HINT);
                }
                __m256i quad[8];
                ef_w4a8_quads(src, quad);
                for (int q = 0; q < 8; q++) acc[j][q] = _mm256_dpbusd_epi32(acc[j][q], quad[q], xb);
            }
        }
        /* sum x*(q-8) = sum x*q - 8 * sum x over the group. */
        __m512i corr = _mm512_set1_epi32(8 * xsum[g]);
        for (int j = 0; j < nb; j++) {
            __m256i ordered[8];
            ef_w4a8_fix_order(acc[j], ordered);
            const uint16_t *s = sz + (g * npad + (b + (size_t)j) * 64) * 2;
            for (int q = 0; q < 4; q++) {
                __m512i a16 = _mm512_inserti64x4(_mm512_castsi256_si512(ordered[2 * q]), ordered[2 * q + 1], 1);
                __m512 af = _mm512_cvtepi32_ps(_mm512_sub_epi32(a16, corr));
                __m512 sc, ze;
                load_sz16(s + 32 * q, &sc, &ze);
                out[j][q] = _mm512_fmadd_ps(sc, af, out[j][q]);
            }
        }
    }
    __m512 vxs = _mm512_set1_ps(xs);
    for (int j = 0; j < nb; j++) {
        size_t bj = b + (size_t)j, cols = min_sz(n - bj * 64, 64);
        for (int q = 0; q < 4; q++) {
            size_t cq = cols > (size_t)(16 * q) ? cols - 16 * q : 0;
            _mm512_mask_storeu_ps(yr + bj * 64 + 16 * q, ef_mask16(cq), _mm512_mul_ps(out[j][q], vxs));
        }
    }
}

void ef_w4a8_avx512(const int8_t *xq, const float *xs, const int32_t *xsum, size_t m, size_t k, const uint8_t *packed,
                    const uint16_t *sz, size_t npad, size_t group, size_t n, size_t b0, size_t b1, float *y) {
    /* Pairs of blocks outside, rows inside, so with several rows the pair stays in L2. On one core of the
     * development VM, pairs against single blocks: GEMV from DRAM 12.2-12.4 against 11.2-11.4 GB/s, GEMM (64 rows)
     * 126 against 107 GFLOP/s. */
    size_t groups = (k + group - 1) / group;
    size_t b = b0;
    for (; b + 2 <= b1; b += 2)
        for (size_t i = 0; i < m; i++)
            w4a8_row_blocks(xq + i * k, xs[i], xsum + i * groups, k, packed, sz, npad, group, n, b, y + i * n, 2);
    for (; b < b1; b++)
        for (size_t i = 0; i < m; i++)
            w4a8_row_blocks(xq + i * k, xs[i], xsum + i * groups, k, packed, sz, npad, group, n, b, y + i * n, 1);
}

/* ---- W4A8 with AVX512-VBMI: vpermt2b builds the vpdpbusd operands ----
 *
 * Four consecutive k-rows of a block are 128 contiguous bytes (two zmm loads, A = rows 0-1, B = rows 2-3). One
 * vpermt2b gathers, for 16 byte positions c, the four rows' bytes into dword c (bytes r0[c], r1[c], r2[c], r3[c]);
 * a mask leaves the low nibbles (columns c) and a shift plus mask the high ones (columns c + 32): the operand of a
 * zmm vpdpbusd, already in column order. Per 4 k-rows x 64 columns that is 2 permutes, 6 logic ops and 4 zmm
 * vpdpbusd, against 16 unpacks, 12 logic ops and 8 ymm vpdpbusd in ef_w4a8_quads + ef_w4a8_fix_order (linear_common.h), and the 4
 * accumulators per block leave room for four blocks side by side (four weight streams in flight, as in the W4A16
 * GEMV) where the base path holds two. The results are bit-identical to the base path (same integer sums, same
 * order of float operations per group).
 *
 * Measured on the development VM: in cache (scratch harness, one core, 8 blocks x 5120 in L2) 40.5 against 29.9
 * GB/s; from DRAM (cargo bench cpu_gemv, 1.5 GiB of 17408 x 5120 matrices, quiet windows, 7 repetitions each)
 * 0.88-0.90 / 0.88-0.92 of the four-stream read probe on 1 / 2 threads against 0.78 / 0.77-0.79 for the base
 * kernel (benchmarks/cpu-avx512-2core.md, c1 session).
 *
 * VBMI is not among the flags build.rs gives the AVX-512 library, so these two functions carry it as a target
 * attribute, and the Rust side calls them only where the CPU reports avx512vbmi (kernels::cpu::has_avx512_vbmi). */
#define W4A8V_NB 4
__attribute__((target("avx512vbmi"))) static inline __attribute__((always_inline)) void
w4a8v_row_blocks(const int8_t *xr, const float xs, const int32_t *xsum, size_t k, const uint8_t *packed,
                 const uint16_t *sz, size_t npad, size_t group, size_t n, size_t b, float *yr, const int nb) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* output byte 4c + r <- row r, byte c: index 32 r + c in the 128-byte pair (A: rows 0-1, B: rows 2-3) */
    const __m512i idx0 = _mm512_set_epi8(111, 79, 47, 15, 110, 78, 46, 14, 109, 77, 45, 13, 108, 76, 44, 12, /* 15-12 */
                                         107, 75, 43, 11, 106, 74, 42, 10, 105, 73, 41, 9, 104, 72, 40, 8, /* 11-8 */
                                         103, 71, 39, 7, 102, 70, 38, 6, 101, 69, 37, 5, 100, 68, 36, 4, /* 7-4 */
                                         99, 67, 35, 3, 98, 66, 34, 2, 97, 65, 33, 1, 96, 64, 32, 0); /* columns 3-0 */
    const __m512i idx1 = _mm512_add_epi8(idx0, _mm512_set1_epi8(16));
    size_t groups = (k + group - 1) / group;
    __m512 out[W4A8V_NB][4];
    for (int j = 0; j < nb; j++)
        for (int q = 0; q < 4; q++) out[j][q] = _mm512_setzero_ps();
    for (size_t g = 0; g < groups; g++) {
        size_t k0 = g * group, k1 = min_sz(k0 + group, k);
        __m512i acc[W4A8V_NB][4];
        for (int j = 0; j < nb; j++) {
            for (int q = 0; q < 4; q++) acc[j][q] = _mm512_setzero_si512();
            prefetch_sz(sz, g + 1, groups, npad, b + (size_t)j);
        }
        size_t kk = k0;
        for (; kk + 4 <= k1; kk += 4) {
            int32_t xw;
            memcpy(&xw, xr + kk, 4);
            __m512i xb = _mm512_set1_epi32(xw);
            for (int j = 0; j < nb; j++) {
                const uint8_t *src = packed + (b + (size_t)j) * k * 32 + kk * 32;
                _mm_prefetch((const char *)src + EF_PREFETCH, EF_PREFETCH_HINT);
                _mm_prefetch((const char *)src + EF_PREFETCH + 64, EF_PREFETCH_HINT);
                __m512i A = _mm512_loadu_si512((const void *)src), B = _mm512_loadu_si512((const void *)(src + 64));
                __m512i q0 = _mm512_permutex2var_epi8(A, idx0, B), q1 = _mm512_permutex2var_epi8(A, idx1, B);
                acc[j][0] = _mm512_dpbusd_epi32(acc[j][0], _mm512_and_si512(q0, m4), xb);
                acc[j][1] = _mm512_dpbusd_epi32(acc[j][1], _mm512_and_si512(q1, m4), xb);
                acc[j][2] = _mm512_dpbusd_epi32(acc[j][2], _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4), xb);
                acc[j][3] = _mm512_dpbusd_epi32(acc[j][3], _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4), xb);
            }
        }
        if (kk < k1) {
            /* A short final quad (k not a multiple of 4): masked loads zero the missing rows, x is padded with 0. */
            size_t rows = k1 - kk;
            int8_t xt[4] = {0, 0, 0, 0};
            memcpy(xt, xr + kk, rows);
            int32_t xw;
            memcpy(&xw, xt, 4);
            __m512i xb = _mm512_set1_epi32(xw);
            __mmask64 ma = rows >= 2 ? ~(__mmask64)0 : (__mmask64)0xFFFFFFFFu;
            __mmask64 mb = rows >= 3 ? (__mmask64)0xFFFFFFFFu : 0; /* rows is at most 3 here */
            for (int j = 0; j < nb; j++) {
                const uint8_t *src = packed + (b + (size_t)j) * k * 32 + kk * 32;
                __m512i A = _mm512_maskz_loadu_epi8(ma, src), B = _mm512_maskz_loadu_epi8(mb, src + 64);
                __m512i q0 = _mm512_permutex2var_epi8(A, idx0, B), q1 = _mm512_permutex2var_epi8(A, idx1, B);
                acc[j][0] = _mm512_dpbusd_epi32(acc[j][0], _mm512_and_si512(q0, m4), xb);
                acc[j][1] = _mm512_dpbusd_epi32(acc[j][1], _mm512_and_si512(q1, m4), xb);
                acc[j][2] = _mm512_dpbusd_epi32(acc[j][2], _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4), xb);
                acc[j][3] = _mm512_dpbusd_epi32(acc[j][3], _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4), xb);
            }
        }
        __m512i corr = _mm512_set1_epi32(8 * xsum[g]);
        for (int j = 0; j < nb; j++) {
            const uint16_t *s = sz + (g * npad + (b + (size_t)j) * 64) * 2;
            for (int q = 0; q < 4; q++) {
                __m512 sc, ze;
                load_sz16(s + 32 * q, &sc, &ze);
                out[j][q] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[j][q], corr)), out[j][q]);
            }
        }
    }
    __m512 vxs = _mm512_set1_ps(xs);
    for (int j = 0; j < nb; j++) {
        size_t bj = b + (size_t)j, cols = min_sz(n - bj * 64, 64);
        for (int q = 0; q < 4; q++) {
            size_t cq = cols > (size_t)(16 * q) ? cols - 16 * q : 0;
            _mm512_mask_storeu_ps(yr + bj * 64 + 16 * q, ef_mask16(cq), _mm512_mul_ps(out[j][q], vxs));
        }
    }
}

__attribute__((target("avx512vbmi"))) void ef_w4a8_avx512vbmi(const int8_t *xq, const float *xs, const int32_t *xsum,
                                                               size_t m, size_t k, const uint8_t *packed,
                                                               const uint16_t *sz, size_t npad, size_t group, size_t n,
                                                               size_t b0, size_t b1, float *y) {
    size_t groups = (k + group - 1) / group;
    size_t b = b0;
    for (; b + W4A8V_NB <= b1; b += W4A8V_NB)
        for (size_t i = 0; i < m; i++)
            w4a8v_row_blocks(xq + i * k, xs[i], xsum + i * groups, k, packed, sz, npad, group, n, b, y + i * n,
                             W4A8V_NB);
    for (; b < b1; b++)
        for (size_t i = 0; i < m; i++)
            w4a8v_row_blocks(xq + i * k, xs[i], xsum + i * groups, k, packed, sz, npad, group, n, b, y + i * n, 1);
}

/* ----------------------------------------------------------------------------------------------------------------
 * Row-major formats (FP8, NVFP4, bf16): GEMV streams the weight rows (bf16 four at a time). GEMM dequantises 64
 * weight rows x W4_KC columns into a row-major panel, turns it into the [k][64] tile the int4 GEMM uses (16-wide
 * gathers), and runs the same register-blocked kernel (axpy_rows) over every row of x. A dot-product kernel
 * straight over the row-major panel was written first and ran at 42 GFLOP/s where this form runs at 103-115
 * (64 x 1024 x 5120, one core of the development VM, best of 25), most likely because it loads a whole vector of
 * x from L2 for every 4 FMAs where the tile form broadcasts one element of x from L1. */

typedef void (*panel_fn)(const void *ctx, size_t r, size_t k0, size_t kc, float *out);

static void gemm_panels(const float *x, size_t m, size_t k, size_t n, size_t r0, size_t r1, float *y, panel_fn fill,
                        const void *ctx) {
    static _Thread_local float panel[64 * W4_KC] __attribute__((aligned(64)));
    static _Thread_local float tile[W4_KC * 64] __attribute__((aligned(64)));
    const __m512i rows16 = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(W4_KC));
    for (size_t rb = r0; rb < r1; rb += 64) {
        size_t rows = min_sz(64, r1 - rb);
        for (size_t k0 = 0; k0 < k; k0 += W4_KC) {
            size_t kc = min_sz(W4_KC, k - k0);
            for (size_t j = 0; j < 64; j++) {
                if (j < rows) fill(ctx, rb + j, k0, kc, panel + j * W4_KC);
                else memset(panel + j * W4_KC, 0, sizeof(float) * W4_KC);
            }
            for (size_t kk = 0; kk < kc; kk++)
                for (int q = 0; q < 4; q++)
                    _mm512_store_ps(tile + kk * 64 + 16 * q,
                                    _mm512_i32gather_ps(rows16, panel + (size_t)q * 16 * W4_KC + kk, 4));
            size_t i = 0;
            for (; i + 4 <= m; i += 4) axpy_rows(x + i * k, k, k0, kc, tile, y + i * n, n, rb, rows, k0 == 0, 4);
            for (; i < m; i++) axpy_rows(x + i * k, k, k0, kc, tile, y + i * n, n, rb, rows, k0 == 0, 1);
        }
    }
}

/* ---- FP8 e4m3, 128 x 128 block scales ---- */

/* e4m3 -> f32 through fp16: the 7 magnitude bits shifted left by 7 are an fp16 with the same exponent and
 * mantissa fields, worth 2^-8 times the e4m3 value, and that holds for subnormals too (fp16 subnormals have the
 * same shape), so vcvtph2ps finishes the job exactly, in hardware. The sign comes from sign-extending the byte;
 * the mask clears the copy that lands in the exponent's top bit. An earlier decode built the f32 directly and
 * multiplied by 2^120; it was 50x slower on data with subnormal codes (0.4 against 19 GB/s, one core, in cache)
 * because of microcode assists on f32 subnormal operands. Returns values times 2^-8; callers fold 256 into the
 * block scale. */
static inline __m512 e4m3x16_s8(__m128i codes) {
    __m256i h = _mm256_cvtepi8_epi16(codes);
    h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xBFFF));
    return _mm512_cvtph_ps(h);
}

/* The same for 32 codes, two vectors. */
static inline void e4m3x32_s8(__m256i codes, __m512 *lo, __m512 *hi) {
    __m512i h = _mm512_cvtepi8_epi16(codes);
    h = _mm512_and_si512(_mm512_slli_epi16(h, 7), _mm512_set1_epi16((short)0xBFFF));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

typedef struct {
    const uint8_t *w;
    const float *sinv;
    size_t k;
} fp8_ctx;

static void fp8_panel(const void *vctx, size_t r, size_t k0, size_t kc, float *out) {
    const fp8_ctx *c = (const fp8_ctx *)vctx;
    size_t kb = (c->k + EF_FP8_BLOCK - 1) / EF_FP8_BLOCK;
    const uint8_t *wr = c->w + r * c->k;
    for (size_t kk = 0; kk < kc; kk += 16) {
        __mmask16 mk = ef_mask16(kc - kk);
        float s = c->sinv[(r / EF_FP8_BLOCK) * kb + (k0 + kk) / EF_FP8_BLOCK];
        __m512 v = e4m3x16_s8(_mm_maskz_loadu_epi8(mk, wr + k0 + kk));
        _mm512_mask_storeu_ps(out + kk, mk, _mm512_mul_ps(v, _mm512_set1_ps(s * 256.0f)));
    }
}

/* NR rows of the FP8 GEMV side by side: NR weight streams in flight, each x vector loaded once for all of them.
 * Each stream prefetches the same column NR rows ahead (the next row group), not EF_PREFETCH bytes ahead: with
 * rows side by side, EF_PREFETCH past row j lands in row j+1, which is being read already, so only the last row's
 * prefetch would run ahead. From DRAM on the development VM (cargo bench cpu_gemv, fp8 only, 7 reps, three
 * alternations): one row at a time 11.3-11.5 GB/s on 1 thread and 20.9-21.6 on 2; four rows with the
 * EF_PREFETCH distance 9.6-9.7 and 18.1-18.2 (two rows the same), which is why FP8 read one row at a time before;
 * four rows prefetching the next group 14.4-14.6 and 26.6-26.8. (NVFP4's f32 kernel gained nothing from the same
 * change; its VBMI kernel reads four rows from four far-apart parts of the range instead: see nvfp4i_rows.) */
#define FP8_NR 4
static inline __attribute__((always_inline)) void fp8_gemv_rows(const float *x, size_t k, const uint8_t *w,
                                                                const float *sinv, size_t r, float *y, const int nr) {
    size_t kb = (k + EF_FP8_BLOCK - 1) / EF_FP8_BLOCK;
    const uint8_t *wr[4];
    const float *s[4];
    __m512 tot[4];
    for (int j = 0; j < nr; j++) {
        wr[j] = w + (r + (size_t)j) * k;
        s[j] = sinv + ((r + (size_t)j) / EF_FP8_BLOCK) * kb;
        tot[j] = _mm512_setzero_ps();
    }
    for (size_t blk = 0; blk < kb; blk++) {
        size_t k0 = blk * EF_FP8_BLOCK, k1 = min_sz(k0 + EF_FP8_BLOCK, k);
        __m512 a[4][2];
        for (int j = 0; j < nr; j++) a[j][0] = a[j][1] = _mm512_setzero_ps();
        size_t kk = k0;
        for (; kk + 64 <= k1; kk += 64) {
            __m512 x0 = _mm512_loadu_ps(x + kk), x1 = _mm512_loadu_ps(x + kk + 16);
            __m512 x2 = _mm512_loadu_ps(x + kk + 32), x3 = _mm512_loadu_ps(x + kk + 48);
            for (int j = 0; j < nr; j++) {
                _mm_prefetch((const char *)(wr[j] + kk + (size_t)nr * k), EF_PREFETCH_HINT);
                __m512 w0, w1, w2, w3;
                e4m3x32_s8(_mm256_loadu_si256((const __m256i *)(wr[j] + kk)), &w0, &w1);
                e4m3x32_s8(_mm256_loadu_si256((const __m256i *)(wr[j] + kk + 32)), &w2, &w3);
                a[j][0] = _mm512_fmadd_ps(w0, x0, a[j][0]);
                a[j][1] = _mm512_fmadd_ps(w1, x1, a[j][1]);
                a[j][0] = _mm512_fmadd_ps(w2, x2, a[j][0]);
                a[j][1] = _mm512_fmadd_ps(w3, x3, a[j][1]);
            }
        }
        for (; kk < k1; kk += 16) {
            __mmask16 mk = ef_mask16(k1 - kk);
            __m512 xv = _mm512_maskz_loadu_ps(mk, x + kk);
            for (int j = 0; j < nr; j++)
                a[j][0] = _mm512_fmadd_ps(e4m3x16_s8(_mm_maskz_loadu_epi8(mk, wr[j] + kk)), xv, a[j][0]);
        }
        for (int j = 0; j < nr; j++)
            tot[j] = _mm512_fmadd_ps(_mm512_add_ps(a[j][0], a[j][1]), _mm512_set1_ps(s[j][blk] * 256.0f), tot[j]);
    }
    for (int j = 0; j < nr; j++) y[r + (size_t)j] = _mm512_reduce_add_ps(tot[j]);
}

void ef_fp8_avx512(const float *x, size_t m, size_t k, const uint8_t *w, const float *sinv, size_t n, size_t r0,
                   size_t r1, float *y) {
    if (m > 1) {
        fp8_ctx c = {w, sinv, k};
        gemm_panels(x, m, k, n, r0, r1, y, fp8_panel, &c);
        return;
    }
    size_t r = r0;
    for (; r + FP8_NR <= r1; r += FP8_NR) fp8_gemv_rows(x, k, w, sinv, r, y, FP8_NR);
    for (; r < r1; r++) fp8_gemv_rows(x, k, w, sinv, r, y, 1);
}

/* ---- NVFP4: e2m1 codes, e4m3 scale per 16, f32 global ---- */

static const float E2M1_TAIL[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

static inline __m512 lut_e2m1(void) {
    return _mm512_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f);
}

typedef struct {
    const uint8_t *w;
    const uint8_t *scales;
    float global;
    size_t k;
} nvfp4_ctx;

static void nvfp4_panel(const void *vctx, size_t r, size_t k0, size_t kc, float *out) {
    const nvfp4_ctx *c = (const nvfp4_ctx *)vctx;
    const __m512 lut = lut_e2m1();
    /* 16 elements = 8 bytes = one scale; widen each byte twice (low nibble, then high) and interleave. */
    const __m512i even_odd = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const uint8_t *wr = c->w + r * (c->k / 2);
    const uint8_t *sr = c->scales + r * (c->k / EF_NVFP4_GROUP);
    for (size_t kk = 0; kk < kc; kk += 16) {
        size_t e = k0 + kk;
        __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(wr + e / 2)));
        __m512 lo = _mm512_permutexvar_ps(bytes, lut), hi = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), lut);
        __m512 v = _mm512_permutex2var_ps(lo, even_odd, hi);
        float s = ef_e4m3_decode(sr[e / EF_NVFP4_GROUP]) * c->global;
        _mm512_storeu_ps(out + kk, _mm512_mul_ps(v, _mm512_set1_ps(s)));
    }
}

void ef_nvfp4_avx512(const float *x, const float *xp, size_t m, size_t k, const uint8_t *w, const uint8_t *scales,
                     float global, size_t n, size_t r0, size_t r1, float *y) {
    if (m > 1) {
        nvfp4_ctx c = {w, scales, global, k};
        gemm_panels(x, m, k, n, r0, r1, y, nvfp4_panel, &c);
        return;
    }
    /* GEMV over 128-element chunks: the 64 bytes load as 16 dwords, dword j holding elements 8j..8j+7, and nibble t
     * of every dword is selected by a shift of 4t (permutexvar ignores the bits above 4). xp holds x in the matching
     * [t][j] order per chunk (the Rust side builds it once per call). Elements 8j..8j+7 share scale j/2. */
    const __m512 lut = lut_e2m1();
    size_t chunks = k / 128, groups = k / EF_NVFP4_GROUP;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * (k / 2);
        const uint8_t *sr = scales + r * groups;
        __m512 acc = _mm512_setzero_ps();
        for (size_t c = 0; c < chunks; c++) {
            __m512i v = _mm512_loadu_si512((const void *)(wr + c * 64));
            _mm_prefetch((const char *)(wr + c * 64 + EF_PREFETCH), EF_PREFETCH_HINT);
            const float *xc = xp + c * 128;
            __m128i s8 = _mm_loadl_epi64((const __m128i *)(sr + c * 8));
            __m512 sv = e4m3x16_s8(_mm_unpacklo_epi8(s8, s8)); /* lane j: scale j/2, times 2^-8 */
            __m512 t0 = _mm512_mul_ps(_mm512_permutexvar_ps(v, lut), _mm512_loadu_ps(xc));
            __m512 t1 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut), _mm512_loadu_ps(xc + 16));
            t0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 8), lut), _mm512_loadu_ps(xc + 32), t0);
            t1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 12), lut), _mm512_loadu_ps(xc + 48), t1);
            t0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 16), lut), _mm512_loadu_ps(xc + 64), t0);
            t1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 20), lut), _mm512_loadu_ps(xc + 80), t1);
            t0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 24), lut), _mm512_loadu_ps(xc + 96), t0);
            t1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 28), lut), _mm512_loadu_ps(xc + 112), t1);
            acc = _mm512_fmadd_ps(_mm512_add_ps(t0, t1), sv, acc);
        }
        float out = _mm512_reduce_add_ps(acc) * 256.0f; /* sv carried 2^-8 */
        /* Tail: k is a multiple of 16 but maybe not of 128; xp keeps x in natural order there. */
        for (size_t g = chunks * 8; g < groups; g++) {
            float a = 0.0f;
            for (size_t j = 0; j < 8; j++) {
                uint8_t byte = wr[g * 8 + j];
                float lo = E2M1_TAIL[byte & 15], hi = E2M1_TAIL[byte >> 4];
                a += xp[g * 16 + 2 * j] * lo + xp[g * 16 + 2 * j + 1] * hi;
            }
            out += a * ef_e4m3_decode(sr[g]);
        }
        y[r] = out * global;
    }
}

/* ---- NVFP4 GEMV with AVX512-VBMI + VNNI: integer dot products ----
 *
 * Every e2m1 value doubled is an integer in [-12, 12], so 2 w + 12 is a u8 in [0, 24], the unsigned operand of
 * vpdpbusd; one vpermb per 64 codes is the table lookup (vpermb reads the low 6 bits of each index byte, and the
 * 64-byte table repeats its 16 entries four times, so the other nibble in bits 4-5 needs no mask). The activations
 * come as integers: per 16-element scale group g, s_g is the power of two at or above max|x| / (127 * 2^16) and
 * X = round(x / s_g), |X| <= 127 * 2^16 (ef_nvfp4_xq_avx512vbmi below, once per call), split into three signed bytes X = h 2^16 + m 2^8 + l, so a
 * 128-element chunk is 6 vpdpbusd (3 limbs x 2 code vectors); xs[16 c + i] = s_g of lane i's group g = 8 c + i/2. Layout of xq per chunk (384 bytes): limb h of the even elements
 * (byte j = element 2j, the low nibbles of the 64 code bytes), limb h of the odd elements (high nibbles), then
 * m and l the same way; xnb[16 c + i] = -12 * (X[8i] + ... + X[8i + 7]) removes the +12 bias. Dword lane i of
 * every vpdpbusd covers elements 8i..8i+7, i.e. scale group i/2, as in the f32 kernel above, so the scale vector is
 * the same. Bounds: each limb's lane sum is at most 8 * 24 * 128 < 2^15, so (h << 16) + (m << 8) + l stays below
 * 1.62e9 before the bias: int32 never overflows. Precision: x is represented to s_g / 2 <= 2^-23 max|x| of its
 * 16-element group (f32 itself holds x to 2^-24 |x|; the per-group scale keeps an outlier from costing more than
 * its own group), exactly for values with at most 8 significant bits within 2^-15 of the group's max (bf16
 * activations, and the basis vectors of the exact-decode test); the integer sums are exact, and the int -> f32
 * conversion of a lane sum rounds once (2^-24 relative): the result differs from the f32 kernel's by rounding,
 * plus that representation error for groups whose values differ widely in magnitude.
 *
 * Micro-ops per 128 codes (64 code bytes + 8 scale bytes), counted from the source: this kernel 1 load, 1
 * prefetch (+ 1/8 for the scales), 1 shift, 2 vpermb, 6 vpdpbusd (activation loads fused), 2 shifts + 1 add to
 * join the limbs (chained: the m limbs accumulate onto ah << 8, the l limbs onto (am << 8) + bias), 1 int -> f32,
 * scale decode 5 (load, one masked vpermb that puts each byte in the high half of two words, arithmetic shift,
 * mask, vcvtph2ps: the e4m3x16_s8 recipe with the byte doubling and sign extension in one permute), 1 multiply by
 * xs (its load fused), 1 FMA: 22; the f32 kernel above: 33 (8 of them the port-5 vpermps; here 3 vpermb). Per 32
 * codes: 5.5 against 8.25. A bf16 route (vpermb + vpunpck{l,h}bw to build bf16 codes, vdpbf16ps on bf16
 * activations, two scale vectors per chunk) would be about 25 per 128 codes, but vdpbf16ps costs 3.8 FMAs of
 * throughput on this CPU (16 independent chains: 0.70 against 0.185 ns per instruction; vpdpbusd 0.13), so its 4
 * dot products alone cost as much as the f32 kernel's 8 FMAs + 8 permutes; it was not built
 * (benchmarks/cpu-avx512-2core.md, c2 session). In cache (one core, 256 rows x 5120, L2, c3 session): 24.9 GB/s as
 * built (25.7 with four adjacent rows, see below), 23.7 before the chained join and the permute scale decode; the
 * f32 kernel 14.0-14.4 (c2).
 *
 * Memory side: NV4I_NR = 4 rows per step share the activation vectors, and they are taken from four far-apart
 * parts of the thread's row range (part p holds rows r0 + p * part .. ), one row of each per step, so the core
 * reads four independent row-major streams, each 64 bytes per step, as the int4 GEMVs read four far-apart blocks.
 * Each stream prefetches the same column of its next row (k/2 bytes ahead, one step of that stream) into L2, and
 * every 8 chunks the scale line of that next row. From DRAM (cargo bench cpu_gemv, 17408 x 5120 matrices, 1.5 GiB,
 * c3 session) the kernel read 0.95-0.96 of the four-stream read probe on 1 thread and 0.90-0.96 on 2, against
 * 0.74-0.76 for four adjacent rows (each prefetching the next row group, the FP8 GEMV's scheme); two parts of two
 * adjacent rows gave 0.86-0.88, two parts of four rows (8 per step) 0.86, eight parts (8 per step) 0.92-0.93, no
 * scale prefetch 0.92-0.93, prefetching two rows ahead the same as one. The remaining rows (fewer than 4 past the
 * last full step) run one at a time, prefetching EF_PREFETCH bytes ahead in their row. */
#define NV4I_NR 4
__attribute__((target("avx512vbmi"))) static inline __attribute__((always_inline)) void
nvfp4i_rows(const float *x, const int8_t *xq, const int32_t *xnb, const float *xs, size_t k, const uint8_t *w,
            const uint8_t *scales, float global, const size_t *rr, size_t pfrows, float *y, const int nr) {
    /* 2 e2m1 + 12 for the 16 codes, repeated 4 times (index bits 4-5 are the other nibble's low bits) */
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    /* scale decode: word i <- scale byte i/2 in its high half (the low bytes are zeroed by the mask) */
    const __m256i sidx = _mm256_setr_epi8(0, 0, 0, 0, 0, 1, 0, 1, 0, 2, 0, 2, 0, 3, 0, 3, 0, 4, 0, 4, 0, 5, 0, 5, 0, 6,
                                          0, 6, 0, 7, 0, 7);
    const __m256i smask = _mm256_set1_epi16((short)0xBFFF);
    size_t chunks = k / 128, groups = k / EF_NVFP4_GROUP;
    __m512 acc[NV4I_NR];
    for (int j = 0; j < nr; j++) acc[j] = _mm512_setzero_ps();
    for (size_t c = 0; c < chunks; c++) {
        const int8_t *q = xq + c * 384;
        __m512i xh0 = _mm512_loadu_si512((const void *)q), xh1 = _mm512_loadu_si512((const void *)(q + 64));
        __m512i xm0 = _mm512_loadu_si512((const void *)(q + 128)), xm1 = _mm512_loadu_si512((const void *)(q + 192));
        __m512i xl0 = _mm512_loadu_si512((const void *)(q + 256)), xl1 = _mm512_loadu_si512((const void *)(q + 320));
        __m512i nb = _mm512_loadu_si512((const void *)(xnb + c * 16));
        __m512 vxs = _mm512_loadu_ps(xs + c * 16); /* lane i: the x scale of group i/2 */
        for (int j = 0; j < nr; j++) {
            const uint8_t *wr = w + rr[j] * (k / 2) + c * 64;
            const uint8_t *sr = scales + rr[j] * groups + c * 8;
            __m512i v = _mm512_loadu_si512((const void *)wr);
            /* one row: EF_PREFETCH bytes ahead in its row; nr rows: the same column pfrows rows on (the stream's
             * next row), and every 8 chunks that row's scale line */
            _mm_prefetch((const char *)(nr == 1 ? wr + EF_PREFETCH : wr + pfrows * (k / 2)), EF_PREFETCH_HINT);
            if (nr > 1 && (c & 7) == 0) _mm_prefetch((const char *)(sr + pfrows * groups), EF_PREFETCH_HINT);
            __m512i lo = _mm512_permutexvar_epi8(v, lut), hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(v, 4), lut);
            /* (((ah << 8) + am) << 8) + bias + al, accumulated in place. int32 holds every step: am << 8 is at
             * most 8 * 24 * (127 * 2^16 + 128) < 1.6e9 (the bound above), and once the bias is in, the sum is
             * sum (u - 12) X - sum u l (u = 2 w + 12 the code operand), below 8 * 12 * 127 * 2^16 + 8 * 24 * 128
             * < 8.0e8 through the l steps */
            __m512i ah = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xh0), hi, xh1);
            __m512i am = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_slli_epi32(ah, 8), lo, xm0), hi, xm1);
            __m512i s = _mm512_add_epi32(_mm512_slli_epi32(am, 8), nb);
            s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s, lo, xl0), hi, xl1);
            __m128i s8 = _mm_loadl_epi64((const __m128i *)sr);
            __m256i hs = _mm256_maskz_permutexvar_epi8(0xAAAAAAAAu, sidx, _mm256_castsi128_si256(s8));
            /* byte << 8 shifted right by 1 (arithmetic) = sign-extended byte << 7, as in e4m3x16_s8 */
            __m512 sc = _mm512_cvtph_ps(_mm256_and_si256(_mm256_srai_epi16(hs, 1), smask));
            __m512 sv = _mm512_mul_ps(sc, vxs); /* lane i: scale i/2, x 2^-8 */
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sv, acc[j]);
        }
    }
    for (int j = 0; j < nr; j++) {
        const uint8_t *wr = w + rr[j] * (k / 2);
        const uint8_t *sr = scales + rr[j] * groups;
        float out = _mm512_reduce_add_ps(acc[j]) * 128.0f; /* 2^8 from the scales, 1/2 from the doubled codes */
        /* Tail groups (k a multiple of 16 but not of 128): f32, natural order, as in the f32 kernel. */
        for (size_t g = chunks * 8; g < groups; g++) {
            float a = 0.0f;
            for (size_t i = 0; i < 8; i++) {
                uint8_t byte = wr[g * 8 + i];
                a += x[g * 16 + 2 * i] * E2M1_TAIL[byte & 15] + x[g * 16 + 2 * i + 1] * E2M1_TAIL[byte >> 4];
            }
            out += a * ef_e4m3_decode(sr[g]);
        }
        y[rr[j]] = out * global;
    }
}

__attribute__((target("avx512vbmi"))) void ef_nvfp4_avx512vbmi(const float *x, const int8_t *xq, const int32_t *xnb,
                                                                const float *xs, size_t k, const uint8_t *w,
                                                                const uint8_t *scales, float global, size_t r0,
                                                                size_t r1, float *y) {
    /* NV4I_NR parts of `part` rows each, one row of every part per step (see above), then the rest one by one */
    size_t steps = (r1 - r0) / NV4I_NR, part = steps, rr[NV4I_NR];
    for (size_t t = 0; t < steps; t++) {
        for (int p = 0; p < NV4I_NR; p++) rr[p] = r0 + (size_t)p * part + t;
        nvfp4i_rows(x, xq, xnb, xs, k, w, scales, global, rr, 1, y, NV4I_NR);
    }
    for (size_t r = r0 + steps * NV4I_NR; r < r1; r++) nvfp4i_rows(x, xq, xnb, xs, k, w, scales, global, &r, 0, y, 1);
}

/* Builds the integer activations of ef_nvfp4_avx512vbmi (layout above) from x[chunks * 128]: per 16-element group
 * g, s_g = the power of two at or above max|x| / (127 * 2^16) and X = round-to-nearest-even(x / s_g) clamped to
 * +-127 * 2^16;
 * a group of zeros gets s_g = 0 and X = 0. Returns 0 (and the caller runs the f32 kernel) when a value is not
 * finite or s_g would be an f32 subnormal (0 < max|x| < ~1e-31); 1 otherwise. Limb bytes are built per chunk in
 * element order and split into even and odd elements with one vpermt2b each. About 1 us per 5120 elements: the
 * same loop in (SSE2-baseline) Rust cost 29 us, which for a 256 x 5120 GEMV (0.7 MB) was a third of the call. */
__attribute__((target("avx512vbmi"))) int ef_nvfp4_xq_avx512vbmi(const float *x, size_t chunks, int8_t *xq,
                                                                  int32_t *xnb, float *xs) {
    const float lim = 8323072.0f; /* 127 * 2^16 */
    const __m512i vlim = _mm512_set1_epi32(8323072), c128 = _mm512_set1_epi32(128), c255 = _mm512_set1_epi32(255);
    const __m512i idx_even = _mm512_setr_epi32(0x06040200, 0x0E0C0A08, 0x16141210, 0x1E1C1A18, 0x26242220,
                                               0x2E2C2A28, 0x36343230, 0x3E3C3A38, 0x46444240, 0x4E4C4A48,
                                               0x56545250, 0x5E5C5A58, 0x66646260, 0x6E6C6A68, 0x76747270,
                                               0x7E7C7A78);
    const __m512i idx_odd = _mm512_add_epi8(idx_even, _mm512_set1_epi8(1));
    for (size_t c = 0; c < chunks; c++) {
        uint8_t limb[3][128];
        for (size_t g = 0; g < 8; g++) {
            __m512 v = _mm512_loadu_ps(x + c * 128 + g * 16);
            __m512 a = _mm512_abs_ps(v);
            if (_mm512_cmp_ps_mask(a, _mm512_set1_ps(3.4028234663852886e38f), _CMP_LE_OQ) != 0xFFFF) return 0;
            float amax = _mm512_reduce_max_ps(a);
            float s = 0.0f;
            __m512i X = _mm512_setzero_si512();
            if (amax > 0.0f) {
                /* s: the power of two at or above amax / lim, so x / s is exact before the rounding to an integer
                 * and the kernel's multiply by s adds no error of its own */
                s = amax / lim;
                if (s < 1.17549435e-38f) return 0;
                uint32_t sb;
                memcpy(&sb, &s, sizeof sb);
                if (sb & 0x7FFFFFu) sb = (sb & 0x7F800000u) + 0x00800000u;
                memcpy(&s, &sb, sizeof s);
                __m512 t = _mm512_mul_ps(v, _mm512_set1_ps(1.0f / s));
                X = _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                X = _mm512_max_epi32(_mm512_min_epi32(X, vlim), _mm512_sub_epi32(_mm512_setzero_si512(), vlim));
            }
            __m512i l = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(X, c128), c255), c128);
            __m512i x1 = _mm512_srai_epi32(_mm512_sub_epi32(X, l), 8);
            __m512i m = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(x1, c128), c255), c128);
            __m512i h = _mm512_srai_epi32(_mm512_sub_epi32(x1, m), 8);
            _mm_storeu_si128((__m128i *)(limb[0] + g * 16), _mm512_cvtepi32_epi8(h));
            _mm_storeu_si128((__m128i *)(limb[1] + g * 16), _mm512_cvtepi32_epi8(m));
            _mm_storeu_si128((__m128i *)(limb[2] + g * 16), _mm512_cvtepi32_epi8(l));
            xnb[c * 16 + 2 * g] = -12 * _mm512_mask_reduce_add_epi32(0x00FF, X);
            xnb[c * 16 + 2 * g + 1] = -12 * _mm512_mask_reduce_add_epi32(0xFF00, X);
            xs[c * 16 + 2 * g] = s;
            xs[c * 16 + 2 * g + 1] = s;
        }
        for (int j = 0; j < 3; j++) {
            __m512i A = _mm512_loadu_si512((const void *)limb[j]), B = _mm512_loadu_si512((const void *)(limb[j] + 64));
            _mm512_storeu_si512((void *)(xq + c * 384 + j * 128), _mm512_permutex2var_epi8(A, idx_even, B));
            _mm512_storeu_si512((void *)(xq + c * 384 + j * 128 + 64), _mm512_permutex2var_epi8(A, idx_odd, B));
        }
    }
    return 1;
}

/* ---- bf16 ---- */

static inline __m512 bf16x16(__m256i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); }

typedef struct {
    const uint16_t *w;
    size_t k;
} bf16_ctx;

static void bf16_panel(const void *vctx, size_t r, size_t k0, size_t kc, float *out) {
    const bf16_ctx *c = (const bf16_ctx *)vctx;
    const uint16_t *wr = c->w + r * c->k + k0;
    for (size_t kk = 0; kk < kc; kk += 16) {
        __mmask16 mk = ef_mask16(kc - kk);
        _mm512_mask_storeu_ps(out + kk, mk, bf16x16(_mm256_maskz_loadu_epi16(mk, wr + kk)));
    }
}

void ef_bf16_avx512(const float *x, size_t m, size_t k, const uint16_t *w, size_t n, size_t r0, size_t r1, float *y) {
    if (m > 1) {
        bf16_ctx c = {w, k};
        gemm_panels(x, m, k, n, r0, r1, y, bf16_panel, &c);
        return;
    }
    /* Four rows at a time: four weight streams in flight instead of one, and every x vector loaded once for four
     * rows. Measured on the development VM (scratch harness, one thread, 1.4 GB of weights, best of 15, alternating runs):
     * one row at a time 6.3-10.3 GB/s against torch's bf16 GEMV at 8.9-15.3; four rows 9.3-14.9 against 11.3-15.6.
     * (A bf16 row is 2k bytes, so EF_PREFETCH ahead stays inside it; the FP8 GEMV, rows of k bytes, prefetches
     * the next row group instead, see fp8_gemv_rows.) */
    size_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        const uint16_t *w0 = w + r * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        size_t kk = 0;
        for (; kk + 32 <= k; kk += 32) {
            _mm_prefetch((const char *)(w0 + kk) + EF_PREFETCH, EF_PREFETCH_HINT);
            _mm_prefetch((const char *)(w1 + kk) + EF_PREFETCH, EF_PREFETCH_HINT);
            _mm_prefetch((const char *)(w2 + kk) + EF_PREFETCH, EF_PREFETCH_HINT);
            _mm_prefetch((const char *)(w3 + kk) + EF_PREFETCH, EF_PREFETCH_HINT);
            __m512 xa = _mm512_loadu_ps(x + kk), xb = _mm512_loadu_ps(x + kk + 16);
#define BF16_ROW2(wp, acc)                                                                                          \
    acc = _mm512_fmadd_ps(bf16x16(_mm256_loadu_si256((const __m256i *)((wp) + kk))), xa, acc);                      \
    acc = _mm512_fmadd_ps(bf16x16(_mm256_loadu_si256((const __m256i *)((wp) + kk + 16))), xb, acc);
            BF16_ROW2(w0, a0)
            BF16_ROW2(w1, a1)
            BF16_ROW2(w2, a2)
            BF16_ROW2(w3, a3)
#undef BF16_ROW2
        }
        for (; kk < k; kk += 16) {
            __mmask16 mk = ef_mask16(k - kk);
            __m512 xv = _mm512_maskz_loadu_ps(mk, x + kk);
            a0 = _mm512_fmadd_ps(bf16x16(_mm256_maskz_loadu_epi16(mk, w0 + kk)), xv, a0);
            a1 = _mm512_fmadd_ps(bf16x16(_mm256_maskz_loadu_epi16(mk, w1 + kk)), xv, a1);
            a2 = _mm512_fmadd_ps(bf16x16(_mm256_maskz_loadu_epi16(mk, w2 + kk)), xv, a2);
            a3 = _mm512_fmadd_ps(bf16x16(_mm256_maskz_loadu_epi16(mk, w3 + kk)), xv, a3);
        }
        y[r] = _mm512_reduce_add_ps(a0);
        y[r + 1] = _mm512_reduce_add_ps(a1);
        y[r + 2] = _mm512_reduce_add_ps(a2);
        y[r + 3] = _mm512_reduce_add_ps(a3);
    }
    for (; r < r1; r++) {
        const uint16_t *wr = w + r * k;
        __m512 a0 = _mm512_setzero_ps();
        for (size_t kk = 0; kk < k; kk += 16) {
            __mmask16 mk = ef_mask16(k - kk);
            a0 = _mm512_fmadd_ps(bf16x16(_mm256_maskz_loadu_epi16(mk, wr + kk)), _mm512_maskz_loadu_ps(mk, x + kk), a0);
        }
        y[r] = _mm512_reduce_add_ps(a0);
    }
}
