//! The XRT backend says what is missing instead of failing obscurely: without XRT or an NPU,
//! opening fails naming the library or the device node; with both, running a design without
//! device artifacts fails naming the design.
#![cfg(feature = "xrt")]

use codegen_aie::xrt::{Xrt, XrtError, ACCEL_DIR};

#[test]
fn xrt_reports_what_is_missing() {
    match Xrt::open() {
        Err(e @ XrtError::NoLibrary { .. }) => {
            let text = e.to_string();
            assert!(text.contains("libxrt_coreutil.so") && text.contains("--backend host"), "{text}");
        }
        Err(e @ XrtError::NoDevice) => {
            let text = e.to_string();
            assert!(text.contains(ACCEL_DIR) && text.contains("amdxdna"), "{text}");
            assert!(std::fs::read_dir(ACCEL_DIR).map_or(true, |d| d.count() == 0));
        }
        Err(e) => panic!("unexpected: {e}"),
        Ok(x) => {
            assert!(x.device.starts_with(ACCEL_DIR));
            let err = x.run_gemm("gemm_64x64x64_npu1", &[], &[]).unwrap_err();
            assert!(err.to_string().contains("gemm_64x64x64_npu1"), "{err}");
        }
    }
}
