//! `npuc passes` and `npuc explore` from the command line.

mod common;

use serde_json::Value;
use std::process::Command;

fn npuc(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_npuc")).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn model(name: &str) -> String {
    common::model(name).display().to_string()
}

#[test]
fn passes_dumps_one_file_per_pass_and_reports_json() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) =
        npuc(&["passes", &model("llama-optimum"), "--target", "cpu", "--dump-dir", dir.path().to_str().unwrap()]);
    assert!(ok, "{err}");
    let mut files: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert_eq!(
        files,
        ["00-import.ir", "01-canonicalize.ir", "02-saturate.ir", "03-position-tables.ir", "04-lower-slices.ir"]
    );
    let text = std::fs::read_to_string(dir.path().join("02-saturate.ir")).unwrap();
    assert!(text.starts_with("graph "), "{}", &text[..80.min(text.len())]);
    // The summary lines go to stderr, one per pass.
    assert!(err.contains("canonicalize") && err.contains("saturate"), "{err}");

    let (ok, out, err) = npuc(&["passes", &model("llama-optimum"), "--json", "--stop-after", "canonicalize"]);
    assert!(ok, "{err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = r["passes"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["canonicalize"]);
    assert!(r["weight_bytes"].as_u64().unwrap() > 0);

    // The final program's step cost: a decode step reads every weight once (the tied lm_head
    // reads the whole embedding table) and gathers one row of it and a cos and a sin row; a
    // 64-row prefill block reads the same weights, 63 more gathered rows of each, and does 64×
    // the GEMM work (plus attention).
    let (ok, out, err) = npuc(&["passes", &model("llama-optimum"), "--json"]);
    assert!(ok, "{err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    let cost = |i: usize, k: &str| r["step_cost"][i]["cost"][k].as_u64().unwrap();
    assert_eq!(r["step_cost"][0]["step"], "decode");
    let c = common::config("llama-optimum");
    let (hidden, head_dim) = (c.hidden as u64, c.head_dim as u64);
    let total = r["weight_bytes"].as_u64().unwrap();
    assert!(c.tied_embeddings);
    // An embedding row and a cos and a sin row (head_dim f32 each) per token.
    let rows = (hidden + 2 * head_dim) * 4;
    assert_eq!(cost(0, "weight_bytes"), total + rows, "{}", r["step_cost"]);
    assert_eq!(cost(1, "weight_bytes"), cost(0, "weight_bytes") + 63 * rows);
    // The decode step's attention at its 513 keys: q·k and p·v per head and layer.
    let attention = (c.layers * c.heads) as u64 * 513 * head_dim * 2;
    assert!(cost(1, "macs") >= 64 * (cost(0, "macs") - attention));
}

#[test]
fn passes_refuses_unknown_targets_and_passes() {
    let (ok, _, err) = npuc(&["passes", &model("llama-optimum"), "--target", "gpu"]);
    assert!(!ok);
    // The CLI lists the targets the registry has.
    assert!(err.contains("'gpu'") && err.contains("cpu, xdna, intel-npu"), "{err}");
    let (ok, _, err) = npuc(&["passes", &model("llama-optimum"), "--stop-after", "fold"]);
    assert!(!ok);
    assert!(err.contains("no pass named `fold`") && err.contains("canonicalize, saturate"), "{err}");
}

/// `--check` evaluates the final program on a case and reports its error against ONNX Runtime's
/// outputs; `--fp16-sim` does it as an fp16 device would. On the builder's unmodified int4 graph
/// (accuracy level 1) both stay close
/// (fp16 rounds every tensor: errors of a few 10⁻³, logits KL far below 0.01).
#[test]
fn passes_checks_the_program_against_a_test_case() {
    let case = common::fixture("llama-builder-int4-acc1").join("prefill").display().to_string();
    let m = model("llama-builder-int4-acc1");
    for (target, fp16, bound) in [("cpu", false, 1e-4), ("intel-npu", true, 2e-2)] {
        let mut args = vec!["passes", &m, "--target", target, "--json", "--check", &case];
        if fp16 {
            args.push("--fp16-sim");
        }
        let (ok, out, err) = npuc(&args);
        assert!(ok, "{err}");
        let r: Value = serde_json::from_str(&out).unwrap();
        let checks = r["check"].as_array().unwrap();
        let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names[0], "logits", "{names:?}");
        assert_eq!(names.len(), 5, "logits and four presents: {names:?}");
        for c in checks {
            let d = c["max_rel_diff"].as_f64().unwrap();
            assert!(d < bound, "{target}: {c}");
            assert!(!fp16 || d > 0.0, "fp16 rounding must show: {c}");
            assert_eq!(c["non_finite"], 0);
        }
        assert!(checks[0]["worst_kl"].as_f64().unwrap() < 1e-3, "{target}: {}", checks[0]);
    }
    let (ok, _, err) = npuc(&["passes", &m, "--check", "no/such/case"]);
    assert!(!ok && err.contains("no/such/case") && err.contains("does not exist"), "{err}");
    let empty = tempfile::tempdir().unwrap();
    let (ok, _, err) = npuc(&["passes", &m, "--check", empty.path().to_str().unwrap()]);
    assert!(!ok && err.contains("holds no input_N.pb"), "{err}");
}

#[test]
fn explore_runs_user_rules_on_one_layer() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("my.rules");
    std::fs::write(&rules, "# x·σ(x) as written by torch\nmy-silu: (Mul ?x (Sigmoid ?x)) => (npuc::Silu ?x)\n")
        .unwrap();
    let (ok, out, err) = npuc(&[
        "explore",
        &model("llama-optimum"),
        "--layer",
        "0",
        "--family",
        "rmsnorm",
        "--rules",
        rules.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    let applied: u64 = r["report"]["phases"][0]["iterations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|it| it["applied"]["my-silu"].as_u64())
        .sum();
    assert_eq!(applied, 1, "one SiLU per layer: {out}");
    let ops: Vec<(String, u64)> = serde_json::from_value(r["ops_after"].clone()).unwrap();
    assert!(ops.contains(&("npuc::Silu".to_string(), 1)), "{ops:?}");
    assert!(r["nodes_after"].as_u64() < r["nodes_before"].as_u64());
}

#[test]
fn explore_reports_bad_rules_and_families_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("bad.rules");
    std::fs::write(&rules, "ok: (Neg ?x) => (Neg ?x)\nbad: (Frobnicate ?x) => ?x\n").unwrap();
    let (ok, _, err) = npuc(&["explore", &model("llama-optimum"), "--rules", rules.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("bad.rules: line 2"), "{err}");
    let (ok, _, err) = npuc(&["explore", &model("llama-optimum"), "--family", "nope"]);
    assert!(!ok);
    assert!(err.contains("unknown rule family `nope`") && err.contains("rmsnorm"), "{err}");
    let (ok, _, err) = npuc(&["explore", &model("llama-optimum"), "--layer", "7"]);
    assert!(!ok);
    assert!(err.contains("layer 7"), "{err}");
}

#[test]
fn explore_explains_a_fused_value() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("my.rules");
    std::fs::write(&rules, "my-silu: (Mul ?x (Sigmoid ?x)) => (npuc::Silu ?x)\n").unwrap();
    let value = "/model/layers.0/mlp/act_fn/Mul_output_0";
    let (ok, out, err) = npuc(&[
        "explore",
        &model("llama-optimum"),
        "--layer",
        "0",
        "--family",
        "rmsnorm",
        "--rules",
        rules.to_str().unwrap(),
        "--explain",
        value,
    ]);
    assert!(ok, "{err}");
    let chain: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("rewrite chain")).collect();
    assert!(chain.iter().any(|l| l.trim_start().starts_with("start: (Mul ")), "{out}");
    assert!(chain.iter().any(|l| l.trim_start().starts_with("my-silu: (npuc::Silu ")), "{out}");
}
