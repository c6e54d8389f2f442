//! Group-quantised int4 weights in PyTorch's CPU tinygemm layout, packed one 64-column block at a time.
//!
//! Layout (the seeds measured it by packing an index pattern through `torch._convert_weight_to_int4pack_for_cpu`;
//! `kernels/bench/torch_cpu_int4.py` re-checks byte equality and torch's decode on every benchmark run):
//! `packed` is uint8 `[Npad/64][K][32]`; inside the 32 bytes of block `b`, row `k`, byte `d` holds output
//! column `64b + d` in its low nibble and `64b + d + 32` in its high nibble. `scales_zeros` is bf16
//! `[ceil(K/group)][Npad][2]` (scale, zero) and a weight is `(code - 8) * scale + zero`. `Npad` is `N` rounded up
//! to 64: the padding columns of the last block carry code 8 with scale and zero 0, so they decode to exactly 0
//! and the kernels compute them and drop them instead of reading past the matrix. For `N` a multiple of 64 the
//! bytes are exactly torch's. `K` need not be a multiple of the group: the last group is short.
//!
//! Packing is chunked: [`Int4Weights::quantize_with`] asks its caller for one block of 64 weight rows at a time
//! and quantises them straight into the packed bytes, so the only transient is that block, `64 * K * 4` bytes
//! (512 KiB for K = 2048, 4.25 MiB for K = 17408), whatever `N` is. The seeds' packer went through an int32 copy
//! of the whole matrix instead: 1 GiB for a 131072 x 2048 embedding.

use crate::error::{checked_product, checked_sum};
use crate::formats::Int4Logical;
use crate::formats::{bf16_to_f32, f32_to_bf16, group_params, quantize_code};
use crate::{ensure_shape, KernelError};

/// Output columns per packed block.
pub const BLOCK_N: usize = 64;
/// Group sizes the packer accepts (the ones checkpoints use; W4A8 also needs a multiple of 4).
pub use crate::formats::INT4_GROUPS as GROUPS;

/// How the group's range maps onto the 16 codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int4Scheme {
    /// Group minimum at code 0 and maximum at code 15 (tinygemm's W4A16 grid, the more faithful one).
    Asymmetric,
    /// GPTQ's symmetric grid: zero point 8, `scale = 2 * amax / 15`, zero 0. Required by W4A8.
    Symmetric,
}

/// Packed int4 weights of an `[n, k]` linear layer (see the module docs for the layout).
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Weights {
    n: usize,
    k: usize,
    group: usize,
    scheme: Int4Scheme,
    packed: Vec<u8>,
    scales_zeros: Vec<u16>,
}

/// Checks that the weights given to [`Int4Weights::quantize`] or [`Int4Weights::quantize_bf16`] are `[n, k]`.
fn check_quantize_len(len: usize, n: usize, k: usize) -> Result<(), KernelError> {
    ensure_shape!(
        len == checked_product("int4 quantize", "n*k", &[n, k])?,
        "int4 quantize",
        "weights have {len} elements, expected n*k = {n}*{k}"
    );
    Ok(())
}

impl Int4Weights {
    /// Quantises and packs f32 weights `[n, k]` (row-major, output features first, as checkpoints store them).
    pub fn quantize(
        w: &[f32],
        n: usize,
        k: usize,
        group: usize,
        scheme: Int4Scheme,
    ) -> Result<Self, KernelError> {
        check_quantize_len(w.len(), n, k)?;
        Self::quantize_with(n, k, group, scheme, |row0, rows| {
            rows.copy_from_slice(&w[row0 * k..row0 * k + rows.len()]);
            Ok(())
        })
    }

    /// Quantises and packs bf16 weights `[n, k]` (bits), converting one block of rows at a time.
    pub fn quantize_bf16(
        w: &[u16],
        n: usize,
        k: usize,
        group: usize,
        scheme: Int4Scheme,
    ) -> Result<Self, KernelError> {
        check_quantize_len(w.len(), n, k)?;
        Self::quantize_with(n, k, group, scheme, |row0, rows| {
            for (d, &s) in rows.iter_mut().zip(&w[row0 * k..]) {
                *d = bf16_to_f32(s);
            }
            Ok(())
        })
    }

    /// The chunked packer. `rows(row0, buf)` must fill `buf` (`rows * k` f32, at most `64 * k`) with weight rows
    /// `row0..row0 + buf.len() / k`; it is called once per 64-row block, in order, with the same buffer, which is
    /// the packer's only transient. Errors from `rows` (say, a failed read of a checkpoint shard) pass through.
    pub fn quantize_with(
        n: usize,
        k: usize,
        group: usize,
        scheme: Int4Scheme,
        mut rows: impl FnMut(usize, &mut [f32]) -> Result<(), KernelError>,
    ) -> Result<Self, KernelError> {
        let mut out = Self::empty(n, k, group, scheme)?;
        let symmetric = scheme == Int4Scheme::Symmetric;
        // The block buffer: no overflow (the packed buffer just allocated holds k * 32 bytes per block, and this is
        // 8 times that at most), reserved fallibly like the packed buffers.
        let buf_len = BLOCK_N.min(n) * k;
        let mut buf = Vec::new();
        buf.try_reserve_exact(buf_len).map_err(|_| {
            KernelError::shape(
                "int4 quantize",
                format!("cannot allocate a block buffer of {buf_len} f32"),
            )
        })?;
        buf.resize(buf_len, 0.0f32);
        for b in 0..out.blocks() {
            let row0 = b * BLOCK_N;
            let nrows = BLOCK_N.min(n - row0);
            let chunk = &mut buf[..nrows * k];
            rows(row0, chunk)?;
            for (d, row) in chunk.chunks_exact(k).enumerate() {
                for g in 0..out.groups() {
                    let (c0, c1) = (g * group, ((g + 1) * group).min(k));
                    let (s, z) = group_params(&row[c0..c1], symmetric);
                    out.set_scale_zero(g, row0 + d, s, z);
                    for (c, &v) in row.iter().enumerate().take(c1).skip(c0) {
                        out.set_code(row0 + d, c, quantize_code(v, s, z));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Packs already-quantised logical weights (codes `[n][k]`, scales/zeros `[groups][n]`) as one whole matrix.
    /// The chunked packer must produce the same bytes; the tests check it.
    pub fn from_logical(l: &Int4Logical, scheme: Int4Scheme) -> Result<Self, KernelError> {
        const OP: &str = "int4 pack";
        // The logical sizes are checked before the packed buffers are allocated.
        Self::empty_shape(l.n, l.k, l.group)?;
        ensure_shape!(
            l.codes.len() == checked_product(OP, "n*k", &[l.n, l.k])?,
            OP,
            "codes have {} elements, expected n*k",
            l.codes.len()
        );
        let params = checked_product(OP, "ceil(k/group)*n", &[l.k.div_ceil(l.group), l.n])?;
        ensure_shape!(
            l.scales.len() == params && l.zeros.len() == params,
            OP,
            "scales/zeros must be [ceil(k/group)][n] = {params} elements"
        );
        let mut out = Self::empty(l.n, l.k, l.group, scheme)?;
        ensure_shape!(
            l.codes.iter().all(|&c| c < 16),
            "int4 pack",
            "codes must be in 0..16"
        );
        if scheme == Int4Scheme::Symmetric {
            ensure_shape!(
                l.zeros.iter().all(|&z| z == 0.0),
                "int4 pack",
                "the symmetric grid needs every zero = 0"
            );
        }
        for r in 0..l.n {
            for c in 0..l.k {
                out.set_code(r, c, l.codes[r * l.k + c]);
            }
            for g in 0..out.groups() {
                out.set_scale_zero(g, r, l.scales[g * l.n + r], l.zeros[g * l.n + r]);
            }
        }
        Ok(out)
    }

    /// Wraps buffers that are already in the packed layout (a cache written by an earlier run, or benchmark data),
    /// checking their sizes. Codes in padding columns are not inspected; with zero scales they decode to 0.
    pub fn from_raw(
        n: usize,
        k: usize,
        group: usize,
        scheme: Int4Scheme,
        packed: Vec<u8>,
        scales_zeros: Vec<u16>,
    ) -> Result<Self, KernelError> {
        let shape = Self::empty_shape(n, k, group)?;
        ensure_shape!(
            packed.len() == shape.0,
            "int4 from_raw",
            "packed has {} bytes, expected ceil(n/64)*k*32 = {}",
            packed.len(),
            shape.0
        );
        ensure_shape!(
            scales_zeros.len() == shape.1,
            "int4 from_raw",
            "scales_zeros has {} elements, expected ceil(k/group)*npad*2 = {}",
            scales_zeros.len(),
            shape.1
        );
        if scheme == Int4Scheme::Symmetric {
            // W4A8 never reads the zeros (its grid pins them at 0), so a nonzero one would be silently dropped.
            ensure_shape!(
                scales_zeros
                    .iter()
                    .skip(1)
                    .step_by(2)
                    .all(|&z| z & 0x7FFF == 0),
                "int4 from_raw",
                "the symmetric grid needs every zero to be 0"
            );
        }
        Ok(Self {
            n,
            k,
            group,
            scheme,
            packed,
            scales_zeros,
        })
    }

    /// Checks the dimensions and returns the packed and scale buffer lengths. Both must fit in `isize::MAX` bytes
    /// (what a `Vec` can hold), and so do the kernels' index products, which never exceed them.
    fn empty_shape(n: usize, k: usize, group: usize) -> Result<(usize, usize), KernelError> {
        const OP: &str = "int4 pack";
        ensure_shape!(
            n > 0 && k > 0,
            OP,
            "n and k must be positive (n = {n}, k = {k})"
        );
        ensure_shape!(
            GROUPS.contains(&group),
            OP,
            "group must be one of {GROUPS:?}, got {group}"
        );
        let blocks = n.div_ceil(BLOCK_N);
        let npad = checked_product(OP, "ceil(n/64)*64", &[blocks, BLOCK_N])?;
        let packed = checked_product(OP, "ceil(n/64)*k*32", &[blocks, k, 32])?;
        let sz = checked_product(OP, "ceil(k/group)*npad*2", &[k.div_ceil(group), npad, 2])?;
        // The byte size of the scales (2 per element) and the two buffers together are what a GEMV addresses.
        let total = checked_sum(OP, "packed + scales bytes", &[packed, sz, sz])?;
        ensure_shape!(
            total <= isize::MAX as usize,
            OP,
            "n = {n}, k = {k} needs {total} bytes, more than an address space holds"
        );
        Ok((packed, sz))
    }

    fn empty(n: usize, k: usize, group: usize, scheme: Int4Scheme) -> Result<Self, KernelError> {
        const OP: &str = "int4 pack";
        let (packed_len, sz_len) = Self::empty_shape(n, k, group)?;
        // Code 8 in both nibbles: padding columns decode to (8 - 8) * 0 + 0 = 0. The buffers are reserved
        // fallibly, so a size the allocator refuses is an error rather than an abort.
        let alloc_err = |what: &str, len: usize| {
            KernelError::shape(OP, format!("cannot allocate {what} of {len} elements"))
        };
        let mut packed = Vec::new();
        packed
            .try_reserve_exact(packed_len)
            .map_err(|_| alloc_err("the packed codes", packed_len))?;
        packed.resize(packed_len, 0x88u8);
        let mut scales_zeros = Vec::new();
        scales_zeros
            .try_reserve_exact(sz_len)
            .map_err(|_| alloc_err("the scales and zeros", sz_len))?;
        scales_zeros.resize(sz_len, 0);
        Ok(Self {
            n,
            k,
            group,
            scheme,
            packed,
            scales_zeros,
        })
    }

    fn set_code(&mut self, row: usize, col: usize, code: u8) {
        let (b, d) = (row / BLOCK_N, row % BLOCK_N);
        let idx = (b * self.k + col) * 32 + d % 32;
        let byte = &mut self.packed[idx];
        *byte = if d < 32 {
            (*byte & 0xF0) | code
        } else {
            (*byte & 0x0F) | (code << 4)
        };
    }

    fn set_scale_zero(&mut self, g: usize, row: usize, scale: f32, zero: f32) {
        let idx = (g * self.npad() + row) * 2;
        self.scales_zeros[idx] = f32_to_bf16(scale);
        self.scales_zeros[idx + 1] = f32_to_bf16(zero);
    }

    /// The stored code of output feature `row`, input feature `col`, read from the packed bytes.
    fn code(&self, row: usize, col: usize) -> u8 {
        let (b, d) = (row / BLOCK_N, row % BLOCK_N);
        let byte = self.packed[(b * self.k + col) * 32 + d % 32];
        if d < 32 {
            byte & 0x0F
        } else {
            byte >> 4
        }
    }

    fn scale_zero(&self, g: usize, row: usize) -> (f32, f32) {
        let idx = (g * self.npad() + row) * 2;
        (
            bf16_to_f32(self.scales_zeros[idx]),
            bf16_to_f32(self.scales_zeros[idx + 1]),
        )
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.n
    }
    /// Input features.
    pub fn k(&self) -> usize {
        self.k
    }
    /// Input features per scale.
    pub fn group(&self) -> usize {
        self.group
    }
    /// The quantisation grid.
    pub fn scheme(&self) -> Int4Scheme {
        self.scheme
    }
    /// `n` rounded up to a whole 64-column block.
    pub fn npad(&self) -> usize {
        self.n.div_ceil(BLOCK_N) * BLOCK_N
    }
    /// Number of 64-column blocks.
    pub fn blocks(&self) -> usize {
        self.n.div_ceil(BLOCK_N)
    }
    /// Number of scale rows, `ceil(k / group)`.
    pub fn groups(&self) -> usize {
        self.k.div_ceil(self.group)
    }
    /// The packed codes, uint8 `[npad/64][k][32]`.
    pub fn packed(&self) -> &[u8] {
        &self.packed
    }
    /// Scales and zeros, bf16 bits `[groups][npad][2]`.
    pub fn scales_zeros(&self) -> &[u16] {
        &self.scales_zeros
    }
    /// Bytes a GEMV reads: packed codes plus scales and zeros.
    pub fn bytes(&self) -> usize {
        self.packed.len() + self.scales_zeros.len() * 2
    }

    /// Reads the packed layout back into logical codes, scales and zeros (bit-exact inverse of the packer).
    pub fn to_logical(&self) -> Int4Logical {
        let mut codes = vec![0u8; self.n * self.k];
        let mut scales = vec![0.0f32; self.groups() * self.n];
        let mut zeros = vec![0.0f32; self.groups() * self.n];
        for r in 0..self.n {
            for c in 0..self.k {
                codes[r * self.k + c] = self.code(r, c);
            }
            for g in 0..self.groups() {
                (scales[g * self.n + r], zeros[g * self.n + r]) = self.scale_zero(g, r);
            }
        }
        Int4Logical {
            n: self.n,
            k: self.k,
            group: self.group,
            codes,
            scales,
            zeros,
        }
    }

    /// Dequantises one output row (one embedding row when the matrix is an embedding table) straight from the
    /// packed layout into `out` (`k` f32), without a second copy of the matrix.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        ensure_shape!(
            row < self.n,
            "int4 dequantize_row",
            "row {row} out of range (n = {})",
            self.n
        );
        ensure_shape!(
            out.len() == self.k,
            "int4 dequantize_row",
            "out has {} elements, expected k = {}",
            out.len(),
            self.k
        );
        for g in 0..self.groups() {
            let (s, z) = self.scale_zero(g, row);
            let (c0, c1) = (g * self.group, ((g + 1) * self.group).min(self.k));
            for (c, o) in out.iter_mut().enumerate().take(c1).skip(c0) {
                *o = (f32::from(self.code(row, c)) - 8.0) * s + z;
            }
        }
        Ok(())
    }

    /// Embedding gather from a packed int4 table: `out[i] = dequantize_row(ids[i])`, `out` is `[ids.len(), k]`.
    /// Every id is checked before anything is written.
    pub fn gather_rows(&self, ids: &[u32], out: &mut [f32]) -> Result<(), KernelError> {
        ensure_shape!(
            out.len() == checked_product("int4 gather_rows", "ids*k", &[ids.len(), self.k])?,
            "int4 gather_rows",
            "out has {} elements, expected ids * k = {} * {}",
            out.len(),
            ids.len(),
            self.k
        );
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.n) {
            return Err(KernelError::shape(
                "int4 gather_rows",
                format!("id {bad} out of range (rows = {})", self.n),
            ));
        }
        for (&id, o) in ids.iter().zip(out.chunks_exact_mut(self.k)) {
            self.dequantize_row(id as usize, o)?;
        }
        Ok(())
    }
}
