//! The intel-npu IR against the real OpenVINO (its Python API, `tools/ov_check.py`): every segment
//! loads with `read_model`, and each one run on CPU (f32) matches the reference evaluator on the
//! same inputs (the builder's Llama and Qwen3 int4, symmetric and asymmetric, optimum's float
//! SmolLM2 and Llama with compressed weights, interleaved RoPE); the IR is weightless and every block size views the same weight bytes.

mod common;

use codegen_intel::float::FloatWeights;
use codegen_intel::symmetric::Asymmetric;
use ir::{DType, Tensor};
use runtime::bundle::intel::Role;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> PathBuf {
    std::env::var_os("NPUC_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"))
}

fn program(entry: &str) -> ir::Graph {
    program_of(&common::model(entry))
}

fn program_of(model: &Path) -> ir::Graph {
    let imported = frontend::import_file(model).unwrap_or_else(|e| panic!("{e}"));
    let target = passes::targets::target("intel-npu").unwrap();
    passes::driver::run(&target.pipeline(), imported.graph, None, |_, _| {}).unwrap().graph
}

/// SmolLM2 as the builder writes it in int4 (symmetric, block 32, tied embedding), compiled once
/// for the tests that read it.
fn smollm2() -> &'static (ir::Graph, codegen_intel::IntelIr) {
    static IR: std::sync::OnceLock<(ir::Graph, codegen_intel::IntelIr)> = std::sync::OnceLock::new();
    IR.get_or_init(|| {
        let g = program("smollm2-builder-int4");
        let ir = codegen_intel::compile(&g, &codegen_intel::Options::default()).unwrap();
        (g, ir)
    })
}

fn write_ir(dir: &Path, ir: &codegen_intel::IntelIr) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, text) in &ir.xml {
        std::fs::write(dir.join(name), text).unwrap();
    }
    std::fs::write(dir.join(codegen_intel::WEIGHTS_FILE), &ir.weights).unwrap();
    std::fs::write(dir.join(codegen_intel::PLAN_FILE), ir.plan.encode()).unwrap();
}

fn ov_check(dir: &Path, extra: &[&str]) -> Value {
    let out = Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/ov_check.py"))
        .arg(dir)
        .args(extra)
        .output()
        .expect("running tools/ov_check.py (set NPUC_PYTHON to a Python with openvino)");
    assert!(out.status.success(), "ov_check.py failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Rows `0..t` of the RoPE table `name` stored in the weights file.
fn rope_rows(ir: &codegen_intel::IntelIr, name: &str, t: usize) -> Vec<f32> {
    let rope = &ir.plan.rope;
    let width = rope.width;
    assert!(t <= rope.positions, "{rope:?}");
    let offset = rope.tables[name].offset as usize;
    ir.weights[offset..offset + t * width * 4].chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The reference evaluator on the IR's own program for `t` tokens at positions 0..t, every value
/// any segment reads or writes kept.
fn reference(ir: &codegen_intel::IntelIr, t: usize) -> HashMap<String, Tensor> {
    let mut g = ir.device_program.clone();
    let names: BTreeSet<String> = ir
        .plan
        .segments
        .iter()
        .flat_map(|s| s.inputs.iter().map(|i| i.name.clone()).chain(s.outputs.iter().map(|o| o.name.clone())))
        .collect();
    let by_name = g.value_by_name().into_iter().map(|(k, v)| (k.to_string(), v)).collect::<HashMap<_, _>>();
    for n in &names {
        if let Some(&v) = by_name.get(n) {
            if matches!(g.value(v).def, ir::ValueDef::Node { .. }) {
                g.outputs.push(v);
            }
        }
    }
    let mut inputs = HashMap::new();
    for &i in &g.inputs {
        let v = g.value(i);
        let dims = |name: &str| match name {
            "batch_size" | "batch" => Some(1),
            "past_sequence_length" => Some(0),
            _ => Some(t as i64),
        };
        let shape: Vec<usize> = v.shape.iter().map(|d| d.eval(&dims).unwrap() as usize).collect();
        let count: usize = shape.iter().product();
        let tensor = if v.name.contains("input_ids") {
            Tensor::from_i64(v.dtype, shape, (0..count as i64).map(|k| (k * 7 + 3) % 200).collect())
        } else if v.name.contains("position") {
            Tensor::from_i64(v.dtype, shape, (0..count as i64).collect())
        } else if v.dtype.is_float() {
            Tensor::from_f32(v.dtype, shape, vec![0.0; count])
        } else {
            Tensor::from_i64(v.dtype, shape, vec![1; count])
        };
        inputs.insert(v.name.clone(), tensor);
    }
    ir::run::run_graph(&g, &inputs).unwrap()
}

fn raw(t: &Tensor) -> (Vec<u8>, &'static str) {
    match t.dtype {
        DType::I64 => (t.as_i64().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(), "int64"),
        _ => (t.to_f32_vec().iter().flat_map(|v| v.to_le_bytes()).collect(), "float32"),
    }
}

/// Runs every segment of `ir` for token blocks 1 and 4 (the IR must have them) on OpenVINO CPU
/// and checks it against the reference evaluator on the same inputs.
fn check_segments_against_openvino(ir: &codegen_intel::IntelIr) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("intel");
    write_ir(&dir, ir);
    let cases_dir = tmp.path().join("cases");
    std::fs::create_dir_all(&cases_dir).unwrap();
    let mut cases = Vec::new();
    let mut file_id = 0;
    for t in [1usize, 4] {
        let reference = reference(ir, t);
        let ids = Tensor::from_i64(DType::I64, vec![1, t], (0..t as i64).map(|k| (k * 7 + 3) % 200).collect());
        for seg in &ir.plan.segments {
            let Some(file) = seg.files.get(&t) else { continue };
            // A last-row segment's network of block 1 reads the last row; of a verify block, every row.
            let last_row = seg.last_row_only && t == 1;
            let mut put = |name: &str, tensor: &Tensor, shape: &[usize]| -> Value {
                let (bytes, dtype) = raw(tensor);
                let mut bytes = bytes;
                let want: usize = shape.iter().product();
                let elem = if dtype == "int64" { 8 } else { 4 };
                if last_row {
                    bytes = bytes[bytes.len() - want * elem..].to_vec();
                }
                assert_eq!(bytes.len(), want * elem, "{name} in {file}");
                file_id += 1;
                let path = format!("{file_id}.raw");
                std::fs::write(cases_dir.join(&path), bytes).unwrap();
                json!({"path": path, "shape": shape, "dtype": dtype})
            };
            let mut inputs = serde_json::Map::new();
            for i in &seg.inputs {
                let name = i.name.as_str();
                let tensor = match i.role {
                    Role::Rope => {
                        let rows = rope_rows(ir, name, t);
                        Tensor::from_f32(DType::F32, vec![rows.len()], rows)
                    }
                    Role::Input => ids.clone(),
                    Role::Value => reference[name].clone(),
                };
                inputs.insert(name.to_string(), put(name, &tensor, &i.shape[&t]));
            }
            let mut outputs = serde_json::Map::new();
            for o in &seg.outputs {
                let name = o.name.as_str();
                outputs.insert(name.to_string(), put(name, &reference[name], &o.shape[&t]));
            }
            cases.push(json!({"file": file, "inputs": inputs, "outputs": outputs}));
        }
    }
    let segments = ir.plan.segments.len();
    assert!(segments >= 3, "a two-layer model cuts into at least 3 segments, got {segments}");
    std::fs::write(cases_dir.join("cases.json"), serde_json::to_vec(&cases).unwrap()).unwrap();
    let report = ov_check(&dir, &["--cases", cases_dir.to_str().unwrap()]);
    assert_eq!(report["loaded"].as_array().unwrap().len(), ir.xml.len(), "every .xml loads with read_model");
    let results = report["cases"].as_array().unwrap();
    assert!(results.len() >= 2 * segments, "{report}");
    for r in results {
        let (d, m) = (r["max_abs_diff"].as_f64().unwrap(), r["max_abs_ref"].as_f64().unwrap());
        // f32 on CPU against the f64-accumulating evaluator; the weights are the same values (the
        // f16 scales are exact), so what differs is f32 rounding and summation order.
        assert!(r["finite"].as_bool().unwrap() && d <= 1e-4 * m.max(1.0), "{r}");
    }
}

#[test]
fn intel_segments_load_in_openvino_and_match_the_reference_evaluator_per_block() {
    // The builder's default int4 (accuracy level 4): the IR and the program it is checked against
    // both take float activations into the 4-bit products (`symmetric::float_activations`).
    let g = program("llama-builder-int4");
    let options = codegen_intel::Options { blocks: vec![1, 4], ..Default::default() };
    check_segments_against_openvino(&codegen_intel::compile(&g, &options).unwrap());
}

fn const_views(xml: &str) -> Vec<(String, usize, usize, usize)> {
    // (element type, offset, size, bytes) of every Const layer.
    let mut out = Vec::new();
    for layer in xml.split("<layer ").skip(1) {
        if !layer.contains("type=\"Const\"") {
            continue;
        }
        let attr = |k: &str| {
            let key = format!(" {k}=\"");
            let s = layer
                .find(&key)
                .map(|i| &layer[i + key.len()..])
                .unwrap_or_else(|| panic!("Const without {k}: {layer}"));
            s[..s.find('"').unwrap()].to_string()
        };
        let (offset, size) = (attr("offset").parse().unwrap(), attr("size").parse().unwrap());
        out.push((attr("element_type"), offset, size, size));
    }
    out
}

#[test]
fn intel_ir_is_weightless_and_every_block_size_views_the_same_weights() {
    let (_, ir) = smollm2();
    let bin = ir.weights.len();
    let xml_bytes: usize = ir.xml.iter().map(|(_, t)| t.len()).sum();
    // 31 block-sized segments × (2 block sizes + 2 verify blocks) + the lm_head's last row and its
    // 2 verify blocks over every row. A network's XML does not grow with its block size, so the
    // verify blocks double it (SmolLM2: 5.2 MB more beside 78 MB of weights); every block's XML
    // is a few percent of the weights.
    assert_eq!(ir.plan.verify_blocks, [2, 4]);
    assert_eq!(ir.xml.len(), 31 * 4 + 3);
    assert!(xml_bytes * 5 < bin, "{xml_bytes} bytes of XML against {bin} of weights");
    let mut weights_by_block: HashMap<String, BTreeSet<(usize, usize)>> = HashMap::new();
    for (name, text) in &ir.xml {
        assert!(!text.contains("<blob") && !text.contains("value=\""), "{name} carries data inline");
        for (et, offset, size, _) in const_views(text) {
            assert!(offset + size <= bin, "{name}: Const {et} at {offset}+{size} beyond the {bin}-byte weights file");
            if size >= 4096 {
                let segment = name.rsplit_once("_t").unwrap().0.to_string();
                weights_by_block.entry(format!("{segment}/{name}")).or_default().insert((offset, size));
            }
        }
    }
    // Every segment's networks (t1, t64 and the verify blocks' t2 and t4) view the same weight
    // ranges: the verify networks add no weight bytes.
    let mut per_segment: HashMap<String, Vec<BTreeSet<(usize, usize)>>> = HashMap::new();
    for (k, v) in weights_by_block {
        per_segment.entry(k.split('/').next().unwrap().to_string()).or_default().push(v);
    }
    for (segment, sets) in &per_segment {
        assert!(sets.iter().all(|s| s == &sets[0] && !s.is_empty()), "{segment}: block sizes view different weights");
    }
    // The tied embedding and lm_head share one int8 copy: the weights file holds about the
    // model's 4-bit layers plus one int8 embedding, not two.
    let big: usize = per_segment.values().flat_map(|s| s[0].iter()).collect::<BTreeSet<_>>().iter().map(|r| r.1).sum();
    assert!(big <= bin, "{big} > {bin}");
}

#[test]
fn intel_asymmetric_weights_are_requantised_with_the_error_reported_or_rejected() {
    // The builder's asymmetric int4 (block 128, zero points; it writes the embedding in float).
    let g = program("llama-builder-int4-b128-asym");
    let err =
        codegen_intel::compile(&g, &codegen_intel::Options { asymmetric: Asymmetric::Reject, ..Default::default() })
            .err()
            .expect("the asymmetric graph has zero points");
    assert!(err.to_string().contains("asymmetric zero points") && err.to_string().contains("weight_Q4"), "{err}");
    let ir = codegen_intel::compile(&g, &codegen_intel::Options::default()).unwrap();
    let requantized: Vec<_> = ir.requantized.iter().filter(|r| r.requantized).collect();
    assert_eq!(requantized.len(), 2 * 5 + 1, "q|k|v, o, gate, up, down of 2 layers and the lm_head");
    for r in &requantized {
        // Each group's scale is chosen between max|w|/7 and 0.725·max|w|/7 for the least squared
        // error: a weight moves by at most what clipping to 0.725·max|w| costs.
        assert!(r.max_rel > 0.0 && r.max_rel <= 0.28, "{r:?}");
        assert!(r.mean_rel > 0.0 && r.mean_rel < 0.15, "{r:?}");
    }
    let average = requantized.iter().map(|r| r.mean_rel).sum::<f64>() / requantized.len() as f64;
    assert!(average < 0.09, "mean relative error {average}");
    // No zero points remain in the program the IR and the host run.
    for n in ir.device_program.nodes.iter().chain(&ir.host_program.nodes).filter(|n| n.op.starts_with("WGemm")) {
        assert!(n.inputs.get(3).copied().flatten().is_none(), "{} keeps zero points", n.name);
    }
}

/// The bytes of the float weights a program holds.
fn float_weight_bytes(g: &ir::Graph) -> usize {
    g.weights.iter().filter(|(_, w)| w.dtype.is_float()).map(|(_, w)| w.bytes.len()).sum()
}

/// The projections of `ir`'s program: every MatMul by a weight became a WGemm.
fn assert_no_float_projections(ir: &codegen_intel::IntelIr) {
    for g in [&ir.device_program, &ir.host_program] {
        let ct = g.compile_time_nodes();
        for (n, &ct) in g.nodes.iter().zip(&ct) {
            if n.op == "MatMul" && !ct {
                let b = n.inputs[1].unwrap();
                let weight_b = match g.value(b).def {
                    ir::ValueDef::Weight(_) | ir::ValueDef::Const(_) => true,
                    ir::ValueDef::Node { node, .. } => g.compile_time_nodes()[node.0 as usize],
                    ir::ValueDef::Input => false,
                };
                assert!(!weight_b, "{} still multiplies by a float weight", n.name);
            }
        }
    }
}

#[test]
fn intel_float_smollm2_is_stored_as_int4_and_every_segment_matches_openvino() {
    let g = program("smollm2-optimum");
    let f32_bytes = float_weight_bytes(&g);
    let options = codegen_intel::Options { blocks: vec![1, 4], ..Default::default() };
    let ir = codegen_intel::compile(&g, &options).unwrap();
    // int4 projections (q, k, v, o, gate, up, down of 30 layers and the tied lm_head) and an int8
    // embedding: under a fifth of the f32 model.
    let bin = ir.weights.len();
    assert!(bin * 5 < f32_bytes, "{bin} bytes of weights against {f32_bytes} bytes of f32 weights");
    assert_no_float_projections(&ir);
    let compressed: Vec<_> = ir.requantized.iter().filter(|e| e.from_float.is_some()).collect();
    assert_eq!(compressed.len(), 30 * 7 + 2);
    let embedding: Vec<_> = compressed.iter().filter(|e| e.from_float == Some(FloatWeights::Int8)).collect();
    assert!(embedding.len() == 1 && embedding[0].weight.contains("embed_tokens"), "{embedding:?}");
    // int8 in blocks of 64 along the row (no block of this table is clipped): half a step of
    // max|w|/127 at most.
    assert!(embedding[0].max_rel <= 0.5 / 127.0 + 1e-6 && embedding[0].mean_rel < 0.01, "{embedding:?}");
    for e in compressed.iter().filter(|e| e.from_float != Some(FloatWeights::Int8)) {
        assert_eq!(e.from_float, Some(FloatWeights::Int4));
        // The scale is chosen between max|w|/7 and 0.725·max|w|/7 per group: clipping the largest
        // weight costs at most 27.5% of it, rounding the others at most half a step.
        assert!(e.max_rel > 0.0 && e.max_rel <= 0.28 && e.mean_rel < 0.2, "{e:?}");
    }
    // K = 576 is not a multiple of 128 (one group per channel); K = 1536 is (groups of 128).
    let blocks: BTreeSet<i64> = ir
        .device_program
        .nodes
        .iter()
        .filter(|n| n.op == "WGemm")
        .map(|n| n.attrs.int("block_size").unwrap().unwrap())
        .collect();
    assert_eq!(blocks, BTreeSet::from([128, 576]));
    check_segments_against_openvino(&ir);
}

#[test]
fn intel_float_weights_int8_and_f16_are_as_accurate_as_their_format_and_match_openvino() {
    let g = program("llama-optimum");
    // The embedding table: the weight the id Gather reads (its tied lm_head reads a transposed
    // copy, a projection like the others).
    let gather = g.nodes.iter().find(|n| n.op == "Gather").expect("the embedding Gather");
    let table = g.value(gather.inputs[0].unwrap()).name.clone();
    let mut sizes = Vec::new();
    for format in [FloatWeights::Int4, FloatWeights::Int8, FloatWeights::F16] {
        let options = codegen_intel::Options { blocks: vec![1, 4], weights: format, ..Default::default() };
        let ir = codegen_intel::compile(&g, &options).unwrap();
        let compressed: Vec<_> = ir.requantized.iter().filter(|e| e.from_float.is_some()).collect();
        assert!(!compressed.is_empty());
        for e in &compressed {
            // The integer formats store the embedding as int8.
            let embedding = e.weight == table;
            let want = if embedding && format == FloatWeights::Int4 { FloatWeights::Int8 } else { format };
            assert_eq!(e.from_float, Some(want), "{e:?}");
            match want {
                // Half a step of max|w|/127 at most (int8 does not clip enough to matter here).
                FloatWeights::Int8 => assert!(e.max_rel <= 0.28 && e.mean_rel < 0.01, "{e:?}"),
                // f16 rounding: at most 2^-11 relative to each value.
                FloatWeights::F16 => assert!(e.max_rel <= 1.0 / 2048.0 && e.mean_rel < 1e-3, "{e:?}"),
                FloatWeights::Int4 => assert!(e.max_rel <= 0.28 && e.mean_rel < 0.2, "{e:?}"),
            }
        }
        if format == FloatWeights::F16 {
            // f16 keeps the MatMuls, over f16 constants the IR converts to f32.
            assert!(ir.xml.iter().any(|(_, x)| x.contains("element_type=\"f16\"")));
            assert!(ir.device_program.nodes.iter().all(|n| n.op != "WGemm"));
        } else {
            assert_no_float_projections(&ir);
        }
        sizes.push(ir.weights.len());
        if format != FloatWeights::Int4 {
            check_segments_against_openvino(&ir);
        }
    }
    assert!(sizes[0] < sizes[1] && sizes[1] < sizes[2], "weights bytes int4, int8, f16: {sizes:?}");
}

/// The builder's asymmetric int4 Qwen3 (block 128, zero points) with its float embedding replaced
/// by a GatherBlockQuantized over the lm_head's 4-bit codes, scales and zero points — tied
/// (`tied`: the codes through a Reshape to [N, K/2], as the builder spells a tied embedding) or
/// copies of its own. The builder writes a quantised embedding only for symmetric weights: with
/// zero points it keeps the embedding float, and the tied asymmetric graph it can write is refused
/// by ONNX Runtime, so this input is made here from its real file.
fn quantised_embedding(tied: bool) -> ir::Graph {
    let mut g = program("qwen3-builder-int4-b128-asym");
    let ids = g.inputs[0];
    let gather = g.nodes.iter().position(|n| n.op == "Gather" && n.inputs[1] == Some(ids)).expect("the embedding");
    let head = g.nodes.iter().rev().find(|n| n.op.starts_with("WGemm")).expect("the lm_head").clone();
    let (codes, scales, zero_points) = (head.inputs[1].unwrap(), head.inputs[2].unwrap(), head.inputs[3].unwrap());
    let dims =
        |v: ir::ValueId| -> Vec<usize> { g.value(v).shape.iter().map(|d| d.as_known().unwrap() as usize).collect() };
    let (n, blocks, half) = (dims(codes)[0], dims(codes)[1], dims(codes)[2]);
    let flat = vec![ir::Dim::known(n as i64), ir::Dim::known((blocks * half) as i64)];
    let data = if tied {
        let shape = push_value(
            &mut g,
            "embed.shape",
            ir::DType::I64,
            vec![ir::Dim::known(2)],
            ir::ValueDef::Const(Tensor::from_i64(DType::I64, vec![2], vec![n as i64, (blocks * half) as i64])),
        );
        insert_node(&mut g, gather, "embed.reshape", ir::Domain::Onnx, "Reshape", &[codes, shape], flat)
    } else {
        let mut store = (*g.weights).clone();
        let mut own = |g: &mut ir::Graph, v: ir::ValueId, shape: Vec<ir::Dim>| {
            let ir::ValueDef::Weight(w) = g.value(v).def else { panic!("{} is not a weight", g.value(v).name) };
            let w = g.weights.get(w);
            let known = shape.iter().map(|d| d.as_known().unwrap() as usize).collect();
            let id = store.add(ir::Weight::new(format!("embed_own.{}", w.name), w.dtype, known, w.bytes.clone()));
            push_value(g, &format!("embed_own.{}", w.name), w.dtype, shape, ir::ValueDef::Weight(id))
        };
        let (scales_shape, zp_shape) = (g.value(scales).shape.clone(), g.value(zero_points).shape.clone());
        let copies = [own(&mut g, codes, flat), own(&mut g, scales, scales_shape), own(&mut g, zero_points, zp_shape)];
        g.weights = std::sync::Arc::new(store);
        return gather_block_quantized(g, gather, copies, half);
    };
    gather_block_quantized(g, gather + 1, [data, scales, zero_points], half)
}

/// `g` with node `at` (the float Gather) turned into a com.microsoft GatherBlockQuantized of the
/// ids over `[data, scales, zero_points]`, 4-bit blocks of `2·half` along axis 1.
fn gather_block_quantized(mut g: ir::Graph, at: usize, [data, scales, zp]: [ir::ValueId; 3], half: usize) -> ir::Graph {
    let node = &mut g.nodes[at];
    let ids = node.inputs[1];
    node.domain = ir::Domain::Microsoft;
    node.op = "GatherBlockQuantized";
    node.opset = 1;
    node.inputs = vec![Some(data), ids, Some(scales), Some(zp)];
    for (k, v) in [("bits", 4), ("block_size", 2 * half as i64), ("gather_axis", 0), ("quantize_axis", 1)] {
        node.attrs.set(k, ir::Attr::Int(v));
    }
    g.pruned()
}

/// Appends a value.
fn push_value(g: &mut ir::Graph, name: &str, dtype: DType, shape: Vec<ir::Dim>, def: ir::ValueDef) -> ir::ValueId {
    g.values.push(ir::Value { name: name.to_string(), dtype, shape, def });
    ir::ValueId(g.values.len() as u32 - 1)
}

/// Inserts a one-output node before node `at` (renumbering the nodes after it); returns its output.
fn insert_node(
    g: &mut ir::Graph,
    at: usize,
    name: &str,
    domain: ir::Domain,
    op: &'static str,
    inputs: &[ir::ValueId],
    shape: Vec<ir::Dim>,
) -> ir::ValueId {
    for v in &mut g.values {
        if let ir::ValueDef::Node { node, .. } = &mut v.def {
            if node.0 as usize >= at {
                node.0 += 1;
            }
        }
    }
    let dtype = g.value(inputs[0]).dtype;
    let def = ir::ValueDef::Node { node: ir::NodeId(at as u32), output: 0 };
    let out = push_value(g, &format!("{name}.out"), dtype, shape, def);
    let node = ir::Node {
        name: name.to_string(),
        domain,
        op,
        opset: 21,
        attrs: Default::default(),
        inputs: inputs.iter().map(|&v| Some(v)).collect(),
        outputs: vec![out],
    };
    g.nodes.insert(at, node);
    out
}

#[test]
fn intel_qwen3_tied_embedding_with_zero_points_reads_the_requantised_lm_head_and_matches_openvino() {
    let g = quantised_embedding(true);
    let err =
        codegen_intel::compile(&g, &codegen_intel::Options { asymmetric: Asymmetric::Reject, ..Default::default() })
            .err()
            .expect("the graph has asymmetric weights");
    assert!(err.to_string().contains("asymmetric zero points"), "{err}");
    let options = codegen_intel::Options { blocks: vec![1, 4], ..Default::default() };
    let ir = codegen_intel::compile(&g, &options).unwrap();
    // q, k, v, o, gate, up, down of 2 layers and the lm_head, whose codes the embedding shares.
    assert_eq!(ir.requantized.iter().filter(|e| e.requantized).count(), 2 * 7 + 1);
    for p in [&ir.device_program, &ir.host_program] {
        let embed = p.nodes.iter().find(|n| n.op == "GatherBlockQuantized").expect("a quantised embedding");
        let head = p.nodes.iter().rev().find(|n| n.op.starts_with("WGemm")).unwrap();
        assert!(embed.inputs.get(3).copied().flatten().is_none(), "the embedding keeps zero points");
        assert_eq!(embed.inputs[2], head.inputs[2], "the embedding and the lm_head read different scales");
        let codes = match p.value(embed.inputs[0].unwrap()).def {
            ir::ValueDef::Node { node, .. } => p.node(node).inputs[0],
            _ => embed.inputs[0],
        };
        assert_eq!(codes, head.inputs[1], "the embedding and the lm_head read different codes");
        assert!(p.value(codes.unwrap()).name.ends_with(".sym"));
    }
    check_segments_against_openvino(&ir);
}

#[test]
fn intel_interleaved_rope_matches_the_reference_evaluator_in_openvino() {
    // llama-builder-int4-acc1 with every Rope made interleaved: the reference evaluator rotates
    // pairs (2i, 2i+1), so the IR only matches if it does too.
    let mut g = program("llama-builder-int4-acc1");
    let mut ropes = 0;
    for n in g.nodes.iter_mut().filter(|n| n.op == "Rope") {
        n.attrs.set("interleaved", ir::Attr::Int(1));
        ropes += 1;
    }
    assert!(ropes >= 2, "{ropes} Rope nodes");
    let options = codegen_intel::Options { blocks: vec![1, 4], ..Default::default() };
    check_segments_against_openvino(&codegen_intel::compile(&g, &options).unwrap());
}

#[test]
fn intel_an_embedding_of_its_own_with_zero_points_is_requantised_like_a_gemm() {
    // Its own copies of the lm_head's codes ([rows, K/2]), scales and zero points. Re-quantised
    // on its own, it must come out exactly as the lm_head's symmetric weights do.
    let g = quantised_embedding(false);
    let options = codegen_intel::Options { blocks: vec![1, 4], ..Default::default() };
    let ir = codegen_intel::compile(&g.pruned(), &options).unwrap();
    let requantized: Vec<_> = ir.requantized.iter().filter(|e| e.requantized).collect();
    assert_eq!(requantized.len(), 2 * 7 + 2, "the layers, the lm_head and the embedding");
    let own = requantized.iter().find(|e| e.weight.starts_with("embed_own.")).expect("the embedding is reported");
    let head = requantized.iter().find(|e| e.weight == own.weight["embed_own.".len()..]).unwrap();
    assert_eq!((own.max_rel, own.mean_rel), (head.max_rel, head.mean_rel));
    let p = &ir.host_program;
    let e = p.nodes.iter().find(|n| n.op == "GatherBlockQuantized").unwrap();
    let h = p.nodes.iter().rev().find(|n| n.op.starts_with("WGemm")).unwrap();
    assert!(e.inputs.get(3).copied().flatten().is_none());
    let bytes = |v: Option<ir::ValueId>| match p.value(v.unwrap()).def {
        ir::ValueDef::Weight(w) => p.weights.get(w).bytes.clone(),
        _ => panic!("not a weight"),
    };
    assert_ne!(e.inputs[0], h.inputs[1]);
    assert_eq!(bytes(e.inputs[0]), bytes(h.inputs[1]), "the same codes");
    assert_eq!(bytes(e.inputs[2]), bytes(h.inputs[2]), "the same scales");
    check_segments_against_openvino(&ir);
}
