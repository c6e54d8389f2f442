//! Device memory the allocator's pool holds after buffers are freed, against what `Gpu::release_unused` hands back:
//! its own binary, because it reads the device's free memory, which any test running beside it would move.
//!
//! Where there is no CUDA device, or without the `cuda` feature, it prints "skipped: no CUDA device".

mod gpu_common;
use gpu_common::gpu;

/// A load's pattern: a raw buffer, the repacked one beside it, the raw one freed, the sizes changing (the 27B's FP8
/// linears, in MiB). What stays taken after `release_unused` is what is kept, to the allocator's granularity; and
/// once everything is dropped, everything comes back.
#[test]
fn release_unused_hands_the_freed_buffers_back_to_the_driver() {
    let Some(gpu) = gpu() else { return };
    const SLACK: usize = 64 << 20;
    gpu.release_unused().expect("release");
    let (before, _) = gpu.memory_info().expect("memory_info");
    let mut kept = Vec::new();
    for mib in [178usize, 89, 84, 31, 178, 89, 84, 31] {
        let raw = gpu.zeros::<u8>(mib << 20).expect("raw");
        kept.push(gpu.zeros::<u8>(mib << 20).expect("tiles"));
        drop(raw);
    }
    let kept_bytes: usize = kept.iter().map(|b| b.len()).sum();
    let (unreleased, _) = gpu.memory_info().expect("memory_info");
    gpu.release_unused().expect("release");
    let (after, _) = gpu.memory_info().expect("memory_info");
    let mib = |b: usize| b >> 20;
    println!(
        "kept {} MiB; taken {} MiB before release_unused, {} MiB after",
        mib(kept_bytes),
        mib(before.saturating_sub(unreleased)),
        mib(before.saturating_sub(after))
    );
    assert!(
        before.saturating_sub(after) <= kept_bytes + SLACK,
        "{} MiB taken for {} MiB kept",
        mib(before.saturating_sub(after)),
        mib(kept_bytes)
    );
    drop(kept);
    gpu.release_unused().expect("release");
    let (end, _) = gpu.memory_info().expect("memory_info");
    assert!(
        end + SLACK >= before,
        "{} MiB still taken with nothing kept",
        mib(before.saturating_sub(end))
    );
}
