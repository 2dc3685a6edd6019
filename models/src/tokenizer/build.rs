//! Builds a `tokenizers::Tokenizer` equivalent to the one a GGUF file describes.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::bytes::METASPACE;
use super::meta::{GgufVocab, TokenKind, VocabModel};
use super::TokenizerError;

/// llama.cpp's `LLAMA3` / HF's Llama 3 split: contractions (case-insensitive), words with one
/// leading non-letter, numbers in groups of up to three, punctuation runs, newlines.
const REGEX_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split: like Llama 3 but every digit on its own.
const REGEX_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's (o200k) split, as its `tokenizer.json` writes it (Phi-4-mini, Llama 4): words
/// split where the case changes, contractions kept with their word, digits in threes.
const REGEX_GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How text is cut into words before byte-level BPE, chosen by `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gpt2Pre {
    /// The GPT-2 regex (`'s|'t|... ?\p{L}+| ?\p{N}+|...`).
    Gpt2,
    /// Every digit alone, then the GPT-2 regex (SmolLM, StarCoder, Refact).
    DigitsThenGpt2,
    /// The Llama 3 regex; merges are skipped for whole-word vocabulary hits.
    Llama3,
    /// The Qwen2 regex with NFC normalisation.
    Qwen2,
    /// The GPT-4o regex.
    Gpt4o,
}

impl Gpt2Pre {
    pub fn from_name(pre: &str) -> Self {
        match pre {
            "default" | "gpt2" | "gpt-2" => Self::Gpt2,
            "smollm" | "starcoder" | "refact" => Self::DigitsThenGpt2,
            "llama3" | "llama-bpe" | "llama-v3" | "smaug-bpe" => Self::Llama3,
            "qwen2" | "deepseek-r1-qwen" => Self::Qwen2,
            "gpt-4o" | "llama4" => Self::Gpt4o,
            other => {
                tracing::warn!(
                    pre = other,
                    "unknown tokenizer.ggml.pre, using the GPT-2 pre-tokenizer"
                );
                Self::Gpt2
            }
        }
    }
}

/// Builds the inner tokenizer. Special (control/unknown) tokens are registered as special
/// added tokens and the tokenizer is left with `encode_special_tokens = true`: it never
/// turns their text into their ids by itself; [`super::GgufTokenizer`] cuts them out first
/// when the caller allows special tokens.
pub(crate) fn build(vocab: &GgufVocab) -> Result<Tokenizer, TokenizerError> {
    let mut tokenizer = match vocab.model {
        VocabModel::Gpt2 => build_gpt2(vocab)?,
        VocabModel::Llama => build_llama(vocab)?,
    };

    let mut special = Vec::new();
    let mut user_defined = Vec::new();
    for (tok, kind) in vocab.tokens.iter().zip(&vocab.kinds) {
        if tok.is_empty() {
            continue;
        }
        if kind.is_special() {
            special.push(AddedToken::from(tok.clone(), true).normalized(false));
        } else if *kind == TokenKind::UserDefined {
            user_defined.push(AddedToken::from(tok.clone(), false).normalized(false));
        }
    }
    if !special.is_empty() {
        tokenizer
            .add_special_tokens(special)
            .map_err(TokenizerError::Build)?;
    }
    if !user_defined.is_empty() {
        tokenizer
            .add_tokens(user_defined)
            .map_err(TokenizerError::Build)?;
    }
    tokenizer.set_encode_special_tokens(true);
    Ok(tokenizer)
}

/// First id for each token text: GGUF vocabularies occasionally repeat a string.
fn vocab_map(tokens: &[String]) -> Vocab {
    let mut map = Vocab::with_capacity(tokens.len());
    for (id, tok) in tokens.iter().enumerate() {
        // The vocabulary length was checked to fit in u32 when parsed.
        map.entry(tok.clone()).or_insert(id as u32);
    }
    if map.len() != tokens.len() {
        tracing::debug!(
            duplicates = tokens.len() - map.len(),
            "GGUF vocabulary repeats some token strings; the first id wins when encoding"
        );
    }
    map
}

fn build_gpt2(vocab: &GgufVocab) -> Result<Tokenizer, TokenizerError> {
    let merges = vocab
        .merges
        .clone()
        .ok_or(TokenizerError::MissingKey("tokenizer.ggml.merges"))?;
    let pre = Gpt2Pre::from_name(&vocab.pre);
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_map(&vocab.tokens), merges)
        .ignore_merges(pre == Gpt2Pre::Llama3)
        .build()
        .map_err(TokenizerError::Build)?;
    let mut tokenizer = Tokenizer::new(bpe);

    let split = |regex: &str| -> Result<PreTokenizerWrapper, TokenizerError> {
        Ok(Split::new(
            SplitPattern::Regex(regex.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(TokenizerError::Build)?
        .into())
    };
    let pre_tokenizer: PreTokenizerWrapper = match pre {
        Gpt2Pre::Gpt2 => ByteLevel::new(false, true, true).into(),
        Gpt2Pre::DigitsThenGpt2 => Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into(),
        Gpt2Pre::Llama3 => Sequence::new(vec![
            split(REGEX_LLAMA3)?,
            ByteLevel::new(false, true, false).into(),
        ])
        .into(),
        Gpt2Pre::Qwen2 => Sequence::new(vec![
            split(REGEX_QWEN2)?,
            ByteLevel::new(false, false, false).into(),
        ])
        .into(),
        Gpt2Pre::Gpt4o => Sequence::new(vec![
            split(REGEX_GPT4O)?,
            ByteLevel::new(false, false, false).into(),
        ])
        .into(),
    };
    if pre == Gpt2Pre::Qwen2 {
        tokenizer
            .with_normalizer(Some(NFC))
            .map_err(TokenizerError::Build)?;
    }
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::new(false, false, false)));
    Ok(tokenizer)
}

fn build_llama(vocab: &GgufVocab) -> Result<Tokenizer, TokenizerError> {
    let merges = match &vocab.merges {
        Some(m) => m.clone(),
        None => {
            let scores = vocab
                .scores
                .as_ref()
                .ok_or(TokenizerError::MissingKey("tokenizer.ggml.scores"))?;
            merges_from_scores(&vocab.tokens, &vocab.kinds, scores)
        }
    };
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab_map(&vocab.tokens), merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = vocab.unk {
        builder = builder.unk_token(vocab.tokens[unk as usize].clone());
    }
    let bpe = builder.build().map_err(TokenizerError::Build)?;
    let mut tokenizer = Tokenizer::new(bpe);
    let scheme = if vocab.add_space_prefix {
        PrependScheme::Always
    } else {
        PrependScheme::Never
    };
    // No split: SentencePiece BPE runs over the whole text between special tokens.
    tokenizer.with_pre_tokenizer(Some(Metaspace::new(METASPACE, scheme, false)));

    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(METASPACE.to_string(), " ")
            .map_err(TokenizerError::Build)?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if vocab.add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// Rebuilds BPE merges from SentencePiece scores: every way of splitting an ordinary token
/// into two vocabulary pieces is a merge, ranked by the merged token's score (higher first).
/// SentencePiece BPE merges the adjacent pair whose result scores highest, so this ordering
/// reproduces it; ties (equal scores) fall back to the lower token id.
pub(crate) fn merges_from_scores(
    tokens: &[String],
    kinds: &[TokenKind],
    scores: &[f32],
) -> Vec<(String, String)> {
    let piece_ids: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| matches!(kinds[*i], TokenKind::Normal | TokenKind::UserDefined))
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut ranked: Vec<(usize, usize)> = Vec::new(); // (merged id, split byte offset)
    for (id, tok) in tokens.iter().enumerate() {
        if kinds[id] != TokenKind::Normal || tok.chars().nth(1).is_none() {
            continue;
        }
        for (at, _) in tok.char_indices().skip(1) {
            if piece_ids.contains_key(&tok[..at]) && piece_ids.contains_key(&tok[at..]) {
                ranked.push((id, at));
            }
        }
    }
    ranked.sort_by(|a, b| {
        scores[b.0]
            .total_cmp(&scores[a.0])
            .then(a.0.cmp(&b.0))
            .then(a.1.cmp(&b.1))
    });
    ranked
        .into_iter()
        .map(|(id, at)| (tokens[id][..at].to_string(), tokens[id][at..].to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_follow_merged_token_scores() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let kinds = vec![TokenKind::Normal; tokens.len()];
        let scores = [0.0, 0.0, 0.0, -3.0, -1.0, -2.0];
        let merges = merges_from_scores(&tokens, &kinds, &scores);
        let got: Vec<(&str, &str)> = merges
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        assert_eq!(got, vec![("b", "c"), ("a", "bc"), ("ab", "c"), ("a", "b")]);
    }

    #[test]
    fn control_tokens_are_never_merge_results() {
        let tokens: Vec<String> = ["<", "x", ">", "<x", "<x>"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut kinds = vec![TokenKind::Normal; tokens.len()];
        kinds[4] = TokenKind::Control;
        let merges = merges_from_scores(&tokens, &kinds, &[0.0, 0.0, 0.0, -1.0, 10.0]);
        assert_eq!(merges, vec![("<".to_string(), "x".to_string())]);
    }

    #[test]
    fn unknown_pre_falls_back_to_gpt2() {
        assert_eq!(Gpt2Pre::from_name("smollm"), Gpt2Pre::DigitsThenGpt2);
        assert_eq!(Gpt2Pre::from_name("llama-bpe"), Gpt2Pre::Llama3);
        assert_eq!(Gpt2Pre::from_name("qwen2"), Gpt2Pre::Qwen2);
        assert_eq!(Gpt2Pre::from_name("gpt-4o"), Gpt2Pre::Gpt4o);
        assert_eq!(Gpt2Pre::from_name("no-such-pre"), Gpt2Pre::Gpt2);
    }
}
