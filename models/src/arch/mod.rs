//! Transformer architectures. Each one turns token ids into next-token logits and owns its
//! KV cache, so the engine can reuse a cached prompt prefix and roll the cache back.

use candle_core::quantized::gguf_file;
use candle_core::Device;

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

mod common;
pub mod cpu;
pub mod gemma3;
pub mod llama;
pub mod shape;

/// Architectures (values of `general.architecture`) this build can run.
pub const SUPPORTED: &[&str] = &["llama", "smollm3", "qwen2", "qwen3", "phi3", "gemma3"];

/// A decoder-only transformer with a KV cache.
///
/// Positions are implicit: `forward` appends `tokens` after the `cache_len()` tokens
/// already in the cache.
pub trait Transformer: Send {
    /// Runs `tokens` through the model at positions `cache_len()..`, stores their keys and
    /// values in the cache, and returns the logits of the last token (`vocab_size()` values).
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// Like [`forward`](Self::forward), but returns the logits of every one of `tokens`,
    /// position after position (`tokens.len() * vocab_size()` values). Scoring a given text
    /// needs them; generation does not, so the default runs one token at a time and the
    /// CPU kernels override it with one batched pass.
    fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut all = Vec::with_capacity(tokens.len() * self.vocab_size());
        for &t in tokens {
            all.extend(self.forward(&[t])?);
        }
        Ok(all)
    }
    /// Number of tokens whose keys and values are cached.
    fn cache_len(&self) -> usize;
    /// Forgets cached positions from `len` on (no-op when `len >= cache_len()`).
    fn truncate(&mut self, len: usize);
    /// Longest sequence (prompt + output) the model can hold.
    fn max_seq_len(&self) -> usize;
    /// Size of the output vocabulary.
    fn vocab_size(&self) -> usize;
    /// Bytes of weights one decoded token reads (every matrix once, one row of the token
    /// embeddings), where the implementation knows its own layout; `None` otherwise.
    fn weight_bytes_per_token(&self) -> Option<usize> {
        None
    }
}

/// Loads the transformer that `general.architecture` names.
pub fn load(file: &GgufFile, device: &Device, max_seq_len: usize) -> Result<Box<dyn Transformer>> {
    let arch = file.architecture()?;
    match arch.as_str() {
        a if shape::FAMILY.contains(&a) => match cpu::eligible(file, device) {
            // The CPU kernels are several times faster than candle's on small models.
            Ok(()) => Ok(Box::new(cpu::CpuLlama::load(file, max_seq_len, 0)?)),
            Err(reason) => {
                tracing::info!(%reason, arch = a, "using the candle implementation");
                Ok(Box::new(llama::Llama::load(file, device, max_seq_len)?))
            }
        },
        "gemma3" => match cpu::eligible(file, device) {
            Ok(()) => Ok(Box::new(cpu::CpuLlama::load(file, max_seq_len, 0)?)),
            Err(reason) => {
                tracing::info!(%reason, arch = "gemma3", "using the candle implementation");
                Ok(Box::new(gemma3::Gemma3::load(file, device, max_seq_len)?))
            }
        },
        other => Err(ModelError::UnsupportedArchitecture(other.to_string())),
    }
}

/// Checks a `forward` call before any work: tokens present, room in the context window,
/// every id inside the vocabulary.
pub(crate) fn check_input(
    tokens: &[u32],
    cached: usize,
    max_seq: usize,
    vocab: usize,
) -> Result<()> {
    if tokens.is_empty() {
        return Err(ModelError::InvalidRequest("no tokens to process".into()));
    }
    if cached + tokens.len() > max_seq {
        return Err(ModelError::ContextOverflow {
            needed: cached + tokens.len(),
            max: max_seq,
        });
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::InvalidRequest(format!(
            "token id {bad} is outside the vocabulary"
        )));
    }
    Ok(())
}

/// Reads a metadata value as u32 (`ARCH.key`).
pub(crate) fn md_u32(ct: &gguf_file::Content, key: &str) -> Result<u32> {
    let v = ct.metadata.get(key).ok_or_else(|| ModelError::Metadata {
        key: key.to_string(),
        reason: "missing".into(),
    })?;
    v.to_u32().map_err(|e| ModelError::Metadata {
        key: key.to_string(),
        reason: e.to_string(),
    })
}

/// Reads a metadata value as f32, with a default when absent.
pub(crate) fn md_f32_or(ct: &gguf_file::Content, key: &str, default: f32) -> Result<f32> {
    match ct.metadata.get(key) {
        None => Ok(default),
        Some(v) => v.to_f32().map_err(|e| ModelError::Metadata {
            key: key.to_string(),
            reason: e.to_string(),
        }),
    }
}
