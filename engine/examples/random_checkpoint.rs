//! Writes a random-weight checkpoint with a real model's geometry for the speed benchmarks (never committed).
//!
//! - `random_checkpoint CONFIG.json OUT_DIR`: the fixtures' values (normal samples, quantized one by one), for the
//!   CPU benchmarks: `cargo run --release -p engine --example random_checkpoint -- models/qwen3-1.7b/config.json
//!   /tmp/qwen3-1.7b`.
//! - `random_checkpoint CARD_DIR OUT_DIR`: a model card's directory (`config.json`, `hf_quant_config.json`), streamed
//!   with random bits on every core ([`engine::bench_checkpoint`]): the GPU benchmarks' 27B models in a minute.

fn main() -> miette::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(src), Some(out)) = (args.next(), args.next()) else {
        miette::bail!("usage: random_checkpoint CONFIG.json|CARD_DIR OUT_DIR");
    };
    let (src, out) = (std::path::Path::new(&src), std::path::Path::new(&out));
    let t = std::time::Instant::now();
    let bytes = if src.is_dir() {
        engine::bench_checkpoint::write(src, out, 1)?
    } else {
        let text =
            std::fs::read_to_string(src).map_err(|e| miette::miette!("{}: {e}", src.display()))?;
        engine::fixtures::write_random_checkpoint(&text, out, 1)?
    };
    println!(
        "wrote {}/model.safetensors ({bytes} bytes) in {:.1} s",
        out.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
