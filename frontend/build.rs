//! Generates the ONNX protobuf types from `proto/onnx.proto` with protox (no protoc needed).

fn main() {
    let proto = "proto/onnx.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"]).expect("proto/onnx.proto compiles");
    prost_build::Config::new()
        // Tensor payloads decode as `Bytes` slices of the memory-mapped file, never copies.
        .bytes([".onnx.TensorProto.raw_data"])
        .compile_fds(descriptors)
        .expect("prost generates the ONNX types");
}
