//! Layouts of the amdxdna driver's UAPI structures (`include/uapi/drm/amdxdna_accel.h`; all
//! fields little-endian, C layout), its constants, and the DRM ioctl numbers.

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
