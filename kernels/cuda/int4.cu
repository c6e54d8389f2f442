// Int4 linear layers on the GPU (sm_90): W4A16 (f32 activations) and W4A8 (int8 activations per row) over the
// chunked tinygemm pack of kernels/src/linear/int4.rs, the same bytes the CPU kernels and embedding_gather_int4
// (ops.cu) read. The safe entry points, their checks and the launches are in kernels/src/cuda/int4.rs.
//
// Layout: packed uint8 [npad/64][k][32]; in block b, row c, byte d holds output column 64b + d in its low nibble and
// 64b + d + 32 in its high nibble. scales_zeros bf16 [ceil(k/group)][npad][2] (scale, zero); a weight is
// (code - 8) * scale + zero. Padding columns (n <= j < npad) decode to 0 and are never stored.
//
// One simple kernel for every m, correct rather than fast: a block owns one 64-column block of the weights and a
// tile of INT4_ROWS activation rows (grid.y strides over the tiles), its 8 warps split the groups of k round-robin,
// and lane l keeps the columns l and l + 32 (one packed byte per k) for every row of the tile. The warps' partial
// sums meet in shared memory and are added in warp order, so the result does not depend on timing.
//
// W4A16 dequantises each weight as the CPU does ((code - 8) * scale + zero, two roundings, no FMA) and accumulates
// x * w in f32. W4A8 reads activations that int4_quantize_rows_i8 (below) quantised, the CPU's per-row grid
// (scale = amax / 127, q = roundf(x * (127 / amax)) clamped to +-127), accumulates code products in int32 per group,
// adds scale * dot per group in f32 and multiplies by the row's scale at the end, the CPU kernels' order.
#include "common.cuh"

using namespace edgefit;

namespace {

constexpr int INT4_THREADS = 256;
constexpr int INT4_WARPS = INT4_THREADS / 32;
constexpr int INT4_ROWS = 16;
constexpr int QUANT_THREADS = 256;
static_assert(INT4_THREADS == 256 && INT4_ROWS == 16, "kernels/src/cuda/int4.rs restates the block shape");

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

// (code - 8) * scale + zero rounded twice, as Int4Weights::dequantize_row and the CPU kernels compute it.
__device__ __forceinline__ float dequant(uint32_t code, float s, float z) {
    return __fadd_rn(__fmul_rn((float)code - 8.0f, s), z);
}

template <bool A8>
__device__ __forceinline__ void int4_linear_body(const float* __restrict__ x, const int8_t* __restrict__ xq,
                                                 const float* __restrict__ xs, const uint8_t* __restrict__ packed,
                                                 const uint16_t* __restrict__ scales_zeros, float* __restrict__ y,
                                                 int m, int n, int k, int group, uint32_t npad) {
    __shared__ float red[INT4_WARPS][INT4_ROWS][64];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t b = blockIdx.x;
    const uint8_t* blk = packed + b * (size_t)k * 32 + lane;
    const size_t col0 = b * 64 + lane;  // the low nibble's column; the high nibble's is col0 + 32
    const int groups = (k + group - 1) / group;
    const int tiles = (m + INT4_ROWS - 1) / INT4_ROWS;
    for (int tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
        const int i0 = tile * INT4_ROWS;
        const int mt = min(INT4_ROWS, m - i0);
        float acc_lo[INT4_ROWS], acc_hi[INT4_ROWS];
#pragma unroll
        for (int r = 0; r < INT4_ROWS; ++r) acc_lo[r] = acc_hi[r] = 0.0f;
        for (int g = warp; g < groups; g += INT4_WARPS) {
            const int c0 = g * group, c1 = min(c0 + group, k);
            const size_t sz = ((size_t)g * npad + col0) * 2;
            const float s_lo = bf16_bits_to_float(scales_zeros[sz]);
            const float z_lo = bf16_bits_to_float(scales_zeros[sz + 1]);
            const float s_hi = bf16_bits_to_float(scales_zeros[sz + 64]);
            const float z_hi = bf16_bits_to_float(scales_zeros[sz + 65]);
            if constexpr (A8) {
                int32_t d_lo[INT4_ROWS], d_hi[INT4_ROWS];
#pragma unroll
                for (int r = 0; r < INT4_ROWS; ++r) d_lo[r] = d_hi[r] = 0;
                for (int c = c0; c < c1; ++c) {
                    const uint32_t byte = blk[(size_t)c * 32];
                    const int32_t w_lo = (int32_t)(byte & 15u) - 8, w_hi = (int32_t)(byte >> 4) - 8;
#pragma unroll
                    for (int r = 0; r < INT4_ROWS; ++r) {
                        const int32_t q = r < mt ? (int32_t)xq[(size_t)(i0 + r) * k + c] : 0;
                        d_lo[r] += q * w_lo;
                        d_hi[r] += q * w_hi;
                    }
                }
#pragma unroll
                for (int r = 0; r < INT4_ROWS; ++r) {
                    acc_lo[r] = __fadd_rn(acc_lo[r], __fmul_rn(s_lo, (float)d_lo[r]));
                    acc_hi[r] = __fadd_rn(acc_hi[r], __fmul_rn(s_hi, (float)d_hi[r]));
                }
            } else {
                for (int c = c0; c < c1; ++c) {
                    const uint32_t byte = blk[(size_t)c * 32];
                    const float w_lo = dequant(byte & 15u, s_lo, z_lo), w_hi = dequant(byte >> 4, s_hi, z_hi);
#pragma unroll
                    for (int r = 0; r < INT4_ROWS; ++r) {
                        const float xv = r < mt ? x[(size_t)(i0 + r) * k + c] : 0.0f;
                        acc_lo[r] = fmaf(xv, w_lo, acc_lo[r]);
                        acc_hi[r] = fmaf(xv, w_hi, acc_hi[r]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < INT4_ROWS; ++r) {
            red[warp][r][lane] = acc_lo[r];
            red[warp][r][lane + 32] = acc_hi[r];
        }
        __syncthreads();
        for (int o = threadIdx.x; o < INT4_ROWS * 64; o += INT4_THREADS) {
            const int r = o / 64, c = o % 64;
            const size_t col = b * 64 + c;
            if (r < mt && col < (size_t)n) {
                float s = red[0][r][c];
#pragma unroll
                for (int w = 1; w < INT4_WARPS; ++w) s = __fadd_rn(s, red[w][r][c]);
                if constexpr (A8) s = __fmul_rn(s, xs[i0 + r]);
                y[(size_t)(i0 + r) * n + col] = s;
            }
        }
        // The next tile overwrites red.
        __syncthreads();
    }
}

}  // namespace

// y [m, n] = x [m, k] . W^T with f32 activations. Grid (npad / 64, min(ceil(m / 16), 65535)), INT4_THREADS threads.
extern "C" __global__ void __launch_bounds__(INT4_THREADS)
    int4_w4a16(const float* __restrict__ x, const uint8_t* __restrict__ packed,
               const uint16_t* __restrict__ scales_zeros, float* __restrict__ y, int m, int n, int k, int group,
               uint32_t npad) {
    int4_linear_body<false>(x, nullptr, nullptr, packed, scales_zeros, y, m, n, k, group, npad);
}

// y [m, n] from int8 activations xq [m, k] with one scale per row xs [m] (int4_quantize_rows_i8) and weights on the
// symmetric grid (every zero 0, not read). Grid and block as int4_w4a16.
extern "C" __global__ void __launch_bounds__(INT4_THREADS)
    int4_w4a8(const int8_t* __restrict__ xq, const float* __restrict__ xs, const uint8_t* __restrict__ packed,
              const uint16_t* __restrict__ scales_zeros, float* __restrict__ y, int m, int n, int k, int group,
              uint32_t npad) {
    int4_linear_body<true>(nullptr, xq, xs, packed, scales_zeros, y, m, n, k, group, npad);
}

// W4A8's activation quantiser, one block of QUANT_THREADS per row of x [m, k]: amax = max |x| (NaN ignored, as
// f32::max and fmaxf both do), xs = amax / 127 and q = roundf(x * (127 / amax)) clamped to +-127, ties away from
// zero; a zero row gets scale 0 and zero codes, a NaN element code 0 (Rust's `as i8`). Bit for bit the CPU's
// quantize_rows in kernels/src/linear/mod.rs (IEEE division, no FMA).
extern "C" __global__ void __launch_bounds__(QUANT_THREADS)
    int4_quantize_rows_i8(const float* __restrict__ x, int8_t* __restrict__ xq, float* __restrict__ xs, int k) {
    __shared__ float part[QUANT_THREADS / 32];
    const float* row = x + (size_t)blockIdx.x * k;
    int8_t* qrow = xq + (size_t)blockIdx.x * k;
    float amax = 0.0f;
    for (int c = threadIdx.x; c < k; c += QUANT_THREADS) amax = fmaxf(amax, fabsf(row[c]));
    amax = warp_max(amax);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = amax;
    __syncthreads();
    amax = part[0];
#pragma unroll
    for (int w = 1; w < QUANT_THREADS / 32; ++w) amax = fmaxf(amax, part[w]);
    const float inv = amax > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    if (threadIdx.x == 0) xs[blockIdx.x] = amax > 0.0f ? __fdiv_rn(amax, 127.0f) : 0.0f;
    for (int c = threadIdx.x; c < k; c += QUANT_THREADS) {
        const float r = roundf(__fmul_rn(row[c], inv));
        qrow[c] = r != r ? (int8_t)0 : (int8_t)fminf(fmaxf(r, -127.0f), 127.0f);
    }
}
