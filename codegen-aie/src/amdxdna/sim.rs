//! A model of the amdxdna driver for tests: every ioctl is checked the way the driver checks it
//! (must-be-zero fields, buffer types, a heap before a context, a configured CU before a
//! command, the command header's word count, addresses that belong to the buffers the command
//! names, a wait on the context's syncobj at a submitted point), buffer objects are not coherent
//! (the device sees host writes only after SYNC_BO to the device, the host sees device writes only
//! after SYNC_BO from it), and the "device" runs a [`Firmware`] on the loaded PDI, the instruction
//! stream and the buffers. [`Sim::interpreting`] is the firmware tests use: its PDI is a design's
//! own text and running it is the design interpreter, so a GEMM comes back int32-exact only if
//! every buffer, address and sync on the way is right. What it cannot show is the NPU itself.

use crate::interp;
use std::collections::HashMap;
use std::io::{Error, ErrorKind};
use std::sync::{Arc, Mutex, MutexGuard};
use xdna_driver::uapi::*;
use xdna_driver::{Driver, Ioctl};

/// A buffer object of the simulated driver.
pub struct SimBo {
    pub ty: u32,
    /// What the host sees (for DEV buffers, a range of the heap's host view).
    host: *mut u8,
    size: usize,
    /// What the device sees.
    device: Vec<u8>,
    xdna_addr: u64,
    map_offset: u64,
    _own: Option<Box<[u8]>>,
}

/// A hardware context of the simulated driver.
#[derive(Default)]
pub struct Ctx {
    cu_pdi: Option<u32>,
    syncobj: u32,
}

/// What the device does with a loaded PDI, an instruction stream and the buffers' contents: the
/// output (the last buffer's new contents) or a failure.
pub type Firmware = Box<dyn FnMut(&[u8], &[u8], &[Vec<u8>]) -> Result<Vec<Vec<u8>>, FirmwareError> + Send>;

/// Why the simulated device failed a command (the driver reports it as the command's state).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FirmwareError {
    #[error("the command has no instructions")]
    NoInstructions,
    #[error("the PDI is not a design's text: {0}")]
    PdiNotText(#[from] std::str::Utf8Error),
    #[error(transparent)]
    Design(#[from] interp::InterpError),
}

/// The simulated driver's state, open for tests to inspect.
#[derive(Default)]
pub struct State {
    pub meta: AieMetadata,
    pub bos: HashMap<u32, SimBo>,
    next: u32,
    next_addr: u64,
    heap: Option<u32>,
    heap_used: usize,
    pub ctxs: HashMap<u32, Ctx>,
    submitted: HashMap<u32, Vec<u64>>,
    seq: u64,
    /// Every ioctl made, by name.
    pub calls: Vec<&'static str>,
    firmware: Option<Firmware>,
    /// Why the firmware failed the last command it failed.
    pub firmware_error: Option<FirmwareError>,
    /// Fail this ioctl (by name) with EINVAL.
    pub fail: Option<&'static str>,
}

/// A simulated NPU; clones share one state.
#[derive(Clone)]
pub struct Sim(Arc<Mutex<State>>);

// SAFETY: the raw pointers in the state point into buffers the state owns (or the caller's
// mapping of them); every access goes through the mutex.
unsafe impl Send for State {}

impl Sim {
    pub fn new(meta: AieMetadata, firmware: Firmware) -> Sim {
        Sim(Arc::new(Mutex::new(State { meta, firmware: Some(firmware), ..Default::default() })))
    }

    /// An npu1-shaped array (4 columns of 4 compute rows) whose firmware treats the PDI as a
    /// design's text and runs it through the design interpreter on the buffers.
    pub fn interpreting() -> Sim {
        let firmware: Firmware = Box::new(|pdi, insts, buffers| {
            if insts.is_empty() {
                return Err(FirmwareError::NoInstructions);
            }
            run_design(pdi, buffers)
        });
        Sim::new(npu1_metadata(), firmware)
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What [`Sim::interpreting`]'s device does: the PDI is a design's text, the buffers its
/// runtime sequence's arguments (their bytes read as the arguments' element types), and what
/// comes back every buffer as the design left it — its outputs written, whichever they are.
pub fn run_design(pdi: &[u8], buffers: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, FirmwareError> {
    let text = std::str::from_utf8(pdi)?;
    let args: Vec<interp::Arg> = buffers.iter().map(|b| interp::Arg::Bytes(b)).collect();
    let (after, _) = interp::run_buffers(text, &args)?;
    let bytes = |words: &[i32], len: usize| match len == words.len() {
        // An i8 argument: a value a word.
        true => words.iter().map(|&v| v as u8).collect(),
        false => words.iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    Ok(after.iter().zip(buffers).map(|(w, b)| bytes(w, b.len())).collect())
}

/// What an npu1 (Phoenix) reports: 4 columns, shim row 0, mem tile row 1, 4 compute rows from 2.
pub fn npu1_metadata() -> AieMetadata {
    let tile = |rows, start| TileMetadata { row_count: rows, row_start: start, ..Default::default() };
    AieMetadata { cols: 4, rows: 6, core: tile(4, 2), mem: tile(1, 1), shim: tile(1, 0), ..Default::default() }
}

fn inval(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidInput, msg.to_string())
}

impl State {
    fn bo_by_addr(&self, addr: u64) -> Option<u32> {
        self.bos.iter().find(|(_, b)| b.xdna_addr == addr).map(|(h, _)| *h)
    }

    fn exec(&mut self, a: &mut ExecCmd) -> Result<(), Error> {
        if a.ext != 0 || a.ext_flags != 0 || a.ty != CMD_SUBMIT_EXEC_BUF || a.cmd_count != 1 {
            return Err(inval("exec: MBZ fields, type or command count"));
        }
        let ctx = self.ctxs.get(&a.hwctx).ok_or_else(|| inval("exec: no such hwctx"))?;
        let pdi = ctx.cu_pdi.ok_or_else(|| inval("HW Context is not ready"))?;
        // SAFETY: the caller passes `arg_count` handles it keeps alive for the call.
        let args: Vec<u32> = unsafe { std::slice::from_raw_parts(a.args as *const u32, a.arg_count as usize) }.to_vec();
        if args.iter().any(|h| !self.bos.contains_key(h)) {
            return Err(inval("exec: an argument buffer does not exist"));
        }
        let cmd = self.bos.get(&(a.cmd_handles as u32)).filter(|b| b.ty == BO_CMD);
        let cmd = cmd.ok_or_else(|| inval("exec: the command is not a CMD buffer"))?;
        // SAFETY: the driver reads a CMD buffer's host view (it is coherent for the driver).
        let host = unsafe { std::slice::from_raw_parts(cmd.host, cmd.size) };
        let words: Vec<u32> = host.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let header = words[0];
        let count = ((header >> 12) & 0x7ff) as usize;
        if cmd_state(header) != ERT_STATE_NEW || (header >> 23) & 0x1f != ERT_START_CU || count + 1 > words.len() {
            return Err(inval("exec: header"));
        }
        let p = &words[1..=count];
        if p.len() < 6 || p[0] & 1 == 0 {
            return Err(inval("exec: payload or CU mask"));
        }
        let u64_at = |i: usize| u64::from(p[i]) | (u64::from(p[i + 1]) << 32);
        if u64_at(1) != DPU_OPCODE_TRANSACTION {
            return Err(inval("exec: opcode"));
        }
        let listed = |h: &u32| args.contains(h);
        let instr = self.bo_by_addr(u64_at(3)).filter(listed).ok_or_else(|| inval("exec: instruction address"))?;
        let instr_bo = &self.bos[&instr];
        if instr_bo.ty != BO_DEV || 4 * p[5] as usize > instr_bo.size {
            return Err(inval("exec: instruction buffer type or size"));
        }
        let insts = instr_bo.device[..4 * p[5] as usize].to_vec();
        let mut buffers = Vec::new();
        let mut i = 6;
        while i + 1 < p.len() {
            let h = self.bo_by_addr(u64_at(i)).filter(listed).ok_or_else(|| inval("exec: buffer address"))?;
            buffers.push(h);
            i += 2;
        }
        if buffers.is_empty() {
            return Err(inval("exec: no buffers"));
        }
        let contents: Vec<Vec<u8>> = buffers.iter().map(|h| self.bos[h].device.clone()).collect();
        let pdi_bytes = self.bos[&pdi].device.clone();
        let firmware = self.firmware.as_mut().expect("a firmware");
        let state = match firmware(&pdi_bytes, &insts, &contents) {
            Ok(after) => {
                for (h, out) in buffers.iter().zip(&after) {
                    let bo = self.bos.get_mut(h).expect("listed");
                    let n = out.len().min(bo.size);
                    bo.device[..n].copy_from_slice(&out[..n]);
                }
                ERT_STATE_COMPLETED
            }
            Err(e) => {
                self.firmware_error = Some(e);
                5
            }
        };
        let cmd = &self.bos[&(a.cmd_handles as u32)];
        // SAFETY: the header word of a live CMD buffer.
        unsafe { *(cmd.host as *mut u32) = (header & !0xf) | state };
        a.seq = self.seq;
        self.submitted.entry(a.hwctx).or_default().push(self.seq);
        self.seq += 1;
        Ok(())
    }
}

impl State {
    fn get_info(&mut self, a: &mut GetInfo) -> Result<(), Error> {
        if a.param != QUERY_AIE_METADATA || (a.buffer_size as usize) < size_of::<AieMetadata>() {
            return Err(inval("get_info"));
        }
        // SAFETY: the caller's buffer of `buffer_size` bytes.
        unsafe { *(a.buffer as *mut AieMetadata) = self.meta };
        Ok(())
    }

    fn create_bo(&mut self, a: &mut CreateBo) -> Result<(), Error> {
        if a.flags != 0 || a.vaddr != 0 || a.size == 0 || !(BO_SHMEM..=BO_CMD).contains(&a.ty) {
            return Err(inval("create_bo: MBZ fields, size or type"));
        }
        let size = a.size as usize;
        let (host, own) = if a.ty == BO_DEV {
            let heap = self.heap.ok_or_else(|| inval("create_bo: no dev heap"))?;
            let at = self.heap_used;
            if at + size > self.bos[&heap].size {
                return Err(Error::new(ErrorKind::OutOfMemory, "dev heap full"));
            }
            self.heap_used += size.div_ceil(4096) * 4096;
            // SAFETY: within the heap's host view.
            (unsafe { self.bos[&heap].host.add(at) }, None)
        } else {
            if a.ty == BO_DEV_HEAP && self.heap.is_some() {
                return Err(inval("create_bo: a second dev heap"));
            }
            let mut mem = vec![0u8; size].into_boxed_slice();
            (mem.as_mut_ptr(), Some(mem))
        };
        self.next += 1;
        let handle = self.next;
        self.next_addr += 0x10_0000;
        let (xdna_addr, map_offset) = (0x1_0000_0000 + self.next_addr, u64::from(handle) << 20);
        let bo = SimBo { ty: a.ty, host, size, device: vec![0; size], xdna_addr, map_offset, _own: own };
        self.bos.insert(handle, bo);
        if a.ty == BO_DEV_HEAP {
            self.heap = Some(handle);
        }
        a.handle = handle;
        Ok(())
    }

    fn get_bo_info(&mut self, a: &mut GetBoInfo) -> Result<(), Error> {
        if a.ext != 0 || a.ext_flags != 0 || a.pad != 0 {
            return Err(inval("get_bo_info: MBZ"));
        }
        let bo = self.bos.get(&a.handle).ok_or_else(|| inval("get_bo_info: no such bo"))?;
        a.map_offset = bo.map_offset;
        a.vaddr = if bo.ty == BO_DEV { bo.host as u64 } else { 0 };
        a.xdna_addr = bo.xdna_addr;
        Ok(())
    }

    fn sync_bo(&mut self, a: &mut SyncBo) -> Result<(), Error> {
        let bo = self.bos.get_mut(&a.handle).ok_or_else(|| inval("sync_bo: no such bo"))?;
        let (off, len) = (a.offset as usize, a.size as usize);
        if off + len > bo.size {
            return Err(inval("sync_bo: range"));
        }
        // SAFETY: the buffer's host view, `size` bytes.
        let host = unsafe { std::slice::from_raw_parts_mut(bo.host, bo.size) };
        match a.direction {
            SYNC_TO_DEVICE => bo.device[off..off + len].copy_from_slice(&host[off..off + len]),
            SYNC_FROM_DEVICE => host[off..off + len].copy_from_slice(&bo.device[off..off + len]),
            _ => return Err(inval("sync_bo: direction")),
        }
        Ok(())
    }

    fn create_hwctx(&mut self, a: &mut CreateHwctx) -> Result<(), Error> {
        if a.ext != 0 || a.ext_flags != 0 || a.qos_p == 0 {
            return Err(inval("create_hwctx: MBZ or no QoS"));
        }
        if self.heap.is_none() {
            return Err(inval("The client dev heap object not exist"));
        }
        let rows = u32::from(self.meta.core.row_count);
        if a.num_tiles == 0 || !a.num_tiles.is_multiple_of(rows) || a.num_tiles / rows > u32::from(self.meta.cols) {
            return Err(inval("create_hwctx: num_tiles"));
        }
        self.next += 1;
        a.handle = self.next;
        a.syncobj_handle = 1000 + self.next;
        let ctx = Ctx { cu_pdi: None, syncobj: a.syncobj_handle };
        self.ctxs.insert(a.handle, ctx);
        Ok(())
    }

    fn config_hwctx(&mut self, a: &mut ConfigHwctx) -> Result<(), Error> {
        if a.pad != 0 || a.param_type != HWCTX_CONFIG_CU || a.param_val_size as usize > 4096 {
            return Err(inval("config_hwctx"));
        }
        // SAFETY: the caller's parameter of `param_val_size` bytes.
        let cu = unsafe { *(a.param_val as *const ConfigCu) };
        if cu.num_cus == 0 || cu.pad != [0; 3] || cu.cu_configs[0].pad != [0; 3] {
            return Err(inval("config_cu: count or MBZ"));
        }
        let pdi = cu.cu_configs[0].cu_bo;
        if self.bos.get(&pdi).map(|b| b.ty) != Some(BO_DEV) {
            return Err(inval("Invalid BO type"));
        }
        let ctx = self.ctxs.get_mut(&a.handle).ok_or_else(|| inval("config_hwctx: no such hwctx"))?;
        if ctx.cu_pdi.is_some() {
            return Err(inval("Not support re-config CU"));
        }
        ctx.cu_pdi = Some(pdi);
        Ok(())
    }

    /// A wait on one context's syncobj at a point submitted to it, before the deadline.
    fn timeline_wait(&mut self, a: &mut SyncobjTimelineWait, now: i64) -> Result<(), Error> {
        // SAFETY: one handle and one point, as `count_handles` says.
        let (h, p) = unsafe { (*(a.handles as *const u32), *(a.points as *const u64)) };
        let ok = a.count_handles == 1
            && a.timeout_nsec > now
            && self
                .ctxs
                .iter()
                .any(|(c, ctx)| ctx.syncobj == h && self.submitted.get(c).is_some_and(|v| v.contains(&p)));
        if !ok {
            return Err(Error::new(ErrorKind::TimedOut, "timeline wait: no such point"));
        }
        Ok(())
    }

    fn gem_close(&mut self, a: &mut GemClose) -> Result<(), Error> {
        if self.heap == Some(a.handle) && self.bos.len() > 1 {
            return Err(inval("closing the heap under live buffers"));
        }
        self.bos.remove(&a.handle).ok_or_else(|| inval("gem_close: no such bo"))?;
        if self.heap == Some(a.handle) {
            self.heap = None;
        }
        Ok(())
    }
}

impl Driver for Sim {
    fn ioctl(&mut self, call: Ioctl<'_>) -> std::io::Result<()> {
        let now = self.now_ns();
        let mut s = self.state();
        let name = call.name();
        s.calls.push(name);
        if s.fail == Some(name) {
            return Err(inval("injected failure"));
        }
        match call {
            Ioctl::GetInfo(a) => s.get_info(a),
            Ioctl::CreateBo(a) => s.create_bo(a),
            Ioctl::GetBoInfo(a) => s.get_bo_info(a),
            Ioctl::SyncBo(a) => s.sync_bo(a),
            Ioctl::CreateHwctx(a) => s.create_hwctx(a),
            Ioctl::ConfigHwctx(a) => s.config_hwctx(a),
            Ioctl::DestroyHwctx(a) => {
                s.ctxs.remove(&a.handle).ok_or_else(|| inval("destroy_hwctx: no such hwctx"))?;
                Ok(())
            }
            Ioctl::ExecCmd(a) => s.exec(a),
            Ioctl::SyncobjTimelineWait(a) => s.timeline_wait(a, now),
            Ioctl::GemClose(a) => s.gem_close(a),
        }
    }

    fn map(&mut self, offset: u64, len: usize) -> std::io::Result<*mut u8> {
        let s = self.state();
        let bo =
            s.bos.values().find(|b| b.map_offset == offset && b.ty != BO_DEV).ok_or_else(|| inval("mmap offset"))?;
        if len > bo.size {
            return Err(inval("mmap length"));
        }
        Ok(bo.host)
    }

    fn unmap(&mut self, _ptr: *mut u8, _len: usize) {}

    fn now_ns(&self) -> i64 {
        1_000
    }
}
