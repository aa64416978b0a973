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

/// Limits of one DMA buffer descriptor of a tile kind, as mlir-aie's target model gives them for
/// AIE2 (npu1) and AIE2P (npu2) alike (`AIETargetModel`: `getBDMaxDims`, `getDmaBdWrapBits`,
/// `getDmaBdStepBits`, `getDmaBdMaxLen`, `getDmaBdIterBits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DmaLimits {
    /// Address dimensions one descriptor walks (the shim's iteration dimension not counted).
    pub dims: usize,
    /// Largest size of a dimension: the wrap field's `2^bits - 1`.
    pub max_size: usize,
    /// Largest stride: the step field stores `stride - 1` in 32-bit words, so `2^bits`.
    pub max_stride_words: usize,
    /// Largest transfer, in 32-bit words.
    pub max_len_words: usize,
    /// Largest count of the iteration dimension a runtime sequence puts in front of a shim
    /// descriptor's address dimensions (6-bit wrap of `count - 1`).
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
    /// Banks of a compute tile's data memory (`getNumBanks`): 4 of 16 KiB.
    pub fn core_banks(self) -> usize {
        4
    }
    /// Banks of a mem tile (`getNumBanks`): 8 of 64 KiB.
    pub fn mem_tile_banks(self) -> usize {
        8
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

    /// The array's clock, an assumption of the cost model: npu1 1.0 GHz (Phoenix's firmware
    /// records an AIE frequency of 1000 MHz); npu2 1.5 GHz, what Strix's 50 int8 TOPS over 32
    /// tiles × 512 MACs × 2 operations imply.
    pub fn clock_hz(self) -> f64 {
        match self {
            Device::Npu1 => 1.0e9,
            Device::Npu2 => 1.5e9,
        }
    }

    /// Bytes per second the shim tiles' DMA channels bring into the array at most: every column's
    /// channels, one 32-bit stream word per cycle each.
    pub fn shim_bytes_per_second(self) -> f64 {
        (self.columns() * self.shim_channels() * self.stream_bytes_per_cycle()) as f64 * self.clock_hz()
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

    /// Shim descriptors: three address dimensions (10-bit wraps, 20-bit steps), a 32-bit length,
    /// and the runtime sequence's iteration dimension in front.
    pub fn shim_dma(self) -> DmaLimits {
        DmaLimits {
            dims: 3,
            max_size: 1023,
            max_stride_words: 1 << 20,
            max_len_words: u32::MAX as usize,
            max_repeat: 64,
        }
    }
    /// Mem-tile descriptors: four address dimensions (10-bit wraps, 17-bit steps, 17-bit length).
    pub fn mem_tile_dma(self) -> DmaLimits {
        DmaLimits { dims: 4, max_size: 1023, max_stride_words: 1 << 17, max_len_words: (1 << 17) - 1, max_repeat: 1 }
    }
    /// Compute-tile descriptors: three address dimensions (8-bit wraps, 13-bit steps, 14-bit
    /// length).
    pub fn core_dma(self) -> DmaLimits {
        DmaLimits { dims: 3, max_size: 255, max_stride_words: 1 << 13, max_len_words: (1 << 14) - 1, max_repeat: 1 }
    }
    /// Memory-to-stream (and stream-to-memory) channels of one compute tile.
    pub fn core_channels(self) -> usize {
        2
    }
    /// Buffer descriptors one mem-tile channel reaches: even channels use 0..24, odd ones 24..48
    /// (mlir-aie's `isBdChannelAccessible`).
    pub fn mem_tile_channel_bds(self) -> usize {
        24
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
