fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/ktfs.proto");
    tonic_prost_build::configure().compile_protos(&["proto/ktfs.proto"], &["proto"])?;
    Ok(())
}
