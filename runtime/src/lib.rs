//! The runtime: bundle loader (verifies versions, sizes and hashes), the host executor and its
//! kernels, the paged KV cache, sampling, tokenizer, and the `Backend` trait with `host`,
//! `openvino` and `xrt` implementations.
//!
//! Built so far: [`bundle`] (the deployable bundle: writer for the compiler, verifying loader),
//! [`kvcache`] (the paged KV cache with attention over pages), [`kernels`] (the host executor's
//! compute kernels with run-time CPU feature dispatch) and [`exec`] (the host executor: a bundle's
//! program planned into reused buffers, run with the kernels and the paged cache; float and 4-bit
//! weight-only programs today; several sequences share one KV pool) and [`sample`] (greedy, temperature,
//! top-k and top-p with a seeded generator). The int8 programs and the device backends are next. The
//! crate depends on no compiler crate: a bundle is the only thing that crosses from the compiler
//! to the runtime.

pub mod bundle;
pub mod exec;
pub mod kernels;
pub mod kvcache;
#[cfg(feature = "openvino")]
pub mod openvino;
pub mod sample;
#[cfg(feature = "xrt")]
pub mod xdna;
