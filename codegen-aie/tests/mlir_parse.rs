//! Every design the plan emits for SmolLM2-135M and the Qwen3-0.6B shape, on npu1 and npu2,
//! parses and verifies as MLIR (`mlir-opt` of LLVM/MLIR 22, unregistered dialects allowed), and
//! MLIR's own verifier — not ours — rejects broken ones.

use codegen_aie::gemm::GemmSite;
use codegen_aie::plan::{self, PlanOptions};
use codegen_aie::{design, mlir, tiling, Device, GemmShape};

fn site(node: &str, k: usize, n: usize) -> GemmSite {
    GemmSite::of_shape(node, k, n)
}

#[test]
fn every_design_parses_as_mlir() {
    let smollm2 = [(576, 576), (576, 192), (1536, 576), (576, 1536), (576, 49152)];
    // With Llama-3.2-1B's down projection, whose GEMV design streams its activations per tile.
    let qwen3 = [(1024, 2048), (1024, 1024), (2048, 1024), (1024, 3072), (3072, 1024), (1024, 151936), (8192, 2048)];
    let mut parsed = 0;
    for device in [Device::Npu1, Device::Npu2] {
        let sites = smollm2.iter().chain(&qwen3).enumerate().map(|(i, &(k, n))| site(&format!("p{i}"), k, n)).collect();
        let p = plan::plan_sites(sites, PlanOptions::new(device)).unwrap();
        for d in p.designs.values() {
            mlir::verify_generic(&d.generic()).unwrap_or_else(|e| panic!("{}: {e}", d.name));
            parsed += 1;
        }
    }
    assert!(parsed >= 40, "{parsed}");
}

#[test]
fn mlir_rejects_a_design_with_an_undefined_value() {
    let d = design::build(&tiling::choose(Device::Npu1, GemmShape { m: 64, k: 64, n: 64 }).unwrap());
    let text = d.generic();
    assert!(mlir::verify_generic(&text).is_ok());
    let broken = text.replacen("\"aie.core\"(%tile_0_2)", "\"aie.core\"(%tile_9_9)", 1);
    assert_ne!(broken, text);
    assert!(mlir::verify_generic(&broken).is_err());
}

#[test]
fn mlir_verifies_the_core_loops_as_scf() {
    let d = design::build(&tiling::choose(Device::Npu2, GemmShape { m: 128, k: 64, n: 64 }).unwrap());
    // An scf.for body must end in scf.yield: MLIR's own verifier, not ours, says so.
    let broken = d.generic().replacen("\"scf.yield\"() : () -> ()", "\"aie.end\"() : () -> ()", 1);
    assert_ne!(broken, d.generic());
    assert!(mlir::verify_generic(&broken).is_err());
}

#[test]
fn mlir_verifies_the_core_functions_bodies() {
    let d = design::build(&tiling::choose(Device::Npu1, GemmShape { m: 64, k: 64, n: 64 }).unwrap());
    // func, arith, memref, scf and vector are registered in MLIR: a contraction typed unlike its
    // operands, and a vector read with an index missing, are MLIR's errors, not ours.
    let contract = ": (vector<4x8xi32>, vector<8x8xi32>, vector<4x8xi32>) -> vector<4x8xi32>";
    assert!(d.generic().contains(contract));
    let mistyped =
        d.generic().replacen(contract, ": (vector<4x8xi32>, vector<8x8xi32>, vector<4x8xi32>) -> vector<8x8xi32>", 1);
    assert!(matches!(mlir::verify_generic(&mistyped), Err(mlir::MlirError::Rejected(_))));
    let read = "\"vector.transfer_read\"(%a, %mb, %kb, %idx0, %idx0, %pad8)";
    assert!(d.generic().contains(read));
    let short = d.generic().replacen(read, "\"vector.transfer_read\"(%a, %mb, %kb, %idx0, %pad8)", 1);
    assert!(matches!(mlir::verify_generic(&short), Err(mlir::MlirError::Rejected(_))));
    // A GEMV core of 3 rows (not whole micro-blocks) runs scalar code: a product typed unlike
    // its operands.
    let g =
        codegen_aie::gemv::build(&codegen_aie::gemv::choose(Device::Npu1, GemmShape { m: 3, k: 64, n: 64 }).unwrap());
    let product = "\"arith.muli\"(%aw, %ww) : (i32, i32) -> i32";
    assert!(g.generic().contains(product));
    let mistyped = g.generic().replacen(product, "\"arith.muli\"(%aw, %ww) : (i32, i32) -> i8", 1);
    assert!(matches!(mlir::verify_generic(&mistyped), Err(mlir::MlirError::Rejected(_))));
}

#[test]
fn the_tool_is_mlir_22() {
    let version = mlir::version().unwrap();
    assert!(version.contains("LLVM version 22."), "{version}");
}
