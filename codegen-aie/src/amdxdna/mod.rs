//! Running a design on an XDNA NPU through the amdxdna driver's ioctls (Linux ≥ 6.14, device
//! nodes `/dev/accel/accel*`), with no XRT in between.
//!
//! The sequence, as the driver's UAPI (`include/uapi/drm/amdxdna_accel.h`) and its command
//! handling define it:
//!
//! 1. `GET_INFO(QUERY_AIE_METADATA)`: columns and core rows of the array.
//! 2. A `DEV_HEAP` buffer object, mapped: the driver sub-allocates every `DEV` buffer from it, and
//!    a hardware context can only be created once the heap exists.
//! 3. The design's PDI (from mlir-aie's toolchain) in a `DEV` buffer; `CREATE_HWCTX` for the
//!    columns the design uses (`num_tiles` = columns × core rows), then `CONFIG_HWCTX(CONFIG_CU)`
//!    with that buffer as CU 0.
//! 4. The instruction stream in a `DEV` buffer, inputs and output in mapped `SHMEM` buffers, each
//!    synced to the device (`SYNC_BO`).
//! 5. A `CMD` buffer holding one ERT command: header (state NEW, payload word count, opcode
//!    `ERT_START_CU`), the CU mask, then the arguments in the register map mlir-aie's kernels
//!    declare — opcode 3 (u64), instruction address (u64), instruction count (u32 words), one
//!    device address (u64) per buffer; `EXEC_CMD` with every buffer it names returns a sequence
//!    number.
//! 6. `SYNCOBJ_TIMELINE_WAIT` on the context's syncobj at that point (absolute timeout), the
//!    command's state read back from the header (COMPLETED or an error naming the state), and the
//!    output synced from the device.
//!
//! Every ioctl goes through the [`Driver`] trait: [`AccelFile`] is the device node, and tests put
//! a model of the driver's checks in its place, so everything up to the ioctl boundary runs here
//! without an NPU.

pub mod sim;

use std::ffi::c_void;
use std::path::{Path, PathBuf};

/// Layouts of the driver's UAPI structures (all fields little-endian, C layout).
pub mod uapi {
    /// `struct amdxdna_qos_info`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct QosInfo {
        pub gops: u32,
        pub fps: u32,
        pub dma_bandwidth: u32,
        pub latency: u32,
        pub frame_exec_time: u32,
        pub priority: u32,
    }

    /// `struct amdxdna_drm_create_hwctx`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct CreateHwctx {
        pub ext: u64,
        pub ext_flags: u64,
        pub qos_p: u64,
        pub umq_bo: u32,
        pub log_buf_bo: u32,
        pub max_opc: u32,
        pub num_tiles: u32,
        pub mem_size: u32,
        pub umq_doorbell: u32,
        pub handle: u32,
        pub syncobj_handle: u32,
    }

    /// `struct amdxdna_drm_destroy_hwctx`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct DestroyHwctx {
        pub handle: u32,
        pub pad: u32,
    }

    /// `struct amdxdna_cu_config`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct CuConfig {
        pub cu_bo: u32,
        pub cu_func: u8,
        pub pad: [u8; 3],
    }

    /// `struct amdxdna_hwctx_param_config_cu` with one CU.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct ConfigCu {
        pub num_cus: u16,
        pub pad: [u16; 3],
        pub cu_configs: [CuConfig; 1],
    }

    /// `struct amdxdna_drm_config_hwctx`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct ConfigHwctx {
        pub handle: u32,
        pub param_type: u32,
        pub param_val: u64,
        pub param_val_size: u32,
        pub pad: u32,
    }

    /// `struct amdxdna_drm_create_bo`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct CreateBo {
        pub flags: u64,
        pub vaddr: u64,
        pub size: u64,
        pub ty: u32,
        pub handle: u32,
    }

    /// `struct amdxdna_drm_get_bo_info`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct GetBoInfo {
        pub ext: u64,
        pub ext_flags: u64,
        pub handle: u32,
        pub pad: u32,
        pub map_offset: u64,
        pub vaddr: u64,
        pub xdna_addr: u64,
    }

    /// `struct amdxdna_drm_sync_bo`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct SyncBo {
        pub handle: u32,
        pub direction: u32,
        pub offset: u64,
        pub size: u64,
    }

    /// `struct amdxdna_drm_exec_cmd`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct ExecCmd {
        pub ext: u64,
        pub ext_flags: u64,
        pub hwctx: u32,
        pub ty: u32,
        pub cmd_handles: u64,
        pub args: u64,
        pub cmd_count: u32,
        pub arg_count: u32,
        pub seq: u64,
    }

    /// `struct amdxdna_drm_get_info`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct GetInfo {
        pub param: u32,
        pub buffer_size: u32,
        pub buffer: u64,
    }

    /// `struct amdxdna_drm_query_aie_tile_metadata`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct TileMetadata {
        pub row_count: u16,
        pub row_start: u16,
        pub dma_channel_count: u16,
        pub lock_count: u16,
        pub event_reg_count: u16,
        pub pad: [u16; 3],
    }

    /// `struct amdxdna_drm_query_aie_metadata`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct AieMetadata {
        pub col_size: u32,
        pub cols: u16,
        pub rows: u16,
        pub version_major: u32,
        pub version_minor: u32,
        pub core: TileMetadata,
        pub mem: TileMetadata,
        pub shim: TileMetadata,
    }

    /// `struct drm_gem_close`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct GemClose {
        pub handle: u32,
        pub pad: u32,
    }

    /// `struct drm_syncobj_timeline_wait` (without the later `deadline_nsec`, which the DRM core
    /// zero-fills for callers that pass the shorter size).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct SyncobjTimelineWait {
        pub handles: u64,
        pub points: u64,
        pub timeout_nsec: i64,
        pub count_handles: u32,
        pub flags: u32,
        pub first_signaled: u32,
        pub pad: u32,
    }

    pub const BO_SHMEM: u32 = 1;
    pub const BO_DEV_HEAP: u32 = 2;
    pub const BO_DEV: u32 = 3;
    pub const BO_CMD: u32 = 4;
    pub const SYNC_TO_DEVICE: u32 = 0;
    pub const SYNC_FROM_DEVICE: u32 = 1;
    pub const HWCTX_CONFIG_CU: u32 = 0;
    pub const CMD_SUBMIT_EXEC_BUF: u32 = 0;
    pub const QUERY_AIE_METADATA: u32 = 1;
    pub const SYNCOBJ_WAIT_ALL: u32 = 1;
    pub const SYNCOBJ_WAIT_FOR_SUBMIT: u32 = 2;

    /// ERT command opcodes and states (the command header's fields).
    pub const ERT_START_CU: u32 = 0;
    pub const ERT_STATE_NEW: u32 = 1;
    pub const ERT_STATE_COMPLETED: u32 = 4;
    /// The opcode word mlir-aie's kernels take first: run the instruction stream.
    pub const DPU_OPCODE_TRANSACTION: u64 = 3;

    /// The command header: state in bits 0..4, payload word count in bits 12..23, opcode in
    /// bits 23..28.
    pub fn cmd_header(state: u32, count: u32, opcode: u32) -> u32 {
        (state & 0xf) | ((count & 0x7ff) << 12) | ((opcode & 0x1f) << 23)
    }

    pub fn cmd_state(header: u32) -> u32 {
        header & 0xf
    }

    pub fn cmd_state_name(state: u32) -> &'static str {
        match state {
            0 => "INVALID",
            1 => "NEW",
            2 => "QUEUED",
            3 => "RUNNING",
            4 => "COMPLETED",
            5 => "ERROR",
            6 => "ABORT",
            7 => "SUBMITTED",
            8 => "TIMEOUT",
            9 => "NORESPONSE",
            _ => "unknown",
        }
    }

    /// Linux's `_IOC(dir, 'd', nr, size)` for DRM ioctls.
    pub const fn drm_ioc(dir: u64, nr: u64, size: usize) -> u64 {
        (dir << 30) | ((size as u64) << 16) | ((b'd' as u64) << 8) | nr
    }
    const WRITE: u64 = 1;
    const READ_WRITE: u64 = 3;
    const COMMAND_BASE: u64 = 0x40;
    pub const IOCTL_CREATE_HWCTX: u64 = drm_ioc(READ_WRITE, COMMAND_BASE, size_of::<CreateHwctx>());
    pub const IOCTL_DESTROY_HWCTX: u64 = drm_ioc(READ_WRITE, COMMAND_BASE + 1, size_of::<DestroyHwctx>());
    pub const IOCTL_CONFIG_HWCTX: u64 = drm_ioc(READ_WRITE, COMMAND_BASE + 2, size_of::<ConfigHwctx>());
    pub const IOCTL_CREATE_BO: u64 = drm_ioc(READ_WRITE, COMMAND_BASE + 3, size_of::<CreateBo>());
    pub const IOCTL_GET_BO_INFO: u64 = drm_ioc(READ_WRITE, COMMAND_BASE + 4, size_of::<GetBoInfo>());
    pub const IOCTL_SYNC_BO: u64 = drm_ioc(READ_WRITE, COMMAND_BASE + 5, size_of::<SyncBo>());
    pub const IOCTL_EXEC_CMD: u64 = drm_ioc(READ_WRITE, COMMAND_BASE + 6, size_of::<ExecCmd>());
    pub const IOCTL_GET_INFO: u64 = drm_ioc(READ_WRITE, COMMAND_BASE + 7, size_of::<GetInfo>());
    pub const IOCTL_GEM_CLOSE: u64 = drm_ioc(WRITE, 0x09, size_of::<GemClose>());
    pub const IOCTL_SYNCOBJ_TIMELINE_WAIT: u64 = drm_ioc(READ_WRITE, 0xca, size_of::<SyncobjTimelineWait>());
}

use uapi::*;

/// One ioctl and its argument, typed.
pub enum Ioctl<'a> {
    GetInfo(&'a mut GetInfo),
    CreateBo(&'a mut CreateBo),
    GetBoInfo(&'a mut GetBoInfo),
    SyncBo(&'a mut SyncBo),
    CreateHwctx(&'a mut CreateHwctx),
    ConfigHwctx(&'a mut ConfigHwctx),
    DestroyHwctx(&'a mut DestroyHwctx),
    ExecCmd(&'a mut ExecCmd),
    SyncobjTimelineWait(&'a mut SyncobjTimelineWait),
    GemClose(&'a mut GemClose),
}

impl Ioctl<'_> {
    pub fn name(&self) -> &'static str {
        match self {
            Ioctl::GetInfo(_) => "GET_INFO",
            Ioctl::CreateBo(_) => "CREATE_BO",
            Ioctl::GetBoInfo(_) => "GET_BO_INFO",
            Ioctl::SyncBo(_) => "SYNC_BO",
            Ioctl::CreateHwctx(_) => "CREATE_HWCTX",
            Ioctl::ConfigHwctx(_) => "CONFIG_HWCTX",
            Ioctl::DestroyHwctx(_) => "DESTROY_HWCTX",
            Ioctl::ExecCmd(_) => "EXEC_CMD",
            Ioctl::SyncobjTimelineWait(_) => "SYNCOBJ_TIMELINE_WAIT",
            Ioctl::GemClose(_) => "GEM_CLOSE",
        }
    }

    /// The request number and argument pointer `ioctl(2)` takes.
    pub fn raw(&mut self) -> (u64, *mut c_void) {
        fn p<T>(t: &mut T) -> *mut c_void {
            t as *mut T as *mut c_void
        }
        match self {
            Ioctl::GetInfo(a) => (IOCTL_GET_INFO, p(*a)),
            Ioctl::CreateBo(a) => (IOCTL_CREATE_BO, p(*a)),
            Ioctl::GetBoInfo(a) => (IOCTL_GET_BO_INFO, p(*a)),
            Ioctl::SyncBo(a) => (IOCTL_SYNC_BO, p(*a)),
            Ioctl::CreateHwctx(a) => (IOCTL_CREATE_HWCTX, p(*a)),
            Ioctl::ConfigHwctx(a) => (IOCTL_CONFIG_HWCTX, p(*a)),
            Ioctl::DestroyHwctx(a) => (IOCTL_DESTROY_HWCTX, p(*a)),
            Ioctl::ExecCmd(a) => (IOCTL_EXEC_CMD, p(*a)),
            Ioctl::SyncobjTimelineWait(a) => (IOCTL_SYNCOBJ_TIMELINE_WAIT, p(*a)),
            Ioctl::GemClose(a) => (IOCTL_GEM_CLOSE, p(*a)),
        }
    }
}

/// What the runtime needs of the device node.
pub trait Driver {
    /// Performs one ioctl; the driver reads and writes the argument (and what it points to).
    fn ioctl(&mut self, call: Ioctl<'_>) -> std::io::Result<()>;
    /// Maps `len` bytes of a buffer object at its fake mmap offset.
    fn map(&mut self, offset: u64, len: usize) -> std::io::Result<*mut u8>;
    fn unmap(&mut self, ptr: *mut u8, len: usize);
    /// `CLOCK_MONOTONIC` now, in nanoseconds (timeline waits take absolute deadlines).
    fn now_ns(&self) -> i64;
}

/// The NPU's device node.
pub struct AccelFile {
    file: std::fs::File,
    pub path: PathBuf,
}

impl AccelFile {
    pub fn open(path: &Path) -> std::io::Result<AccelFile> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        Ok(AccelFile { file, path: path.to_path_buf() })
    }
}

impl Driver for AccelFile {
    fn ioctl(&mut self, mut call: Ioctl<'_>) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let (request, arg) = call.raw();
        // SAFETY: `arg` points to the live, correctly laid out argument of `request`; pointers
        // inside it point to buffers the caller keeps alive for the call.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), request as _, arg) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn map(&mut self, offset: u64, len: usize) -> std::io::Result<*mut u8> {
        use std::os::fd::AsRawFd;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh shared mapping of the device file; the kernel validates the offset.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, self.file.as_raw_fd(), offset as _)
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(p as *mut u8)
    }

    fn unmap(&mut self, ptr: *mut u8, len: usize) {
        // SAFETY: `ptr`/`len` came from `map` and are unmapped once.
        unsafe { libc::munmap(ptr as *mut c_void, len) };
    }

    fn now_ns(&self) -> i64 {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid timespec to write.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
        t.tv_sec * 1_000_000_000 + t.tv_nsec
    }
}

/// Where the amdxdna driver puts the NPU's device node.
pub const ACCEL_DIR: &str = "/dev/accel";

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
            let out = self.upload(BO_SHMEM, &vec![0u8; output_len])?;
            bos.push(out);
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
            let out = &bos[bos.len() - 2];
            self.sync(out, SYNC_FROM_DEVICE)?;
            Ok(out.bytes()[..output_len].to_vec())
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
