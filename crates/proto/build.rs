//! Compiles the protos with protox (pure Rust), so no `protoc` is needed:
//! `proto/gangway.proto` (native) and `proto/nacos_grpc_service.proto` (Nacos SDK wire protocol).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/gangway.proto");
    println!("cargo:rerun-if-changed=proto/nacos_grpc_service.proto");
    let fds = protox::compile(["proto/gangway.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    let fds = protox::compile(["proto/nacos_grpc_service.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
