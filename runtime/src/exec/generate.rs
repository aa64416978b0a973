//! The generation loops: one sequence ([`Executor::generate`]) or several prompts as interleaved
//! sequences of one KV pool ([`Executor::generate_many`]), with their timings.

use std::time::Instant;

use super::error::ExecError;
use super::Executor;
use crate::kvcache::SeqId;
use crate::sample::Sampler;

/// Timings of one [`Executor::generate_greedy`] call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    /// Tokens generated (the stop token included when one ended generation).
    pub generated_tokens: usize,
    /// Prefill and the first token's logits.
    pub prefill_ms: f64,
    /// Every decode step after the first generated token.
    pub decode_ms: f64,
}

impl GenerateStats {
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_ms)
    }

    /// Decode steps (generated tokens after the first) per second.
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.decode_ms)
    }
}

fn rate(tokens: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        tokens as f64 * 1000.0 / ms
    } else {
        0.0
    }
}

/// One sequence of [`Executor::generate_many`].
#[derive(Debug, Default)]
pub struct SequenceOutput {
    /// Tokens generated (the stop token included when one ended generation).
    pub tokens: Vec<u32>,
    /// `prefill_ms` is this sequence's prefill; `decode_ms` the sum of its own decode steps.
    pub stats: GenerateStats,
    /// Prompt tokens whose KV pages were shared with an earlier sequence instead of computed.
    pub shared_prefix_tokens: usize,
    /// Why the sequence stopped early, if it did.
    pub error: Option<ExecError>,
}

/// The index of the largest logit (the first of equal ones; NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

impl Executor<'_> {
    /// Greedy decoding: [`Executor::generate`] with a greedy [`Sampler`].
    pub fn generate_greedy(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        stop: &[u32],
        on_token: impl FnMut(u32),
    ) -> Result<(Vec<u32>, GenerateStats), ExecError> {
        self.generate(prompt, max_new, stop, &mut Sampler::greedy(), on_token)
    }

    /// Prefills `prompt` on the default sequence, then appends the token `sampler` chooses until
    /// one of `stop` is generated (it is included) or `max_new` tokens are. `on_token` sees each
    /// token as it is chosen. Starts from the current position (call [`Executor::reset`] for a
    /// new sequence).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        stop: &[u32],
        sampler: &mut Sampler,
        mut on_token: impl FnMut(u32),
    ) -> Result<(Vec<u32>, GenerateStats), ExecError> {
        let mut stats = GenerateStats { prompt_tokens: prompt.len(), ..GenerateStats::default() };
        let mut generated = Vec::with_capacity(max_new);
        if max_new == 0 {
            return Ok((generated, stats));
        }
        let start = Instant::now();
        let mut next = sampler.sample(self.step(prompt)?);
        stats.prefill_ms = start.elapsed().as_secs_f64() * 1000.0;
        let decode_start = Instant::now();
        loop {
            generated.push(next);
            on_token(next);
            if generated.len() >= max_new || stop.contains(&next) {
                break;
            }
            next = sampler.sample(self.step(&[next])?);
        }
        stats.decode_ms = decode_start.elapsed().as_secs_f64() * 1000.0;
        stats.generated_tokens = generated.len();
        Ok((generated, stats))
    }

    /// Generates for several prompts as concurrent sequences of one KV pool: every prompt is
    /// prefilled in turn, then the live sequences take one decode step each, round after round,
    /// until each has met a stop token or `max_new` tokens. Prompt `i` samples with
    /// `samplers[i]`, and `on_token(i, token)` sees its tokens as they are chosen.
    ///
    /// A prompt that begins like an earlier one shares that one's pages for the whole pages of
    /// the common prefix (leaving at least its last token to run), so its prefill runs only the
    /// rest and nothing is copied. A sequence whose step fails (an exhausted pool, a full
    /// context) ends with that error and its pages are released; the others go on. Sequences
    /// are dropped at the end; the default sequence is not touched.
    pub fn generate_many(
        &mut self,
        prompts: &[Vec<u32>],
        max_new: usize,
        stop: &[u32],
        samplers: &mut [Sampler],
        mut on_token: impl FnMut(usize, u32),
    ) -> Vec<SequenceOutput> {
        assert_eq!(prompts.len(), samplers.len(), "one sampler per prompt");
        let page_rows = self.cache.config().page_rows;
        let mut outs: Vec<SequenceOutput> = prompts
            .iter()
            .map(|p| SequenceOutput {
                stats: GenerateStats { prompt_tokens: p.len(), ..GenerateStats::default() },
                ..SequenceOutput::default()
            })
            .collect();
        let mut seqs: Vec<Option<SeqId>> = vec![None; prompts.len()];
        let mut next = vec![0u32; prompts.len()];
        if max_new == 0 {
            return outs;
        }
        // A sequence's recurrent state holds its last position only: no prefix to share.
        let shareable = !self.has_recurrent_state();
        for (i, prompt) in prompts.iter().enumerate() {
            // The earlier live sequence with the longest common prefix, in whole pages.
            let source = (0..i)
                .filter_map(|j| {
                    let common = prompts[j].iter().zip(prompt).take_while(|(a, b)| a == b).count();
                    let rows = common.min(prompt.len().saturating_sub(1)) / page_rows * page_rows;
                    seqs[j].filter(|_| rows > 0 && shareable).map(|s| (rows, s))
                })
                .max_by_key(|&(rows, _)| rows);
            let start = Instant::now();
            let result = (|| {
                let (seq, shared) = match source {
                    Some((rows, parent)) => (self.fork_sequence(parent, rows)?, rows),
                    None => (self.new_sequence(), 0),
                };
                seqs[i] = Some(seq);
                outs[i].shared_prefix_tokens = shared;
                let logits = self.step_sequence(seq, &prompt[shared..])?;
                Ok(samplers[i].sample(logits))
            })();
            outs[i].stats.prefill_ms = start.elapsed().as_secs_f64() * 1000.0;
            match result {
                Ok(token) => next[i] = token,
                Err(e) => self.end_with_error(&mut seqs[i], &mut outs[i], e),
            }
        }
        while seqs.iter().any(Option::is_some) {
            for i in 0..prompts.len() {
                let Some(seq) = seqs[i] else { continue };
                let token = next[i];
                outs[i].tokens.push(token);
                on_token(i, token);
                if outs[i].tokens.len() >= max_new || stop.contains(&token) {
                    outs[i].stats.generated_tokens = outs[i].tokens.len();
                    let _ = self.drop_sequence(seq);
                    seqs[i] = None;
                    continue;
                }
                let start = Instant::now();
                let result = self.step_sequence(seq, &[token]).map(|logits| samplers[i].sample(logits));
                outs[i].stats.decode_ms += start.elapsed().as_secs_f64() * 1000.0;
                match result {
                    Ok(t) => next[i] = t,
                    Err(e) => self.end_with_error(&mut seqs[i], &mut outs[i], e),
                }
            }
        }
        outs
    }

    fn end_with_error(&mut self, seq: &mut Option<SeqId>, out: &mut SequenceOutput, error: ExecError) {
        if let Some(s) = seq.take() {
            let _ = self.drop_sequence(s);
        }
        out.stats.generated_tokens = out.tokens.len();
        out.error = Some(error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_of_equal_logits() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 1);
    }
}
