//! The amdxdna run path of `xdna-driver` against the driver model of `amdxdna::sim`: a GEMM
//! through every ioctl int32-exact with every buffer object freed, and the errors of the path.
#![cfg(feature = "xrt")]

#[allow(dead_code)]
mod common;

use codegen_aie::amdxdna::sim::{npu1_metadata, FirmwareError, Sim};
use codegen_aie::interp::InterpError;
use codegen_aie::{design, tiling, Device, GemmShape};
use xdna_driver::{Npu, NpuError};

fn gemm_design(m: usize, k: usize, n: usize) -> design::Design {
    design::build(&tiling::choose(Device::Npu1, GemmShape { m, k, n }).unwrap())
}

#[test]
fn a_gemm_through_the_ioctl_path_is_int32_exact_and_frees_every_buffer() {
    let s = Sim::interpreting();
    let d = gemm_design(64, 128, 64);
    let t = &d.tiling;
    let (sh, p) = (t.shape, t.padded);
    let a = common::pad(&common::values(sh.m * sh.k, 3), (sh.m, sh.k), (p.m, p.k));
    let b = common::pad(&common::values(sh.k * sh.n, 4), (sh.k, sh.n), (p.k, p.n));
    let want = common::reference(&a, &b, (p.m, p.k, p.n));
    let insts = vec![0u8; 64];
    {
        let mut npu = Npu::with_driver(s.clone()).unwrap();
        assert_eq!(npu.metadata, npu1_metadata());
        let ctx = npu.context(d.generic().as_bytes(), t.cols as u32).unwrap();
        for _ in 0..2 {
            let got = npu.run_gemm(&ctx, &insts, &a, &b, p.m * p.n).unwrap();
            assert_eq!(got, want);
        }
        npu.release(ctx);
    }
    let st = s.state();
    assert!(st.bos.is_empty(), "{} buffer objects left open", st.bos.len());
    assert!(st.ctxs.is_empty());
    let first: Vec<&str> = st.calls.iter().take(6).copied().collect();
    assert_eq!(first, ["GET_INFO", "CREATE_BO", "GET_BO_INFO", "CREATE_BO", "GET_BO_INFO", "SYNC_BO"]);
    assert_eq!(st.calls.iter().filter(|&&c| c == "EXEC_CMD").count(), 2);
}

#[test]
fn the_ioctl_path_reports_what_went_wrong() {
    let d = gemm_design(64, 64, 64);
    let (a, b) = (vec![1i8; 64 * 64], vec![1i8; 64 * 64]);
    // More columns than the array has.
    let sim = Sim::interpreting();
    let mut npu = Npu::with_driver(sim.clone()).unwrap();
    let err = npu.context(d.generic().as_bytes(), 9).err().unwrap();
    assert!(matches!(err, NpuError::Columns { need: 9, have: 4 }), "{err}");
    // A PDI the firmware cannot load makes the command fail, with its state named.
    let ctx = npu.context(b"not a design", 1).unwrap();
    let err = npu.run_gemm(&ctx, &[0; 16], &a, &b, 64 * 64).unwrap_err();
    assert!(err.to_string().contains("ERROR"), "{err}");
    let firmware_error = sim.state().firmware_error.take();
    assert!(
        matches!(firmware_error, Some(FirmwareError::Design(InterpError::Parse { line: 1, .. }))),
        "{firmware_error:?}"
    );
    // An instruction stream that is not whole words is refused before any ioctl.
    let err = npu.run_gemm(&ctx, &[0; 6], &a, &b, 64 * 64).unwrap_err();
    assert!(err.to_string().contains("6 bytes"), "{err}");
    npu.release(ctx);
    // A failing ioctl is named, and what was created before it is released.
    let s = Sim::interpreting();
    s.state().fail = Some("CONFIG_HWCTX");
    let mut npu = Npu::with_driver(s.clone()).unwrap();
    let err = npu.context(d.generic().as_bytes(), 1).err().unwrap();
    assert!(err.to_string().starts_with("amdxdna CONFIG_HWCTX"), "{err}");
    drop(npu);
    assert!(s.state().bos.is_empty() && s.state().ctxs.is_empty());
}
