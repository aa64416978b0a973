//! The device model: array geometry, memories, DMA resources and the int8 kernel's micro-tile, per
//! NPU generation, as mlir-aie's target model gives them.

use serde::Serialize;

/// An AMD XDNA NPU generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// Phoenix / Hawk Point (XDNA 1): 4 columns × 4 compute rows.
    Npu1,
    /// Strix / Krackan (XDNA 2): 8 columns × 4 compute rows.
    Npu2,
}

/// Limits of one DMA buffer-descriptor access pattern (sizes and strides in elements of 32 bits
/// for strides; sizes counted in the transfer's own elements, innermost first in hardware order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DmaLimits {
    /// Dimensions a descriptor walks (including the repeat dimension of shim descriptors).
    pub dims: usize,
    /// Largest wrap (size) of every non-repeat dimension.
    pub max_size: usize,
    /// Largest stride, in 32-bit words.
    pub max_stride_words: usize,
    /// Largest repeat count of the outermost dimension (shim descriptors only; 1 elsewhere).
    pub max_repeat: usize,
}

pub const DEVICES: &[&str] = &["npu1", "npu2"];

impl Device {
    pub fn parse(name: &str) -> Option<Device> {
        match name {
            "npu1" => Some(Device::Npu1),
            "npu2" => Some(Device::Npu2),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Device::Npu1 => "npu1",
            Device::Npu2 => "npu2",
        }
    }

    pub fn columns(self) -> usize {
        match self {
            Device::Npu1 => 4,
            Device::Npu2 => 8,
        }
    }

    /// Compute rows (tile rows 2..=5); row 0 is the shim, row 1 the mem tiles.
    pub fn compute_rows(self) -> usize {
        4
    }

    /// First row of compute tiles.
    pub const FIRST_COMPUTE_ROW: usize = 2;
    pub const MEM_TILE_ROW: usize = 1;
    pub const SHIM_ROW: usize = 0;

    /// Data memory of one compute tile, stack included.
    pub fn core_data_bytes(self) -> usize {
        64 * 1024
    }
    /// Stack the kernel object reserves in data memory.
    pub fn core_stack_bytes(self) -> usize {
        1024
    }
    pub fn core_program_bytes(self) -> usize {
        16 * 1024
    }
    pub fn core_bds(self) -> usize {
        16
    }
    pub fn core_locks(self) -> usize {
        16
    }
    pub fn mem_tile_bytes(self) -> usize {
        512 * 1024
    }
    pub fn mem_tile_bds(self) -> usize {
        48
    }
    pub fn mem_tile_locks(self) -> usize {
        64
    }
    /// Memory-to-stream and stream-to-memory channels of one mem tile.
    pub fn mem_tile_channels(self) -> usize {
        6
    }
    /// Buffer descriptors per shim DMA channel a runtime sequence may have in flight.
    pub fn shim_bds(self) -> usize {
        16
    }
    /// Memory-to-stream (and stream-to-memory) channels of one shim tile.
    pub fn shim_channels(self) -> usize {
        2
    }

    /// The int8 × int8 → int32 kernel's micro-tile r×s×t: A is consumed in r×s blocks, B in s×t.
    pub fn micro_tile(self) -> (usize, usize, usize) {
        match self {
            Device::Npu1 => (4, 8, 8),
            Device::Npu2 => (8, 8, 8),
        }
    }

    /// int8 multiply-accumulates per cycle per compute tile.
    pub fn macs_per_cycle(self) -> usize {
        match self {
            Device::Npu1 => 256,
            Device::Npu2 => 512,
        }
    }

    /// Bytes one DMA stream channel moves per cycle (a 32-bit stream).
    pub fn stream_bytes_per_cycle(self) -> usize {
        4
    }

    /// Shim descriptors: three wrapped dimensions plus the repeat.
    pub fn shim_dma(self) -> DmaLimits {
        DmaLimits { dims: 4, max_size: 1023, max_stride_words: 1 << 20, max_repeat: 64 }
    }
    /// Mem-tile descriptors: four wrapped dimensions.
    pub fn mem_tile_dma(self) -> DmaLimits {
        DmaLimits { dims: 4, max_size: 1023, max_stride_words: 1 << 17, max_repeat: 1 }
    }
    /// Compute-tile descriptors: three wrapped dimensions.
    pub fn core_dma(self) -> DmaLimits {
        DmaLimits { dims: 3, max_size: 255, max_stride_words: 1 << 13, max_repeat: 1 }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
