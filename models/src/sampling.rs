//! Turning logits into the next token: repetition penalty, temperature, top-k, top-p and
//! min-p, with a seeded RNG so that a seed reproduces a generation.

use rand::distributions::{Distribution, WeightedIndex};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// How the next token is chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingOptions {
    /// Softmax temperature; 0 picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = no limit).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probabilities add up to `top_p` (1 = no limit).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = off).
    pub min_p: f32,
    /// Divide (or for negative logits, multiply) the logits of recently seen tokens by this
    /// factor (1 = off).
    pub repeat_penalty: f32,
    /// How many of the most recent tokens the repetition penalty looks at.
    pub repeat_last_n: usize,
    /// Seed of the random generator; None draws one from the OS.
    pub seed: Option<u64>,
}

impl Default for SamplingOptions {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.1,
            repeat_last_n: 64,
            seed: None,
        }
    }
}

impl SamplingOptions {
    /// Deterministic decoding: always the most likely token, no penalties.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 0,
            seed: Some(0),
        }
    }

    /// Rejects values that make no sense, with a message naming the option.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(ModelError::InvalidRequest(what.to_string()));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("temperature must be a number >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        if !self.repeat_penalty.is_finite() || self.repeat_penalty <= 0.0 {
            return bad("repeat_penalty must be a number > 0");
        }
        Ok(())
    }
}

/// Stateful sampler for one generation.
pub struct Sampler {
    opts: SamplingOptions,
    rng: StdRng,
    /// Scratch buffer of (token, logit) candidates, reused between tokens.
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler with the given options.
    pub fn new(opts: SamplingOptions) -> Self {
        let rng = match opts.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_entropy(),
        };
        Self {
            opts,
            rng,
            candidates: Vec::new(),
        }
    }

    /// The options in force.
    pub fn options(&self) -> &SamplingOptions {
        &self.opts
    }

    /// Applies the repetition penalty to `logits` in place, for the tokens in the last
    /// `repeat_last_n` entries of `history`.
    pub fn penalize(&self, logits: &mut [f32], history: &[u32]) {
        let p = self.opts.repeat_penalty;
        if p == 1.0 || self.opts.repeat_last_n == 0 {
            return;
        }
        let start = history.len().saturating_sub(self.opts.repeat_last_n);
        let mut seen = history[start..].to_vec();
        seen.sort_unstable();
        seen.dedup();
        for t in seen {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l >= 0.0 { *l / p } else { *l * p };
            }
        }
    }

    /// Picks a token from `logits` (already penalised). Tokens whose logit is -inf are never
    /// picked; returns None when every logit is -inf or NaN.
    pub fn pick(&mut self, logits: &[f32]) -> Option<u32> {
        if self.opts.temperature == 0.0 {
            return argmax(logits);
        }
        let cands = &mut self.candidates;
        cands.clear();
        cands.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i as u32, l)),
        );
        if cands.is_empty() {
            return None;
        }
        let by_logit_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1);
        if self.opts.top_k > 0 && self.opts.top_k < cands.len() {
            cands.select_nth_unstable_by(self.opts.top_k - 1, by_logit_desc);
            cands.truncate(self.opts.top_k);
        }
        cands.sort_unstable_by(by_logit_desc);
        let max = cands[0].1;
        let t = self.opts.temperature;
        let mut probs: Vec<f32> = cands.iter().map(|&(_, l)| ((l - max) / t).exp()).collect();
        let sum: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        // min-p relative to the best token, then nucleus (top-p) on the sorted list.
        let mut keep = probs.len();
        if self.opts.min_p > 0.0 {
            let floor = probs[0] * self.opts.min_p;
            keep = probs.iter().take_while(|&&p| p >= floor).count().max(1);
        }
        if self.opts.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, p) in probs.iter().take(keep).enumerate() {
                acc += p;
                if acc >= self.opts.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        let dist = WeightedIndex::new(&probs[..keep]).ok()?;
        Some(cands[dist.sample(&mut self.rng)].0)
    }
}

/// Index of the largest finite value.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_finite() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_the_largest_finite_logit() {
        let mut s = Sampler::new(SamplingOptions::greedy());
        assert_eq!(s.pick(&[0.1, 3.0, f32::NAN, 2.0]), Some(1));
        assert_eq!(s.pick(&[f32::NEG_INFINITY, -1.0]), Some(1));
        assert_eq!(s.pick(&[f32::NEG_INFINITY]), None);
    }

    #[test]
    fn masked_tokens_are_never_sampled() {
        let opts = SamplingOptions {
            temperature: 5.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(7),
            ..SamplingOptions::default()
        };
        let mut s = Sampler::new(opts);
        let logits = [1.0, f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY];
        for _ in 0..500 {
            let t = s.pick(&logits).expect("a finite logit exists");
            assert!(t == 0 || t == 2);
        }
    }

    #[test]
    fn same_seed_same_tokens() {
        let opts = SamplingOptions {
            seed: Some(42),
            ..SamplingOptions::default()
        };
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
            .collect();
        let mut a = Sampler::new(opts.clone());
        let mut b = Sampler::new(opts);
        let xa: Vec<_> = (0..50).map(|_| a.pick(&logits)).collect();
        let xb: Vec<_> = (0..50).map(|_| b.pick(&logits)).collect();
        assert_eq!(xa, xb);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let opts = SamplingOptions {
            top_k: 1,
            seed: Some(1),
            ..SamplingOptions::default()
        };
        let mut s = Sampler::new(opts);
        for _ in 0..20 {
            assert_eq!(s.pick(&[0.0, 0.5, 0.4]), Some(1));
        }
    }

    #[test]
    fn top_p_cuts_the_tail() {
        // Token 0 holds ~0.9999 of the mass: top_p 0.5 must always choose it.
        let opts = SamplingOptions {
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            temperature: 1.0,
            seed: Some(3),
            ..SamplingOptions::default()
        };
        let mut s = Sampler::new(opts);
        for _ in 0..100 {
            assert_eq!(s.pick(&[10.0, 0.0, 0.0, 0.0]), Some(0));
        }
    }

    #[test]
    fn repetition_penalty_lowers_seen_tokens() {
        let s = Sampler::new(SamplingOptions {
            repeat_penalty: 2.0,
            repeat_last_n: 2,
            ..SamplingOptions::default()
        });
        let mut logits = [4.0, -4.0, 4.0];
        s.penalize(&mut logits, &[2, 0, 1]);
        // Only the last two tokens (0 and 1) count.
        assert_eq!(logits, [2.0, -8.0, 4.0]);
    }

    #[test]
    fn invalid_options_are_rejected() {
        let o = SamplingOptions {
            top_p: 0.0,
            ..SamplingOptions::default()
        };
        assert!(o.validate().is_err());
        let o = SamplingOptions {
            temperature: -1.0,
            ..SamplingOptions::default()
        };
        assert!(o.validate().is_err());
        assert!(SamplingOptions::default().validate().is_ok());
    }
}
