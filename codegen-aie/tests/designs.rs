//! Every design the plan emits for SmolLM2-135M and the Qwen3-0.6B shape, on npu1 and npu2, at
//! the decode and the prefill M-block, executed from its text by the interpreter and compared
//! int32-exactly with a plain GEMM; and the interpreter's and the checks' failure modes.

mod common;

use codegen_aie::design;
use codegen_aie::gemm::GemmSite;
use codegen_aie::plan::{self, PlanOptions};
use codegen_aie::Device;
use common::prove;

fn site(node: &str, k: usize, n: usize) -> GemmSite {
    GemmSite::of_shape(node, k, n)
}

fn smollm2() -> Vec<GemmSite> {
    vec![
        site("q", 576, 576),
        site("k", 576, 192),
        site("v", 576, 192),
        site("o", 576, 576),
        site("gate", 576, 1536),
        site("up", 576, 1536),
        site("down", 1536, 576),
        site("lm_head", 576, 49152),
    ]
}

fn qwen3_0p6b() -> Vec<GemmSite> {
    vec![
        site("q", 1024, 2048),
        site("k", 1024, 1024),
        site("v", 1024, 1024),
        site("o", 2048, 1024),
        site("gate", 1024, 3072),
        site("up", 1024, 3072),
        site("down", 3072, 1024),
        site("lm_head", 1024, 151936),
    ]
}

fn prove_model(sites: Vec<GemmSite>, device: Device) {
    let p = plan::plan_sites(sites.clone(), PlanOptions::new(device)).unwrap();
    // Every projection is planned, every column of it lies in exactly one chunk, and both its
    // M-blocks have a design.
    assert_eq!(p.gemms.len(), sites.len());
    for g in &p.gemms {
        let covered: usize = g.chunks.iter().map(|c| c.cols).sum();
        assert_eq!(covered, g.site.n, "{}", g.site.node);
        let mut next = 0;
        for c in &g.chunks {
            assert_eq!(c.col_offset, next, "{}", g.site.node);
            next += c.cols;
            for name in [&c.decode_design, &c.prefill_design] {
                let d = &p.designs[name];
                assert!(d.tiling.shape.n >= c.cols && d.tiling.shape.k == g.site.k, "{name}");
            }
        }
    }
    let decode = plan::decode_rows(device);
    let ms: Vec<usize> = p.designs.values().map(|d| d.tiling.shape.m).collect();
    assert!(ms.contains(&decode) && ms.contains(&plan::DEFAULT_PREFILL_ROWS), "{ms:?}");
    for (i, d) in p.designs.values().enumerate() {
        design::check(d).unwrap();
        prove(d, 7 + i as u64);
    }
}

#[test]
fn smollm2_designs_equal_the_reference_gemm_on_npu1() {
    prove_model(smollm2(), Device::Npu1);
}

#[test]
fn smollm2_designs_equal_the_reference_gemm_on_npu2() {
    prove_model(smollm2(), Device::Npu2);
}

#[test]
fn qwen3_0p6b_designs_equal_the_reference_gemm_on_npu1() {
    prove_model(qwen3_0p6b(), Device::Npu1);
}

#[test]
fn qwen3_0p6b_designs_equal_the_reference_gemm_on_npu2() {
    prove_model(qwen3_0p6b(), Device::Npu2);
}
