//! An open NPU ([`Npu`]): the device heap, buffer objects, hardware contexts with a design's PDI
//! as CU 0, and runs of an instruction stream through one ERT command (see the crate
//! documentation for the sequence).

use crate::driver::{AccelFile, Driver, Ioctl};
use crate::uapi::*;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum NpuError {
    #[error("no XDNA NPU: {0} (is the amdxdna driver loaded? it is in Linux 6.14 and later)")]
    NoDevice(String),
    #[error("amdxdna {call}: {err}")]
    Ioctl { call: &'static str, err: std::io::Error },
    #[error("mapping a {size}-byte buffer object: {err}")]
    Map { size: usize, err: std::io::Error },
    #[error("the design uses {need} columns; the NPU has {have}")]
    Columns { need: u32, have: u32 },
    #[error("the command ended in state {state} ({name})", name = cmd_state_name(*state))]
    Command { state: u32 },
    #[error("{0}")]
    Input(String),
}

/// A buffer object: its handle, size, device address and (when mapped) host view.
pub struct Bo {
    pub handle: u32,
    pub ty: u32,
    pub size: usize,
    pub xdna_addr: u64,
    ptr: *mut u8,
    /// Whether `ptr` is a mapping of its own (DEV buffers live inside the heap's).
    owns_map: bool,
}

// SAFETY: a buffer object's mapping is process memory, valid on any thread; `Bo` hands out
// `&`/`&mut` views only through `&self`/`&mut self`.
unsafe impl Send for Bo {}

impl Bo {
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `size` bytes for the life of the buffer, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.size) }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: as above, shared.
        unsafe { std::slice::from_raw_parts(self.ptr, self.size) }
    }
}

/// A hardware context with a design's PDI configured as CU 0.
pub struct HwContext {
    pub handle: u32,
    pub syncobj: u32,
    pdi: Bo,
}

/// The size of the device heap the DEV buffers (PDI, instruction streams) are cut from.
pub const HEAP_BYTES: usize = 64 << 20;
/// How long a command may run.
pub const COMMAND_TIMEOUT_NS: i64 = 10_000_000_000;

/// An open NPU.
pub struct Npu<D: Driver> {
    driver: D,
    pub metadata: AieMetadata,
    heap: Option<Bo>,
}

impl Npu<AccelFile> {
    /// Opens the first accel node under `dir` (normally `/dev/accel`).
    pub fn open(dir: &Path) -> Result<Npu<AccelFile>, NpuError> {
        let mut nodes: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| NpuError::NoDevice(format!("{}: {e}", dir.display())))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("accel")))
            .collect();
        nodes.sort();
        let node = nodes.first().ok_or_else(|| NpuError::NoDevice(format!("{} has no accel node", dir.display())))?;
        let file = AccelFile::open(node).map_err(|e| NpuError::NoDevice(format!("{}: {e}", node.display())))?;
        Npu::with_driver(file)
    }
}

impl<D: Driver> Npu<D> {
    /// Queries the array and creates the device heap.
    pub fn with_driver(mut driver: D) -> Result<Npu<D>, NpuError> {
        let mut metadata = AieMetadata::default();
        let mut info = GetInfo {
            param: QUERY_AIE_METADATA,
            buffer_size: size_of::<AieMetadata>() as u32,
            buffer: &mut metadata as *mut AieMetadata as u64,
        };
        driver.ioctl(Ioctl::GetInfo(&mut info)).map_err(|err| NpuError::Ioctl { call: "GET_INFO", err })?;
        let mut npu = Npu { driver, metadata, heap: None };
        let heap = npu.bo(BO_DEV_HEAP, HEAP_BYTES)?;
        npu.heap = Some(heap);
        Ok(npu)
    }

    fn call(&mut self, call: Ioctl<'_>) -> Result<(), NpuError> {
        let name = call.name();
        self.driver.ioctl(call).map_err(|err| NpuError::Ioctl { call: name, err })
    }

    /// Creates a buffer object of `ty` and gives it a host view.
    pub fn bo(&mut self, ty: u32, size: usize) -> Result<Bo, NpuError> {
        let mut create = CreateBo { size: size as u64, ty, ..Default::default() };
        self.call(Ioctl::CreateBo(&mut create))?;
        let mut info = GetBoInfo { handle: create.handle, ..Default::default() };
        if let Err(e) = self.call(Ioctl::GetBoInfo(&mut info)) {
            self.close(create.handle);
            return Err(e);
        }
        // DEV buffers are views of the heap's mapping (the driver returns their address there);
        // the others are mapped at their fake offset.
        let (ptr, owns_map) = if ty == BO_DEV && info.vaddr != 0 {
            (info.vaddr as *mut u8, false)
        } else {
            match self.driver.map(info.map_offset, size) {
                Ok(p) => (p, true),
                Err(err) => {
                    self.close(create.handle);
                    return Err(NpuError::Map { size, err });
                }
            }
        };
        Ok(Bo { handle: create.handle, ty, size, xdna_addr: info.xdna_addr, ptr, owns_map })
    }

    fn close(&mut self, handle: u32) {
        let mut close = GemClose { handle, pad: 0 };
        let _ = self.driver.ioctl(Ioctl::GemClose(&mut close));
    }

    /// Unmaps and closes a buffer object.
    pub fn free(&mut self, bo: Bo) {
        if bo.owns_map {
            self.driver.unmap(bo.ptr, bo.size);
        }
        self.close(bo.handle);
    }

    /// A buffer of `ty` holding `data`, synced to the device.
    pub fn upload(&mut self, ty: u32, data: &[u8]) -> Result<Bo, NpuError> {
        let mut bo = self.bo(ty, data.len().max(1))?;
        bo.bytes_mut()[..data.len()].copy_from_slice(data);
        if let Err(e) = self.sync(&bo, SYNC_TO_DEVICE) {
            self.free(bo);
            return Err(e);
        }
        Ok(bo)
    }

    pub fn sync(&mut self, bo: &Bo, direction: u32) -> Result<(), NpuError> {
        let mut s = SyncBo { handle: bo.handle, direction, offset: 0, size: bo.size as u64 };
        self.call(Ioctl::SyncBo(&mut s))
    }

    /// A hardware context over `columns` columns with `pdi` configured as CU 0.
    pub fn context(&mut self, pdi: &[u8], columns: u32) -> Result<HwContext, NpuError> {
        let have = u32::from(self.metadata.cols);
        if columns == 0 || columns > have {
            return Err(NpuError::Columns { need: columns, have });
        }
        if pdi.is_empty() {
            return Err(NpuError::Input("an empty PDI".into()));
        }
        let pdi = self.upload(BO_DEV, pdi)?;
        let qos = QosInfo::default();
        let mut create = CreateHwctx {
            qos_p: &qos as *const QosInfo as u64,
            num_tiles: columns * u32::from(self.metadata.core.row_count),
            ..Default::default()
        };
        if let Err(e) = self.call(Ioctl::CreateHwctx(&mut create)) {
            self.free(pdi);
            return Err(e);
        }
        let mut cu = ConfigCu {
            num_cus: 1,
            cu_configs: [CuConfig { cu_bo: pdi.handle, ..Default::default() }],
            ..Default::default()
        };
        let mut config = ConfigHwctx {
            handle: create.handle,
            param_type: HWCTX_CONFIG_CU,
            param_val: &mut cu as *mut ConfigCu as u64,
            param_val_size: size_of::<ConfigCu>() as u32,
            pad: 0,
        };
        let ctx = HwContext { handle: create.handle, syncobj: create.syncobj_handle, pdi };
        if let Err(e) = self.call(Ioctl::ConfigHwctx(&mut config)) {
            self.release(ctx);
            return Err(e);
        }
        Ok(ctx)
    }

    pub fn release(&mut self, ctx: HwContext) {
        let mut d = DestroyHwctx { handle: ctx.handle, pad: 0 };
        let _ = self.driver.ioctl(Ioctl::DestroyHwctx(&mut d));
        self.free(ctx.pdi);
    }

    /// Runs the instruction stream `insts` on `ctx` with `inputs` as the first buffers and an
    /// output buffer of `output_len` bytes last; returns the output.
    pub fn run(
        &mut self,
        ctx: &HwContext,
        insts: &[u8],
        inputs: &[&[u8]],
        output_len: usize,
    ) -> Result<Vec<u8>, NpuError> {
        let mut out = self.run_outputs(ctx, insts, inputs, &[output_len])?;
        Ok(out.pop().expect("one output"))
    }

    /// [`Npu::run`] with several output buffers after the inputs, of `output_lens` bytes each;
    /// returns them in order.
    pub fn run_outputs(
        &mut self,
        ctx: &HwContext,
        insts: &[u8],
        inputs: &[&[u8]],
        output_lens: &[usize],
    ) -> Result<Vec<Vec<u8>>, NpuError> {
        if insts.is_empty() || !insts.len().is_multiple_of(4) {
            return Err(NpuError::Input(format!(
                "an instruction stream of {} bytes (whole 32-bit words)",
                insts.len()
            )));
        }
        let mut bos: Vec<Bo> = Vec::new();
        let result = (|| {
            let instr = self.upload(BO_DEV, insts)?;
            bos.push(instr);
            for data in inputs {
                let bo = self.upload(BO_SHMEM, data)?;
                bos.push(bo);
            }
            for &len in output_lens {
                let out = self.upload(BO_SHMEM, &vec![0u8; len])?;
                bos.push(out);
            }
            let words = command_words(bos[0].xdna_addr, (insts.len() / 4) as u32, bos[1..].iter().map(|b| b.xdna_addr));
            let mut cmd = self.bo(BO_CMD, 4 * words.len())?;
            for (chunk, w) in cmd.bytes_mut().chunks_exact_mut(4).zip(&words) {
                chunk.copy_from_slice(&w.to_le_bytes());
            }
            let handles: Vec<u32> = bos.iter().map(|b| b.handle).collect();
            let cmd_handle = cmd.handle;
            bos.push(cmd);
            let mut exec = ExecCmd {
                hwctx: ctx.handle,
                ty: CMD_SUBMIT_EXEC_BUF,
                cmd_handles: u64::from(cmd_handle),
                args: handles.as_ptr() as u64,
                cmd_count: 1,
                arg_count: handles.len() as u32,
                ..Default::default()
            };
            self.call(Ioctl::ExecCmd(&mut exec))?;
            let (handle, point) = (ctx.syncobj, exec.seq);
            let mut wait = SyncobjTimelineWait {
                handles: &handle as *const u32 as u64,
                points: &point as *const u64 as u64,
                timeout_nsec: self.driver.now_ns() + COMMAND_TIMEOUT_NS,
                count_handles: 1,
                flags: SYNCOBJ_WAIT_ALL | SYNCOBJ_WAIT_FOR_SUBMIT,
                ..Default::default()
            };
            self.call(Ioctl::SyncobjTimelineWait(&mut wait))?;
            let cmd = bos.last().expect("the command buffer");
            let header = u32::from_le_bytes(cmd.bytes()[..4].try_into().expect("4 bytes"));
            if cmd_state(header) != ERT_STATE_COMPLETED {
                return Err(NpuError::Command { state: cmd_state(header) });
            }
            let outs = &bos[bos.len() - 1 - output_lens.len()..bos.len() - 1];
            let mut read = vec![];
            for (out, &len) in outs.iter().zip(output_lens) {
                self.sync(out, SYNC_FROM_DEVICE)?;
                read.push(out.bytes()[..len].to_vec());
            }
            Ok(read)
        })();
        for bo in bos {
            self.free(bo);
        }
        result
    }

    /// One int8 GEMM design: `a` (M×K) and `b` (K×N) row-major int8, the int32 M×N result.
    pub fn run_gemm(
        &mut self,
        ctx: &HwContext,
        insts: &[u8],
        a: &[i8],
        b: &[i8],
        out_elems: usize,
    ) -> Result<Vec<i32>, NpuError> {
        let bytes = |v: &[i8]| v.iter().map(|&x| x as u8).collect::<Vec<u8>>();
        let out = self.run(ctx, insts, &[&bytes(a), &bytes(b)], 4 * out_elems)?;
        Ok(out.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

impl<D: Driver> Drop for Npu<D> {
    fn drop(&mut self) {
        if let Some(heap) = self.heap.take() {
            self.free(heap);
        }
    }
}

/// The ERT command for one run: header, CU mask, then mlir-aie's kernel arguments (opcode 3 as
/// u64, the instruction stream's address as u64, its length in 32-bit words, each buffer's
/// address as u64, low word first).
pub fn command_words(instr_addr: u64, instr_words: u32, buffers: impl Iterator<Item = u64>) -> Vec<u32> {
    let mut w = vec![0u32, 1];
    let split = |w: &mut Vec<u32>, v: u64| {
        w.push(v as u32);
        w.push((v >> 32) as u32);
    };
    split(&mut w, DPU_OPCODE_TRANSACTION);
    split(&mut w, instr_addr);
    w.push(instr_words);
    for b in buffers {
        split(&mut w, b);
    }
    w[0] = cmd_header(ERT_STATE_NEW, (w.len() - 1) as u32, ERT_START_CU);
    w
}
