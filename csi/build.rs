//! Compiles the CSI spec's `csi.proto` (client and server) with Debian's protoc. Its imports
//! (`google/protobuf/descriptor.proto`, `timestamp.proto`, `wrappers.proto`) come from protoc's
//! include directory (Debian: `libprotobuf-dev`), or from `PROTOC_INCLUDE`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    println!("cargo:rerun-if-env-changed=PROTOC_INCLUDE");
    let mut includes = vec!["proto".to_string()];
    if let Ok(dir) = std::env::var("PROTOC_INCLUDE") {
        includes.push(dir);
    }
    tonic_prost_build::configure()
        // Controller and Node calls that kt-csi does not implement answer UNIMPLEMENTED.
        .generate_default_stubs(true)
        .compile_protos(&["proto/csi.proto".to_string()], &includes)
        .map_err(|e| {
            format!(
                "{e}\n(csi.proto imports google/protobuf/*.proto: install Debian's \
                 libprotobuf-dev, or set PROTOC_INCLUDE to a directory holding them)"
            )
        })?;
    Ok(())
}
