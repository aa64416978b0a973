//! Resource checks, padding, and the interpreter's failure modes: every way a design can be wrong
//! that the interpreter is there to catch.

mod common;

use codegen_aie::design::{self, check_pattern, Rule};
use codegen_aie::interp::{self, InterpError};
use codegen_aie::qgemv;
use codegen_aie::tiling::{self, GemmShape, TilingError};
use codegen_aie::Device;
use common::{prove, run_text};

fn design(device: Device, m: usize, k: usize, n: usize) -> design::Design {
    design::build(&tiling::choose(device, GemmShape { m, k, n }).unwrap())
}

#[test]
fn a_tile_over_the_compute_tile_budget_is_an_error_naming_shape_and_budget() {
    let shape = GemmShape { m: 256, k: 1024, n: 1024 };
    let err = tiling::with_tile(Device::Npu1, shape, 128, 256, 256).unwrap_err();
    let TilingError::NothingFits { shape: s, device, reason } = &err else { panic!("{err}") };
    assert_eq!((*s, *device), (shape, Device::Npu1));
    let text = err.to_string();
    assert!(text.contains("256x1024x1024") && text.contains("65536") && text.contains("npu1"), "{text}");
    assert!(reason.contains("compute-tile memory"), "{reason}");
}

#[test]
fn a_tile_the_micro_tile_does_not_divide_is_rejected() {
    // npu2's kernel needs m % 32 == 0 (4r with r = 8) and n % 16 == 0.
    let shape = GemmShape { m: 128, k: 64, n: 64 };
    let err = tiling::with_tile(Device::Npu2, shape, 16, 64, 64).unwrap_err();
    assert!(err.to_string().contains("m % 32 == 0"), "{err}");
    let err = tiling::with_tile(Device::Npu1, shape, 16, 64, 24).unwrap_err();
    assert!(err.to_string().contains("n % 16 == 0"), "{err}");
    assert!(tiling::with_tile(Device::Npu1, shape, 16, 64, 32).is_ok());
}

#[test]
fn access_patterns_over_the_dma_limits_are_errors() {
    let mem = Device::Npu1.mem_tile_dma();
    assert_eq!(check_pattern(mem, 1, &[(2, 64), (4, 8), (4, 32), (8, 1)], false), Ok(()));
    let five = [(2, 1), (2, 64), (4, 8), (4, 32), (8, 1)];
    assert!(check_pattern(mem, 1, &five, false).unwrap_err().to_string().contains("5 dimensions"));
    assert!(check_pattern(mem, 1, &[(4, 8), (8, 2)], false).unwrap_err().to_string().contains("innermost stride"));
    assert!(check_pattern(mem, 1, &[(4, 8), (6, 1)], false).unwrap_err().to_string().contains("32-bit words"));
    assert!(check_pattern(mem, 1, &[(2000, 8), (8, 1)], false).unwrap_err().to_string().contains("size 2000"));
    assert!(check_pattern(mem, 4, &[(2, (1 << 17) + 1), (8, 1)], false).unwrap_err().to_string().contains("stride"));
    let shim = Device::Npu1.shim_dma();
    assert_eq!(check_pattern(shim, 1, &[(64, 0), (4, 64), (16, 576), (64, 1)], true), Ok(()));
    assert!(check_pattern(shim, 1, &[(65, 0), (4, 64), (16, 576), (64, 1)], true)
        .unwrap_err()
        .to_string()
        .contains("repeat 65"));
}

#[test]
fn every_chosen_tiling_fits_and_predicts_a_utilisation_between_zero_and_one() {
    for device in [Device::Npu1, Device::Npu2] {
        for (k, n) in [(576, 576), (576, 192), (1536, 576), (1024, 3072), (3072, 1024)] {
            let decode = tiling::choose(device, GemmShape { m: 64, k, n }).unwrap();
            let prefill = tiling::choose(device, GemmShape { m: 512, k, n }).unwrap();
            for t in [&decode, &prefill] {
                assert!(t.utilisation > 0.0 && t.utilisation <= 1.0, "{t:?}");
                assert!(t.l1_bytes <= device.core_data_bytes() && t.l2_bytes <= device.mem_tile_bytes(), "{t:?}");
                design::check(&design::build(t)).unwrap();
            }
            // More rows reuse every streamed weight more: the array is busier.
            assert!(prefill.utilisation > decode.utilisation, "{k}x{n} on {device}: {prefill:?} vs {decode:?}");
        }
    }
}

#[test]
fn shapes_that_divide_nothing_are_padded_and_still_exact() {
    for device in [Device::Npu1, Device::Npu2] {
        let d = design(device, 37, 200, 300);
        let (s, p) = (d.tiling.shape, d.tiling.padded);
        assert!(p.m > s.m && p.n > s.n && p.k % d.tiling.k == 0, "{:?}", d.tiling);
        assert!(d.generic().contains("npuc.gemm_shape = array<i64: 37, 200, 300>"));
        prove(&d, 3);
    }
}

#[test]
fn a_core_that_does_not_zero_its_accumulator_is_caught() {
    let d = design(Device::Npu1, 64, 128, 128);
    let text: String =
        d.generic().lines().filter(|l| !l.contains("callee = @zero_i32")).map(|l| format!("{l}\n")).collect();
    let (got, want) = run_text(&d, &text, 5).unwrap();
    assert_ne!(got, want);
    let (got, want) = run_text(&d, &d.generic(), 5).unwrap();
    assert_eq!(got, want);
}

#[test]
fn a_wrong_access_pattern_gives_a_wrong_result() {
    let d = design(Device::Npu2, 128, 256, 256);
    let b = d.fifos.iter().find(|f| f.name == "B_L2L1_0").unwrap();
    let dims = |v: &[(usize, usize)]| {
        v.iter().map(|(s, t)| format!("<size = {s}, stride = {t}>")).collect::<Vec<_>>().join(", ")
    };
    let mut swapped = b.to_stream.clone();
    swapped.swap(2, 3);
    swapped.swap(0, 1);
    let text = d.generic().replacen(&dims(&b.to_stream), &dims(&swapped), 1);
    assert_ne!(text, d.generic());
    match run_text(&d, &text, 9) {
        Ok((got, want)) => assert_ne!(got, want),
        Err(e) => assert!(matches!(e, InterpError::Run(_)), "{e}"),
    }
}

#[test]
fn reusing_a_shim_bd_before_its_wait_is_an_error() {
    // Enough column blocks that the sequence must wait to reuse descriptors.
    let d = design(Device::Npu1, 64, 64, 8192);
    let text: String =
        d.generic().lines().filter(|l| !l.contains("aiex.npu.dma_wait")).map(|l| format!("{l}\n")).collect();
    let err = run_text(&d, &text, 1).unwrap_err();
    assert!(err.to_string().contains("reused before a wait"), "{err}");
}

#[test]
fn a_core_waiting_for_an_element_nobody_sends_is_an_error() {
    let d = design(Device::Npu1, 64, 128, 256);
    let tiles = d.cores[0].tiles;
    let from = format!("%ctiles = \"arith.constant\"() {{value = {tiles} : index}}");
    let to = format!("%ctiles = \"arith.constant\"() {{value = {} : index}}", tiles + 1);
    let text = d.generic().replacen(&from, &to, 1);
    assert_ne!(text, d.generic());
    let err = run_text(&d, &text, 1).unwrap_err();
    assert!(err.to_string().contains("no element was produced"), "{err}");
}

#[test]
fn text_that_is_not_a_design_is_a_parse_error_with_a_line() {
    let err = interp::run("\"builtin.module\"() ({\n  garbage here\n}) : () -> ()\n", &[]).unwrap_err();
    assert!(matches!(err, InterpError::Parse { line: 2, .. }), "{err}");
}

#[test]
fn small_calls_run_as_gemv_blocks_and_large_ones_are_cut_into_m_blocks() {
    use codegen_aie::plan::{self, PlanOptions};
    let sites = vec![codegen_aie::gemm::GemmSite::of_shape("q", 576, 576)];
    let p = plan::plan_sites(sites.clone(), PlanOptions::new(Device::Npu1)).unwrap();
    assert_eq!((p.decode_rows, p.gemv_rows), (64, 8));
    assert_eq!(plan::route(&p, 1), Some(vec![(8, 1)]));
    assert_eq!(plan::route(&p, 15), Some(vec![(8, 8), (8, 7)]));
    let designs = |rows| -> Vec<&str> { p.calls(&p.gemms[0], rows).unwrap().iter().map(|c| c.design).collect() };
    assert_eq!(designs(8), ["gemv_8x576x576_npu1"]);
    assert_eq!(designs(64), ["gemm_64x576x576_npu1"]);
    assert_eq!(plan::route(&p, 16), Some(vec![(64, 16)]));
    assert_eq!(plan::route(&p, 64), Some(vec![(64, 64)]));
    assert_eq!(plan::route(&p, 300), Some(vec![(256, 256), (64, 44)]));
    assert_eq!(plan::route(&p, 400), Some(vec![(256, 256), (256, 144)]));
    let without =
        plan::plan_sites(sites.clone(), PlanOptions { gemv_rows: 0, ..PlanOptions::new(Device::Npu1) }).unwrap();
    assert_eq!(plan::route(&without, 15), None, "without GEMV designs small calls stay on the host");
    assert!(without.designs.keys().all(|name| name.starts_with("gemm_")));
    let p2 = plan::plan_sites(sites, PlanOptions::new(Device::Npu2)).unwrap();
    assert_eq!(p2.decode_rows, 128);
    assert_eq!(plan::route(&p2, 100), Some(vec![(128, 100)]));
}

#[test]
fn a_residual_pass_is_read_in_the_main_passs_gemv_call_and_gets_first_pass_m_blocks() {
    use codegen_aie::plan::{self, PlanOptions};
    // SmolLM2's gate and up side by side (2 × 1536) with their residual pass after them.
    let mut site = codegen_aie::gemm::GemmSite::of_shape("gate_up", 576, 4 * 1536);
    (site.passes, site.first_pass_columns) = (2, 2 * 1536);
    let p = plan::plan_sites(vec![site], PlanOptions::new(Device::Npu1)).unwrap();
    let g = &p.gemms[0];
    // M-block chunks: the main columns with both passes, the residual's with the first.
    let chunks: Vec<(usize, usize, usize)> = g.chunks.iter().map(|c| (c.col_offset, c.cols, c.passes)).collect();
    assert_eq!(chunks, [(0, 3072, 2), (3072, 3072, 1)]);
    // A decode step: one GEMV call over all 6,144 columns, both passes' rows.
    let decode = p.calls(g, 2).unwrap();
    assert_eq!(decode.len(), 1);
    assert_eq!((decode[0].cols, decode[0].used, decode[0].design), (6144, 2, "gemv_8x576x6144_npu1"));
    // A 100-token prefill: 200 rows for the main chunk, 100 for the residual's.
    let prefill = p.calls(g, 200).unwrap();
    let rows = |offset| prefill.iter().filter(|c| c.col_offset == offset).map(|c| c.used).sum::<usize>();
    assert_eq!((rows(0), rows(3072)), (200, 100));
    let gemv = &p.designs["gemv_8x576x6144_npu1"];
    codegen_aie::design::check(gemv).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn wide_projections_are_cut_into_equal_chunks_that_cover_every_column_once() {
    use codegen_aie::plan::chunks;
    let c = chunks(151936, 4096);
    assert_eq!(c.len(), 38);
    assert!(c.iter().all(|&(_, w)| w <= 4096));
    assert_eq!(c.iter().map(|&(_, w)| w).sum::<usize>(), 151936);
    assert!(c.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
    assert_eq!(chunks(49152, 4096), (0..12).map(|i| (i * 4096, 4096)).collect::<Vec<_>>());
    assert_eq!(chunks(192, 4096), vec![(0, 192)]);
}

#[test]
fn the_interpreter_enforces_memory_and_dma_limits_on_the_text() {
    let d = design(Device::Npu1, 64, 256, 256);
    // Deeper FIFOs than the compute tile's memory holds.
    let deep = d.generic().replace("elemNumber = 2 : i32", "elemNumber = 16 : i32");
    let err = run_text(&d, &deep, 1).unwrap_err();
    assert!(err.to_string().contains("bytes of data memory"), "{err}");
    // A shim descriptor repeating more often than it can.
    let t = &d.tiling;
    let from = format!("static_sizes = array<i64: 1, 1, {}, {}>", t.rows * t.m, t.n);
    assert!(d.generic().contains(&from));
    let repeat =
        d.generic().replacen(&from, &format!("static_sizes = array<i64: 65, 1, {}, {}>", t.rows * t.m, t.n), 1);
    let err = run_text(&d, &repeat, 1).unwrap_err();
    assert!(err.to_string().contains("repeat 65"), "{err}");
}

#[test]
fn link_offsets_are_i64_array_attributes_and_the_dense_spelling_is_refused() {
    // mlir-aie declares `aie.objectfifo.link`'s offsets as I64ArrayAttr: `[0 : i64, 512 : i64]`.
    // The dense `array<i64: ...>` spelling fails its verifier, so the interpreter refuses it too.
    let d = design(Device::Npu1, 64, 128, 128);
    let (t, text) = (&d.tiling, d.generic());
    let slice = t.m * t.k;
    let attr = format!("dst_offsets = [0 : i64, {slice} : i64, {} : i64, {} : i64]", 2 * slice, 3 * slice);
    assert!(text.contains(&attr), "{text}");
    assert!(!text.lines().any(|l| l.contains("aie.objectfifo.link") && l.contains("array<")), "{text}");
    let dense = text.replacen(&attr, &format!("dst_offsets = array<i64: 0, {slice}, {}, {}>", 2 * slice, 3 * slice), 1);
    let err = run_text(&d, &dense, 1).unwrap_err();
    assert!(matches!(&err, InterpError::Parse { .. }) && err.to_string().contains("dst_offsets"), "{err}");
}

#[test]
fn a_join_output_pattern_walking_the_whole_buffer_is_refused_by_the_interpreter() {
    // mlir-aie lowers a join's output pattern once per input transfer: a pattern over the whole
    // joined buffer reads past each transfer ("out of bounds access in join input").
    let d = design(Device::Npu1, 64, 128, 128);
    let t = &d.tiling;
    let c = d.fifos.iter().find(|f| f.name == "C_L2L3_0").unwrap();
    assert_eq!(c.to_stream.iter().map(|&(s, _)| s).product::<usize>(), t.m * t.n);
    let dims = |v: &[(usize, usize)]| {
        v.iter().map(|(s, t)| format!("<size = {s}, stride = {t}>")).collect::<Vec<_>>().join(", ")
    };
    let mut whole = c.to_stream.clone();
    whole[0].0 *= t.rows;
    let line = |v: &[(usize, usize)]| format!("dimensionsToStream = #aie<bd_dim_layout_array[{}]>", dims(v));
    assert!(d.generic().contains(&line(&c.to_stream)));
    let text: String =
        d.generic()
            .lines()
            .map(|l| {
                if l.contains("sym_name = \"C_L2L3_") {
                    l.replace(&line(&c.to_stream), &line(&whole))
                } else {
                    l.into()
                }
            })
            .map(|l| l + "\n")
            .collect();
    assert_ne!(text, d.generic());
    let err = run_text(&d, &text, 2).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("@C_L2L3_") && msg.contains(&format!("transfer of {}", t.m * t.n)), "{msg}");
}

/// The rule a changed design breaks, with what breaks it.
fn refused(change: impl FnOnce(&mut design::Design)) -> design::ResourceError {
    let mut d = design(Device::Npu1, 64, 128, 128);
    design::check(&d).unwrap();
    change(&mut d);
    design::check(&d).unwrap_err()
}

fn assert_rule(err: &design::ResourceError, rule: Rule, subject: &str) {
    assert_eq!(err.rule, rule, "{err}");
    assert!(err.subject.contains(subject), "{err}");
    assert!(err.to_string().contains(rule.name()), "{err}");
}

fn fifo_mut<'d>(d: &'d mut design::Design, name: &str) -> &'d mut design::Fifo {
    d.fifos.iter_mut().find(|f| f.name == name).unwrap()
}

fn link_of<'d>(d: &'d mut design::Design, fifo: &str) -> &'d mut design::Link {
    d.links.iter_mut().find(|l| l.inputs.iter().chain(&l.outputs).any(|n| n == fifo)).unwrap()
}

#[test]
fn every_planned_design_keeps_mlir_aies_rules() {
    use codegen_aie::gemm::GemmSite;
    use codegen_aie::plan::{self, PlanOptions};
    let shapes = [(576, 576), (576, 192), (1536, 576), (576, 1536), (576, 49152), (1024, 2048), (1024, 1024)];
    let shapes = shapes.into_iter().chain([(2048, 1024), (1024, 3072), (3072, 1024), (1024, 151936), (64, 64)]);
    let sites: Vec<GemmSite> =
        shapes.enumerate().map(|(i, (k, n))| GemmSite::of_shape(&format!("p{i}"), k, n)).collect();
    for device in [Device::Npu1, Device::Npu2] {
        let p = plan::plan_sites(sites.clone(), PlanOptions::new(device)).unwrap();
        for d in p.designs.values() {
            design::check(d).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

#[test]
fn fifos_need_a_depth_and_shim_producers_no_layout() {
    assert_rule(&refused(|d| fifo_mut(d, "C_L1L2_0_0").depth = 0), Rule::FifoEnds, "C_L1L2_0_0");
    let err = refused(|d| fifo_mut(d, "A_L3L2").to_stream = vec![(16, 32), (32, 1)]);
    assert_rule(&err, Rule::ShimProducerLayout, "A_L3L2");
}

#[test]
fn a_link_is_one_kind_names_fifos_and_holds_each_fifo_once() {
    let err = refused(|d| link_of(d, "A_L3L2").inputs[0] = "A_missing".into());
    assert_rule(&err, Rule::LinkKind, "A_missing");
    let err = refused(|d| {
        d.links.retain(|l| !l.outputs.contains(&"B_L2L1_0".to_string()));
        link_of(d, "C_L2L3_0").outputs.push("B_L2L1_0".into());
    });
    assert_rule(&err, Rule::LinkKind, "C_L2L3_0");
    let err = refused(|d| {
        let b = link_of(d, "B_L3L2_0").clone();
        d.links.push(b);
    });
    assert_rule(&err, Rule::LinkOnce, "B_L3L2_0");
}

#[test]
fn a_link_meets_at_one_tile_off_the_shim() {
    let err = refused(|d| fifo_mut(d, "C_L2L3_0").producer = (1, 1));
    assert_rule(&err, Rule::LinkTile, "C_L2L3_0");
    let err = refused(|d| {
        for f in d.fifos.iter_mut().filter(|f| f.name.starts_with("C_L1L2_0_")) {
            f.consumers = vec![(0, 0)];
        }
        let c = fifo_mut(d, "C_L2L3_0");
        c.producer = (0, 0);
        c.to_stream.clear();
    });
    assert_rule(&err, Rule::LinkTile, "C_L2L3_0");
    assert!(err.what.contains("shim"), "{err}");
}

#[test]
fn link_offsets_number_one_per_split_fifo_and_cut_one_element_each() {
    let err = refused(|d| {
        link_of(d, "C_L2L3_0").src_offsets.pop();
    });
    assert_rule(&err, Rule::LinkOffsets, "C_L2L3_0");
    let err = refused(|d| link_of(d, "B_L3L2_0").dst_offsets = vec![0]);
    assert_rule(&err, Rule::LinkOffsets, "B_L2L1_0");
    let err = refused(|d| link_of(d, "A_L3L2").dst_offsets.swap(1, 2));
    assert_rule(&err, Rule::LinkTransfers, "A_L2L1_3");
    assert!(err.what.contains("do not rise"), "{err}");
    let err = refused(|d| link_of(d, "C_L2L3_0").src_offsets[1] /= 2);
    assert_rule(&err, Rule::LinkTransfers, "C_L2L3_0");
    assert!(err.what.contains("C_L1L2_0_0 is 512 i32 elements; its transfer at 0 of C_L2L3_0 is 256"), "{err}");
}

#[test]
fn a_join_output_pattern_must_stay_inside_each_input_transfer() {
    // The pattern the designs had before: the whole joined block, which mlir-aie refuses with
    // "out of bounds access in join input, for index 2047 in transfer of length 512".
    let err = refused(|d| {
        let rows = d.tiling.rows;
        fifo_mut(d, "C_L2L3_0").to_stream[0].0 *= rows;
    });
    assert_rule(&err, Rule::JoinPattern, "C_L2L3_0");
    assert!(err.what.contains("index 2047") && err.what.contains("transfer of 512"), "{err}");
}

#[test]
fn distribute_and_plain_producer_patterns_stay_inside_their_transfer() {
    let err = refused(|d| fifo_mut(d, "A_L2L1_1").to_stream[0].0 *= 2);
    assert_rule(&err, Rule::DistributePattern, "A_L2L1_1");
    let err = refused(|d| fifo_mut(d, "B_L2L1_0").to_stream[0].1 += 4);
    assert_rule(&err, Rule::FifoPattern, "B_L2L1_0");
    let err = refused(|d| fifo_mut(d, "B_L2L1_0").to_stream[1].0 -= 1);
    assert_rule(&err, Rule::FifoPattern, "B_L2L1_0");
}

#[test]
fn descriptor_limits_are_the_tile_kinds() {
    // A compute tile's descriptor walks three dimensions of at most 255 each.
    let err = refused(|d| fifo_mut(d, "C_L1L2_0_0").to_stream = vec![(2, 256), (2, 128), (4, 32), (32, 1)]);
    assert_rule(&err, Rule::BdLimits, "C_L1L2_0_0");
    assert!(err.what.contains("4 dimensions"), "{err}");
    let err = refused(|d| fifo_mut(d, "C_L1L2_0_0").to_stream = vec![(512, 1)]);
    assert_rule(&err, Rule::BdLimits, "C_L1L2_0_0");
    assert!(err.what.contains("size 512"), "{err}");
    let core = Device::Npu2.core_dma();
    assert_eq!(
        check_pattern(core, 4, &[(128, 128), (128, 1)], false).unwrap_err().to_string(),
        "16384 words in one transfer, the descriptor moves at most 16383"
    );
    assert_eq!(check_pattern(core, 4, &[(4, 0), (8, 1)], false), Err(design::PatternError::ZeroStride));
    assert!(check_pattern(core, 1, &[(4, 8192 + 4), (8, 1)], false).unwrap_err().to_string().contains("exceeds 8192"));
    assert_eq!(check_pattern(core, 4, &[(4, 8192), (8, 1)], false), Ok(()));
}

/// One more FIFO `X` of one buffer of `elems` i32 values, from core (0, 3) into core (0, 2).
fn extra_fifo(elems: usize) -> design::Fifo {
    design::Fifo {
        name: "X".into(),
        producer: (0, 3),
        consumers: vec![(0, 2)],
        depth: 1,
        shape: vec![elems],
        elem: design::Elem::I32,
        to_stream: vec![],
    }
}

#[test]
fn tiles_keep_their_memory_channels_and_descriptors() {
    let err = refused(|d| fifo_mut(d, "C_L1L2_0_0").depth = 31);
    assert_rule(&err, Rule::Memory, "compute tile (0, 2)");
    let err = refused(|d| d.fifos.push(extra_fifo(64)));
    assert_rule(&err, Rule::Channels, "compute tile (0, 2)");
    let err = refused(|d| {
        fifo_mut(d, "A_L2L1_0").depth = 9;
        fifo_mut(d, "B_L2L1_0").depth = 9;
    });
    assert_rule(&err, Rule::Bds, "compute tile (0, 2)");
    // The distribute's owner takes a descriptor per buffer and output: 7 × 4 is past the 24 one
    // mem-tile channel reaches.
    let err = refused(|d| fifo_mut(d, "A_L3L2").depth = 7);
    assert_rule(&err, Rule::Bds, "mem tile (0, 1)");
    assert!(err.what.contains("A_L3L2's channel needs 28 BDs"), "{err}");
}

#[test]
fn runtime_dmas_keep_the_shim_descriptor_and_its_ids() {
    let err = refused(|d| {
        if let Some(design::SeqOp::Dma { offset, .. }) =
            d.seq.iter_mut().find(|op| matches!(op, design::SeqOp::Dma { arg: 0, .. }))
        {
            *offset += 1;
        }
    });
    assert_rule(&err, Rule::RuntimeDma, "A_L3L2");
    let err = refused(|d| {
        if let Some(design::SeqOp::Dma { id, .. }) = d.seq.first_mut() {
            *id = 16;
        }
    });
    assert_rule(&err, Rule::ShimBdIds, "C_L2L3_0");
}

/// Every FIFO buffer fits one bank (16 KiB in a compute tile, 64 KiB in a mem tile), as
/// mlir-aie's bank-aware allocator needs: SmolLM2's 576-wide projections once took 32×32×144
/// tiles, whose 18 432-byte C buffer (and 73 728-byte C join in the mem tile) made it fall back
/// to sequential allocation; the chooser now picks a tile whose buffers fit.
#[test]
fn buffers_fit_a_memory_bank() {
    for (device, n) in [(Device::Npu1, 144), (Device::Npu2, 192)] {
        let shape = GemmShape { m: 256, k: 576, n: 576 };
        let err = tiling::with_tile(device, shape, 32, 32, n).unwrap_err().to_string();
        assert!(err.contains("banks: ") && err.contains("-byte bank"), "{device:?}: {err}");
        let chosen = tiling::choose(device, shape).unwrap();
        assert!(chosen.m * chosen.n * 4 <= 16384, "{device:?}: C tile {}×{}", chosen.m, chosen.n);
        assert!(chosen.rows * chosen.m * chosen.n * 4 <= 65536, "{device:?}: C join {}×{}", chosen.m, chosen.n);
    }
    // One more FIFO into a core, of one 18 432-byte buffer: room enough, but not in one bank.
    let err = refused(|d| d.fifos.push(extra_fifo(4608)));
    assert_rule(&err, Rule::Banks, "compute tile (0, 2)");
    assert!(err.what.contains("X's buffer of 18432 bytes"), "{err}");
}

#[test]
fn a_core_calling_a_function_without_a_body_is_refused_naming_it_and_the_tile() {
    let err = refused(|d| d.functions.iter_mut().find(|f| f.name == "matmul_i8_i32").unwrap().body = None);
    assert_rule(&err, Rule::CoreCalls, "compute tile (0, 2)");
    assert!(err.to_string().contains("@matmul_i8_i32") && err.to_string().contains("without a body"), "{err}");
    let err = refused(|d| d.functions.retain(|f| f.name != "zero_i32"));
    assert_rule(&err, Rule::CoreCalls, "compute tile (0, 2)");
    assert!(err.to_string().contains("@zero_i32, which the design does not define"), "{err}");
}

#[test]
fn the_interpreter_refuses_a_call_to_a_declaration() {
    let mut d = design(Device::Npu1, 64, 128, 128);
    d.functions.iter_mut().find(|f| f.name == "zero_i32").unwrap().body = None;
    let text = d.generic();
    assert!(text.contains("sym_name = \"zero_i32\", sym_visibility = \"private\""));
    let err = run_text(&d, &text, 1).unwrap_err().to_string();
    assert!(err.contains("core (0, 2)") && err.contains("calls @zero_i32, which has no body in the design"), "{err}");
}

#[test]
fn buffers_that_fit_in_total_but_not_bank_by_bank_are_refused_as_mlir_aie_places_them() {
    // Six 9,000-byte buffers on a core with room for them in total: each 16 KiB bank takes one,
    // and no bank has 9,000 bytes left for the fifth (mlir-aie's bank-aware allocator places the
    // largest first, one bank after another).
    let mut d =
        codegen_aie::gemv::build(&codegen_aie::gemv::choose(Device::Npu1, GemmShape { m: 8, k: 64, n: 64 }).unwrap());
    design::check(&d).unwrap();
    let tile = d.cores[0].tile;
    let used: usize = d
        .fifos
        .iter()
        .filter(|f| f.producer == tile || f.consumers.contains(&tile))
        .map(|f| f.depth * f.elems() * f.elem.bytes())
        .sum();
    let extra =
        |i: usize| design::Buffer { tile, name: format!("extra{i}"), shape: vec![9000], elem: design::Elem::I8 };
    d.buffers.extend((0..5).map(extra));
    let total = used + 5 * 9000 + Device::Npu1.core_stack_bytes();
    assert!(total <= Device::Npu1.core_data_bytes(), "{total} bytes: the total fits");
    let e = design::check(&d).unwrap_err();
    assert_eq!(e.rule, Rule::Banks, "{e}");
    assert!(e.what.contains("fits no bank in mlir-aie's bank-aware placement"), "{e}");
    d.buffers.pop();
    design::check(&d).unwrap_or_else(|e| panic!("four of them fit, one a bank: {e}"));
}

#[test]
fn a_name_mlir_cannot_write_unquoted_or_arithmetic_on_wide_vectors_is_refused() {
    // The name is the device's bare symbol in the custom form: no `-`.
    let err = refused(|d| d.name = "nqgemv1_1x576x960_npu1_eps1e-5".into());
    assert_rule(&err, Rule::SymbolName, "design name");
    // The aligned inverse rms on 32 i32 lanes (1,024 bits) is host-side core code; a design
    // carrying it is refused, as mlir-aie's vector-to-aievec leaves its `subi` illegal.
    let wide = codegen_aie::qkernels::inverse_rms(codegen_aie::qkernels::NormShape { rows: 1, d: 64, epsilon: 1e-5 });
    let err = refused(|d| d.functions.push(wide.unwrap()));
    assert_rule(&err, Rule::VectorWidth, "@n_irms");
    assert!(err.what.contains("vector<1x32xi32> (1024 bits)"), "{err}");
}

#[test]
fn a_fifo_named_as_mlir_aies_consumer_end_of_another_is_an_error() {
    // mlir-aie splits a broadcast FIFO `J` into consumer ends `J_0_cons`, `J_1_cons`, ...: a
    // FIFO of the design called `J_0` has its own end `J_0_cons`, and a core's uses of one
    // become the other's.
    let q = qgemv::choose_split(Device::Npu1, GemmShape { m: 1, k: 576, n: 576 }, (2, qgemv::Feed::Rows), (2, false))
        .unwrap();
    let mut d = qgemv::build(&q);
    design::check(&d).unwrap();
    let slot = d.fifos.iter().position(|f| f.name == "S_0").unwrap();
    d.fifos[slot].name = "J_0".into();
    let err = design::check(&d).unwrap_err();
    assert_eq!(err.rule, Rule::FifoNames, "{err}");
    assert!(err.to_string().contains("J_0_cons"), "{err}");
}

#[test]
fn a_mem_tiles_channels_share_its_descriptors_by_halves() {
    // Column 0's mem tile distributes the rows' slices and joins the slots beside its own core's
    // weight stream and outputs; deepening the weight buffer runs out of the 24 BDs its
    // channels' half shares.
    let shape = GemmShape { m: 1, k: 1536, n: 576 };
    let q = qgemv::choose_split(Device::Npu1, shape, (2, qgemv::Feed::Rows), (3, false)).unwrap();
    assert!(q.staged > 0, "{q:?}");
    let mut d = qgemv::build(&q);
    design::check(&d).unwrap();
    let staged = d.fifos.iter().position(|f| f.name == "W_L3_0").unwrap();
    let err = (q.staged..40)
        .find_map(|depth| {
            d.fifos[staged].depth = depth;
            design::check(&d).err()
        })
        .unwrap();
    assert_eq!(err.rule, Rule::Bds, "{err}");
    assert!(err.to_string().contains("channels need"), "{err}");
}

#[test]
fn a_prologue_core_that_never_sends_its_slot_hangs_every_core_and_is_an_error() {
    // The exchange is a cycle (slots into the mem tile's join, the joined slots back to the
    // cores that sent them): a core that keeps its first slot leaves the join waiting, so every
    // core waits on the broadcast — the interpreter reports the hang rather than hanging.
    let q = qgemv::choose_split(Device::Npu1, GemmShape { m: 1, k: 576, n: 576 }, (1, qgemv::Feed::Rows), (2, false))
        .unwrap();
    let d = qgemv::build(&q);
    let release = "\"aie.objectfifo.release\"() {objFifo_name = @S_0, port = 0 : i32, size = 1 : i32} : () -> ()";
    let text = d.generic().replacen(release, "", 1);
    assert_ne!(text, d.generic());
    let x = vec![0.5f32; q.tiling.padded.m * q.tiling.padded.k];
    let w = vec![1i8; d.args[1].0];
    let args = [interp::Arg::F32(&x), interp::Arg::I8(&w)];
    interp::run_args(&d.generic(), &args).unwrap();
    let err = interp::run_args(&text, &args).unwrap_err();
    assert!(err.to_string().contains("no element was produced"), "{err}");
}
