//! Code generation for AMD XDNA NPUs (`npu1` Phoenix/Hawk Point, `npu2` Strix): one MLIR-AIE
//! design per GEMM shape (tile placement, object FIFOs, core bodies calling the int8 kernel the
//! design defines in MLIR, the runtime DMA sequence), the tiling cost model and resource checks, the host plan that maps the
//! program's projections onto designs, and a design interpreter that executes the emitted text to
//! prove it.
//!
//! - [`device`]: the device model.
//! - [`gemm`]: the projection GEMMs of a compiled program.
//! - [`tiling`]: per-shape tiling by cost model; compile-time errors naming shape and budget.
//! - [`design`]: the design of a tiling and its generic and pretty texts.
//! - [`gemv`]: GEMV designs for decode: weights streamed over every shim channel, activation rows
//!   resident in every core.
//! - [`qgemv`]: GEMV designs that take f32 rows and return f32 outputs, their cores quantising
//!   the rows (`QuantizeRows{passes}`) and dequantising the products (the `QGemm` epilogue).
//! - [`kernels`]: the cores' code, MLIR functions every design carries; [`qkernels`] the
//!   quantisation and epilogue functions, f32 operation for operation as the program defines them.
//! - [`rules`]: mlir-aie's object FIFO, link and DMA descriptor rules and the tiles' resources,
//!   checked on a design ([`design::check`]) so what mlir-aie would refuse fails without it.
//! - [`interp`]: parses a design's generic text and executes it int32-exactly.
//! - [`plan`]: the host plan (which node calls which design: decode calls the GEMV designs,
//!   prefill blocks the GEMM designs) and each design's `aiecc.py` build command.
//! - [`quant`]: the A8W8 epilogue on a design's int32 readback, as `QGemm` defines it.
//! - [`mlir`]: verifies designs with MLIR itself (`mlir-opt` of LLVM/MLIR 22).
//! - [`amdxdna`] (feature `xrt`): runs a design on an XDNA NPU through the amdxdna driver's
//!   ioctls, and a model of the driver (`amdxdna::sim`) that tests run it against.

#[cfg(feature = "xrt")]
pub mod amdxdna;
pub mod chain;
pub mod cost;
pub mod design;
pub mod device;
pub mod gemm;
pub mod gemv;
pub mod interp;
pub mod kernels;
pub mod mlir;
pub mod plan;
pub mod qgemv;
pub mod qkernels;
pub mod quant;
pub mod rules;
pub mod sequence;
pub mod tiling;

pub use device::Device;
pub use tiling::{GemmShape, Tiling};
