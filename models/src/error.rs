//! Errors of the inference layer.

use std::path::PathBuf;

/// Everything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The model file could not be opened or read.
    #[error("cannot read model file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not a GGUF file, or its header or metadata is damaged.
    #[error("{path} is not a valid GGUF model ({reason}); re-download it with `starling models pull` or pass another file")]
    BadGguf {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A metadata key the architecture needs is missing or has the wrong type.
    #[error("model metadata key `{key}` is missing or invalid: {reason}")]
    Metadata {
        /// The GGUF metadata key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The model's architecture is not one this build can run.
    #[error("unsupported model architecture `{0}` (supported: {supported})", supported = crate::arch::SUPPORTED.join(", "))]
    UnsupportedArchitecture(String),
    /// A tensor the architecture needs is missing or has an unexpected shape.
    #[error("tensor `{name}`: {reason}")]
    Tensor {
        /// Tensor name in the GGUF file.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The prompt plus the requested tokens do not fit in the context window.
    #[error("context window exceeded: {needed} tokens needed, the model holds {max}")]
    ContextOverflow {
        /// Tokens the request would need.
        needed: usize,
        /// The model's context length.
        max: usize,
    },
    /// The request is invalid (bad sampling option, empty prompt, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The tokenizer could not be built or failed.
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    /// The chat template could not be compiled or rendered.
    #[error(transparent)]
    Chat(#[from] crate::chat::ChatError),
    /// A constraint could not be compiled, or output broke it.
    #[error(transparent)]
    Constraint(#[from] crate::constraint::ConstraintError),
    /// The inference thread is gone (the model was unloaded or crashed).
    #[error("the inference engine has stopped")]
    EngineStopped,
    /// An error inside candle.
    #[error("tensor backend: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result alias for this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
