//! Reading and validating the `tokenizer.*` metadata of a GGUF file.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::{Content, Value};

use super::TokenizerError;

/// What one vocabulary entry is, from `tokenizer.ggml.token_type` (llama.cpp's numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// An ordinary piece produced by the tokenizer model (type 1, and type 0 "undefined").
    Normal,
    /// The unknown-token placeholder (type 2).
    Unknown,
    /// A control token such as `<|im_start|>` or `<eos>` (type 3). Only ever produced from
    /// template text, never from user text.
    Control,
    /// A user-defined token (type 4): matched verbatim wherever its text appears, like an
    /// ordinary piece (gemma's `"\n\n"`, `"<b>"`).
    UserDefined,
    /// A reserved, unused slot (type 5).
    Unused,
    /// A byte-fallback token `<0xNN>` (type 6).
    Byte,
}

impl TokenKind {
    fn from_code(code: i64) -> Self {
        match code {
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Normal,
        }
    }

    /// Control and unknown tokens are "special": recognised in text only when the caller
    /// allows it, and left out of decoded text.
    pub fn is_special(self) -> bool {
        matches!(self, Self::Control | Self::Unknown)
    }
}

/// The tokenizer family named by `tokenizer.ggml.model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VocabModel {
    /// `gpt2`: byte-level BPE with explicit merges.
    Gpt2,
    /// `llama`: SentencePiece-style BPE with `▁` for spaces and `<0xNN>` byte fallback.
    Llama,
}

/// Everything the tokenizer builder needs, parsed and checked once.
#[derive(Debug, Clone)]
pub(crate) struct GgufVocab {
    pub model: VocabModel,
    pub pre: String,
    pub tokens: Vec<String>,
    pub kinds: Vec<TokenKind>,
    pub scores: Option<Vec<f32>>,
    pub merges: Option<Vec<(String, String)>>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub add_bos: bool,
    pub add_space_prefix: bool,
    pub chat_template: Option<String>,
}

impl GgufVocab {
    pub fn from_metadata(md: &HashMap<String, Value>) -> Result<Self, TokenizerError> {
        let model = match string(md, "tokenizer.ggml.model")? {
            Some("gpt2") => VocabModel::Gpt2,
            Some("llama") => VocabModel::Llama,
            Some(other) => return Err(TokenizerError::UnsupportedModel(other.to_string())),
            None => return Err(TokenizerError::MissingKey("tokenizer.ggml.model")),
        };
        let pre = string(md, "tokenizer.ggml.pre")?
            .unwrap_or("default")
            .to_string();
        let tokens = string_array(md, "tokenizer.ggml.tokens")?
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.tokens"))?;
        if tokens.is_empty() {
            return Err(TokenizerError::Invalid(
                "tokenizer.ggml.tokens is empty".into(),
            ));
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(TokenizerError::Invalid("vocabulary larger than u32".into()));
        }
        let n = tokens.len();

        let kinds = match md.get("tokenizer.ggml.token_type") {
            None => vec![TokenKind::Normal; n],
            Some(v) => {
                let arr = array(v, "tokenizer.ggml.token_type")?;
                check_len(arr.len(), n, "tokenizer.ggml.token_type")?;
                arr.iter()
                    .map(|v| integer(v, "tokenizer.ggml.token_type").map(TokenKind::from_code))
                    .collect::<Result<Vec<_>, _>>()?
            }
        };

        let scores = match md.get("tokenizer.ggml.scores") {
            None => None,
            Some(v) => {
                let arr = array(v, "tokenizer.ggml.scores")?;
                check_len(arr.len(), n, "tokenizer.ggml.scores")?;
                Some(
                    arr.iter()
                        .map(|v| float(v, "tokenizer.ggml.scores"))
                        .collect::<Result<Vec<_>, _>>()?,
                )
            }
        };

        let merges = match string_array(md, "tokenizer.ggml.merges")? {
            None => None,
            Some(list) => Some(
                list.into_iter()
                    .map(|m| match m.split_once(' ') {
                        Some((a, b)) if !a.is_empty() && !b.is_empty() => {
                            Ok((a.to_string(), b.to_string()))
                        }
                        _ => Err(TokenizerError::Invalid(format!("malformed merge {m:?}"))),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };

        let id = |key: &'static str| -> Result<Option<u32>, TokenizerError> {
            match md.get(key) {
                None => Ok(None),
                Some(v) => {
                    let raw = integer(v, key)?;
                    // Some converters write -1 for "none"; ids past the vocabulary are
                    // ignored rather than trusted.
                    match usize::try_from(raw) {
                        Ok(i) if i < n => Ok(Some(raw as u32)),
                        _ => {
                            tracing::warn!(
                                key,
                                id = raw,
                                vocab = n,
                                "token id out of range, ignored"
                            );
                            Ok(None)
                        }
                    }
                }
            }
        };

        let add_space_prefix_default = model == VocabModel::Llama;
        Ok(Self {
            model,
            pre,
            kinds,
            scores,
            merges,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            eom: id("tokenizer.ggml.eom_token_id")?,
            add_bos: boolean(md, "tokenizer.ggml.add_bos_token")?
                .unwrap_or(model == VocabModel::Llama),
            add_space_prefix: boolean(md, "tokenizer.ggml.add_space_prefix")?
                .unwrap_or(add_space_prefix_default),
            chat_template: string(md, "tokenizer.chat_template")?.map(str::to_string),
            tokens,
        })
    }
}

/// Reads the vocabulary of a GGUF file's metadata.
pub(crate) fn vocab_from_content(content: &Content) -> Result<GgufVocab, TokenizerError> {
    GgufVocab::from_metadata(&content.metadata)
}

fn check_len(got: usize, want: usize, key: &'static str) -> Result<(), TokenizerError> {
    if got == want {
        Ok(())
    } else {
        Err(TokenizerError::Invalid(format!(
            "{key} has {got} entries but the vocabulary has {want}"
        )))
    }
}

fn wrong_type(key: &'static str, expected: &'static str) -> TokenizerError {
    TokenizerError::WrongType { key, expected }
}

fn array<'a>(v: &'a Value, key: &'static str) -> Result<&'a [Value], TokenizerError> {
    match v {
        Value::Array(a) => Ok(a),
        _ => Err(wrong_type(key, "array")),
    }
}

fn string<'a>(
    md: &'a HashMap<String, Value>,
    key: &'static str,
) -> Result<Option<&'a str>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(wrong_type(key, "string")),
    }
}

fn string_array(
    md: &HashMap<String, Value>,
    key: &'static str,
) -> Result<Option<Vec<String>>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => array(v, key)?
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(wrong_type(key, "array of strings")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
    }
}

fn boolean(md: &HashMap<String, Value>, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => integer(v, key).map(|i| Some(i != 0)),
    }
}

fn integer(v: &Value, key: &'static str) -> Result<i64, TokenizerError> {
    Ok(match v {
        Value::U8(x) => i64::from(*x),
        Value::I8(x) => i64::from(*x),
        Value::U16(x) => i64::from(*x),
        Value::I16(x) => i64::from(*x),
        Value::U32(x) => i64::from(*x),
        Value::I32(x) => i64::from(*x),
        Value::U64(x) => i64::try_from(*x).map_err(|_| wrong_type(key, "integer below 2^63"))?,
        Value::I64(x) => *x,
        _ => return Err(wrong_type(key, "integer")),
    })
}

fn float(v: &Value, key: &'static str) -> Result<f32, TokenizerError> {
    match v {
        Value::F32(x) => Ok(*x),
        Value::F64(x) => Ok(*x as f32),
        other => integer(other, key).map(|i| i as f32),
    }
}
