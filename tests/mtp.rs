//! Drafting with the MTP head onnxruntime-genai's builder writes beside Qwen3.5-style decoders
//! (`mtp.onnx`; the hybrid corpus's Qwen3.5 and Qwen3.5-MoE, fp32 and int4), compiled into the
//! bundle as its drafter program.
//!
//! - The bundle: the head's program reads the decoder's embedding and lm_head under their own
//!   names (stored once) and its clashing names apart; `--no-drafter` leaves it and the
//!   decoder's `hidden_states` output out, and `--speculate mtp` then says so.
//! - Numerics: the decoder's hidden states and the head's logits and hidden states agree with
//!   ONNX Runtime's prefill, `mtp` and `mtp_decode` cases.
//! - Drafting: the head's first draft at every decode position is the draft ONNX Runtime's
//!   reference loop made there (the corpus index's `drafts`), whether the verify steps before
//!   kept none of the drafts or several (an oracle then replaces the head's drafts by the
//!   greedy continuation, so the head runs several decoder rows at once); greedy speculation
//!   gives plain greedy's ids for draft lengths 1 to 3.

mod common;

use common::hybrid::{compile, greedy_agrees, hybrid_dir, ids, index};
use common::relative_error;

use runtime::bundle::{Bundle, DrafterKind};
use runtime::exec::{Drafter, ExecOptions, Executor, MtpDrafter};
use runtime::sample::Sampler;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// The entries with an MTP head.
const HEADS: [&str; 4] =
    ["qwen3.5-builder-fp32", "qwen3.5-builder-int4", "qwen3.5-moe-builder-fp32", "qwen3.5-moe-builder-int4"];

/// Relative to the largest |expected| value; as `hybrid_run.rs` holds the decoder's logits.
const FLOAT_TOL: f64 = 1e-4;
const LEVEL4_TOL: f64 = 1e-2;

fn tol(name: &str) -> f64 {
    if name.ends_with("int4") {
        LEVEL4_TOL
    } else {
        FLOAT_TOL
    }
}

fn options() -> ExecOptions {
    ExecOptions { max_context: 64, ..ExecOptions::default() }
}

/// A case's tensors by name, as f32.
fn case(dir: &Path, case: &str) -> (HashMap<String, Vec<f32>>, HashMap<String, Vec<f32>>) {
    let (inputs, outputs) = frontend::read_test_case(&dir.join(case)).unwrap();
    let inputs = inputs.iter().map(|(n, t)| (n.clone(), t.to_f64_vec().iter().map(|&v| v as f32).collect()));
    let outputs = outputs.iter().map(|(n, t)| (n.clone(), t.to_f64_vec().iter().map(|&v| v as f32).collect()));
    (inputs.collect(), outputs.collect())
}

fn token_ids(values: &[f32]) -> Vec<u32> {
    values.iter().map(|&v| v as u32).collect()
}

/// The weights a program reads, by name.
fn weight_names(program: &runtime::bundle::Program) -> Vec<String> {
    let weight = |v: &runtime::bundle::program::Value| match &v.def {
        runtime::bundle::program::ValueDef::Weight(name) => Some(name.clone()),
        _ => None,
    };
    program.values.iter().filter_map(weight).collect()
}

#[test]
fn the_bundle_carries_the_head_beside_the_decoder_sharing_its_embedding_and_lm_head() {
    let tmp = tempfile::tempdir().unwrap();
    for name in HEADS {
        let bundle = Bundle::open(compile(name, tmp.path()).unwrap(), Some("cpu")).unwrap();
        let drafter = bundle.drafter().unwrap_or_else(|| panic!("{name}: the bundle carries no drafter"));
        assert_eq!(drafter.kind, DrafterKind::Mtp);
        let (decoder, head) = (weight_names(bundle.program()), weight_names(&drafter.program));
        let shared: Vec<&String> = head.iter().filter(|w| decoder.contains(w)).collect();
        assert!(shared.iter().any(|w| w.contains("embed_tokens")), "{name}: shared {shared:?}");
        assert!(shared.iter().any(|w| w.contains("lm_head")), "{name}: shared {shared:?}");
        let renamed: Vec<&String> = head.iter().filter(|w| w.starts_with("mtp/")).collect();
        assert!(!renamed.is_empty(), "{name}: the head's layer reuses the decoder's names");
        for w in renamed {
            assert!(decoder.contains(&w["mtp/".len()..].to_string()), "{name}: `{w}` was renamed without a clash");
        }
        let outputs = &bundle.program().outputs;
        assert!(outputs.iter().any(|&v| bundle.program().values[v].name == "hidden_states"), "{name}");
    }
}

#[test]
fn without_the_drafter_the_bundle_has_no_head_and_speculate_mtp_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let model = hybrid_dir().join("qwen3.5-builder-fp32").join("model.onnx");
    let out = tmp.path().join("plain.npub");
    let npuc = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_npuc")).args(args).output().unwrap();
    let compiled = npuc(&["compile", model.to_str().unwrap(), "--no-drafter", "-o", out.to_str().unwrap()]);
    assert!(compiled.status.success(), "{}", String::from_utf8_lossy(&compiled.stderr));
    assert!(String::from_utf8_lossy(&compiled.stdout).contains("not compiled: --no-drafter"));
    let bundle = Bundle::open(&out, Some("cpu")).unwrap();
    assert!(bundle.drafter().is_none());
    let program = bundle.program();
    assert!(program.outputs.iter().all(|&v| program.values[v].name != "hidden_states"));
    let run = npuc(&["run", out.to_str().unwrap(), "--prompt-ids", "1,2,3", "--speculate", "mtp", "--max-tokens", "4"]);
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("carries no drafter program"));
}

#[test]
fn the_decoders_hidden_states_and_the_heads_outputs_are_onnx_runtimes() {
    let tmp = tempfile::tempdir().unwrap();
    for name in HEADS {
        let dir = hybrid_dir().join(name);
        let bundle = Bundle::open(compile(name, tmp.path()).unwrap(), Some("cpu")).unwrap();
        let (inputs, outputs) = case(&dir, "prefill");
        let mut decoder = Executor::new(&bundle, options()).unwrap();
        let prompt = token_ids(&inputs["input_ids"]);
        // These decoders feed the lm_head before the last MLP: the hidden states alone need it,
        // and a step skips it unless asked for them.
        let plain = decoder.step(&prompt).unwrap().to_vec();
        assert!(decoder.hidden_rows().is_none(), "{name}");
        decoder.reset().unwrap();
        decoder.set_hidden_output(true);
        assert_eq!(decoder.step(&prompt).unwrap(), plain, "{name}: the logits do not depend on the hidden states");
        let e = relative_error(decoder.hidden_rows().unwrap(), &outputs["hidden_states"]);
        assert!(e <= tol(name), "{name}: decoder hidden states {e:e}");
        let mut report = format!("{name}: decoder hidden states {e:.1e}");
        let mut head = Executor::new_drafter(&bundle, options()).unwrap();
        let seq = head.default_sequence();
        for step in ["mtp", "mtp_decode"] {
            let (inputs, outputs) = case(&dir, step);
            let logits =
                head.step_sequence_hidden(seq, &token_ids(&inputs["input_ids"]), &inputs["hidden_states"]).unwrap();
            let want = &outputs["logits"];
            let e = relative_error(logits, &want[want.len() - logits.len()..]);
            assert!(e <= tol(name), "{name} {step}: logits {e:e}");
            let h = relative_error(head.hidden_rows().unwrap(), &outputs["hidden_states_out"]);
            assert!(h <= tol(name), "{name} {step}: hidden_states_out {h:e}");
            report += &format!("; {step}: logits {e:.1e}, hidden states {h:.1e}");
        }
        eprintln!("{report}");
    }
}

/// Records the first draft the MTP head makes at each decoder position; with `oracle`, hands
/// the verify step the greedy continuation instead of the head's drafts, so that drafts are kept.
struct Recording<'b, 'o> {
    head: MtpDrafter<'b>,
    first_drafts: Vec<(usize, u32)>,
    oracle: Option<&'o [u32]>,
}

impl Drafter for Recording<'_, '_> {
    fn draft(&mut self, history: &[u32]) -> Vec<u32> {
        let drafts = self.head.draft(history);
        if let Some(&first) = drafts.first() {
            self.first_drafts.push((history.len() - 1, first));
        }
        match self.oracle {
            Some(full) => full[history.len()..(history.len() + drafts.len()).min(full.len())].to_vec(),
            None => drafts,
        }
    }
    fn max_draft(&self) -> usize {
        self.head.max_draft()
    }
    fn wants_hidden(&self) -> bool {
        self.head.wants_hidden()
    }
    fn keep_hidden(&mut self, hidden: &[f32], rows: usize) {
        self.head.keep_hidden(hidden, rows)
    }
}

#[test]
fn the_heads_drafts_are_onnx_runtimes_and_speculation_keeps_greedy_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let entries = index();
    for name in HEADS {
        let entry = entries.iter().find(|e| e["name"] == name).unwrap();
        let (case, reference) = (&entry["cases"][0], ids(&entry["mtp"], "drafts"));
        let (prompt, greedy) = (ids(case, "prompt_ids"), ids(case, "greedy_ids"));
        let full: Vec<u32> = prompt.iter().chain(&greedy).copied().collect();
        let bundle = Bundle::open(compile(name, tmp.path()).unwrap(), Some("cpu")).unwrap();
        for (draft_len, oracle) in [(1, false), (3, false), (2, true), (3, true)] {
            let head = MtpDrafter::new(Executor::new_drafter(&bundle, options()).unwrap(), draft_len).unwrap();
            let mut d = Recording { head, first_drafts: Vec::new(), oracle: oracle.then_some(&full[..]) };
            let mut exec = Executor::new(&bundle, options()).unwrap();
            let mut sampler = Sampler::greedy();
            let (got, _, spec) =
                exec.generate_speculative(&prompt, greedy.len(), &[], &mut d, &mut sampler, |_| {}).unwrap();
            let what = format!("{name}, draft length {draft_len}, oracle {oracle}");
            assert!(d.head.take_error().is_none(), "{what}");
            greedy_agrees(&got, case).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(spec.accepted > 0, oracle, "{what}: {spec:?}");
            assert!(d.first_drafts.len() >= if oracle { 3 } else { reference.len() }, "{what}: {:?}", d.first_drafts);
            for &(decoded, first) in &d.first_drafts {
                let want = reference[decoded - prompt.len()];
                assert_eq!(first, want, "{what}: the draft after position {decoded}");
            }
        }
    }
}
