//! Compiles the Open Inference Protocol's gRPC service (`proto/inference.proto`) into Rust: the
//! parser is `protox` (Rust), so the build needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/inference.proto");
    let descriptors = protox::compile(["inference.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        // prost's codec with undecodable messages answered INVALID_ARGUMENT (src/grpc.rs).
        .codec_path("crate::grpc::codec::Codec")
        .compile_fds(descriptors)?;
    Ok(())
}
