//! Admission: which prompt–answer pairs become shared memories.
//!
//! Cheap deterministic checks run first ([`precheck`]): empty or echoed answers, answers that
//! look cut off, answers unrelated to their prompt, answers that fit the domain's other
//! prompts as well as their own (a mismatched pair) and prompts far from the domain's
//! existing pool (by embedding). Pairs that pass are scored by the node's LLM against the domain's
//! rubric ([`score_pair`]), with the output constrained to one integer 0..10, and kept when
//! the score reaches the threshold. A manual add (CLI/API) skips the LLM score but not the
//! checks.

use starling_models::chat::ChatMessage;

use super::book::{dot, unit, Inserted, MemoryBook};
use super::record::{normalize_text, validate_domain, MemoryBody, MemoryError};
use crate::llm::{Llm, LlmError};

/// Admission settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    /// Lowest LLM score (0..10) kept.
    pub threshold: f32,
    /// A prompt whose cosine with the centroid of every author's prompts in its domain is
    /// below this is off-domain (only checked once the domain has `min_pool` memories from
    /// two or more authors, or from this node).
    pub off_domain_cosine: f32,
    /// Memories a domain needs before the off-domain check applies.
    pub min_pool: usize,
    /// An answer whose cosine with its prompt is below this is unrelated to it.
    pub unrelated_cosine: f32,
    /// An answer must be closer to its own prompt than to the domain's prompts on average,
    /// by at least this cosine (only checked once the domain has `min_pool` memories).
    pub mismatch_margin: f32,
    /// Score given to manual adds that name none.
    pub manual_score: f32,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            threshold: 2.0,
            off_domain_cosine: 0.2,
            min_pool: 5,
            unrelated_cosine: 0.05,
            mismatch_margin: 0.1,
            manual_score: 8.0,
        }
    }
}

/// Why a pair was not admitted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Rejection {
    /// Invalid fields (empty, too long, bad domain).
    #[error(transparent)]
    Invalid(#[from] MemoryError),
    /// The answer repeats the prompt.
    #[error("the answer repeats the prompt")]
    Echo,
    /// The answer looks cut off.
    #[error("the answer looks truncated ({0})")]
    Truncated(&'static str),
    /// The prompt is far from the domain's other memories.
    #[error("off-domain: similarity {cosine:.2} to the domain's memories is below {min:.2}")]
    OffDomain {
        /// Cosine with the domain centroid.
        cosine: f32,
        /// The threshold.
        min: f32,
    },
    /// The answer is unrelated to the prompt.
    #[error("the answer is unrelated to the prompt (similarity {cosine:.2})")]
    Unrelated {
        /// Cosine of prompt and answer.
        cosine: f32,
    },
    /// The answer relates to the domain's other prompts about as well as to its own: it
    /// most likely answers a different request.
    #[error(
        "the answer does not single out its prompt (similarity {cosine:.2} to it, \
         {others:.2} to the domain's prompts on average)"
    )]
    Mismatched {
        /// Cosine of prompt and answer.
        cosine: f32,
        /// Mean cosine of the answer with the domain's prompts.
        others: f32,
    },
    /// The LLM's rubric score is below the threshold.
    #[error("score {score}/10 is below the threshold {threshold}")]
    LowScore {
        /// The score.
        score: f32,
        /// The threshold.
        threshold: f32,
    },
    /// A near-duplicate is already kept.
    #[error("near-duplicate of memory {of}")]
    Duplicate {
        /// The kept memory.
        of: String,
    },
}

/// Why admission could not decide.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// The LLM failed.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// The book failed (store, embedder, publishing).
    #[error(transparent)]
    Book(#[from] super::book::BookError),
}

/// The outcome of [`admit`].
#[derive(Debug, Clone, PartialEq)]
pub enum Admitted {
    /// Kept (and published).
    Kept(super::record::Memory),
    /// Not kept, and why.
    Rejected(Rejection),
}

/// A finished prompt–answer pair offered for admission.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    /// The domain pool.
    pub domain: String,
    /// The prompt.
    pub prompt: String,
    /// The answer.
    pub answer: String,
    /// Task or group id it came from.
    pub source: Option<String>,
}

/// Words an unfinished sentence often ends with.
const DANGLING: &[&str] = &[
    "the", "a", "an", "and", "or", "of", "to", "with", "for", "in", "on", "is", "are", "be",
    "that", "which", "because", "but", "by", "as", "at", "from",
];

/// Deterministic text checks: validity, echo, truncation.
pub fn precheck_text(domain: &str, prompt: &str, answer: &str) -> Result<(), Rejection> {
    validate_domain(domain)?;
    let body = MemoryBody {
        v: super::record::MEMORY_VERSION,
        domain: domain.to_owned(),
        prompt: prompt.to_owned(),
        answer: answer.to_owned(),
        source: None,
        score: 0.0,
        created_at: 0,
    };
    body.validate()?;
    if normalize_text(prompt) == normalize_text(answer) {
        return Err(Rejection::Echo);
    }
    if let Some(reason) = truncation(answer) {
        return Err(Rejection::Truncated(reason));
    }
    Ok(())
}

/// Why `answer` looks cut off, if it does.
pub fn truncation(answer: &str) -> Option<&'static str> {
    let t = answer.trim_end();
    if t.matches("```").count() % 2 == 1 {
        return Some("unclosed code block");
    }
    let mut depth = [0i32; 3];
    for c in t.chars() {
        match c {
            '(' => depth[0] += 1,
            ')' => depth[0] -= 1,
            '[' => depth[1] += 1,
            ']' => depth[1] -= 1,
            '{' => depth[2] += 1,
            '}' => depth[2] -= 1,
            _ => {}
        }
    }
    if depth.iter().any(|&d| d > 0) {
        return Some("unclosed bracket");
    }
    if t.ends_with([',', ':', ';', '(', '-', '+', '*', '/', '=']) && !t.ends_with("--") {
        return Some("ends mid-sentence");
    }
    // Several words ending on a function word (a one-word answer like "to" can be right).
    let words: Vec<&str> = t.split_whitespace().collect();
    if words.len() >= 4 {
        if let Some(last) = words.last() {
            let last = last.to_ascii_lowercase();
            if DANGLING.contains(&last.as_str()) {
                return Some("ends on a dangling word");
            }
        }
    }
    if unfinished_prose(t.lines().last().unwrap_or_default()) {
        return Some("prose without a full stop");
    }
    None
}

/// Whether `line` is a sentence of prose (six or more words, at least 80% of them plain
/// words) that stops on a letter with no full stop. Lists, headings, code, numbers, quotes
/// and short lines legitimately end without one, so they never count.
fn unfinished_prose(line: &str) -> bool {
    let line = line.trim();
    let list_item = line.starts_with(['-', '*', '•', '#', '>', '|'])
        || line
            .split_once(['.', ')'])
            .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
    if list_item || line.contains('`') || !line.ends_with(char::is_alphabetic) {
        return false;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let plain = words
        .iter()
        .filter(|w| {
            let w = w.trim_end_matches([',', ';', ':']);
            w.starts_with(char::is_alphabetic)
                && w.chars()
                    .all(|c| c.is_alphabetic() || c == '\'' || c == '-')
        })
        .count();
    words.len() >= 6 && plain * 5 >= words.len() * 4
}

/// Embedding checks: the answer must relate to the prompt, more than to the domain's other
/// prompts on average, and the prompt to the domain's pool (the last two once the domain
/// has `min_pool` memories). Returns the prompt embedding for reuse.
pub async fn precheck_embedding(
    book: &MemoryBook,
    config: &AdmissionConfig,
    domain: &str,
    prompt: &str,
    answer: &str,
) -> Result<Result<Vec<f32>, Rejection>, super::book::BookError> {
    let mut vs = book
        .embed(vec![prompt.to_owned(), answer.to_owned()])
        .await?;
    let a = vs.pop().unwrap_or_default();
    let p = vs.pop().unwrap_or_default();
    if p.is_empty() {
        return Ok(Ok(p));
    }
    let cosine = MemoryBook::cosine(&p, &a);
    if cosine < config.unrelated_cosine {
        return Ok(Err(Rejection::Unrelated { cosine }));
    }
    let Some(profile) = book.domain_profile(domain) else {
        return Ok(Ok(p));
    };
    // A domain is judged by its profile once it has `min_pool` memories, and only when
    // they come from more than one author or from this node itself: one peer alone does
    // not define a domain for everybody (a peer that filled `general` with nonsense
    // would otherwise make every good memory "off-domain").
    if profile.memories < config.min_pool || (profile.authors < 2 && !profile.only_me) {
        return Ok(Ok(p));
    }
    let sum = profile.sum;
    // A good answer is about its own request more than about the domain's requests in
    // general; an answer that was filed under the wrong prompt is not.
    let others = dot(&a, &sum) / profile.authors as f32;
    if cosine - others < config.mismatch_margin {
        return Ok(Err(Rejection::Mismatched { cosine, others }));
    }
    // Off-domain means far from what every author of the domain writes about: another
    // author's memories can make a prompt closer to the domain, never further from it.
    let cosine = profile
        .means
        .iter()
        .filter_map(|m| unit(m.clone()))
        .map(|c| MemoryBook::cosine(&p, &c))
        .fold(f32::NEG_INFINITY, f32::max);
    if cosine.is_finite() && cosine < config.off_domain_cosine {
        return Ok(Err(Rejection::OffDomain {
            cosine,
            min: config.off_domain_cosine,
        }));
    }
    Ok(Ok(p))
}

/// The rubric the LLM scores a pair of `domain` against.
pub fn rubric(domain: &str) -> &'static str {
    match domain {
        "math" | "arithmetic" => {
            "A good answer gives the correct final number, shows the key step, and answers \
             exactly what was asked. A wrong number scores 0-2."
        }
        "code" | "programming" => {
            "A good answer is correct, complete code or a precise explanation for exactly the \
             task asked, in the language asked, without unrelated text. Broken or off-topic \
             code scores 0-2."
        }
        "format" | "extraction" => {
            "A good answer follows the required output format exactly (fields, order, \
             punctuation) and contains the right values. Wrong format scores 0-3."
        }
        _ => {
            "A good answer is correct, directly answers the request, is complete (not cut \
             off), and is concise. An answer about something else, empty, or wrong scores 0-2."
        }
    }
}

/// The LLM's rubric score of a pair, an integer 0..10 (constrained decoding).
pub async fn score_pair(
    llm: &Llm,
    domain: &str,
    prompt: &str,
    answer: &str,
) -> Result<f32, LlmError> {
    let messages = vec![
        ChatMessage::system(format!(
            "You grade answers for the '{domain}' domain. Rubric: {} \
             Reply with one integer from 0 (useless) to 10 (excellent).",
            rubric(domain)
        )),
        ChatMessage::user(format!(
            "Request:\n{}\n\nAnswer:\n{}\n\nScore (0-10):",
            clip(prompt, 1500),
            clip(answer, 2000)
        )),
    ];
    let text = llm.matching(messages, "(10|[0-9])", 3).await?;
    text.trim()
        .parse::<u8>()
        .map(f32::from)
        .map_err(|_| LlmError::Decode(format!("not a score: {text:?}")))
}

fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A pair that passed every admission check (not yet published).
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    /// The LLM's rubric score (or the manual score).
    pub score: f32,
    /// The prompt's embedding (empty without an embedder), reused when publishing.
    pub embedding: Vec<f32>,
}

/// The admission decision on a pair without publishing it: the text checks, the embedding
/// checks, then the LLM score against the domain's rubric and the threshold (skipped when
/// `llm` is `None`: a manual add, which takes `manual_score`). Duplicates are not checked
/// here: the book does that when publishing ([`admit`]).
pub async fn assess(
    book: &MemoryBook,
    llm: Option<&Llm>,
    config: &AdmissionConfig,
    pair: &Pair,
    manual_score: Option<f32>,
) -> Result<Result<Accepted, Rejection>, AdmissionError> {
    let (domain, prompt, answer) = (
        pair.domain.as_str(),
        pair.prompt.as_str(),
        pair.answer.as_str(),
    );
    if let Err(r) = precheck_text(domain, prompt, answer) {
        return Ok(Err(r));
    }
    let embedding = match precheck_embedding(book, config, domain, prompt, answer).await? {
        Ok(e) => e,
        Err(r) => return Ok(Err(r)),
    };
    let score = match llm {
        Some(llm) => {
            let score = score_pair(llm, domain, prompt, answer).await?;
            if score < config.threshold {
                return Ok(Err(Rejection::LowScore {
                    score,
                    threshold: config.threshold,
                }));
            }
            score
        }
        None => manual_score.unwrap_or(config.manual_score).clamp(0.0, 10.0),
    };
    Ok(Ok(Accepted { score, embedding }))
}

/// Full admission of a finished pair: [`assess`], then duplicate detection and publishing.
pub async fn admit(
    book: &MemoryBook,
    llm: Option<&Llm>,
    config: &AdmissionConfig,
    pair: &Pair,
    manual_score: Option<f32>,
) -> Result<Admitted, AdmissionError> {
    let accepted = match assess(book, llm, config, pair, manual_score).await? {
        Ok(a) => a,
        Err(r) => return Ok(Admitted::Rejected(r)),
    };
    let body = MemoryBook::body(
        &pair.domain,
        &pair.prompt,
        &pair.answer,
        pair.source.clone(),
        accepted.score,
    );
    let emb = (!accepted.embedding.is_empty()).then_some(accepted.embedding);
    Ok(match book.publish(body, emb).await? {
        Inserted::Added(m) => Admitted::Kept(m),
        Inserted::Duplicate { of } | Inserted::Known(of) => {
            Admitted::Rejected(Rejection::Duplicate { of })
        }
        Inserted::Ignored => Admitted::Rejected(Rejection::Duplicate { of: String::new() }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_prechecks() {
        assert!(precheck_text("math", "What is 2+2?", "4").is_ok());
        assert!(matches!(
            precheck_text("math", "What is 2+2?", " "),
            Err(Rejection::Invalid(MemoryError::Empty("answer")))
        ));
        assert_eq!(
            precheck_text("math", "What is 2+2?", "what is 2 + 2"),
            Err(Rejection::Echo)
        );
        assert!(matches!(
            precheck_text("code", "Write hello", "```rust\nfn main() {"),
            Err(Rejection::Truncated(_))
        ));
        assert!(matches!(
            precheck_text(
                "general",
                "Why is the sky blue?",
                "Because sunlight is scattered by the"
            ),
            Err(Rejection::Truncated(_))
        ));
        assert!(matches!(
            precheck_text("general", "List three", "apples, pears,"),
            Err(Rejection::Truncated(_))
        ));
        assert!(precheck_text("general", "Where to?", "to").is_ok());
        assert_eq!(
            truncation(
                "Blue light scatters more. Short blue wavelengths scatter much more than red ones"
            ),
            Some("prose without a full stop")
        );
        for fine in [
            "Short blue wavelengths scatter much more than red ones.",
            "Paris",
            "The answer is 42",
            "Title: Dune\nAuthor: Frank Herbert\nYear: 1965",
            "Steps:\n1. Preheat the oven to a high temperature\n2. Bake the bread until it is golden brown",
            "- keep the list in insertion order with a dict",
            "Use `sorted(xs, key=len)` to sort them by their length in place",
            "東京は日本の首都です",
        ] {
            assert_eq!(truncation(fine), None, "{fine:?}");
        }
    }
}
