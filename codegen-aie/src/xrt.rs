//! The XRT backend (feature `xrt`, off by default): the way a design runs on a real XDNA NPU.
//!
//! XRT ≥ 2.18 (hardware contexts and the ELF flow; Debian's 2.13 lacks both) is loaded at run
//! time with `dlopen`, so npuc neither links nor needs it to build. What exists today is the
//! discovery half: [`Xrt::open`] finds the library and the NPU's accel device node and says
//! precisely what is missing. Running a design needs its device artifacts (instruction stream and
//! xclbin from mlir-aie's `aiecc`), which bundles do not carry yet, so [`Xrt::run_gemm`] refuses
//! with that reason instead of pretending.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

/// Libraries tried, in order.
pub const XRT_LIBRARIES: &[&str] = &["libxrt_coreutil.so.2", "libxrt_coreutil.so"];
/// Where the amdxdna driver exposes the NPU.
pub const ACCEL_DIR: &str = "/dev/accel";

extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlclose(handle: *mut c_void) -> c_int;
    fn dlerror() -> *const c_char;
}

const RTLD_NOW: c_int = 2;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum XrtError {
    #[error("XRT not found: none of {tried} loads ({detail}); install XRT >= 2.18 with the amdxdna driver, or run the bundle with --backend host")]
    NoLibrary { tried: String, detail: String },
    #[error("no XDNA NPU: {ACCEL_DIR} has no accel device (is the amdxdna driver loaded?); run the bundle with --backend host")]
    NoDevice,
    #[error("design {design}: the bundle has no device artifacts for it (instruction stream and xclbin from mlir-aie's aiecc); run the bundle with --backend host")]
    NoArtifacts { design: String },
}

/// A loaded XRT and the NPU it found.
pub struct Xrt {
    handle: *mut c_void,
    pub device: PathBuf,
}

impl Drop for Xrt {
    fn drop(&mut self) {
        // SAFETY: `handle` came from a successful dlopen and is closed once.
        unsafe { dlclose(self.handle) };
    }
}

fn accel_device(dir: &Path) -> Option<PathBuf> {
    let mut nodes: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("accel")))
        .collect();
    nodes.sort();
    nodes.into_iter().next()
}

impl Xrt {
    /// Loads XRT and finds the NPU, or says which of the two is missing.
    pub fn open() -> Result<Xrt, XrtError> {
        let mut detail = String::new();
        let mut handle = std::ptr::null_mut();
        for name in XRT_LIBRARIES {
            let c = CString::new(*name).expect("library names have no NUL");
            // SAFETY: a NUL-terminated name; dlopen has no other preconditions.
            handle = unsafe { dlopen(c.as_ptr(), RTLD_NOW) };
            if !handle.is_null() {
                break;
            }
            // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call.
            let e = unsafe { dlerror() };
            if !e.is_null() {
                detail = unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned();
            }
        }
        if handle.is_null() {
            return Err(XrtError::NoLibrary { tried: XRT_LIBRARIES.join(", "), detail });
        }
        let xrt = Xrt { handle, device: PathBuf::new() };
        let device = accel_device(Path::new(ACCEL_DIR)).ok_or(XrtError::NoDevice)?;
        Ok(Xrt { device, ..xrt })
    }

    /// Runs one design on int8 host buffers and returns the int32 readback.
    pub fn run_gemm(&self, design: &str, _a: &[i8], _b: &[i8]) -> Result<Vec<i32>, XrtError> {
        Err(XrtError::NoArtifacts { design: design.to_string() })
    }
}
