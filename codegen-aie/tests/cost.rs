//! The cost model on a SmolLM2-shaped layer's projections and a tied lm_head.

use codegen_aie::cost::{self, DISPATCH_SECONDS};
use codegen_aie::gemm::GemmSite;
use codegen_aie::plan::{self, PlanOptions};
use codegen_aie::Device;

fn site(node: &str, k: usize, n: usize) -> GemmSite {
    GemmSite { node: node.into(), op: "ai.onnx::MatMul".into(), k, n, weight: node.into(), transposed: false }
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
    for device in [Device::Npu1, Device::Npu2] {
        let plan = plan::plan_sites(sites(), PlanOptions::new(device)).unwrap();
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
    }
    let npu1 = cost::predict(&plan::plan_sites(sites(), PlanOptions::new(Device::Npu1)).unwrap(), 512, &lm_head);
    let npu2 = cost::predict(&plan::plan_sites(sites(), PlanOptions::new(Device::Npu2)).unwrap(), 512, &lm_head);
    assert!(npu2.prefill_tok_s > npu1.prefill_tok_s, "npu2 {} against npu1 {}", npu2.prefill_tok_s, npu1.prefill_tok_s);
}

#[test]
fn a_prompt_below_the_host_threshold_never_reaches_the_array() {
    let plan = plan::plan_sites(sites(), PlanOptions::new(Device::Npu1)).unwrap();
    let p = cost::predict(&plan, 8, &|_| false);
    assert_eq!((p.prefill_calls, p.prefill_tok_s), (0, 0.0));
}
