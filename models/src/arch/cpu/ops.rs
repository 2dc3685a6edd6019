//! Element-wise helpers written so that the compiler vectorises them.

/// `e^x` to about 2e-7 relative error, without branches so that loops over it vectorise.
/// Inputs below -87 give about 1e-38, above 88 about 1.6e38.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    // Taylor series of e^r on |r| <= ln2/2.
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let bits = ((n as i32 + 127) as u32) << 23;
    p * f32::from_bits(bits)
}

/// `x · sigmoid(x)`.
#[inline(always)]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// GELU with the tanh approximation (PyTorch's `gelu(approximate="tanh")`, Gemma's
/// `gelu_pytorch_tanh`, candle's `gelu`): `x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³)))`,
/// with `tanh(y) = 1 − 2/(e^{2y} + 1)` so that loops over it vectorise.
#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let y = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    let tanh = 1.0 - 2.0 / (exp(2.0 * y) + 1.0);
    0.5 * x * (1.0 + tanh)
}

/// `1 / sqrt(mean(x²) + eps)`: the factor RMS normalisation multiplies a row by.
pub(crate) fn rms_gain(x: &[f32], eps: f32) -> f32 {
    let mut acc = [0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    let mut sum: f32 = acc.iter().sum();
    sum += chunks.remainder().iter().map(|v| v * v).sum::<f32>();
    1.0 / (sum / x.len().max(1) as f32 + eps).sqrt()
}

/// Replaces `x` by `exp(x - max(x))` and returns the sum of the new values. The
/// exponentials and the sum run in separate loops, and the sum in 16 lanes, so that both
/// vectorise (one loop that added each value as it went ran scalar: a fifth of a
/// SmolLM2 prompt's time was attention, most of it here).
pub(crate) fn softmax_unnormalised(x: &mut [f32]) -> f32 {
    // The largest value, in 16 lanes (a maximum is the same in any order).
    let mut top = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        top.iter_mut().zip(c).for_each(|(t, &v)| *t = t.max(v));
    }
    let max = top
        .iter()
        .chain(chunks.remainder())
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    x.iter_mut().for_each(|v| *v = exp(*v - max));
    let mut lanes = [0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        lanes.iter_mut().zip(c).for_each(|(l, v)| *l += v);
    }
    lanes.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x), x.exp());
            assert!(
                ((got - want) / want).abs() < 1e-6,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.01;
        }
        assert!(exp(-1000.0) < 1e-37 && exp(-1000.0) >= 0.0);
        assert!(exp(f32::NEG_INFINITY) < 1e-37);
    }

    #[test]
    fn silu_gelu_and_rms() {
        for x in [-20.0f32, -1.0, 0.0, 0.5, 3.0, 30.0] {
            let want = x / (1.0 + (-x).exp());
            assert!((silu(x) - want).abs() <= 1e-6 * want.abs().max(1.0));
        }
        for x in [-30.0f32, -3.0, -1.0, -0.1, 0.0, 0.2, 1.0, 2.5, 30.0] {
            let y = 0.797_884_6_f32 * (x + 0.044_715 * x * x * x);
            let want = 0.5 * x * (1.0 + y.tanh());
            assert!(
                (gelu_tanh(x) - want).abs() <= 1e-6 * want.abs().max(1.0),
                "gelu({x}) = {}, want {want}",
                gelu_tanh(x)
            );
        }
        let x: Vec<f32> = (0..37).map(|i| i as f32 - 18.0).collect();
        let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / 37.0;
        assert!((rms_gain(&x, 1e-5) - 1.0 / (mean_sq + 1e-5).sqrt()).abs() < 1e-6);
    }
}
