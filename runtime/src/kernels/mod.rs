//! The host executor's compute kernels, one file per kernel family:
//!
//! | family | file | what |
//! |---|---|---|
//! | `WGemm` | [`wgemm`] | int4/int8 weight-only GEMM with onnxruntime MatMulNBits semantics, weights repacked into 16-column panels ([`wgemm::pack_wgemm`]) |
//! | `QGemm` | [`qgemm`] | int8 × int8 → int32 GEMM with the folded zero-point epilogue and optional requantisation |
//! | f32 GEMM | [`gemm`] | y = a·W (+ bias) with W as [K, N] or transposed [N, K] |
//! | norms | [`norm`] | RmsNorm, SkipRmsNorm (normalised output and residual sum) |
//! | Rope | [`rope`] | rotary embedding, rotate-half and interleaved, full-width cos/sin |
//! | SwiGlu | [`swiglu`] | Silu(gate) · up |
//! | embedding | [`embed`] | row gather from f32 and block-quantised tables |
//! | layout | [`layout`] | Slice, Transpose and Concat of f32 tensors (copies, at most 8 axes) |
//! | quantisation | [`quantize`] | QuantizeLinear, DequantizeLinear and QuantizeRows of activations |
//! | attention | `attention` | one KV page's scores for a GQA group and each query row's softmax partial, for [`crate::kvcache`] |
//!
//! Every kernel takes an [`Isa`]: the scalar fallback runs everywhere; the SIMD paths are chosen
//! at run time from the CPU's features ([`Isa::detect`]) and can be forced (tests force each one).
//! Kernels that split work take a [`ThreadPool`] and split along the output columns, so each
//! weight byte is read once per call. Nothing on the decode path allocates once its scratch
//! buffers have grown to the largest shape seen: outputs and scratch are the caller's.

pub(crate) mod attention;
pub mod embed;
pub mod gemm;
pub mod layout;
pub mod norm;
pub mod pool;
pub mod qgemm;
pub mod quantize;
pub mod rope;
pub mod swiglu;
pub mod wgemm;

mod simd;

pub use pool::ThreadPool;

/// An instruction-set path. Ordered from the most portable to the most specialised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust, no target features.
    Scalar,
    /// AVX2 + FMA (256-bit); integer dot products with `vpmaddubsw` / `vpmaddwd`.
    Avx2,
    /// AVX-512 F/BW/VL (512-bit), without VNNI.
    Avx512,
    /// AVX-512 F/BW/VL + VNNI (`vpdpbusd`). Float-only kernels run their AVX-512 code here.
    Avx512Vnni,
}

impl Isa {
    /// Every path, in order.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni];

    /// The most specialised path this CPU runs.
    pub fn detect() -> Isa {
        Isa::ALL.into_iter().rev().find(|isa| isa.is_available()).unwrap_or(Isa::Scalar)
    }

    /// Whether this CPU has every feature the path needs.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => Isa::Avx512.is_available() && is_x86_feature_detected!("avx512vnni"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512-vnni",
        }
    }

    /// Panics when the path is not available: running target-feature code on a CPU without the
    /// feature is undefined behaviour, so a kernel refuses it outright.
    pub(crate) fn check(self) -> Isa {
        assert!(self.is_available(), "kernel path {} is not available on this CPU", self.name());
        self
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Weights or parameters a kernel cannot take.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    /// A buffer's length or a dimension does not fit the others.
    #[error("{what}: {detail}")]
    Shape { what: &'static str, detail: String },
    /// A valid ONNX configuration the kernels do not implement.
    #[error("unsupported {what}: {detail}")]
    Unsupported { what: &'static str, detail: String },
    /// A token id outside the table.
    #[error("token id {id} is outside the table of {rows} rows")]
    IdOutOfRange { id: usize, rows: usize },
}

pub(crate) fn shape_err(what: &'static str, detail: impl Into<String>) -> KernelError {
    KernelError::Shape { what, detail: detail.into() }
}

/// A raw pointer that may cross threads. Kernels hand each task a disjoint part of an output
/// buffer through it; the task split is what makes the writes disjoint.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr<T>(pub *mut T);

// SAFETY: only used to write disjoint ranges from the tasks of one `ThreadPool::run`, which
// returns after every task has finished.
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer. A method, so that closures capture the whole `SyncPtr` (which is `Sync`)
    /// rather than its raw-pointer field.
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// The `index`-th of `parts` near-equal contiguous ranges of `0..units`.
pub(crate) fn split_range(units: usize, parts: usize, index: usize) -> std::ops::Range<usize> {
    (index * units / parts)..((index + 1) * units / parts)
}
