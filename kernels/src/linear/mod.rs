//! Weight kernels for the linear layers: `y = x W^T` with `W` stored int4 (tinygemm layout, W4A16 and W4A8),
//! FP8 e4m3 with 128x128 block scales, NVFP4, or bf16, on the CPU.
//!
//! Each format has a safe entry point that checks every size and then runs the C kernel of the fastest path this
//! CPU has (`*`), and a `*_with(isa, threads, ..)` form that tests and benchmarks use to drive a given path. Both
//! return the [`Isa`] that actually ran, so a caller (and every test) can see when a format falls back to another
//! path. Today every format has scalar, AVX2 and AVX-512 code; the AVX2 path has no tiled GEMM (each row is a GEMV).
//! W4A8 and the W4A16 and NVFP4 GEMVs also have AVX-512 + VBMI kernels, taken on [`Isa::Avx512`] where the CPU
//! has AVX512-VBMI; `w4a8_ext` / `w4a16_ext` / `nvfp4_ext` report them ([`Ran`]) and [`Ext::Base`] opts out of
//! them.
//! Threads split the output features (64-column blocks for int4, 64-row panels otherwise) through
//! [`crate::cpu::parallel_ranges`]; every output element is written exactly once.
//!
//! One activation row (decode) streams the weights once and decodes them in registers, aiming at the memory read
//! bandwidth (`benchmarks/cpu-avx512-2core.md` records how close each format gets); several rows (prefill)
//! dequantise a tile once and reuse it across rows. W4A16's several rows run, on a CPU with AVX512-VBMI, an
//! integer GEMM instead (int16 activations per group, `vpdpwssd`, [`GemmActs`]; `benchmarks/engine-cpu.md`,
//! "Prefill on an integer int4 GEMM"). Activations are f32 or bf16
//! (converted to f32 once per call, `m * k` elements, negligible next to the weights).

pub mod int4;

pub use int4::{Int4Scheme, Int4Weights};

use crate::cpu::{parallel_ranges, Isa, SharedMut};
use crate::error::checked_product;
use crate::formats::bf16_to_f32;
use crate::formats::{FP8_BLOCK, NVFP4_GROUP};
use crate::ops::fastest_path;
use crate::{ensure_shape, KernelError};
use std::borrow::Cow;

mod ffi {
    use crate::ops::c_kernels;

    c_kernels! {
        pub(crate) type W4a16Fn = fn(x: *const f32, m: usize, k: usize, packed: *const u8, sz: *const u16, npad: usize, group: usize, n: usize, b0: usize, b1: usize, y: *mut f32);
        ef_w4a16_scalar,
        #[cfg(edgefit_x86_kernels)] ef_w4a16_avx2,
        #[cfg(edgefit_x86_kernels)] ef_w4a16_avx512,
    }
    c_kernels! {
        pub(crate) type W4a8Fn = fn(xq: *const i8, xs: *const f32, xsum: *const i32, m: usize, k: usize, packed: *const u8, sz: *const u16, npad: usize, group: usize, n: usize, b0: usize, b1: usize, y: *mut f32);
        ef_w4a8_scalar,
        #[cfg(edgefit_x86_kernels)] ef_w4a8_avx2,
        #[cfg(edgefit_x86_kernels)] ef_w4a8_avx512,
        #[cfg(edgefit_x86_kernels)] ef_w4a8_avx512vbmi,
    }
    c_kernels! {
        pub(crate) type Fp8Fn = fn(x: *const f32, m: usize, k: usize, w: *const u8, sinv: *const f32, n: usize, r0: usize, r1: usize, y: *mut f32);
        ef_fp8_scalar,
        #[cfg(edgefit_x86_kernels)] ef_fp8_avx2,
        #[cfg(edgefit_x86_kernels)] ef_fp8_avx512,
    }
    c_kernels! {
        pub(crate) type Nvfp4Fn = fn(x: *const f32, xp: *const f32, m: usize, k: usize, w: *const u8, scales: *const u8, global: f32, n: usize, r0: usize, r1: usize, y: *mut f32);
        ef_nvfp4_scalar,
        #[cfg(edgefit_x86_kernels)] ef_nvfp4_avx2,
        #[cfg(edgefit_x86_kernels)] ef_nvfp4_avx512,
    }
    c_kernels! {
        pub(crate) type Bf16Fn = fn(x: *const f32, m: usize, k: usize, w: *const u16, n: usize, r0: usize, r1: usize, y: *mut f32);
        ef_bf16_scalar,
        #[cfg(edgefit_x86_kernels)] ef_bf16_avx2,
        #[cfg(edgefit_x86_kernels)] ef_bf16_avx512,
    }
    /// The integer int4 GEMM's activation encoder and kernel, generic over the code type (`i8` or `i16`).
    #[cfg(edgefit_x86_kernels)]
    pub(crate) type Int4GemmXqFn<Q> = unsafe extern "C" fn(
        x: *const f32,
        m: usize,
        k: usize,
        group: usize,
        r0: usize,
        r1: usize,
        xq: *mut Q,
        xs: *mut f32,
        xz: *mut f32,
    ) -> i32;
    #[cfg(edgefit_x86_kernels)]
    pub(crate) type Int4GemmFn<Q> = unsafe extern "C" fn(
        xq: *const Q,
        xs: *const f32,
        xz: *const f32,
        m: usize,
        k: usize,
        packed: *const u8,
        sz: *const u16,
        npad: usize,
        group: usize,
        n: usize,
        b0: usize,
        b1: usize,
        y: *mut f32,
    );
    c_kernels! {
        pub(crate) fn(x: *const f32, chunks: usize, xq: *mut i8, xnb: *mut i32, xs: *mut f32) -> i32;
        #[cfg(edgefit_x86_kernels)] ef_nvfp4_xq_avx512vbmi,
    }
    c_kernels! {
        pub(crate) fn(x: *const f32, xq: *const i8, xnb: *const i32, xs: *const f32, k: usize, w: *const u8, scales: *const u8, global: f32, r0: usize, r1: usize, y: *mut f32);
        #[cfg(edgefit_x86_kernels)] ef_nvfp4_avx512vbmi,
    }
    c_kernels! {
        pub(crate) fn(x: *const f32, k: usize, group: usize, xq: *mut i16, xs: *mut f32, xsum: *mut i32) -> i32;
        #[cfg(edgefit_x86_kernels)] ef_w4a16_xq_avx512,
    }
    c_kernels! {
        pub(crate) fn(xq: *const i16, xs: *const f32, xsum: *const i32, k: usize, packed: *const u8, sz: *const u16, npad: usize, group: usize, n: usize, b0: usize, b1: usize, y: *mut f32);
        #[cfg(edgefit_x86_kernels)] ef_w4a16_avx512vbmi,
    }
    c_kernels! {
        pub(crate) fn(x: *const f32, m: usize, k: usize, group: usize, r0: usize, r1: usize, xq: *mut i8, xs: *mut f32, xz: *mut f32) -> i32;
        #[cfg(edgefit_x86_kernels)] ef_int4_gemm_xq8_avx512,
    }
    c_kernels! {
        pub(crate) fn(x: *const f32, m: usize, k: usize, group: usize, r0: usize, r1: usize, xq: *mut i16, xs: *mut f32, xz: *mut f32) -> i32;
        #[cfg(edgefit_x86_kernels)] ef_int4_gemm_xq16_avx512,
    }
    c_kernels! {
        pub(crate) fn(xq: *const i8, xs: *const f32, xz: *const f32, m: usize, k: usize, packed: *const u8, sz: *const u16, npad: usize, group: usize, n: usize, b0: usize, b1: usize, y: *mut f32);
        #[cfg(edgefit_x86_kernels)] ef_int4_gemm_a8_avx512vbmi,
    }
    c_kernels! {
        pub(crate) fn(xq: *const i16, xs: *const f32, xz: *const f32, m: usize, k: usize, packed: *const u8, sz: *const u16, npad: usize, group: usize, n: usize, b0: usize, b1: usize, y: *mut f32);
        #[cfg(edgefit_x86_kernels)] ef_int4_gemm_a16_avx512vbmi,
    }
}

use ffi::{Bf16Fn, Fp8Fn, Nvfp4Fn, W4a16Fn, W4a8Fn};

/// The kernels of one format for each path; `None` means the path has no code of its own for that format and
/// the dispatcher runs (and reports) the scalar code instead. `avx512_vbmi` is a variant of the AVX-512 kernel
/// that also uses AVX512-VBMI byte permutes, taken on [`Isa::Avx512`] where the CPU has VBMI and the caller allows
/// it ([`Ext::Auto`]).
struct Table<F> {
    scalar: F,
    avx2: Option<F>,
    avx512: Option<F>,
    avx512_vbmi: Option<F>,
}

impl<F: Copy> Table<F> {
    /// The kernel for `isa` and the path it really is, or an error when this CPU cannot run `isa`.
    fn pick(&self, op: &'static str, isa: Isa, ext: Ext) -> Result<(Ran, F), KernelError> {
        if !isa.is_supported() {
            return Err(KernelError::IsaUnavailable { op, isa });
        }
        let plain = |isa| Ran { isa, vbmi: false };
        Ok(match isa {
            Isa::Avx512 => match (self.avx512, self.avx512_vbmi) {
                (Some(_), Some(f)) if ext == Ext::Auto && crate::cpu::has_avx512_vbmi() => {
                    (Ran::AVX512_VBMI, f)
                }
                (Some(f), _) => (plain(Isa::Avx512), f),
                (None, _) => (plain(Isa::Scalar), self.scalar),
            },
            Isa::Avx2 => self
                .avx2
                .map_or((plain(Isa::Scalar), self.scalar), |f| (plain(Isa::Avx2), f)),
            Isa::Scalar => (plain(Isa::Scalar), self.scalar),
        })
    }
}

/// Whether a call may use the AVX-512 kernels' VBMI variants (where the CPU has AVX512-VBMI and the format has
/// one). The plain entry points and `*_with` use [`Ext::Auto`]; `*_ext` with [`Ext::Base`] runs the AVX-512 base
/// kernel, so tests and benchmarks can drive (and compare) both on a VBMI machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ext {
    /// The fastest variant of the path this CPU runs.
    Auto,
    /// Only the instructions of the [`Isa`] itself (AVX-512 F/BW/VL/DQ/VNNI/BF16).
    Base,
}

/// The kernel a call ran: the path, and whether it was the path's VBMI variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ran {
    pub isa: Isa,
    pub vbmi: bool,
}

impl Ran {
    /// An AVX-512 kernel's VBMI variant.
    const AVX512_VBMI: Ran = Ran {
        isa: Isa::Avx512,
        vbmi: true,
    };
}

/// The activations in the encoded form that a format's integer GEMV reads (W4A16 and NVFP4, whose VBMI kernels take
/// x as integers rather than f32), where the call takes that kernel: the base pick `ran` is [`Isa::Avx512`], the
/// caller allows VBMI ([`Ext::Auto`]), the call is a GEMV that kernel handles (`gemv`: one activation row, plus
/// what the format adds), the CPU has AVX512-VBMI, and `encode` can hold the activations. `None` sends the call to
/// the base kernel, which handles every input.
#[cfg(edgefit_x86_kernels)]
fn vbmi_gemv_input<Q>(
    ran: Ran,
    ext: Ext,
    gemv: bool,
    encode: impl FnOnce() -> Option<Q>,
) -> Option<Q> {
    (ran.isa == Isa::Avx512 && ext == Ext::Auto && gemv && crate::cpu::has_avx512_vbmi())
        .then(encode)
        .flatten()
}

#[cfg(edgefit_x86_kernels)]
macro_rules! x86 {
    ($e:expr) => {
        Some($e)
    };
}
#[cfg(not(edgefit_x86_kernels))]
macro_rules! x86 {
    ($e:expr) => {
        None
    };
}

const W4A16: Table<W4a16Fn> = Table {
    scalar: ffi::ef_w4a16_scalar,
    avx2: x86!(ffi::ef_w4a16_avx2),
    avx512: x86!(ffi::ef_w4a16_avx512),
    avx512_vbmi: None,
};
const W4A8: Table<W4a8Fn> = Table {
    scalar: ffi::ef_w4a8_scalar,
    avx2: x86!(ffi::ef_w4a8_avx2),
    avx512: x86!(ffi::ef_w4a8_avx512),
    avx512_vbmi: x86!(ffi::ef_w4a8_avx512vbmi),
};
const FP8: Table<Fp8Fn> = Table {
    scalar: ffi::ef_fp8_scalar,
    avx2: x86!(ffi::ef_fp8_avx2),
    avx512: x86!(ffi::ef_fp8_avx512),
    avx512_vbmi: None,
};
const NVFP4: Table<Nvfp4Fn> = Table {
    scalar: ffi::ef_nvfp4_scalar,
    avx2: x86!(ffi::ef_nvfp4_avx2),
    avx512: x86!(ffi::ef_nvfp4_avx512),
    avx512_vbmi: None,
};
const BF16: Table<Bf16Fn> = Table {
    scalar: ffi::ef_bf16_scalar,
    avx2: x86!(ffi::ef_bf16_avx2),
    avx512: x86!(ffi::ef_bf16_avx512),
    avx512_vbmi: None,
};

/// Activations of a linear call: row-major `[m, k]`, f32 or bf16 bits.
#[derive(Debug, Clone, Copy)]
pub enum Activations<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
}

/// `From` a slice or a `Vec` of each element type into its [`Activations`] variant.
macro_rules! activations_from {
    ($($variant:ident: $ty:ty),*) => {$(
        impl<'a> From<&'a [$ty]> for Activations<'a> {
            fn from(x: &'a [$ty]) -> Self {
                Activations::$variant(x)
            }
        }
        impl<'a> From<&'a Vec<$ty>> for Activations<'a> {
            fn from(x: &'a Vec<$ty>) -> Self {
                Activations::$variant(x)
            }
        }
    )*};
}
activations_from!(F32: f32, Bf16: u16);

impl<'a> Activations<'a> {
    fn len(&self) -> usize {
        match self {
            Activations::F32(x) => x.len(),
            Activations::Bf16(x) => x.len(),
        }
    }

    fn to_f32(self) -> Cow<'a, [f32]> {
        match self {
            Activations::F32(x) => Cow::Borrowed(x),
            Activations::Bf16(x) => Cow::Owned(x.iter().map(|&b| bf16_to_f32(b)).collect()),
        }
    }
}

/// Checks the activation and output sizes shared by every format.
fn check_io(
    op: &'static str,
    x: &Activations<'_>,
    m: usize,
    n: usize,
    k: usize,
    y: &[f32],
) -> Result<(), KernelError> {
    ensure_shape!(m > 0, op, "m must be positive");
    let (mk, mn) = (
        checked_product(op, "m*k", &[m, k])?,
        checked_product(op, "m*n", &[m, n])?,
    );
    ensure_shape!(
        x.len() == mk,
        op,
        "x has {} elements, expected m*k = {m}*{k}",
        x.len()
    );
    ensure_shape!(
        y.len() == mn,
        op,
        "y has {} elements, expected m*n = {m}*{n}",
        y.len()
    );
    Ok(())
}

/// Checks the weight dimensions shared by every row-major format.
pub(crate) fn check_nk(op: &'static str, n: usize, k: usize) -> Result<(), KernelError> {
    ensure_shape!(
        n > 0 && k > 0,
        op,
        "n and k must be positive (n = {n}, k = {k})"
    );
    Ok(())
}

/// Runs `kernel(r0, r1, y)` on every range `r0..r1` of `0..units` that [`parallel_ranges`] hands to `threads`
/// threads (`align` units at a time), with `y` the start of the output. Each kernel call must write only the
/// outputs of its own range; the ranges are disjoint and cover `0..units`, so every output is written once.
fn over_ranges<K>(y: &mut [f32], units: usize, align: usize, threads: usize, kernel: K)
where
    K: Fn(usize, usize, *mut f32) + Sync,
{
    let out = SharedMut(y.as_mut_ptr());
    parallel_ranges(units, align, threads, |r0, r1| kernel(r0, r1, out.get()));
}

/// Defines a format's `name_with(isa, threads, x, m, w, y)` as its `_ext` form with [`Ext::Auto`], returning only
/// the path that ran.
macro_rules! auto_ext {
    ($(#[$m:meta])* pub fn $name:ident(w: &$w:ty) = $ext:ident;) => {
        $(#[$m])*
        pub fn $name<'a>(
            isa: Isa,
            threads: usize,
            x: impl Into<Activations<'a>>,
            m: usize,
            w: &$w,
            y: &mut [f32],
        ) -> Result<Isa, KernelError> {
            $ext(isa, Ext::Auto, threads, x, m, w, y).map(|r| r.isa)
        }
    };
}

fastest_path! {
    /// W4A16 over packed int4 weights with the detected path and all cores.
    pub fn w4a16<'a>(x: impl Into<Activations<'a>>, m: usize, w: &Int4Weights, y: &mut [f32]) -> Result<Isa, KernelError> = w4a16_with;
}

auto_ext! {
    /// W4A16 on a given path and thread count; returns the path that ran.
    pub fn w4a16_with(w: &Int4Weights) = w4a16_ext;
}

/// W4A16 on a given path, variant choice and thread count; returns the kernel that ran. On [`Isa::Avx512`] with
/// [`Ext::Auto`] and a CPU with AVX512-VBMI, the call runs on integer dot products: one activation row (`m == 1`)
/// on the GEMV (x as int16 per group with a power-of-two scale, `vpermb` + `vpdpwssd`, see `csrc/linear_avx512.c`),
/// several rows on the integer GEMM with the same int16 encoding ([`GemmActs::Int16`], `csrc/int4_gemm_avx512.c`).
/// Their results match the f32 kernel's up to rounding plus the representation of x: each x is held to within
/// max |x| / 32767 of its group (bf16 activations exactly, unless a group spans more than 2^7 in magnitude).
/// Activations with a non-finite value, or a group with 0 < max |x| < ~3.9e-34, take the f32 kernels (the GEMV,
/// or the tiled GEMM for `m > 1`); the returned [`Ran`] says which ran.
pub fn w4a16_ext<'a>(
    isa: Isa,
    ext: Ext,
    threads: usize,
    x: impl Into<Activations<'a>>,
    m: usize,
    w: &Int4Weights,
    y: &mut [f32],
) -> Result<Ran, KernelError> {
    w4a16_gemm_ext(isa, ext, GemmActs::Int16, threads, x, m, w, y)
}

/// How the integer int4 GEMM (`m > 1`) holds the activations: per row and weight group, as integers times a scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmActs {
    /// int16 with a power-of-two scale at or above max |x_g| / 32767: the W4A16 GEMV's encoding, so prefill and
    /// decode compute the same function; `vpdpwssd`, 32 multiply-adds per instruction. W4A16's default.
    Int16,
    /// int8, `s = max |x_g| / 127`, `X = round(x / s)`: llama.cpp's Q8_0 class of activation precision (its block
    /// is 32, here the weight group), so no longer W4A16's numerics; `vpdpbusd`, 64 multiply-adds per
    /// instruction. Only through [`w4a16_gemm_ext`], never chosen by [`w4a16`].
    Int8,
}

/// W4A16 weights with the integer GEMM's activation encoding chosen by the caller (`acts`); otherwise as
/// [`w4a16_ext`] (`m == 1`, a path without the integer GEMM, or activations it cannot hold run what
/// [`w4a16_ext`] runs). With [`GemmActs::Int8`] each x of a group is held to within max |x_g| / 254.
#[allow(clippy::too_many_arguments)]
pub fn w4a16_gemm_ext<'a>(
    isa: Isa,
    ext: Ext,
    acts: GemmActs,
    threads: usize,
    x: impl Into<Activations<'a>>,
    m: usize,
    w: &Int4Weights,
    y: &mut [f32],
) -> Result<Ran, KernelError> {
    const OP: &str = "w4a16";
    let x = x.into();
    check_io(OP, &x, m, w.n(), w.k(), y)?;
    // `W4A16` has no VBMI entry, so `ran` reports `f`; the integer GEMV (its own activation encoding) is chosen in
    // `w4a16_base`.
    let (ran, f) = W4A16.pick(OP, isa, ext)?;
    let x = x.to_f32();
    #[cfg(edgefit_x86_kernels)]
    if m > 1
        && vbmi_gemv_input(ran, ext, true, || Some(())).is_some()
        && int4_gemm(acts, threads, &x, m, w, y)
    {
        return Ok(Ran::AVX512_VBMI);
    }
    #[cfg(not(edgefit_x86_kernels))]
    let _ = acts;
    w4a16_base(ran, f, ext, threads, &x, m, w, y)
}

/// Calls the int4 kernel `f` with its own activation arguments (`acts`), then the arguments every int4 kernel
/// ends with: the weights' `k, packed, scales_zeros, npad, group, n` (`w`, an [`Int4Weights`]), the block range
/// `b0..b1` and the output `y`.
macro_rules! int4_kernel {
    ($($f:ident)::+($($acts:expr),*), $w:expr, $b0:expr, $b1:expr, $y:expr) => {
        $($f)::+(
            $($acts,)*
            $w.k(),
            $w.packed().as_ptr(),
            $w.scales_zeros().as_ptr(),
            $w.npad(),
            $w.group(),
            $w.n(),
            $b0,
            $b1,
            $y,
        )
    };
}

/// The integer GEMV (`m == 1` where it applies) or the kernel `pick` chose (the f32 GEMV / tiled GEMM).
#[allow(clippy::too_many_arguments)]
fn w4a16_base(
    ran: Ran,
    f: W4a16Fn,
    ext: Ext,
    threads: usize,
    x: &[f32],
    m: usize,
    w: &Int4Weights,
    y: &mut [f32],
) -> Result<Ran, KernelError> {
    #[cfg(edgefit_x86_kernels)]
    if let Some(xq) = vbmi_gemv_input(ran, ext, m == 1, || W4a16Xq::new(x, w.group())) {
        over_ranges(y, w.blocks(), INT4_BLOCK_ALIGN, threads, |b0, b1, y| {
            // SAFETY: xq.q holds k rounded up to even int16, xq.xs and xq.sum ceil(k/group) elements (built from
            // x just above); the packed buffer and scales have the sizes `Int4Weights` guarantees for (n, k,
            // group), y is [n] (checked); b0..b1 are block indices below `blocks()` and this thread writes only
            // their columns. The CPU reports avx512vbmi, which the kernel's target attribute adds to the AVX-512
            // set `Isa::Avx512` guarantees.
            unsafe {
                int4_kernel!(
                    ffi::ef_w4a16_avx512vbmi(xq.q.as_ptr(), xq.xs.as_ptr(), xq.sum.as_ptr()),
                    w,
                    b0,
                    b1,
                    y
                )
            }
        });
        return Ok(Ran::AVX512_VBMI);
    }
    over_ranges(y, w.blocks(), INT4_BLOCK_ALIGN, threads, |b0, b1, y| {
        // SAFETY: x is [m, k], the packed buffer and scales have the sizes `Int4Weights` guarantees for (n, k,
        // group), y is [m, n] (all checked above); b0..b1 are block indices below `blocks()`, and this thread
        // writes only columns 64*b0..min(64*b1, n), disjoint from every other thread's.
        unsafe { int4_kernel!(f(x.as_ptr(), m), w, b0, b1, y) }
    });
    Ok(ran)
}

/// One activation row as the W4A16 integer kernel reads it: int16 codes (`k` rounded up to even, the pad 0), and
/// per group the power-of-two scale and the sum of the codes.
#[cfg(edgefit_x86_kernels)]
struct W4a16Xq {
    q: Vec<i16>,
    xs: Vec<f32>,
    sum: Vec<i32>,
}

#[cfg(edgefit_x86_kernels)]
impl W4a16Xq {
    /// `None` when a group cannot be held this way (a non-finite value, or 0 < max |x| < ~3.9e-34, where the
    /// scale would be an f32 subnormal): the caller then runs the f32 kernel, which handles every input. Built
    /// once per call, on the calling thread, and shared by every block and thread.
    fn new(x: &[f32], group: usize) -> Option<Self> {
        let k = x.len();
        let groups = k.div_ceil(group);
        let mut q = vec![0i16; k + (k & 1)];
        let mut xs = vec![0f32; groups];
        let mut sum = vec![0i32; groups];
        // SAFETY: x holds k elements, q k rounded up to even, xs and sum ceil(k/group); the caller checked
        // Isa::Avx512, the encoder's instruction set.
        let ok = unsafe {
            ffi::ef_w4a16_xq_avx512(
                x.as_ptr(),
                k,
                group,
                q.as_mut_ptr(),
                xs.as_mut_ptr(),
                sum.as_mut_ptr(),
            )
        };
        (ok == 1).then_some(Self { q, xs, sum })
    }
}

/// Activation rows per chunk of the integer GEMM's encoded x (`EF_GEMM_KC8` / `EF_GEMM_KC16` in
/// `csrc/linear_common.h`): 256 bytes of every row per chunk.
#[cfg(edgefit_x86_kernels)]
const GEMM_KC8: usize = 256;
#[cfg(edgefit_x86_kernels)]
const GEMM_KC16: usize = 128;

#[cfg(edgefit_x86_kernels)]
thread_local! {
    /// The integer GEMM's encoded activations, kept per calling thread and grown as needed: a prefill call encodes
    /// up to m * k * 2 bytes (6 MiB for 512 x 6144), which a fresh allocation would fault in page by page on every
    /// call. As u64 for 8-byte alignment; the int8 and int16 views are carved from it.
    static GEMM_XQ: std::cell::RefCell<(Vec<u64>, Vec<f32>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new()))
    };
}

/// The integer int4 GEMM (`csrc/int4_gemm_avx512.c`): encodes x (`acts`, rows split over the threads), then runs
/// the GEMM over the blocks. The caller checked the sizes, `Isa::Avx512` and AVX512-VBMI. Returns false, having
/// written nothing to y, when the encoder cannot hold x (a non-finite value, or an int16 group scale below the
/// smallest normal f32); the caller then runs the f32 kernel.
#[cfg(edgefit_x86_kernels)]
fn int4_gemm(
    acts: GemmActs,
    threads: usize,
    x: &[f32],
    m: usize,
    w: &Int4Weights,
    y: &mut [f32],
) -> bool {
    match acts {
        GemmActs::Int8 => int4_gemm_as::<i8>(
            GEMM_KC8,
            ffi::ef_int4_gemm_xq8_avx512,
            ffi::ef_int4_gemm_a8_avx512vbmi,
            threads,
            x,
            m,
            w,
            y,
        ),
        GemmActs::Int16 => int4_gemm_as::<i16>(
            GEMM_KC16,
            ffi::ef_int4_gemm_xq16_avx512,
            ffi::ef_int4_gemm_a16_avx512vbmi,
            threads,
            x,
            m,
            w,
            y,
        ),
    }
}

/// [`int4_gemm`] with activation codes of type `Q`: `kc` rows per 256-byte chunk, `encode` and `gemm` the
/// encoder and GEMM kernel of that code type.
#[cfg(edgefit_x86_kernels)]
#[allow(clippy::too_many_arguments)]
fn int4_gemm_as<Q>(
    kc: usize,
    encode: ffi::Int4GemmXqFn<Q>,
    gemm: ffi::Int4GemmFn<Q>,
    threads: usize,
    x: &[f32],
    m: usize,
    w: &Int4Weights,
    y: &mut [f32],
) -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (k, group) = (w.k(), w.group());
    let groups = w.groups();
    // 256 bytes per row and chunk; these sizes are below the m * k * 4 bytes of x, so they do not overflow.
    let xq_bytes = k.div_ceil(kc) * m * 256;
    let mut run = |xq: &mut [u64], sc: &mut [f32]| -> bool {
        let (xs, xz) = sc.split_at_mut(m * groups);
        let ok = AtomicBool::new(true);
        let (qp, sp, zp) = (
            SharedMut(xq.as_mut_ptr().cast::<u8>()),
            SharedMut(xs.as_mut_ptr()),
            SharedMut(xz.as_mut_ptr()),
        );
        parallel_ranges(m, 1, threads, |r0, r1| {
            // SAFETY: x is [m, k] (checked by the caller); xq holds ceil(k/KC) * m * 256 bytes and xs, xz m *
            // groups f32 (sized above), the layout the encoders write; this range writes only rows r0..r1 of them
            // (their 256-byte pieces and their [groups] rows), disjoint from every other range. Isa::Avx512 (the
            // encoders' instruction set) was checked by the caller.
            let r = unsafe {
                encode(
                    x.as_ptr(),
                    m,
                    k,
                    group,
                    r0,
                    r1,
                    qp.get().cast::<Q>(),
                    sp.get(),
                    zp.get(),
                )
            };
            if r != 1 {
                ok.store(false, Ordering::Relaxed);
            }
        });
        if !ok.into_inner() {
            return false;
        }
        let (xq, xs, xz): (&[u64], &[f32], &[f32]) = (xq, xs, xz);
        over_ranges(y, w.blocks(), INT4_BLOCK_ALIGN, threads, |b0, b1, y| {
            // SAFETY: xq, xs, xz were filled just above for all m rows (every range returned 1); the packed
            // buffer and scales have the sizes `Int4Weights` guarantees for (n, k, group); y is [m, n] (checked
            // by the caller); b0..b1 are block indices below `blocks()` and this thread writes only their
            // columns. The CPU reports avx512vbmi (checked by the caller), which the kernels' target attribute
            // adds to the AVX-512 set `Isa::Avx512` guarantees.
            unsafe {
                int4_kernel!(
                    gemm(xq.as_ptr().cast::<Q>(), xs.as_ptr(), xz.as_ptr(), m),
                    w,
                    b0,
                    b1,
                    y
                )
            }
        });
        true
    };
    let words = xq_bytes.div_ceil(8);
    GEMM_XQ.with(|cell| match cell.try_borrow_mut() {
        Ok(mut bufs) => {
            let (xq, sc) = &mut *bufs;
            if xq.len() < words {
                xq.resize(words, 0);
            }
            if sc.len() < 2 * m * groups {
                sc.resize(2 * m * groups, 0.0);
            }
            run(&mut xq[..words], &mut sc[..2 * m * groups])
        }
        // A call nested in another on this thread (a kernel called from inside a parallel range) gets its own.
        Err(_) => run(&mut vec![0u64; words], &mut vec![0.0f32; 2 * m * groups]),
    })
}

/// 64-column blocks per thread unit for the int4 kernels: the AVX-512 GEMV walks four blocks side by side (four
/// weight streams in flight: 13.4-13.7 GB/s from DRAM on one core of the development VM against 10.0 for one block
/// at a time, same in-cache speed), so threads get whole groups of four where there are enough blocks.
const INT4_BLOCK_ALIGN: usize = 4;

/// Per-row int8 activations for W4A8: codes, row scales and per-group code sums.
struct QuantizedRows {
    q: Vec<i8>,
    scales: Vec<f32>,
    group_sums: Vec<i32>,
}

/// W4A8's own activation quantiser (its tests compare it with `reference::linear::quantize_rows_int8`, so the
/// kernel path must not call that): per row, `scale = amax / 127` and `q = round(x / scale)` with ties away from
/// zero (`roundf`, as the C kernels round), clamped to +-127; a zero row gets scale 0 and zero codes. The group
/// sums let the kernels fold in the weights' zero point once per group.
fn quantize_rows(x: &[f32], m: usize, k: usize, group: usize) -> QuantizedRows {
    let groups = k.div_ceil(group);
    let mut q = vec![0i8; m * k];
    let mut scales = vec![0.0f32; m];
    let mut group_sums = vec![0i32; m * groups];
    for i in 0..m {
        let row = &x[i * k..(i + 1) * k];
        let qrow = &mut q[i * k..(i + 1) * k];
        let amax = row.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        scales[i] = if amax > 0.0 { amax / 127.0 } else { 0.0 };
        for (dst, &v) in qrow.iter_mut().zip(row) {
            *dst = (v * inv).round().clamp(-127.0, 127.0) as i8;
        }
        for (g, s) in group_sums[i * groups..(i + 1) * groups]
            .iter_mut()
            .enumerate()
        {
            let part = &qrow[g * group..((g + 1) * group).min(k)];
            *s = part.iter().map(|&v| i32::from(v)).sum();
        }
    }
    QuantizedRows {
        q,
        scales,
        group_sums,
    }
}

fastest_path! {
    /// W4A8 (symmetric int4 weights, int8 activations quantised per row) with the detected path and all cores.
    pub fn w4a8<'a>(x: impl Into<Activations<'a>>, m: usize, w: &Int4Weights, y: &mut [f32]) -> Result<Isa, KernelError> = w4a8_with;
}

auto_ext! {
    /// W4A8 on a given path and thread count; returns the path that ran. The weights must be on the symmetric grid.
    pub fn w4a8_with(w: &Int4Weights) = w4a8_ext;
}

/// W4A8 on a given path, variant choice and thread count; returns the kernel that ran. On [`Isa::Avx512`] with
/// [`Ext::Auto`] a CPU with AVX512-VBMI runs the VBMI kernel (`vpermt2b` builds the `vpdpbusd` operands, four
/// 64-column blocks side by side; bit-identical results to the base kernel, see `csrc/linear_avx512.c`).
pub fn w4a8_ext<'a>(
    isa: Isa,
    ext: Ext,
    threads: usize,
    x: impl Into<Activations<'a>>,
    m: usize,
    w: &Int4Weights,
    y: &mut [f32],
) -> Result<Ran, KernelError> {
    const OP: &str = "w4a8";
    let x = x.into();
    check_io(OP, &x, m, w.n(), w.k(), y)?;
    ensure_shape!(
        w.scheme() == Int4Scheme::Symmetric,
        OP,
        "W4A8 needs weights quantised on the symmetric grid (zero point 8); these are asymmetric"
    );
    let (ran, f) = W4A8.pick(OP, isa, ext)?;
    let xf = x.to_f32();
    let qr = quantize_rows(&xf, m, w.k(), w.group());
    over_ranges(y, w.blocks(), INT4_BLOCK_ALIGN, threads, |b0, b1, y| {
        // SAFETY: xq is [m, k], xs [m], xsum [m, ceil(k/group)] (built just above), the weights are consistent by
        // construction of `Int4Weights`, y is [m, n]; this thread writes only the columns of blocks b0..b1. `pick`
        // returned a kernel whose instructions this CPU has (the VBMI variant only where avx512vbmi is reported).
        unsafe {
            int4_kernel!(
                f(qr.q.as_ptr(), qr.scales.as_ptr(), qr.group_sums.as_ptr(), m),
                w,
                b0,
                b1,
                y
            )
        }
    });
    Ok(ran)
}

/// FP8 e4m3 weights `[n, k]` with f32 `weight_scale_inv` `[ceil(n/128), ceil(k/128)]`, borrowed from wherever
/// the checkpoint was loaded. Sizes are checked once here.
#[derive(Debug, Clone, Copy)]
pub struct Fp8Weights<'a> {
    w: &'a [u8],
    scale_inv: &'a [f32],
    n: usize,
    k: usize,
}

impl<'a> Fp8Weights<'a> {
    pub fn new(w: &'a [u8], scale_inv: &'a [f32], n: usize, k: usize) -> Result<Self, KernelError> {
        const OP: &str = "fp8 weights";
        check_nk(OP, n, k)?;
        ensure_shape!(
            w.len() == checked_product(OP, "n*k", &[n, k])?,
            OP,
            "weight has {} bytes, expected n*k = {n}*{k}",
            w.len()
        );
        let want = checked_product(
            OP,
            "ceil(n/128)*ceil(k/128)",
            &[n.div_ceil(FP8_BLOCK), k.div_ceil(FP8_BLOCK)],
        )?;
        ensure_shape!(
            scale_inv.len() == want,
            OP,
            "weight_scale_inv has {} elements, expected ceil(n/128)*ceil(k/128) = {want}",
            scale_inv.len()
        );
        Ok(Self { w, scale_inv, n, k })
    }
    /// Bytes a GEMV reads (codes plus scales).
    pub fn bytes(&self) -> usize {
        self.w.len() + self.scale_inv.len() * 4
    }
}

/// Rows per thread unit for the row-major formats: the GEMM's 64-row panel, so threads never split a panel.
const ROW_ALIGN: usize = 64;

fastest_path! {
    /// FP8 block linear with the detected path and all cores.
    pub fn fp8<'a>(x: impl Into<Activations<'a>>, m: usize, w: &Fp8Weights<'_>, y: &mut [f32]) -> Result<Isa, KernelError> = fp8_with;
}

/// FP8 block linear on a given path and thread count; returns the path that ran.
pub fn fp8_with<'a>(
    isa: Isa,
    threads: usize,
    x: impl Into<Activations<'a>>,
    m: usize,
    w: &Fp8Weights<'_>,
    y: &mut [f32],
) -> Result<Isa, KernelError> {
    const OP: &str = "fp8";
    let x = x.into();
    check_io(OP, &x, m, w.n, w.k, y)?;
    let (Ran { isa: ran, .. }, f) = FP8.pick(OP, isa, Ext::Auto)?;
    let x = x.to_f32();
    over_ranges(y, w.n, ROW_ALIGN, threads, |r0, r1, y| {
        // SAFETY: x [m, k], w [n, k], scale_inv [ceil(n/128), ceil(k/128)] and y [m, n] were checked; r0..r1 is
        // within 0..n and disjoint from the other threads' ranges, and the kernel writes only those columns.
        unsafe {
            f(
                x.as_ptr(),
                m,
                w.k,
                w.w.as_ptr(),
                w.scale_inv.as_ptr(),
                w.n,
                r0,
                r1,
                y,
            )
        }
    });
    Ok(ran)
}

/// NVFP4 weights (modelopt): codes `[n, k/2]` (even element in the low nibble), e4m3 scales `[n, k/16]`, and
/// the f32 `weight_scale_2`. `k` must be a multiple of 16, as the format requires.
#[derive(Debug, Clone, Copy)]
pub struct Nvfp4Weights<'a> {
    w: &'a [u8],
    scales: &'a [u8],
    global: f32,
    n: usize,
    k: usize,
}

impl<'a> Nvfp4Weights<'a> {
    pub fn new(
        w: &'a [u8],
        scales: &'a [u8],
        global: f32,
        n: usize,
        k: usize,
    ) -> Result<Self, KernelError> {
        const OP: &str = "nvfp4 weights";
        check_nk(OP, n, k)?;
        ensure_shape!(
            k.is_multiple_of(NVFP4_GROUP),
            OP,
            "k = {k} is not a multiple of the 16-element scale group"
        );
        // k is a multiple of 16, so these products are exact and never larger than n*k.
        let codes = checked_product(OP, "n*k/2", &[n, k / 2])?;
        let groups = checked_product(OP, "n*k/16", &[n, k / NVFP4_GROUP])?;
        ensure_shape!(
            w.len() == codes,
            OP,
            "weight has {} bytes, expected n*k/2 = {codes}",
            w.len()
        );
        ensure_shape!(
            scales.len() == groups,
            OP,
            "weight_scale has {} bytes, expected n*k/16 = {groups}",
            scales.len()
        );
        ensure_shape!(
            global.is_finite(),
            OP,
            "weight_scale_2 must be finite, got {global}"
        );
        Ok(Self {
            w,
            scales,
            global,
            n,
            k,
        })
    }
    /// Bytes a GEMV reads (codes plus scales).
    pub fn bytes(&self) -> usize {
        self.w.len() + self.scales.len()
    }
}

/// Activations reordered for the AVX-512 NVFP4 GEMV: inside every full 128-element chunk, `xp[16 t + j] =
/// x[8 j + t]` (the order in which the kernel pulls nibbles out of 32-bit lanes); the tail stays in order.
fn nvfp4_permute(x: &[f32], k: usize) -> Vec<f32> {
    let mut xp = x.to_vec();
    for (dst, src) in xp.chunks_exact_mut(k).zip(x.chunks_exact(k)) {
        for c in 0..k / 128 {
            for t in 0..8 {
                for j in 0..16 {
                    dst[c * 128 + 16 * t + j] = src[c * 128 + 8 * j + t];
                }
            }
        }
    }
    xp
}

/// One activation row in the integer form of the NVFP4 VBMI GEMV (`ef_nvfp4_avx512vbmi` in
/// `csrc/linear_avx512.c`): per 16-element scale group `g`, `s_g` is the power of two at or above
/// `max|x| / (127 * 2^16)` and `X = round(x / s_g)`
/// split into three signed bytes `X = h 2^16 + m 2^8 + l`, laid out per 128-element chunk as 384 bytes `[h even,
/// h odd, m even, m odd, l even, l odd]` (64 bytes each; "even" byte `j` is element `2j`, the low nibble of code
/// byte `j`); `xs[16 c + i]` is `s_g` of the group of dword lane `i` (`g = 8 c + i / 2`), and
/// `xnb[16 c + i] = -12 * sum(X[8i..8i+8])` removes the `+12` bias of the unsigned codes. Each element is held to
/// `s_g / 2 <= 2^-23 max|x|` of its group (bf16 activations exactly). Only full chunks are encoded; the kernel reads the tail groups from
/// x itself.
#[cfg(edgefit_x86_kernels)]
struct Nvfp4Xq {
    q: Vec<i8>,
    nb: Vec<i32>,
    xs: Vec<f32>,
}

#[cfg(edgefit_x86_kernels)]
impl Nvfp4Xq {
    /// `None` when a group cannot be represented this way (a non-finite value, or a max |x| so small that its
    /// scale would be an f32 subnormal, below about 1e-31): the caller then runs the f32 kernel, which handles
    /// every input. Only on a CPU with AVX512-VBMI (the encoder is AVX-512 C, `ef_nvfp4_xq_avx512vbmi`).
    fn new(x: &[f32]) -> Option<Self> {
        let chunks = x.len() / 128;
        let mut q = vec![0i8; chunks * 384];
        let mut nb = vec![0i32; chunks * 16];
        let mut xs = vec![0f32; chunks * 16];
        // SAFETY: x holds chunks * 128 elements, q chunks * 384 bytes, nb and xs chunks * 16 elements; the caller
        // checked avx512vbmi (and Isa::Avx512, which the rest of the encoder's instructions need).
        let ok = unsafe {
            ffi::ef_nvfp4_xq_avx512vbmi(
                x.as_ptr(),
                chunks,
                q.as_mut_ptr(),
                nb.as_mut_ptr(),
                xs.as_mut_ptr(),
            )
        };
        (ok == 1).then_some(Self { q, nb, xs })
    }
}

fastest_path! {
    /// NVFP4 linear with the detected path and all cores.
    pub fn nvfp4<'a>(x: impl Into<Activations<'a>>, m: usize, w: &Nvfp4Weights<'_>, y: &mut [f32]) -> Result<Isa, KernelError> = nvfp4_with;
}

auto_ext! {
    /// NVFP4 linear on a given path and thread count; returns the path that ran.
    pub fn nvfp4_with(w: &Nvfp4Weights<'_>) = nvfp4_ext;
}

/// NVFP4 linear on a given path, variant choice and thread count; returns the kernel that ran. On [`Isa::Avx512`]
/// with [`Ext::Auto`], a CPU with AVX512-VBMI and one activation row (`m == 1`), the GEMV runs on integer dot
/// products (`vpermb` decodes the codes, `vpdpbusd` against x as three int8 limbs per 128-element chunk, see
/// `csrc/linear_avx512.c`); its results match the f32 kernel's up to rounding (each x is held to 2^-23 of the
/// max |x| of its 16-element group, where f32 holds it to 2^-24 |x|; bf16 activations are held exactly). Activations with a non-finite value or a
/// group with 0 < max |x| < ~1e-31 take the f32 kernel, and so does `k < 128`; the returned [`Ran`] says which
/// ran.
pub fn nvfp4_ext<'a>(
    isa: Isa,
    ext: Ext,
    threads: usize,
    x: impl Into<Activations<'a>>,
    m: usize,
    w: &Nvfp4Weights<'_>,
    y: &mut [f32],
) -> Result<Ran, KernelError> {
    const OP: &str = "nvfp4";
    let x = x.into();
    check_io(OP, &x, m, w.n, w.k, y)?;
    // `NVFP4` has no VBMI entry, so `ran` reports `f`; the integer GEMV (its own activation encoding) is chosen
    // below.
    let (ran, f) = NVFP4.pick(OP, isa, ext)?;
    let x = x.to_f32();
    #[cfg(edgefit_x86_kernels)]
    if let Some(xq) = vbmi_gemv_input(ran, ext, m == 1 && w.k >= 128, || Nvfp4Xq::new(&x)) {
        over_ranges(y, w.n, ROW_ALIGN, threads, |r0, r1, y| {
            // SAFETY: x is [k]; xq.q [k/128 * 384], xq.nb and xq.xs [k/128 * 16] (built from x just above); w [n,
            // k/2], scales [n, k/16] with k a multiple of 16, y [n] (checked); r0..r1 is within 0..n and disjoint
            // from the other threads'. The CPU reports avx512vbmi, which the kernel's target attribute adds to the
            // AVX-512 set `Isa::Avx512` guarantees.
            unsafe {
                ffi::ef_nvfp4_avx512vbmi(
                    x.as_ptr(),
                    xq.q.as_ptr(),
                    xq.nb.as_ptr(),
                    xq.xs.as_ptr(),
                    w.k,
                    w.w.as_ptr(),
                    w.scales.as_ptr(),
                    w.global,
                    r0,
                    r1,
                    y,
                )
            }
        });
        return Ok(Ran::AVX512_VBMI);
    }
    let xp: Cow<'_, [f32]> = if ran.isa == Isa::Avx512 && m == 1 {
        Cow::Owned(nvfp4_permute(&x, w.k))
    } else {
        Cow::Borrowed(&x)
    };
    over_ranges(y, w.n, ROW_ALIGN, threads, |r0, r1, y| {
        // SAFETY: x and xp are [m, k], w [n, k/2], scales [n, k/16] with k a multiple of 16, y [m, n] (checked);
        // r0..r1 is within 0..n and disjoint from the other threads'.
        unsafe {
            f(
                x.as_ptr(),
                xp.as_ptr(),
                m,
                w.k,
                w.w.as_ptr(),
                w.scales.as_ptr(),
                w.global,
                w.n,
                r0,
                r1,
                y,
            )
        }
    });
    Ok(ran)
}

/// bf16 weights `[n, k]` (bits).
#[derive(Debug, Clone, Copy)]
pub struct Bf16Weights<'a> {
    w: &'a [u16],
    n: usize,
    k: usize,
}

impl<'a> Bf16Weights<'a> {
    pub fn new(w: &'a [u16], n: usize, k: usize) -> Result<Self, KernelError> {
        const OP: &str = "bf16 weights";
        check_nk(OP, n, k)?;
        ensure_shape!(
            w.len() == checked_product(OP, "n*k", &[n, k])?,
            OP,
            "weight has {} elements, expected n*k = {n}*{k}",
            w.len()
        );
        Ok(Self { w, n, k })
    }
    /// Bytes a GEMV reads.
    pub fn bytes(&self) -> usize {
        self.w.len() * 2
    }
}

fastest_path! {
    /// bf16 linear with the detected path and all cores.
    pub fn bf16<'a>(x: impl Into<Activations<'a>>, m: usize, w: &Bf16Weights<'_>, y: &mut [f32]) -> Result<Isa, KernelError> = bf16_with;
}

/// bf16 linear on a given path and thread count; returns the path that ran.
pub fn bf16_with<'a>(
    isa: Isa,
    threads: usize,
    x: impl Into<Activations<'a>>,
    m: usize,
    w: &Bf16Weights<'_>,
    y: &mut [f32],
) -> Result<Isa, KernelError> {
    const OP: &str = "bf16";
    let x = x.into();
    check_io(OP, &x, m, w.n, w.k, y)?;
    let (Ran { isa: ran, .. }, f) = BF16.pick(OP, isa, Ext::Auto)?;
    let x = x.to_f32();
    over_ranges(y, w.n, ROW_ALIGN, threads, |r0, r1, y| {
        // SAFETY: x [m, k], w [n, k] and y [m, n] were checked; r0..r1 is within 0..n and disjoint from the other
        // threads' ranges.
        unsafe { f(x.as_ptr(), m, w.k, w.w.as_ptr(), w.n, r0, r1, y) }
    });
    Ok(ran)
}

#[cfg(test)]
mod tests {
    use super::quantize_rows;

    /// W4A8's own quantiser gives the reference's codes and scales bit for bit (exact ties, a zero row, a
    /// non-finite-free spread of magnitudes, a short last group), and its group sums add up the codes.
    #[test]
    fn w4a8_activation_quantiser_matches_the_reference() {
        let (m, k, group) = (3, 70, 32);
        let x: Vec<f32> = (0..m * k)
            .map(|i| match i / k {
                0 => (i as f32 - 35.0) * 0.5,
                1 => 0.0,
                _ => ((i * 7919) % 1000) as f32 * 1e-3 - 0.5,
            })
            .collect();
        let ours = quantize_rows(&x, m, k, group);
        let (q, scales) = crate::reference::linear::quantize_rows_int8(&x, m, k);
        assert_eq!(ours.q, q);
        assert_eq!(
            ours.scales.iter().map(|s| s.to_bits()).collect::<Vec<_>>(),
            scales.iter().map(|s| s.to_bits()).collect::<Vec<_>>()
        );
        let groups = k.div_ceil(group);
        for i in 0..m {
            for g in 0..groups {
                let part = &q[i * k + g * group..i * k + ((g + 1) * group).min(k)];
                let want: i32 = part.iter().map(|&v| i32::from(v)).sum();
                assert_eq!(ours.group_sums[i * groups + g], want, "row {i} group {g}");
            }
        }
    }
}
