//! The raw bytes each token stands for.
//!
//! Decoding in this crate is "concatenate the bytes of the tokens, then read UTF-8", which
//! is what both llama.cpp and the `tokenizers` decoders do for these two families. Keeping
//! the bytes in one table makes `decode`, the streaming decoder and constrained decoding
//! agree by construction.

use super::meta::{TokenKind, VocabModel};

/// The metaspace character SentencePiece uses in place of a space.
pub(crate) const METASPACE: char = '\u{2581}';

/// GPT-2's reversible map from bytes to printable characters: printable Latin-1 bytes map
/// to themselves, every other byte to `U+0100 + n` in byte order.
pub(crate) fn gpt2_byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[usize::from(b)] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(0x100 + next).unwrap_or('\0');
            next += 1;
            c
        };
    }
    table
}

/// Inverse of [`gpt2_byte_to_char`], as a lookup closure over chars.
fn gpt2_char_to_byte() -> impl Fn(char) -> Option<u8> {
    let forward = gpt2_byte_to_char();
    let mut inverse = std::collections::HashMap::with_capacity(256);
    for (b, c) in forward.iter().enumerate() {
        // `b` ranges over 0..256, so the cast is lossless.
        inverse.insert(*c, b as u8);
    }
    move |c| inverse.get(&c).copied()
}

/// Parses `<0xNN>` (SentencePiece byte-fallback pieces).
pub(crate) fn parse_byte_token(s: &str) -> Option<u8> {
    let hex = s.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// All tokens' bytes in one flat buffer.
#[derive(Debug, Clone)]
pub(crate) struct ByteTable {
    data: Vec<u8>,
    /// `ends[i]` is the end of token `i` in `data`; token `i` starts at `ends[i - 1]`.
    ends: Vec<usize>,
}

impl ByteTable {
    pub fn build(model: VocabModel, tokens: &[String], kinds: &[TokenKind]) -> Self {
        let mut data = Vec::with_capacity(tokens.iter().map(String::len).sum());
        let mut ends = Vec::with_capacity(tokens.len());
        let to_byte = gpt2_char_to_byte();
        for (tok, kind) in tokens.iter().zip(kinds) {
            match (model, kind) {
                // Special tokens stand for their literal text.
                (_, k) if k.is_special() => data.extend_from_slice(tok.as_bytes()),
                (VocabModel::Gpt2, _) => {
                    let mut buf = [0u8; 4];
                    for c in tok.chars() {
                        match to_byte(c) {
                            Some(b) => data.push(b),
                            // Some vocabularies carry pieces outside the byte alphabet
                            // (added tokens written verbatim): take their UTF-8.
                            None => data.extend_from_slice(c.encode_utf8(&mut buf).as_bytes()),
                        }
                    }
                }
                (VocabModel::Llama, _) => match parse_byte_token(tok) {
                    Some(b) if *kind == TokenKind::Byte || *kind == TokenKind::Normal => {
                        data.push(b);
                    }
                    _ => {
                        let mut buf = [0u8; 4];
                        for c in tok.chars() {
                            let c = if c == METASPACE { ' ' } else { c };
                            data.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                        }
                    }
                },
            }
            ends.push(data.len());
        }
        Self { data, ends }
    }

    /// The bytes of token `id`, or `None` past the vocabulary.
    pub fn get(&self, id: u32) -> Option<&[u8]> {
        let i = usize::try_from(id).ok()?;
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.data[start..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_table_is_a_bijection_with_known_points() {
        let t = gpt2_byte_to_char();
        assert_eq!(t[usize::from(b' ')], '\u{120}'); // 'Ġ'
        assert_eq!(t[usize::from(b'\n')], '\u{10A}'); // 'Ċ'
        assert_eq!(t[usize::from(b'a')], 'a');
        let set: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(set.len(), 256);
        let back = gpt2_char_to_byte();
        for b in 0..=255u8 {
            assert_eq!(back(t[usize::from(b)]), Some(b));
        }
    }

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xFF>"), Some(255));
        assert_eq!(parse_byte_token("<0x1>"), None);
        assert_eq!(parse_byte_token("<0xZZ>"), None);
        assert_eq!(parse_byte_token("0x0A"), None);
    }
}
