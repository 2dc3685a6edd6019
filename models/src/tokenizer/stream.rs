//! Incremental detokenisation that never splits a UTF-8 character.

use super::GgufTokenizer;

/// Turns generated ids into text as they arrive.
///
/// Bytes that do not yet form a complete UTF-8 character (one byte-fallback token of a
/// four-byte emoji, or half of a byte-level BPE piece) are held back until the character is
/// complete. Invalid sequences become U+FFFD exactly as `String::from_utf8_lossy` would,
/// so the concatenation of everything [`push`](Self::push) and [`finish`](Self::finish)
/// return equals [`GgufTokenizer::decode`] of all the ids.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t GgufTokenizer,
    pending: Vec<u8>,
    /// Whether any byte has been produced yet (the leading-space rule applies to the first).
    started: bool,
}

impl<'t> StreamDecoder<'t> {
    pub(super) fn new(tokenizer: &'t GgufTokenizer) -> Self {
        Self {
            tokenizer,
            pending: Vec::new(),
            started: false,
        }
    }

    /// Adds one id; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Option<String> {
        let bytes = self.tokenizer.decoded_bytes(id, !self.started);
        if bytes.is_empty() {
            return None;
        }
        self.started = true;
        self.pending.extend_from_slice(bytes);
        self.drain(false)
    }

    /// Adds several ids; returns the text they complete, if any.
    pub fn push_all(&mut self, ids: &[u32]) -> Option<String> {
        let mut out = String::new();
        for &id in ids {
            if let Some(s) = self.push(id) {
                out.push_str(&s);
            }
        }
        (!out.is_empty()).then_some(out)
    }

    /// Whether bytes of an incomplete character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Flushes what is held back (an incomplete character becomes U+FFFD) and resets the
    /// decoder for a new sequence.
    pub fn finish(&mut self) -> Option<String> {
        let out = self.drain(true);
        self.started = false;
        out
    }

    /// Moves every complete character (and every invalid sequence, as U+FFFD) out of
    /// `pending`; with `flush`, an incomplete tail goes too.
    fn drain(&mut self, flush: bool) -> Option<String> {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid_up_to` marks the end of the longest valid prefix.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        None if flush => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &[];
                            break;
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let consumed = self.pending.len() - keep;
        self.pending.drain(..consumed);
        (!out.is_empty()).then_some(out)
    }
}
