//! The instruction-set paths of the C kernels and the run-time probe, in a module of their own so the error type
//! can name an ISA without importing the CPU dispatch (which returns that error type).

use std::sync::OnceLock;

/// Instruction-set paths of the C kernels, from slowest to fastest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable C, compiled for the baseline target. Always available.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL/DQ + VNNI + BF16.
    Avx512,
}

impl Isa {
    /// The fastest path this CPU supports, probed once per process.
    pub fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| *Isa::available().last().unwrap_or(&Isa::Scalar))
    }

    /// Every path this CPU can run, slowest first.
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        if Isa::Avx2.is_supported() {
            v.push(Isa::Avx2);
        }
        if Isa::Avx512.is_supported() {
            v.push(Isa::Avx512);
        }
        v
    }

    /// Whether this CPU (and this build) can run the path.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))]
            Isa::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
                    && std::arch::is_x86_feature_detected!("avx512bf16")
            }
            #[cfg(not(all(target_arch = "x86_64", edgefit_x86_kernels)))]
            _ => false,
        }
    }
}
