//! Speculative decoding: drafted tokens verified several at a time, with exact rollback.
//!
//! Decoding reads every weight once per step; a step over several rows reads them once too. A
//! [`Drafter`] guesses the next tokens, one verify step scores the pending token and every draft
//! ([`Executor::step_sequence_rows`]), and drafts are tested in order against the row before
//! each ([`Sampler::verify_draft`]): greedy keeps a draft equal to the row's argmax; sampling
//! keeps draft `d` with probability p(d) and otherwise draws from p without `d`, the
//! speculative-sampling rule for a drafter that proposes one token, so every position has plain
//! sampling's distribution. The first rejection gives the replacement; when every draft is kept,
//! the last row gives the next token. Rejected rows leave the cache by truncating the
//! sequence's page tables ([`Executor::truncate_sequence`]: no copy); a hybrid decoder's
//! recurrent state goes back to the state the verify step kept after the last kept row. The verify rows equal
//! single steps bit for bit, so greedy speculation gives plain greedy's tokens.
//!
//! The loop ([`generate_speculative`]) runs on any [`VerifyBackend`]: the host executor, or
//! OpenVINO (`runtime::openvino::OvSession`), whose verify steps run in the bundle's static verify
//! blocks, so drafts there are at most the largest verify block − 1 tokens.
//!
//! [`PromptLookup`] drafts the tokens that followed the latest earlier occurrence of the text's
//! last n-gram (the prompt and what was generated): free, and right where output repeats input
//! (summaries, edits, code).

use std::time::Instant;

use super::error::ExecError;
use super::generate::GenerateStats;
use super::Executor;
use crate::sample::Sampler;

/// Proposes the tokens that may come next, from the text so far (prompt and generated tokens).
pub trait Drafter {
    /// Up to [`Drafter::max_draft`] tokens guessed to follow `history`; empty for no guess.
    fn draft(&mut self, history: &[u32]) -> Vec<u32>;
    /// The most tokens one draft holds.
    fn max_draft(&self) -> usize;
    /// What the verify step made of the last draft: `accepted` of its `drafted` tokens kept.
    fn observe(&mut self, drafted: usize, accepted: usize) {
        let _ = (drafted, accepted);
    }
    /// Whether drafts read the decoder's hidden states (an MTP head): the loop then hands over
    /// the rows the decoder keeps from each step ([`Drafter::keep_hidden`]).
    fn wants_hidden(&self) -> bool {
        false
    }
    /// The decoder's hidden states from its last step ([`VerifyBackend::hidden_rows`]), of which
    /// the first `rows` rows are kept (the prompt's, or the pending token's and the kept drafts').
    fn keep_hidden(&mut self, hidden: &[f32], rows: usize) {
        let _ = (hidden, rows);
    }
}

/// Drafts by n-gram lookup in the text so far, as long as drafts are kept: after a rejection the
/// next draft is one token longer than what was kept, after a draft kept whole one token longer
/// than it, up to `draft_len`. A verify row costs more than nothing (attention, the norms, the
/// lm_head's products), so where the text does not repeat, drafts shrink to one token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// The longest n-gram matched; shorter ones are tried down to `min_ngram`.
    pub ngram: usize,
    pub min_ngram: usize,
    /// Tokens drafted per verify step at most.
    pub draft_len: usize,
    /// Tokens the next draft may hold.
    length: usize,
}

impl Default for PromptLookup {
    fn default() -> PromptLookup {
        PromptLookup::new(3, 1, 4)
    }
}

impl Drafter for PromptLookup {
    fn draft(&mut self, history: &[u32]) -> Vec<u32> {
        let mut draft = self.lookup(history);
        draft.truncate(self.length);
        draft
    }

    fn max_draft(&self) -> usize {
        self.draft_len
    }

    fn observe(&mut self, drafted: usize, accepted: usize) {
        if drafted > 0 {
            self.length = (accepted + 1).min(self.draft_len);
        }
    }
}

impl PromptLookup {
    /// Matches n-grams of `min_ngram..=ngram` tokens; drafts up to `draft_len` tokens.
    pub fn new(ngram: usize, min_ngram: usize, draft_len: usize) -> PromptLookup {
        PromptLookup { ngram, min_ngram: min_ngram.max(1), draft_len, length: draft_len }
    }

    /// The tokens that followed the latest earlier occurrence of `history`'s last n-gram, for the
    /// longest n that occurs (`draft_len` at most); empty when none does.
    pub fn lookup(&self, history: &[u32]) -> Vec<u32> {
        for n in (self.min_ngram..=self.ngram.min(history.len().saturating_sub(1))).rev() {
            let tail = &history[history.len() - n..];
            let found = (0..history.len() - n).rev().find(|&s| &history[s..s + n] == tail);
            if let Some(start) = found {
                let from = start + n;
                return history[from..(from + self.draft_len).min(history.len())].to_vec();
            }
        }
        Vec::new()
    }
}

/// What speculation did over one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    /// Verify steps after the prefill: weight passes of decoding.
    pub verify_steps: usize,
    pub drafted: usize,
    pub accepted: usize,
}

impl SpeculationStats {
    /// Drafts kept, of those verified.
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// What speculative decoding needs of a backend: a step over the prompt that gives the last
/// row's logits, a verify step over a block that gives every row's, truncation back to a
/// position, and the sizes that bound a draft. [`Executor`] and the `openvino` backend's
/// `OvSession` implement it; [`generate_speculative`] decodes on either.
pub trait VerifyBackend {
    type Error;
    /// Runs `tokens` at the next positions and returns the logits of the last one.
    fn step_last(&mut self, tokens: &[u32]) -> Result<&[f32], Self::Error>;
    /// Runs `tokens` at the next positions and returns every one's logits, `[tokens, vocab]`.
    fn step_every_row(&mut self, tokens: &[u32]) -> Result<&[f32], Self::Error>;
    /// Keeps the first `tokens` tokens and forgets the rest.
    fn truncate(&mut self, tokens: usize) -> Result<(), Self::Error>;
    /// Tokens held.
    fn position(&self) -> usize;
    /// Most tokens held.
    fn max_context(&self) -> usize;
    /// Width of a row of logits.
    fn vocab(&self) -> usize;
    /// Most rows one verify step holds (the pending token and its drafts).
    fn max_verify_rows(&self) -> usize;
    /// The hidden states every row of the last step computed (a decoder with an MTP head), or
    /// `None`.
    fn hidden_rows(&self) -> Option<&[f32]> {
        None
    }
    /// Makes steps compute what [`VerifyBackend::hidden_rows`] returns (a drafter reads it).
    fn compute_hidden(&mut self, on: bool) {
        let _ = on;
    }
}

impl VerifyBackend for Executor<'_> {
    type Error = ExecError;

    fn step_last(&mut self, tokens: &[u32]) -> Result<&[f32], ExecError> {
        self.step(tokens)
    }

    fn step_every_row(&mut self, tokens: &[u32]) -> Result<&[f32], ExecError> {
        self.step_sequence_rows(self.default_sequence(), tokens)
    }

    fn truncate(&mut self, tokens: usize) -> Result<(), ExecError> {
        self.truncate_sequence(self.default_sequence(), tokens)
    }

    fn position(&self) -> usize {
        Executor::position(self)
    }

    fn max_context(&self) -> usize {
        Executor::max_context(self)
    }

    fn vocab(&self) -> usize {
        Executor::vocab(self)
    }

    /// The host's verify step is a step of any length.
    fn max_verify_rows(&self) -> usize {
        usize::MAX
    }

    fn hidden_rows(&self) -> Option<&[f32]> {
        Executor::hidden_rows(self)
    }

    fn compute_hidden(&mut self, on: bool) {
        self.set_hidden_output(on);
    }
}

impl Executor<'_> {
    /// Decoding of the default sequence as [`Executor::generate`] does it with `sampler` — the
    /// same tokens when greedy, the same distribution when sampled — verifying `drafter`'s
    /// drafts several at a time ([`generate_speculative`]).
    pub fn generate_speculative(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        stop: &[u32],
        drafter: &mut dyn Drafter,
        sampler: &mut Sampler,
        on_token: impl FnMut(u32),
    ) -> Result<(Vec<u32>, GenerateStats, SpeculationStats), ExecError> {
        generate_speculative(self, prompt, max_new, stop, drafter, sampler, on_token)
    }
}

/// Prefills `prompt` on `backend`, then decodes as plain sampling with `sampler` would — the
/// same tokens when greedy, the same distribution when sampled — verifying `drafter`'s drafts
/// several at a time, until `max_new` tokens or a `stop` token (included). A draft is at most
/// [`VerifyBackend::max_verify_rows`] − 1 tokens.
pub fn generate_speculative<B: VerifyBackend + ?Sized>(
    backend: &mut B,
    prompt: &[u32],
    max_new: usize,
    stop: &[u32],
    drafter: &mut dyn Drafter,
    sampler: &mut Sampler,
    mut on_token: impl FnMut(u32),
) -> Result<(Vec<u32>, GenerateStats, SpeculationStats), B::Error> {
    let mut stats = GenerateStats { prompt_tokens: prompt.len(), ..GenerateStats::default() };
    let mut spec = SpeculationStats::default();
    let mut generated: Vec<u32> = Vec::with_capacity(max_new);
    if max_new == 0 {
        return Ok((generated, stats, spec));
    }
    backend.compute_hidden(drafter.wants_hidden());
    let start = Instant::now();
    let mut history = prompt.to_vec();
    let mut pending = sampler.sample(backend.step_last(prompt)?);
    hand_hidden(backend, drafter, prompt.len());
    stats.prefill_ms = start.elapsed().as_secs_f64() * 1000.0;
    let decode_start = Instant::now();
    let mut emit = |token: u32, generated: &mut Vec<u32>, history: &mut Vec<u32>| {
        generated.push(token);
        history.push(token);
        on_token(token);
        generated.len() >= max_new || stop.contains(&token)
    };
    while !emit(pending, &mut generated, &mut history) {
        // The block (pending and drafts) must fit the context and the backend's verify step;
        // drafts past `max_new` are waste.
        let room = (max_new - generated.len()).min(backend.max_context().saturating_sub(backend.position() + 1));
        let longest = drafter.max_draft().min(backend.max_verify_rows().saturating_sub(1));
        let mut drafts = drafter.draft(&history);
        drafts.truncate(room.min(longest));
        let (accepted, next) = verify(backend, pending, &drafts, sampler)?;
        hand_hidden(backend, drafter, accepted + 1);
        drafter.observe(drafts.len(), accepted);
        spec.verify_steps += 1;
        spec.drafted += drafts.len();
        spec.accepted += accepted;
        pending = next;
        if drafts[..accepted].iter().any(|&t| emit(t, &mut generated, &mut history)) {
            break;
        }
    }
    stats.decode_ms = decode_start.elapsed().as_secs_f64() * 1000.0;
    stats.generated_tokens = generated.len();
    backend.compute_hidden(false);
    Ok((generated, stats, spec))
}

/// Gives a drafter that reads hidden states the first `rows` rows of the backend's last step.
fn hand_hidden<B: VerifyBackend + ?Sized>(backend: &B, drafter: &mut dyn Drafter, rows: usize) {
    if drafter.wants_hidden() {
        drafter.keep_hidden(backend.hidden_rows().unwrap_or_default(), rows);
    }
}

/// One verify step over `pending` and `drafts`: how many drafts `sampler` keeps, testing each
/// against the row before it, and the token after the last one kept. The backend keeps `pending`
/// and the kept drafts.
fn verify<B: VerifyBackend + ?Sized>(
    backend: &mut B,
    pending: u32,
    drafts: &[u32],
    sampler: &mut Sampler,
) -> Result<(usize, u32), B::Error> {
    let kept_before = backend.position();
    let mut block = Vec::with_capacity(drafts.len() + 1);
    block.push(pending);
    block.extend_from_slice(drafts);
    let vocab = backend.vocab();
    let rows = backend.step_every_row(&block)?;
    let mut rows = rows.chunks_exact(vocab);
    let mut accepted = 0;
    let mut next = None;
    for (&draft, row) in drafts.iter().zip(rows.by_ref()) {
        next = sampler.verify_draft(row, draft);
        if next.is_some() {
            break;
        }
        accepted += 1;
    }
    let next = match next {
        Some(token) => token,
        None => sampler.sample(rows.next().expect("a row after the last draft")),
    };
    backend.truncate(kept_before + 1 + accepted)?;
    Ok((accepted, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_shrink_after_a_rejection_and_grow_while_kept() {
        let mut d = PromptLookup::new(2, 1, 4);
        let text = [1, 2, 3, 4, 5, 6, 7, 1, 2];
        assert_eq!(d.draft(&text), [3, 4, 5, 6]);
        d.observe(4, 1);
        assert_eq!(d.draft(&text), [3, 4], "one longer than what was kept");
        d.observe(2, 0);
        assert_eq!(d.draft(&text), [3]);
        d.observe(1, 1);
        d.observe(2, 2);
        assert_eq!(d.draft(&text), [3, 4, 5], "one longer than a draft kept whole");
        d.observe(0, 0);
        assert_eq!(d.draft(&text).len(), 3, "no draft, no change");
        // A minimum n-gram of 2 ignores a lone repeated token.
        assert_eq!(PromptLookup::new(3, 2, 4).lookup(&[5, 9, 8, 7, 5]), Vec::<u32>::new());
        assert_eq!(PromptLookup::new(3, 1, 4).lookup(&[5, 9, 8, 7, 5]), [9, 8, 7, 5]);
    }

    #[test]
    fn lookup_drafts_what_followed_the_latest_longest_match() {
        let d = PromptLookup::new(3, 1, 3);
        // "5 6" last occurred followed by 9 1 2; the 3-gram "4 5 6" never occurred before.
        assert_eq!(d.lookup(&[5, 6, 7, 8, 5, 6, 9, 1, 2, 4, 5, 6]), [9, 1, 2]);
        // A 3-gram match wins over a later 1-gram match.
        assert_eq!(d.lookup(&[1, 2, 3, 7, 7, 3, 8, 1, 2, 3]), [7, 7, 3]);
        // The continuation stops at the end of the text.
        assert_eq!(d.lookup(&[4, 2, 4]), [2, 4]);
        assert_eq!(d.lookup(&[1, 2, 3]), Vec::<u32>::new());
        assert_eq!(d.lookup(&[]), Vec::<u32>::new());
    }
}
