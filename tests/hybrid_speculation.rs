//! Speculative decoding on the hybrid corpus (`fixtures/hybrid`): a verify step keeps the
//! recurrent state after each of its rows, and truncating to a row puts that state back.
//!
//! - Rewinding: a sequence stepped over a verify block then truncated holds the recurrent state
//!   and KV rows of a sequence that only ever saw the kept tokens, bit for bit (asserted on the
//!   states themselves and on the logits of the steps after), and a fork inside the block starts
//!   from that row's state.
//! - Greedy speculation gives plain greedy's tokens on every hybrid bundle the executor runs
//!   (Qwen3.5, Qwen3.5-MoE, LFM2, LFM2-MoE, fp32 and int4; gpt-oss fp32), over a prompt that repeats itself and
//!   one that does not; across them drafts are both kept and rejected.

mod common;

use common::hybrid::compile;

use runtime::bundle::Bundle;
use runtime::exec::{ExecOptions, Executor, PromptLookup};
use runtime::sample::Sampler;

/// The entries the executor runs (the builder refuses gpt-oss's int4).
const RUNNABLE: [&str; 9] = [
    "qwen3.5-builder-fp32",
    "qwen3.5-builder-int4",
    "qwen3.5-moe-builder-fp32",
    "qwen3.5-moe-builder-int4",
    "lfm2-builder-fp32",
    "lfm2-builder-int4",
    "lfm2-moe-builder-fp32",
    "lfm2-moe-builder-int4",
    "gpt-oss-builder-fp32",
];

/// `n` token ids from a small linear congruence (below 256: every tiny vocabulary holds them).
fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (seed.wrapping_mul(97).wrapping_add(i * 31 + 7)) % 251 + 1).collect()
}

/// A verify block of 5 rows truncated to its first 2 leaves the state, the KV rows and so the
/// logits after of a sequence that stepped those 2 tokens alone; a fork at row 3 starts from
/// row 3's state; the truncation copies nothing; outside the block a rewind is refused.
#[test]
fn truncating_a_verify_block_puts_back_the_state_after_the_kept_rows() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["qwen3.5-builder-fp32", "lfm2-moe-builder-int4"] {
        let bundle_dir = compile(name, tmp.path()).unwrap();
        let bundle = Bundle::open(&bundle_dir, Some("cpu")).unwrap();
        let options = ExecOptions { max_context: 64, sequences: 4, ..ExecOptions::default() };
        let mut exec = Executor::new(&bundle, options).unwrap();
        let (p, block) = (tokens(9, 1), tokens(5, 2));
        let (spec, plain, three) = (exec.new_sequence(), exec.new_sequence(), exec.new_sequence());
        for seq in [spec, plain, three] {
            exec.step_sequence(seq, &p).unwrap();
        }
        exec.step_sequence_rows(spec, &block).unwrap();
        let fork = exec.fork_sequence(spec, p.len() + 3).unwrap();
        exec.truncate_sequence(spec, p.len() + 2).unwrap();
        assert_eq!(exec.sequence_position(spec).unwrap(), p.len() + 2);
        let traffic = exec.cache().sequence_stats(spec).unwrap().traffic;
        assert!(traffic.copied_bytes == 0 && traffic.truncated_bytes > 0, "{name}: {traffic:?}");
        for &t in &block[..2] {
            exec.step_sequence(plain, &[t]).unwrap();
        }
        for &t in &block[..3] {
            exec.step_sequence(three, &[t]).unwrap();
        }
        let state = |exec: &Executor, seq| exec.sequence_state(seq).unwrap().to_vec();
        assert!(state(&exec, spec) == state(&exec, plain), "{name}: state after the rollback differs");
        assert!(state(&exec, fork) == state(&exec, three), "{name}: a fork inside the block has another state");
        assert!(state(&exec, spec) != state(&exec, three), "{name}: rows 2 and 3 must differ to tell them apart");
        for t in tokens(4, 3) {
            let a = exec.step_sequence(spec, &[t]).unwrap().to_vec();
            let b = exec.step_sequence(plain, &[t]).unwrap().to_vec();
            assert!(a == b, "{name}: logits after the rollback differ from a run without the rejected rows");
            let c = exec.step_sequence(fork, &[t]).unwrap().to_vec();
            let d = exec.step_sequence(three, &[t]).unwrap().to_vec();
            assert!(c == d, "{name}: logits of the fork differ from a run of its 3 rows");
        }
        // The block's rows are gone once the sequence steps on.
        let held = exec.sequence_position(spec).unwrap();
        assert!(exec.truncate_sequence(spec, held - 1).is_err(), "{name}: rewound outside a verify block");
    }
}

/// Greedy with prompt-lookup speculation gives plain greedy's tokens on every runnable bundle.
#[test]
fn speculative_greedy_gives_the_tokens_of_greedy_on_hybrids() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut accepted, mut rejected) = (0, 0);
    for name in RUNNABLE {
        let bundle_dir = compile(name, tmp.path()).unwrap();
        let bundle = Bundle::open(&bundle_dir, Some("cpu")).unwrap();
        let mut exec = Executor::new(&bundle, ExecOptions { max_context: 96, ..ExecOptions::default() }).unwrap();
        let phrase = tokens(6, 4);
        for p in [[&phrase[..], &phrase[..], &phrase[..3]].concat(), tokens(17, 5)] {
            exec.reset().unwrap();
            let (plain, _) = exec.generate_greedy(&p, 24, &[], |_| {}).unwrap();
            exec.reset().unwrap();
            let mut drafter = PromptLookup::new(3, 1, 4);
            let (spec, _, s) =
                exec.generate_speculative(&p, 24, &[], &mut drafter, &mut Sampler::greedy(), |_| {}).unwrap();
            assert_eq!(spec, plain, "{name}: speculative greedy differs from greedy");
            accepted += s.accepted;
            rejected += s.drafted - s.accepted;
        }
    }
    assert!(accepted > 0 && rejected > 0, "drafts kept {accepted}, rejected {rejected}: both paths must run");
}
