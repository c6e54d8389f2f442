// The read floor of the decode GEMV benchmark (bench_gemv.py): the time one kernel launch needs to read a given
// set of bytes once from HBM and do nothing else with them. A GEMV must read its weights and scales; whatever it
// spends beyond this floor is its own (decode, mma, reductions, the fragment kernel, ramp and tail), and what is
// below the floor is out of reach on this card at this size, whatever "% of copy" the target asks for.
// Not part of the crate: run_session.sh prepare compiles it to read_floor.ptx in the carry, with the crate's nvcc.
//
// read_floor_u{U}: the 16-byte words a[0 .. na) then b[0 .. nb) (e.g. the tile layout's weights, then its scale
// words), grid-stride, U independent streaming loads in flight per thread (the GEMVs' ld.global.nc.L1::no_allocate).
// The XOR of everything read is kept so that no load is dead, and written to *sink only if it equals a constant
// (so in practice nothing is written: the kernel reads and exits).
#include "common.cuh"  // edgefit::ld_stream: the GEMVs' streaming load (ld.global.nc.L1::no_allocate.v4)

using edgefit::ld_stream;

template <int U>
__device__ __forceinline__ void read_floor(const uint4* __restrict__ a, unsigned long long na,
                                           const uint4* __restrict__ b, unsigned long long nb, uint32_t* sink) {
    const size_t n = na + nb;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    uint32_t x = 0;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride * U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const size_t j = i + u * stride;
            v[u] = j < na ? ld_stream(a + j) : j < n ? ld_stream(b + (j - na)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (x == 0x9e3779b9u) *sink = x;
}

#define READ_FLOOR(U)                                                                                             \
    extern "C" __global__ void __launch_bounds__(256) read_floor_u##U(const uint4* a, unsigned long long na,       \
                                                                      const uint4* b, unsigned long long nb,       \
                                                                      uint32_t* sink) {                            \
        read_floor<U>(a, na, b, nb, sink);                                                                        \
    }
READ_FLOOR(2)
READ_FLOOR(4)
READ_FLOOR(8)
