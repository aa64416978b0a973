//! The cost model on a SmolLM2-shaped layer's projections and a tied lm_head, and the decode
//! table for SmolLM2-135M and Qwen3-0.6B shapes on npu1 and npu2 (`cargo test --release -p
//! codegen-aie --test cost -- --nocapture` prints it).

use codegen_aie::cost::{self, DISPATCH_SECONDS};
use codegen_aie::gemm::GemmSite;
use codegen_aie::plan::{self, PlanOptions};
use codegen_aie::{gemv, Device, GemmShape};

fn site(node: &str, k: usize, n: usize) -> GemmSite {
    GemmSite::of_shape(node, k, n)
}

/// q, k, v, o, gate, up and down of one SmolLM2-135M layer, and its 49 152-wide lm_head.
fn sites() -> Vec<GemmSite> {
    let (h, kv, i) = (576, 192, 1536);
    let names = [("q", h, h), ("k", h, kv), ("v", h, kv), ("o", h, h), ("gate", h, i), ("up", h, i), ("down", i, h)];
    let mut out: Vec<GemmSite> = names.iter().map(|&(n, k, w)| site(n, k, w)).collect();
    out.push(site("lm_head", h, 49152));
    out
}

#[test]
fn prefill_scales_with_the_prompt_and_skips_the_last_row_lm_head() {
    let lm_head = |s: &GemmSite| s.node == "lm_head";
    // Without GEMV designs, so that the lm_head's one row stays on the host.
    let options = |device| PlanOptions { gemv_rows: 0, ..PlanOptions::new(device) };
    for device in [Device::Npu1, Device::Npu2] {
        let plan = plan::plan_sites(sites(), options(device)).unwrap();
        let (p512, p1024) = (cost::predict(&plan, 512, &lm_head), cost::predict(&plan, 1024, &lm_head));
        // 512 rows are two 256-row blocks of every layer projection (one column chunk each); the
        // lm_head's single row stays on the host.
        assert_eq!(p512.prefill_calls, 7 * 2, "{device:?}");
        assert_eq!(p1024.prefill_calls, 2 * p512.prefill_calls);
        assert!((p1024.prefill_array_seconds - 2.0 * p512.prefill_array_seconds).abs() < 1e-12);
        assert!((p512.prefill_dispatch_seconds - 14.0 * DISPATCH_SECONDS).abs() < 1e-12);
        assert!(p512.prefill_tok_s > 0.0 && p512.prefill_tok_s.is_finite());
        // Counting the lm_head for every row adds its 256-row calls over 12 column chunks.
        let every_row = cost::predict(&plan, 512, &|_| false);
        assert_eq!(every_row.prefill_calls, 14 + 2 * 12);
        assert!(every_row.prefill_tok_s < p512.prefill_tok_s);
        // A decode token reads every int8 weight once: 3 538 944 bytes of the layer and
        // 28 311 552 of the lm_head, through 2 shim channels of 4 bytes per cycle per column.
        assert_eq!(p512.decode_weight_bytes, 3_538_944 + 28_311_552);
        let (columns, clock) = if device == Device::Npu1 { (4.0, 1.0e9) } else { (8.0, 1.5e9) };
        let bound = columns * 2.0 * 4.0 * clock / (3_538_944.0 + 28_311_552.0);
        assert!((p512.decode_tok_s_bound - bound).abs() < 1e-9 * bound, "{device:?}: {}", p512.decode_tok_s_bound);
        assert_eq!((p512.decode_calls, p512.decode_tok_s), (0, 0.0), "no GEMV designs: decode on the host");
    }
    let npu1 = cost::predict(&plan::plan_sites(sites(), options(Device::Npu1)).unwrap(), 512, &lm_head);
    let npu2 = cost::predict(&plan::plan_sites(sites(), options(Device::Npu2)).unwrap(), 512, &lm_head);
    assert!(npu2.prefill_tok_s > npu1.prefill_tok_s, "npu2 {} against npu1 {}", npu2.prefill_tok_s, npu1.prefill_tok_s);
}

#[test]
fn a_prompt_below_the_host_threshold_runs_as_gemv_blocks() {
    let plan = plan::plan_sites(sites(), PlanOptions::new(Device::Npu1)).unwrap();
    // The GEMV designs take the lm_head in fewer, wider chunks than the GEMM designs' 12.
    let lm_head = plan.gemms.last().unwrap();
    let wide = lm_head.gemv_chunks.len();
    assert!(wide < lm_head.chunks.len() && lm_head.chunks.len() == 12, "{wide} GEMV chunks");
    // One 8-row block per GEMV chunk: the 7 layer projections and the lm_head's chunks.
    let p = cost::predict(&plan, 8, &|_| false);
    assert_eq!(p.prefill_calls, 7 + wide);
    assert_eq!(p.prefill_calls, p.decode_calls, "8 rows cost what one does: one block each");
    assert!((p.prefill_array_seconds - p.decode_array_seconds).abs() < 1e-15);
    assert_eq!(cost::predict(&plan, 9, &|_| false).prefill_calls, 2 * (7 + wide), "9 rows are two blocks");
    let without = plan::plan_sites(sites(), PlanOptions { gemv_rows: 0, ..PlanOptions::new(Device::Npu1) }).unwrap();
    let p = cost::predict(&without, 8, &|_| false);
    assert_eq!((p.prefill_calls, p.prefill_tok_s), (0, 0.0), "without GEMV designs it stays on the host");
}

/// A decoder's projections: per layer q, k, v, o, gate, up, down, then the tied lm_head.
fn model(layers: usize, (h, q, kv, i, vocab): (usize, usize, usize, usize, usize)) -> Vec<GemmSite> {
    let layer = [("q", h, q), ("k", h, kv), ("v", h, kv), ("o", q, h), ("gate", h, i), ("up", h, i), ("down", i, h)];
    let mut out: Vec<GemmSite> =
        (0..layers).flat_map(|l| layer.iter().map(move |&(n, k, w)| site(&format!("{l}.{n}"), k, w))).collect();
    out.push(site("lm_head", h, vocab));
    out
}

fn smollm2_135m() -> Vec<GemmSite> {
    model(30, (576, 576, 192, 1536, 49152))
}

fn qwen3_0p6b() -> Vec<GemmSite> {
    model(28, (1024, 2048, 1024, 3072, 151936))
}

#[test]
fn decode_on_the_gemv_designs_stays_under_the_bandwidth_floor_and_npu2_is_faster() {
    println!("model        device  calls/token  array ms  dispatch ms  decode tok/s  floor tok/s  MB/token");
    for (name, sites) in [("SmolLM2-135M", smollm2_135m()), ("Qwen3-0.6B", qwen3_0p6b())] {
        let mut rates = vec![];
        for device in [Device::Npu1, Device::Npu2] {
            let plan = plan::plan_sites(sites.clone(), PlanOptions::new(device)).unwrap();
            let p = cost::predict(&plan, 1024, &|s| s.node == "lm_head");
            println!(
                "{name:<12} {device:<7} {:>11}  {:>8.3}  {:>11.3}  {:>12.1}  {:>11.1}  {:>8.1}",
                p.decode_calls,
                p.decode_array_seconds * 1e3,
                p.decode_dispatch_seconds * 1e3,
                p.decode_tok_s,
                p.decode_tok_s_bound,
                p.decode_weight_bytes as f64 / 1e6
            );
            let chunks: usize = plan.gemms.iter().map(|g| g.gemv_chunks.len()).sum();
            assert_eq!(p.decode_calls, chunks, "{name} {device}: one GEMV call per GEMV column chunk");
            assert!(p.decode_tok_s > 0.0 && p.decode_tok_s < p.decode_tok_s_bound, "{name} {device}: {p:?}");
            // The array alone streams the weights no faster than every shim channel could.
            let floor_seconds = p.decode_weight_bytes as f64 / device.shim_bytes_per_second();
            assert!(p.decode_array_seconds > floor_seconds, "{name} {device}");
            assert!((p.decode_dispatch_seconds - chunks as f64 * DISPATCH_SECONDS).abs() < 1e-12);
            rates.push(p.decode_tok_s);
        }
        assert!(rates[1] > rates[0], "{name}: npu2 {} against npu1 {}", rates[1], rates[0]);
    }
}

#[test]
fn more_rows_per_gemv_block_are_never_slower_per_row() {
    for device in [Device::Npu1, Device::Npu2] {
        for (k, n) in [(576, 192), (576, 1536), (1536, 576), (3072, 1024), (1024, 4096)] {
            let per_row: Vec<f64> = (1..=gemv::GEMV_ROWS)
                .map(|m| gemv::choose(device, GemmShape { m, k, n }).unwrap().total_cycles as f64 / m as f64)
                .collect();
            assert!(per_row.windows(2).all(|w| w[1] <= w[0]), "{device} {k}x{n}: cycles per row {per_row:?}");
            assert!(per_row[7] < per_row[0] / 2.0, "{device} {k}x{n}: 8 rows share one weight stream");
        }
    }
}
