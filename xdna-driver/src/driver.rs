//! The ioctl boundary: every call the run path makes to the amdxdna driver, typed ([`Ioctl`]),
//! the [`Driver`] trait that performs them, and [`AccelFile`], the device node that does so for
//! real. A model of the driver in place of [`AccelFile`] lets everything up to the boundary run
//! without an NPU.

use crate::uapi::*;
use std::ffi::c_void;
use std::path::{Path, PathBuf};

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
