//! The runtime: the bundle loader (verifies versions, sizes and hashes), the host executor and its
//! kernels, the paged KV cache, sampling, and the device backends.
//!
//! - [`bundle`]: the deployable bundle (writer for the compiler, verifying loader).
//! - [`kvcache`]: the paged KV cache with attention over pages.
//! - [`kernels`]: the host executor's compute kernels, with run-time CPU feature dispatch.
//! - [`exec`]: the host executor — a bundle's program planned into reused buffers and run with the
//!   kernels and the paged cache (float, 4-bit weight-only, A8W8 and xdna int8 programs; several
//!   sequences share one KV pool).
//! - [`sample`]: greedy, temperature, top-k and top-p with a seeded generator.
//! - `openvino` (feature `openvino`): an intel-npu bundle's IR segments on an OpenVINO device.
//! - `xdna` (feature `xrt`): the executor's QGemms on an XDNA NPU, through `xdna-driver`: prefill
//!   blocks on the GEMM designs, decode steps on the GEMV designs.
//!
//! The crate depends on no compiler crate, under any feature (`tests/no_compiler_crate.rs` checks
//! cargo's resolve): a bundle is the only thing that crosses from the compiler to the runtime.

pub use ::bundle;
pub mod exec;
pub mod kernels;
pub mod kvcache;
#[cfg(feature = "openvino")]
pub mod openvino;
pub mod sample;
#[cfg(feature = "xrt")]
pub mod xdna;
