//! Tokenizers built from GGUF metadata.
//!
//! [`GgufTokenizer::from_gguf`] reads `tokenizer.ggml.*` and builds a
//! [`tokenizers::Tokenizer`] that tokenises like the model's original tokenizer:
//!
//! * `tokenizer.ggml.model = gpt2`: byte-level BPE with the GGUF merges; the word splitter
//!   is chosen by `tokenizer.ggml.pre` (`smollm`/`starcoder`/`refact`: digits one by one then
//!   GPT-2; `default`/`gpt2`; `llama3`/`llama-bpe`/`smaug-bpe`; `qwen2`; `gpt-4o`/`llama4`); unknown values fall
//!   back to GPT-2 with a warning.
//! * `tokenizer.ggml.model = llama`: SentencePiece BPE (`▁` for spaces, `<0xNN>` byte
//!   fallback, optional prefix space from `tokenizer.ggml.add_space_prefix`), with the GGUF
//!   merges if present, otherwise merges rebuilt from `tokenizer.ggml.scores`.
//!
//! Control tokens (token type 3, and the unknown token) are special: [`GgufTokenizer::encode`]
//! only recognises their text when asked to, so user text can never smuggle them in.
//! User-defined tokens (type 4) are matched verbatim everywhere, as the original tokenizers do.
//!
//! Decoding concatenates the raw bytes of the tokens ([`GgufTokenizer::token_bytes`]) and reads
//! them as UTF-8; [`StreamDecoder`] does the same incrementally without ever splitting a
//! character.

mod build;
mod bytes;
mod meta;
mod stream;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use candle_core::quantized::gguf_file::Content;

pub use meta::TokenKind;
pub use stream::StreamDecoder;

use bytes::ByteTable;
use meta::{GgufVocab, VocabModel};

/// Errors from building or running a GGUF tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required metadata key is absent.
    #[error("GGUF metadata has no `{0}`")]
    MissingKey(&'static str),
    /// A metadata key holds the wrong type of value.
    #[error("GGUF metadata `{key}` is not a {expected}")]
    WrongType {
        /// The key.
        key: &'static str,
        /// What it should have held.
        expected: &'static str,
    },
    /// `tokenizer.ggml.model` names a tokenizer family this crate does not build.
    #[error("unsupported tokenizer model `{0}` (supported: gpt2, llama)")]
    UnsupportedModel(String),
    /// The metadata is present but inconsistent (lengths, ids, merges).
    #[error("invalid tokenizer metadata: {0}")]
    Invalid(String),
    /// The `tokenizers` crate refused to build the tokenizer.
    #[error("building the tokenizer failed: {0}")]
    Build(#[source] tokenizers::Error),
    /// The `tokenizers` crate failed while encoding.
    #[error("encoding failed: {0}")]
    Encode(#[source] tokenizers::Error),
    /// The tokenizer could not be serialised.
    #[error("serialising the tokenizer failed: {0}")]
    Serialize(#[source] tokenizers::Error),
}

/// One piece of input to [`GgufTokenizer::encode_segments`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment<'a> {
    /// The text.
    pub text: &'a str,
    /// Whether control-token text inside `text` becomes the control token (template text)
    /// or is tokenised as plain text (user content).
    pub allow_special: bool,
}

impl<'a> Segment<'a> {
    /// Trusted text (chat-template markup): control-token text is recognised.
    pub fn template(text: &'a str) -> Self {
        Self {
            text,
            allow_special: true,
        }
    }

    /// Untrusted text (message content): control-token text is plain text.
    pub fn content(text: &'a str) -> Self {
        Self {
            text,
            allow_special: false,
        }
    }
}

/// Token strings that mark the end of a turn in common chat formats.
const END_OF_TURN_NAMES: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
];

/// A tokenizer built from GGUF metadata. Cheap to share behind an `Arc`; all methods take
/// `&self`.
#[derive(Debug)]
pub struct GgufTokenizer {
    inner: tokenizers::Tokenizer,
    tokens: Vec<String>,
    kinds: Vec<TokenKind>,
    bytes: ByteTable,
    /// Finds special-token text; pattern `i` is the token `special_ids[i]`.
    special_matcher: Option<AhoCorasick>,
    special_ids: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Vec<u32>,
    add_bos: bool,
    strip_leading_space: bool,
    chat_template: Option<String>,
    /// The most bytes of text one ordinary (non-special) token stands for.
    max_token_bytes: usize,
}

impl GgufTokenizer {
    /// Builds the tokenizer described by a GGUF file's metadata.
    pub fn from_gguf(content: &Content) -> Result<Self, TokenizerError> {
        Self::from_vocab(meta::vocab_from_content(content)?)
    }

    fn from_vocab(vocab: GgufVocab) -> Result<Self, TokenizerError> {
        let inner = build::build(&vocab)?;
        let bytes = ByteTable::build(vocab.model, &vocab.tokens, &vocab.kinds);

        let mut special_ids = Vec::new();
        let mut patterns = Vec::new();
        for (id, (tok, kind)) in vocab.tokens.iter().zip(&vocab.kinds).enumerate() {
            if kind.is_special() && !tok.is_empty() {
                // The vocabulary length was checked to fit in u32 when parsed.
                special_ids.push(id as u32);
                patterns.push(tok.as_str());
            }
        }
        let special_matcher = if patterns.is_empty() {
            None
        } else {
            Some(
                AhoCorasickBuilder::new()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(&patterns)
                    .map_err(|e| TokenizerError::Invalid(format!("special tokens: {e}")))?,
            )
        };

        let mut eot: Vec<u32> = Vec::new();
        let mut push = |id: u32| {
            if !eot.contains(&id) {
                eot.push(id);
            }
        };
        vocab.eos.into_iter().for_each(&mut push);
        vocab.eot.into_iter().for_each(&mut push);
        vocab.eom.into_iter().for_each(&mut push);
        for name in END_OF_TURN_NAMES {
            if let Some(pos) = patterns.iter().position(|p| p == name) {
                push(special_ids[pos]);
            }
        }

        tracing::debug!(
            model = ?vocab.model,
            pre = %vocab.pre,
            vocab = vocab.tokens.len(),
            special = special_ids.len(),
            "built GGUF tokenizer"
        );
        let max_token_bytes = (0..vocab.tokens.len())
            .filter(|&id| !vocab.kinds[id].is_special())
            .filter_map(|id| bytes.get(id as u32).map(<[u8]>::len))
            .max()
            .unwrap_or(1)
            .max(1);
        Ok(Self {
            max_token_bytes,
            inner,
            bytes,
            special_matcher,
            special_ids,
            bos: vocab.bos,
            eos: vocab.eos,
            eot,
            add_bos: vocab.add_bos,
            strip_leading_space: vocab.model == VocabModel::Llama && vocab.add_space_prefix,
            chat_template: vocab.chat_template,
            tokens: vocab.tokens,
            kinds: vocab.kinds,
        })
    }

    /// The most bytes of text one ordinary token stands for: `text.len() /
    /// max_token_bytes()` tokens at least, a bound known without tokenising.
    pub fn max_token_bytes(&self) -> usize {
        self.max_token_bytes
    }

    /// Tokenises `text` without adding BOS. With `allow_special = false`, text that looks
    /// like a control token (`"<|im_end|>"`) is tokenised as ordinary text; use that for
    /// anything a user or a peer wrote.
    pub fn encode(&self, text: &str, allow_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.encode_segments(&[Segment {
            text,
            allow_special,
        }])
    }

    /// Tokenises the concatenation of `segments` as one text, recognising control tokens
    /// only inside segments that allow them. A control token is recognised only when its
    /// whole text lies inside one such segment. Text between control tokens is tokenised in
    /// one piece across segment boundaries, so the result equals `encode(whole, true)`
    /// whenever the untrusted segments contain no control-token text.
    pub fn encode_segments(&self, segments: &[Segment<'_>]) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        let mut pending = String::new();
        for seg in segments {
            let matcher = match (&self.special_matcher, seg.allow_special) {
                (Some(m), true) => m,
                _ => {
                    pending.push_str(seg.text);
                    continue;
                }
            };
            let mut last = 0;
            for m in matcher.find_iter(seg.text) {
                pending.push_str(&seg.text[last..m.start()]);
                self.encode_plain(&pending, &mut ids)?;
                pending.clear();
                ids.push(self.special_ids[m.pattern().as_usize()]);
                last = m.end();
            }
            pending.push_str(&seg.text[last..]);
        }
        self.encode_plain(&pending, &mut ids)?;
        Ok(ids)
    }

    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        if text.is_empty() {
            return Ok(());
        }
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(TokenizerError::Encode)?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }

    /// Decodes ids to text, leaving out control tokens (and ids past the vocabulary).
    /// Invalid UTF-8 (a byte-fallback sequence cut short) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.decoded_bytes(id, out.is_empty()));
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Decodes ids to text including the text of control tokens (for logs and debugging).
    pub fn decode_with_special(&self, ids: &[u32]) -> String {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The bytes `id` contributes to decoded text given whether it is the first non-empty
    /// piece: nothing for special tokens, and without the prefix space the tokenizer added
    /// if it is first.
    fn decoded_bytes(&self, id: u32, first: bool) -> &[u8] {
        if self.kind(id).is_none_or(TokenKind::is_special) {
            return &[];
        }
        let b = self.token_bytes(id);
        if first && self.strip_leading_space {
            b.strip_prefix(b" ").unwrap_or(b)
        } else {
            b
        }
    }

    /// The raw bytes token `id` stands for (its literal text for control tokens; empty past
    /// the vocabulary).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id).unwrap_or(&[])
    }

    /// The token's string as stored in the GGUF vocabulary (`"Ġthe"`, `"▁the"`, `"<0x0A>"`).
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens
            .get(usize::try_from(id).ok()?)
            .map(String::as_str)
    }

    /// The id of a token given its vocabulary string.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// What kind of token `id` is, or `None` past the vocabulary.
    pub fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(usize::try_from(id).ok()?).copied()
    }

    /// Whether `id` is a control (or unknown) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.kind(id).is_some_and(TokenKind::is_special)
    }

    /// The beginning-of-sequence token, if the model declares one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token, if the model declares one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Every token that ends generation: EOS, `tokenizer.ggml.eot_token_id` and
    /// `eom_token_id`, and whichever of `<|im_end|>`, `<|endoftext|>`, `<end_of_turn>`,
    /// `<|eot_id|>`, `<|eom_id|>`, `<|end|>` the vocabulary has as control tokens.
    pub fn eot_ids(&self) -> &[u32] {
        &self.eot
    }

    /// Whether a prompt should start with BOS (`tokenizer.ggml.add_bos_token`; defaults to
    /// true for SentencePiece vocabularies, false for byte-level BPE).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Number of entries in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The Jinja chat template from `tokenizer.chat_template`, if the file has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The underlying `tokenizers` tokenizer. It has `encode_special_tokens` set, so on its
    /// own it never produces control tokens from text.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The built tokenizer as `tokenizer.json`. Whoever loads it must call
    /// `set_encode_special_tokens(true)` to keep control-token text in user input inert, as
    /// [`inner`](Self::inner) does.
    pub fn to_json(&self, pretty: bool) -> Result<String, TokenizerError> {
        self.inner
            .to_string(pretty)
            .map_err(TokenizerError::Serialize)
    }

    /// A decoder for a stream of generated ids.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests;
