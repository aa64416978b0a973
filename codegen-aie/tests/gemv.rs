//! GEMV designs for decode: a block of up to 8 activation rows against a streamed int8 weight,
//! executed from their text by the interpreter and compared bit for bit with a plain int8 × int8
//! → int32 GEMM; their layout on the array (one core per weight stream, every shim channel but
//! the activations' busy); and every GEMV design the plan makes for SmolLM2-135M and a
//! Qwen3-0.6B-shaped model passing the design checker on npu1 and npu2.

mod common;

use codegen_aie::design::{self, Kind};
use codegen_aie::gemm::GemmSite;
use codegen_aie::plan::{self, PlanOptions};
use codegen_aie::{gemv, interp, Device, GemmShape};
use common::{pad, prove, reference, transpose_padded, values};

fn site(node: &str, k: usize, n: usize) -> GemmSite {
    GemmSite::of_shape(node, k, n)
}

fn gemv_design(device: Device, k: usize, n: usize) -> design::Design {
    gemv::build(&gemv::choose(device, GemmShape { m: gemv::GEMV_ROWS, k, n }).unwrap())
}

/// `rows` activation rows (the rest of the block zero, as the runtime pads a call) through the
/// 8-row design for `k × n`; returns the design's `[rows, n]` and the reference.
fn block(device: Device, rows: usize, (k, n): (usize, usize), seed: u64) -> (Vec<i32>, Vec<i32>) {
    let d = gemv_design(device, k, n);
    let p = d.tiling.padded;
    let (a, w) = (values(rows * k, seed), values(k * n, seed + 1));
    let (out, _) =
        interp::run(&d.generic(), &[&pad(&a, (rows, k), (p.m, p.k)), &transpose_padded(&w, (k, n), (p.k, p.n))])
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
    for (i, row) in out.chunks(p.n).enumerate().skip(rows) {
        assert!(row.iter().all(|&x| x == 0), "{}: padding row {i} is not zero", d.name);
    }
    let got = (0..rows).flat_map(|i| out[i * p.n..i * p.n + n].to_vec()).collect();
    (got, reference(&a, &w, (rows, k, n)))
}

#[test]
fn one_three_and_eight_rows_equal_the_reference_bit_for_bit() {
    for device in [Device::Npu1, Device::Npu2] {
        for rows in [1, 3, 8] {
            let (got, want) = block(device, rows, (576, 192), 40 + rows as u64);
            assert_eq!(got, want, "{device}: {rows} rows");
        }
    }
}

#[test]
fn columns_the_cores_do_not_divide_and_a_ragged_k_equal_the_reference() {
    // 100 and 1000 columns over 7 (npu1) and 15 (npu2) cores; K 200 is no multiple of a part,
    // K 2500 needs three parts.
    for device in [Device::Npu1, Device::Npu2] {
        for (k, n) in [(64, 100), (200, 1000), (2500, 100)] {
            let d = gemv_design(device, k, n);
            assert_ne!(n % gemv::streams(device), 0);
            assert!(d.tiling.padded.n > n, "{}: padded {:?}", d.name, d.tiling.padded);
            let (got, want) = block(device, 5, (k, n), k as u64);
            assert_eq!(got, want, "{}", d.name);
        }
    }
    let (parts, _) = gemv::parts_and_tiles(&gemv_design(Device::Npu1, 2500, 100).tiling);
    assert_eq!(parts, 3, "K 2500 in parts of at most 1016");
}

#[test]
fn every_shim_channel_but_the_activations_streams_one_core_its_weights() {
    for (device, streams) in [(Device::Npu1, 7), (Device::Npu2, 15)] {
        assert_eq!(gemv::streams(device), streams);
        let d = gemv_design(device, 576, 1536);
        assert_eq!(d.cores.len(), streams, "{}", d.name);
        let mut per_shim = vec![0; device.columns()];
        for f in d.fifos.iter().filter(|f| f.producer.1 == 0) {
            per_shim[f.producer.0] += 1;
        }
        assert_eq!(per_shim, vec![device.shim_channels(); device.columns()], "{}", d.name);
        let a = d.fifos.iter().find(|f| f.name == "A").unwrap();
        assert_eq!(a.consumers.len(), streams, "A is broadcast to every core");
        let outputs = d.fifos.iter().filter(|f| f.consumers.iter().any(|c| c.1 == 0)).count();
        assert_eq!(outputs, device.columns(), "one joined output per array column");
    }
}

fn smollm2() -> Vec<GemmSite> {
    let shapes = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576), (576, 49152)];
    shapes.iter().enumerate().map(|(i, &(k, n))| site(&format!("s{i}"), k, n)).collect()
}

fn qwen3_0p6b() -> Vec<GemmSite> {
    let shapes = [(1024, 2048), (1024, 1024), (2048, 1024), (1024, 3072), (3072, 1024), (1024, 151936)];
    shapes.iter().enumerate().map(|(i, &(k, n))| site(&format!("q{i}"), k, n)).collect()
}

#[test]
fn the_checker_accepts_every_gemv_design_of_smollm2_and_qwen3_on_npu1_and_npu2() {
    let mut checked = 0;
    for device in [Device::Npu1, Device::Npu2] {
        for sites in [smollm2(), qwen3_0p6b()] {
            let p = plan::plan_sites(sites.clone(), PlanOptions::new(device)).unwrap();
            for g in &p.gemms {
                assert!(!g.gemv_chunks.is_empty(), "{} has no GEMV design", g.site.node);
                for c in &g.gemv_chunks {
                    let name = &c.design;
                    let d = &p.designs[name];
                    assert_eq!((d.kind, d.tiling.shape.m, d.tiling.shape.k), (Kind::Gemv, 8, g.site.k), "{name}");
                    assert!(d.tiling.shape.n >= c.cols, "{name}");
                }
            }
            for (i, d) in p.designs.values().filter(|d| d.kind == Kind::Gemv).enumerate() {
                design::check(d).unwrap_or_else(|e| panic!("{e}"));
                prove(d, 90 + i as u64);
                checked += 1;
            }
        }
    }
    assert_eq!(
        checked,
        2 * (6 + 5),
        "distinct GEMV shapes: SmolLM2 5, Qwen3 6 (the lm_head a column chunk), per device"
    );
}

#[test]
fn a_gemv_core_without_its_zeroing_shows_in_the_interpreter() {
    let d = gemv_design(Device::Npu1, 64, 100);
    let text = d.generic().replace("\"func.call\"(%cbuf) {callee = @gemv_zero_i32}", "\"scf.yield\"()");
    assert_ne!(text, d.generic(), "the zeroing call is in the text");
    // A core's output elements start as garbage, so accumulating into them shows.
    let unzeroed = common::run_text(&d, &text, 3).map(|(got, want)| got == want);
    assert!(matches!(unzeroed, Ok(false)), "{unzeroed:?}");
    assert!(common::run_text(&d, &d.generic(), 3).map(|(got, want)| got == want).unwrap());
}

#[test]
fn a_k_too_long_to_stay_resident_streams_the_activations_with_each_tile_and_equals_the_reference() {
    // SmolLM2's down projection keeps its 1,536-long rows resident; Llama-3.2-1B's (K 8,192) and
    // a 7,000-long K cannot, so the activations come again with every output tile.
    for device in [Device::Npu1, Device::Npu2] {
        assert!(gemv::resident(&gemv_design(device, 1536, 576).tiling));
        for (k, n) in [(7000, 100), (8192, 2048)] {
            let d = gemv_design(device, k, n);
            assert!(!gemv::resident(&d.tiling), "{}", d.name);
            design::check(&d).unwrap_or_else(|e| panic!("{e}"));
            let a = d.fifos.iter().find(|f| f.name == "A").unwrap();
            assert_eq!(a.depth, 2, "{}: double-buffered, not one buffer per part", d.name);
        }
        let (got, want) = block(device, 3, (7000, 100), 77);
        assert_eq!(got, want, "{device}");
    }
    let d = gemv_design(Device::Npu1, 8192, 2048);
    assert!(d.tiling.l1_bytes <= Device::Npu1.core_data_bytes(), "{:?}", d.tiling);
}
