//! Stop strings over a stream of text chunks: text that may be the start of a stop string is
//! held back until it is clear whether the stop string follows.

/// Watches streamed text for any of a set of stop strings.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

/// What to do with a chunk of generated text.
#[derive(Debug, PartialEq, Eq)]
pub enum StopCheck {
    /// Emit this text (possibly empty, when text is being held back) and go on.
    Continue(String),
    /// A stop string was found: emit this text (what came before it) and stop.
    Stop(String),
}

impl StopMatcher {
    /// A matcher for these stop strings (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Feeds the next chunk of text.
    pub fn push(&mut self, chunk: &str) -> StopCheck {
        if self.stops.is_empty() {
            return StopCheck::Continue(chunk.to_string());
        }
        self.pending.push_str(chunk);
        // The earliest stop string occurrence wins.
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = hit {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return StopCheck::Stop(out);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let hold = self
            .pending
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.pending[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.pending.len());
        let out = self.pending[..hold].to_string();
        self.pending.drain(..hold);
        StopCheck::Continue(out)
    }

    /// Ends the stream: returns text still held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for c in chunks {
            match m.push(c) {
                StopCheck::Continue(t) => out.push_str(&t),
                StopCheck::Stop(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_split_across_chunks() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "D more"]),
            ("abc ".into(), true)
        );
    }

    #[test]
    fn false_start_is_released() {
        assert_eq!(run(&["END"], &["E", "N", "x"]), ("ENx".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(
            run(&["world", "lo"], &["hello world"]),
            ("hel".into(), true)
        );
    }

    #[test]
    fn no_stops_passes_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn unicode_boundaries_are_respected() {
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
        assert_eq!(run(&["éx"], &["café", "y"]), ("caféy".into(), false));
    }
}
