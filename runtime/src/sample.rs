//! Choosing the next token from a row of logits: greedy, or sampled with temperature, top-k and
//! top-p (nucleus) filtering from a seeded generator of our own, so that one seed always gives
//! the same tokens on every machine.
//!
//! With temperature `T > 0` the candidates are the `top_k` largest logits (all when `top_k` is
//! 0), in decreasing order (ties by lower token id), with probabilities `softmax(logit / T)` over
//! the candidates; top-p then keeps the shortest head of that list whose mass reaches `top_p`
//! (at least one token) and renormalises. One uniform draw picks a token by walking the
//! cumulative mass. Temperature 0 is greedy: [`argmax`](crate::exec::argmax), the first of equal
//! logits, and the generator is not used. NaN logits are never chosen.

use crate::exec::argmax;

/// How the next token is chosen. The default is greedy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the most likely tokens whose mass reaches `top_p` (in (0, 1]); 1 keeps all.
    pub top_p: f32,
    /// Seed of the generator.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl SamplingParams {
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Refuses a negative or non-finite temperature and a `top_p` outside (0, 1].
    pub fn validate(&self) -> Result<(), SampleError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SampleError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SampleError::TopP(self.top_p));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SampleError {
    #[error("temperature {0} is not a finite number ≥ 0 (0 is greedy)")]
    Temperature(f32),
    #[error("top-p {0} is outside (0, 1]")]
    TopP(f32),
}

/// xoshiro256** seeded through SplitMix64: small, fast, and the same sequence everywhere.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng { s: [next(), next(), next(), next()] }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A token chooser with its generator and reused candidate buffers (sampling allocates nothing
/// once the buffers have grown to the vocabulary).
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler, SampleError> {
        params.validate()?;
        Ok(Sampler { params, rng: Rng::new(params.seed), candidates: Vec::new() })
    }

    pub fn greedy() -> Sampler {
        Sampler::new(SamplingParams::default()).expect("the default parameters are valid")
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token for `logits` (see the module documentation).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let mut candidates = std::mem::take(&mut self.candidates);
        distribution(logits, &self.params, &mut candidates);
        let token = match candidates.as_slice() {
            [] => argmax(logits),
            [(t, _)] => *t,
            list => {
                let u = self.rng.next_f64();
                let mut cumulative = 0.0f64;
                let mut chosen = list[list.len() - 1].0;
                for &(t, p) in list {
                    cumulative += f64::from(p);
                    if u < cumulative {
                        chosen = t;
                        break;
                    }
                }
                chosen
            }
        };
        self.candidates = candidates;
        token
    }
}

impl Sampler {
    /// Speculative sampling's test of a drafted token, for a drafter that proposes one token
    /// with certainty: `None` keeps `draft` (with probability p(draft) under this sampler's
    /// distribution for `logits`), `Some(t)` rejects it and gives `t` drawn from that
    /// distribution with `draft` removed and the rest renormalised. Over the coin and the
    /// replacement draw, the token that ends up at this position is distributed exactly as
    /// [`Sampler::sample`]'s — whatever the drafter proposes. Greedy parameters keep the draft
    /// when it is the argmax and otherwise give the argmax, drawing nothing.
    pub fn verify_draft(&mut self, logits: &[f32], draft: u32) -> Option<u32> {
        let mut candidates = std::mem::take(&mut self.candidates);
        distribution(logits, &self.params, &mut candidates);
        let p = candidates.iter().find(|c| c.0 == draft).map_or(0.0, |c| f64::from(c.1));
        let verdict = if candidates.is_empty() {
            Some(argmax(logits))
        } else if p >= 1.0 || (p > 0.0 && self.rng.next_f64() < p) {
            None
        } else {
            Some(self.draw_without(&candidates, draft, 1.0 - p))
        };
        self.candidates = candidates;
        verdict
    }

    /// A token from `candidates` other than `left_out`, whose probabilities sum to `mass`.
    fn draw_without(&mut self, candidates: &[(u32, f32)], left_out: u32, mass: f64) -> u32 {
        let mut rest = candidates.iter().filter(|c| c.0 != left_out);
        let Some(&(last, _)) = rest.clone().next_back() else { return left_out };
        if rest.clone().nth(1).is_none() {
            return last;
        }
        let u = self.rng.next_f64() * mass;
        let mut cumulative = 0.0f64;
        rest.find(|c| {
            cumulative += f64::from(c.1);
            u < cumulative
        })
        .map_or(last, |c| c.0)
    }
}

/// The tokens sampling may choose and their probabilities (summing to 1), most likely first:
/// temperature, top-k and top-p applied as the module documentation says. Greedy parameters give
/// the argmax alone. Empty when no logit is a number.
pub fn distribution(logits: &[f32], params: &SamplingParams, out: &mut Vec<(u32, f32)>) {
    out.clear();
    if params.is_greedy() {
        if logits.iter().any(|x| !x.is_nan()) {
            out.push((argmax(logits), 1.0));
        }
        return;
    }
    out.extend(logits.iter().enumerate().filter(|(_, x)| !x.is_nan()).map(|(i, &x)| (i as u32, x)));
    let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if params.top_k > 0 && params.top_k < out.len() {
        out.select_nth_unstable_by(params.top_k - 1, by_logit);
        out.truncate(params.top_k);
    }
    out.sort_unstable_by(by_logit);
    let Some(&(_, max)) = out.first() else { return };
    let inv_t = 1.0 / f64::from(params.temperature);
    let mut total = 0.0f64;
    for c in out.iter_mut() {
        let w = ((f64::from(c.1) - f64::from(max)) * inv_t).exp();
        c.1 = w as f32;
        total += w;
    }
    if params.top_p < 1.0 {
        let target = f64::from(params.top_p) * total;
        let mut mass = 0.0f64;
        let mut keep = out.len();
        for (i, c) in out.iter().enumerate() {
            mass += f64::from(c.1);
            if mass >= target {
                keep = i + 1;
                break;
            }
        }
        out.truncate(keep);
        total = out.iter().map(|c| f64::from(c.1)).sum();
    }
    for c in out.iter_mut() {
        c.1 = (f64::from(c.1) / total) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p, seed }
    }

    /// Logits whose softmax at temperature 1 is `probs`.
    fn logits_of(probs: &[f64]) -> Vec<f32> {
        probs.iter().map(|p| p.ln() as f32).collect()
    }

    /// A deterministic, irregular row of logits.
    fn pseudo_logits(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        (0..n).map(|_| (rng.next_f64() * 8.0 - 4.0) as f32).collect()
    }

    #[test]
    fn top_k_one_is_greedy() {
        for seed in 0..20 {
            let logits = pseudo_logits(1000, seed);
            let mut sampler = Sampler::new(params(1.3, 1, 1.0, seed)).unwrap();
            for _ in 0..5 {
                assert_eq!(sampler.sample(&logits), argmax(&logits), "seed {seed}");
            }
        }
    }

    #[test]
    fn temperature_zero_is_greedy_and_ignores_the_filters() {
        let logits = pseudo_logits(500, 3);
        let mut sampler = Sampler::new(params(0.0, 7, 0.3, 99)).unwrap();
        assert_eq!(sampler.sample(&logits), argmax(&logits));
    }

    #[test]
    fn top_p_keeps_the_shortest_head_reaching_the_mass() {
        let logits = logits_of(&[0.05, 0.5, 0.15, 0.3]);
        let mut out = Vec::new();
        // 0.5 < 0.75 ≤ 0.5 + 0.3: tokens 1 and 3.
        distribution(&logits, &params(1.0, 0, 0.75, 0), &mut out);
        let tokens: Vec<u32> = out.iter().map(|c| c.0).collect();
        assert_eq!(tokens, [1, 3]);
        assert!((out[0].1 - 0.5 / 0.8).abs() < 1e-6 && (out[1].1 - 0.3 / 0.8).abs() < 1e-6, "{out:?}");
        // 0.8 < 0.85 ≤ 0.95: three tokens.
        distribution(&logits, &params(1.0, 0, 0.85, 0), &mut out);
        assert_eq!(out.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 3, 2]);
        // A mass below the top token's still keeps that token.
        distribution(&logits, &params(1.0, 0, 0.1, 0), &mut out);
        assert_eq!(out, [(1, 1.0)]);
        // top-k applies before top-p: the 2 best renormalised are 0.625 / 0.375.
        distribution(&logits, &params(1.0, 2, 0.6, 0), &mut out);
        assert_eq!(out, [(1, 1.0)]);
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let logits = logits_of(&[0.2, 0.8]);
        let mut out = Vec::new();
        // p ∝ p0^(1/T): at T = 0.5, 0.64 / 0.68 for the larger.
        distribution(&logits, &params(0.5, 0, 1.0, 0), &mut out);
        assert_eq!(out[0].0, 1);
        assert!((out[0].1 - 0.64 / 0.68).abs() < 1e-6, "{out:?}");
        distribution(&logits, &params(2.0, 0, 1.0, 0), &mut out);
        let want = 0.8f64.sqrt() / (0.8f64.sqrt() + 0.2f64.sqrt());
        assert!((f64::from(out[0].1) - want).abs() < 1e-6, "{out:?}");
    }

    #[test]
    fn frequencies_follow_the_distribution() {
        // χ² with 3 degrees of freedom: 16.27 is its 0.999 quantile. Fixed seeds make the
        // statistic deterministic; a sampler drawing from the wrong distribution lands far above.
        let probs = [0.1, 0.2, 0.3, 0.4];
        let logits = logits_of(&probs);
        let draws = 20_000;
        for seed in [1, 2, 3] {
            let mut sampler = Sampler::new(params(1.0, 0, 1.0, seed)).unwrap();
            let mut counts = [0usize; 4];
            for _ in 0..draws {
                counts[sampler.sample(&logits) as usize] += 1;
            }
            let chi2: f64 = counts
                .iter()
                .zip(probs)
                .map(|(&c, p)| {
                    let e = p * draws as f64;
                    (c as f64 - e).powi(2) / e
                })
                .sum();
            assert!(chi2 < 16.27, "seed {seed}: counts {counts:?}, χ² = {chi2}");
        }
        // Tokens outside top-k or top-p are never drawn.
        let mut sampler = Sampler::new(params(1.0, 2, 1.0, 5)).unwrap();
        assert!((0..2000).all(|_| sampler.sample(&logits) >= 2));
        let mut sampler = Sampler::new(params(1.0, 0, 0.65, 5)).unwrap();
        assert!((0..2000).all(|_| sampler.sample(&logits) >= 2));
    }

    /// χ² of `counts` against `probs` over `draws` draws.
    fn chi_squared(counts: &[usize], probs: &[f64], draws: usize) -> f64 {
        let expected = probs.iter().map(|p| p * draws as f64);
        counts.iter().zip(expected).map(|(&c, e)| (c as f64 - e).powi(2) / e).sum()
    }

    /// Two positions of speculative sampling with a fixed draft pair, against the exact joint
    /// distribution of plain sampling: p(a) · p(b | a) over a 4-token vocabulary. The first draft
    /// is likely (accepted most of the time), the second unlikely after it, so every path —
    /// both kept, the second replaced, the first replaced and the next sampled — carries mass.
    #[test]
    fn speculative_sampling_keeps_the_joint_distribution() {
        let first = [0.1, 0.2, 0.6, 0.1];
        let second = |a: usize| -> [f64; 4] {
            let mut p = [0.15, 0.15, 0.15, 0.15];
            p[(a + 1) % 4] = 0.55;
            p
        };
        let (draft_a, draft_b) = (2u32, 1u32);
        let joint: Vec<f64> = (0..16).map(|i| first[i / 4] * second(i / 4)[i % 4]).collect();
        // 37.70: the 0.999 quantile of χ² with 15 degrees of freedom; seeds fixed.
        let draws = 40_000;
        for seed in [11, 12] {
            let mut sampler = Sampler::new(params(1.0, 0, 1.0, seed)).unwrap();
            let mut counts = vec![0usize; 16];
            for _ in 0..draws {
                let (a, b) = match sampler.verify_draft(&logits_of(&first), draft_a) {
                    None => {
                        let row = logits_of(&second(draft_a as usize));
                        (draft_a, sampler.verify_draft(&row, draft_b).unwrap_or(draft_b))
                    }
                    Some(a) => (a, sampler.sample(&logits_of(&second(a as usize)))),
                };
                counts[a as usize * 4 + b as usize] += 1;
            }
            let chi2 = chi_squared(&counts, &joint, draws);
            assert!(chi2 < 37.70, "seed {seed}: counts {counts:?}, χ² = {chi2}");
        }
    }

    #[test]
    fn a_draft_outside_the_candidates_is_always_replaced_and_greedy_keeps_only_the_argmax() {
        let logits = logits_of(&[0.05, 0.5, 0.15, 0.3]);
        let mut top2 = Sampler::new(params(1.0, 2, 1.0, 4)).unwrap();
        assert!((0..500).all(|_| matches!(top2.verify_draft(&logits, 2), Some(1 | 3))));
        let mut greedy = Sampler::greedy();
        assert_eq!(greedy.verify_draft(&logits, 1), None);
        assert_eq!(greedy.verify_draft(&logits, 3), Some(1));
        // A certain draft is kept without a draw.
        let mut top1 = Sampler::new(params(1.0, 1, 1.0, 4)).unwrap();
        assert_eq!(top1.verify_draft(&logits, 1), None);
    }

    #[test]
    fn one_seed_gives_one_sequence() {
        let logits = vec![0.0f32; 64];
        let run = |seed| {
            let mut sampler = Sampler::new(params(1.0, 0, 1.0, seed)).unwrap();
            (0..200).map(|_| sampler.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
        // The state is seeded by SplitMix64, whose first output for seed 0 is a published
        // constant.
        assert_eq!(Rng::new(0).s[0], 0xE220_A839_7B1D_CDAF);
        assert_ne!(Rng::new(0).next_u64(), Rng::new(1).next_u64());
    }

    #[test]
    fn nan_logits_are_never_chosen() {
        let logits = [f32::NAN, 1.0, f32::NAN, 1.0];
        let mut sampler = Sampler::new(params(1.0, 0, 1.0, 9)).unwrap();
        assert!((0..500).all(|_| matches!(sampler.sample(&logits), 1 | 3)));
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert_eq!(Sampler::new(params(-1.0, 0, 1.0, 0)).unwrap_err(), SampleError::Temperature(-1.0));
        assert_eq!(Sampler::new(params(1.0, 0, 0.0, 0)).unwrap_err(), SampleError::TopP(0.0));
        assert_eq!(Sampler::new(params(1.0, 0, 1.5, 0)).unwrap_err(), SampleError::TopP(1.5));
    }
}
