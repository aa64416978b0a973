//! Writes the one-row qgemv designs of SmolLM2-135M's and a Qwen3-0.6B-shaped model's decode
//! projections (npu1 and npu2, one and two activation passes) into a folder, both forms, for a
//! check with mlir-aie's own tools (no plan uses qgemv designs yet, so `npuc compile` does not
//! write them), and prints each one's predicted cycles beside the 8-row GEMV design's for the
//! same projection (the cost model's assumptions: `codegen_aie::qgemv`'s constants).
//!
//! `cargo run --release -p codegen-aie --example qgemv_designs -- OUT_DIR`

use codegen_aie::{gemv, qgemv, Device, GemmShape};

/// (K, N) of SmolLM2's q/k/v, o, gate/up with its residual columns, down and a lm_head chunk,
/// then Qwen3-0.6B's q/k/v, o, down.
const SHAPES: [(usize, usize); 8] =
    [(576, 960), (576, 576), (576, 6144), (1536, 1152), (576, 16384), (1024, 4096), (2048, 1024), (3072, 2048)];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(out) = std::env::args().nth(1) else {
        return Err("usage: qgemv_designs OUT_DIR".into());
    };
    std::fs::create_dir_all(&out)?;
    println!("{:<30} {:>11} {:>11} {:>6}", "design", "cycles", "GEMV (8 rows)", "ratio");
    for device in [Device::Npu1, Device::Npu2] {
        for &(k, n) in &SHAPES {
            // The plan cuts a projection no GEMV design takes whole into narrower chunks.
            let plain = gemv::choose(device, GemmShape { m: gemv::GEMV_ROWS, k, n }).ok().map(|t| t.total_cycles);
            for passes in [1, 2] {
                let q = qgemv::choose(device, GemmShape { m: 1, k, n }, passes)?;
                let d = qgemv::build(&q);
                std::fs::write(format!("{out}/{}.pretty.mlir", d.name), d.pretty())?;
                std::fs::write(format!("{out}/{}.generic.mlir", d.name), d.generic())?;
                let cycles = q.tiling.total_cycles;
                match plain {
                    Some(p) => println!("{:<30} {cycles:>11} {p:>11} {:>6.2}", d.name, cycles as f64 / p as f64),
                    None => println!("{:<30} {cycles:>11} {:>11} {:>6}", d.name, "-", "-"),
                }
            }
        }
    }
    Ok(())
}
