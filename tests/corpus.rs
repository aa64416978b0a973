//! The exporter corpus: tiny Llama and Qwen3 models exported by the real tools (optimum-onnx,
//! the onnxruntime-genai builder in fp32 and int4, onnxruntime's quantize_static, AMD Quark), and
//! SmolLM2-135M through optimum and the builder's int4, into `fixtures/corpus` by
//! `tools/export_corpus.py`, each with ONNX Runtime's prefill/decode cases and 16 greedy ids per
//! prompt (one prompt for the tiny models, three for SmolLM2). For every model: it imports; the cpu pipeline fuses one Attention per
//! layer; the final program's prefill logits (reference evaluator) are within the form's
//! tolerance of ONNX Runtime's; `npuc compile` and `npuc run --prompt-ids` give ONNX Runtime's 16
//! greedy ids, or the same ids up to a step where ONNX Runtime's own top-2 gap is a near tie
//! (below 1% of max|logit|), and `--speculate lookup` gives the plain run's ids for the first
//! prompt; the xdna and intel-npu targets compile, and the intel-npu bundle's
//! IR on OpenVINO's CPU device gives the host executor's greedy ids for the same bundle. The table of every cell is written to
//! `fixtures/corpus/table.md` (make test prints it).
//!
//! Tolerances on the prefill logits, as a fraction of ONNX Runtime's largest logit: 1e-4 for
//! float graphs, 1e-3 for int4 graphs at `accuracy_level` 1 (float activations), 0.1 for the
//! builder's default int4 graphs (level 4) and for QDQ graphs, whose greedy ids are reported, not
//! required:
//! - level 4 quantises each activation block to int8 before the product. npuc computes exactly
//!   that (`accuracy_level_4_products_match_onnx_runtime_node_by_node`: every such node of the
//!   corpus to f32 rounding), but in a whole model an activation that an earlier op's f32
//!   rounding moves across a rounding boundary changes its code by one step, about 1e-3 of that
//!   product, and later layers compound it: tiny graphs agree to 4e-7 or part at a near tie;
//!   SmolLM2's layers 0-1 agree to 3e-7 and its logits end 6e-2 apart;
//! - QDQ: npuc drops the Q/DQ pairs inside the attention (see `rewrites::attention`): the logits
//!   and greedy ids against ONNX Runtime on the file say what the dropped pairs cost. The
//!   contract for QDQ graphs is ONNX Runtime on the same file with those pairs bypassed
//!   (`tools/corpus/qdq_bypass.py` finds them from the graph's structure: q and kᵀ into the scores
//!   product, the scores, the probabilities and v; five per layer in every QDQ entry): the prefill
//!   logits within 1e-5 of max|logit|, its greedy ids up to a near tie. The pairs npuc keeps are
//!   its QGemms' inputs and requantising epilogues, exact in integers, and pairs it computes as
//!   ONNX does; measured, the logits agree exactly on every entry.
mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Entry {
    name: String,
    exporter: String,
    dir: PathBuf,
    layers: usize,
    cases: Vec<GreedyCase>,
    /// QDQ entries: ONNX Runtime's greedy continuations on the file with its attention-internal
    /// Q/DQ pairs bypassed (what npuc's fused float Attention computes), and how many pairs per
    /// layer the exporter tool bypassed.
    bypassed: Vec<GreedyCase>,
    pairs_per_layer: Option<u64>,
    /// What the exporter tool found about the file itself (an exporter that disagrees with the
    /// others on the same weights).
    note: Option<String>,
    /// Why the exporter made no file.
    refused: Option<String>,
}

/// Exporters known to refuse an architecture, by entry name prefix and a fragment of the reason:
/// onnxruntime-genai's builder 0.18 reads `rope_parameters["rope_type"]`, which transformers 5
/// keys by layer type for Gemma 3 (local and global RoPE). Any other refusal fails the test.
const KNOWN_REFUSALS: [(&str, &str); 1] = [("gemma3-builder", "rope_type")];

/// One prompt and ONNX Runtime's greedy continuation of it.
struct GreedyCase {
    prompt: Vec<u64>,
    greedy: Vec<u64>,
    /// ONNX Runtime's top-1/top-2 logit gap at each greedy step, as a fraction of max|logit|.
    margins: Vec<f64>,
}

/// A greedy step whose top-1/top-2 gap is below this fraction of max|logit| is a near tie: f32
/// rounding (or one int8 activation code that rounding moves, at `accuracy_level` 4) decides it,
/// so the ids may part there and only there.
const NEAR_TIE: f64 = 0.01;

/// QDQ graphs against ONNX Runtime on the same file with the attention-internal Q/DQ pairs
/// bypassed, as a fraction of max|logit|: every other pair is npuc's QGemm and its requantising
/// epilogue, exact in integers, so the two differ by f32 rounding only.
const BYPASSED_TOLERANCE: f64 = 1e-5;

/// One row of the table: a cell per stage, and whether the row fails.
struct Row {
    cells: Vec<String>,
    failures: Vec<String>,
}

fn entries() -> Vec<Entry> {
    let dir = common::fixtures_dir().join("corpus");
    let text = std::fs::read_to_string(dir.join("index.json"))
        .unwrap_or_else(|e| panic!("{}/index.json: {e}: run `make corpus` (or `make test`)", dir.display()));
    let index: Value = serde_json::from_str(&text).unwrap();
    index["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let refused = e["refused"].as_str().map(str::to_string);
            Entry {
                name: e["name"].as_str().unwrap().to_string(),
                exporter: e["exporter"].as_str().unwrap().to_string(),
                dir: dir.join(e["name"].as_str().unwrap()),
                layers: e["layers"].as_u64().unwrap_or(0) as usize,
                cases: greedy_cases(&e["cases"]),
                bypassed: greedy_cases(&e["cases_bypassed"]),
                pairs_per_layer: e["attention_qdq_bypassed"]["pairs_per_layer"].as_u64(),
                note: e["note"].as_str().map(str::to_string),
                refused,
            }
        })
        .collect()
}

/// An index entry's list of greedy cases (none when absent).
fn greedy_cases(cases: &Value) -> Vec<GreedyCase> {
    let ids = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect::<Vec<_>>();
    let cases = cases.as_array().map_or(&[][..], Vec::as_slice);
    cases
        .iter()
        .map(|c| GreedyCase {
            prompt: ids(&c["prompt_ids"]),
            greedy: ids(&c["greedy_ids"]),
            margins: c["greedy_margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect(),
        })
        .collect()
}

/// QDQ graphs: onnxruntime's `quantize_static` and AMD Quark's A8W8 (both int8 activations per
/// tensor, int8 weights per channel or per tensor, in ai.onnx Q/DQ).
fn is_qdq(e: &Entry) -> bool {
    e.exporter.starts_with("qdq") || e.exporter.starts_with("quark")
}

/// The builder's int4 graphs at its default `accuracy_level` 4: int8 activations per block.
fn is_level4(e: &Entry) -> bool {
    e.exporter.starts_with("builder-int4") && !e.exporter.ends_with("acc1")
}

/// Whether the greedy ids must be ONNX Runtime's (up to a near tie), or are only reported.
fn greedy_required(e: &Entry) -> bool {
    !is_qdq(e) && !is_level4(e)
}

fn npuc(args: &[&str]) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_npuc")).args(args).output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(err.lines().rev().find(|l| l.starts_with("error")).unwrap_or("failed").to_string())
    }
}

/// Import, the cpu pipeline, the fused-op counts and the prefill logits' error.
fn program_cells(e: &Entry, row: &mut Row) {
    let model = e.dir.join("model.onnx");
    let imported = match frontend::import_file(&model) {
        Ok(i) => i,
        Err(err) => {
            row.failures.push(format!("import: {err}"));
            row.cells.extend(["import fails".into(), "-".into(), "-".into(), "-".into()]);
            return;
        }
    };
    row.cells.push(format!("{} nodes", imported.graph.nodes.len()));
    let dead_nodes = imported.report.dead_nodes;
    let pipeline = passes::targets::target("cpu").unwrap().pipeline();
    let graph = match passes::driver::run(&pipeline, imported.graph, None, |_, _| {}) {
        Ok(o) => o.graph,
        Err(err) => {
            row.failures.push(format!("cpu pipeline: {err}"));
            row.cells.extend(["pipeline fails".into(), "-".into(), "-".into()]);
            return;
        }
    };
    let census = graph.op_census();
    let count = |op: &str| census.iter().filter(|(o, _)| o.ends_with(op)).map(|(_, n)| n).sum::<usize>();
    let attention = count("npuc::Attention");
    let mut windows: Vec<i64> = graph
        .nodes
        .iter()
        .filter(|n| n.domain == ir::Domain::Npuc && n.op == "Attention")
        .filter_map(|n| n.attrs.int("window").ok().flatten())
        .collect();
    windows.dedup();
    let windows = if windows.is_empty() { String::new() } else { format!(" (window {windows:?})") };
    let (swiglu, gelu) = (count("npuc::SwiGlu"), count("npuc::GeluGate"));
    let gates = match (swiglu, gelu) {
        (s, 0) => format!("{s} SwiGlu"),
        (0, g) => format!("{g} GeluGate"),
        (s, g) => format!("{s} SwiGlu, {g} GeluGate"),
    };
    row.cells.push(format!(
        "{attention} Attention{windows}, {} norms, {gates}",
        count("npuc::RmsNorm") + count("npuc::SkipRmsNorm")
    ));
    if attention != e.layers {
        row.failures.push(format!("{attention} fused Attention for {} layers", e.layers));
    }
    // The builder's Phi-3 graph leaves 9 nodes dead, one layer's gated MLP among them (the
    // index notes ONNX Runtime's greedy on it parting from optimum's on the same weights).
    let dead_mlp = e.name.starts_with("phi3-builder") && dead_nodes > 0;
    if swiglu + gelu != e.layers && !dead_mlp {
        row.failures.push(format!("{} fused gates for {} layers", swiglu + gelu, e.layers));
    }
    prefill_cells(e, &graph, row);
}

/// The program's prefill logits (reference evaluator) against ONNX Runtime's on the file, within
/// the form's tolerance; for QDQ graphs also against ONNX Runtime on the file with the attention
/// Q/DQ pairs bypassed, to f32 rounding.
fn prefill_cells(e: &Entry, graph: &ir::Graph, row: &mut Row) {
    let tolerance = if is_qdq(e) || is_level4(e) {
        0.1
    } else if e.exporter.contains("int4") {
        1e-3
    } else {
        1e-4
    };
    logits_cell(graph, &e.dir.join("prefill"), tolerance, row);
    if !is_qdq(e) {
        row.cells.push("-".into());
        return;
    }
    let Some(pairs) = e.pairs_per_layer else {
        row.failures.push("no references with the attention Q/DQ pairs bypassed: remake the corpus".into());
        row.cells.push("no reference".into());
        return;
    };
    logits_cell(graph, &e.dir.join("prefill_bypassed"), BYPASSED_TOLERANCE, row);
    let cell = row.cells.last_mut().unwrap();
    *cell = format!("{cell} ({pairs} pairs/layer)");
}

/// One prefill case's logits: the cell is their difference as a fraction of max|logit|.
fn logits_cell(graph: &ir::Graph, case: &Path, tolerance: f64, row: &mut Row) {
    let (inputs, expected) = frontend::read_test_case(case).unwrap();
    let got = match ir::run::run_graph(graph, &inputs) {
        Ok(g) => g,
        Err(err) => {
            row.failures.push(format!("evaluating the program: {err}"));
            row.cells.push("evaluation fails".into());
            return;
        }
    };
    let want = &expected.iter().find(|(n, _)| n == "logits").expect("a logits output").1;
    let (diff, scale) = common::max_abs_diff(&got["logits"], want);
    let rel = diff / scale;
    row.cells.push(if rel == 0.0 { "0".into() } else { format!("{rel:.1e}") });
    if rel.is_nan() || rel > tolerance {
        let case = case.file_name().unwrap().to_string_lossy();
        row.failures.push(format!("{case} logits differ by {rel:.2e} of max|logit| (allowed {tolerance:.0e})"));
    }
}

/// `npuc compile` for cpu, then `npuc run --prompt-ids` of every prompt against ONNX Runtime's
/// greedy ids on the file and, for QDQ graphs, on the file with the attention Q/DQ pairs bypassed
/// (required up to a near tie).
fn greedy_cells(e: &Entry, work: &Path, row: &mut Row) {
    let bundle = work.join(format!("{}.npub", e.name));
    let model = e.dir.join("model.onnx");
    let compiled = npuc(&["compile", model.to_str().unwrap(), "--target", "cpu", "-o", bundle.to_str().unwrap()]);
    if let Err(err) = compiled {
        row.failures.push(format!("compile cpu: {err}"));
        row.cells.extend(["compile fails".into(), "-".into()]);
        return;
    }
    stored_once(&bundle, row);
    let runs: Vec<Option<Vec<u64>>> = e.cases.iter().map(|c| greedy_run(&bundle, c, row, &[])).collect();
    if let (Some(plain), Some(c)) = (&runs[0], e.cases.first()) {
        let speculative = greedy_run(&bundle, c, row, &["--speculate", "lookup", "--draft-len", "4"]);
        if speculative.as_ref().is_some_and(|t| t != plain) {
            row.failures.push(format!("--speculate lookup gave {speculative:?}, plain greedy {plain:?}"));
        }
    }
    let compare = |cases: &[GreedyCase], required: bool, row: &mut Row| {
        let results: Vec<String> = cases.iter().zip(&runs).map(|(c, t)| greedy_case(t, c, required, row)).collect();
        results.join("; ")
    };
    let cell = compare(&e.cases, greedy_required(e), row);
    row.cells.push(cell);
    let bypassed =
        if !is_qdq(e) || e.bypassed.len() != e.cases.len() { "-".into() } else { compare(&e.bypassed, true, row) };
    row.cells.push(bypassed);
}

/// A float MatMul weight stored as GEMM panels is not stored as it is too: a tied embedding (the
/// builder's `Gather(Transpose(lm_head))`) is gathered from the lm_head's panels in place.
fn stored_once(bundle: &Path, row: &mut Row) {
    let b = runtime::bundle::Bundle::open(bundle, Some("cpu")).unwrap();
    let names: Vec<&str> = b.tensors().map(|t| t.name).collect();
    for name in &names {
        if names.contains(&runtime::exec::packed::gemm_panels_name(name).as_str()) {
            row.failures.push(format!("`{name}` is stored both as it is and as GEMM panels"));
        }
    }
}

/// `npuc run --prompt-ids` of one prompt (with `extra` options): the greedy ids, None when the
/// run fails.
fn greedy_run(bundle: &Path, c: &GreedyCase, row: &mut Row, extra: &[&str]) -> Option<Vec<u64>> {
    let ids: Vec<String> = c.prompt.iter().map(u64::to_string).collect();
    let steps = c.greedy.len().to_string();
    let args = [
        "run",
        bundle.to_str().unwrap(),
        "--prompt-ids",
        &ids.join(","),
        "--max-tokens",
        &steps,
        "--ignore-eos",
        "--json",
        // Two threads: a prompt's attention is split over the KV heads.
        "--threads",
        "2",
    ];
    match npuc(&[&args[..], extra].concat()) {
        Ok(out) => {
            let json: Value = serde_json::from_str(&out).unwrap();
            Some(json["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect())
        }
        Err(err) => {
            row.failures.push(format!("run: {err}"));
            None
        }
    }
}

/// One prompt's greedy ids against ONNX Runtime's: "k/n ids", and where they part. When
/// `required`, they may part only at a near tie.
fn greedy_case(tokens: &Option<Vec<u64>>, c: &GreedyCase, required: bool, row: &mut Row) -> String {
    let Some(tokens) = tokens else {
        return "run fails".into();
    };
    let same = tokens.iter().zip(&c.greedy).take_while(|(a, b)| a == b).count();
    if same == c.greedy.len() {
        return format!("{same}/{same} ids");
    }
    let gap = c.margins[same];
    if gap >= NEAR_TIE && required {
        row.failures.push(format!("greedy ids {tokens:?}, ONNX Runtime {:?} (no near tie where they part)", c.greedy));
    }
    format!("{same}/{} ids, then a gap of {:.1}% at step {}", c.greedy.len(), gap * 100.0, same + 1)
}

/// `npuc compile --target T` succeeds; the bundle's path.
fn target_cell(e: &Entry, work: &Path, target: &str, row: &mut Row) -> Option<PathBuf> {
    let bundle = work.join(format!("{}.{target}.npub", e.name));
    let model = e.dir.join("model.onnx");
    match npuc(&["compile", model.to_str().unwrap(), "--target", target, "-o", bundle.to_str().unwrap()]) {
        Ok(_) => {
            row.cells.push("compiles".into());
            Some(bundle)
        }
        Err(err) => {
            row.failures.push(format!("compile {target}: {err}"));
            row.cells.push("fails".into());
            None
        }
    }
}

/// The greedy ids of `bundle` for the first prompt on a backend.
fn greedy_on(bundle: &Path, e: &Entry, backend: &str) -> Result<Vec<u64>, String> {
    let c = &e.cases[0];
    let ids = c.prompt.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let steps = c.greedy.len().to_string();
    let bundle = bundle.to_str().unwrap();
    let args =
        ["run", bundle, "--prompt-ids", &ids, "--max-tokens", &steps, "--ignore-eos", "--json", "--backend", backend];
    let json: Value = serde_json::from_str(&npuc(&args)?).unwrap();
    Ok(json["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect())
}

/// The intel-npu bundle's IR on OpenVINO's CPU device gives the host executor's greedy ids for
/// the same bundle (the same weights: float models' weights compressed to int4 on both sides).
fn openvino_cell(e: &Entry, bundle: Option<PathBuf>, row: &mut Row) {
    let Some(bundle) = bundle else {
        row.cells.push("-".into());
        return;
    };
    match (greedy_on(&bundle, e, "host"), greedy_on(&bundle, e, "openvino")) {
        (Ok(host), Ok(ov)) => {
            let same = host.iter().zip(&ov).take_while(|(a, b)| a == b).count();
            row.cells.push(format!("{same}/{} ids", host.len()));
            // QDQ activations are FakeQuantize on OpenVINO: a value within f32 rounding of a
            // rounding tie can take the other code there (see tests/intel_openvino.rs).
            if same != host.len() && !is_qdq(e) {
                row.failures.push(format!("OpenVINO greedy ids {ov:?}, the host's {host:?}"));
            }
        }
        (Err(err), _) | (_, Err(err)) => {
            row.failures.push(format!("intel-npu run: {err}"));
            row.cells.push("run fails".into());
        }
    }
}

fn write_table(rows: &[(String, Row)]) -> String {
    let mut t = String::from(
        "| model | import | fused (cpu) | prefill logits vs ORT | vs ORT, attention Q/DQ bypassed | greedy vs ORT (host) | vs ORT, attention Q/DQ bypassed | xdna | intel-npu | intel-npu: OpenVINO CPU vs host |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (name, row) in rows {
        t += &format!("| {name} | {} |\n", row.cells.join(" | "));
    }
    t
}

/// A one-node MatMulNBits case of the corpus: its folder, and the node's attributes.
fn matmulnbits_cases() -> Vec<(PathBuf, Value)> {
    let dir = common::fixtures_dir().join("corpus");
    let index: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("index.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    for e in index["entries"].as_array().unwrap() {
        for c in e["matmulnbits_cases"].as_array().into_iter().flatten() {
            out.push((dir.join(e["name"].as_str().unwrap()).join(c["dir"].as_str().unwrap()), c.clone()));
        }
    }
    out
}

/// The weights and activations of a one-node MatMulNBits case, as the kernels take them.
fn kernel_product(graph: &ir::Graph, a: &ir::Tensor) -> Vec<f32> {
    use runtime::kernels::wgemm::{pack_wgemm, wgemm, MatMulNBits, NBitsZeroPoints, WGemmPrecision, WGemmScratch};
    let node = &graph.nodes[0];
    let attr = |n: &str| node.attrs.int(n).unwrap().unwrap() as usize;
    let weight = |i: usize| match &graph.value(node.inputs[i].unwrap()).def {
        ir::ValueDef::Weight(w) => graph.weights.get(*w),
        _ => panic!("input {i} of the case is not a weight"),
    };
    let scales: Vec<f32> = weight(2).to_tensor().unwrap().to_f32_vec();
    let zp = node.inputs.get(3).copied().flatten().map(|_| weight(3).bytes.to_vec());
    let zero_points = zp.as_deref().map_or(NBitsZeroPoints::Default, NBitsZeroPoints::Packed);
    let (k, n) = (attr("K"), attr("N"));
    let src = MatMulNBits {
        k,
        n,
        bits: attr("bits"),
        block_size: attr("block_size"),
        b: &weight(1).bytes,
        scales: &scales,
        zero_points,
    };
    let packed = pack_wgemm(&src).unwrap();
    let level4 = node.attrs.int("accuracy_level").unwrap() == Some(4);
    let precision = if level4 { WGemmPrecision::Int8Activations } else { WGemmPrecision::Exact };
    let rows = a.numel() / k;
    let mut y = vec![0f32; rows * n];
    let pool = runtime::kernels::ThreadPool::new(1);
    let isa = runtime::kernels::Isa::detect();
    wgemm(isa, &pool, &packed.weights(), &a.to_f32_vec(), rows, None, &mut y, precision, &mut WGemmScratch::default());
    y
}

/// Every MatMulNBits configuration of the builder's int4 graphs, on its own: ONNX Runtime's
/// product against the reference evaluator and the WGemm kernels (at `accuracy_level` 4 both
/// quantise the activations per block as onnxruntime does). Agreement is to f32 rounding of the
/// sums (2e-5 of the largest output); exact float activations would be 1-3 % off.
#[test]
fn accuracy_level_4_products_match_onnx_runtime_node_by_node() {
    let cases = matmulnbits_cases();
    assert!(cases.len() >= 10, "{} MatMulNBits cases", cases.len());
    for (dir, attrs) in cases {
        let imported = frontend::import_file(&dir.join("model.onnx")).unwrap();
        let (inputs, expected) = frontend::read_test_case(&dir.join("case")).unwrap();
        let want = &expected[0].1;
        let got = &ir::run::run_graph(&imported.graph, &inputs).unwrap()["Y"];
        let (diff, scale) = common::max_abs_diff(got, want);
        assert!(diff <= 2e-5 * scale, "{} {attrs}: evaluator {:.2e} of max", dir.display(), diff / scale);
        let kernel = kernel_product(&imported.graph, &inputs["A"]);
        let kernel = ir::Tensor::from_f32(ir::DType::F32, want.shape.clone(), kernel);
        let (diff, scale) = common::max_abs_diff(&kernel, want);
        assert!(diff <= 2e-5 * scale, "{} {attrs}: kernels {:.2e} of max", dir.display(), diff / scale);
    }
}

#[test]
fn every_corpus_model_fuses_compiles_and_gives_onnx_runtimes_greedy_ids() {
    let entries = entries();
    assert!(entries.len() >= 17, "the corpus index lists {} models", entries.len());
    assert!(
        entries.iter().any(|e| e.name == "smollm2-optimum") && entries.iter().any(|e| e.name == "smollm2-builder-int4")
    );
    let work = tempfile::tempdir().unwrap();
    let mut rows = Vec::new();
    for e in &entries {
        let mut row = Row { cells: vec![], failures: vec![] };
        if let Some(reason) = &e.refused {
            let known = KNOWN_REFUSALS.iter().any(|(name, why)| e.name.starts_with(name) && reason.contains(why));
            if !known {
                row.failures.push(format!("the exporter refused: {reason}"));
            }
            row.cells.push(format!("the exporter refused: {reason}"));
            rows.push((e.name.clone(), row));
            continue;
        }
        program_cells(e, &mut row);
        greedy_cells(e, work.path(), &mut row);
        target_cell(e, work.path(), "xdna", &mut row);
        let intel = target_cell(e, work.path(), "intel-npu", &mut row);
        openvino_cell(e, intel, &mut row);
        rows.push((e.name.clone(), row));
    }
    let mut table = write_table(&rows);
    for e in entries.iter().filter(|e| e.note.is_some()) {
        table += &format!("\n{}: {}\n", e.name, e.note.as_deref().unwrap_or_default());
    }
    std::fs::write(common::fixtures_dir().join("corpus").join("table.md"), &table).unwrap();
    let failures: Vec<String> =
        rows.iter().flat_map(|(n, r)| r.failures.iter().map(move |f| format!("{n}: {f}"))).collect();
    assert!(failures.is_empty(), "{table}\n{}", failures.join("\n"));
}
