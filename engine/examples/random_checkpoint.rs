//! Writes a random-weight checkpoint with a real model's geometry for the speed benchmarks (never committed):
//! `cargo run --release -p engine --example random_checkpoint -- models/qwen3-1.7b/config.json /tmp/qwen3-1.7b`.

fn main() -> miette::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(config), Some(out)) = (args.next(), args.next()) else {
        miette::bail!("usage: random_checkpoint CONFIG.json OUT_DIR");
    };
    let text = std::fs::read_to_string(&config).map_err(|e| miette::miette!("{config}: {e}"))?;
    let bytes = engine::fixtures::write_random_checkpoint(&text, std::path::Path::new(&out), 1)?;
    println!("wrote {out}/model.safetensors ({bytes} bytes)");
    Ok(())
}
