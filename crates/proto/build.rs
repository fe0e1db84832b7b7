//! Compiles `proto/gangway.proto` with protox (pure Rust), so no `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/gangway.proto");
    let fds = protox::compile(["proto/gangway.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
