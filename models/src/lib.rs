//! Local inference for Starling: GGUF chat models on candle, tokenizers and chat templates
//! built from GGUF metadata, sampling, constrained decoding, sentence embeddings, and the
//! sources models are fetched from.
//!
//! This crate knows nothing about networking or agents.

pub mod arch;
pub mod error;
pub mod gguf;
pub mod sampling;

pub use error::{ModelError, Result};
