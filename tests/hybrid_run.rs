//! The host executor on the hybrid corpus (`fixtures/hybrid`): every entry is compiled for the
//! cpu target with `npuc compile`; the ones the executor runs must give ONNX Runtime's 16 greedy
//! ids from the index's prompt (a divergence is allowed only at a near-tie, as in
//! `hybrid_vs_ort.rs`) and the prefill case's logits within [`FLOAT_TOL`] (fp32) or
//! [`LEVEL4_TOL`] (the builder's int4 at `accuracy_level` 4) of the largest |expected| logit.
//! The others must be refused for the reasons [`EXPECTED_REFUSALS`] lists, so that an entry
//! starting (or stopping) to run is noticed.
//!
//! MoE reads only the routed experts: a decode step computes `k` experts per MoE node.
//! Recurrent state is per sequence: two sequences stepped in turn give each one's tokens alone,
//! and a stateful sequence cannot be truncated outside a verify block (`hybrid_speculation.rs`
//! rewinds inside one).

mod common;

use common::hybrid::{compile, greedy_agrees, hybrid_dir, ids, index};
use common::relative_error;

use runtime::bundle::Bundle;
use runtime::exec::{argmax, ExecError, ExecOptions, Executor};
use std::path::Path;
use std::process::Command;

/// f32 accumulation against ONNX Runtime's fp32 logits, relative to the largest |logit|
/// (measured worst 1.0e-6: LFM2 and Qwen3.5-MoE).
const FLOAT_TOL: f64 = 1e-4;
/// The builder's int4 (`accuracy_level` 4: int8 activation blocks, where a rounding boundary can
/// move one block's code; the evaluator meets one at 3.4e-3 on Qwen3.5-MoE). Measured worst
/// 6.4e-7 (Qwen3.5-MoE).
const LEVEL4_TOL: f64 = 1e-2;
/// Entries that do not run, by a fragment of the reason: the builder refuses gpt-oss's int4.
const EXPECTED_REFUSALS: [(&str, &str); 1] = [("gpt-oss-builder-int4", "no model.onnx")];

/// Greedy ids of `steps` tokens after `prompt` on a new sequence.
fn greedy(exec: &mut Executor, prompt: &[u32], steps: usize) -> Result<Vec<u32>, ExecError> {
    let seq = exec.new_sequence();
    let mut out = vec![argmax(exec.step_sequence(seq, prompt)?)];
    while out.len() < steps {
        let next = argmax(exec.step_sequence(seq, &out[out.len() - 1..])?);
        out.push(next);
    }
    exec.drop_sequence(seq)?;
    Ok(out)
}

/// Worst error of every prefill row's logits against the prefill case's, relative to the largest
/// |expected| logit.
fn prefill_error(exec: &mut Executor, dir: &Path) -> Result<f64, String> {
    let (inputs, outputs) = frontend::read_test_case(&dir.join("prefill")).map_err(|e| e.to_string())?;
    let prompt: Vec<u32> = inputs["input_ids"].as_i64().unwrap().iter().map(|&t| t as u32).collect();
    let logits = outputs.iter().find(|(n, _)| n == "logits").ok_or("the prefill case has no logits")?;
    let want = logits.1.to_f64_vec();
    let seq = exec.new_sequence();
    let got = exec.step_sequence_rows(seq, &prompt).map_err(|e| e.to_string())?.to_vec();
    exec.drop_sequence(seq).map_err(|e| e.to_string())?;
    if got.len() != want.len() {
        return Err(format!("{} logits against ONNX Runtime's {}", got.len(), want.len()));
    }
    let largest = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    let worst = got.iter().zip(&want).fold(0f64, |m, (g, w)| m.max((f64::from(*g) - w).abs()));
    Ok(worst / largest)
}

/// Runs one entry: `Ok(Some(report))` when it runs and agrees, `Ok(None)` with the refusal in
/// `refused` when it is refused, `Err` when it runs and disagrees.
fn check(entry: &serde_json::Value, tmp: &Path, refused: &mut Vec<(String, String)>) -> Result<Option<String>, String> {
    let name = entry["name"].as_str().unwrap();
    let bundle_dir = match compile(name, tmp) {
        Ok(b) => b,
        Err(e) => {
            refused.push((name.to_string(), format!("compile: {e}")));
            return Ok(None);
        }
    };
    let bundle = Bundle::open(&bundle_dir, Some("cpu")).map_err(|e| e.to_string())?;
    let mut exec = match Executor::new(&bundle, ExecOptions { max_context: 64, sequences: 2, ..ExecOptions::default() })
    {
        Ok(x) => x,
        Err(e) => {
            refused.push((name.to_string(), format!("run: {e}")));
            return Ok(None);
        }
    };
    let tol = if name.ends_with("int4") { LEVEL4_TOL } else { FLOAT_TOL };
    let err = prefill_error(&mut exec, &hybrid_dir().join(name))?;
    if err > tol {
        return Err(format!("{name}: prefill logits differ by {err:.2e} of the largest (tolerance {tol:.0e})"));
    }
    let case = &entry["cases"][0];
    let got = greedy(&mut exec, &ids(case, "prompt_ids"), 16).map_err(|e| format!("{name}: {e}"))?;
    greedy_agrees(&got, case).map_err(|e| format!("{name}: {e}"))?;
    Ok(Some(format!("{name}: prefill logits within {err:.1e}, greedy ids agree")))
}

#[test]
fn hybrid_bundles_run_with_onnx_runtime_s_greedy_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut refused, mut failures, mut ran) = (Vec::new(), Vec::new(), 0);
    for entry in index() {
        match check(&entry, tmp.path(), &mut refused) {
            Ok(Some(report)) => {
                eprintln!("{report}");
                ran += 1;
            }
            Ok(None) => {}
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    for (name, why) in &refused {
        eprintln!("{name} refused: {}", why.lines().last().unwrap_or(""));
        let expected = EXPECTED_REFUSALS.iter().find(|(n, _)| n == name);
        assert!(expected.is_some_and(|(_, reason)| why.contains(reason)), "{name} was refused unexpectedly: {why}");
    }
    assert_eq!(ran + refused.len(), index().len());
    assert_eq!(refused.len(), EXPECTED_REFUSALS.len(), "an entry expected to be refused ran: {refused:?}");
}

/// The sequences' recurrent states are their own: stepping two in turn gives each one's greedy
/// ids alone, and a stateful sequence refuses truncation outside a verify block.
#[test]
fn interleaved_sequences_keep_their_own_recurrent_state() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["qwen3.5-builder-fp32", "lfm2-builder-fp32"] {
        let bundle_dir = compile(name, tmp.path()).unwrap();
        let bundle = Bundle::open(&bundle_dir, Some("cpu")).unwrap();
        let mut exec =
            Executor::new(&bundle, ExecOptions { max_context: 64, sequences: 3, ..ExecOptions::default() }).unwrap();
        let prompts: [&[u32]; 2] = [&[1, 17, 250, 33, 402, 98, 5, 311], &[7, 300, 41, 12]];
        let alone: Vec<Vec<u32>> = prompts.iter().map(|p| greedy(&mut exec, p, 12).unwrap()).collect();
        assert_ne!(alone[0], alone[1], "{name}: the two prompts must differ to tell the states apart");
        let seqs = [exec.new_sequence(), exec.new_sequence()];
        let mut got: Vec<Vec<u32>> = vec![Vec::new(), Vec::new()];
        for step in 0..12 {
            for i in 0..2 {
                let tokens = if step == 0 { prompts[i].to_vec() } else { vec![got[i][step - 1]] };
                got[i].push(argmax(exec.step_sequence(seqs[i], &tokens).unwrap()));
            }
        }
        assert_eq!(got, alone, "{name}: interleaved sequences differ from each alone");
        // Outside a verify block the state of an earlier position is gone: rewinding is refused.
        let held = exec.sequence_position(seqs[0]).unwrap();
        match exec.truncate_sequence(seqs[0], held - 1) {
            Err(ExecError::RecurrentState { action, .. }) => assert_eq!(action, "truncating"),
            other => panic!("{name}: truncating a stateful sequence gave {other:?}"),
        }
        assert!(matches!(exec.fork_sequence(seqs[1], 2), Err(ExecError::RecurrentState { .. })));
    }
}

/// A decode step computes exactly `k` experts per MoE node (the routed ones; 4 experts, k = 2:
/// one MoE node in Qwen3.5-MoE, two in LFM2-MoE), reading their bytes only, and a prefill step
/// each expert at most once per node (tokens grouped).
#[test]
fn moe_decode_computes_only_the_routed_experts() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        ("qwen3.5-moe-builder-fp32", 1),
        ("qwen3.5-moe-builder-int4", 1),
        ("lfm2-moe-builder-fp32", 2),
        ("lfm2-moe-builder-int4", 2),
    ];
    let mut all_bytes = Vec::new();
    for (name, nodes) in cases {
        let bundle_dir = compile(name, tmp.path()).unwrap();
        let bundle = Bundle::open(&bundle_dir, Some("cpu")).unwrap();
        let mut exec = Executor::new(&bundle, ExecOptions { max_context: 64, ..ExecOptions::default() }).unwrap();
        let (experts, k) = (4, 2);
        let first = argmax(exec.step(&[1, 17, 250, 33, 402, 98, 5, 311]).unwrap());
        let after_prefill = exec.moe_expert_passes();
        assert!(
            (nodes * k..=nodes * experts).contains(&(after_prefill as usize)),
            "{name}: prefill computed {after_prefill}"
        );
        let bytes_before = exec.moe_expert_bytes_read();
        exec.step(&[first]).unwrap();
        assert_eq!(exec.moe_expert_passes() - after_prefill, (nodes * k) as u64, "{name}: one decode step");
        // A decode token reads the routed experts' bytes: k of E per node, the active size.
        let (active, all) = exec.moe_bytes_per_token();
        assert_eq!(exec.moe_expert_bytes_read() - bytes_before, active as u64, "{name}: bytes of one decode step");
        assert_eq!(active * experts, all * k, "{name}: experts of equal size");
        all_bytes.push(all);
    }
    // The int4 experts (4-bit codes and a scale per 32) are read in place: under a fifth of fp32's.
    assert!(all_bytes[1] * 5 < all_bytes[0] && all_bytes[3] * 5 < all_bytes[2], "{all_bytes:?}");
}

/// `npuc run --stats --json` reports the recurrent state beside the KV cache (Qwen3.5: a conv
/// state of 256 × 3 and a linear-attention state of 4 × 32 × 32 f32 values per sequence), and
/// `--speculate lookup` on a stateful bundle gives the tokens of plain greedy.
#[test]
fn run_reports_state_bytes_and_speculates_on_a_stateful_bundle() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = compile("qwen3.5-builder-fp32", tmp.path()).unwrap();
    let run = |extra: &[&str]| {
        let prompt = "1,17,250,33,402,1,17,250,33";
        let mut args = vec!["run", bundle.to_str().unwrap(), "--prompt-ids", prompt, "--max-tokens", "12"];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_npuc")).args(&args).output().unwrap();
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let plain = run(&["--stats", "--json"]);
    assert_eq!(plain["state"]["bytes_per_sequence"], 4 * (256 * 3 + 4 * 32 * 32));
    let spec = run(&["--json", "--speculate", "lookup"]);
    assert_eq!(spec["tokens"], plain["tokens"], "speculation changed the tokens");
    assert!(spec["speculation"]["verify_steps"].as_u64().unwrap() > 0, "{spec}");
}

/// The chunked delta rule gives the recurrence's prefill: Qwen3.5's logits and recurrent state
/// after a 45-token prompt in chunks of 16 (crossing two chunk boundaries) and of the default 64
/// agree with token by token (`delta_chunk` 0) to 1e-5 of the largest value; without gated
/// delta layers (LFM2) the option changes nothing.
#[test]
fn chunked_delta_rule_prefill_agrees_with_the_recurrence() {
    let tmp = tempfile::tempdir().unwrap();
    let prompt: Vec<u32> = (0..45).map(|i| (i * 37 + 11) % 250 + 1).collect();
    for name in ["qwen3.5-builder-fp32", "qwen3.5-moe-builder-int4", "lfm2-builder-fp32"] {
        let bundle_dir = compile(name, tmp.path()).unwrap();
        let bundle = Bundle::open(&bundle_dir, Some("cpu")).unwrap();
        let prefill = |delta_chunk| {
            let mut exec = Executor::new(&bundle, ExecOptions { delta_chunk, ..ExecOptions::default() }).unwrap();
            let logits = exec.step(&prompt).unwrap().to_vec();
            (logits, exec.sequence_state(exec.default_sequence()).unwrap().to_vec())
        };
        let (want_logits, want_state) = prefill(0);
        for chunk in [16, 64] {
            let (logits, state) = prefill(chunk);
            let logit_err = relative_error(&logits, &want_logits);
            let state_err = relative_error(&state, &want_state);
            eprintln!("{name}, chunk {chunk}: logits {logit_err:.1e}, state {state_err:.1e}");
            assert!(
                logit_err < 1e-5 && state_err < 1e-5,
                "{name}, chunk {chunk}: logits {logit_err:.1e}, state {state_err:.1e}"
            );
        }
    }
}

/// Prompts sharing a prefix share its KV pages on a hybrid decoder too: the first prompt's
/// prefill forks the second at 32 tokens (2 pages of 16) and the third at 48, copying the
/// recurrent state there, and every prompt gets the tokens it gets alone.
#[test]
fn prompts_with_a_common_prefix_share_pages_and_fork_the_state() {
    let tmp = tempfile::tempdir().unwrap();
    let base: Vec<u32> = (0..60).map(|i| (i * 29 + 3) % 250 + 1).collect();
    let prompts = vec![base.clone(), [&base[..40], &[7, 9][..]].concat(), [&base[..50], &[11][..]].concat()];
    for name in ["qwen3.5-builder-fp32", "lfm2-moe-builder-int4"] {
        let bundle_dir = compile(name, tmp.path()).unwrap();
        let bundle = Bundle::open(&bundle_dir, Some("cpu")).unwrap();
        let options = ExecOptions { max_context: 96, sequences: 4, kv_page_rows: Some(16), ..ExecOptions::default() };
        let mut exec = Executor::new(&bundle, options).unwrap();
        let alone: Vec<Vec<u32>> = prompts.iter().map(|p| greedy(&mut exec, p, 10).unwrap()).collect();
        let mut samplers = vec![runtime::sample::Sampler::greedy(); 3];
        let outs = exec.generate_many(&prompts, 10, &[], &mut samplers, |_, _| {});
        assert_eq!(outs.iter().map(|o| o.shared_prefix_tokens).collect::<Vec<_>>(), [0, 32, 48], "{name}");
        for (i, out) in outs.iter().enumerate() {
            assert!(out.error.is_none(), "{name}: prompt {i}: {:?}", out.error);
            assert_eq!(out.tokens, alone[i], "{name}: prompt {i} differs from its run alone");
        }
    }
}

/// `npuc bench --json` on an MoE bundle measures the expert bytes a decode token reads: the
/// active experts' (k of E per node), and with the other GEMMs what a dense model of that active
/// size reads.
#[test]
fn bench_reports_moe_bytes_per_decode_token() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = compile("lfm2-moe-builder-int4", tmp.path()).unwrap();
    let args = ["bench", bundle.to_str().unwrap(), "--prompt-len", "8", "--gen-len", "4", "--repetitions", "1"];
    let out = Command::new(env!("CARGO_BIN_EXE_npuc")).args(args).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let moe = &report["moe"];
    let (active, all) = (moe["active_expert_bytes"].as_f64().unwrap(), moe["all_expert_bytes"].as_f64().unwrap());
    assert_eq!(moe["expert_bytes_per_decode_token"].as_f64().unwrap(), active, "{moe}");
    assert_eq!(2.0 * active, all, "k = 2 of 4 experts: {moe}");
    let gemm = report["gemm_weight_bytes_per_token"].as_f64().unwrap();
    assert_eq!(moe["dense_same_active_bytes_per_token"].as_f64().unwrap(), gemm + active);
}

/// MoE projections split their rows over the pool's workers, and a prefill's chunked delta rule
/// its state heads (Qwen3.5-MoE's 4, two a thread): a 100-token prefill (two 64-row delta-rule
/// chunks) and a decode step of the MoE bundles give the same logits on 2 threads as on 1, bit
/// for bit (each row's dot product and each head's recurrence is the same sum either way).
#[test]
fn moe_on_two_threads_gives_one_threads_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let prompt: Vec<u32> = (0..100).map(|i| (i * 37 + 11) % 250 + 1).collect();
    for name in ["qwen3.5-moe-builder-int4", "lfm2-moe-builder-fp32", "gpt-oss-builder-fp32"] {
        let bundle_dir = compile(name, tmp.path()).unwrap();
        let bundle = Bundle::open(&bundle_dir, Some("cpu")).unwrap();
        let run = |threads| {
            let mut exec = Executor::new(&bundle, ExecOptions { threads, ..ExecOptions::default() }).unwrap();
            let mut logits = exec.step(&prompt).unwrap().to_vec();
            logits.extend_from_slice(exec.step(&[7]).unwrap());
            logits
        };
        assert!(run(1) == run(2), "{name}: 2 threads changed the logits");
    }
}
