//! Writes the one-row qgemv designs of SmolLM2-135M's and a Qwen3-0.6B-shaped model's decode
//! projections (npu1 and npu2, one and two activation passes) into a folder, both forms, for a
//! check with mlir-aie's own tools (no plan uses qgemv designs yet, so `npuc compile` does not
//! write them), and prints each one's predicted cycles beside the 8-row GEMV design's for the
//! same projection (the cost model's assumptions: `codegen_aie::qgemv`'s constants).
//!
//! Also writes the norm core functions for the models' hidden sizes as modules of one function —
//! RmsNorm (`qkernels::rms_norm`, `n_rms_d<D>.mlir`) and the aligned inverse rms
//! (`qkernels::inverse_rms`, `n_irms_d<D>.mlir`) — and prints their operations: per 32-value
//! block of their two loops, and once a row (the lanes' folding and the root); and the row
//! quantisation's functions, of `x`, of the exact products `x·γ` and of the integer gate's
//! values (`qkernels::gate_functions`, `gq_*`, also written as one module, `gq_k576.mlir`),
//! and the f32 gate (`qkernels::swiglu`), per 8-value block.
//!
//! The norm-fed designs (`qgemv::choose_norm`: the residual stream's row and γ in, the norm on
//! the cores) of the projections a norm feeds are written too, their cycles beside the qgemv
//! design's that takes the normalised row.
//!
//! The pairs designs (a weight's two passes summed on the cores) follow, and one decode token of
//! SmolLM2-135M and Qwen3-0.6B on the chained designs beside the plan's GEMV designs: array
//! cycles, calls, and the tokens a second the array's share and the calls' dispatch allow.
//!
//! Then the sum-fed designs (`snqgemv…`: the residual stream's rows and a projection's output
//! in, their sum normalised on the cores and written back) of the projections a norm feeds,
//! one row and verify's eight, beside the norm-fed design that takes the sum from the host.
//!
//! Last, each model's decode MLP as one array program of two phases (`codegen_aie::sequence`),
//! and its layer after attention as one of three (`layer_…`: o, the sum-fed gate/up, down).
//!
//! `cargo run --release -p codegen-aie --example qgemv_designs -- OUT_DIR`

use codegen_aie::gemm::GemmSite;
use codegen_aie::kernels::{Function, Stmt};
use codegen_aie::qkernels::{self, NormShape};
use codegen_aie::{cost, gemv, plan, qgemv, Device, GemmShape};

/// (K, N) of SmolLM2's q/k/v, o, gate/up with its residual columns, down and a lm_head chunk,
/// then Qwen3-0.6B's q/k/v, o, down.
const SHAPES: [(usize, usize); 8] =
    [(576, 960), (576, 576), (576, 6144), (1536, 1152), (576, 16384), (1024, 4096), (2048, 1024), (3072, 2048)];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(out) = std::env::args().nth(1) else {
        return Err("usage: qgemv_designs OUT_DIR".into());
    };
    std::fs::create_dir_all(&out)?;
    println!("{:<40} {:>11} {:>11} {:>6}", "design", "cycles", "GEMV (8 rows)", "ratio");
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
                    Some(p) => println!("{:<40} {cycles:>11} {p:>11} {:>6.2}", d.name, cycles as f64 / p as f64),
                    None => println!("{:<40} {cycles:>11} {:>11} {:>6}", d.name, "-", "-"),
                }
            }
        }
    }
    norm_fed(&out)?;
    pairs(&out)?;
    sum_fed(&out)?;
    chained_decode(&out)?;
    mlp_programs(&out)?;
    norms(&out)
}

/// Each model's decode MLP as one array program (`codegen_aie::sequence::mlp`: the norm-fed
/// gate/up design, then the gate-fed down design on the row it wrote), both forms, as
/// `mlp_<model>_<device>.{generic,pretty}.mlir`: the main device `mlp_...` whose sequence
/// configures each design in turn.
fn mlp_programs(out: &str) -> Result<(), Box<dyn std::error::Error>> {
    let norm = qgemv::Feed::Norm { epsilon: 1e-6, sum: false };
    let gate = qgemv::Feed::Gate { kept: true };
    for m in &MODELS {
        for device in [Device::Npu1, Device::Npu2] {
            let gate_up = qgemv::choose_pairs(device, GemmShape { m: 1, k: m.hidden, n: 2 * m.inter }, 2, norm)?;
            let down = qgemv::choose_pairs(device, GemmShape { m: 1, k: m.inter, n: m.hidden }, 2, gate)?;
            let p = codegen_aie::sequence::mlp(&gate_up, &down)?;
            let model = m.name.to_lowercase().replace(['-', '.'], "_");
            let stem = format!("{out}/mlp_{model}_{device}");
            std::fs::write(format!("{stem}.generic.mlir"), p.generic())?;
            std::fs::write(format!("{stem}.pretty.mlir"), p.pretty())?;
            println!("{}: {} phases, {} buffers", p.name, p.phases.len(), p.buffers.len());
            // The layer after attention: o writing the sum-fed gate/up design's rows, then the MLP.
            let o = qgemv::choose_pairs(device, GemmShape { m: 1, k: m.attn, n: m.hidden }, 2, qgemv::Feed::Rows)?;
            let sum = qgemv::Feed::Norm { epsilon: 1e-6, sum: true };
            let summed = qgemv::choose_pairs(device, GemmShape { m: 1, k: m.hidden, n: 2 * m.inter }, 2, sum)?;
            let p = codegen_aie::sequence::layer(&o, &summed, &down)?;
            let stem = format!("{out}/layer_{model}_{device}");
            std::fs::write(format!("{stem}.generic.mlir"), p.generic())?;
            std::fs::write(format!("{stem}.pretty.mlir"), p.pretty())?;
            println!("{}: {} phases, {} buffers", p.name, p.phases.len(), p.buffers.len());
        }
    }
    Ok(())
}

/// A model's decode shapes: layers, hidden, q/k/v outputs, attention width, intermediate,
/// vocabulary.
struct Model {
    name: &'static str,
    layers: usize,
    hidden: usize,
    qkv: usize,
    attn: usize,
    inter: usize,
    vocab: usize,
}

const MODELS: [Model; 2] = [
    Model { name: "SmolLM2-135M", layers: 30, hidden: 576, qkv: 960, attn: 576, inter: 1536, vocab: 49152 },
    Model { name: "Qwen3-0.6B", layers: 28, hidden: 1024, qkv: 4096, attn: 2048, inter: 3072, vocab: 151936 },
];

/// One decode token on the chained designs — per layer the norm-fed q/k/v and gate/up, o on the
/// attention's rows and the gate-fed down projection, each summing its weight's two passes on
/// the cores, then the final norm-fed lm_head in the plan's column chunks — against the plan's
/// GEMV designs, whose calls take codes the host quantised and return int32 products the host
/// finishes (the host's share of either is not counted). "prologue" is the share of the chained
/// token's cycles its calls spend before their GEMV cores hold the codes. Writes the chained
/// designs too.
fn chained_decode(out: &str) -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "\n{:<14} {:<5} {:>6} {:>14} {:>8} {:>9} {:>14} {:>8}",
        "decode", "", "calls", "chained cycles", "tok/s", "prologue", "GEMV cycles", "tok/s"
    );
    for m in &MODELS {
        for device in [Device::Npu1, Device::Npu2] {
            let (calls, cycles, prologue) = chained_token(m, device, out)?;
            let rate = |c: u64| 1.0 / (c as f64 / device.clock_hz() + calls as f64 * cost::DISPATCH_SECONDS);
            let gemv = gemv_token(m, device)?;
            let gemv_cycles = (gemv.decode_array_seconds * device.clock_hz()).round();
            println!(
                "{:<14} {:<5} {calls:>6} {cycles:>14} {:>8.1} {:>8.1}% {gemv_cycles:>14} {:>8.1}",
                m.name,
                device.to_string(),
                rate(cycles),
                100.0 * prologue as f64 / cycles as f64,
                gemv.decode_tok_s
            );
        }
    }
    Ok(())
}

/// Calls, cycles and prologue cycles of one chained token of `m` on `device`.
fn chained_token(m: &Model, device: Device, out: &str) -> Result<(usize, u64, u64), Box<dyn std::error::Error>> {
    let chunks = plan::chunks(m.vocab, plan::DEFAULT_MAX_GEMV_COLS);
    let norm = qgemv::Feed::Norm { epsilon: 1e-6, sum: false };
    let gate = qgemv::Feed::Gate { kept: true };
    let layer = [
        (m.hidden, m.qkv, norm),
        (m.attn, m.hidden, qgemv::Feed::Rows),
        (m.hidden, 2 * m.inter, norm),
        (m.inter, m.hidden, gate),
    ];
    let (mut cycles, mut prologue) = (0u64, 0u64);
    let mut add = |q: &qgemv::QTiling, times: u64| {
        cycles += times * q.tiling.total_cycles;
        prologue += times * q.prologue_cycles;
    };
    for (k, n, feed) in layer {
        let q = qgemv::choose_pairs(device, GemmShape { m: 1, k, n }, 2, feed)?;
        add(&q, m.layers as u64);
        let d = qgemv::build(&q);
        std::fs::write(format!("{out}/{}.generic.mlir", d.name), d.generic())?;
    }
    for &(_, width) in &chunks {
        add(&qgemv::choose_norm(device, GemmShape { m: 1, k: m.hidden, n: width }, 2, 1e-6)?, 1);
    }
    Ok((4 * m.layers + chunks.len(), cycles, prologue))
}

/// The cost model's decode prediction for `m`'s projections planned on `device`'s GEMV designs.
fn gemv_token(m: &Model, device: Device) -> Result<cost::Prediction, Box<dyn std::error::Error>> {
    let two_pass = |node: &str, k: usize, n: usize| GemmSite {
        passes: 2,
        first_pass_columns: n,
        ..GemmSite::of_shape(node, k, 2 * n)
    };
    let layer = [
        ("qkv", m.hidden, m.qkv),
        ("o", m.attn, m.hidden),
        ("gate_up", m.hidden, 2 * m.inter),
        ("down", m.inter, m.hidden),
    ];
    let mut sites: Vec<GemmSite> =
        (0..m.layers).flat_map(|l| layer.map(|(p, k, n)| two_pass(&format!("{p}{l}"), k, n))).collect();
    sites.push(GemmSite { passes: 2, ..GemmSite::of_shape("lm_head", m.hidden, m.vocab) });
    let p = plan::plan_sites(sites, plan::PlanOptions::new(device))?;
    Ok(cost::predict(&p, 1, &|_| false))
}

/// The norm-fed designs of the same projections with the weight's two passes summed in the
/// epilogue (`_pairs`: N outputs from 2N weight columns), beside the norm-fed design that
/// returns the 2N columns for the host to add, and the gate-fed down projections likewise.
fn pairs(out: &str) -> Result<(), Box<dyn std::error::Error>> {
    println!("\n{:<52} {:>11} {:>11} {:>6}", "pairs design", "cycles", "2N columns", "ratio");
    let feeds = [
        (&NORM_FED[..], qgemv::Feed::Norm { epsilon: 1e-5, sum: false }),
        (&GATE_FED[..], qgemv::Feed::Gate { kept: true }),
    ];
    for device in [Device::Npu1, Device::Npu2] {
        for (k, n, feed) in feeds.iter().flat_map(|(shapes, f)| shapes.iter().map(move |&(k, n)| (k, n, *f))) {
            let q = qgemv::choose_pairs(device, GemmShape { m: 1, k, n }, 2, feed)?;
            let d = qgemv::build(&q);
            std::fs::write(format!("{out}/{}.pretty.mlir", d.name), d.pretty())?;
            std::fs::write(format!("{out}/{}.generic.mlir", d.name), d.generic())?;
            let wide = GemmShape { m: 1, k, n: 2 * n };
            let plain = match feed {
                qgemv::Feed::Norm { epsilon, .. } => qgemv::choose_norm(device, wide, 2, epsilon)?,
                _ => qgemv::choose_gate(device, wide, 2)?,
            };
            let (cycles, plain) = (q.tiling.total_cycles, plain.tiling.total_cycles);
            println!("{:<52} {cycles:>11} {plain:>11} {:>6.2}", d.name, cycles as f64 / plain as f64);
        }
    }
    Ok(())
}

/// The sum-fed pairs designs of the projections a norm feeds, one and eight rows, beside the
/// norm-fed pairs design of the same rows.
fn sum_fed(out: &str) -> Result<(), Box<dyn std::error::Error>> {
    println!("\n{:<60} {:>11} {:>11} {:>6}", "sum-fed design", "cycles", "norm-fed", "ratio");
    let (sum, norm) = (qgemv::Feed::Norm { epsilon: 1e-5, sum: true }, qgemv::Feed::Norm { epsilon: 1e-5, sum: false });
    for device in [Device::Npu1, Device::Npu2] {
        for (&(k, n), rows) in NORM_FED.iter().flat_map(|s| [(s, 1), (s, 8)]) {
            let shape = GemmShape { m: rows, k, n };
            let q = match qgemv::choose_pairs(device, shape, 2, sum) {
                Ok(q) => q,
                Err(e) => {
                    println!("{device} {rows}x{k}x{n}: none ({e})");
                    continue;
                }
            };
            let d = qgemv::build(&q);
            std::fs::write(format!("{out}/{}.pretty.mlir", d.name), d.pretty())?;
            std::fs::write(format!("{out}/{}.generic.mlir", d.name), d.generic())?;
            let (cycles, plain) =
                (q.tiling.total_cycles, qgemv::choose_pairs(device, shape, 2, norm)?.tiling.total_cycles);
            println!("{:<60} {cycles:>11} {plain:>11} {:>6.2}", d.name, cycles as f64 / plain as f64);
        }
    }
    Ok(())
}

/// (K, N) of the projections a norm feeds: SmolLM2's q/k/v and gate/up, then Qwen3-0.6B's.
const NORM_FED: [(usize, usize); 4] = [(576, 960), (576, 3072), (1024, 4096), (1024, 6144)];

/// (K, N) of the projections a gate feeds: SmolLM2's down, then Qwen3-0.6B's.
const GATE_FED: [(usize, usize); 2] = [(1536, 576), (3072, 1024)];

/// The norm-fed designs of the projections a norm feeds (the residual stream's row and γ in)
/// and the gate-fed designs of those a gate feeds (the gate's and up's rows in), written like
/// the others, with their predicted cycles beside the qgemv design's that takes the normalised
/// row or the gate's output.
fn norm_fed(out: &str) -> Result<(), Box<dyn std::error::Error>> {
    println!("\n{:<50} {:>11} {:>11} {:>6}", "norm- or gate-fed design", "cycles", "qgemv", "ratio");
    type Choose = fn(Device, GemmShape, usize) -> Result<qgemv::QTiling, codegen_aie::tiling::TilingError>;
    let norm: Choose = |device, shape, passes| qgemv::choose_norm(device, shape, passes, 1e-5);
    let fed: [(&[(usize, usize)], Choose); 2] = [(&NORM_FED, norm), (&GATE_FED, qgemv::choose_gate)];
    for device in [Device::Npu1, Device::Npu2] {
        for (k, n, choose) in fed.iter().flat_map(|(shapes, c)| shapes.iter().map(move |&(k, n)| (k, n, *c))) {
            for passes in [1, 2] {
                let shape = GemmShape { m: 1, k, n };
                let q = choose(device, shape, passes)?;
                let d = qgemv::build(&q);
                std::fs::write(format!("{out}/{}.pretty.mlir", d.name), d.pretty())?;
                std::fs::write(format!("{out}/{}.generic.mlir", d.name), d.generic())?;
                let (cycles, plain) =
                    (q.tiling.total_cycles, qgemv::choose(device, shape, passes)?.tiling.total_cycles);
                println!("{:<50} {cycles:>11} {plain:>11} {:>6.2}", d.name, cycles as f64 / plain as f64);
            }
        }
    }
    Ok(())
}

/// The norm functions for SmolLM2's, Qwen3-0.6B's and Qwen3-4B's hidden sizes — RmsNorm (its
/// loops: the squares, the scaling) and the aligned inverse rms (the largest magnitude, the
/// squares) — and their operation counts (constants aside).
fn norms(out: &str) -> Result<(), Box<dyn std::error::Error>> {
    println!("\n{:<16} {:>16} {:>16} {:>12}", "norm", "loop 1 / block", "loop 2 / block", "once a row");
    type Build = fn(NormShape) -> Result<Function, String>;
    let functions: [(&str, Build); 2] = [("n_rms", qkernels::rms_norm), ("n_irms", qkernels::inverse_rms)];
    for (name, build) in functions {
        for d in [576, 1024, 2560] {
            let f = build(NormShape { rows: 1, d, epsilon: 1e-5 })?;
            std::fs::write(format!("{out}/{name}_d{d}.mlir"), format!("module {{\n{}}}\n", f.pretty(2)))?;
            let (loops, once) = counts(&f)?;
            println!("{:<16} {:>16} {:>16} {once:>12}", format!("{name}_d{d}"), loops[0], loops[1]);
        }
    }
    prologues(out)
}

/// The row quantisation's functions, two passes, for `QuantizeRows(x)` (`q_*`), for the
/// exact products `QuantizeRows(x, γ)` (`qn_*`) and for `QuantizeSwiGlu(g, u)` (`gq_*`, its
/// scales the `qn_*` ones): operations per 8-value block of their loop over a K part, and once a
/// row.
fn prologues(out: &str) -> Result<(), Box<dyn std::error::Error>> {
    println!("\n{:<16} {:>16} {:>12}", "quantisation", "loop / block", "once a row");
    let sh = qkernels::Shape {
        rows: 1,
        k: 576,
        n: 64,
        passes: 2,
        kernel_rows: 1,
        input: qkernels::Input::Rows,
        pairs: false,
        stacked: false,
    };
    let dequant = qkernels::DEQUANT;
    let plain = qkernels::functions(sh).into_iter().filter(|f| f.name != dequant);
    let text: String = qkernels::gate_functions(sh).iter().map(|f| f.pretty(2)).collect();
    std::fs::write(format!("{out}/gq_k{}.mlir", sh.k), format!("module {{\n{text}}}\n"))?;
    let gate = qkernels::gate_functions(sh).into_iter().filter(|f| f.name.starts_with("gq_"));
    for f in plain.chain(qkernels::product_functions(sh)).chain(gate) {
        let (loops, once) = counts(&f)?;
        let per_block = loops.first().map_or("-".to_string(), |n| n.to_string());
        println!("{:<16} {per_block:>16} {once:>12}", f.name);
    }
    let gate = qkernels::swiglu(qkernels::GateShape { rows: 1, d: 1536 })?;
    let (loops, once) = counts(&gate)?;
    println!("{:<16} {:>16} {once:>12}", gate.name, loops[0]);
    Ok(())
}

/// The operations of a function that is one loop over rows: per loop inside it, and the rest
/// of the row's.
fn counts(f: &Function) -> Result<(Vec<usize>, usize), String> {
    let row = match f.body.as_deref() {
        Some([.., Stmt::For { body, .. }]) => body,
        _ => return Err(format!("@{} is not one loop over rows", f.name)),
    };
    let loops: Vec<usize> =
        row.iter().filter_map(|s| if let Stmt::For { body, .. } = s { Some(operations(body)) } else { None }).collect();
    Ok((loops.clone(), operations(row) - loops.iter().sum::<usize>() - loops.len()))
}

/// Operations in `body`, constants aside, loops counted once.
fn operations(body: &[Stmt]) -> usize {
    body.iter()
        .map(|s| match s {
            Stmt::Const { .. } | Stmt::FConst { .. } => 0,
            Stmt::For { body, .. } => operations(body) + 1,
            _ => 1,
        })
        .sum()
}
