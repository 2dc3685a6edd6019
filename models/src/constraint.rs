//! Grammar-constrained decoding: JSON Schema, regex and Lark grammars enforced
//! on the sampled tokens with [`llguidance`] token masks.
//!
//! The pieces, and who owns them:
//!
//! * [`TokenVocab`]: plain data describing a model's tokenizer (the bytes each
//!   token id stands for, control tokens, end-of-turn tokens, a tokenize
//!   function). Built by whoever loads the tokenizer; nothing here depends on
//!   a tokenizer crate.
//! * [`ConstraintCompiler`]: built **once per model** from a [`TokenVocab`]
//!   (building the token trie is the expensive step), cheap to clone and shared
//!   across requests and threads.
//! * [`ConstraintState`]: one per request, owned by the sampling loop.
//!
//! The sampling loop is meant to use the *lazy* strategy, which for most steps
//! costs one cheap check instead of a full mask over the vocabulary:
//!
//! ```text
//! loop {
//!     if state.is_finished() { break }          // grammar complete: stop
//!     logits = model.forward(..)
//!     tok = sample(logits)
//!     if !state.is_allowed(tok) {               // cheap: walks tok's bytes only
//!         state.compute_mask()?.apply_to_logits(&mut logits);
//!         tok = sample(logits)                   // now always allowed
//!     }
//!     if eos_ids.contains(tok) { break }        // only sampled where can_stop()
//!     state.commit(tok)?;
//!     emit(tok)
//! }
//! ```
//!
//! Control tokens (the vocabulary's `special` list and every end-of-turn id)
//! are marked special in the trie, so they can never be produced as part of
//! constrained text; an end-of-turn token is allowed only where the grammar
//! accepts (see [`ConstraintState::can_stop`]).

use std::fmt;
use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

/// Longest token (in bytes) the token trie can hold.
const MAX_TOKEN_BYTES: usize = 1024;
/// Largest vocabulary the token trie can hold (token ids are 24-bit there).
const MAX_VOCAB: usize = 0x00ff_ffff;
/// Key under which llguidance reads its JSON formatting options in a schema.
const JSON_OPTIONS_KEY: &str = "x-guidance";

/// Tokenizes a UTF-8 byte string into token ids, without adding BOS/EOS and
/// without interpreting control-token text in it.
pub type TokenizeFn = Arc<dyn Fn(&[u8]) -> Vec<u32> + Send + Sync>;

/// A model's token vocabulary as plain data.
#[derive(Clone)]
pub struct TokenVocab {
    /// Raw bytes each token id stands for, indexed by id: byte-level BPE
    /// decoded to bytes, SentencePiece `▁` turned into a space, `<0xNN>` into
    /// that byte. Control tokens hold their text (e.g. `<|im_end|>`); unused
    /// ids may be empty (they are never allowed). Pad with empty entries up to
    /// the model's logits width if it is larger than the tokenizer's.
    pub tokens: Vec<Vec<u8>>,
    /// Control tokens: never emitted inside constrained text.
    pub special: Vec<u32>,
    /// Every token that ends the model's turn (EOS, `<|im_end|>`, `<|eot_id|>`,
    /// ...). At least one is required. They are treated as special too.
    pub eos_ids: Vec<u32>,
    /// Canonical tokenization of text, used for tokens the grammar forces.
    /// It is only ever called with valid UTF-8.
    pub tokenize: TokenizeFn,
}

impl fmt::Debug for TokenVocab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenVocab")
            .field("tokens", &self.tokens.len())
            .field("special", &self.special.len())
            .field("eos_ids", &self.eos_ids)
            .finish_non_exhaustive()
    }
}

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// A JSON Schema. Output is compact-ish JSON (`", "` and `": "`
    /// separators, no free whitespace) unless the schema carries its own
    /// llguidance `x-guidance` formatting options.
    JsonSchema(serde_json::Value),
    /// A regular expression the whole output must match.
    Regex(String),
    /// A grammar in llguidance's Lark dialect (may embed `%json` etc.).
    Lark(String),
}

impl Constraint {
    /// Short name of the constraint kind, for errors and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonSchema(_) => "JSON Schema",
            Constraint::Regex(_) => "regex",
            Constraint::Lark(_) => "Lark grammar",
        }
    }
}

/// Errors from building, compiling or driving a constraint.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The [`TokenVocab`] cannot be used (e.g. no EOS, id out of range).
    #[error("invalid token vocabulary: {0}")]
    Vocab(String),
    /// The schema/regex/grammar cannot be compiled; `message` is llguidance's.
    #[error("cannot compile {kind} constraint: {message}")]
    Compile {
        /// Which kind of constraint failed.
        kind: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// A token was committed that the constraint does not allow here.
    /// The state is unusable afterwards.
    #[error("token {token} violates the constraint: {message}")]
    Rejected {
        /// The offending token id.
        token: u32,
        /// llguidance's explanation.
        message: String,
    },
    /// The matcher failed or hit a resource limit while computing a mask.
    /// The state is unusable afterwards.
    #[error("constraint matcher failed: {0}")]
    Matcher(String),
}

/// Builds [`ConstraintState`]s for one model's vocabulary.
///
/// Cheap to clone; `Send + Sync`. Build it once per loaded model.
#[derive(Clone)]
pub struct ConstraintCompiler {
    factory: Arc<ParserFactory>,
    env: Arc<VocabEnv>,
}

impl fmt::Debug for ConstraintCompiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConstraintCompiler")
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

impl ConstraintCompiler {
    /// Builds the token trie and grammar compiler for `vocab`.
    ///
    /// This walks the whole vocabulary (tens of milliseconds for ~50k tokens).
    pub fn new(vocab: TokenVocab) -> Result<Self, ConstraintError> {
        let env = Arc::new(VocabEnv::new(vocab)?);
        let tok_env: TokEnv = env.clone();
        let mut factory = ParserFactory::new_simple(&tok_env)
            .map_err(|e| ConstraintError::Vocab(e.to_string()))?;
        // llguidance logs to stderr by default; keep it quiet and surface its
        // grammar warnings through tracing instead.
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Self {
            factory: Arc::new(factory),
            env,
        })
    }

    /// Number of token ids covered (the width a mask applies to).
    pub fn vocab_size(&self) -> usize {
        self.env.trie.vocab_size()
    }

    /// Compiles `constraint` into a fresh per-request state.
    pub fn compile(&self, constraint: &Constraint) -> Result<ConstraintState, ConstraintError> {
        let kind = constraint.kind();
        let grammar = match constraint {
            Constraint::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_json_format_defaults(schema, kind)?)
            }
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| ConstraintError::Compile {
                kind,
                message: e.to_string(),
            })?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(message) = matcher.get_error() {
            return Err(ConstraintError::Compile { kind, message });
        }
        for warning in matcher.grammar_warnings() {
            tracing::warn!(kind, %warning, "constraint grammar warning");
        }
        Ok(ConstraintState {
            matcher,
            env: self.env.clone(),
            kind,
            tokens_committed: 0,
            masks_computed: 0,
        })
    }
}

/// The constraint's progress through one request's output.
///
/// `Send`, not shared: the sampling loop owns it. After any `Err` from
/// [`commit`](Self::commit) or [`compute_mask`](Self::compute_mask) the state
/// is poisoned and every later call fails; end the request.
pub struct ConstraintState {
    matcher: Matcher,
    env: Arc<VocabEnv>,
    kind: &'static str,
    tokens_committed: usize,
    masks_computed: usize,
}

impl fmt::Debug for ConstraintState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConstraintState")
            .field("kind", &self.kind)
            .field("tokens_committed", &self.tokens_committed)
            .field("masks_computed", &self.masks_computed)
            .field("finished", &self.is_finished())
            .finish_non_exhaustive()
    }
}

impl ConstraintState {
    /// Whether `token` may come next. Cheap (proportional to the token's
    /// length): check the sampled token first and compute a full mask only
    /// when it is rejected. End-of-turn tokens are allowed exactly where the
    /// grammar accepts. Agrees with [`compute_mask`](Self::compute_mask).
    pub fn is_allowed(&mut self, token: u32) -> bool {
        if self.matcher.is_error() {
            return false;
        }
        if self.env.is_eos(token) {
            return self.can_stop();
        }
        if self.matcher.is_stopped() || !self.env.is_text_token(token) {
            return false;
        }
        matches!(self.matcher.validate_tokens(&[token]), Ok(1))
    }

    /// The full set of tokens allowed next. Costs a walk of the token trie
    /// (sub-millisecond to a few ms on a 50k vocabulary, depending on the
    /// grammar state). Once the grammar is finished only the EOS tokens are
    /// allowed.
    pub fn compute_mask(&mut self) -> Result<TokenMask, ConstraintError> {
        self.masks_computed += 1;
        let bits = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| ConstraintError::Matcher(e.to_string()))?;
        Ok(TokenMask { bits })
    }

    /// Advances past `token` (which must be allowed). Committing an EOS token
    /// where the grammar accepts finishes the state; committing one after it
    /// finished is a no-op.
    pub fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        if self.env.is_eos(token) && self.is_finished() && !self.matcher.is_error() {
            return Ok(());
        }
        if token as usize >= self.env.trie.vocab_size() {
            return Err(ConstraintError::Rejected {
                token,
                message: format!(
                    "token id out of range (vocabulary has {})",
                    self.env.trie.vocab_size()
                ),
            });
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError::Rejected {
                token,
                message: e.to_string(),
            })?;
        self.tokens_committed += 1;
        Ok(())
    }

    /// Tokens the grammar forces next (e.g. the fixed `{"action": "` that
    /// opens a JSON object), without committing them. The sampling loop may
    /// [`commit`](Self::commit) and emit them without sampling, then run one
    /// batched forward pass over them. Empty when nothing is forced.
    pub fn forced_tokens(&mut self) -> Vec<u32> {
        if self.is_finished() {
            return Vec::new();
        }
        self.matcher.compute_ff_tokens()
    }

    /// The grammar is complete and nothing more may follow (or an EOS was
    /// committed, or the state failed): stop generating.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The output so far is a complete match: an EOS token may end it here.
    pub fn can_stop(&mut self) -> bool {
        if self.matcher.is_error() {
            return false;
        }
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }

    /// Why the state failed, if it did.
    pub fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }

    /// Number of tokens committed so far.
    pub fn tokens_committed(&self) -> usize {
        self.tokens_committed
    }

    /// Number of full masks computed so far (the slow path).
    pub fn masks_computed(&self) -> usize {
        self.masks_computed
    }

    /// Bytes of `tokens` as the constraint sees them (control tokens are
    /// rendered as their text behind a `0xFF` marker byte).
    pub fn decode(&self, tokens: &[u32]) -> Vec<u8> {
        self.env.trie.decode(tokens)
    }
}

/// The set of tokens allowed at one step, as a bitset over token ids.
#[derive(Clone)]
pub struct TokenMask {
    bits: SimpleVob,
}

impl fmt::Debug for TokenMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenMask")
            .field("vocab_size", &self.vocab_size())
            .field("allowed", &self.allowed_count())
            .finish()
    }
}

impl TokenMask {
    /// Number of token ids covered; ids at or above it are never allowed.
    pub fn vocab_size(&self) -> usize {
        self.bits.len()
    }

    /// Whether `token` is in the set.
    pub fn is_allowed(&self, token: u32) -> bool {
        (token as usize) < self.bits.len() && self.bits.is_allowed(token)
    }

    /// How many tokens are allowed.
    pub fn allowed_count(&self) -> usize {
        self.bits.num_set()
    }

    /// The allowed token ids, ascending.
    pub fn allowed_tokens(&self) -> Vec<u32> {
        self.bits.to_list()
    }

    /// The bitset: bit `i % 32` of word `i / 32` is set when token `i` is
    /// allowed. Bits at or above [`vocab_size`](Self::vocab_size) are zero.
    pub fn as_words(&self) -> &[u32] {
        self.bits.as_slice()
    }

    /// Sets the logit of every disallowed token to `-inf` (including any
    /// logits beyond the vocabulary, e.g. padding rows of the output layer).
    pub fn apply_to_logits(&self, logits: &mut [f32]) {
        let words = self.bits.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let word = words.get(w).copied().unwrap_or(0);
            if word == u32::MAX {
                continue;
            }
            for (bit, logit) in chunk.iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// Resource limits for one constraint. They bound compile time and the time
/// and memory of one mask, so a hostile schema fails with an error instead of
/// hanging the inference thread.
fn limits() -> ParserLimits {
    ParserLimits {
        // ~20 ms of lexer construction at most.
        initial_lexer_fuel: 1_000_000,
        // ~15 ms of lexer work per mask at most.
        step_lexer_fuel: 200_000,
        // ~2.5 ms of parser work per mask at most.
        step_max_items: 50_000,
        max_items_in_row: 2_000,
        // ~1-2 kB each: caps lexer memory near 100 MB.
        max_lexer_states: 50_000,
        max_grammar_size: 200_000,
        precompute_large_lexemes: true,
        // Errors name the problem, without dumping grammar and parser state.
        verbose_errors: false,
    }
}

/// `schema` (an object schema) with the JSON layout of [`Constraint::JsonSchema`] (`", "` and
/// `": "`, no free whitespace) unless it sets its own: for schemas embedded in a
/// [`Constraint::Lark`] grammar with `%json`, which llguidance otherwise lets the model pad
/// with any whitespace.
pub fn json_layout_for_lark(schema: &serde_json::Value) -> serde_json::Value {
    with_json_format_defaults(schema, "Lark grammar").unwrap_or_else(|_| schema.clone())
}

/// Returns `schema` with our JSON formatting defaults unless it sets its own.
fn with_json_format_defaults(
    schema: &serde_json::Value,
    kind: &'static str,
) -> Result<serde_json::Value, ConstraintError> {
    let mut schema = schema.clone();
    match &mut schema {
        serde_json::Value::Object(map) => {
            if !map.contains_key(JSON_OPTIONS_KEY) {
                map.insert(
                    JSON_OPTIONS_KEY.to_owned(),
                    serde_json::json!({
                        "whitespace_flexible": false,
                        "item_separator": ", ",
                        "key_separator": ": ",
                    }),
                );
            }
            Ok(schema)
        }
        // `true` = any JSON value; `false` can never match.
        serde_json::Value::Bool(true) => Ok(serde_json::json!({
            JSON_OPTIONS_KEY: {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}
        })),
        other => Err(ConstraintError::Compile {
            kind,
            message: format!("a schema must be an object or `true`, got {other}"),
        }),
    }
}

/// The token environment llguidance needs, built from a [`TokenVocab`].
struct VocabEnv {
    trie: TokTrie,
    tokenize: TokenizeFn,
    eos: Vec<TokenId>,
}

impl VocabEnv {
    fn new(vocab: TokenVocab) -> Result<Self, ConstraintError> {
        let n = vocab.tokens.len();
        if n == 0 {
            return Err(ConstraintError::Vocab("no tokens".into()));
        }
        if n > MAX_VOCAB {
            return Err(ConstraintError::Vocab(format!(
                "{n} tokens, more than the {MAX_VOCAB} supported"
            )));
        }
        if vocab.eos_ids.is_empty() {
            return Err(ConstraintError::Vocab("no end-of-turn token".into()));
        }
        let mut words = vocab.tokens;
        let mut is_special = vec![false; n];
        for &id in vocab.special.iter().chain(&vocab.eos_ids) {
            let Some(flag) = is_special.get_mut(id as usize) else {
                return Err(ConstraintError::Vocab(format!(
                    "control token id {id} is outside the vocabulary of {n}"
                )));
            };
            *flag = true;
        }
        for (id, (word, special)) in words.iter_mut().zip(&is_special).enumerate() {
            if *special {
                // A leading 0xFF marks a control token: no grammar text can
                // contain that byte (it never occurs in UTF-8), so the token
                // is never allowed as text.
                if word.is_empty() {
                    *word = format!("<|control_{id}|>").into_bytes();
                }
                word.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
            } else if word.first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
                // A plain token for the lone byte 0xFF (or starting with it)
                // would read as a control token; 0xFF is never valid in
                // UTF-8 output, so dropping it loses nothing.
                word.clear();
            }
            if word.len() > MAX_TOKEN_BYTES {
                return Err(ConstraintError::Vocab(format!(
                    "token {id} is {} bytes long, more than the {MAX_TOKEN_BYTES} supported",
                    word.len()
                )));
            }
        }
        let eos = vocab.eos_ids;
        // Checked above: words.len() <= MAX_VOCAB fits in u32.
        let vocab_size = words.len() as u32;
        let mut info = TokRxInfo::new(vocab_size, eos[0]);
        info.tok_end_of_turn = Some(eos[0]);
        // TokTrie::from asserts only what was validated above (sizes, ids,
        // token lengths); with_eos_tokens asserts a non-empty, in-range list.
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        Ok(Self {
            trie,
            tokenize: vocab.tokenize,
            eos,
        })
    }

    fn is_eos(&self, token: u32) -> bool {
        self.eos.contains(&token)
    }

    /// A token that can stand in text: in range, non-empty, not a control token.
    fn is_text_token(&self, token: u32) -> bool {
        let bytes = self.trie.token(token);
        !bytes.is_empty() && bytes[0] != TokTrie::SPECIAL_TOKEN_MARKER
    }
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let vocab_size = self.trie.vocab_size();
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            let ids = (self.tokenize)(text.as_bytes());
            if ids.iter().all(|&id| (id as usize) < vocab_size) {
                ids
            } else {
                // A tokenizer that disagrees with the vocabulary: fall back
                // to a greedy longest-match over the trie.
                self.trie.greedy_tokenize(text.as_bytes())
            }
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn byte_vocab() -> TokenVocab {
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        tokens.push(b"<|end|>".to_vec());
        TokenVocab {
            tokens,
            special: vec![],
            eos_ids: vec![256],
            tokenize: Arc::new(|b: &[u8]| b.iter().map(|&x| u32::from(x)).collect()),
        }
    }

    #[test]
    fn vocab_errors_are_reported() {
        let mut v = byte_vocab();
        v.eos_ids.clear();
        assert!(matches!(
            ConstraintCompiler::new(v),
            Err(ConstraintError::Vocab(_))
        ));
        let mut v = byte_vocab();
        v.special.push(9999);
        assert!(matches!(
            ConstraintCompiler::new(v),
            Err(ConstraintError::Vocab(_))
        ));
        let mut v = byte_vocab();
        v.tokens[65] = vec![b'a'; MAX_TOKEN_BYTES + 1];
        assert!(matches!(
            ConstraintCompiler::new(v),
            Err(ConstraintError::Vocab(_))
        ));
    }

    #[test]
    fn eos_text_is_not_text() {
        // The EOS token's bytes "<|end|>" must not be usable as literal text.
        let c = ConstraintCompiler::new(byte_vocab()).unwrap();
        let mut s = c
            .compile(&Constraint::Regex("<\\|end\\|>x".into()))
            .unwrap();
        assert!(!s.is_allowed(256));
        let mask = s.compute_mask().unwrap();
        assert!(!mask.is_allowed(256));
        assert!(mask.is_allowed(u32::from(b'<')));
    }

    #[test]
    fn apply_to_logits_masks_tail() {
        let c = ConstraintCompiler::new(byte_vocab()).unwrap();
        let mut s = c.compile(&Constraint::Regex("ab".into())).unwrap();
        let mask = s.compute_mask().unwrap();
        let mut logits = vec![1.0f32; 300];
        mask.apply_to_logits(&mut logits);
        let finite: Vec<usize> = (0..300).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(finite, vec![usize::from(b'a')]);
    }
}
