//! Local inference for Starling: GGUF chat models on candle, tokenizers and chat templates
//! built from GGUF metadata, sampling, constrained decoding, sentence embeddings, and the
//! sources models are fetched from.
//!
//! This crate knows nothing about networking or agents.

pub mod arch;
pub mod bench;
pub mod budget;
pub mod chat;
pub mod constraint;
pub mod embed;
pub mod engine;
pub mod error;
pub mod gguf;
pub mod requant;
pub mod sampling;
pub mod source;
pub mod stop;
pub mod testing;
pub mod tokenizer;

pub use error::{ModelError, Result};

// The crate's own tests run with the allocator the `starling` binary installs, so the
// chat template's memory bound is tested as it runs.
#[cfg(test)]
#[global_allocator]
static ALLOC: budget::Budgeted = budget::Budgeted;
