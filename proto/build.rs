//! Compiles the .proto files with protox (pure Rust), so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/agentmesh/credential/v1/credential.proto",
        "proto/agentmesh/controlplane/v1/controlplane.proto",
        "proto/agentmesh/mesh/v1/mesh.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let descriptor_path =
        std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("agentmesh_descriptor.bin");
    std::fs::write(&descriptor_path, prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
