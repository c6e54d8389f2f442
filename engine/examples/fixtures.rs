//! Writes the parity fixtures (`cargo xtask fixtures` runs this): `cargo run -p engine --example fixtures -- DIR`.

fn main() -> miette::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "engine/tests/fixtures".into());
    for fx in engine::fixtures::all() {
        engine::fixtures::write(&fx, std::path::Path::new(&dir))?;
        println!("wrote {dir}/{}", fx.name);
    }
    Ok(())
}
