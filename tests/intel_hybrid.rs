//! The intel-npu target on the hybrid corpus (`fixtures/hybrid`): Qwen3.5 and LFM2 (recurrent
//! layers), Qwen3.5-MoE and LFM2-MoE (mixtures of experts), fp32 and int4, compiled
//! with `npuc compile --target intel-npu --blocks 1,16` and run on OpenVINO CPU (precision hint
//! f32) against the host executor on the same bundle: the same 16 greedy ids, and first-step
//! logits within [`LOGITS_TOL`] of the largest |logit|. The prompts are the index's (8 tokens, one
//! padded block of 16) and one of 40 tokens (two full blocks and a padded one), so the states
//! carry across blocks and padded rows must leave them alone.
//!
//! Mixtures of experts run both ways: the routed experts' static networks with their weights (f32,
//! or QMoE's int4 codes and scales) bound as inputs, and computed on the host.
//!
//! gpt-oss (MoE, attention sinks, a sliding window) runs too. What the target refuses, it refuses
//! naming the node: QMoE with int8 activation blocks, and truncating a hybrid sequence (its
//! recurrent state holds only the last position).

mod common;

use common::hybrid::{hybrid_dir, ids, index};
use common::relative_error;
use runtime::bundle::Bundle;
use runtime::exec::{ExecOptions, Executor};
use runtime::openvino::{OvError, OvOptions, OvSession};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The same weights in f32 on both sides; the host runs the delta rule in chunks and sums in
/// another order than OpenVINO. Measured worst 4.0e-6 (Qwen3.5-MoE fp32; the test prints each).
const LOGITS_TOL: f64 = 1e-4;

/// `npuc compile --target intel-npu --blocks 1,16` of hybrid entry `name`: the bundle, or the
/// compiler's message.
fn compile(name: &str, tmp: &Path) -> Result<PathBuf, String> {
    compile_blocks(name, tmp, "1,16")
}

/// `npuc compile --target intel-npu --blocks BLOCKS` of hybrid entry `name`.
fn compile_blocks(name: &str, tmp: &Path, blocks: &str) -> Result<PathBuf, String> {
    let model = hybrid_dir().join(name).join("model.onnx");
    let bundle = tmp.join(format!("{name}-{blocks}.npub"));
    let out = Command::new(env!("CARGO_BIN_EXE_npuc"))
        .args(["compile", model.to_str().unwrap(), "--target", "intel-npu", "--blocks", blocks, "-o"])
        .arg(&bundle)
        .output()
        .unwrap();
    match out.status.success() {
        true => Ok(bundle),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// The index's prompt of entry `name`.
fn index_prompt(name: &str) -> Vec<u32> {
    let entry = index().into_iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("{name} in the index"));
    ids(&entry["cases"][0], "prompt_ids")
}

/// Compiles `name`, runs both prompts on OpenVINO CPU (with the experts of a mixture computed on
/// the host when `host_experts`, else in the bound expert networks) and on the host executor; the
/// worst first-step logits error relative to the largest |logit|.
fn openvino_against_host(name: &str, host_experts: bool) -> f64 {
    let long: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % 500).collect();
    openvino_against_host_on(name, host_experts, "1,16", &[index_prompt(name), long])
}

/// [`openvino_against_host`] with token blocks `blocks` and these prompts.
fn openvino_against_host_on(name: &str, host_experts: bool, blocks: &str, prompts: &[Vec<u32>]) -> f64 {
    let tmp = tempfile::tempdir().unwrap();
    let path = compile_blocks(name, tmp.path(), blocks).unwrap_or_else(|e| panic!("{name}: {e}"));
    let bundle = Bundle::open(&path, Some("intel-npu")).unwrap();
    let options =
        OvOptions { device: "CPU".into(), cache_dir: Some(tmp.path().join("cache")), max_context: 128, threads: 2 };
    let mut ov = OvSession::open(&bundle, &options).unwrap();
    ov.set_host_experts(host_experts);
    let mut host = Executor::new(&bundle, ExecOptions { max_context: 128, ..ExecOptions::default() }).unwrap();
    let mut worst = 0f64;
    for prompt in prompts {
        let want = host.step(prompt).unwrap().to_vec();
        let got = ov.step(prompt).unwrap();
        worst = worst.max(relative_error(&got, &want));
        host.reset().unwrap();
        ov.reset().unwrap();
        let (want_ids, _) = host.generate_greedy(prompt, 16, &[], |_| {}).unwrap();
        let got_ids = ov.generate_greedy(prompt, 16, &[], |_| {}).unwrap();
        assert_eq!(got_ids.len(), 16, "{name}");
        assert_eq!(got_ids, want_ids, "{name}: {} prompt tokens", prompt.len());
        host.reset().unwrap();
        ov.reset().unwrap();
    }
    let experts = match (name.contains("moe") || name.contains("gpt-oss"), host_experts) {
        (false, _) => "",
        (true, true) => " (experts on the host)",
        (true, false) => " (expert networks)",
    };
    eprintln!("{name}{experts}: first-step logits within {worst:.2e} of the largest |logit|");
    assert!(worst <= LOGITS_TOL, "{name}: first-step logits differ by {worst:.2e} of the largest");
    worst
}

#[test]
fn intel_openvino_cpu_gives_the_host_tokens_for_qwen3_5() {
    openvino_against_host("qwen3.5-builder-fp32", false);
    openvino_against_host("qwen3.5-builder-int4", false);
}

#[test]
fn intel_openvino_cpu_gives_the_host_tokens_for_qwen3_5_moe() {
    openvino_against_host("qwen3.5-moe-builder-fp32", false);
    openvino_against_host("qwen3.5-moe-builder-fp32", true);
    openvino_against_host("qwen3.5-moe-builder-int4", false);
    openvino_against_host("qwen3.5-moe-builder-int4", true);
}

#[test]
fn intel_openvino_cpu_gives_the_host_tokens_for_lfm2() {
    openvino_against_host("lfm2-builder-fp32", false);
    openvino_against_host("lfm2-builder-int4", false);
}

#[test]
fn intel_openvino_cpu_gives_the_host_tokens_for_lfm2_moe() {
    openvino_against_host("lfm2-moe-builder-fp32", false);
    openvino_against_host("lfm2-moe-builder-fp32", true);
    openvino_against_host("lfm2-moe-builder-int4", false);
    openvino_against_host("lfm2-moe-builder-int4", true);
}

/// gpt-oss: mixtures of experts (clamped SwiGLU) and attention with sinks and, every other layer,
/// a sliding window of 12 that the 40-token prompt passes.
#[test]
fn intel_openvino_cpu_gives_the_host_tokens_for_gpt_oss() {
    openvino_against_host("gpt-oss-builder-fp32", false);
    openvino_against_host("gpt-oss-builder-fp32", true);
}

/// The default static shapes, blocks of 1 and 64 rows: a 70-token prompt runs a full block of 64
/// and a padded one, each expert's routed rows gathered into a block of 64 (or 1).
#[test]
fn intel_openvino_cpu_gives_the_host_tokens_in_blocks_of_1_and_64() {
    let long: Vec<u32> = (0..70u32).map(|i| (i * 53 + 7) % 500).collect();
    for name in ["qwen3.5-moe-builder-int4", "lfm2-moe-builder-fp32"] {
        openvino_against_host_on(name, false, "1,64", std::slice::from_ref(&long));
    }
}

#[test]
fn intel_plan_of_a_hybrid_cuts_at_its_recurrent_layers_and_experts() {
    let tmp = tempfile::tempdir().unwrap();
    let path = compile("qwen3.5-moe-builder-fp32", tmp.path()).unwrap();
    let plan = runtime::bundle::intel::Plan::decode(&std::fs::read(path.join("intel/plan.json")).unwrap()).unwrap();
    use runtime::bundle::intel::{HostStep, Step};
    let kinds: Vec<&str> = plan
        .host
        .iter()
        .map(|h| match h {
            HostStep::CausalConv(_) => "conv",
            HostStep::DeltaRule(_) => "delta",
            HostStep::Moe(_) => "moe",
        })
        .collect();
    // Layer 0 is linear attention (conv, then the delta rule) and a mixture of experts beside a
    // shared expert; layer 1 is full attention (the tiny model's last layer has no MLP).
    assert_eq!(kinds, ["conv", "delta", "moe"], "{:?}", plan.host);
    let steps: Vec<String> = plan
        .schedule
        .iter()
        .map(|s| match s {
            Step::Segment(i) => format!("s{i}"),
            Step::Attention(i) => format!("a{i}"),
            Step::Host(i) => format!("h{i}"),
        })
        .collect();
    // conv | delta rule | experts | attention, the lm_head last.
    assert_eq!(steps.join(" "), "s0 h0 s1 h1 s2 h2 s3 a0 s4 s5");
    assert_eq!(plan.host.iter().map(HostStep::state_floats).collect::<Vec<_>>(), [256 * 3, 4 * 32 * 32, 0]);
}

#[test]
fn intel_refuses_what_its_host_steps_do_not_compute_naming_the_node() {
    // Coded experts (the builder's QMoE, folded into Moe) whose inputs the host executor
    // quantises to int8 blocks (accuracy_level 4): the expert networks compute with float
    // inputs, so the target refuses it rather than differ.
    let model = hybrid_dir().join("qwen3.5-moe-builder-int4/model.onnx");
    let imported = frontend::import_file(&model).unwrap();
    let target = passes::targets::target("intel-npu").unwrap();
    let mut program = passes::driver::run(&target.pipeline(), imported.graph, None, |_, _| {}).unwrap().graph;
    let qmoe = program.nodes.iter_mut().find(|n| n.op == "Moe").expect("a Moe node");
    qmoe.attrs.set("accuracy_level", ir::attr::Attr::Int(4));
    let name = qmoe.name.clone();
    let err = codegen_intel::compile(&program, &codegen_intel::Options::default()).err().expect("compiled").to_string();
    assert!(err.contains(&format!("node `{name}`")) && err.contains("int8 activation blocks"), "{err}");
}

#[test]
fn intel_openvino_refuses_to_truncate_a_hybrid_sequence() {
    let tmp = tempfile::tempdir().unwrap();
    let path = compile("lfm2-builder-fp32", tmp.path()).unwrap();
    let bundle = Bundle::open(&path, Some("intel-npu")).unwrap();
    let options =
        OvOptions { device: "CPU".into(), cache_dir: Some(tmp.path().join("cache")), max_context: 64, threads: 2 };
    let mut ov = OvSession::open(&bundle, &options).unwrap();
    ov.step(&[1, 2, 3, 4]).unwrap();
    match ov.truncate(2) {
        Err(OvError::RecurrentTruncate { node, tokens: 2, held: 4 }) => {
            assert!(node.starts_with("CausalConv_"), "{node}")
        }
        other => panic!("truncating a hybrid sequence: {:?}", other.map(|_| ())),
    }
    // Keeping every token is no rewind.
    ov.truncate(4).unwrap();
    assert_eq!(ov.position(), 4);
    assert_eq!(ov.recurrent_node(), Some(node_name(&bundle).as_str()));
    // The CLI refuses to speculate on OpenVINO before generating anything, and runs plain greedy
    // decoding with the host backend's ids.
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_npuc"))
            .args(["run", path.to_str().unwrap(), "--prompt-ids", "1,17,250,33,402,5,9,100", "--max-tokens", "8"])
            .args(["--ignore-eos", "--ov-cache-dir"])
            .arg(tmp.path().join("cache"))
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stdout, stderr) = run(&["--backend", "openvino", "--speculate", "lookup"]);
    assert!(!ok && stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("node `CausalConv_") && stderr.contains("speculate on the host backend"), "{stderr}");
    let (host, openvino) = (run(&["--backend", "host"]), run(&["--backend", "openvino"]));
    assert!(host.0 && openvino.0, "{}{}", host.2, openvino.2);
    assert_eq!(openvino.1.lines().next(), host.1.lines().next());
}

/// The first CausalConv node of the bundle's plan (the fused op the builder's
/// CausalConvWithState became).
fn node_name(bundle: &Bundle) -> String {
    let plan = runtime::bundle::intel::Plan::decode(&bundle.read_file("intel/plan.json").unwrap()).unwrap();
    plan.host.iter().map(|h| h.node().to_string()).find(|n| n.starts_with("CausalConv_")).unwrap()
}

/// A decode step binds and runs exactly the `k` routed experts of each mixture, one network each;
/// a prefill block runs each routed expert once over all its rows (at most every expert once).
#[test]
fn intel_openvino_runs_only_the_routed_experts_binding_their_weights() {
    let tmp = tempfile::tempdir().unwrap();
    // (entry, MoE nodes, k, experts)
    for (name, nodes, k, experts) in [("qwen3.5-moe-builder-fp32", 1, 2, 4), ("lfm2-moe-builder-int4", 2, 2, 4)] {
        let path = compile(name, tmp.path()).unwrap();
        let bundle = Bundle::open(&path, Some("intel-npu")).unwrap();
        let options =
            OvOptions { device: "CPU".into(), cache_dir: Some(tmp.path().join("cache")), max_context: 64, threads: 2 };
        let mut ov = OvSession::open(&bundle, &options).unwrap();
        let prompt = index_prompt(name);
        let logits = ov.step(&prompt).unwrap();
        let prefill = ov.expert_runs();
        assert!((nodes..=nodes * experts).contains(&(prefill as usize)), "{name}: {prefill} expert runs in prefill");
        ov.step(&[runtime::exec::argmax(&logits)]).unwrap();
        assert_eq!(ov.expert_runs() - prefill, (nodes * k) as u64, "{name}: expert runs of one decode step");
        ov.set_host_experts(true);
        ov.step(&[1]).unwrap();
        assert_eq!(ov.expert_runs() - prefill, (nodes * k) as u64, "{name}: host experts run no network");
    }
}
