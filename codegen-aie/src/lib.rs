//! Code generation for AMD XDNA NPUs (`npu1` Phoenix/Hawk Point, `npu2` Strix): one MLIR-AIE
//! design per GEMM shape (tile placement, object FIFOs, core bodies calling the int8 kernel, the
//! runtime DMA sequence), the tiling cost model and resource checks, and a design interpreter that
//! executes the emitted text to prove it.
//!
//! Not built yet. It will depend on `ir` and `passes`.
