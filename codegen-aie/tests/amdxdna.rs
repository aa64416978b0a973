//! The amdxdna run path against the driver model of `amdxdna::sim`: the UAPI layouts and ioctl
//! numbers, the command words, a GEMM through every ioctl int32-exact with every buffer object
//! freed, and the errors of the path.
#![cfg(feature = "xrt")]

#[allow(dead_code)]
mod common;

use codegen_aie::amdxdna::sim::{npu1_metadata, Sim};
use codegen_aie::amdxdna::uapi::*;
use codegen_aie::amdxdna::{command_words, Npu, NpuError};
use codegen_aie::{design, tiling, Device, GemmShape};

#[test]
fn ioctl_numbers_are_the_drm_encodings_of_the_uapi_sizes() {
    // Struct sizes as the UAPI header lays them out (C layout, natural alignment).
    assert_eq!(
        [
            size_of::<CreateHwctx>(),
            size_of::<DestroyHwctx>(),
            size_of::<ConfigHwctx>(),
            size_of::<CreateBo>(),
            size_of::<GetBoInfo>(),
            size_of::<SyncBo>(),
            size_of::<ExecCmd>(),
            size_of::<GetInfo>(),
            size_of::<AieMetadata>(),
            size_of::<ConfigCu>(),
            size_of::<SyncobjTimelineWait>(),
        ],
        [56, 8, 24, 32, 48, 24, 56, 16, 64, 16, 40]
    );
    assert_eq!(std::mem::offset_of!(ExecCmd, seq), 48);
    assert_eq!(std::mem::offset_of!(GetBoInfo, xdna_addr), 40);
    assert_eq!(std::mem::offset_of!(AieMetadata, core), 16);
    // _IOWR('d', 0x40 + nr, size): direction 3 in bits 30-31, size in 16-29, 'd' in 8-15.
    assert_eq!(IOCTL_CREATE_HWCTX, 0xc038_6440);
    assert_eq!(IOCTL_EXEC_CMD, 0xc038_6446);
    assert_eq!(IOCTL_GET_INFO, 0xc010_6447);
    assert_eq!(IOCTL_GEM_CLOSE, 0x4008_6409);
    assert_eq!(IOCTL_SYNCOBJ_TIMELINE_WAIT, 0xc028_64ca);
}

#[test]
fn command_words_follow_the_mlir_aie_kernel_register_map() {
    let w = command_words(0x1234_5678_9abc, 40, [0x1_0000_1000u64, 0x2_0000_2000].into_iter());
    // Header: state NEW, 10 payload words, ERT_START_CU; then the CU mask.
    assert_eq!(w.len(), 11);
    assert_eq!(w[0], 1 | (10 << 12));
    assert_eq!(w[1], 1);
    // Opcode 3 (u64), instruction address (u64), instruction words (u32), then buffers.
    assert_eq!(&w[2..], &[3, 0, 0x5678_9abc, 0x1234, 40, 0x1000, 1, 0x2000, 2]);
}

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
    let mut npu = Npu::with_driver(Sim::interpreting()).unwrap();
    let err = npu.context(d.generic().as_bytes(), 9).err().unwrap();
    assert!(matches!(err, NpuError::Columns { need: 9, have: 4 }), "{err}");
    // A PDI the firmware cannot load makes the command fail, with its state named.
    let ctx = npu.context(b"not a design", 1).unwrap();
    let err = npu.run_gemm(&ctx, &[0; 16], &a, &b, 64 * 64).unwrap_err();
    assert!(err.to_string().contains("ERROR"), "{err}");
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

#[test]
fn opening_without_an_npu_names_what_is_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let err = Npu::open(tmp.path()).err().expect("an empty folder has no NPU");
    let text = err.to_string();
    assert!(text.contains("no XDNA NPU") && text.contains("has no accel node") && text.contains("amdxdna"), "{text}");
    let missing = tmp.path().join("nothing");
    let text = Npu::open(&missing).err().unwrap().to_string();
    assert!(text.contains(missing.to_str().unwrap()), "{text}");
}
