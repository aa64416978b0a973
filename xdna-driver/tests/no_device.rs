//! The driver's side of the ioctl boundary that needs no device: the UAPI layouts and ioctl
//! numbers, the ERT command words, and what opening says when there is no NPU. (The run path
//! through every ioctl is tested against codegen-aie's model of the driver, `amdxdna::sim`.)

use xdna_driver::uapi::*;
use xdna_driver::{command_words, Npu};

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
