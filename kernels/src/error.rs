use crate::isa::Isa;

/// Every way a kernel call can be refused. Bad sizes are errors, never undefined behaviour.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum KernelError {
    /// A buffer or dimension does not match what the kernel needs.
    #[error("{op}: {what}")]
    Shape { op: &'static str, what: String },
    /// The requested instruction-set path is not available on this CPU or not built for this target.
    #[error("{op}: the {isa:?} path is not available on this CPU")]
    IsaUnavailable { op: &'static str, isa: Isa },
    /// The crate was built without the `cuda` feature.
    #[error("built without CUDA: rebuild with `--features cuda` (needs the pinned nvcc 13.0, see README)")]
    NotCompiledWithCuda,
    /// A CUDA driver or launch error.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// The driver could not allocate the device (or page-locked host) memory asked for: a caller can tell this from
    /// a failure that retrying smaller would not fix.
    #[error("CUDA: out of memory: {0}")]
    OutOfMemory(String),
}

impl KernelError {
    /// Shorthand used by the size checks of every safe entry point.
    pub fn shape(op: &'static str, what: impl Into<String>) -> Self {
        KernelError::Shape {
            op,
            what: what.into(),
        }
    }
}

/// Fails with a [`KernelError::Shape`] naming `op` unless `cond` holds.
#[macro_export]
macro_rules! ensure_shape {
    ($cond:expr, $op:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::KernelError::shape($op, format!($($fmt)+)));
        }
    };
}

/// The product of `factors`, or a [`KernelError::Shape`] naming `op` and `what` (the product's formula, such as
/// `"m*k"`) when it does not fit in `usize`. Every size check multiplies through this (or [`checked_sum`]), so an
/// absurd dimension is refused instead of wrapping to a small length that a C or CUDA kernel would then trust.
pub(crate) fn checked_product(
    op: &'static str,
    what: &str,
    factors: &[usize],
) -> Result<usize, KernelError> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .ok_or_else(|| {
            KernelError::shape(op, format!("{what} overflows usize (factors {factors:?})"))
        })
}

/// The sum of `terms`, or a [`KernelError::Shape`] naming `op` and `what` when it does not fit in `usize`.
pub(crate) fn checked_sum(
    op: &'static str,
    what: &str,
    terms: &[usize],
) -> Result<usize, KernelError> {
    terms
        .iter()
        .try_fold(0usize, |acc, &t| acc.checked_add(t))
        .ok_or_else(|| KernelError::shape(op, format!("{what} overflows usize (terms {terms:?})")))
}

/// Fails with a [`KernelError::Shape`] naming `op` unless buffer `name` holds `want` elements (`got`).
pub(crate) fn check_len(
    op: &'static str,
    name: &str,
    got: usize,
    want: usize,
) -> Result<(), KernelError> {
    crate::ensure_shape!(
        got == want,
        op,
        "{name} has {got} elements, expected {want}"
    );
    Ok(())
}

/// The rows of `width` elements that `len` elements of `name` make, or a [`KernelError::Shape`] naming `op` when
/// `width` (`width_name`) is 0 or `len` is not a whole number of rows.
pub(crate) fn whole_rows(
    op: &'static str,
    name: &str,
    len: usize,
    width_name: &str,
    width: usize,
) -> Result<usize, KernelError> {
    crate::ensure_shape!(width > 0, op, "{width_name} must be positive");
    crate::ensure_shape!(
        len.is_multiple_of(width),
        op,
        "{name} has {len} elements, not a whole number of rows of {width}"
    );
    Ok(len / width)
}
