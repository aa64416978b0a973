//! `npuc compile --target xdna`: the bundle's designs cover every projection GEMM of the program
//! (the lm_head included), the plan routes small calls to the GEMV designs, and every design read
//! back from the bundle executes int32-exactly in the design interpreter.

mod common;

use codegen_aie::{interp, quant};
use runtime::bundle::Bundle;
use serde_json::Value;
use std::collections::BTreeSet;
use std::process::Command;

fn npuc(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_npuc")).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn compile(name: &str, device: &str, dir: &std::path::Path) -> (Bundle, Value) {
    let out = dir.join(format!("{name}_{device}.npub"));
    let model = common::model(name);
    let args = [
        "compile",
        model.to_str().unwrap(),
        "--target",
        "xdna",
        "--device",
        device,
        "-o",
        out.to_str().unwrap(),
        "--json",
    ];
    let (ok, stdout, err) = npuc(&args);
    assert!(ok, "{err}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    (Bundle::open(&out, Some("xdna")).unwrap_or_else(|e| panic!("{name}: {e}")), summary)
}

/// Projection nodes of the bundle's program, found from the program JSON alone: MatMul, WGemm,
/// QGemm whose weight operand is constant: a stored weight, or computed from stored weights only.
fn projection_nodes(program: &Value) -> BTreeSet<String> {
    let values = program["values"].as_array().unwrap();
    let nodes = program["nodes"].as_array().unwrap();
    fn constant(values: &[Value], nodes: &[Value], v: &Value) -> bool {
        let Some(i) = v.as_u64() else { return false };
        let def = &values[i as usize]["def"];
        if def.get("weight").is_some() || def.get("const").is_some() {
            return true;
        }
        nodes.iter().find(|n| n["outputs"].as_array().unwrap().iter().any(|o| o.as_u64() == Some(i))).is_some_and(|n| {
            n["inputs"].as_array().unwrap().iter().filter(|x| !x.is_null()).all(|x| constant(values, nodes, x))
        })
    }
    nodes
        .iter()
        .filter_map(|n| {
            let w = match n["op"].as_str()? {
                "ai.onnx::MatMul" => &n["inputs"][1],
                "npuc::WGemm" => &n["inputs"][1],
                "npuc::QGemm" => &n["inputs"][3],
                _ => return None,
            };
            constant(values, nodes, w).then(|| n["name"].as_str().unwrap().to_string())
        })
        .collect()
}

fn values_i8(len: usize, seed: u64) -> Vec<i8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 56) as u8 as i8
        })
        .collect()
}

/// Runs every design of `kind` (`gemm`, `gemv`) and `rows` rows from the bundle's text against a
/// plain GEMM; a GEMV design takes the weight transposed.
fn designs_pass_the_interpreter(b: &Bundle, plan: &Value, kind: &str, rows: u64) -> usize {
    let mut ran = 0;
    let designs = plan["designs"].as_array().unwrap();
    for d in designs.iter().filter(|d| d["tiling"]["shape"]["m"] == rows && d["kind"] == kind) {
        let text = String::from_utf8(b.read_file(d["file"].as_str().unwrap()).unwrap()).unwrap();
        let dim = |k: &str, x: &str| d["tiling"][k][x].as_u64().unwrap() as usize;
        let (m, k, n) = (dim("shape", "m"), dim("shape", "k"), dim("shape", "n"));
        let (pm, pk, pn) = (dim("padded", "m"), dim("padded", "k"), dim("padded", "n"));
        let (a, w) = (values_i8(m * k, 11), values_i8(k * n, 12));
        let mut ap = vec![0i8; pm * pk];
        for i in 0..m {
            ap[i * pk..i * pk + k].copy_from_slice(&a[i * k..i * k + k]);
        }
        let mut wp = vec![0i8; pk * pn];
        for i in 0..k {
            for j in 0..n {
                let at = if kind == "gemv" { j * pk + i } else { i * pn + j };
                wp[at] = w[i * n + j];
            }
        }
        let (c, _) = interp::run(&text, &[&ap, &wp]).unwrap_or_else(|e| panic!("{}: {e}", d["name"]));
        for i in 0..m {
            for j in 0..n {
                let want: i32 = (0..k).map(|kk| a[i * k + kk] as i32 * w[kk * n + j] as i32).sum();
                assert_eq!(c[i * pn + j], want, "{}: C[{i}][{j}]", d["name"]);
            }
        }
        ran += 1;
    }
    ran
}

/// The bundle's first projection, an int8 `QGemm`, through its decode-block design: activations
/// quantised per row as `QuantizeRows` does, the weight codes, scales and zero points read back
/// from the bundle, the design's int32 output from the interpreter, the A8W8 epilogue on it;
/// the result must equal the reference `QGemm` bit for bit.
fn first_qgemm_through_its_design(b: &Bundle, plan: &Value) -> bool {
    let program = serde_json::to_value(b.program()).unwrap();
    let values = program["values"].as_array().unwrap();
    let g = &plan["gemms"][0];
    let node = program["nodes"].as_array().unwrap().iter().find(|n| n["name"] == g["site"]["node"]).unwrap();
    assert_eq!(node["op"], "npuc::QGemm");
    let input = |i: usize| &values[node["inputs"][i].as_u64().unwrap() as usize];
    // The array-int8 form: symmetric per-row activation codes (zero point the constant 0).
    if input(2)["def"]["const"]["data"] != serde_json::json!([0]) {
        return false;
    }
    let weight = |i: usize| b.tensor(input(i)["def"]["weight"].as_str().unwrap()).unwrap();
    let (k, n) = (g["site"]["k"].as_u64().unwrap() as usize, g["site"]["n"].as_u64().unwrap() as usize);
    let w: Vec<i8> = weight(3).bytes.iter().map(|&x| x as i8).collect();
    let sw: Vec<f32> = weight(4).bytes.chunks_exact(4).map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]])).collect();
    let zw: Vec<i64> = weight(5).bytes.iter().map(|&x| x as i8 as i64).collect();
    assert_eq!((w.len(), sw.len(), zw.len()), (k * n, n, n));
    // The first column chunk's design: its columns of the weight, as a QGemm of their own.
    let chunk = &g["chunks"][0];
    assert_eq!(chunk["col_offset"], 0);
    let cols = chunk["cols"].as_u64().unwrap() as usize;
    let w: Vec<i8> = w.chunks(n).flat_map(|row| row[..cols].to_vec()).collect();
    let (sw, zw, n) = (sw[..cols].to_vec(), zw[..cols].to_vec(), cols);
    let name = chunk["decode_design"].as_str().unwrap();
    let d = plan["designs"].as_array().unwrap().iter().find(|d| d["name"] == name).unwrap();
    let dim = |key: &str, x: &str| d["tiling"][key][x].as_u64().unwrap() as usize;
    let (m, pm, pk, pn) = (dim("shape", "m"), dim("padded", "m"), dim("padded", "k"), dim("padded", "n"));
    let a: Vec<f32> =
        values_i8(m * k * 4, 3).chunks(4).map(|c| c.iter().map(|&x| x as f32 / 64.0).sum::<f32>()).collect();
    let (codes, row_scales) = ir::fused::quantize_rows(&a, k);
    let mut ap = vec![0i8; pm * pk];
    for i in 0..m {
        ap[i * pk..i * pk + k].copy_from_slice(&codes[i * k..(i + 1) * k]);
    }
    let mut wp = vec![0i8; pk * pn];
    for i in 0..k {
        wp[i * pn..i * pn + n].copy_from_slice(&w[i * n..(i + 1) * n]);
    }
    let text = String::from_utf8(b.read_file(d["file"].as_str().unwrap()).unwrap()).unwrap();
    let (c, _) = interp::run(&text, &[&ap, &wp]).unwrap();
    let p: Vec<i32> = (0..m).flat_map(|i| c[i * pn..i * pn + n].to_vec()).collect();
    let (rows, cols) = quant::code_sums(&codes, m, k, &w, n);
    let q = quant::QParams { a_scales: &row_scales, a_zero: 0, w_scales: &sw, w_zeros: &zw };
    let got = quant::epilogue(&p, m, k, n, &rows, &cols, &q);
    let t = |dtype, shape: Vec<usize>, v: Vec<i64>| ir::Tensor::from_i64(dtype, shape, v);
    let inputs = [
        t(ir::DType::I8, vec![m, k], codes.iter().map(|&x| x as i64).collect()),
        ir::Tensor::from_f32(ir::DType::F32, vec![m, 1], row_scales.clone()),
        t(ir::DType::I8, vec![], vec![0]),
        t(ir::DType::I8, vec![k, n], w.iter().map(|&x| x as i64).collect()),
        ir::Tensor::from_f32(ir::DType::F32, vec![n], sw.clone()),
        t(ir::DType::I8, vec![n], zw.clone()),
    ];
    let attrs = ir::Attrs::default();
    let op = ir::OpRef { node: "qgemm", domain: ir::Domain::Npuc, op: "QGemm", opset: 1, attrs: &attrs };
    let refs: Vec<Option<&ir::Tensor>> = inputs.iter().map(Some).collect();
    let want = ir::fused::eval(&op, &refs, 1).unwrap().remove(0);
    assert_eq!(got, want.as_f32().unwrap(), "the design's QGemm differs from the reference");
    true
}

/// Checks a bundle; true when its first projection was also run through the A8W8 epilogue.
fn check_bundle(name: &str, device: &str) -> bool {
    let tmp = tempfile::tempdir().unwrap();
    let (b, summary) = compile(name, device, tmp.path());
    let plan: Value = serde_json::from_slice(&b.read_file("xdna/plan.json").unwrap()).unwrap();
    assert_eq!(plan["format"], "npuc-xdna-plan/6");
    assert_eq!(plan["device"], device);
    assert_eq!((&plan["host_threshold_rows"], &plan["gemv_rows"]), (&16.into(), &8.into()));
    let planned: BTreeSet<String> =
        plan["gemms"].as_array().unwrap().iter().map(|g| g["site"]["node"].as_str().unwrap().to_string()).collect();
    let projections = projection_nodes(&serde_json::to_value(b.program()).unwrap());
    assert!(!projections.is_empty());
    assert_eq!(planned, projections, "{name}: every projection GEMM has designs");
    let gemms = plan["gemms"].as_array().unwrap();
    let vocab = b.model().vocab as u64;
    let lm_head = gemms.iter().rev().find(|g| g["site"]["n"] == vocab).expect("the lm_head is planned");
    // The weight it streams is in the bundle (array-int8 stores a tied lm_head's int8 [k, n] copy).
    assert!(b.tensor(lm_head["site"]["weight"].as_str().unwrap()).is_some(), "{name}: {lm_head}");
    for g in gemms {
        for chunks in ["chunks", "gemv_chunks"] {
            let cols: u64 = g[chunks].as_array().unwrap().iter().map(|c| c["cols"].as_u64().unwrap()).sum();
            assert_eq!(cols, g["site"]["n"].as_u64().unwrap(), "{} {chunks}", g["site"]["node"]);
        }
    }
    for d in plan["designs"].as_array().unwrap() {
        for k in ["file", "pretty"] {
            let text = String::from_utf8(b.read_file(d[k].as_str().unwrap()).unwrap()).unwrap();
            assert!(text.contains("aie.objectfifo.link") && text.contains("aiex.npu.dma_memcpy_nd"), "{}", d[k]);
            // The cores' code is in the design: functions with bodies, no object to link; the
            // GEMM cores and the 8-row GEMV blocks multiply in vector form.
            assert!(text.contains("memref.store") && text.contains("vector.contract"), "{}", d[k]);
            assert!(!text.contains("link_with") && !text.contains("private"), "{}", d[k]);
        }
        let build = d["build"].as_str().unwrap();
        assert!(build.starts_with("aiecc.py --no-xchesscc --no-xbridge"), "{build}");
        assert!(build.ends_with(&format!(" {}", d["pretty"].as_str().unwrap())), "{build}");
        let u = d["tiling"]["utilisation"].as_f64().unwrap();
        assert!(u > 0.0 && u <= 1.0);
    }
    assert_eq!(summary["xdna"]["projections"], projections.len());
    // make test installs mlir-opt, so every design was verified by MLIR 22 while compiling.
    let mlir = plan["mlir"].as_str().unwrap();
    let count = plan["designs"].as_array().unwrap().len();
    let programs: BTreeSet<&str> =
        plan["programs"].as_array().into_iter().flatten().map(|p| p["name"].as_str().unwrap()).collect();
    let verified = format!("{count} designs and {} array programs verified by MLIR (", programs.len());
    assert!(mlir.starts_with(&verified) && mlir.contains("LLVM version 22."), "{mlir}");
    assert_eq!(summary["xdna"]["mlir"], plan["mlir"]);
    assert_eq!(summary["xdna"]["projections_with_designs"], projections.len());
    // Without aiecc on PATH, the summary says so and gives each design's build command.
    assert!(summary["xdna"]["artifacts"].as_str().unwrap().starts_with("aiecc.py is not on PATH"), "{summary}");
    for (d, s) in plan["designs"].as_array().unwrap().iter().zip(summary["xdna"]["designs"].as_array().unwrap()) {
        assert_eq!((&s["name"], &s["build"]), (&d["name"], &d["build"]));
    }
    let distinct = |chunks: &str, field: &str| -> BTreeSet<String> {
        let chunks = gemms.iter().flat_map(|g| g[chunks].as_array().unwrap());
        chunks.map(|c| c[field].as_str().unwrap().to_string()).collect()
    };
    let ran = designs_pass_the_interpreter(&b, &plan, "gemm", plan["decode_rows"].as_u64().unwrap());
    assert_eq!(ran, distinct("chunks", "decode_design").len(), "{name}: every decode-block design ran");
    let ran = designs_pass_the_interpreter(&b, &plan, "gemv", 8);
    assert_eq!(ran, distinct("gemv_chunks", "design").len(), "{name}: every GEMV design ran");
    let w = b.tensor(gemms[0]["site"]["weight"].as_str().unwrap()).unwrap();
    w.dtype == runtime::bundle::Dtype::I8 && first_qgemm_through_its_design(&b, &plan)
}

#[test]
fn smollm2_compiles_for_npu1_with_designs_for_every_projection_and_its_qgemm_equals_the_reference() {
    assert!(check_bundle("smollm2-optimum", "npu1"));
}

#[test]
fn int4_qwen3_compiles_for_npu2_with_designs_for_every_projection_and_its_qgemm_equals_the_reference() {
    assert!(check_bundle("qwen3-builder-int4", "npu2"));
}

#[test]
fn qdq_llama_compiles_for_npu1_with_designs_for_every_qgemm_including_lm_head() {
    check_bundle("llama-qdq-per-tensor-s8", "npu1");
}

/// A design MLIR rejects is a compiler bug: the compile fails naming the design and MLIR's words.
/// A stand-in mlir-opt (named by `NPUC_MLIR_OPT`) answers `--version` and rejects every input.
#[test]
fn a_design_mlir_rejects_fails_the_compile_naming_it() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let tool = tmp.path().join("mlir-opt");
    std::fs::write(
        &tool,
        "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'LLVM version 22.1.0'; exit 0; }\necho \"<stdin>:3:5: error: 'aie.tile' op is not good\" >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let model = common::model("llama-optimum");
    let out = Command::new(env!("CARGO_BIN_EXE_npuc"))
        .args([
            "compile",
            model.to_str().unwrap(),
            "--target",
            "xdna",
            "-o",
            tmp.path().join("b.npub").to_str().unwrap(),
        ])
        .env("NPUC_MLIR_OPT", &tool)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not verify in MLIR (LLVM version 22.1.0)") && err.contains("design gemm_"), "{err}");
    assert!(err.contains("'aie.tile' op is not good"), "{err}");
}

#[test]
fn device_applies_to_xdna_only_and_must_be_known() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::model("llama-optimum");
    let out = tmp.path().join("x.npub");
    let (ok, _, err) =
        npuc(&["compile", model.to_str().unwrap(), "--target", "cpu", "--device", "npu1", "-o", out.to_str().unwrap()]);
    assert!(!ok && err.contains("--device npu1 applies to --target xdna only"), "{err}");
    let (ok, _, err) = npuc(&[
        "compile",
        model.to_str().unwrap(),
        "--target",
        "xdna",
        "--device",
        "npu9",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("unknown XDNA device `npu9`"), "{err}");
}

#[test]
fn a_tied_lm_head_reading_the_embedding_transposed_is_a_projection() {
    // Before array-int8 (the cpu pipeline), the tied lm_head is MatMul(x, Transpose(embedding)).
    let g = frontend::import_file(&common::model("llama-optimum")).unwrap().graph;
    let t = passes::targets::target("cpu").unwrap();
    let g = passes::driver::run(&t.pipeline(), g, None, |_, _| {}).unwrap().graph;
    let sites = codegen_aie::gemm::collect(&g);
    let head = sites.last().unwrap();
    let vocab = g.value(g.outputs[0]).shape.last().unwrap().as_known().unwrap() as usize;
    assert_eq!((head.n, head.transposed, head.op.as_str()), (vocab, true, "ai.onnx::MatMul"), "{head:?}");
    let embedding = g.weights.iter().find(|(_, w)| w.name == head.weight).map(|(_, w)| w.shape.clone());
    assert_eq!(embedding, Some(vec![vocab, head.k]));
    assert!(sites.iter().rev().skip(1).all(|s| !s.transposed));
}

/// `npuc run --backend xrt` on a machine without XRT or an NPU names what is missing and points
/// at the host backend; a bundle for another target is refused for what it is.
#[test]
fn the_xrt_backend_says_what_is_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, _) = compile("llama-optimum", "npu1", tmp.path());
    let bundle = tmp.path().join("llama-optimum_npu1.npub");
    let (ok, _, err) = npuc(&["run", bundle.to_str().unwrap(), "--prompt", "hi", "--backend", "xrt"]);
    assert!(!ok, "{err}");
    let missing =
        err.contains("XRT not found") || err.contains("no XDNA NPU") || err.contains("without the `xrt` feature");
    assert!(missing && err.contains("--backend host"), "{err}");
    let model = common::model("llama-optimum");
    let cpu = tmp.path().join("cpu.npub");
    let (ok, _, err) = npuc(&["compile", model.to_str().unwrap(), "--target", "cpu", "-o", cpu.to_str().unwrap()]);
    assert!(ok, "{err}");
    let (ok, _, err) = npuc(&["run", cpu.to_str().unwrap(), "--prompt", "hi", "--backend", "xrt"]);
    assert!(!ok && err.contains("--target xdna") && err.contains("cpu"), "{err}");
}

/// The `xrt` backend's run path end to end without an NPU: an xdna bundle whose designs carry
/// device artifacts (here the design's own text as the PDI, which the driver model's firmware runs
/// through the design interpreter, and a stand-in instruction stream) runs on the host executor
/// with every prefill QGemm offloaded through the amdxdna ioctls — buffer objects, hardware
/// contexts, commands, syncobj waits (`codegen_aie::amdxdna::sim` checks each as the driver does).
/// The int32 products are exact, so the logits equal the host backend's bit for bit — a 20-row
/// prefill (the small M-block's designs), a decode step (one row, below the plan's threshold: the
/// GEMV designs) and a 100-row prefill (the prefill designs).
#[cfg(feature = "xrt")]
#[test]
fn an_xdna_bundle_runs_its_prefill_and_decode_gemms_through_the_amdxdna_ioctls_with_the_host_logits() {
    use codegen_aie::amdxdna::sim::Sim;
    use runtime::exec::{ExecOptions, Executor};
    use xdna_driver::Npu;
    let tmp = tempfile::tempdir().unwrap();
    let (bundle, _) = compile("llama-optimum", "npu1", tmp.path());
    let plan: Value = serde_json::from_slice(&bundle.read_file("xdna/plan.json").unwrap()).unwrap();
    let mut add = Vec::new();
    for d in plan["designs"].as_array().unwrap() {
        let name = d["name"].as_str().unwrap();
        let text = bundle.read_file(d["file"].as_str().unwrap()).unwrap();
        add.push((format!("xdna/{name}.pdi"), text));
        add.push((format!("xdna/{name}.insts.bin"), vec![0u8; 64]));
    }
    let with = tmp.path().join("with_artifacts.npub");
    common::copy_bundle_adding_files(&bundle, &with, &add);
    let bundle = Bundle::open(&with, Some("xdna")).unwrap();
    let options = || ExecOptions { threads: 2, max_context: 128, ..ExecOptions::default() };
    let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % 500).collect();
    let mut host = Executor::new(&bundle, options()).unwrap();
    let want_prefill = host.step(&prompt).unwrap().to_vec();
    let want_decode = host.step(&[7]).unwrap().to_vec();

    let sim = Sim::interpreting();
    let npu = Npu::with_driver(sim.clone()).unwrap();
    let offload = Box::new(runtime::xdna::XdnaOffload::new(npu, &bundle).unwrap());
    let mut npu_exec = Executor::new(&bundle, options()).unwrap();
    npu_exec.set_offload(offload).unwrap();
    let got_prefill = npu_exec.step(&prompt).unwrap().to_vec();
    let prefill_calls = npu_exec.offloaded_calls();
    let execs = sim.state().calls.iter().filter(|&&c| c == "EXEC_CMD").count();
    let got_decode = npu_exec.step(&[7]).unwrap().to_vec();
    // 2 layers × (q, k and v side by side; o; gate and up side by side; down: one call of both
    // activation passes' rows each) + the lm_head's call.
    let calls = 2 * 4 + 1;
    assert_eq!(prefill_calls, calls, "QGemm calls offloaded in the prefill step");
    // Each one M-block per column chunk: every call but the lm_head's has its weights' second
    // pass as a chunk of its own, which multiplies the first activation pass's rows only.
    assert_eq!(execs as u64, 2 * (4 * 2) + 1, "commands submitted");
    // A one-row decode step runs its chained projections (o and down: their γ-free rows) as one
    // qgemv call each, and every other QGemm call as one GEMV block: a weight's two passes are
    // one design's columns.
    let chains = plan["chains"].as_array().unwrap().len() as u64;
    assert_eq!(chains, 4, "o and down of both layers");
    assert_eq!(npu_exec.offloaded_chains(), chains, "every chain of the decode step");
    assert_eq!(npu_exec.offloaded_calls(), prefill_calls + calls - chains, "the other QGemm calls");
    let decode_execs = sim.state().calls.iter().filter(|&&c| c == "EXEC_CMD").count() - execs;
    assert_eq!(decode_execs as u64, calls, "one command per projection");
    let differing = |a: &[f32], b: &[f32]| a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    assert_eq!(got_prefill.len(), want_prefill.len());
    assert_eq!(differing(&got_prefill, &want_prefill), 0, "prefill logits that differ from the host's");
    assert_eq!(differing(&got_decode, &want_decode), 0, "decode logits that differ from the host's");
    // A prompt longer than the smallest M-block runs the prefill designs.
    let long: Vec<u32> = (0..100).map(|i| (i * 53 + 11) % 500).collect();
    host.reset().unwrap();
    npu_exec.reset().unwrap();
    let want_long = host.step(&long).unwrap().to_vec();
    let got_long = npu_exec.step(&long).unwrap().to_vec();
    assert_eq!(npu_exec.offloaded_calls(), 2 * prefill_calls + calls - chains);
    assert_eq!(differing(&got_long, &want_long), 0, "logits of a 100-token prefill");
    // One hardware context per design the steps used: every decode, prefill and GEMV design.
    let gemms = plan["gemms"].as_array().unwrap();
    let m_blocks = gemms.iter().flat_map(|g| g["chunks"].as_array().unwrap());
    // The steps had one row or 20 or 100: a chained projection's GEMV design ran in none.
    let chain_nodes: Vec<&Value> = plan["chains"].as_array().unwrap().iter().map(|c| &c["qgemm"]).collect();
    let unchained = gemms.iter().filter(|g| !chain_nodes.contains(&&g["site"]["node"]));
    let gemv = unchained.flat_map(|g| g["gemv_chunks"].as_array().unwrap()).map(|c| c["design"].as_str().unwrap());
    let chained = plan["chains"].as_array().unwrap().iter().flat_map(|c| c["chunks"].as_array().unwrap());
    let used: BTreeSet<&str> = m_blocks
        .flat_map(|c| ["decode_design", "prefill_design"].map(|k| c[k].as_str().unwrap()))
        .chain(gemv)
        .chain(chained.map(|c| c["design"].as_str().unwrap()))
        .collect();
    assert_eq!(sim.state().ctxs.len(), used.len(), "hardware contexts");
    drop(npu_exec);
    assert!(sim.state().bos.is_empty() && sim.state().ctxs.is_empty(), "every buffer and context released");
}
