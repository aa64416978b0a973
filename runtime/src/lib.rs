//! The runtime: bundle loader (verifies versions, sizes and hashes), the host executor and its
//! kernels, the paged KV cache, sampling, tokenizer, and the `Backend` trait with `host`,
//! `openvino` and `xrt` implementations.
//!
//! Not built yet. It depends on no compiler crate: a bundle is the only thing that crosses from the
//! compiler to the runtime.
