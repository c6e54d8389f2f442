//! Small per-token ops the engine needs around the big kernels: RMSNorm (`w` and `1 + w` forms), SiLU-and-mul,
//! GELU(erf)-and-mul (C, scalar / AVX2 / AVX-512), embedding gather from bf16 or f32 rows and argmax (Rust: a gather
//! is a copy and argmax one pass, neither has arithmetic worth vectorising by hand).
//!
//! The activations have hand-written AVX-512 and AVX2 paths (vector exp and erfc: `csrc/seq_common.h`,
//! `csrc/ops_avx2.c`); RMSNorm is hand-written for AVX-512 and compiler-vectorised portable C otherwise; the scalar
//! path is the portable C of `csrc/ops_impl.h` with libm's `expf` / `erff`.
//!
//! Gated activations take the fused `gate_up` projection `[rows, 2*inter]` with the gate half first (vLLM's
//! `SiluAndMul` convention; transformers computes `act(gate_proj(x)) * up_proj(x)`, the same numbers).

use crate::cpu::Isa;
use crate::error::{check_len, checked_product, whole_rows};
use crate::KernelError;
use std::sync::atomic::Ordering;

pub use crate::shapes::NormWeight;

use crate::cpu::record_isa;
pub use crate::cpu::seq_isa_calls;

/// Declares C kernels that share one signature, and optionally a function-pointer type for them, so the
/// signature is written once for every path: `c_kernels! { type F = fn(x: *const f32) -> i32; k_scalar,
/// #[cfg(..)] k_avx2 }`. The CPU op modules use it for their `extern "C"` blocks.
macro_rules! c_kernels {
    ($vis:vis $(type $alias:ident =)? fn $params:tt -> $ret:ty; $($(#[$m:meta])* $name:ident),+ $(,)?) => {
        $($vis type $alias = unsafe extern "C" fn $params -> $ret;)?
        extern "C" { $($(#[$m])* $vis fn $name $params -> $ret;)+ }
    };
    ($vis:vis $(type $alias:ident =)? fn $params:tt; $($(#[$m:meta])* $name:ident),+ $(,)?) => {
        $($vis type $alias = unsafe extern "C" fn $params;)?
        extern "C" { $($(#[$m])* $vis fn $name $params;)+ }
    };
}
pub(crate) use c_kernels;

/// `Ok` with the kernel (or kernel set) of `isa` among the scalar, AVX2 and AVX-512 builds, or
/// [`KernelError::IsaUnavailable`] naming `op` when this CPU or this build lacks the path. The AVX2 and AVX-512
/// expressions are compiled only where the x86 kernels are built, so they may name symbols that exist only there.
macro_rules! isa_kernels {
    ($op:expr, $isa:expr, scalar: $s:expr, avx2: $a2:expr, avx512: $a5:expr $(,)?) => {
        'pick: {
            let (op, isa): (&'static str, $crate::cpu::Isa) = ($op, $isa);
            if !isa.is_supported() {
                break 'pick Err($crate::KernelError::IsaUnavailable { op, isa });
            }
            // The arms are a `match`, not `Ok`s, so that distinct kernel functions coerce to one pointer type.
            Ok(match isa {
                $crate::cpu::Isa::Scalar => $s,
                #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))]
                $crate::cpu::Isa::Avx2 => $a2,
                #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))]
                $crate::cpu::Isa::Avx512 => $a5,
                #[cfg(not(all(target_arch = "x86_64", edgefit_x86_kernels)))]
                _ => break 'pick Err($crate::KernelError::IsaUnavailable { op, isa }),
            })
        }
    };
}
pub(crate) use isa_kernels;

/// Defines the plain entry point of an op, `name(args)`, as its `_with` form on the fastest path this CPU has
/// ([`Isa::detected`]) and all cores ([`crate::cpu::default_threads`]); the doc comment and signature are written
/// out at the call, only the forwarding body is generated.
macro_rules! fastest_path {
    ($(#[$m:meta])* pub fn $name:ident $(<$($lt:lifetime),+>)? ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $with:path;) => {
        $(#[$m])*
        pub fn $name $(<$($lt),+>)? ($($arg: $ty),*) -> $ret {
            $with($crate::cpu::Isa::detected(), $crate::cpu::default_threads(), $($arg),*)
        }
    };
}
pub(crate) use fastest_path;

pub(crate) fn check_rmsnorm(
    op: &'static str,
    x: &[f32],
    weight: &[f32],
    eps: f32,
    out: &[f32],
) -> Result<(), KernelError> {
    crate::ensure_shape!(!weight.is_empty(), op, "weight must not be empty");
    whole_rows(op, "x", x.len(), "weight", weight.len())?;
    check_len(op, "out", out.len(), x.len())?;
    crate::ensure_shape!(
        eps.is_finite() && eps >= 0.0,
        op,
        "eps must be finite and non-negative, got {eps}"
    );
    Ok(())
}

pub(crate) fn check_glu(
    op: &'static str,
    gate_up: &[f32],
    inter: usize,
    out: &[f32],
) -> Result<(), KernelError> {
    crate::ensure_shape!(inter > 0, op, "inter must be positive");
    // The C kernels take `inter` as an i64.
    crate::ensure_shape!(
        i64::try_from(inter).is_ok(),
        op,
        "inter = {inter} is more than the kernels index"
    );
    let width = checked_product(op, "2*inter", &[2, inter])?;
    crate::ensure_shape!(
        gate_up.len().is_multiple_of(width),
        op,
        "gate_up has {} elements, not a whole number of rows of 2*inter = {}",
        gate_up.len(),
        width
    );
    let rows = gate_up.len() / width;
    // rows*inter is half of gate_up.len(), so it cannot overflow.
    crate::ensure_shape!(
        out.len() == rows * inter,
        op,
        "out has {} elements, expected rows*inter = {}",
        out.len(),
        rows * inter
    );
    Ok(())
}

/// Rows of an embedding table.
#[derive(Debug, Clone, Copy)]
pub enum EmbeddingTable<'a> {
    /// bf16 rows `[vocab, dim]` (the checkpoint's dtype).
    Bf16(&'a [half::bf16]),
    /// f32 rows `[vocab, dim]`.
    F32(&'a [f32]),
}

/// `out` of an embedding gather holds `ids` rows of `dim`, checked alike by the CPU gather and the GPU backend's f32
/// gather.
pub(crate) fn check_gather_out(
    op: &'static str,
    ids: usize,
    dim: usize,
    out: usize,
) -> Result<(), KernelError> {
    let want = checked_product(op, "ids*dim", &[ids, dim])?;
    crate::ensure_shape!(
        out == want,
        op,
        "out has {out} elements, expected ids*dim = {want}"
    );
    Ok(())
}

/// Gathers `out[i] = table[ids[i]]` (`[ids.len(), dim]` f32); an id past the vocabulary is an error naming it.
pub fn embedding_gather(
    table: EmbeddingTable<'_>,
    dim: usize,
    ids: &[u32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "embedding_gather";
    let len = match table {
        EmbeddingTable::Bf16(t) => t.len(),
        EmbeddingTable::F32(t) => t.len(),
    };
    let vocab = whole_rows(OP, "table", len, "dim", dim)?;
    check_gather_out(OP, ids.len(), dim, out.len())?;
    if let Some((i, &id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
        return Err(KernelError::shape(
            OP,
            format!("ids[{i}] = {id} is past the vocabulary of {vocab} rows"),
        ));
    }
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(dim)) {
        let r = id as usize * dim;
        match table {
            EmbeddingTable::Bf16(t) => {
                for (o, &v) in o.iter_mut().zip(&t[r..r + dim]) {
                    *o = v.to_f32();
                }
            }
            EmbeddingTable::F32(t) => o.copy_from_slice(&t[r..r + dim]),
        }
    }
    Ok(())
}

/// Index of the largest value (the first one on ties). NaN is refused: a NaN logit means the step already failed.
pub fn argmax(x: &[f32]) -> Result<usize, KernelError> {
    const OP: &str = "argmax";
    crate::ensure_shape!(!x.is_empty(), OP, "empty input");
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        crate::ensure_shape!(!v.is_nan(), OP, "x[{i}] is NaN");
        if v > x[best] {
            best = i;
        }
    }
    Ok(best)
}

c_kernels! {
    type NormFn = fn(x: *const f32, w: *const f32, dim: i64, one_plus: i32, eps: f32, out: *mut f32, r0: i64, r1: i64) -> i32;
    ops_rmsnorm_scalar,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] ops_rmsnorm_avx2,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] ops_rmsnorm_avx512,
}
c_kernels! {
    type GluFn = fn(gate_up: *const f32, inter: i64, gelu: i32, out: *mut f32, r0: i64, r1: i64) -> i32;
    ops_glu_scalar,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] ops_glu_avx2,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] ops_glu_avx512,
}

fn kernels_for(op: &'static str, isa: Isa) -> Result<(NormFn, GluFn), KernelError> {
    isa_kernels!(op, isa,
        scalar: (ops_rmsnorm_scalar, ops_glu_scalar),
        avx2: (ops_rmsnorm_avx2, ops_glu_avx2),
        avx512: (ops_rmsnorm_avx512, ops_glu_avx512),
    )
}

/// Rows below which one thread does the whole op: a row of a few thousand floats takes about a microsecond, less
/// than spawning a scoped thread costs.
const ROWS_PER_THREAD: usize = 16;

fn run_rows(
    op: &'static str,
    isa: Isa,
    rows: usize,
    threads: usize,
    out: &mut [f32],
    f: impl Fn(*mut f32, i64, i64) -> i32 + Sync,
) -> Result<(), KernelError> {
    if rows == 0 {
        return Ok(());
    }
    let tag = std::sync::atomic::AtomicI32::new(-1);
    let o = crate::cpu::SharedMut(out.as_mut_ptr());
    let threads = threads.min(rows.div_ceil(ROWS_PER_THREAD));
    crate::cpu::parallel_ranges(rows, 1, threads, |r0, r1| {
        tag.store(f(o.get(), r0 as i64, r1 as i64), Ordering::Relaxed);
    });
    record_isa(op, isa, tag.into_inner())
}

fastest_path! {
    /// RMSNorm over rows of `weight.len()`: `out = x * rsqrt(mean(x^2) + eps) * w` (or `1 + w`), fastest path.
    pub fn rmsnorm(x: &[f32], weight: &[f32], form: NormWeight, eps: f32, out: &mut [f32]) -> Result<(), KernelError> = rmsnorm_with;
}

/// [`rmsnorm`] on an explicit path and thread count (threads split the rows).
pub fn rmsnorm_with(
    isa: Isa,
    threads: usize,
    x: &[f32],
    weight: &[f32],
    form: NormWeight,
    eps: f32,
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "ops::rmsnorm";
    check_rmsnorm(OP, x, weight, eps, out)?;
    let (norm, _) = kernels_for(OP, isa)?;
    let dim = weight.len();
    let one_plus = i32::from(form == NormWeight::OnePlus);
    run_rows(OP, isa, x.len() / dim, threads, out, |o, r0, r1| {
        // SAFETY: x and out hold rows x dim floats and weight dim (checked); rows r0..r1 belong to this thread.
        unsafe {
            norm(
                x.as_ptr(),
                weight.as_ptr(),
                dim as i64,
                one_plus,
                eps,
                o,
                r0,
                r1,
            )
        }
    })
}

fn glu_with(
    op: &'static str,
    gelu: bool,
    isa: Isa,
    threads: usize,
    gate_up: &[f32],
    inter: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_glu(op, gate_up, inter, out)?;
    let (_, glu) = kernels_for(op, isa)?;
    // check_glu verified that 2*inter does not overflow.
    run_rows(
        op,
        isa,
        gate_up.len() / (2 * inter),
        threads,
        out,
        |o, r0, r1| {
            // SAFETY: gate_up holds rows x 2*inter floats and out rows x inter (checked); rows r0..r1 are this thread's.
            unsafe { glu(gate_up.as_ptr(), inter as i64, i32::from(gelu), o, r0, r1) }
        },
    )
}

fastest_path! {
    /// `out = silu(gate) * up` over rows of `gate_up` (`[rows, 2*inter]`, gate first), fastest path.
    pub fn silu_and_mul(gate_up: &[f32], inter: usize, out: &mut [f32]) -> Result<(), KernelError> = silu_and_mul_with;
}

/// [`silu_and_mul`] on an explicit path and thread count.
pub fn silu_and_mul_with(
    isa: Isa,
    threads: usize,
    gate_up: &[f32],
    inter: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    glu_with(
        "ops::silu_and_mul",
        false,
        isa,
        threads,
        gate_up,
        inter,
        out,
    )
}

fastest_path! {
    /// `out = gelu_erf(gate) * up` over rows of `gate_up` (`[rows, 2*inter]`, gate first), fastest path. The exact
    /// erf form, not the tanh approximation: Spark uses `gelu` (erf), and the seed measured tanh no faster on the
    /// phone NPU (1.535 vs 1.483 ms per layer) and kept erf for fidelity.
    pub fn gelu_and_mul(gate_up: &[f32], inter: usize, out: &mut [f32]) -> Result<(), KernelError> = gelu_and_mul_with;
}

/// [`gelu_and_mul`] on an explicit path and thread count.
pub fn gelu_and_mul_with(
    isa: Isa,
    threads: usize,
    gate_up: &[f32],
    inter: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    glu_with("ops::gelu_and_mul", true, isa, threads, gate_up, inter, out)
}

pub use crate::shapes::GatedAct;

/// `out = act(gate) * up` over rows of `gate_up` (`[rows, 2*inter]`, gate first; `out` `[rows, inter]`), the
/// activation `act` names: [`silu_and_mul`], [`gelu_and_mul`] or [`gelu_tanh_and_mul`].
pub fn act_and_mul(
    act: GatedAct,
    gate_up: &[f32],
    inter: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    match act {
        GatedAct::Silu => silu_and_mul(gate_up, inter, out),
        GatedAct::GeluErf => gelu_and_mul(gate_up, inter, out),
        GatedAct::GeluTanh => gelu_tanh_and_mul(gate_up, inter, out),
    }
}

c_kernels! {
    type ProbeFn = fn(iters: i64, sink: *mut f32, flops: *mut i64) -> i32;
    ops_fma_probe_scalar,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] ops_fma_probe_avx2,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] ops_fma_probe_avx512,
}

/// Runs the compute-roof probe (`iters` rounds of independent fused multiply-adds at the path's vector width) on
/// the calling thread and returns the FLOPs it did; the benchmarks time it to state a FLOP floor measured in the
/// same run as the kernel it judges.
pub fn fma_probe(isa: Isa, iters: u32) -> Result<f64, KernelError> {
    const OP: &str = "ops::fma_probe";
    let f: ProbeFn = isa_kernels!(OP, isa,
        scalar: ops_fma_probe_scalar,
        avx2: ops_fma_probe_avx2,
        avx512: ops_fma_probe_avx512,
    )?;
    let (mut sink, mut flops) = (0.0f32, 0i64);
    // SAFETY: the probe only writes the two scalars it is given.
    let tag = unsafe { f(i64::from(iters), &mut sink, &mut flops) };
    std::hint::black_box(sink);
    record_isa(OP, isa, tag)?;
    Ok(flops as f64)
}

/// `out = gelu_tanh(gate) * up` over rows of `gate_up` (`[rows, 2*inter]`, gate first): Gemma's
/// `gelu_pytorch_tanh`, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu_tanh_and_mul(
    gate_up: &[f32],
    inter: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_glu("gelu_tanh_and_mul", gate_up, inter, out)?;
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    for (row, o) in gate_up
        .chunks_exact(2 * inter)
        .zip(out.chunks_exact_mut(inter))
    {
        let (g, u) = row.split_at(inter);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            let t = (C * (g + 0.044_715 * g * g * g)).tanh();
            *o = 0.5 * g * (1.0 + t) * u;
        }
    }
    Ok(())
}
