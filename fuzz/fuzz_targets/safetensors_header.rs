//! A safetensors file as arbitrary bytes through the bounded header reader of `cargo xtask plan --model DIR`
//! (`xtask/src/checkpoint.rs`, included as a module: xtask is a binary): it never panics and never reads more than
//! the 8-byte length and the header it declares.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code, unreachable_pub)]
#[path = "../../xtask/src/checkpoint.rs"]
mod checkpoint;

fuzz_target!(|data: &[u8]| {
    let _ = checkpoint::header_from(
        "fuzz.safetensors",
        "fuzz.safetensors",
        data.len() as u64,
        std::io::Cursor::new(data),
    );
});
