//! Grounded answers: a task's result is a short answer built from spans copied out of cited
//! evidence, never free text of the small model.

use serde::{Deserialize, Serialize};

/// Where a fact used in an answer comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Citation {
    /// Name of the node that holds the evidence.
    pub node: String,
    /// Its node id.
    pub node_id: String,
    /// The document (file name relative to the node's document folder), or `calculator`.
    pub document: String,
    /// The evidence, verbatim (a sentence, or a table row with its column names; for an
    /// agent, its whole answer).
    pub quote: String,
    /// The third-party agent whose answer this is (the node's `executor = "external:NAME"`);
    /// `document` is empty then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

impl Citation {
    /// Where the evidence is: `document` of a node, or the node's agent NAME.
    pub fn source(&self) -> String {
        match &self.agent {
            Some(a) => format!("agent {a}"),
            None => self.document.clone(),
        }
    }

    /// One line for people: `node (document): "quote"`; an agent's answer is the answer
    /// itself, so its line is `node (agent NAME)`.
    pub fn line(&self) -> String {
        match &self.agent {
            Some(_) => format!("{} ({})", self.node, self.source()),
            None => format!("{} ({}): \"{}\"", self.node, self.document, self.quote),
        }
    }
}

/// How far a task's answer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AnswerStatus {
    /// Every part of the question is answered from cited evidence.
    Answered,
    /// Some parts are answered, others are not known to the swarm.
    Partial,
    /// Nothing the swarm holds answers the question.
    #[default]
    Unknown,
}

use std::collections::HashSet;
use std::sync::OnceLock;

use regex::Regex;

use crate::search::{split_sentences, tokenize};

/// Most words an answer may have.
pub const MAX_ANSWER_WORDS: usize = 60;

// ---------------------------------------------------------------------------------------
// Evidence units
// ---------------------------------------------------------------------------------------

/// One citable piece of a document: a sentence, a list item, a `key: value` line or a table
/// row (rendered with its column names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unit {
    /// The document (file name relative to the document folder).
    pub document: String,
    /// The nearest heading above it (the document's title for most units).
    #[serde(default)]
    pub heading: String,
    /// The unit's text as quoted (a table row as `Column: cell; Column: cell`).
    pub text: String,
    /// Named fields: a table row's (column, cell) pairs, or a `key: value` line's one pair.
    #[serde(default)]
    pub fields: Vec<(String, String)>,
    /// Position in its document (later units come later).
    #[serde(default)]
    pub position: u32,
    /// For a `key: value` line in a block of such lines (a record: a call sheet, a loan
    /// form), the block's other lines: what the line is about (`Location: Gullhaven pier`
    /// for `Crew call: 05:50`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub record: String,
}

impl Unit {
    /// Everything a query may match: the document name, the heading and the text.
    fn match_text(&self) -> String {
        let stem = self
            .document
            .rsplit('/')
            .next()
            .unwrap_or(&self.document)
            .split('.')
            .next()
            .unwrap_or("")
            .replace(['_', '-'], " ");
        format!("{stem} {} {}", self.heading, self.text)
    }

    /// The index terms of what the unit says: its heading and its text.
    fn stated_terms(&self) -> Vec<String> {
        terms_of(&format!("{} {}", self.heading, self.text))
    }
}

/// A unit's named fields.
type Fields = Vec<(String, String)>;

/// Appends a unit (units, heading, text, fields).
trait PushUnit: FnMut(&mut Vec<Unit>, &str, String, Fields) {}
impl<F: FnMut(&mut Vec<Unit>, &str, String, Fields)> PushUnit for F {}

fn table_cells(line: &str) -> Vec<String> {
    let t = line.trim().trim_start_matches('|').trim_end_matches('|');
    t.split('|').map(|c| c.trim().to_owned()).collect()
}

fn is_separator_row(line: &str) -> bool {
    let t = line.trim();
    t.starts_with('|') && t.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
}

/// A short `Key: value` at the start of a sentence (at most four words of key).
fn key_value(sentence: &str) -> Option<(String, String)> {
    let (k, v) = sentence.split_once(": ")?;
    let k = k.trim();
    let words = k.split_whitespace().count();
    if words == 0 || words > 6 || !k.chars().any(char::is_alphabetic) {
        return None;
    }
    let v = v.trim().trim_end_matches('.').trim();
    (!v.is_empty()).then(|| (k.to_owned(), v.to_owned()))
}

/// Splits a document into citable units (see [`Unit`]). Markdown tables become one unit
/// per row; headings are remembered as the context of the units under them; list markers
/// are dropped; paragraphs are split into sentences.
pub fn document_units(document: &str, text: &str) -> Vec<Unit> {
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut header: Option<Vec<String>> = None;
    let mut paragraph = String::new();
    let mut position = 0u32;
    let mut push = |out: &mut Vec<Unit>, heading: &str, text: String, fields| {
        out.push(Unit {
            document: document.to_owned(),
            heading: heading.to_owned(),
            text,
            fields,
            position,
            record: String::new(),
        });
        position += 1;
    };
    // Runs of consecutive `key: value` lines (indices into `out`), closed by anything else.
    let mut records: Vec<Vec<usize>> = vec![Vec::new()];
    let flush =
        |paragraph: &mut String, out: &mut Vec<Unit>, heading: &str, push: &mut dyn PushUnit| {
            for s in split_sentences(paragraph) {
                let fields = key_value(&s).into_iter().collect();
                push(out, heading, s, fields);
            }
            paragraph.clear();
        };
    for raw in text.lines() {
        let line = raw.trim();
        let kv_line = !line.starts_with('|') && key_value(strip_list_marker(line)).is_some();
        if !kv_line && records.last().is_some_and(|r| !r.is_empty()) {
            records.push(Vec::new());
        }
        if line.starts_with('|') {
            flush(&mut paragraph, &mut out, &heading, &mut push);
            if is_separator_row(line) {
                continue;
            }
            let cells = table_cells(line);
            match &header {
                None => header = Some(cells),
                Some(h) => {
                    let fields: Vec<(String, String)> = h
                        .iter()
                        .cloned()
                        .zip(cells)
                        .filter(|(_, c)| !c.is_empty())
                        .collect();
                    let text = fields
                        .iter()
                        .map(|(k, v)| {
                            if k.is_empty() {
                                v.clone()
                            } else {
                                format!("{k}: {v}")
                            }
                        })
                        .collect::<Vec<_>>()
                        .join("; ");
                    if !text.is_empty() {
                        push(&mut out, &heading, text, fields);
                    }
                }
            }
            continue;
        }
        header = None;
        if line.is_empty() {
            flush(&mut paragraph, &mut out, &heading, &mut push);
            continue;
        }
        if let Some(h) = line.strip_prefix('#') {
            flush(&mut paragraph, &mut out, &heading, &mut push);
            heading = h.trim_start_matches('#').trim().to_owned();
            continue;
        }
        // A list item or a `Key: value` line is a unit of its own.
        let item = strip_list_marker(line);
        if item.len() != line.len() || key_value(line).is_some() || line.contains(" = ") {
            flush(&mut paragraph, &mut out, &heading, &mut push);
            for s in split_sentences(item) {
                let fields: Fields = key_value(&s).into_iter().collect();
                if kv_line && !fields.is_empty() {
                    if let Some(r) = records.last_mut() {
                        r.push(out.len());
                    }
                }
                push(&mut out, &heading, s, fields);
            }
            continue;
        }
        if !paragraph.is_empty() {
            paragraph.push(' ');
        }
        paragraph.push_str(line);
    }
    flush(&mut paragraph, &mut out, &heading, &mut push);
    for run in records.iter().filter(|r| r.len() >= 2) {
        for &i in run {
            let others: Vec<&str> = run
                .iter()
                .filter(|&&j| j != i)
                .map(|&j| out[j].text.as_str())
                .collect();
            out[i].record = others.join("; ");
        }
    }
    out
}

fn strip_list_marker(line: &str) -> &str {
    let t = line.trim_start();
    if let Some(r) = t.strip_prefix("- ").or_else(|| t.strip_prefix("* ")) {
        return r.trim_start();
    }
    let digits = t.chars().take_while(char::is_ascii_digit).count();
    if digits > 0 && digits < 3 {
        let rest = &t[digits..];
        if let Some(r) = rest.strip_prefix(". ").or_else(|| rest.strip_prefix(") ")) {
            return r.trim_start();
        }
    }
    line
}

// ---------------------------------------------------------------------------------------
// Questions
// ---------------------------------------------------------------------------------------

/// The kind of value a question asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Slot {
    /// A person (who).
    Person,
    /// A clock time.
    Time,
    /// A day or date (when).
    Date,
    /// A number, usually with a unit.
    Quantity,
    /// A number of things (`how many books`): a number, with or without a noun.
    Count,
    /// A place, room, code or similar (where, which gate).
    Place,
    /// Anything else (what, which).
    Thing,
}

/// A weighted query term.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Term {
    /// The index term (see [`crate::search::tokenize`]).
    pub term: String,
    /// Its weight.
    pub weight: f32,
    /// Whether evidence must contain it.
    pub required: bool,
    /// Context (the lead-in, the other clauses, the question a follow-up came from): it
    /// raises the score of evidence holding it and costs nothing where it is missing.
    #[serde(default)]
    pub context: bool,
}

/// One sub-question of a task, drawn from the task's own words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubQuestion {
    /// The clause as asked (with the task's lead-in), shown as the task text.
    pub text: String,
    /// What kind of value answers it.
    pub slot: Slot,
    /// The words naming the value (`gate`, `lead keeper`), as index terms.
    pub slot_terms: Vec<String>,
    /// Weighted terms the evidence should contain.
    pub terms: Vec<Term>,
    /// Prefer the latest of equally good units (the question asks for the latest, or the
    /// evidence is a log).
    pub latest: bool,
}

/// Pronouns that are the subject of a clause (`should I ring`, `are we asking`).
const SUBJECT_PRONOUNS: &[&str] = &["i", "we", "you", "they", "he", "she", "it"];
const WH: &[&str] = &[
    "who", "whom", "whose", "what", "what's", "whats", "which", "where", "when", "how", "why",
];
const AUX: &[&str] = &[
    "is", "are", "was", "were", "does", "do", "did", "should", "can", "could", "will", "would",
    "has", "have", "had", "must", "may", "might", "shall", "i", "we", "you", "they", "it", "he",
    "she",
];
/// Words of the asking (`how many`, `how much more`, `can you find out`): evidence states a
/// value without them, so they are no terms of a sub-question.
const ASKING_WORDS: &[&str] = &[
    "many",
    "much",
    "more",
    "find",
    "know",
    "tell",
    "need",
    "whoever",
    "whichever",
    "whatever",
];
const WEEKDAYS_MONTHS: &[&str] = &[
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

fn words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'')
                .to_owned()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// Index terms of `text`, with digits' plural `s` dropped (`Year 9s` -> `9`).
/// A lone capital letter is a name too (`row K`, `Plan B`; not `A` or `I`), and the tails
/// of contractions (`we're`) are no terms.
pub fn terms_of(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    // `Sat` and `Sun` are words too, but not before a time or a date (`Sun 13:00`).
    let text = weekend_re().replace_all(text, |c: &regex::Captures| {
        let day = if &c[1] == "Sat" { "Saturday" } else { "Sunday" };
        format!("{day}{}", &c[2])
    });
    let text = age_group_re().replace_all(&text, |c: &regex::Captures| format!("u{}", &c[1]));
    // A clock time is one term however it is written (`2 pm`, `14:00`, `noon`).
    let text = clock_re().replace_all(&text, |c: &regex::Captures| {
        let hour: u32 = c
            .get(1)
            .or(c.get(4))
            .and_then(|h| h.as_str().parse().ok())
            .unwrap_or(12);
        let minute = c.get(2).or(c.get(5)).map_or("00", |m| m.as_str());
        let hour = match c.get(3).map(|m| m.as_str().to_ascii_lowercase()) {
            Some(p) if p == "p" && hour < 12 => hour + 12,
            Some(p) if p == "a" && hour == 12 => 0,
            _ => hour,
        };
        format!(" t{hour:02}{minute} ")
    });
    // `round one` and `Round 1`, `the second feed stop` and `Feed 2`: one spelling.
    let text = numbered_re().replace_all(&text, |c: &regex::Captures| {
        let (before, word) = match (c.get(1), c.get(2)) {
            (Some(b), Some(w)) => (b.as_str(), w.as_str()),
            _ => ("", c.get(3).map_or("", |m| m.as_str())),
        };
        match number_word(&word.to_lowercase()) {
            Some(n) => format!("{before}{n}"),
            None => c[0].to_owned(),
        }
    });
    for w in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let mut cs = w.chars();
        if let (Some(c), None) = (cs.next(), cs.next()) {
            if c.is_uppercase() && c != 'A' && c != 'I' {
                out.extend(c.to_lowercase().map(String::from));
                continue;
            }
        }
        // An abbreviation is read as written (`Wed`), not after stemming, which makes
        // `wedding` `wed` and `decking` `deck`.
        if let Some(full) = calendar_abbreviation(&w.to_lowercase()) {
            out.extend(tokenize(full));
            continue;
        }
        out.extend(
            tokenize(w)
                .into_iter()
                .filter(|t| !matches!(t.as_str(), "re" | "ve" | "ll"))
                .map(normalise_term),
        );
    }
    out
}

/// A number word that numbers something: a cardinal after a noun (`round one`, `day two`;
/// not after a determiner or a preposition: `which one`, `at one`) or an ordinal from
/// `second` on (`first` is often no number: `first aid`, `who goes first`).
fn numbered_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)(\b(?:round|day|week|heat|race|leg|stage|lane|table|court|pitch|bay|gate|platform|room|floor|group|team|year|level|grade|stop|feed|checkpoint|session|part|section|step|game|match|set|class|division|block|zone|area|field|unit|car|coach|carriage|bus|route|line|door|hole|tee|ward|box|shelf|row|aisle|stand|berth|dock|hall|studio|lab) )(one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)\b|\b(second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth)\b",
    )
}

/// The number a number word of [`numbered_re`] names.
fn number_word(w: &str) -> Option<u32> {
    let words = [
        ["one", "first"],
        ["two", "second"],
        ["three", "third"],
        ["four", "fourth"],
        ["five", "fifth"],
        ["six", "sixth"],
        ["seven", "seventh"],
        ["eight", "eighth"],
        ["nine", "ninth"],
        ["ten", "tenth"],
        ["eleven", "eleventh"],
        ["twelve", "twelfth"],
    ];
    words
        .iter()
        .position(|p| p.contains(&w))
        .map(|i| i as u32 + 1)
}

/// The unambiguous weekday and month abbreviations (`Fri`, `Nov`) as full names (`Sat`,
/// `Sun`, `May` are words too, so they stay).
fn calendar_abbreviation(word: &str) -> Option<&'static str> {
    Some(match word {
        "mon" => "monday",
        "tue" | "tues" => "tuesday",
        "wed" => "wednesday",
        "thu" | "thur" | "thurs" => "thursday",
        "fri" => "friday",
        "jan" => "january",
        "feb" => "february",
        "mar" => "march",
        "apr" => "april",
        "jul" => "july",
        "aug" => "august",
        "sep" | "sept" => "september",
        "oct" => "october",
        "nov" => "november",
        "dec" => "december",
        _ => return None,
    })
}

/// One spelling per number: `9s` and `14th` are `9` and `14`.
fn normalise_term(t: String) -> String {
    let digits_then = |suffixes: &[&str]| {
        suffixes.iter().find_map(|x| {
            let d = t.strip_suffix(x)?;
            (!d.is_empty() && d.chars().all(|c| c.is_ascii_digit())).then(|| d.to_owned())
        })
    };
    digits_then(&["s", "st", "nd", "rd", "th"]).unwrap_or(t)
}

fn is_wh(w: &str) -> bool {
    let lower = w.to_lowercase().replace('’', "'");
    let bare = lower.strip_suffix("'s").unwrap_or(&lower);
    WH.contains(&bare)
}

/// The slot of one clause: its kind and the words naming it.
/// Whether `clause` names one day: a weekday, `today` or `tomorrow`, or a day of a month
/// (`14 November`); a month alone leaves the day to ask for.
fn names_day(clause: &str) -> bool {
    let lower = clause.to_lowercase();
    words(&lower).iter().any(|w| {
        let w = w.trim_end_matches("'s");
        WEEKDAYS_MONTHS[..7].contains(&w) || ["today", "tonight", "tomorrow"].contains(&w)
    }) || date_re()
        .find_iter(clause)
        .any(|m| m.as_str().chars().any(|c| c.is_ascii_digit()))
}

/// Articles and possessives: words that open a noun phrase and say which or whose.
const ARTICLES: &[&str] = &[
    "the", "a", "an", "his", "her", "their", "its", "our", "my", "your",
];

/// Whether `w` opens a noun phrase: an article, a possessive or a demonstrative.
fn is_determiner(w: &str) -> bool {
    ARTICLES.contains(&w) || ["this", "that", "these", "those"].contains(&w)
}

fn slot_of(clause: &str) -> (Slot, Vec<String>) {
    let ws: Vec<String> = words(clause).iter().map(|w| w.to_lowercase()).collect();
    let Some(i) = ws.iter().position(|w| is_wh(w)) else {
        return (Slot::Thing, Vec::new());
    };
    let wh = ws[i].replace('’', "'").trim_end_matches("'s").to_owned();
    // The noun phrase after the wh-word, up to an auxiliary verb.
    let mut np: Vec<String> = Vec::new();
    for w in &ws[i + 1..] {
        if AUX.contains(&w.as_str()) || is_wh(w) {
            break;
        }
        np.push(w.clone());
    }
    if wh == "what" && np.first().is_some_and(|w| w == "the") {
        np.remove(0);
    }
    // `what grade the new purple climb is at`: a noun, then the subject of its own clause;
    // only the noun names the value.
    if matches!(wh.as_str(), "what" | "which") && np.get(1).is_some_and(|w| is_determiner(w)) {
        np.truncate(1);
    }
    // The head noun: the last word before a preposition (`time on Sunday` -> `time`).
    let preps = [
        "on", "at", "in", "for", "of", "from", "to", "by", "with", "per",
    ];
    let head = np
        .iter()
        .take_while(|w| !preps.contains(&w.as_str()))
        .last()
        .cloned()
        .unwrap_or_default();
    let mut rest_terms = terms_of(&np.join(" "));
    rest_terms.retain(|t| !ASKING_WORDS.contains(&t.as_str()));
    let quantity_words = [
        "weight",
        "weigh",
        "temperature",
        "mass",
        "power",
        "budget",
        "limit",
        "size",
        "length",
        "price",
        "cost",
        "abv",
        "strength",
        "volume",
        "capacity",
        "heaviest",
        "heavy",
        "long",
        "much",
        "many",
        "far",
        "big",
        "tall",
        "high",
        "deep",
        "fast",
        "old",
        "wide",
        "speed",
        "distance",
        "height",
        "depth",
        "amount",
        "number",
        "percentage",
        "rate",
        "fee",
        "dose",
        "voltage",
        "pressure",
        // Money: what a charge, fare or rent is asked as (`what's the daytime fare`).
        "charge",
        "charges",
        "fare",
        "fares",
        "fees",
        "prices",
        "costs",
        "rates",
        "rent",
        "deposit",
        "toll",
        "tariff",
        "wage",
        "salary",
        // `what will the couple pay`: the verb names the amount.
        "pay",
        "spend",
        "owe",
    ];
    let slot = match wh.as_str() {
        "who" | "whom" | "whose" => Slot::Person,
        // `When is the octopus kite flying on the Sunday?`: with the day given, the
        // question asks for the time.
        "when" if names_day(clause) => Slot::Time,
        "when" => Slot::Date,
        "where" => Slot::Place,
        // `how many books`: a count; `how warm`, `how long`: a measured quantity.
        "how" if np.first().is_some_and(|w| w == "many") => Slot::Count,
        "how" if !np.is_empty() => Slot::Quantity,
        "how" => Slot::Thing,
        _ => {
            // `what time the front door gets locked`: the noun right after the wh-word
            // says the kind, whatever follows.
            let first = np.first().map(String::as_str);
            // (Not a compound: `what time control` asks for a control.)
            let then_free = np.get(1).is_none_or(|w| {
                ARTICLES.contains(&w.as_str())
                    || ["on", "at", "in", "for", "of", "to", "this", "that", "next"]
                        .contains(&w.as_str())
            });
            if head == "time" || (first == Some("time") && then_free) {
                Slot::Time
            } else if (matches!(first, Some("day" | "date")) && then_free)
                || ["day", "date", "days", "dates", "week", "month", "year"]
                    .contains(&head.as_str())
            {
                Slot::Date
            } else if np.iter().any(|w| quantity_words.contains(&w.as_str())) {
                Slot::Quantity
            } else if [
                "floor",
                "room",
                "gate",
                "shelf",
                "lab",
                "desk",
                "stand",
                "channel",
                "platform",
                "venue",
                "place",
                "location",
                "ward",
                "building",
                "address",
                "pitch",
                "court",
                "bay",
                "berth",
                "dock",
                "locker",
                "cabin",
                "seat",
                "table",
                "stop",
                // Kinds of venue (`which pub is it at`, `which hotel are we staying at`).
                "pub",
                "inn",
                "bar",
                "hotel",
                "hostel",
                "restaurant",
                "cafe",
                "café",
                "hall",
                "church",
                "campsite",
                "station",
                "depot",
                "studio",
                "theatre",
                "club",
                "centre",
                "center",
                "garage",
                "shop",
                "store",
                "warehouse",
                "yard",
                "site",
                "harbour",
                "port",
                "airport",
                "school",
            ]
            .contains(&head.as_str())
            {
                Slot::Place
            } else if ["latest", "earliest"].contains(&head.as_str()) {
                Slot::Time
            } else if [
                "member",
                "person",
                "rep",
                "representative",
                "officer",
                "manager",
                "contact",
                "driver",
                "nurse",
                "doctor",
                "teacher",
                "keeper",
                "curator",
                "lead",
                "leader",
                "owner",
                "holder",
                "chair",
                "captain",
                "coordinator",
                "supervisor",
                "warden",
                "presenter",
                "host",
                "judge",
                "arbiter",
                "courier",
                "engineer",
                "technician",
                "attendant",
                "assistant",
                "consultant",
                "steward",
                "porter",
                "cleaner",
                "receptionist",
                "instructor",
                "tutor",
                "coach",
                "trainer",
                "guide",
                "chef",
                "secretary",
                "treasurer",
                "referee",
                "umpire",
                "volunteer",
                "marshal",
                "caretaker",
                "therapist",
                "surgeon",
                "vet",
                "dentist",
                "pharmacist",
                "carer",
                "photographer",
                "plumber",
                "electrician",
                "contractor",
                "mechanic",
                "pilot",
                "skipper",
                "conductor",
                "soloist",
                "singer",
                "editor",
                "translator",
                "proofreader",
                "reviewer",
                "examiner",
                "inspector",
                "mentor",
                "speaker",
                "clerk",
                "administrator",
                "librarian",
                "ranger",
                "gardener",
            ]
            .contains(&head.as_str())
            {
                Slot::Person
            } else {
                Slot::Thing
            }
        }
    };
    // After `where` and `when` the noun phrase is what is asked about (`where's the
    // charcoal`), not the name of the value.
    let mut slot_terms = if matches!(wh.as_str(), "where" | "when") {
        Vec::new()
    } else {
        rest_terms
    };
    // A degree adjective names the dimension the evidence states (`how warm` ->
    // temperature).
    if matches!(slot, Slot::Quantity) {
        for w in &np {
            let dims: &[&str] = match w.as_str() {
                "warm" | "hot" | "cold" | "cool" | "warmest" | "coldest" => &["temperature"],
                "heavy" | "heaviest" | "light" | "lightest" => &["weight", "mass"],
                "long" | "longest" | "short" => &["length", "duration"],
                "far" | "farthest" | "furthest" => &["distance"],
                "old" | "oldest" => &["age"],
                "tall" | "high" | "highest" | "tallest" => &["height"],
                "deep" | "deepest" => &["depth"],
                "big" | "large" | "biggest" | "largest" => &["size", "capacity"],
                "fast" | "fastest" => &["speed"],
                "expensive" | "cheap" => &["price", "cost"],
                _ => &[],
            };
            for d in dims {
                slot_terms.extend(terms_of(d));
            }
        }
    }
    let mut slot = slot;
    // `who is doing the alterations on the dress ...`: the first words name the role; the
    // rest says whose (and stays a term of the clause, not of the slot).
    if matches!(wh.as_str(), "who" | "whom") {
        slot_terms.clear();
    }
    // `how much will it cost`: the verb names the quantity.
    if slot == Slot::Quantity && slot_terms.is_empty() {
        if let Some(v) = ws[i + 1..]
            .iter()
            .find(|w| quantity_words.contains(&w.as_str()) && !ASKING_WORDS.contains(&w.as_str()))
        {
            slot_terms.extend(terms_of(v));
        }
    }
    // `who leads` / `what does he weigh`: the verb names the slot.
    if slot == Slot::Person || (wh == "what" && np.is_empty()) {
        // `who's going to be conducting`: the verb comes after `going to be` (only where
        // those words lead, among the auxiliaries: `who needs to sign` keeps its `to`).
        let future = |w: &str| matches!(w, "going" | "gonna" | "to" | "be" | "been" | "being");
        let lead = ws[i + 1..]
            .iter()
            .take_while(|w| AUX.contains(&w.as_str()) || future(w))
            .count();
        let after: Vec<&String> = ws[i + 1..]
            .iter()
            .enumerate()
            .filter(|(k, w)| *k >= lead || !future(w))
            .map(|(_, w)| w)
            .collect();
        // `who should I ring`: with a subject of its own between, the verb says what is
        // done to the one asked about, not what they are. (`What are we asking for her`
        // keeps its verb: an empty slot would take any value of the unit.)
        let subject = after
            .iter()
            .take_while(|w| AUX.contains(&w.as_str()))
            .any(|w| SUBJECT_PRONOUNS.contains(&w.as_str()));
        let mut content: Vec<&String> = after
            .into_iter()
            .filter(|w| !AUX.contains(&w.as_str()) && !ARTICLES.contains(&w.as_str()))
            .take(2)
            .collect();
        if subject && slot == Slot::Person {
            content.clear();
        }
        // `who's got the saw`, `who has the keys`: possession names no role.
        let possession = ["got", "get", "gets", "has", "have", "had", "holds", "keeps"];
        if slot == Slot::Person
            && content
                .first()
                .is_some_and(|w| possession.contains(&w.as_str()))
        {
            content.clear();
        }
        if slot == Slot::Thing {
            // `what did Tansy weigh`: the verb that names a quantity may come later.
            if let Some(v) = ws[i + 1..]
                .iter()
                .find(|w| quantity_words.contains(&w.as_str()))
            {
                slot = Slot::Quantity;
                slot_terms.extend(terms_of(v));
            } else if asks_total(clause) {
                // `what does the order come to`: an amount, named by no noun.
                slot = Slot::Quantity;
            }
        }
        for v in content {
            slot_terms.extend(terms_of(v));
        }
    }
    let mut seen = HashSet::new();
    slot_terms.retain(|t| seen.insert(t.clone()));
    (slot, slot_terms)
}

fn capitalised(w: &str) -> bool {
    w.chars().next().is_some_and(char::is_uppercase)
}

/// Entity terms of `text`: capitalised words that do not start it, and words with digits.
fn entity_terms(text: &str) -> (Vec<String>, Vec<String>) {
    let mut names = Vec::new();
    let mut others = Vec::new();
    for (i, w) in words(text).iter().enumerate() {
        if is_wh(w) {
            continue;
        }
        let lower = w.to_lowercase();
        let has_digit = w.chars().any(|c| c.is_ascii_digit());
        if has_digit {
            others.extend(terms_of(w));
        } else if i > 0 && capitalised(w) && lower != "i" {
            if WEEKDAYS_MONTHS.contains(&lower.trim_end_matches('s')) {
                others.extend(terms_of(w));
            } else {
                names.extend(terms_of(w));
            }
        }
    }
    (names, others)
}

/// `clause` without a phrasal verb of outcome (`ended up`, `turned out`, `wound up`), and
/// whether it had one: it asks for the final value, which no evidence words that way.
fn without_outcome_verb(clause: &str) -> (String, bool) {
    static R: OnceLock<Regex> = OnceLock::new();
    let phrase = re(
        &R,
        r"(?i)\b(?:end(?:s|ed|ing)?\s+up|turn(?:s|ed)?\s+out(?:\s+to\s+be)?|w(?:ou|i)nds?\s+up)\b\s*",
    );
    match phrase.replace_all(clause, "") {
        std::borrow::Cow::Borrowed(_) => (clause.to_owned(), false),
        std::borrow::Cow::Owned(plain) => (plain.trim().to_owned(), true),
    }
}

/// Splits one question sentence at a wh-word that follows a comma, `and` or a semicolon
/// (a preposition may stand between: `, and on which day`).
fn split_clauses(body: &str) -> Vec<String> {
    const PREPOSITIONS: &[&str] = &["at", "on", "in", "for", "by", "from", "to", "with"];
    let toks: Vec<&str> = body.split_whitespace().collect();
    let mut clauses: Vec<String> = Vec::new();
    let mut start = 0;
    for i in 0..toks.len() {
        let clean = toks[i].trim_matches(|c: char| !c.is_alphanumeric() && c != '\'');
        if !is_wh(clean) {
            continue;
        }
        // Walk back over prepositions to the joint.
        let mut j = i;
        while j > start && PREPOSITIONS.contains(&toks[j - 1].to_lowercase().as_str()) {
            j -= 1;
        }
        if j < start + 3 {
            continue;
        }
        let before = toks[j - 1];
        let (end, next) = if before.eq_ignore_ascii_case("and") {
            (j - 1, j)
        } else if before.ends_with([',', ';', '?']) {
            (j, j)
        } else {
            continue;
        };
        clauses.push(toks[start..end].join(" "));
        start = next;
    }
    clauses.push(toks[start..].join(" "));
    clauses
        .into_iter()
        .map(|c| {
            c.trim()
                .trim_end_matches([',', ';', '?', '.'])
                .trim()
                .to_owned()
        })
        .filter(|c| c.chars().any(char::is_alphanumeric))
        .collect()
}

/// Splits a question into the sub-questions it asks, drawn from its own clauses: a lead-in
/// before a colon (`For Pepperkorn the greyhound: ...`) is context for every clause, and
/// clauses start at a wh-word after a comma or `and` (`..., and who is ...`). Each clause's
/// names are required of its evidence; the other clauses' names are context.
pub fn decompose(question: &str) -> Vec<SubQuestion> {
    // Sentences that ask nothing (`We are starting the Lumen greenhouse.`) are context.
    let mut lead_parts: Vec<String> = Vec::new();
    let mut asked: Vec<String> = Vec::new();
    for s in split_sentences(question.trim()) {
        let asks = s.ends_with('?') || words(&s).iter().any(|w| is_wh(w));
        if asks {
            asked.push(s);
        } else {
            lead_parts.push(s.trim_end_matches('.').to_owned());
        }
    }
    if asked.is_empty() {
        asked = std::mem::take(&mut lead_parts);
    }
    let mut clauses: Vec<String> = Vec::new();
    for q in &asked {
        let (l, body) = match q.split_once(": ") {
            Some((l, b))
                if l.split_whitespace().count() <= 16 && words(b).iter().any(|w| is_wh(w)) =>
            {
                (l.trim().to_owned(), b.trim().to_owned())
            }
            _ => (String::new(), q.clone()),
        };
        if !l.is_empty() {
            lead_parts.push(l);
        }
        // A clause that asks nothing (`I need to know three things for Anselm Vickery`) is
        // context, unless nothing else asks.
        let (asking, telling): (Vec<String>, Vec<String>) = split_clauses(&body)
            .into_iter()
            .partition(|c| words(c).iter().any(|w| is_wh(w)));
        if asking.is_empty() {
            clauses.extend(telling);
        } else {
            clauses.extend(asking);
            lead_parts.extend(telling);
        }
    }
    let lead = lead_parts.join(". ");
    let all_names: Vec<(usize, Vec<String>, Vec<String>)> = clauses
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (n, o) = entity_terms(c);
            (i, n, o)
        })
        .collect();
    let (lead_names, mut lead_other) = entity_terms(&format!("x {lead}"));
    // `Visitors keep asking me about the tropical house: …`: what the lead-in is about is
    // the topic of every clause, named or not.
    let lead_lower = lead.to_lowercase();
    if let Some(topic) = ["about ", "regarding ", "concerning "]
        .iter()
        .filter_map(|m| lead_lower.rfind(m).map(|i| &lead_lower[i + m.len()..]))
        .min_by_key(|t| t.len())
    {
        for t in terms_of(topic) {
            if !lead_names.contains(&t) && !lead_other.contains(&t) {
                lead_other.push(t);
            }
        }
    }
    let latest_words = [
        "latest",
        "recent",
        "last",
        "current",
        "currently",
        "newest",
        "now",
        "today",
    ];
    clauses
        .iter()
        .enumerate()
        .map(|(i, clause)| {
            // `who ended up with the solo`: the outcome, said with a verb that names
            // nothing the evidence states.
            let asked = clause;
            let (plain, outcome) = without_outcome_verb(clause);
            let clause = &plain;
            let (slot, slot_terms) = slot_of(clause);
            let mut terms: Vec<Term> = Vec::new();
            let add =
                |t: &str, weight: f32, required: bool, context: bool, terms: &mut Vec<Term>| {
                    if let Some(x) = terms.iter_mut().find(|x| x.term == t) {
                        x.weight = x.weight.max(weight);
                        x.required |= required;
                        x.context &= context;
                    } else {
                        terms.push(Term {
                            term: t.to_owned(),
                            weight,
                            required,
                            context,
                        });
                    }
                };
            let names = &all_names[i].1;
            for t in terms_of(clause) {
                if ASKING_WORDS.contains(&t.as_str()) {
                    continue;
                }
                let w = if names.contains(&t) {
                    2.0
                } else if all_names[i].2.contains(&t) {
                    1.5
                } else {
                    1.0
                };
                add(&t, w, names.contains(&t), false, &mut terms);
            }
            for t in &slot_terms {
                add(t, 1.5, false, false, &mut terms);
            }
            // Context: the lead-in and the other clauses' names.
            for t in lead_names.iter().chain(&lead_other) {
                add(t, 1.5, false, true, &mut terms);
            }
            // The lead-in's names give the topic; its other words (`I need three things
            // for an email`) rarely say where the fact is.
            for t in terms_of(&lead) {
                add(&t, 0.3, false, true, &mut terms);
            }
            for (j, n, o) in &all_names {
                if *j != i {
                    for t in n.iter().chain(o) {
                        add(t, 1.0, false, true, &mut terms);
                    }
                }
            }
            let text = if lead.is_empty() {
                format!("{asked}?")
            } else {
                format!("{lead}: {asked}?")
            };
            let lower = clause.to_lowercase();
            SubQuestion {
                text,
                slot,
                slot_terms,
                terms,
                latest: outcome
                    || words(&lower)
                        .iter()
                        .any(|w| latest_words.contains(&w.as_str())),
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Locating evidence
// ---------------------------------------------------------------------------------------

/// A unit located for a sub-question, with how well it matches and the span that answers
/// it, if it holds one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Located {
    /// The unit.
    pub unit: Unit,
    /// Weighted share (0 to 1) of the sub-question's terms the unit holds (terms only in
    /// the document name or heading count 0.7).
    pub score: f32,
    /// The value answering the sub-question, copied from the unit.
    pub span: Option<String>,
    /// Whether the unit says the fact is not settled yet (`Choreographer: TBC`, `pricing
    /// not set yet`): evidence that nobody can answer, which outranks weaker values.
    #[serde(default)]
    pub pending: bool,
}

/// The index terms of the weekday and month names (`Wednesday` -> `wednesday`).
fn calendar_terms() -> &'static [String] {
    static TERMS: OnceLock<Vec<String>> = OnceLock::new();
    TERMS.get_or_init(|| {
        WEEKDAYS_MONTHS
            .iter()
            .map(|d| terms_of(d).concat())
            .filter(|t| !t.is_empty())
            .collect()
    })
}

/// The revisions `text` states, as (old, new) values: `moved from 10 March to 17 March`,
/// `brought forward from 06:30 to 05:50`, `raised from 300` (no new value said), `15:00
/// (was 14:30 ...)`, `(previously 40 beds)`.
pub fn revisions(text: &str) -> Vec<(String, String)> {
    static FROM_TO: OnceLock<Regex> = OnceLock::new();
    static WAS: OnceLock<Regex> = OnceLock::new();
    static INSTEAD: OnceLock<Regex> = OnceLock::new();
    let from_to = re(
        &FROM_TO,
        r"(?i)\b(?:moved|moves|changed|changes|shifted|shifts|switches|brought forward|put back|pushed back|rescheduled|revised|raised|lowered|increased|reduced|cut|updated|rose|fell|went up|went down|switched|regraded|replaced|re-?booked|reassigned|transferred|handed over)\b[^.;]{0,40}?\bfrom ([^.;,()]{1,30}?)(?: to ([^.;,()]{1,30}?))?(?:[.;,()]|$| because| for | on | after | as | when )",
    );
    let was = re(
        &WAS,
        r"(?i)\((?:[^()]*?(?:[,;]|\s[—–-])\s*)?(?:was|previously|formerly|originally|until [^)]{0,20}?)\s+([^();,]{1,30})",
    );
    // `Abimbola covers the night shift instead of Gareth`: what is replaced is named after
    // the marker, and the new value before it (see `updated_value`).
    let instead = re(
        &INSTEAD,
        r"(?i)\b(?:instead of|in place of|rather than)\s+([^.;,()]{1,30}?)(?:[.;,()]|$| because| for | on | after | as | when )",
    );
    let mut out = Vec::new();
    for c in instead.captures_iter(text) {
        out.push((c[1].trim().to_owned(), String::new()));
    }
    for c in from_to.captures_iter(text) {
        let old = c[1].trim().to_owned();
        let new = c
            .get(2)
            .map_or(String::new(), |m| m.as_str().trim().to_owned());
        out.push((old, new));
    }
    for c in was.captures_iter(text) {
        out.push((c[1].trim().to_owned(), String::new()));
    }
    out
}

/// The hours (from, to) a part of the day the question names covers (`on the Saturday
/// morning` -> before noon).
fn day_part(sub: &SubQuestion) -> Option<(u32, u32)> {
    let lower = sub.text.to_lowercase();
    let words: Vec<&str> = lower.split(|c: char| !c.is_alphanumeric()).collect();
    if words.contains(&"morning") {
        Some((0, 12))
    } else if words.contains(&"afternoon") {
        Some((12, 18))
    } else if words.contains(&"evening") || words.contains(&"night") || words.contains(&"tonight") {
        Some((17, 24))
    } else {
        None
    }
}

/// The hour of a clock time (`14:30`, `2 pm`), as [`terms_of`] reads it.
fn hour_of(span: &str) -> Option<u32> {
    let t = terms_of(span).into_iter().find(|t| {
        t.len() == 5 && t.starts_with('t') && t[1..].chars().all(|c| c.is_ascii_digit())
    })?;
    t[1..3].parse().ok()
}

/// Whether `span` is a value of the wrong kind for `sub`: another dimension than asked
/// (`15 minutes` for a cost), or a time outside the part of the day asked.
fn unfit(sub: &SubQuestion, span: &str) -> bool {
    wrong_dimension(sub, span)
        || (sub.slot == Slot::Time && outside_day_part(sub, span))
        || (sub.slot == Slot::Count && is_year(span))
}

/// Whether `span` is a bare year (`2024`): a date, not a count of anything.
fn is_year(span: &str) -> bool {
    let t = span.trim();
    t.len() == 4
        && t.bytes().all(|b| b.is_ascii_digit())
        && (t.starts_with("19") || t.starts_with("20"))
}

/// Whether the time `span` lies outside the part of the day the question names.
fn outside_day_part(sub: &SubQuestion, span: &str) -> bool {
    match (day_part(sub), hour_of(span)) {
        (Some((from, to)), Some(h)) => h < from || h >= to,
        _ => false,
    }
}

/// Whether `text` says a fact is not settled (`TBC`, `to be confirmed`, `not set yet`,
/// `???`) or is kept elsewhere (`see invoice BR-1187`, `price on application`): either
/// way the unit states no value.
fn is_pending(text: &str) -> bool {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)\b(?:tbc|tbd|tba|to be (?:confirmed|decided|agreed|announced|set|fixed|published|finali[sz]ed|arranged|worked out)|(?:still )?being (?:finali[sz]ed|decided|worked out|discussed|negotiated)|not (?:yet )?(?:set|decided|confirmed|agreed|fixed|announced|published|finali[sz]ed)|(?:has|have)n[’']?t (?:yet )?(?:been )?(?:set|decided|confirmed|agreed|fixed|announced|published)|not been (?:set|decided|confirmed|agreed|published|finali[sz]ed)|undecided|awaiting (?:confirmation|a decision|(?:a |the )?quote)|waiting (?:for|on) (?:a |the )?(?:quote|confirmation|decision)|see (?:the |her |his |their )?(?:contract|invoice|agreement|quote)|to follow|on request|price on application|poa)\b|\?\?\?",
    )
    .is_match(text)
}

/// Whether `text` states a change to what was planned or listed (`the last climb moves to
/// 18:40`, `7204 works Diagram A instead`, `changed from 6c to 6b+`, `now the cover`): of
/// two units that answer alike, the one that updates the other is current.
fn is_update(text: &str) -> bool {
    marks_update(text, &revisions(text))
}

/// [`is_update`] for a text whose [`revisions`] are known already.
fn marks_update(text: &str, revisions: &[(String, String)]) -> bool {
    update_re().is_match(text) || !revisions.is_empty()
}

/// The words that mark an update (see [`is_update`]).
fn update_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)\b(?:now|instead of|instead|in place of|(?:moves?|moved|changed?|changes|increased|decreased|reduced|raised|lowered|cut|extended|shortened|put back|pushed back|brought forward|postponed|rescheduled|switched|swapped) (?:to|until|till|onto)|takes over|took over|replaced by|replaces|updated?|revised|amended|corrected|from now on|with effect from)\b",
    )
}

/// The value an update gives: the first of the slot's kind after its marker (`first
/// booked for 10 March was moved to 17 March` gives `17 March`); `revisions` are the
/// text's own [`revisions`].
fn updated_value(sub: &SubQuestion, text: &str, revisions: &[(String, String)]) -> Option<String> {
    let marker = update_re().find(text)?;
    // `brought forward from 06:30`: the value it came from is not the new one.
    let old: Vec<Vec<String>> = revisions.iter().map(|(o, _)| terms_of(o)).collect();
    let fits = |v: &String| {
        let vt = terms_of(v);
        !unfit(sub, v)
            && !old
                .iter()
                .any(|o| !vt.is_empty() && vt.iter().all(|t| o.contains(t)))
    };
    // `she is unavailable and Tiernan Castellane replaces her`: with these markers the
    // new value is the subject, the last of its kind before the marker in that clause.
    let lower = marker.as_str().to_lowercase();
    // So with `X instead of Y` and `X in place of Y`: Y is what X replaces.
    if [
        "replaces",
        "takes over",
        "took over",
        "instead of",
        "in place of",
    ]
    .contains(&lower.as_str())
    {
        let before = &text[..marker.start()];
        let clause = before.rsplit("; ").next().unwrap_or(before);
        let clause = clause.rsplit(". ").next().unwrap_or(clause);
        return typed_spans(sub.slot, clause).into_iter().rev().find(fits);
    }
    typed_spans(sub.slot, &text[marker.end()..])
        .into_iter()
        .find(fits)
}

/// Whether `text` marks what it states as past: `last year`, `last season`, `previously`,
/// `formerly`, `used to`, `no longer`.
fn superseded(text: &str) -> bool {
    let lower = text.to_lowercase().replace('’', "'");
    [
        "last year",
        "last season",
        "previously",
        "formerly",
        "used to",
        "no longer",
        "superseded",
        "out of date",
        "outdated",
    ]
    .iter()
    .any(|m| lower.contains(m))
}

/// `text` without its bracketed asides (`(last year 22 June)`).
fn without_asides(text: &str) -> String {
    static R: OnceLock<Regex> = OnceLock::new();
    re(&R, r"\([^()]*\)").replace_all(text, "").into_owned()
}

/// Extra terms (index terms, as [`terms_of`] gives them) a kind of slot matches in
/// evidence (a `where` question matches a venue).
fn slot_expansion(slot: Slot) -> &'static [&'static str] {
    match slot {
        Slot::Place => &["venu", "location", "room", "address"],
        _ => &[],
    }
}

/// The numbered ranges a text states, as (index term of the noun before them, from, to):
/// `Years 3–6` gives `("year", 3, 6)`, `rooms 10 to 14` gives `("room", 10, 14)`.
fn numbered_ranges(text: &str) -> Vec<(String, u32, u32)> {
    static R: OnceLock<Regex> = OnceLock::new();
    let r = re(
        &R,
        r"(?i)\b([a-z]+)\s+(\d{1,4})\s*(?:–|—|-|to)\s*(\d{1,4})\b",
    );
    r.captures_iter(text)
        .filter_map(|c| {
            let noun = terms_of(&c[1]).into_iter().next()?;
            let (from, to) = (c[2].parse().ok()?, c[3].parse().ok()?);
            (from < to).then_some((noun, from, to))
        })
        .collect()
}

/// Whether the number `term` is asked with a noun before it (`Year 4`) that names one of
/// `ranges` holding it.
fn in_named_range(question: &str, term: &str, ranges: &[(String, u32, u32)]) -> bool {
    let Ok(n) = term.parse::<u32>() else {
        return false;
    };
    if ranges.is_empty() {
        return false;
    }
    let ws = words(question);
    ws.windows(2).any(|w| {
        w[1] == term
            && terms_of(&w[0]).first().is_some_and(|noun| {
                ranges
                    .iter()
                    .any(|(r, from, to)| same_word(noun, r) && (*from..=*to).contains(&n))
            })
    })
}

/// How well `unit` matches `sub`: `None` when it lacks a required name.
pub fn score_unit(sub: &SubQuestion, unit: &Unit) -> Option<f32> {
    let text: HashSet<String> = terms_of(&unit.text).into_iter().collect();
    let context: HashSet<String> = terms_of(&unit.match_text()).into_iter().collect();
    let record: HashSet<String> = terms_of(&unit.record).into_iter().collect();
    let mut total = 0.0;
    let mut hit = 0.0;
    let mut context_hit = 0.0;
    // `what time`, `which day`: a unit stating a value of that kind names it.
    // `How long` asks for a duration or a length, words the evidence rarely uses: a unit
    // stating such a quantity (`soak them for 8 hours`) names it.
    let states_extent = || {
        quantity_re()
            .find_iter(&unit.text)
            .any(|q| matches!(dimension(q.as_str()), Some("time" | "length")))
    };
    let kind_word = |t: &str| match sub.slot {
        Slot::Time => t == "tim" && time_re().is_match(&unit.text),
        Slot::Date => ["date", "day"].contains(&t) && date_re().is_match(&unit.text),
        Slot::Quantity => EXTENT_TERMS.contains(&t) && states_extent(),
        _ => false,
    };
    // (Only a question asking a number can match a range.)
    let ranges = if sub.terms.iter().any(|t| t.term.parse::<u32>().is_ok()) {
        numbered_ranges(&unit.text)
    } else {
        Vec::new()
    };
    for t in &sub.terms {
        let got = if text.contains(&t.term) || kind_word(&t.term) {
            t.weight
        } else if in_named_range(&sub.text, &t.term, &ranges) {
            // `Year 4` in `Years 3–6`.
            0.7 * t.weight
        } else if t.term.len() >= 4 && text.iter().any(|x| same_word(&t.term, x)) {
            // Another form of the word (`drives` / `driver`, `insured` / `insurance`),
            // which the light stemmer keeps apart.
            0.7 * t.weight
        } else if context.contains(&t.term) {
            0.7 * t.weight
        } else if record.contains(&t.term) {
            // The record's other lines say what the line is about, not what it states.
            0.5 * t.weight
        } else if t.required {
            return None;
        } else {
            0.0
        };
        if t.context {
            context_hit += got;
        }
        hit += got;
        // Context counts only where it is found.
        total += if t.context { got } else { t.weight };
    }
    // `Where is it held?` names no noun of its own: the evidence is a venue, a location.
    // Asked that way, the slot's kind is one of the clause's own terms.
    let expansion = slot_expansion(sub.slot);
    if !expansion.is_empty() && sub.slot_terms.is_empty() {
        total += 1.5;
        if expansion.iter().any(|t| text.contains(*t)) {
            hit += 1.5;
        } else if expansion.iter().any(|t| context.contains(*t)) {
            hit += 0.7 * 1.5;
        }
    }
    if total <= 0.0 {
        return None;
    }
    // Context costs nothing where it is missing, but of two units that match the clause
    // alike, the one that also matches its context (`U12` of `our Under-12s game`) is
    // the one meant.
    let mut score = hit / total * (1.0 + (0.05 * context_hit).min(0.2));
    // A value marked as past (`last year's heather gave 231 jars`) is a near miss, unless
    // the question asks about the past itself.
    // The heading or the document may say it (`# Harvest Fair takings — last year`).
    // An aside in brackets (`first flower of the season (last year 22 June)`) dates only
    // itself.
    let past = superseded(&without_asides(&unit.text))
        || superseded(&unit.heading)
        || superseded(&unit.document);
    if past && !superseded(&sub.text) {
        score *= 0.6;
    }
    // A unit about another day or month than the one asked (`Monday chemistry` for a
    // Wednesday question) is a near miss.
    let calendar = calendar_terms();
    let asked: Vec<&String> = calendar
        .iter()
        .filter(|d| sub.terms.iter().any(|t| t.term == **d))
        .collect();
    if !asked.is_empty() {
        // The day may be said by the unit, its heading or its document (`Bookings — Sunday`).
        let other = calendar
            .iter()
            .any(|d| !asked.contains(&d) && context.contains(d));
        let same = asked.iter().any(|d| context.contains(*d));
        if other && !same {
            score *= 0.5;
        }
    }
    Some(score)
}

/// How much a unit's score keeps when the sub-question names something its node's
/// documents never mention ([`unused_names`]).
const UNNAMED_WEIGHT: f32 = 0.85;

/// `sub` with its required names that no unit of `units` holds (in its text, heading or
/// document name) made context; `None` when it has none. A node whose documents never say the organisation's
/// name (`Quillbrook`) still answers for it.
fn unused_names(sub: &SubQuestion, units: &[Unit]) -> Option<SubQuestion> {
    let required: Vec<&Term> = sub.terms.iter().filter(|t| t.required).collect();
    if required.is_empty() || units.is_empty() {
        return None;
    }
    let mut seen: HashSet<String> = HashSet::new();
    for u in units {
        seen.extend(terms_of(&u.match_text()));
        seen.extend(terms_of(&u.text));
    }
    // The same forms of a word that `score_unit` accepts (`potter` in `Pottery`).
    let used = |t: &str| seen.contains(t) || (t.len() >= 4 && seen.iter().any(|x| same_word(t, x)));
    let unused: Vec<String> = required
        .iter()
        .filter(|t| !used(&t.term))
        .map(|t| t.term.clone())
        .collect();
    if unused.is_empty() {
        return None;
    }
    let mut relaxed = sub.clone();
    for t in &mut relaxed.terms {
        if unused.contains(&t.term) {
            t.required = false;
            t.context = true;
        }
    }
    Some(relaxed)
}

/// Whether `unit` is a table row whose first cell is a name (capitalised) that shares no
/// term (in any of its forms) with `sub`, and which holds none of the names `sub` still
/// requires.
fn keyed_by_other_name(sub: &SubQuestion, unit: &Unit) -> bool {
    if unit.fields.len() < 2 {
        return false;
    }
    let key = unit.fields[0].1.trim();
    if !key.starts_with(|c: char| c.is_uppercase()) {
        return false;
    }
    let text = terms_of(&unit.text);
    let named = |k: &String| sub.terms.iter().any(|t| same_word(&t.term, k));
    let names_asked = sub
        .terms
        .iter()
        .any(|t| t.required && text.contains(&t.term));
    !terms_of(key).iter().any(named) && !names_asked
}

/// How much of its score a unit keeps when it names another variant of what is asked
/// about ([`other_variant`]).
const OTHER_VARIANT_WEIGHT: f32 = 0.5;

/// The numbered variants a text names with a hyphenated compound (`ten-class pass`,
/// `3-seater`, `12-week course`), as (number, index term of the noun).
fn variants(text: &str) -> Vec<(u32, String)> {
    static R: OnceLock<Regex> = OnceLock::new();
    let r = re(
        &R,
        r"(?i)\b(\d{1,4}|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty|fifty|hundred)-([a-z]{3,})\b",
    );
    const WORDS: [(&str, u32); 17] = [
        ("one", 1),
        ("two", 2),
        ("three", 3),
        ("four", 4),
        ("five", 5),
        ("six", 6),
        ("seven", 7),
        ("eight", 8),
        ("nine", 9),
        ("ten", 10),
        ("eleven", 11),
        ("twelve", 12),
        ("fifteen", 15),
        ("twenty", 20),
        ("thirty", 30),
        ("fifty", 50),
        ("hundred", 100),
    ];
    r.captures_iter(text)
        .filter_map(|c| {
            let n = c[1].to_lowercase();
            let n = n
                .parse::<u32>()
                .ok()
                .or_else(|| WORDS.iter().find(|(w, _)| *w == n).map(|(_, v)| *v))?;
            let noun = terms_of(&c[2]).into_iter().next()?;
            Some((n, noun))
        })
        .collect()
}

/// Whether `unit` names a numbered variant of a thing `question` names with another number
/// (`5-class pass` against `ten-class pass`), and not the one asked.
fn other_variant(question: &str, unit: &str) -> bool {
    let asked = variants(question);
    if asked.is_empty() {
        return false;
    }
    let stated = variants(unit);
    !stated.iter().any(|s| asked.contains(s))
        && asked
            .iter()
            .any(|(n, noun)| stated.iter().any(|(m, x)| x == noun && m != n))
}

/// How much more a value that names the kind asked for (`Hotel De Zwaan` for `which
/// hotel`) weighs than other evidence.
const KIND_NAMED_BOOST: f32 = 1.2;

/// How much more an update that states a value weighs than other evidence.
const UPDATE_BOOST: f32 = 1.2;

/// What a listing's evidence weighs once an update at the same node replaces its value (see
/// [`supersede_listings`]); the same halving as a value a revision names as the old one.
const SUPERSEDED_WEIGHT: f32 = 0.5;

/// The best units of `units` for `sub`, best first (at most `k`); equally good units are
/// ordered by position, the later first when the sub-question asks for the latest or the
/// document is a log.
pub fn locate(sub: &SubQuestion, units: &[Unit], k: usize) -> Vec<Located> {
    // Values that a unit of these documents says were revised (`moved from 10 March to 17
    // March`, `15:00 (was 14:30)`): found elsewhere, they are near misses.
    let revised: Vec<Vec<(String, String)>> = units.iter().map(|u| revisions(&u.text)).collect();
    let superseded_values: Vec<Vec<String>> = revised
        .iter()
        .flatten()
        .map(|(old, _)| terms_of(old))
        .filter(|t| !t.is_empty())
        .collect();
    // A name these documents never use (`Quillbrook`, the orchard every node works for) is
    // their setting, not another entity: required of no unit here, its evidence is weaker.
    let relaxed = unused_names(sub, units);
    let sub = relaxed.as_ref().unwrap_or(sub);
    let unnamed = if relaxed.is_some() {
        UNNAMED_WEIGHT
    } else {
        1.0
    };
    let mut out: Vec<Located> = units
        .iter()
        .enumerate()
        .filter_map(|(i, u)| {
            // A table row keyed by another name (`Horse: Bramble` when Dulcie is asked
            // about) is about that entity, whatever the rest of the node says.
            if relaxed.is_some() && keyed_by_other_name(sub, u) {
                return None;
            }
            let mut score = score_unit(sub, u)? * unnamed;
            if score <= 0.0 {
                return None;
            }
            let pending = is_pending(&u.text);
            let mut span = if pending { None } else { extract(sub, u) };
            // An update states the old value and the new one: the new one answers.
            if span.is_some() {
                if let Some(v) = updated_value(sub, &u.text, &revised[i]) {
                    span = Some(v);
                }
            }
            if let Some(v) = &span {
                let vt = terms_of(v);
                let revised_here = revised[i]
                    .iter()
                    .any(|(_, new)| terms_of(new).iter().any(|t| vt.contains(t)));
                let is_old =
                    |old: &Vec<String>| !vt.is_empty() && vt.iter().all(|t| old.contains(t));
                if !revised_here && superseded_values.iter().any(is_old) {
                    score *= SUPERSEDED_WEIGHT;
                }
            }
            // `until 10:30` says when something stops: for a question about when
            // something starts (`what time can people get in`) it is the weaker evidence.
            if sub.slot == Slot::Time && !asks_end(sub) {
                if let Some(v) = &span {
                    let before = u
                        .text
                        .find(v.as_str())
                        .map_or("", |i| u.text[..i].trim_end());
                    let lower = before.to_lowercase();
                    if lower.ends_with("until") || lower.ends_with("till") {
                        score *= 0.9;
                    }
                }
            }
            // `the 5-class pass` when the ten-class one is asked about: another variant.
            if other_variant(&sub.text, &u.text) {
                score *= OTHER_VARIANT_WEIGHT;
            }
            // `Hotel De Zwaan` for `which hotel`: the value says it is of the kind asked.
            if matches!(sub.slot, Slot::Place | Slot::Thing) {
                if let Some(v) = &span {
                    let vt = terms_of(v);
                    if sub.slot_terms.iter().any(|t| vt.contains(t)) {
                        score *= KIND_NAMED_BOOST;
                    }
                }
            }
            // An update that states a value outranks the listing it updates.
            if span.is_some() && (marks_update(&u.text, &revised[i]) || is_update(&u.heading)) {
                score *= UPDATE_BOOST;
            }
            Some(Located {
                span,
                unit: u.clone(),
                score,
                pending,
            })
        })
        .collect();
    supersede_listings(sub, &mut out);
    out.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            // A value under a name that says what was asked (`Weight: 5.4 kg`) is better
            // evidence than one found by its kind in prose.
            .then_with(|| {
                named_value(sub, &b.unit)
                    .is_some()
                    .cmp(&named_value(sub, &a.unit).is_some())
            })
            // Of two dated records of one document that match equally, the later one is
            // the current one (the latest weigh-in, the rescheduled delivery).
            .then_with(|| {
                if a.unit.document != b.unit.document || a.unit.fields.is_empty() {
                    return std::cmp::Ordering::Equal;
                }
                match (date_key(&a.unit.text), date_key(&b.unit.text)) {
                    (Some(x), Some(y)) => y.cmp(&x),
                    _ => std::cmp::Ordering::Equal,
                }
            })
            .then_with(|| {
                let later = sub.latest || is_log(&a.unit) || is_log(&b.unit);
                if a.unit.document == b.unit.document && later {
                    b.unit.position.cmp(&a.unit.position)
                } else {
                    std::cmp::Ordering::Equal
                }
            })
    });
    out.truncate(k);
    out
}

/// The names a sub-question asks about: its clause's own (required), and the lead-in's.
fn asked_names(sub: &SubQuestion) -> Vec<&str> {
    sub.terms
        .iter()
        .filter(|t| t.required || (t.context && t.weight >= 1.5))
        .map(|t| t.term.as_str())
        .collect()
}

/// A change note applied to the listing it changes: where a unit that states an update
/// (`the dental check moved to Thu 16 April`, `glaze load moves to Kiln B, fired to
/// 1222°C`) names everything the sub-question names in a listing (a table row, a line) and
/// gives another value of the kind asked, the listing's value is the old one. It weighs
/// [`SUPERSEDED_WEIGHT`] of its score, and the update takes at least the listing's score,
/// so that an update worded further from the question still outranks what it replaces.
/// Only a listing whose names are all in the update counts, so a note about another entity
/// of the same node changes nothing.
fn supersede_listings(sub: &SubQuestion, out: &mut [Located]) {
    let names = asked_names(sub);
    if names.is_empty() {
        return;
    }
    let terms_in = |l: &Located| l.unit.stated_terms();
    let updates: Vec<(usize, Vec<String>, Vec<String>)> = out
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.pending && (is_update(&l.unit.text) || is_update(&l.unit.heading)))
        .filter_map(|(i, l)| Some((i, terms_of(l.span.as_ref()?), terms_in(l))))
        // `extended in 2024 (previously 40 beds)`: the value it names is the old one.
        .filter(|(i, value, _)| {
            !value.is_empty()
                && !revisions(&out[*i].unit.text)
                    .iter()
                    .any(|(old, _)| value.iter().all(|t| terms_of(old).contains(t)))
        })
        .collect();
    if updates.is_empty() {
        return;
    }
    let mut raise: Vec<(usize, f32)> = Vec::new();
    for (i, l) in out.iter_mut().enumerate() {
        if updates.iter().any(|(u, ..)| *u == i) {
            continue;
        }
        let Some(value) = l.span.as_ref().map(|v| terms_of(v)) else {
            continue;
        };
        let keyed: Vec<&str> = {
            let here = terms_in(l);
            names
                .iter()
                .copied()
                .filter(|n| here.iter().any(|t| t == n))
                .collect()
        };
        if keyed.is_empty() {
            continue;
        }
        let replacing = updates.iter().find(|(_, new, terms)| {
            *new != value && keyed.iter().all(|n| terms.iter().any(|t| t == n))
        });
        if let Some((u, ..)) = replacing {
            raise.push((*u, l.score));
            l.score *= SUPERSEDED_WEIGHT;
        }
    }
    for (u, score) in raise {
        out[u].score = out[u].score.max(score);
    }
}

/// A revision one node states, applied to the value another node lists (`Marchbank moved
/// from 11:30 to 12:15` at the chapel, `time booked: 11:30` on the arrangement sheet): where a
/// hit's value is a revision's new value and its unit names something the sub-question
/// asks about, a hit of another node whose value is that revision's old one weighs
/// [`SUPERSEDED_WEIGHT`] of its score, and the revision takes at least that hit's score.
/// [`locate`] does the same within one node.
fn supersede_across_nodes(sub: &SubQuestion, hits: &mut [NodeHit]) {
    let names = asked_names(sub);
    // (index, old value's terms) of every hit whose value is a revision's new value.
    let revised: Vec<(usize, Vec<String>)> = hits
        .iter()
        .enumerate()
        .filter(|(_, h)| !h.located.pending)
        .filter(|(_, h)| {
            let here = h.located.unit.stated_terms();
            names.iter().any(|n| here.iter().any(|t| t == n))
        })
        .flat_map(|(i, h)| {
            let value = h.located.span.as_deref().map(terms_of).unwrap_or_default();
            revisions(&h.located.unit.text)
                .into_iter()
                .filter(move |(old, new)| {
                    let new = terms_of(new);
                    !value.is_empty()
                        && value.iter().all(|t| new.contains(t))
                        && !terms_of(old).is_empty()
                })
                .map(move |(old, _)| (i, terms_of(&old)))
        })
        .collect();
    let mut raise: Vec<(usize, f32)> = Vec::new();
    for (i, old) in &revised {
        let node = hits[*i].node_id.clone();
        for h in hits.iter_mut().filter(|h| h.node_id != node) {
            let Some(value) = h.located.span.as_deref().map(terms_of) else {
                continue;
            };
            if !value.is_empty() && value.iter().all(|t| old.contains(t)) {
                raise.push((*i, h.located.score));
                h.located.score *= SUPERSEDED_WEIGHT;
            }
        }
    }
    for (i, score) in raise {
        hits[i].located.score = hits[i].located.score.max(score);
    }
}

fn is_log(u: &Unit) -> bool {
    let h = format!("{} {}", u.document, u.heading).to_lowercase();
    ["log", "history", "record"].iter().any(|w| h.contains(w))
}

// ---------------------------------------------------------------------------------------
// Spans
// ---------------------------------------------------------------------------------------

/// A pattern compiled once. The patterns are constants of this file, and
/// `every_pattern_compiles` compiles each of them, so a typo fails the tests, not a node.
fn re(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("a constant pattern of grounded.rs"))
}

fn quantity_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)[£$€]\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:k|m|bn)\b)?(?:\s?(?:per|/|a|an)\s(?:night|day|week|month|year|hour|person|head|jar|kg|item))?|(?:[£$€]\s?)?\b\d[\d,]*(?:\.\d+)?\s?(?:%|°\s?[CF]\b|per cent\b|percent\b|(?:kg|g|mg|tonnes?|t|lb|lbs|kilograms?|grams?|litres?|liters?|l|ml|mL|cl|nautical miles?|miles?|nm|kilometres?|kilometers?|metres?|meters?|m|cm|mm|km|kw|kW|w|mw|kwh|v|volts?|[kmg]?hz|a|amps?|M|mm|mol|min|mins|minutes?|hours?|hrs?|h|seconds?|secs?|s|days?|weeks?|months?|years?|knots?|mph|km/h|pence|p|degrees?(?: celsius)?|people|passengers|units|pieces|boxes|pallets|seats|beds|places)\b(?:\s?(?:per|/)\s?[a-z]+)?)",
    )
}

fn count_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(&R, r"\b\d[\d,]*(?:\.\d+)?(?: [a-z]+)?\b")
}

/// Clock times for [`terms_of`]: `2 pm`, `2:30pm`, `14:00`, `noon` (a decimal such as
/// `2.35` is no time).
fn clock_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)\b(\d{1,2})(?:[:.](\d{2}))?\s?([ap])\.?m\b\.?|\b(\d{1,2}):(\d{2})\b|\bnoon\b",
    )
}

/// A conversion statement: `1 <unit> = <number> <unit>` (or `is`, `as`, `equals`).
fn conversion_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)\b1 ((?:nautical |statute )?[a-z]+)\s*(?:=|is|as|equals|makes)\s*(?:about |roughly )?(\d[\d,]*(?:\.\d+)?)\s?([a-z]+)\b",
    )
}

/// `Sat` / `Sun` before a number, for [`terms_of`].
fn weekend_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(&R, r"\b(Sat|Sun)(\.?,?\s+\d)")
}

/// An age group however it is written (`Under-12s`, `under 12`, `U12`, `U-12s`), for
/// [`terms_of`].
fn age_group_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(&R, r"(?i)\b(?:under[- ]?|u-?)(\d{1,2})s?\b")
}

fn number_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(&R, r"\b\d[\d,]*(?:\.\d+)?\b")
}

fn time_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)\b\d{1,2}[:.]\d{2}\s?(?:[ap]\.?m\.?)?|\b\d{1,2}\s?[ap]\.?m\.?|\bnoon\b|\bmidnight\b",
    )
}

fn date_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)\b(?:(?:mon|tues|wednes|thurs|fri|satur|sun)day(?:,? \d{1,2}(?:st|nd|rd|th)?(?: (?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*)?)?|\d{1,2}(?:st|nd|rd|th)? (?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*(?: \d{4})?|(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]* \d{1,2}(?:st|nd|rd|th)?(?:,? \d{4})?)\b",
    )
}

fn person_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"\b[A-Z][a-zà-ÿ'’]+(?:[- ](?:[A-Z][a-zà-ÿ'’]+|de|van|von|da|del|al))*[- ][A-Z][a-zà-ÿ'’]+(?:-[A-Z][a-zà-ÿ'’]+)?\b",
    )
}

fn code_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"\b(?:[A-Z]{1,4}[- ]?\d{1,5}[A-Z]?|\d{1,3}[A-Z]{1,2}|(?:Floor|Level|Room|Lab|Gate|Ch|Channel|Bay|Stand|Platform|Desk|Shelf|Berth|Pitch|Court)\.? ?[A-Z]?\d{1,4}[A-Z]?|\d{1,2}(?:st|nd|rd|th) floor)\b",
    )
}

fn place_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"\b[A-Z][\w'’]+(?: (?:of|the|and|on|de)?\s?[A-Z][\w'’]+)*\b",
    )
}

/// Candidate spans of `text` that are values of the kind `slot` asks for, in order.
fn typed_spans(slot: Slot, text: &str) -> Vec<String> {
    let found = |r: &Regex| -> Vec<String> {
        r.find_iter(text)
            .map(|m| m.as_str().trim().to_owned())
            .collect()
    };
    match slot {
        Slot::Person => found(person_re()),
        Slot::Time => found(time_re()),
        Slot::Date => {
            let mut v = found(date_re());
            if v.is_empty() {
                v = found(time_re());
            }
            v
        }
        Slot::Quantity => {
            let mut v = found(money_conversion_re());
            v.extend(found(conversion_re()));
            v.extend(found(quantity_re()));
            v
        }
        // A count is no clock time (`14` of `14:00`).
        // A count is no measure (`60–90 cm`) and no part of a range.
        Slot::Count => count_re()
            .find_iter(text)
            .filter(|m| {
                let after = &text[m.end()..];
                let before = &text[..m.start()];
                // `one per 40 skaters` and `2 in every 100 donors` are rates, not counts.
                let rate = ["per", "every", "each"]
                    .iter()
                    .any(|w| before.trim_end().to_lowercase().ends_with(&format!(" {w}")))
                    || {
                        // After the number itself (the match may hold the next word).
                        let digits = m.as_str().split_whitespace().next().unwrap_or("");
                        let rest = text[m.start() + digits.len()..].trim_start().to_lowercase();
                        rest.starts_with("in every")
                            || rest
                                .strip_prefix("in ")
                                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
                    };
                // `10` of `10 March` or `March 10` is a day of a date.
                let bare = |w: Option<&str>| {
                    w.unwrap_or("")
                        .trim_matches(|c: char| !c.is_alphanumeric())
                        .to_owned()
                };
                // (`May` only as a name: `5 may be late` is a count.)
                let month = |w: &str| {
                    let lower = w.to_lowercase();
                    let full = calendar_abbreviation(&lower).unwrap_or(&lower);
                    WEEKDAYS_MONTHS[7..].contains(&full) && (full != "may" || w == "May")
                };
                // (A word before the number is part of its date only with nothing between.)
                let previous = before
                    .split_whitespace()
                    .last()
                    .filter(|w| before.ends_with(' ') && w.ends_with(char::is_alphabetic));
                let date_part = month(&bare(text[m.start()..].split_whitespace().nth(1)))
                    || month(&bare(previous));
                !rate
                    && !date_part
                    && !after.starts_with([':', '.', '–', '-'])
                    && !before.ends_with([':', '.', '–', '-'])
                    && !measured(&text[m.start()..])
            })
            .map(|m| m.as_str().trim().to_owned())
            .collect(),
        Slot::Place => {
            let mut v = found(code_re());
            // A capitalised word is a name only past the start of the text, or with others.
            v.extend(
                place_re()
                    .find_iter(text)
                    .filter(|m| m.start() > 0 || m.as_str().contains(' '))
                    .map(|m| m.as_str().to_owned())
                    .filter(|p| !WEEKDAYS_MONTHS.contains(&p.to_lowercase().as_str())),
            );
            v
        }
        Slot::Thing => {
            let mut v = found(quantity_re());
            v.extend(found(code_re()));
            v.extend(found(person_re()));
            v
        }
    }
}

/// What a quantity measures: `money`, `mass`, `volume`, `length`, `time` (a duration),
/// `temperature` or `percent`; `None` for a bare number or a count of things.
fn dimension(span: &str) -> Option<&'static str> {
    if span.contains(['£', '$', '€']) {
        return Some("money");
    }
    if span.contains('°') {
        return Some("temperature");
    }
    static HZ: OnceLock<Regex> = OnceLock::new();
    if re(&HZ, r"(?i)\d\s?[kmg]?hz\b").is_match(span) {
        return Some("frequency");
    }
    let q = parse_quantity(span)?;
    match q.unit.as_str() {
        "%" => Some("percent"),
        "pounds" | "euros" | "dollars" | "pence" | "p" => Some("money"),
        "miles" | "mile" | "nautical" | "nm" => Some("length"),
        u => ["mass", "volume", "length", "time"]
            .into_iter()
            .zip(["g", "ml", "cm", "s"])
            .find(|(_, base)| conversion(u, base).is_some())
            .map(|(d, _)| d),
    }
}

/// What the slot's words say the asked quantity measures (`cost` -> money, `weigh` ->
/// mass), as [`dimension`] names it.
fn asked_dimension(sub: &SubQuestion) -> Option<&'static str> {
    const KINDS: &[(&str, &[&str])] = &[
        (
            "money",
            &[
                "cost",
                "price",
                "fee",
                "charg",
                "pay",
                "spend",
                "expensive",
                "cheap",
                "fare",
                "rent",
            ],
        ),
        ("mass", &["weight", "weigh", "heavy", "heaviest", "mass"]),
        ("temperature", &["temperature", "warm", "hot", "cold"]),
        (
            "length",
            &[
                "distance", "far", "tall", "height", "depth", "deep", "wide", "width",
            ],
        ),
    ];
    // A question that names the unit it wants (`in kilograms`) may need a conversion of
    // another dimension (litres of fuel to its mass).
    if !matches!(sub.slot, Slot::Quantity) || asked_unit(&sub.text).is_some() {
        return None;
    }
    // `fare` and `far` share a stem: the question's own word tells them apart.
    let fare = words(&sub.text)
        .iter()
        .any(|w| w.eq_ignore_ascii_case("fare") || w.eq_ignore_ascii_case("fares"));
    let named = |t: &str| -> String {
        if fare && t == "far" {
            "fare".to_owned()
        } else {
            t.to_owned()
        }
    };
    // The words as written, else as index terms (`price` is `pric`).
    let kinds = |stemmed: bool| -> Vec<&'static str> {
        KINDS
            .iter()
            .filter(|(_, ws)| {
                sub.slot_terms.iter().any(|t| {
                    let t = named(t);
                    ws.iter().any(|w| {
                        *w == t || (stemmed && terms_of(w).first().is_some_and(|x| *x == t))
                    })
                })
            })
            .map(|(d, _)| *d)
            .collect()
    };
    let exact = kinds(false);
    let found = if exact.is_empty() { kinds(true) } else { exact };
    // One kind, or none said for sure.
    match found.as_slice() {
        [d] => Some(*d),
        _ => None,
    }
}

/// The slot terms of a `how long` question (`long` and the dimensions it names, see
/// `slot_of`): it asks for a duration or a length.
const EXTENT_TERMS: &[&str] = &["long", "length", "duration"];

/// Whether `span` measures something other than what `sub` asks (`15 minutes` for a cost).
fn wrong_dimension(sub: &SubQuestion, span: &str) -> bool {
    // `How long` asks for a duration or a length, never a price or a weight.
    let extent = sub.slot == Slot::Quantity
        && asked_unit(&sub.text).is_none()
        && sub
            .slot_terms
            .iter()
            .any(|t| EXTENT_TERMS.contains(&t.as_str()));
    match (asked_dimension(sub), dimension(span)) {
        (_, Some(d)) if extent => !matches!(d, "time" | "length"),
        (Some(a), Some(d)) => a != d,
        _ => false,
    }
}

/// Whether `text` starts with a measurement of length, mass, volume or a percentage
/// (`60 cm`), which is no count of things.
fn measured(text: &str) -> bool {
    quantity_re().find(text).is_some_and(|q| {
        q.start() == 0
            && parse_quantity(q.as_str()).is_some_and(|x| {
                x.unit == "%"
                    || ["g", "ml", "cm"]
                        .iter()
                        .any(|base| conversion(&x.unit, base).is_some())
            })
    })
}

/// Whether `part` is the last word of the compound `word` (`night` of `overnight`,
/// `flower` of `sunflower`).
fn compound_of(word: &str, part: &str) -> bool {
    part.len() >= 5 && word.len() >= part.len() + 2 && word.ends_with(part)
}

/// Whether two index terms are forms of one word: equal, or one is the other with a
/// derivational ending (`driv` / `driver`, `insur` / `insuranc`, `weigh` / `weight`). Other
/// shared beginnings are other words (`temperat` of `Temperate House` is not
/// `temperatur`).
/// Whether `x` is `term` in another form (`drives` / `driver`) or a compound holding it:
/// how [`score_unit`] matches a term the light stemmer keeps apart.
fn same_word(term: &str, x: &str) -> bool {
    term_matches(x, term) || compound_of(term, x)
}

fn term_matches(a: &str, b: &str) -> bool {
    const ENDINGS: &[&str] = &[
        "e", "er", "or", "ar", "ing", "ed", "anc", "enc", "ment", "ion", "ation", "ition", "al",
        "ial", "ity", "y", "ly", "iv", "ist", "ant", "ent", "ee", "ery", "ship", "ure", "ful",
        "less", "able", "ibl", "ic", "t",
    ];
    if a == b {
        return true;
    }
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    short.len() >= 4
        && long
            .strip_prefix(short)
            .is_some_and(|rest| ENDINGS.contains(&rest))
}

/// Whether a value only repeats the question (the entity asked about is no answer).
/// A person asked for is someone other than the names the question gives (`who travels
/// with it to Kestrel Bay` is not answered by `Kestrel Bay Maritime Museum`).
fn only_repeats(sub: &SubQuestion, value: &str) -> bool {
    let ts = terms_of(value);
    if ts.is_empty() {
        return false;
    }
    if sub.slot == Slot::Person {
        let named = |t: &String| {
            sub.terms
                .iter()
                .any(|q| q.term == *t && q.weight >= 1.5 && !sub.slot_terms.contains(&q.term))
        };
        if ts.iter().any(named) {
            return true;
        }
    }
    ts.iter().all(|t| sub.terms.iter().any(|q| q.term == *t))
}

/// The day of the year (roughly: month × 31 + day) of the first date in `text`, to order
/// dated records.
fn date_key(text: &str) -> Option<u32> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let m = date_re().find(text)?.as_str().to_lowercase();
    let mut day = None;
    let mut month = None;
    for w in m
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let digits: String = w.chars().take_while(char::is_ascii_digit).collect();
        if !digits.is_empty() && digits.len() <= 2 {
            day = day.or(digits.parse::<u32>().ok());
        } else if w.len() >= 3 {
            month = month.or(MONTHS.iter().position(|x| w.starts_with(x)));
        }
    }
    Some(month? as u32 * 31 + day?)
}

fn cell_fits(slot: Slot, value: &str) -> bool {
    if !value.chars().any(char::is_alphanumeric) {
        return false;
    }
    match slot {
        // A date (`2 May`) or a time has capitals too, but it is nobody.
        // A person is named (`Obi Strand`, `Mrs Hale`): `TBC`, `Act 2, ballroom` or a
        // date are nobody.
        Slot::Person => {
            person_re().is_match(value)
                && !value.chars().any(|c| c.is_ascii_digit())
                && !date_re().is_match(value)
        }
        Slot::Quantity | Slot::Count => value.chars().any(|c| c.is_ascii_digit()),
        Slot::Time => time_re().is_match(value),
        Slot::Date => date_re().is_match(value) || time_re().is_match(value),
        Slot::Place | Slot::Thing => true,
    }
}

/// The value of `unit` that answers `sub`, copied verbatim: the cell (or `key: value`
/// value) under a name matching the slot's words; else, after the slot's noun in the
/// text (`gate B14`); else the first value of the slot's kind that does not merely repeat
/// the question. `None` when the unit holds no such value.
pub fn extract(sub: &SubQuestion, unit: &Unit) -> Option<String> {
    // A dated note (`14 June: the giant lily's first flower`) is dated by its name.
    if sub.slot == Slot::Date && unit.fields.len() == 1 {
        let key = unit.fields[0].0.trim();
        if date_re().find(key).is_some_and(|m| m.as_str() == key) && !restates(sub, &unit.text) {
            return Some(key.to_owned());
        }
    }
    let span = first_value(sub, unit)?;
    match counted_after(sub, &unit.text, &span) {
        Some(Counted::Asked(whole)) => Some(whole),
        Some(Counted::Other) => None,
        None => Some(range_end(sub, &unit.text, &span).unwrap_or(span)),
    }
}

/// What the words after a count say it counts (see [`counted_after`]).
#[derive(Debug, PartialEq)]
enum Counted {
    /// The noun the question counts, a few words after the number: the count with it
    /// (`6 patrol tents` for `how many tents`, where the count span alone stops at
    /// `6 patrol`).
    Asked(String),
    /// Another plural noun (`24 touring pitches` for `how many dogs`): the number answers
    /// another question about the same place.
    Other,
}

/// What the count `span` of `text` counts, for a sub-question asking how many of a noun
/// ([`counted_noun`]): read from up to three words after the number, within its phrase.
/// `None` when those words name no plural noun, or name one that counts whatever is meant
/// (`1,200 copies` of a prospectus).
fn counted_after(sub: &SubQuestion, text: &str, span: &str) -> Option<Counted> {
    static WORD: OnceLock<Regex> = OnceLock::new();
    const ANY: [&str; 8] = [
        "copies", "units", "items", "pieces", "pairs", "sets", "times", "others",
    ];
    if sub.slot != Slot::Count {
        return None;
    }
    let noun = terms_of(&counted_noun(&sub.text)?);
    let at = text.find(span)?;
    let rest = at + span.split_whitespace().next()?.len();
    for w in re(&WORD, r"\S+").find_iter(&text[rest..]).take(3) {
        let bare = w.as_str().trim_end_matches(|c: char| !c.is_alphanumeric());
        if bare.is_empty() || !bare.chars().all(|c| c.is_alphabetic() || c == '-') {
            return None;
        }
        if terms_of(bare).iter().any(|t| noun.contains(t)) {
            let whole = text[at..rest + w.start() + bare.len()].trim().to_owned();
            return (whole.len() > span.len()).then_some(Counted::Asked(whole));
        }
        let lower = bare.to_lowercase();
        let plural = lower.len() >= 4
            && lower.ends_with('s')
            && !["ss", "us", "is"].iter().any(|e| lower.ends_with(e));
        if plural {
            return (!ANY.contains(&lower.as_str())).then_some(Counted::Other);
        }
        if bare.len() != w.as_str().len() {
            // Punctuation ends the phrase.
            return None;
        }
    }
    None
}

/// Whether the clause asks when something ends (`what time do the glasshouses shut`).
fn asks_end(sub: &SubQuestion) -> bool {
    let clause = sub
        .text
        .rsplit(": ")
        .next()
        .unwrap_or(&sub.text)
        .to_lowercase();
    words(&clause).iter().any(|w| {
        [
            "close", "closes", "closing", "shut", "shuts", "finish", "finishes", "end", "ends",
            "until", "till",
        ]
        .contains(&w.as_str())
    })
}

/// The end of the range that `span` starts in `text` (`10:00–16:30`), when the question
/// asks when something ends.
fn range_end(sub: &SubQuestion, text: &str, span: &str) -> Option<String> {
    static R: OnceLock<Regex> = OnceLock::new();
    let to = re(&R, r"(?i)^\s*(?:–|—|-|to|until|till)\s*");
    if sub.slot != Slot::Time || !asks_end(sub) {
        return None;
    }
    let at = text.find(span)? + span.len();
    let rest = &text[at..];
    let gap = to.find(rest)?;
    let end = time_re().find(&rest[gap.end()..])?;
    (end.start() == 0).then(|| end.as_str().trim().to_owned())
}

/// The first value of the slot's kind in `unit` (see [`extract`]).
fn first_value(sub: &SubQuestion, unit: &Unit) -> Option<String> {
    // A question, or a note that repeats the question (`asked how many books`), asks for
    // the fact; it does not state it.
    if unit.text.trim_end().ends_with('?') || restates(sub, &unit.text) {
        return None;
    }
    // 1. A named field whose name matches the slot's words.
    if let Some(v) = named_value(sub, unit).filter(|v| !unfit(sub, v)) {
        return Some(v);
    }
    // 1b. Of several fields with a value of the kind asked, the one the question's other
    // words name (`Night: 21°C` for `how warm overnight`).
    if matches!(
        sub.slot,
        Slot::Quantity | Slot::Count | Slot::Time | Slot::Date
    ) {
        // (The lead-in's words count: `a full day in Studio A: what does that come to`.)
        let others: Vec<String> = sub
            .terms
            .iter()
            .filter(|t| !sub.slot_terms.contains(&t.term))
            .map(|t| t.term.clone())
            .collect();
        let fitting = unit
            .fields
            .iter()
            .filter(|(_, v)| !typed_spans(sub.slot, v).is_empty())
            .count();
        if fitting > 1 {
            if let Some(v) = best_named_field(sub, unit, &others)
                .and_then(|v| typed_spans(sub.slot, v).into_iter().next())
                .filter(|v| !unfit(sub, v))
            {
                return Some(v);
            }
        }
    }
    // 1c. A record none of whose fields the slot's words name: the field that the clause's
    // other words name (`Food texture: Level 5` for `what consistency does his food have`).
    // Names and numbers say which record, not which field.
    if sub.slot == Slot::Thing && unit.fields.len() > 1 {
        let (names, numbers) = entity_terms(&sub.text);
        let others: Vec<String> = sub
            .terms
            .iter()
            .filter(|t| !t.context && !sub.slot_terms.contains(&t.term))
            .filter(|t| !names.contains(&t.term) && !numbers.contains(&t.term))
            .map(|t| t.term.clone())
            .collect();
        if let Some(v) = best_named_field(sub, unit, &others).filter(|v| !unfit(sub, v)) {
            return Some(v.to_owned());
        }
    }
    // 2. A value right after the slot's noun in the text (`from gate B14`, `Floor 4`), or a
    // number right before it (`97.8 FM`).
    let specific_noun = matches!(sub.slot, Slot::Place | Slot::Thing) && !sub.slot_terms.is_empty();
    if specific_noun {
        // ASCII lowercasing keeps byte offsets, so they index the original text.
        let lower = unit.text.to_ascii_lowercase();
        for s in &sub.slot_terms {
            let mut from = 0;
            while let Some(i) = lower[from..].find(s.as_str()) {
                let at = from + i;
                from = at + s.len();
                let starts_word = !lower[..at].ends_with(|c: char| c.is_alphanumeric());
                if !starts_word {
                    continue;
                }
                let after = &unit.text[at..];
                let window: String = after
                    .split_whitespace()
                    .take(4)
                    .collect::<Vec<_>>()
                    .join(" ");
                if let Some(m) = code_re().find(&window) {
                    return Some(m.as_str().to_owned());
                }
                if sub.slot == Slot::Thing {
                    if let Some(v) = linked_phrase(after) {
                        if !only_repeats(sub, &v) {
                            return Some(v);
                        }
                    }
                }
                let noun = after.split_whitespace().next().unwrap_or("");
                let noun = noun.trim_end_matches(|c: char| !c.is_alphanumeric());
                let before = unit.text[..at].trim_end();
                if let Some(m) = number_re().find_iter(before).last() {
                    if m.end() == before.len() {
                        return Some(format!("{} {noun}", m.as_str()));
                    }
                }
            }
        }
    }
    // 3. A value of the slot's kind, in a field first; in a revision, its new value
    // (`moved from 10 March to 17 March`).
    let news: Vec<String> = revisions(&unit.text)
        .into_iter()
        .map(|(_, new)| new)
        .filter(|n| !n.is_empty())
        .collect();
    let mut values: Vec<&str> = news.iter().map(String::as_str).collect();
    if unit.fields.is_empty() {
        values.push(unit.text.as_str());
    } else {
        // A person is not found under a column that names another kind of value
        // (`Address: 4 Alder Rise`, `Venue: Hall Green`).
        values.extend(
            unit.fields
                .iter()
                .filter(|(k, _)| sub.slot != Slot::Person || !names_other_kind(k))
                .map(|(_, v)| v.as_str()),
        );
    }
    for v in values {
        for span in typed_spans(sub.slot, v) {
            if unfit(sub, &span) {
                continue;
            }
            if !(only_repeats(sub, &span) || specific_noun && sub.slot == Slot::Thing) {
                if sub.slot == Slot::Place && unit.fields.len() > 1 {
                    // A table row holds a place only under a column naming one (step 1 or
                    // below); its other codes are of another kind.
                    continue;
                }
                return Some(span);
            }
        }
    }
    None
}

/// The phrase a word links to (`allergic to latex; ...` -> `latex`, `colour is sage
/// green.` -> `sage green`): after the word and a linking word, up to the next punctuation,
/// at most six words. `text` starts with the word.
fn linked_phrase(text: &str) -> Option<String> {
    const LINKS: &[&str] = &["to", "is", "are", "was", "were", "of", "with", "="];
    let mut ws = text.split_whitespace();
    let first = ws.next()?;
    // `colour: blue` is a named field (see `named_value`); prose links with a word.
    if first.ends_with(|c: char| !c.is_alphanumeric()) {
        return None;
    }
    let link = ws.next()?;
    if !LINKS.contains(&link.to_lowercase().as_str()) {
        return None;
    }
    let mut out: Vec<&str> = Vec::new();
    for w in ws {
        let stop = w.ends_with([',', ';', '.', ':', ')', '(']) || w.starts_with('(');
        let bare = w.trim_matches(|c: char| !c.is_alphanumeric() && c != '-');
        if bare.is_empty() {
            break;
        }
        out.push(bare);
        if stop || out.len() == 6 {
            break;
        }
    }
    if out.is_empty() || out.len() == 6 && !text.contains([';', ',', '.']) {
        return None;
    }
    Some(out.join(" "))
}

/// Whether `text` holds the sub-question's own wh-phrase (`how many`, `which gate`).
fn restates(sub: &SubQuestion, text: &str) -> bool {
    let clause = sub.text.rsplit(": ").next().unwrap_or(&sub.text);
    let ws: Vec<String> = words(clause).iter().map(|w| w.to_lowercase()).collect();
    let Some(i) = ws.iter().position(|w| is_wh(w)) else {
        return false;
    };
    let Some(next) = ws.get(i + 1) else {
        return false;
    };
    let phrase = format!("{} {next}", ws[i]);
    words(text)
        .iter()
        .map(|w| w.to_lowercase())
        .collect::<Vec<_>>()
        .join(" ")
        .contains(&phrase)
}

/// Whether a field's name names a kind of value that is never a person (a place, a
/// date or time, an amount or a count: see [`kind_names`]).
fn names_other_kind(key: &str) -> bool {
    let kt = terms_of(key);
    [
        Slot::Place,
        Slot::Date,
        Slot::Time,
        Slot::Quantity,
        Slot::Count,
    ]
    .iter()
    .flat_map(|s| kind_names(*s))
    .filter_map(|n| terms_of(n).into_iter().next())
    .any(|n| kt.contains(&n))
}

/// Field names that say what kind of value a field holds (`Quantity: 1,200` answers a
/// `how many` question), as index terms.
fn kind_names(slot: Slot) -> &'static [&'static str] {
    match slot {
        Slot::Count => &["quantity", "number", "count", "total", "qty"],
        Slot::Quantity => &["amount", "price", "fee", "cost", "value", "total"],
        Slot::Date => &["date", "day", "due"],
        Slot::Time => &["time", "start"],
        // `which pub`: a row's `Venue` or `Location` names it.
        Slot::Place => &["venu", "location", "address", "place"],
        _ => &[],
    }
}

/// The value of a field of `unit` whose name matches the most of the slot's words and
/// that fits the slot's kind (a number, time or date copied without the words around it).
/// When no field is named by the slot's words, a field named by the slot's kind
/// (`Quantity: 1,200` for `how many`).
fn named_value(sub: &SubQuestion, unit: &Unit) -> Option<String> {
    // With no words of its own (`where is it held`), the slot is named by its kind.
    let own: Vec<String> = if sub.slot_terms.is_empty() {
        slot_expansion(sub.slot)
            .iter()
            .map(|t| t.to_string())
            .collect()
    } else {
        sub.slot_terms.clone()
    };
    // As index terms (`time` is `tim`), as the field names' terms are.
    let kind: Vec<String> = kind_names(sub.slot)
        .iter()
        .filter_map(|t| terms_of(t).into_iter().next())
        .collect();
    let v = [own, kind]
        .iter()
        .find_map(|names| best_named_field(sub, unit, names))?;
    let narrow = matches!(
        sub.slot,
        Slot::Quantity | Slot::Count | Slot::Time | Slot::Date
    );
    match typed_spans(sub.slot, v).into_iter().next() {
        Some(t) if narrow => Some(t),
        _ if narrow && sub.slot == Slot::Count => None,
        _ => Some(v.to_owned()),
    }
}

/// The value of the field of `unit` whose name matches the most of `names` and that fits
/// the slot.
fn best_named_field<'a>(sub: &SubQuestion, unit: &'a Unit, names: &[String]) -> Option<&'a str> {
    let mut best: Option<(usize, &str)> = None;
    for (k, v) in &unit.fields {
        let kt = terms_of(k);
        let hits = names
            .iter()
            .filter(|s| kt.iter().any(|t| term_matches(t, s) || compound_of(s, t)))
            .count();
        if hits > 0
            && cell_fits(sub.slot, v)
            && !only_repeats(sub, v)
            && best.is_none_or(|(h, _)| hits > h)
        {
            best = Some((hits, v));
        }
    }
    best.map(|(_, v)| v)
}

/// Names and codes of `unit` that the sub-question does not mention: what a bridge
/// question asks about next (`CV 317`, `Larch`, `Persistence`).
pub fn link_terms(sub: &SubQuestion, unit: &Unit) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    // What a revision in the unit replaced (`reassigned from Kerry Quinn`) is no longer the
    // entity it names: following it leads to the old holder's value.
    let old: HashSet<String> = revisions(&unit.text)
        .iter()
        .flat_map(|(o, _)| terms_of(o))
        .collect();
    let sources: Vec<&str> = if unit.fields.is_empty() {
        vec![unit.text.as_str()]
    } else {
        unit.fields.iter().map(|(_, v)| v.as_str()).collect()
    };
    for s in sources {
        for (i, w) in words(s).iter().enumerate() {
            let has_digit = w.chars().any(|c| c.is_ascii_digit());
            let cap = capitalised(w) && (i > 0 || !unit.fields.is_empty());
            if !(has_digit || cap) {
                continue;
            }
            // A code's number (`S-031`, `LD-2291`) names it; a bare number does not.
            let code = has_digit && w.chars().any(char::is_alphabetic);
            for t in terms_of(w) {
                let known = sub.terms.iter().any(|q| q.term == t);
                let weekday = WEEKDAYS_MONTHS.contains(&t.as_str());
                let named = code || t.chars().any(char::is_alphabetic);
                if !known && !weekday && !out.contains(&t) && named && !old.contains(&t) {
                    out.push(t);
                }
            }
        }
    }
    out
}

/// The follow-up sub-question of a bridge: the same slot asked about the link entity
/// found in `unit` (the link names and the slot's words weigh most; the question it came
/// from is context).
pub fn follow_up(sub: &SubQuestion, unit: &Unit, link: &[String]) -> SubQuestion {
    let mut terms: Vec<Term> = link
        .iter()
        .map(|t| Term {
            term: t.clone(),
            weight: 2.0,
            required: false,
            context: false,
        })
        .collect();
    for t in &sub.slot_terms {
        if !terms.iter().any(|x| &x.term == t) {
            terms.push(Term {
                term: t.clone(),
                weight: 2.0,
                required: false,
                context: false,
            });
        }
    }
    for t in &sub.terms {
        if !terms.iter().any(|x| x.term == t.term) {
            terms.push(Term {
                term: t.term.clone(),
                weight: 0.3,
                required: false,
                context: true,
            });
        }
    }
    let named: Vec<&str> = unit
        .fields
        .iter()
        .map(|(_, v)| v.as_str())
        .filter(|v| link.iter().any(|l| terms_of(v).contains(l)))
        .collect();
    let about = if named.is_empty() {
        link.join(" ")
    } else {
        named.join(", ")
    };
    SubQuestion {
        text: format!("{} (about {about})", sub.text.trim_end_matches('?')),
        slot: sub.slot,
        slot_terms: sub.slot_terms.clone(),
        terms,
        latest: sub.latest,
    }
}

/// Share of `sub`'s weighted terms found in any of `units` (a chain of evidence).
pub fn chain_score(sub: &SubQuestion, units: &[&Unit]) -> f32 {
    let all: HashSet<String> = units
        .iter()
        .flat_map(|u| terms_of(&u.match_text()))
        .collect();
    let found = |t: &&Term| all.contains(&t.term);
    let hit: f32 = sub.terms.iter().filter(found).map(|t| t.weight).sum();
    // Context counts only where it is found (as in `score_unit`).
    let total: f32 = sub
        .terms
        .iter()
        .filter(|t| !t.context || found(t))
        .map(|t| t.weight)
        .sum();
    if total > 0.0 {
        hit / total
    } else {
        0.0
    }
}

// ---------------------------------------------------------------------------------------
// Calculations
// ---------------------------------------------------------------------------------------

/// A number with its unit, read from a span (`4,150 litres`, `0.80 kg per litre`).
#[derive(Debug, Clone, PartialEq)]
pub struct Quantity {
    /// The value.
    pub value: f64,
    /// Canonical unit (`kg`, `l`, ...; empty for none).
    pub unit: String,
    /// Canonical unit after `per` / `/` (a rate), if any.
    pub per: Option<String>,
    /// The span as written.
    pub text: String,
}

fn canonical_unit(u: &str) -> String {
    let u = u.trim().trim_end_matches('.').to_lowercase();
    let u = u.as_str();
    match u {
        "kilogram" | "kilograms" | "kg" | "kgs" => "kg",
        "gram" | "grams" | "g" => "g",
        "tonne" | "tonnes" | "t" => "t",
        "litre" | "litres" | "liter" | "liters" | "l" => "l",
        "millilitre" | "millilitres" | "ml" => "ml",
        "metre" | "metres" | "meter" | "meters" | "m" => "m",
        "centimetre" | "centimetres" | "cm" => "cm",
        "kilometre" | "kilometres" | "kilometer" | "kilometers" | "km" => "km",
        "minute" | "minutes" | "min" | "mins" => "min",
        "hour" | "hours" | "h" | "hr" | "hrs" => "h",
        "second" | "seconds" | "s" | "sec" | "secs" => "s",
        "percent" | "per cent" | "%" => "%",
        "nautical mile" | "nautical miles" | "nmi" => "nmi",
        "mile" | "miles" | "mi" | "statute mile" | "statute miles" => "mi",
        "foot" | "feet" | "ft" => "ft",
        "inch" | "inches" | "in" => "in",
        "pound" | "pounds" | "lb" | "lbs" => "lb",
        "gallon" | "gallons" | "gal" => "gal",
        // Money (`pounds` stays a weight: `£` says sterling).
        "€" | "eur" | "euro" | "euros" => "eur",
        "£" | "gbp" | "sterling" => "gbp",
        "$" | "usd" | "dollar" | "dollars" => "usd",
        other => other,
    }
    .to_owned()
}

/// Whether `u` (canonical) is a unit of measurement this file knows (`in the morning`
/// names none).
fn is_unit(u: &str) -> bool {
    ["g", "ml", "cm", "s"]
        .iter()
        .any(|base| conversion(u, base).is_some())
        || ["mi", "nmi", "ft", "in", "lb", "gal", "%"].contains(&u)
        || is_currency(u)
}

/// Whether `u` (canonical) is a currency.
fn is_currency(u: &str) -> bool {
    ["eur", "gbp", "usd"].contains(&u)
}

/// The symbol a currency is written with.
fn currency_symbol(u: &str) -> Option<&'static str> {
    match u {
        "eur" => Some("€"),
        "gbp" => Some("£"),
        "usd" => Some("$"),
        _ => None,
    }
}

/// An exchange rate stated with symbols: `£1 = €1.15`.
fn money_conversion_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"([£$€])\s?1(?:\.00?)?\s*(?:=|is|buys)\s*([£$€])\s?(\d+(?:\.\d+)?)",
    )
}

/// Factor to convert `from` into `to` when both measure the same thing.
fn conversion(from: &str, to: &str) -> Option<f64> {
    let scale = |u: &str| -> Option<(&'static str, f64)> {
        Some(match u {
            "kg" => ("mass", 1000.0),
            "g" => ("mass", 1.0),
            "t" => ("mass", 1_000_000.0),
            "l" => ("volume", 1000.0),
            "ml" => ("volume", 1.0),
            "km" => ("length", 100_000.0),
            "m" => ("length", 100.0),
            "cm" => ("length", 1.0),
            "h" => ("time", 3600.0),
            "min" => ("time", 60.0),
            "s" => ("time", 1.0),
            _ => return None,
        })
    };
    if from == to {
        return Some(1.0);
    }
    let (a, fa) = scale(from)?;
    let (b, fb) = scale(to)?;
    (a == b).then_some(fa / fb)
}

/// Whether `unit` (canonical) measures something (mass, volume, length, time, percent)
/// rather than counting things.
fn is_measure(unit: &str) -> bool {
    unit == "%"
        || conversion(unit, "g").is_some()
        || conversion(unit, "ml").is_some()
        || conversion(unit, "cm").is_some()
        || conversion(unit, "s").is_some()
}

/// Reads a quantity from a span.
pub fn parse_quantity(span: &str) -> Option<Quantity> {
    // A conversion statement (`1 nautical mile = 1.852 km`, `count 1 mile as 1.6 km`) is a
    // rate: 1.852 km per nautical mile.
    if let Some(c) = conversion_re().captures(span) {
        let value: f64 = c[2].replace(',', "").parse().ok()?;
        return Some(Quantity {
            value,
            unit: canonical_unit(&c[3]),
            per: Some(canonical_unit(&c[1])),
            // Shown as the rate it is (the citation quotes the statement).
            text: format!("{} {} per {}", &c[2], &c[3], &c[1]),
        });
    }
    // An exchange rate (`£1 = €1.15`) is a rate too: 1.15 euros per pound sterling.
    if let Some(c) = money_conversion_re().captures(span) {
        let value: f64 = c[3].parse().ok()?;
        return Some(Quantity {
            value,
            unit: canonical_unit(&c[2]),
            per: Some(canonical_unit(&c[1])),
            text: format!("{}{} per {}1", &c[2], &c[3], &c[1]),
        });
    }
    let m = number_re().find(span)?;
    let value: f64 = m.as_str().replace(',', "").parse().ok()?;
    let rest = span[m.end()..].trim();
    // `£28 per ringer`: the symbol before the number is the unit.
    if let Some(sym) = span[..m.start()].trim_end().chars().last() {
        if matches!(sym, '£' | '€' | '$') {
            let per = rest
                .strip_prefix("per ")
                .or_else(|| rest.strip_prefix('/'))
                .and_then(|p| p.split_whitespace().next())
                .map(canonical_unit);
            return Some(Quantity {
                value,
                unit: canonical_unit(&sym.to_string()),
                per,
                text: span.trim().to_owned(),
            });
        }
    }
    let (unit, per) = match rest.split_once(" per ").or_else(|| rest.split_once('/')) {
        Some((u, p)) => (
            u.trim(),
            Some(canonical_unit(p.split_whitespace().next().unwrap_or(""))),
        ),
        None => (rest, None),
    };
    // Two-word units first (`nautical miles`).
    let two: String = unit
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let unit = if canonical_unit(&two) != two.to_lowercase() {
        two.as_str()
    } else {
        unit.split_whitespace().next().unwrap_or("")
    };
    Some(Quantity {
        value,
        unit: canonical_unit(unit),
        per,
        text: span.trim().to_owned(),
    })
}

/// The quantities of a record's fields, for an amount times a rate: a bare number takes
/// the noun of its field's name as its unit (`Updos: 5` is 5 updos, `Changeovers in
/// August: 5` is 5 changeovers), and a price under `Per X` is a rate per X (`Per
/// changeover: £65`).
fn field_quantities(unit: &Unit) -> Vec<Quantity> {
    let mut out = Vec::new();
    for (k, v) in &unit.fields {
        let Some(mut q) = parse_quantity(v) else {
            continue;
        };
        let key = k.trim().to_lowercase();
        let (per_key, noun_of) = match key.strip_prefix("per ") {
            Some(rest) => (true, rest.to_owned()),
            None => (false, key.clone()),
        };
        // The key's head noun: its first word (`changeovers` of `changeovers in august`).
        let noun = noun_of
            .split(|c: char| !c.is_alphanumeric())
            .find(|w| !w.is_empty())
            .unwrap_or("")
            .to_owned();
        if noun.is_empty() || noun.chars().any(|c| c.is_ascii_digit()) {
            continue;
        }
        if per_key {
            if q.per.is_some() || !is_currency(&q.unit) {
                continue;
            }
            q.per = Some(canonical_unit(&noun));
            q.text = format!("{} per {noun}", v.trim());
        } else if q.per.is_none() && !q.unit.chars().any(char::is_alphabetic) {
            // (`5 (1, 8, 15 and 26 August)`: what follows the number is no unit.)
            q.unit = canonical_unit(&noun);
            q.text = format!("{} {noun}", v.trim());
        }
        out.push(q);
    }
    out
}

/// What a calculation question asks to do with the numbers it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CalcOp {
    /// How much is left between two amounts of one kind (`how much more`, `headroom`).
    Difference,
    /// An amount times a rate (`litres` × `kg per litre`).
    Product,
    /// Two amounts of one kind added up (`adding up the casks at the Fox and at the
    /// festival`).
    Sum,
    /// What something comes to in all (`what will the updos come to altogether`), where
    /// the question does not say how: an amount times a rate where one of the two is a
    /// rate, else the two amounts added up. The operands' units decide, not the wording.
    Total,
}

/// The unit a question asks its answer in (`in kilograms`), canonical.
pub fn asked_unit(question: &str) -> Option<String> {
    let lower = question.to_lowercase();
    let ws: Vec<&str> = lower
        .split(|c: char| !c.is_alphanumeric() && c != '%')
        .filter(|w| !w.is_empty())
        .collect();
    ws.windows(2).find_map(|w| {
        let u = canonical_unit(w[1]);
        (w[0] == "in" && is_unit(&u)).then_some(u)
    })
}

/// Whether the question asks for a difference between two amounts.
pub fn asks_difference(question: &str) -> bool {
    let lower = question.to_lowercase();
    [
        "how much more",
        "how many more",
        "left",
        "remaining",
        "spare",
        "headroom",
        "short of",
        "difference",
        "still need",
        "still have to",
        "to go",
        // `how many extra … after using what's in the store`: what is needed less what is held.
        "after using",
        "after we use",
        "once we've used",
        "once we have used",
    ]
    .iter()
    .any(|c| lower.contains(c))
}

/// Whether `text` asks for two amounts added up (`adding up X and Y`, `X and Y combined`)
/// rather than an amount times a rate.
pub fn asks_sum(text: &str) -> bool {
    static R: OnceLock<Regex> = OnceLock::new();
    re(&R, r"(?i)\b(?:add(?:ing|ed)? up|combined)\b").is_match(text)
}

/// Whether `text` asks what something comes to in all (`what does the order come to`,
/// `in total`, `altogether`, `all told`, `add up to`). A bare `total` is not enough: `the
/// total capacity of the hall` is a stated figure.
pub fn asks_total(text: &str) -> bool {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)\b(?:(?:come|comes|came|coming) to|in total|altogether|all told|all in all|adds? up to|added up to)\b",
    )
    .is_match(text)
}

/// What a `how many (more)` question counts: the last word of the noun phrase after it
/// (`how many more white ranunculus stems do we …` → `stems`).
fn counted_noun(question: &str) -> Option<String> {
    let lower = question.to_lowercase();
    let ws = words(&lower);
    let at = ws.iter().position(|w| w == "many")?;
    let stop = [
        "still", "left", "in", "on", "at", "for", "of", "to", "than", "that",
    ];
    let np: Vec<&String> = ws[at + 1..]
        .iter()
        .skip_while(|w| matches!(w.as_str(), "more" | "fewer" | "extra" | "additional"))
        .take_while(|w| !AUX.contains(&w.as_str()) && !stop.contains(&w.as_str()))
        .collect();
    np.last()
        .filter(|w| w.chars().all(char::is_alphabetic))
        .map(|w| w.to_string())
}

/// A calculation over two cited quantities: the expression with its inputs and result.
#[derive(Debug, Clone, PartialEq)]
pub struct Calculation {
    /// `2.8 kg − 2.35 kg = 0.45 kg`.
    pub shown: String,
    /// The result with its unit (`0.45 kg`).
    pub result: String,
}

fn format_qty(x: f64, unit: &str) -> String {
    let rounded = (x * 1000.0).round() / 1000.0;
    let int = rounded.trunc() as i64;
    let frac = rounded - rounded.trunc();
    let mut digits = int.abs().to_string();
    let mut grouped = String::new();
    while digits.len() > 3 {
        let tail = digits.split_off(digits.len() - 3);
        grouped = format!(",{tail}{grouped}");
    }
    grouped = format!("{}{digits}{grouped}", if int < 0 { "-" } else { "" });
    if frac.abs() > 1e-9 {
        let f = format!("{:.3}", frac.abs());
        grouped.push_str(f.trim_start_matches('0').trim_end_matches('0'));
    }
    match currency_symbol(unit) {
        Some(sym) if !grouped.starts_with('-') => {
            // Money to the penny: `£206.40`, `€598`.
            let cents = (x * 100.0).round() / 100.0;
            if (cents - cents.trunc()).abs() > 1e-9 {
                let whole = format_qty(cents.trunc(), "");
                format!(
                    "{sym}{whole}.{:02}",
                    ((cents - cents.trunc()) * 100.0).round() as i64
                )
            } else {
                format!("{sym}{grouped}")
            }
        }
        _ if unit.is_empty() => grouped,
        _ => format!("{grouped} {unit}"),
    }
}

/// The factor that takes `b` into `a`'s unit, when the two are amounts of one kind that can
/// be subtracted or added: two counts of things (`163 bookings`, `220 places`) as numbers
/// (1), two measures only when one converts into the other, never a rate.
fn same_kind_factor(a: &Quantity, b: &Quantity) -> Option<f64> {
    if a.per.is_some() || b.per.is_some() {
        return None;
    }
    if !is_measure(&a.unit) && !is_measure(&b.unit) {
        Some(1.0)
    } else {
        conversion(&b.unit, &a.unit)
    }
}

/// Combines `a` and `b` as `op` asks, when their units allow it: a difference of two
/// amounts of one kind (in the unit of the larger, or the other's when the larger is a bare
/// number; also in grams/millilitres when below 1),
/// their sum (in the first one's unit), or an amount times a rate per that amount's unit.
/// The arithmetic is the calculator's.
pub fn calculate(op: CalcOp, a: &Quantity, b: &Quantity) -> Option<Calculation> {
    let eval = |expr: String| super::tools::evaluate(&expr).ok();
    match op {
        CalcOp::Difference => {
            let f = same_kind_factor(a, b)?;
            // The larger amount first; the smaller one in the larger one's unit.
            let (big, small, small_in_big) = if a.value >= b.value * f {
                (a, b, b.value * f)
            } else {
                (b, a, a.value / f)
            };
            // `14` (a bare count) less `9 rolls`: 5 rolls.
            let unit = if big.unit.is_empty() {
                &small.unit
            } else {
                &big.unit
            };
            let r = eval(format!("{} - {small_in_big}", big.value))?;
            let mut result = format_qty(r, unit);
            if r.abs() < 1.0 {
                let sub = match unit.as_str() {
                    "kg" => Some("g"),
                    "l" => Some("ml"),
                    "m" => Some("cm"),
                    _ => None,
                };
                if let Some(su) = sub {
                    let k = conversion(unit, su)?;
                    result = format!("{result} ({})", format_qty(r * k, su));
                }
            }
            Some(Calculation {
                shown: format!("{} − {} = {result}", big.text, small.text),
                result,
            })
        }
        CalcOp::Sum => {
            let f = same_kind_factor(a, b)?;
            let r = eval(format!("{} + {}", a.value, b.value * f))?;
            // `11` (a bare count) and `26 firkins`: 37 firkins.
            let unit = if a.unit.is_empty() { &b.unit } else { &a.unit };
            let result = format_qty(r, unit);
            Some(Calculation {
                shown: format!("{} + {} = {result}", a.text, b.text),
                result,
            })
        }
        CalcOp::Total => match (&a.per, &b.per) {
            // Amounts of one kind (`11` and `26 casks` count alike), but never money and
            // a bare number (`£25` and the `8.3` of a colour code).
            (None, None) if is_currency(&a.unit) == is_currency(&b.unit) => {
                calculate(CalcOp::Sum, a, b)
            }
            (None, None) => None,
            (Some(_), Some(_)) => None,
            _ => calculate(CalcOp::Product, a, b),
        },
        CalcOp::Product => {
            let (amount, rate) = match (&a.per, &b.per) {
                (None, Some(_)) => (a, b),
                (Some(_), None) => (b, a),
                _ => return None,
            };
            let per = rate.per.as_deref()?;
            // `7` ringers (a bare count from a `Ringers` column) × `£28 per ringer`.
            // `6 updos` × `£48 per updo`: the counted noun is the rate's.
            let counted = |u: &str| u == per || u.strip_suffix('s') == Some(per);
            let f = if (amount.unit.is_empty() || counted(&amount.unit)) && !is_unit(per) {
                1.0
            } else {
                conversion(&amount.unit, per)?
            };
            let r = eval(format!("{} * {} * {}", amount.value, f, rate.value))?;
            let result = format_qty(r, &rate.unit);
            Some(Calculation {
                shown: format!("{} × {} = {result}", amount.text, rate.text),
                result,
            })
        }
    }
}

// ---------------------------------------------------------------------------------------
// Answers
// ---------------------------------------------------------------------------------------

/// A task's structured result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Answer {
    /// At most [`MAX_ANSWER_WORDS`] words.
    pub answer: String,
    /// Evidence of every fact used.
    pub citations: Vec<Citation>,
    /// How far it goes.
    pub status: AnswerStatus,
}

/// One answered (or unanswered) part of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartAnswer {
    /// The sub-question.
    pub question: String,
    /// The value, copied from evidence (or computed from cited values); `None`: not found.
    pub value: Option<String>,
    /// The evidence.
    pub citations: Vec<Citation>,
}

/// Fills the answer template from the parts: the values, in the order asked, joined by
/// `;`; an unanswered part says `unknown: <sub-question>`. Cut to [`MAX_ANSWER_WORDS`].
pub fn compose(parts: &[PartAnswer]) -> Answer {
    let found = parts.iter().filter(|p| p.value.is_some()).count();
    let status = if parts.is_empty() || found == 0 {
        AnswerStatus::Unknown
    } else if found == parts.len() {
        AnswerStatus::Answered
    } else {
        AnswerStatus::Partial
    };
    let mut text = if found == 0 {
        let q = parts
            .first()
            .map(|p| p.question.as_str())
            .unwrap_or("the question");
        format!(
            "unknown: no node in the swarm holds the answer to \"{}\"",
            q.trim()
        )
    } else {
        parts
            .iter()
            .map(|p| match &p.value {
                Some(v) => v.clone(),
                None => format!("unknown: {}", p.question.trim()),
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let ws: Vec<&str> = text.split_whitespace().collect();
    if ws.len() > MAX_ANSWER_WORDS {
        text = ws[..MAX_ANSWER_WORDS].join(" ");
    }
    if !text.ends_with(['.', '?', '!', '"']) {
        text.push('.');
    }
    let mut citations: Vec<Citation> = Vec::new();
    for c in parts.iter().flat_map(|p| &p.citations) {
        if !citations.contains(c) {
            citations.push(c.clone());
        }
    }
    Answer {
        answer: text,
        citations,
        status,
    }
}

// ---------------------------------------------------------------------------------------
// Routing: which node answers which sub-question
// ---------------------------------------------------------------------------------------

/// Evidence one node located for a sub-question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeHit {
    /// The node.
    pub node_id: String,
    /// What it located.
    pub located: Located,
    /// How well the node's agent card matches the sub-question ([`card_prior`]): breaks
    /// ties between equally good units of different nodes.
    #[serde(default)]
    pub prior: f32,
}

/// Weighted share of `sub`'s own terms (context aside) that the agent card `card` holds:
/// of two nodes whose documents match equally (`Date: 3 Nov` at the nurse's, `Day: 12 Nov`
/// at the theatre scheduler's), the one whose card says it keeps such facts.
pub fn card_prior(sub: &SubQuestion, card: &str) -> f32 {
    let terms: HashSet<String> = terms_of(card).into_iter().collect();
    let (mut hit, mut total) = (0.0, 0.0);
    for t in sub.terms.iter().filter(|t| !t.context) {
        total += t.weight;
        if terms.contains(&t.term)
            || (t.term.len() >= 4 && terms.iter().any(|x| term_matches(x, &t.term)))
        {
            hit += t.weight;
        }
    }
    if total > 0.0 {
        hit / total
    } else {
        0.0
    }
}

/// Least [`Located::score`] for evidence to count as found.
pub const MIN_SCORE: f32 = 0.3;

/// Most units one node returns for one sub-question. A node holding many documents (or
/// every document, as the benchmark's oracle does) needs room for both numbers of a
/// calculation, a bridge start and the near misses that outrank them.
pub const LOCATE_K: usize = 8;
/// How much more of the question a chain of two units must cover than the best single
/// unit before a bridge is preferred.
pub const CHAIN_MARGIN: f32 = 0.15;

/// How a sub-question is answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "route", rename_all = "snake_case")]
pub enum Route {
    /// One node holds the value.
    Direct {
        /// The node.
        node_id: String,
    },
    /// One node names an entity whose value another node holds.
    Bridge {
        /// The node naming the entity.
        first: String,
        /// The node holding the value (as probed; the follow-up goes to the swarm's best).
        second: String,
        /// The entity's terms as the plan found them (`m`, `0417`): of the units the first
        /// node returns, the follow-up starts from one naming them, whatever order the
        /// node's documents were read in.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        link: Vec<String>,
    },
    /// Two nodes hold the numbers of a calculation.
    Calc {
        /// The operation.
        op: CalcOp,
        /// The two nodes.
        nodes: [String; 2],
    },
    /// No node's documents hold anything for the question, and a node's card offers a
    /// third-party agent that matches it: the whole question goes to that agent verbatim.
    Agent {
        /// The node fronting the agent.
        node_id: String,
        /// The agent's name (the card's `agent`).
        agent: String,
    },
    /// No node holds it.
    NotFound,
}

/// The best hit holding a value, unless evidence that the fact is not settled matches at
/// least as well (then nobody can answer it).
pub fn best_direct(hits: &[NodeHit]) -> Option<&NodeHit> {
    let best = hits
        .iter()
        .filter(|h| h.located.span.is_some() && h.located.score >= MIN_SCORE)
        .max_by(|a, b| {
            a.located
                .score
                .total_cmp(&b.located.score)
                .then(a.prior.total_cmp(&b.prior))
        })?;
    let unsettled = hits
        .iter()
        .any(|h| h.located.pending && h.located.score >= best.located.score);
    (!unsettled).then_some(best)
}

/// Hits that may start a bridge: good matches without a value that name something the
/// question does not (best first, at most `n`), with their follow-up questions.
pub fn bridge_starts(sub: &SubQuestion, hits: &[NodeHit], n: usize) -> Vec<(NodeHit, SubQuestion)> {
    // The best evidence says the fact is not settled (`Choreographer: TBC`): whatever a
    // bridge from it finds (last year's choreographer) is not the answer.
    let top = hits
        .iter()
        .map(|h| h.located.score)
        .fold(f32::NEG_INFINITY, f32::max);
    if hits
        .iter()
        .any(|h| h.located.pending && h.located.score >= top)
    {
        return Vec::new();
    }
    let mut v: Vec<&NodeHit> = hits
        .iter()
        .filter(|h| h.located.span.is_none() && !h.located.pending && h.located.score >= MIN_SCORE)
        .collect();
    v.sort_by(|a, b| b.located.score.total_cmp(&a.located.score));
    v.into_iter()
        .filter_map(|h| {
            let link = link_terms(sub, &h.located.unit);
            (!link.is_empty()).then(|| (h.clone(), follow_up(sub, &h.located.unit, &link)))
        })
        .take(n)
        .collect()
}

/// The best hit for a follow-up that holds a value and names one of the link terms.
pub fn best_follow(follow: &SubQuestion, hits: &[NodeHit]) -> Option<NodeHit> {
    let links: Vec<&String> = follow
        .terms
        .iter()
        .filter(|t| t.weight >= 2.0 && !follow.slot_terms.contains(&t.term))
        .map(|t| &t.term)
        .collect();
    hits.iter()
        .filter(|h| h.located.span.is_some())
        .filter(|h| {
            let ts = terms_of(&h.located.unit.text);
            links.iter().any(|l| ts.contains(l))
        })
        .max_by(|a, b| a.located.score.total_cmp(&b.located.score))
        .cloned()
}

/// The [`chain_score`] of a chain (`first` then `second`) when it beats the best direct
/// hit; `None` when it does not.
pub fn winning_chain_score(
    sub: &SubQuestion,
    direct: Option<&NodeHit>,
    first: &Unit,
    second: &Unit,
) -> Option<f32> {
    let chain = chain_score(sub, &[first, second]);
    let single = direct.map_or(0.0, |d| chain_score(sub, &[&d.located.unit]));
    (chain >= MIN_SCORE && chain > single + CHAIN_MARGIN).then_some(chain)
}

/// Whether `sub` of `question` needs a calculation: it asks for a quantity and either a
/// difference or a unit that the best direct value is not in.
pub fn calc_op(question: &str, sub: &SubQuestion, direct: Option<&NodeHit>) -> Option<CalcOp> {
    if !matches!(sub.slot, Slot::Quantity | Slot::Count) {
        return None;
    }
    if asks_difference(question) {
        return Some(CalcOp::Difference);
    }
    // A rate found for a question that asks no rate (`£28 per ringer` for `what will the
    // couple pay`) is one factor of the answer.
    let direct_q = direct
        .and_then(|d| d.located.span.as_deref())
        .and_then(parse_quantity);
    let lower = question.to_lowercase();
    let asks_rate = [" per ", " each", " a head", " an hour", " a day"]
        .iter()
        .any(|w| lower.contains(w));
    if direct_q.as_ref().is_some_and(|q| q.per.is_some()) && !asks_rate {
        return Some(CalcOp::Product);
    }
    // Two amounts added up where the question says so (`adding up X and Y`).
    if asks_sum(question) {
        return Some(CalcOp::Sum);
    }
    if let Some(unit) = asked_unit(question) {
        let direct_unit = direct
            .and_then(|d| d.located.span.as_deref())
            .and_then(parse_quantity)
            .map(|q| q.unit);
        if direct_unit.as_deref() != Some(unit.as_str()) {
            return Some(CalcOp::Product);
        }
    }
    // `what will it come to altogether`: a total, by whichever operation its operands'
    // units allow.
    asks_total(question).then_some(CalcOp::Total)
}

/// The two hits (from different documents) whose quantities `op` combines, best first.
/// The two cited quantities a calculation takes: of the pairs from different documents
/// whose units fit the operation, the one whose evidence together covers the most of the
/// sub-question (`ordered 1,200` and `potted and ready: 785` for `how many more still have
/// to be potted before we can fill the order`), then the better matches.
pub fn plan_calc(
    op: CalcOp,
    sub: &SubQuestion,
    hits: &[NodeHit],
) -> Option<(NodeHit, NodeHit, Calculation)> {
    // A total is a product where a rate meets an amount, and a sum only where none does.
    if op == CalcOp::Total {
        if let Some(p) = plan_calc(CalcOp::Product, sub, hits) {
            return Some(p);
        }
    }
    // A conversion factor (`1 mile = 1.6 km`) is a general fact: it need not match the
    // question's words, only convert its value.
    let mut qs: Vec<(&NodeHit, Quantity, bool)> = hits
        .iter()
        .filter(|h| {
            h.located.score >= MIN_SCORE * 0.6
                || h.located.span.as_deref().is_some_and(|s| {
                    conversion_re().is_match(s) || money_conversion_re().is_match(s)
                })
        })
        .filter_map(|h| Some((h, parse_quantity(h.located.span.as_deref()?)?, false)))
        .collect();
    // An amount times a rate may take a record's other fields too: the span copied for the
    // question is one field (`Deposit: £100`), the amount the rate needs another (`Booked
    // length: 5 hours` for `£120/h`).
    if matches!(op, CalcOp::Product | CalcOp::Total) {
        let fielded: Vec<(&NodeHit, Quantity, bool)> = hits
            .iter()
            .filter(|h| h.located.score >= MIN_SCORE * 0.6)
            .flat_map(|h| {
                field_quantities(&h.located.unit)
                    .into_iter()
                    .map(move |q| (h, q, true))
            })
            .filter(|(h, q, _)| {
                !qs.iter()
                    .any(|(g, p, _)| std::ptr::eq(*g, *h) && p.value == q.value && p.per == q.per)
            })
            .collect();
        qs.extend(fielded);
    }
    qs.sort_by(|a, b| b.0.located.score.total_cmp(&a.0.located.score));
    let mut best: Option<(f32, f32, NodeHit, NodeHit, Calculation)> = None;
    for (i, (ha, a, fa)) in qs.iter().enumerate() {
        for (hb, b, fb) in qs.iter().skip(i + 1) {
            if ha.located.unit.document == hb.located.unit.document && ha.node_id == hb.node_id {
                continue;
            }
            // A field's number enters only as a factor of a rate (one of the two a rate).
            if (*fa || *fb) && a.per.is_some() == b.per.is_some() {
                continue;
            }
            let Some(mut c) = calculate(op, a, b) else {
                continue;
            };
            // Two bare counts give a bare number: the question says what it counts.
            if a.unit.is_empty() && b.unit.is_empty() {
                if let Some(noun) = counted_noun(&sub.text) {
                    c.result = format!("{} {noun}", c.result);
                    c.shown = format!("{} {noun}", c.shown);
                }
            }
            let cover = chain_score(sub, &[&ha.located.unit, &hb.located.unit]);
            let both = ha.located.score + hb.located.score;
            if best
                .as_ref()
                .is_none_or(|(bc, bb, ..)| cover > *bc || (cover == *bc && both > *bb))
            {
                best = Some((cover, both, (*ha).clone(), (*hb).clone(), c));
            }
        }
    }
    best.map(|(_, _, a, b, c)| (a, b, c))
}

// ---------------------------------------------------------------------------------------
// The inquiry: a sans-IO plan of tasks and rounds
// ---------------------------------------------------------------------------------------

impl SubQuestion {
    /// The same question with no name required of its evidence: what a calculation needs
    /// besides the asked-about entity's own number is often a general figure (a class
    /// limit, a density) that never names the entity.
    pub fn relaxed(&self) -> SubQuestion {
        let mut r = self.clone();
        for t in &mut r.terms {
            t.required = false;
        }
        r
    }
}

/// The unit a bridge part starts from: of what its first node located, the one naming
/// the entity the plan found (whatever order that node read its documents in), else the
/// best.
fn bridge_start(p: &Part) -> Option<&Located> {
    let found = p.steps.first()?.result.as_deref()?;
    let planned = match &p.route {
        Route::Bridge { link, .. } if !link.is_empty() => found.iter().find(|l| {
            let ts = link_terms(&p.sub, &l.unit);
            link.iter().all(|t| ts.contains(t))
        }),
        _ => None,
    };
    planned.or(found.first())
}

/// One unit of work: a sub-question for one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Node asked.
    pub node_id: String,
    /// What it is asked.
    pub sub: SubQuestion,
    /// What it located (best first), once it answered.
    pub result: Option<Vec<Located>>,
    /// For an agent's step: its answer, verbatim (`None` while pending or when it failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
}

/// A sub-question with its route and steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    /// The sub-question.
    pub sub: SubQuestion,
    /// How it is answered.
    pub route: Route,
    /// Steps in the order they run (a bridge's second step is added after the first).
    pub steps: Vec<Step>,
    /// For a direct part: the other nodes whose probe found a value for it, best first,
    /// asked in turn when the chosen node fails ([`Inquiry::failed`]).
    #[serde(default)]
    pub alternates: Vec<String>,
}

/// What the host does next in a grounded inquiry.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Run these steps (node id, task text): this node's own locally, the others as tasks.
    Assign(Vec<(String, String)>),
    /// Everything is known: conclude with this answer.
    Conclude(Answer),
}

/// The host's state of one grounded inquiry: the parts of the question, who answers each,
/// and what came back. It does no IO: the runtime runs the steps at this node itself and
/// sends the others as tasks; results come back with [`Inquiry::record`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inquiry {
    /// The task's question.
    pub question: String,
    /// This node's id (the host; its own steps are not sent as tasks).
    pub me: String,
    /// The parts.
    pub parts: Vec<Part>,
}

impl Inquiry {
    /// An inquiry over routed parts: the first step of each route is planned.
    pub fn new(question: &str, me: &str, routed: Vec<(SubQuestion, Route)>) -> Self {
        let parts = routed
            .into_iter()
            .map(|(sub, route)| {
                let step = |node_id: &String| Step {
                    node_id: node_id.clone(),
                    sub: sub.clone(),
                    result: None,
                    reply: None,
                };
                let steps = match &route {
                    Route::Direct { node_id } | Route::Agent { node_id, .. } => vec![step(node_id)],
                    Route::Bridge { first, .. } => vec![step(first)],
                    Route::Calc { nodes, .. } => nodes.iter().map(step).collect(),
                    Route::NotFound => Vec::new(),
                };
                Part {
                    sub,
                    route,
                    steps,
                    alternates: Vec::new(),
                }
            })
            .collect();
        Self {
            question: question.to_owned(),
            me: me.to_owned(),
            parts,
        }
    }

    /// Notes, for each direct part, the other nodes whose probe (`hits`, one list per
    /// part, as [`Planner::hits`] gives them) located a value for it, best first: the
    /// replacements [`Inquiry::failed`] hands the part to.
    pub fn with_alternates(mut self, hits: &[Vec<NodeHit>]) -> Self {
        for (p, hits) in self.parts.iter_mut().zip(hits) {
            let Route::Direct { node_id } = &p.route else {
                continue;
            };
            let mut valued: Vec<&NodeHit> = hits
                .iter()
                .filter(|h| {
                    h.node_id != *node_id
                        && h.located.span.is_some()
                        && h.located.score >= MIN_SCORE
                })
                .collect();
            valued.sort_by(|a, b| b.located.score.total_cmp(&a.located.score));
            for h in valued {
                if !p.alternates.contains(&h.node_id) {
                    p.alternates.push(h.node_id.clone());
                }
            }
        }
        self
    }

    /// `node_id` failed the step asked as `text` (it did not answer, or came back with no
    /// evidence although its probe had found some). A direct part goes to its next
    /// alternate, which is returned (the caller adds it to the group when it is not a
    /// member); otherwise the step is recorded as having found nothing.
    pub fn failed(&mut self, node_id: &str, text: &str) -> Option<String> {
        for p in &mut self.parts {
            let direct = matches!(p.route, Route::Direct { .. });
            let Some(s) = p
                .steps
                .iter_mut()
                .find(|s| s.node_id == node_id && s.sub.text == text && s.result.is_none())
            else {
                continue;
            };
            if direct && !p.alternates.is_empty() {
                let next = p.alternates.remove(0);
                s.node_id = next.clone();
                p.route = Route::Direct {
                    node_id: next.clone(),
                };
                return Some(next);
            }
            s.result = Some(Vec::new());
            return None;
        }
        None
    }

    /// Nodes other than this one that take part.
    pub fn members(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for p in &self.parts {
            let ids: Vec<&String> = match &p.route {
                Route::Direct { node_id } | Route::Agent { node_id, .. } => vec![node_id],
                Route::Bridge { first, second, .. } => vec![first, second],
                Route::Calc { nodes, .. } => nodes.iter().collect(),
                Route::NotFound => vec![],
            };
            for id in ids {
                if id != &self.me && !out.contains(id) {
                    out.push(id.clone());
                }
            }
        }
        out
    }

    /// The sub-question of a pending step of `node_id` whose text is `text` (`None` for
    /// an agent's step: that node's agent gets the text itself, not a sub-question to
    /// locate evidence for).
    pub fn step_sub(&self, node_id: &str, text: &str) -> Option<SubQuestion> {
        self.parts
            .iter()
            .filter(|p| !matches!(p.route, Route::Agent { .. }))
            .flat_map(|p| &p.steps)
            .find(|s| s.node_id == node_id && s.sub.text == text && s.result.is_none())
            .map(|s| s.sub.clone())
    }

    /// Whether the pending step of `node_id` asked as `text` is an agent's (its answer is
    /// recorded with [`Inquiry::record_reply`]).
    pub fn is_agent_step(&self, node_id: &str, text: &str) -> bool {
        self.parts.iter().any(|p| {
            matches!(p.route, Route::Agent { .. })
                && p.steps
                    .iter()
                    .any(|s| s.node_id == node_id && s.sub.text == text && s.result.is_none())
        })
    }

    /// Records the answer of `node_id`'s agent to the step asked as `text` (`None`: it
    /// failed).
    pub fn record_reply(&mut self, node_id: &str, text: &str, reply: Option<String>) {
        for p in &mut self.parts {
            for s in &mut p.steps {
                if s.node_id == node_id && s.sub.text == text && s.result.is_none() {
                    s.result = Some(Vec::new());
                    s.reply = reply.filter(|r| !r.trim().is_empty());
                    return;
                }
            }
        }
    }

    /// Records what `node_id` located for the step asked as `text`.
    pub fn record(&mut self, node_id: &str, text: &str, found: Vec<Located>) {
        for p in &mut self.parts {
            for s in &mut p.steps {
                if s.node_id == node_id && s.sub.text == text && s.result.is_none() {
                    s.result = Some(found);
                    return;
                }
            }
        }
    }

    /// The next thing to do: the pending steps (this node's own included: the caller runs
    /// those itself and records them like any other), after a bridge whose first step named
    /// an entity got its follow-up step; when no step is pending the answer is composed.
    pub fn next_step(&mut self) -> Next {
        for p in &mut self.parts {
            if let (Route::Bridge { second, .. }, 1) = (&p.route, p.steps.len()) {
                if let Some(first) = bridge_start(p) {
                    let link = link_terms(&p.sub, &first.unit);
                    if !link.is_empty() {
                        let follow = follow_up(&p.sub, &first.unit, &link);
                        p.steps.push(Step {
                            node_id: second.clone(),
                            sub: follow,
                            result: None,
                            reply: None,
                        });
                    }
                }
            }
        }
        let pending: Vec<(String, String)> = self
            .parts
            .iter()
            .flat_map(|p| &p.steps)
            .filter(|s| s.result.is_none())
            .map(|s| (s.node_id.clone(), s.sub.text.clone()))
            .collect();
        if pending.is_empty() {
            Next::Conclude(self.answer())
        } else {
            Next::Assign(pending)
        }
    }

    /// The answer from what is known now (see [`compose`]); `name_of` is applied later by
    /// the runtime (citations carry node ids in `node` until then).
    ///
    /// An agent's answer is the answer, verbatim (not cut to [`MAX_ANSWER_WORDS`]: the
    /// words are the agent's, not spans this node chose), cited as that agent's.
    pub fn answer(&self) -> Answer {
        for p in &self.parts {
            let Route::Agent { node_id, agent } = &p.route else {
                continue;
            };
            if let Some(reply) = p.steps.first().and_then(|s| s.reply.as_ref()) {
                return Answer {
                    answer: reply.clone(),
                    citations: vec![Citation {
                        node: node_id.clone(),
                        node_id: node_id.clone(),
                        document: String::new(),
                        quote: reply.clone(),
                        agent: Some(agent.clone()),
                    }],
                    status: AnswerStatus::Answered,
                };
            }
        }
        let parts: Vec<PartAnswer> = self.parts.iter().map(|p| self.part_answer(p)).collect();
        compose(&parts)
    }

    fn part_answer(&self, p: &Part) -> PartAnswer {
        let cite = |node: &str, l: &Located| Citation {
            node: node.to_owned(),
            node_id: node.to_owned(),
            document: l.unit.document.clone(),
            quote: l.unit.text.clone(),
            agent: None,
        };
        let question = p.sub.text.clone();
        let none = PartAnswer {
            question: question.clone(),
            value: None,
            citations: Vec::new(),
        };
        // The node's best value, unless it says the fact is unsettled at least as
        // strongly (whatever order the equally good units came in).
        let valued = |s: &Step| -> Option<Located> {
            let found = s.result.as_ref()?;
            let v = found
                .iter()
                .find(|l| l.span.is_some() && l.score >= MIN_SCORE)?;
            let unsettled = found.iter().any(|l| l.pending && l.score >= v.score);
            (!unsettled).then(|| v.clone())
        };
        match &p.route {
            Route::NotFound | Route::Agent { .. } => none,
            Route::Direct { .. } => {
                let Some(s) = p.steps.first() else {
                    return none;
                };
                match valued(s) {
                    Some(l) => PartAnswer {
                        question,
                        value: l.span.clone(),
                        citations: vec![cite(&s.node_id, &l)],
                    },
                    None => none,
                }
            }
            Route::Bridge { .. } => {
                let (Some(a), Some(b)) = (p.steps.first(), p.steps.get(1)) else {
                    return none;
                };
                let Some(first) = bridge_start(p) else {
                    return none;
                };
                let links: Vec<String> = link_terms(&p.sub, &first.unit);
                let second = b.result.as_ref().and_then(|r| {
                    r.iter()
                        .find(|l| {
                            l.span.is_some()
                                && terms_of(&l.unit.text).iter().any(|t| links.contains(t))
                        })
                        .cloned()
                });
                match second {
                    Some(l) => PartAnswer {
                        question,
                        value: l.span.clone(),
                        citations: vec![cite(&a.node_id, first), cite(&b.node_id, &l)],
                    },
                    None => none,
                }
            }
            Route::Calc { op, .. } => {
                let hits: Vec<NodeHit> = p
                    .steps
                    .iter()
                    .flat_map(|s| {
                        s.result.iter().flatten().map(|l| NodeHit {
                            node_id: s.node_id.clone(),
                            located: l.clone(),
                            prior: 0.0,
                        })
                    })
                    .collect();
                match plan_calc(*op, &p.sub, &hits) {
                    Some((a, b, c)) => PartAnswer {
                        question,
                        value: Some(c.shown.clone()),
                        citations: vec![
                            cite(&a.node_id, &a.located),
                            cite(&b.node_id, &b.located),
                            Citation {
                                node: self.me.clone(),
                                node_id: self.me.clone(),
                                document: "calculator".into(),
                                quote: c.shown,
                                agent: None,
                            },
                        ],
                    },
                    None => none,
                }
            }
        }
    }
}

/// A third-party agent that a known card offers ([`super::card::AgentCard::agent`]), with
/// how well the card matches a task.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentOffer {
    /// The node fronting the agent.
    pub node_id: String,
    /// The agent's name.
    pub agent: String,
    /// BM25 score of the card for the task (0: no term in common).
    pub bm25: f32,
    /// Cosine of the card's and the task's embeddings (0 without an embedder).
    pub cosine: f32,
}

/// Least cosine between a task and an agent's card for the agent to take a task that
/// shares no term with its card. Not fitted to any benchmark: MiniLM puts unrelated short
/// texts near 0.1 and paraphrases of one topic above 0.4; a task that reaches an agent
/// this way is answered by it and cited as its answer, where otherwise it would be
/// `unknown`.
pub const MIN_AGENT_COSINE: f32 = 0.3;

/// Whether a question routed as `routed` may go to an agent ([`delegate`]): no node's
/// documents hold anything for any of its parts.
pub fn wants_agent(routed: &[(SubQuestion, Route)]) -> bool {
    routed.iter().all(|(_, r)| *r == Route::NotFound)
}

/// Whom a question goes to when no node's documents hold anything for any of its parts
/// (`routed` all [`Route::NotFound`], or nothing to route): the first of `offers` (best
/// match first) whose card shares a term with the question or is close to it in meaning
/// ([`MIN_AGENT_COSINE`]) takes the whole question, verbatim; when none does, `own` (the
/// asked node's own agent, which answers what the node is asked) takes it. `None` while
/// documents hold something: their answers are cited spans, and come first.
pub fn delegate(
    question: &str,
    routed: &[(SubQuestion, Route)],
    offers: &[AgentOffer],
    own: Option<&AgentOffer>,
) -> Option<(SubQuestion, Route)> {
    if !wants_agent(routed) {
        return None;
    }
    let offer = offers
        .iter()
        .find(|o| o.bm25 > 0.0 || o.cosine >= MIN_AGENT_COSINE)
        .or(own)?;
    let sub = SubQuestion {
        text: question.to_owned(),
        slot: Slot::Thing,
        slot_terms: Vec::new(),
        terms: terms_of(question)
            .into_iter()
            .map(|term| Term {
                term,
                weight: 1.0,
                required: false,
                context: false,
            })
            .collect(),
        latest: false,
    };
    let route = Route::Agent {
        node_id: offer.node_id.clone(),
        agent: offer.agent.clone(),
    };
    Some((sub, route))
}

/// Routes one sub-question from the first probe's hits; bridges need a second probe, so
/// their candidates are returned for the caller to probe (then [`route_with_bridges`]).
pub fn route_direct(question: &str, sub: &SubQuestion, hits: &[NodeHit]) -> Route {
    let direct = best_direct(hits);
    if let Some(op) = calc_op(question, sub, direct) {
        if let Some((a, b, _)) = plan_calc(op, sub, hits) {
            return Route::Calc {
                op,
                nodes: [a.node_id, b.node_id],
            };
        }
    }
    match direct {
        Some(d) => Route::Direct {
            node_id: d.node_id.clone(),
        },
        None => Route::NotFound,
    }
}

/// The route once bridge candidates were probed: `chains` holds, per bridge start, the
/// hits of its follow-up question.
pub fn route_with_bridges(
    question: &str,
    sub: &SubQuestion,
    hits: &[NodeHit],
    chains: &[((NodeHit, SubQuestion), Vec<NodeHit>)],
) -> Route {
    let base = route_direct(question, sub, hits);
    if matches!(base, Route::Calc { .. }) {
        return base;
    }
    let direct = best_direct(hits);
    // Of the chains that beat the direct answer, the one whose two units together match
    // the question best (the first start found is not always the right one; of equal
    // chains, the first).
    chains
        .iter()
        .filter_map(|((start, follow), follow_hits)| {
            let end = best_follow(follow, follow_hits)?;
            // A chain within one node's documents (a row, then a note beside it) is that
            // node's own evidence, already weighed as a direct answer: a bridge links
            // what one node names to what another node holds.
            if end.node_id == start.node_id {
                return None;
            }
            let score = winning_chain_score(sub, direct, &start.located.unit, &end.located.unit)?;
            Some((score, start, end))
        })
        .reduce(|best, c| if c.0 > best.0 { c } else { best })
        .map_or(base, |(_, start, end)| Route::Bridge {
            first: start.node_id.clone(),
            second: end.node_id,
            link: link_terms(sub, &start.located.unit),
        })
}

// ---------------------------------------------------------------------------------------
// The plan: which probes route each sub-question (sans-IO)
// ---------------------------------------------------------------------------------------

/// Where a [`Planner`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The sub-questions as asked.
    Asked,
    /// Relaxed sub-questions of the calculations (no names required).
    Relaxed,
    /// Follow-ups of the bridge starts.
    Follows,
    /// Every sub-question is routed.
    Done,
}

/// What the caller does next for a [`Planner`].
#[derive(Debug, Clone, PartialEq)]
pub enum PlanStep {
    /// Probe the candidate nodes with these sub-questions and hand the hits (one list per
    /// sub-question, in order) to [`Planner::handle`].
    Probe(Vec<SubQuestion>),
    /// Each sub-question (as finally asked) with its route: what [`Inquiry::new`] takes.
    Done(Vec<(SubQuestion, Route)>),
}

/// The routing plan of one task, sans-IO: it decomposes the task, asks for at most three
/// rounds of probes (the sub-questions; the relaxed ones that calculations need; the
/// follow-ups of bridge starts) and routes every sub-question. The runtime moves the
/// probes over the network; the offline test and the benchmark probe documents in memory.
#[derive(Debug, Clone)]
pub struct Planner {
    task: String,
    subs: Vec<SubQuestion>,
    hits: Vec<Vec<NodeHit>>,
    follows: Vec<Vec<(NodeHit, SubQuestion)>>,
    chains: Vec<Vec<ChainHits>>,
    stage: Stage,
    /// Which sub-questions the pending probe is about (indices into `subs`), and for
    /// follow-ups which start.
    pending: Vec<(usize, usize)>,
    /// The agent cards (node id, description) known for the probed nodes.
    cards: Vec<(String, String)>,
    /// The node that asks (its own documents are probed too).
    host: Option<String>,
}

/// How much of its score the asking node's own evidence keeps against its peers'. The
/// node asks the swarm because its documents do not settle the question: what they hold
/// is often the open query, the draft or the stale copy that prompted it, so a peer's
/// evidence that matches nearly as well is taken first. With no peer evidence, the node
/// answers from its own documents as before.
const HOST_WEIGHT: f32 = 0.8;

/// A bridge start with its follow-up question, and the hits of that follow-up.
type ChainHits = ((NodeHit, SubQuestion), Vec<NodeHit>);

/// How many bridge starts of one sub-question are followed up.
const BRIDGE_STARTS: usize = 2;

impl Planner {
    /// The plan of `task` (its sub-questions from [`decompose`]).
    pub fn new(task: &str) -> Self {
        let subs = decompose(task);
        let n = subs.len();
        Self {
            task: task.to_owned(),
            subs,
            hits: vec![Vec::new(); n],
            follows: vec![Vec::new(); n],
            chains: vec![Vec::new(); n],
            stage: Stage::Asked,
            pending: Vec::new(),
            cards: Vec::new(),
            host: None,
        }
    }

    /// The agent cards (node id, description) of the nodes that will be probed; their
    /// [`card_prior`] breaks ties between nodes.
    pub fn with_cards(mut self, cards: Vec<(String, String)>) -> Self {
        self.cards = cards;
        self
    }

    /// The asking node, whose own hits weigh [`HOST_WEIGHT`] of a peer's.
    pub fn with_host(mut self, host: &str) -> Self {
        self.host = Some(host.to_owned());
        self
    }

    fn set_priors(&self, sub: &SubQuestion, hits: &mut [NodeHit]) {
        for h in hits {
            h.prior = self
                .cards
                .iter()
                .find(|(id, _)| *id == h.node_id)
                .map_or(0.0, |(_, card)| card_prior(sub, card));
        }
    }

    /// The sub-questions as they stand (relaxed once a calculation was found).
    pub fn subs(&self) -> &[SubQuestion] {
        &self.subs
    }

    /// The hits each sub-question has (for diagnostics).
    pub fn hits(&self) -> &[Vec<NodeHit>] {
        &self.hits
    }

    /// The next probe to run, or the routes when none is left.
    pub fn next_step(&mut self) -> PlanStep {
        loop {
            match self.stage {
                Stage::Asked if self.pending.is_empty() => {
                    if self.subs.is_empty() {
                        self.stage = Stage::Done;
                        continue;
                    }
                    self.pending = (0..self.subs.len()).map(|i| (i, 0)).collect();
                    return PlanStep::Probe(self.subs.clone());
                }
                Stage::Relaxed if self.pending.is_empty() => {
                    // A calculation also needs the general figure that never names the
                    // entity (a class limit, a conversion factor).
                    let calcs: Vec<usize> = (0..self.subs.len())
                        .filter(|&i| {
                            calc_op(&self.task, &self.subs[i], best_direct(&self.hits[i])).is_some()
                        })
                        .collect();
                    if calcs.is_empty() {
                        self.start_follows();
                        continue;
                    }
                    for &i in &calcs {
                        self.subs[i] = self.subs[i].relaxed();
                    }
                    self.pending = calcs.iter().map(|&i| (i, 0)).collect();
                    return PlanStep::Probe(calcs.iter().map(|&i| self.subs[i].clone()).collect());
                }
                Stage::Follows if self.pending.is_empty() => {
                    let mut asked = Vec::new();
                    for (i, f) in self.follows.iter().enumerate() {
                        for (j, (_, q)) in f.iter().enumerate() {
                            self.pending.push((i, j));
                            asked.push(q.clone());
                        }
                    }
                    if asked.is_empty() {
                        self.stage = Stage::Done;
                        continue;
                    }
                    return PlanStep::Probe(asked);
                }
                Stage::Done => {
                    let routed = (0..self.subs.len())
                        .map(|i| {
                            let sub = &self.subs[i];
                            let route =
                                route_with_bridges(&self.task, sub, &self.hits[i], &self.chains[i]);
                            (sub.clone(), route)
                        })
                        .collect();
                    return PlanStep::Done(routed);
                }
                // A probe is pending: ask for it again.
                _ => {
                    let asked = self
                        .pending
                        .iter()
                        .map(|&(i, j)| match self.stage {
                            Stage::Follows => self.follows[i][j].1.clone(),
                            _ => self.subs[i].clone(),
                        })
                        .collect();
                    return PlanStep::Probe(asked);
                }
            }
        }
    }

    /// The hits of the pending probe, one list per sub-question asked (missing lists count
    /// as no hits, extra ones are ignored).
    pub fn handle(&mut self, mut hits: Vec<Vec<NodeHit>>) {
        hits.resize(self.pending.len(), Vec::new());
        for (&(i, j), h) in self.pending.iter().zip(hits.iter_mut()) {
            let sub = match self.stage {
                Stage::Follows => &self.follows[i][j].1,
                _ => &self.subs[i],
            };
            self.set_priors(sub, h);
            supersede_across_nodes(sub, h);
            // Only against a peer that found something: alone, the host's evidence keeps
            // its score (and its place above [`MIN_SCORE`]).
            let is_host = |x: &NodeHit| self.host.as_deref() == Some(x.node_id.as_str());
            let peer_found = h
                .iter()
                .any(|x| !is_host(x) && x.located.span.is_some() && x.located.score >= MIN_SCORE);
            if peer_found {
                // (Not its `TBC`: that nobody can answer yet stands.)
                for x in h.iter_mut().filter(|x| is_host(x) && !x.located.pending) {
                    x.located.score *= HOST_WEIGHT;
                }
            }
        }
        let pending = std::mem::take(&mut self.pending);
        match self.stage {
            Stage::Asked => {
                for ((i, _), h) in pending.into_iter().zip(hits) {
                    self.hits[i] = h;
                }
                self.stage = Stage::Relaxed;
            }
            Stage::Relaxed => {
                for ((i, _), h) in pending.into_iter().zip(hits) {
                    self.hits[i] = h;
                }
                self.start_follows();
            }
            Stage::Follows => {
                for ((i, j), h) in pending.into_iter().zip(hits) {
                    let start = self.follows[i][j].clone();
                    self.chains[i].push((start, h));
                }
                self.stage = Stage::Done;
            }
            Stage::Done => {}
        }
    }

    fn start_follows(&mut self) {
        for i in 0..self.subs.len() {
            self.follows[i] = bridge_starts(&self.subs[i], &self.hits[i], BRIDGE_STARTS);
        }
        self.stage = Stage::Follows;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str =
        "# Departures — 12 July\n\n| Flight | Destination | Gate |\n|---|---|---|\n\
        | CV 317 | Valdessa | B14 |\n| CV 319 | Valdessa | C3 |\n\nGates may change.\n";

    /// What `node` locates for `s` in `units`, as probe hits.
    fn hits(units: &[Unit], node: &str, s: &SubQuestion) -> Vec<NodeHit> {
        locate(s, units, 4)
            .into_iter()
            .map(|l| NodeHit {
                node_id: node.into(),
                located: l,
                prior: 0.0,
            })
            .collect()
    }

    #[test]
    fn every_pattern_compiles() {
        for r in [
            quantity_re(),
            clock_re(),
            weekend_re(),
            conversion_re(),
            count_re(),
            number_re(),
            time_re(),
            date_re(),
            person_re(),
            code_re(),
            place_re(),
            money_conversion_re(),
            age_group_re(),
            update_re(),
            numbered_re(),
        ] {
            assert!(!r.as_str().is_empty());
        }
    }

    #[test]
    fn numbers_and_calendar_words_have_one_spelling() {
        assert_eq!(terms_of("Friday the 14th"), terms_of("Fri 14"));
        assert_eq!(terms_of("Year 9s"), terms_of("Year 9"));
        assert_eq!(terms_of("12 Nov"), terms_of("12 November"));
        // Words that are also weekday or month abbreviations stay words.
        assert_eq!(
            terms_of("the sun sat"),
            vec!["sun".to_string(), "sat".to_string()]
        );
    }

    #[test]
    fn slot_expansions_are_written_as_index_terms() {
        let words = ["venue", "location", "room", "address"];
        let stems: Vec<String> = words.iter().map(|w| terms_of(w).concat()).collect();
        assert_eq!(slot_expansion(Slot::Place), stems.as_slice());
    }

    #[test]
    fn documents_become_rows_sentences_and_key_values() {
        let u = document_units("departures.md", TABLE);
        assert_eq!(u[0].heading, "Departures — 12 July");
        assert_eq!(
            u[0].text,
            "Flight: CV 317; Destination: Valdessa; Gate: B14"
        );
        assert_eq!(u[0].fields[2], ("Gate".into(), "B14".into()));
        assert_eq!(u[2].text, "Gates may change.");
        let kv = document_units(
            "o.md",
            "Chief arbiter: Ludmila Ferncastle.\nDeputy: Colm Ade.\n",
        );
        assert_eq!(kv.len(), 2);
        assert_eq!(
            kv[0].fields,
            vec![("Chief arbiter".into(), "Ludmila Ferncastle".into())]
        );
    }

    #[test]
    fn questions_split_into_their_own_clauses_with_context() {
        let subs = decompose(
            "We are starting the Lumen greenhouse. At what temperature do moonflower seeds \
             germinate best, and on which day does the supply shuttle Kestrel dock at Lumen station?",
        );
        assert_eq!(subs.len(), 2, "{subs:?}");
        assert_eq!(subs[0].slot, Slot::Quantity);
        assert_eq!(subs[1].slot, Slot::Date);
        assert!(subs[1]
            .text
            .starts_with("We are starting the Lumen greenhouse: on which day"));
        let subs = decompose(
            "For Pepperkorn the greyhound: what does he weigh, and who is doing his anaesthetic?",
        );
        assert_eq!(subs.len(), 2, "{subs:?}");
        assert_eq!(subs[0].slot, Slot::Quantity);
        assert_eq!(subs[1].slot, Slot::Person);
        assert!(subs[1].terms.iter().any(|t| t.term == "pepperkorn"));
        let one =
            decompose("Which gate does the flight carrying the Merrin Youth Choir leave from?");
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].slot, Slot::Place);
        assert_eq!(
            one[0].slot_terms,
            vec!["gat".to_string()],
            "stemmed like the index"
        );
        assert!(one[0]
            .terms
            .iter()
            .any(|t| t.term == "merrin" && t.required));
    }

    #[test]
    fn degree_words_counts_contractions_and_clock_times_are_read_as_asked() {
        let subs = decompose("how warm is the main pool today, and who's teaching the class?");
        assert_eq!(subs.len(), 2, "{subs:?}");
        assert_eq!(subs[0].slot, Slot::Quantity);
        assert!(
            subs[0]
                .slot_terms
                .contains(&terms_of("temperature").concat()),
            "{subs:?}"
        );
        assert_eq!(subs[1].slot, Slot::Person);
        // `teaching` names the role; `got` in `who's got the saw` names none.
        assert_eq!(subs[1].slot_terms, terms_of("teaching class"));
        let holder = &decompose("Who's got the big wet saw out?")[0];
        assert_eq!(holder.slot, Slot::Person);
        assert!(holder.slot_terms.is_empty(), "{holder:?}");
        let count = &decompose("How many books can a PhD student have out at once?")[0];
        assert_eq!(count.slot, Slot::Count);
        let rows = document_units(
            "loans.md",
            "Research students can have up to 50 items on loan.",
        );
        assert_eq!(extract(count, &rows[0]).as_deref(), Some("50 items"));
        // `16:20` is a time, not a lead-in; `time on Sunday` asks for a time.
        let boat = decompose("Which boat is doing the 16:20 from Port Ellery?");
        assert_eq!(boat.len(), 1);
        assert_eq!(
            boat[0].text,
            "Which boat is doing the 16:20 from Port Ellery?"
        );
        let due = &decompose("What time on Sunday do teams hand in their projects?")[0];
        assert_eq!(due.slot, Slot::Time);
    }

    #[test]
    fn a_note_that_repeats_the_question_is_no_answer() {
        let sub = &decompose("How many books can a PhD student have out at once?")[0];
        let note = document_units(
            "n.md",
            "Students asked how many books they may have out; some say 30.",
        );
        assert_eq!(extract(sub, &note[0]), None);
        let ask = document_units("q.md", "Is the limit 30 books?");
        assert_eq!(extract(sub, &ask[0]), None);
        let rule = document_units("r.md", "A PhD student may have 50 books out at once.");
        assert_eq!(extract(sub, &rule[0]).as_deref(), Some("50 books"));
    }

    #[test]
    fn a_name_a_node_never_uses_is_its_setting_not_another_entity() {
        let sub = &decompose("When does the Brackenwood choir rehearse on Fridays?")[0];
        assert!(sub
            .terms
            .iter()
            .any(|t| t.term == "brackenwood" && t.required));
        // This node never says `Brackenwood`: its rehearsal note still answers, weaker
        // than the same note that names it.
        let plain = document_units(
            "rehearsals.md",
            "Choir rehearsals on Fridays start at 19:30.",
        );
        let got = locate(sub, &plain, 3);
        assert_eq!(got[0].span.as_deref(), Some("19:30"));
        let named = document_units(
            "rehearsals.md",
            "Brackenwood choir rehearsals on Fridays start at 19:30.",
        );
        assert!(locate(sub, &named, 3)[0].score > got[0].score);
        // A node that uses the name elsewhere keeps it required.
        let other = document_units(
            "r.md",
            "The Brackenwood choir sings at Easter. Choir rehearsals on Fridays start at 19:30.",
        );
        assert!(locate(sub, &other, 3)
            .iter()
            .all(|l| l.unit.text.contains("Brackenwood")));
        // A row keyed by another name is about that entity, named or not.
        let q = &decompose("What is the top speed of Juniper?")[0];
        let rows = document_units(
            "boats.md",
            "| Boat | Top speed |\n|---|---|\n| Heron | 7 knots |\n| Osprey | 9 knots |\n",
        );
        assert!(locate(q, &rows, 3).is_empty(), "{:?}", locate(q, &rows, 3));
        // A capitalised common noun (`Rehearsals`) is no other name.
        let sessions = document_units(
            "sessions.md",
            "| Session | Day | Time |\n|---|---|---|\n| Rehearsals | Friday | 19:30 |\n",
        );
        assert_eq!(locate(sub, &sessions, 1)[0].span.as_deref(), Some("19:30"));
    }

    #[test]
    fn slot_words_are_compared_as_index_terms() {
        let units = document_units("bake.md", "Bake for 25 minutes at 180°C.");
        let sub = &decompose("What temperature should the oven be?")[0];
        assert_eq!(asked_dimension(sub), Some("temperature"));
        assert_eq!(extract(sub, &units[0]).as_deref(), Some("180°C"));
        // A column named by the slot's kind (`Date`) is read first.
        let when = &decompose("When is the fair?")[0];
        let row = document_units(
            "events.md",
            "| Event | Booked on | Date |\n|---|---|---|\n| Fair | 3 March | 12 May |\n",
        );
        assert_eq!(extract(when, &row[0]).as_deref(), Some("12 May"));
        let price = &decompose("What is the price of the pottery course?")[0];
        assert_eq!(asked_dimension(price), Some("money"));
        let course = document_units("c.md", "Pottery course: 90 minutes, £45.");
        assert_eq!(extract(price, &course[0]).as_deref(), Some("£45"));
    }

    #[test]
    fn another_numbered_variant_is_a_near_miss() {
        assert_eq!(
            variants("a ten-class pass"),
            vec![(10, "class".to_string())]
        );
        assert!(other_variant("the ten-class pass", "5-class pass: £60"));
        assert!(!other_variant("the ten-class pass", "10-class pass: £110"));
        assert!(!other_variant(
            "the ten-class pass",
            "5-class and 10-class passes"
        ));
        assert!(!other_variant("the pass", "5-class pass: £60"));
        // Both asked (`I have a 5-class pass: how much is the ten-class one?`): neither is
        // another variant.
        let both = "I have a 5-class pass: what does the ten-class pass cost?";
        assert!(!other_variant(both, "10-class pass: £110"));
        assert!(!other_variant(both, "5-class pass: £60"));
        let sub = &decompose("How much is the ten-week pottery course?")[0];
        let units = document_units(
            "prices.md",
            "- 6-week pottery course: £60\n- 10-week pottery course: £90\n",
        );
        assert_eq!(locate(sub, &units, 1)[0].span.as_deref(), Some("£90"));
    }

    #[test]
    fn a_value_named_by_the_kind_asked_wins_and_a_venue_is_a_place() {
        let sub =
            &decompose("For the Saturday gala in Bruges: which hotel is the band staying at?")[0];
        assert_eq!(sub.slot, Slot::Place);
        let mut units = document_units(
            "gala.md",
            "# Bruges tour\n\n| Day | Venue | Event |\n|---|---|---|\n| Saturday | Corn Exchange | band gala |\n",
        );
        units.extend(document_units(
            "rooms.md",
            "Rooms in Bruges: Harbour Hotel, three nights.",
        ));
        assert_eq!(
            locate(sub, &units, 1)[0].span.as_deref(),
            Some("Harbour Hotel")
        );
        // `which pub` reads a row's `Venue`.
        let pub_q = &decompose("Which pub is the week 3 quiz at?")[0];
        let rows = document_units(
            "fixtures.md",
            "| Week | Venue |\n|---|---|\n| 3 | The Green Man |\n| 4 | The Plough |\n",
        );
        assert_eq!(
            locate(pub_q, &rows, 1)[0].span.as_deref(),
            Some("The Green Man")
        );
    }

    #[test]
    fn a_person_slot_is_named_by_the_verb_only_when_the_person_does_it() {
        // `who leads`, `who's going to be conducting`: the verb names the role.
        let (slot, terms) = slot_of("who leads the walk?");
        assert_eq!(slot, Slot::Person);
        assert!(terms.contains(&"lead".to_owned()), "{terms:?}");
        assert_eq!(
            slot_of("who's going to be conducting on Saturday?").1,
            terms_of("conducting")
        );
        // Only a leading `going to be` is skipped: `who needs to sign` reads `needs to`.
        assert_eq!(
            slot_of("who needs to sign the form?").1,
            terms_of("needs to")
        );
        // `who should I ring`: the verb is done to them; it names no role.
        assert_eq!(
            slot_of("who should I ring if the boiler packs up?"),
            (Slot::Person, Vec::new())
        );
    }

    #[test]
    fn a_cross_reference_or_a_price_to_follow_is_pending_not_a_value() {
        for text in [
            "Pistachio paste order: see invoice BR-1187",
            "Fee: see contract",
            "Quote to follow",
            "Hire of the marquee: price on application",
            "Supplier: awaiting a quote",
        ] {
            assert!(is_pending(text), "{text}");
        }
        // A reference that is itself the value asked for is not pending.
        assert!(!is_pending("Invoice BR-1187: £412.50"));
        let sub = &decompose("What does November's pistachio paste order come to?")[0];
        let units = document_units(
            "orders.md",
            "November pistachio paste order: see invoice BR-1187.",
        );
        let got = &locate(sub, &units, 1)[0];
        assert!(got.pending && got.span.is_none(), "{got:?}");
    }

    #[test]
    fn number_words_that_number_something_are_digits() {
        assert!(terms_of("the round one deadline").contains(&"1".to_owned()));
        assert!(terms_of("our second feed stop").contains(&"2".to_owned()));
        assert_eq!(terms_of("Round 1"), terms_of("round one"));
        // A number word that numbers nothing stays a word (or a stopword).
        assert!(!terms_of("which one is it").contains(&"1".to_owned()));
        assert!(!terms_of("first aid kit").contains(&"1".to_owned()));
    }

    #[test]
    fn a_value_raised_or_put_back_to_another_is_an_update() {
        for text in [
            "The print run was increased to 1,200 copies on 10 March.",
            "Kick-off put back to 15:00.",
            "Deadline extended to 20 January.",
        ] {
            assert!(is_update(text), "{text}");
        }
        let sub = &decompose("How many copies of the parish magazine are we printing?")[0];
        let mut units = document_units(
            "print.md",
            "| Item | Copies |\n|---|---|\n| Parish magazine | 750 |\n",
        );
        units.extend(document_units(
            "amendments.md",
            "Parish magazine: quantity increased to 1,200 copies on 10 March.",
        ));
        assert_eq!(
            locate(sub, &units, 1)[0].span.as_deref(),
            Some("1,200 copies")
        );
    }

    #[test]
    fn calendar_abbreviations_are_read_as_written_not_after_stemming() {
        assert!(terms_of("Wed 3 June, Dec 12").contains(&"wednesday".to_owned()));
        assert!(terms_of("Dec 12").contains(&"december".to_owned()));
        // `wedding` stems to `wed` and `decking` to `deck`: neither is a calendar word.
        let wedding = terms_of("the wedding on the decking");
        assert!(!wedding.iter().any(|t| t == "wednesday" || t == "december"));
    }

    #[test]
    fn a_count_counts_the_noun_asked_and_is_no_day_of_a_date() {
        let sub = &decompose("How many tents are we getting on loan from District?")[0];
        let units = document_units(
            "kit.md",
            "District are lending us 6 patrol tents, to collect on Friday.",
        );
        assert_eq!(
            locate(sub, &units, 1)[0].span.as_deref(),
            Some("6 patrol tents")
        );
        // `9 bags` counts bags, not tents: no count of what was asked.
        let bags = document_units("kit.md", "9 bags of pegs, from the store.");
        assert_eq!(extract(sub, &bags[0]), None);
        // A count of whatever is meant (`copies`) and a bare number stay values.
        let copies = document_units("kit.md", "District sent 12 copies of the map.");
        assert_eq!(extract(sub, &copies[0]).as_deref(), Some("12 copies"));
        let bare = document_units("kit.md", "Tents on loan: 6.");
        assert_eq!(extract(sub, &bare[0]).as_deref(), Some("6"));
        // `10` of `10 March` and `March 10` is a day.
        assert_eq!(
            typed_spans(Slot::Count, "Order amended 10 March: 1,200 copies"),
            vec!["1,200 copies"]
        );
        assert_eq!(
            typed_spans(Slot::Count, "From March 10 we print 750 copies"),
            vec!["750 copies"]
        );
        // `may` as a verb is no month.
        assert_eq!(typed_spans(Slot::Count, "5 may be late"), vec!["5 may"]);
    }

    #[test]
    fn an_old_value_in_an_aside_is_not_the_answer() {
        let sub = &decompose("What time does the ferry leave?")[0];
        let units = document_units(
            "ferry.md",
            "departure: 08:10 (amended 2 May, was 08:40, because of the tide)",
        );
        assert_eq!(locate(sub, &units, 1)[0].span.as_deref(), Some("08:10"));
        // Only a `was` that starts the aside, or a clause of it, gives an old value.
        assert!(revisions("Venue: Corn Exchange (this was confirmed on 3 May).").is_empty());
        assert_eq!(
            revisions("Start: 19:00 (moved in March – was 19:30)"),
            vec![("19:30".to_string(), String::new())]
        );
        assert!(is_pending("Prices are still being finalised"));
        assert!(is_pending(
            "The route will be published in March; it is to be published"
        ));
        assert!(is_pending("The date hasn't been set yet"));
        assert!(!is_pending("The date was set last week"));
    }

    #[test]
    fn the_hosts_own_copy_yields_to_a_peer_that_matches_nearly_as_well() {
        let q = "What time does the library open on Saturday mornings?";
        let own = document_units(
            "notes.md",
            "Library opens Saturday mornings at 09:00, I think (old leaflet).",
        );
        let peer = document_units("hours.md", "Saturday: the library opens at 10:00.");
        let probe = |planner: &mut Planner, with_peer: bool| {
            let PlanStep::Probe(asked) = planner.next_step() else {
                panic!("a probe first")
            };
            let mut h = hits(&own, "me", &asked[0]);
            if with_peer {
                h.extend(hits(&peer, "peer", &asked[0]));
            }
            planner.handle(vec![h]);
            loop {
                match planner.next_step() {
                    PlanStep::Probe(a) => planner.handle(vec![Vec::new(); a.len()]),
                    PlanStep::Done(r) => return r,
                }
            }
        };
        let direct = |n: &str| Route::Direct { node_id: n.into() };
        let routed = probe(&mut Planner::new(q).with_host("me"), true);
        assert_eq!(routed[0].1, direct("peer"));
        // Without the host known, the better-matching own note wins.
        let routed = probe(&mut Planner::new(q), true);
        assert_eq!(routed[0].1, direct("me"));
        // Alone, the host answers from its own note.
        let routed = probe(&mut Planner::new(q).with_host("me"), false);
        assert_eq!(routed[0].1, direct("me"));
    }

    #[test]
    fn values_are_copied_from_the_named_column_or_after_the_noun() {
        let sub = &decompose("Which gate does CV 317 leave from?")[0];
        let units = document_units("departures.md", TABLE);
        let best = &locate(sub, &units, 3)[0];
        assert_eq!(best.span.as_deref(), Some("B14"));
        let prose = document_units("p.md", "The flight departs from gate B14 at ten.");
        assert_eq!(extract(sub, &prose[0]).as_deref(), Some("B14"));
        // A unit without the asked-for value holds no span (a bridge starts there).
        let groups = document_units(
            "g.md",
            "| Group | Flight |\n|---|---|\n| Merrin Youth Choir | CV 317 to Valdessa |\n",
        );
        let q =
            &decompose("Which gate does the flight carrying the Merrin Youth Choir leave from?")[0];
        assert_eq!(extract(q, &groups[0]), None);
        assert!(link_terms(q, &groups[0]).contains(&"valdessa".to_string()));
        // A code's number names it (`S-031`); a bare number does not.
        let where_q = &decompose("Where has the charcoal from trench 3 been sent?")[0];
        assert_eq!(where_q.slot, Slot::Place);
        assert!(where_q.slot_terms.is_empty(), "{where_q:?}");
        let sample = document_units(
            "s.md",
            "| Sample | Trench | Material |\n|---|---|---|\n| S-031 | 3 | charcoal |\n",
        );
        assert_eq!(
            extract(where_q, &sample[0]),
            None,
            "a sample code is no place"
        );
        let links = link_terms(where_q, &sample[0]);
        assert!(links.contains(&"031".to_string()), "{links:?}");
    }

    #[test]
    fn a_bridge_asks_the_follow_up_of_the_node_holding_the_value() {
        let q = "Which gate does the flight carrying the Merrin Youth Choir leave from?";
        let groups = document_units(
            "groups.md",
            "| Group | Flight |\n|---|---|\n| Merrin Youth Choir | CV 317 to Valdessa |\n",
        );
        let gates = document_units("departures.md", TABLE);
        let sub = decompose(q).remove(0);
        let mut h = hits(&groups, "jas", &sub);
        h.extend(hits(&gates, "otis", &sub));
        let starts = bridge_starts(&sub, &h, 2);
        assert_eq!(starts.len(), 1);
        let follow_hits = hits(&gates, "otis", &starts[0].1);
        let route = route_with_bridges(q, &sub, &h, &[(starts[0].clone(), follow_hits)]);
        assert_eq!(
            route,
            Route::Bridge {
                first: "jas".into(),
                second: "otis".into(),
                link: vec!["cv".into(), "valdessa".into()],
            }
        );
        // Both hops in one node's documents: that node's own evidence, no bridge.
        let mut one = hits(&groups, "jas", &sub);
        one.extend(hits(&gates, "jas", &sub));
        let start = bridge_starts(&sub, &one, 2).remove(0);
        let follow = hits(&gates, "jas", &start.1);
        let alone = route_with_bridges(q, &sub, &one, &[(start, follow)]);
        assert!(!matches!(alone, Route::Bridge { .. }), "{alone:?}");
        let mut inq = Inquiry::new(q, "me", vec![(sub, route)]);
        assert_eq!(inq.members(), vec!["jas".to_string(), "otis".to_string()]);
        let Next::Assign(first) = inq.next_step() else {
            panic!("assign")
        };
        assert_eq!(first.len(), 1);
        let s1 = inq.step_sub("jas", &first[0].1).unwrap();
        inq.record("jas", &first[0].1, locate(&s1, &groups, 4));
        let Next::Assign(second) = inq.next_step() else {
            panic!("follow-up")
        };
        assert_eq!(second[0].0, "otis");
        let s2 = inq.step_sub("otis", &second[0].1).unwrap();
        inq.record("otis", &second[0].1, locate(&s2, &gates, 4));
        let Next::Conclude(a) = inq.next_step() else {
            panic!("conclude")
        };
        assert_eq!(a.answer, "B14.");
        assert_eq!(a.status, AnswerStatus::Answered);
        assert_eq!(a.citations.len(), 2);
        assert!(a.citations[1].quote.contains("Gate: B14"));
    }

    #[test]
    fn a_record_field_named_by_the_clauses_other_words_answers_a_what_question() {
        // No column is called `consistency`; the one the clause's `food` names holds it.
        let q = "For Mr Ormsby in room 9: what consistency does his food have to be now?";
        let sub = decompose(q).remove(0);
        let rows = document_units(
            "diets.md",
            "| Room | Patient | Food texture | Drinks |\n|---|---|---|---|\n\
             | 9 | Mr Ormsby | Level 4 puréed | thin |\n",
        );
        assert_eq!(extract(&sub, &rows[0]).as_deref(), Some("Level 4 puréed"));
        // A column named after the record's entity says which record, not which value.
        let q = "Which coach does the first run out of Dunmere take?";
        let sub = decompose(q).remove(0);
        let rows = document_units(
            "runs.md",
            "| Run | Departures from Dunmere | Vehicle |\n|---|---|---|\n| A | 09:10, 11:40 | C7 |\n",
        );
        assert_ne!(extract(&sub, &rows[0]).as_deref(), Some("09:10, 11:40"));
    }

    #[test]
    fn an_outcome_verb_asks_for_the_latest_and_names_no_term() {
        let sub = decompose("Who ended up with the bass solo?").remove(0);
        assert!(sub.latest);
        assert!(sub.terms.iter().all(|t| t.term != "end"), "{:?}", sub.terms);
        assert_eq!(sub.text, "Who ended up with the bass solo?");
        let sub = decompose("What did the ramp turn out to be?").remove(0);
        assert!(sub.latest);
        let sub = decompose("When does the term end?").remove(0);
        assert!(!sub.latest);
    }

    #[test]
    fn the_value_noun_of_an_embedded_question_stops_at_its_subject() {
        // `what grade | the new blue route ... is`: only `grade` names the value.
        let sub =
            decompose("Can you find out what grade the new blue route on the slab is?").remove(0);
        assert_eq!(sub.slot_terms, terms_of("grade"));
        // A noun followed by a preposition keeps its phrase.
        let sub = decompose("What's the name of the ferry?").remove(0);
        assert!(
            sub.slot_terms.contains(&terms_of("ferry")[0]),
            "{:?}",
            sub.slot_terms
        );
    }

    #[test]
    fn who_replaces_whom_names_the_new_person_first() {
        let sub = decompose("Who's refereeing the U10 final?").remove(0);
        let note = document_units(
            "refs.md",
            "Note: Carys Pell was first appointed to the U10 final; she is ill and Rowan Teague replaces her.",
        );
        let found = locate(&sub, &note, 1);
        assert_eq!(found[0].span.as_deref(), Some("Rowan Teague"));
    }

    #[test]
    fn words_that_only_begin_alike_are_other_words() {
        assert!(term_matches("driv", "driver"));
        assert!(term_matches("weigh", "weight"));
        assert!(term_matches("insur", "insuranc"));
        // `Temperate House` says nothing about a temperature.
        assert!(!term_matches(
            &terms_of("temperate")[0],
            &terms_of("temperature")[0]
        ));
        assert!(!term_matches("cart", "cartridg"));
    }

    #[test]
    fn a_bracketed_aside_about_last_year_leaves_the_rest_current() {
        let sub = decompose("When did the giant lily first flower this year?").remove(0);
        let units = document_units(
            "flowers.md",
            "- 2 May: the orchid, first flowers.\n\
             - 14 June: giant lily, first flower of the season (last year 22 June).\n",
        );
        let found = locate(&sub, &units, 2);
        assert_eq!(found[0].span.as_deref(), Some("14 June"));
        // The whole note marked past is still a near miss.
        let old = document_units(
            "n.md",
            "Last year the giant lily first flowered on 22 June.",
        );
        let now = document_units("n.md", "The giant lily first flowered on 14 June.");
        assert!(score_unit(&sub, &old[0]) < score_unit(&sub, &now[0]));
    }

    #[test]
    fn a_year_is_no_count() {
        let sub = decompose("How many beds does the Aldhorn Hut have?").remove(0);
        let units = document_units(
            "huts.md",
            "Aldhorn Hut was extended in 2024 (previously 40 beds).",
        );
        assert_ne!(extract(&sub, &units[0]).as_deref(), Some("2024"));
    }

    #[test]
    fn a_when_question_that_names_the_day_asks_for_the_time() {
        assert_eq!(
            decompose("When is the puppet show on the Sunday?")[0].slot,
            Slot::Time
        );
        assert_eq!(
            decompose("When is the puppet show on 14 June?")[0].slot,
            Slot::Time
        );
        assert_eq!(decompose("When is the puppet show?")[0].slot, Slot::Date);
        assert_eq!(
            decompose("When in June is the puppet show?")[0].slot,
            Slot::Date
        );
    }

    #[test]
    fn a_slot_that_moves_from_one_time_to_another_is_at_the_new_one() {
        assert_eq!(
            revisions("the Sunday slot moves from 13:30 to 14:15, because of the display"),
            vec![("13:30".to_string(), "14:15".to_string())]
        );
        let sub = decompose("When is the Kestrel club flying on the Sunday?").remove(0);
        let note = document_units(
            "changes.md",
            "3 August: the Kestrel club's Sunday slot moves from 13:30 to 14:15, because the display is now at 13:30.",
        );
        assert_eq!(extract(&sub, &note[0]).as_deref(), Some("14:15"));
    }

    #[test]
    fn which_role_asks_for_a_person() {
        for q in [
            "Which room attendant is doing room 12 tomorrow?",
            "Which referee has the final?",
            "Which instructor is taking the Tuesday class?",
        ] {
            assert_eq!(decompose(q)[0].slot, Slot::Person, "{q}");
        }
        assert_eq!(decompose("Which room is the talk in?")[0].slot, Slot::Place);
    }

    #[test]
    fn how_long_is_never_answered_by_a_price() {
        let sub = decompose("How long is the film on Friday?").remove(0);
        assert!(unfit(&sub, "£85"));
        assert!(!unfit(&sub, "128 min"));
    }

    #[test]
    fn of_two_bridges_the_one_matching_the_question_best_is_taken() {
        let q = "How long is the film we're screening on 14 November?";
        let sub = decompose(q).remove(0);
        // Two starts without a value: a note naming a hall, the schedule naming the film.
        let note = document_units(
            "note.md",
            "Our November film screenings are on the 14th and the 28th at the Guildhall.",
        );
        let schedule = document_units(
            "schedule.md",
            "# Film screenings\n\n| Date | Film |\n|---|---|\n| 14 Nov | Under the Chalk Hills |\n",
        );
        let hall = document_units(
            "hall.md",
            "The Guildhall projector takes 20 minutes to warm up.",
        );
        let films = document_units(
            "films.md",
            "| Film | Length |\n|---|---|\n| Under the Chalk Hills | 128 min |\n",
        );
        let mut h = hits(&note, "win", &sub);
        h.extend(hits(&schedule, "cai", &sub));
        let starts = bridge_starts(&sub, &h, 2);
        assert_eq!(starts.len(), 2, "{starts:?}");
        let chains: Vec<_> = starts
            .iter()
            .map(|(start, follow)| {
                let mut f = hits(&hall, "ben", follow);
                f.extend(hits(&films, "zof", follow));
                ((start.clone(), follow.clone()), f)
            })
            .collect();
        let Route::Bridge { first, second, .. } = route_with_bridges(q, &sub, &h, &chains) else {
            panic!("a bridge")
        };
        assert_eq!((first.as_str(), second.as_str()), ("cai", "zof"));
    }

    #[test]
    fn a_failed_step_goes_to_the_next_node_that_found_a_value() {
        let q = "Who is the harbour master at Port Ellery?";
        let sub = decompose(q).remove(0);
        let strong = document_units(
            "a.md",
            "The harbour master at Port Ellery is Morwenna Tregenza.",
        );
        let weak = document_units(
            "b.md",
            "Port Ellery harbour office: Morwenna Tregenza is in charge.",
        );
        let nothing = document_units("c.md", "The ferry leaves at 16:20.");
        let hits: Vec<NodeHit> = [("bea", &strong), ("cal", &weak), ("dan", &nothing)]
            .into_iter()
            .flat_map(|(node, units)| {
                locate(&sub, units, 4).into_iter().map(move |l| NodeHit {
                    node_id: node.into(),
                    located: l,
                    prior: 0.0,
                })
            })
            .collect();
        let route = route_direct(q, &sub, &hits);
        assert_eq!(
            route,
            Route::Direct {
                node_id: "bea".into()
            }
        );
        let mut inq = Inquiry::new(q, "me", vec![(sub, route)]).with_alternates(&[hits]);
        // Only a node that found a value is an alternate; nobody else is recruited yet.
        assert_eq!(inq.parts[0].alternates, vec!["cal".to_string()]);
        assert_eq!(inq.members(), vec!["bea".to_string()]);
        let Next::Assign(first) = inq.next_step() else {
            panic!("assign")
        };
        assert_eq!(inq.failed("bea", &first[0].1), Some("cal".into()));
        let Next::Assign(again) = inq.next_step() else {
            panic!("re-assign")
        };
        assert_eq!(again[0].0, "cal");
        let s = inq.step_sub("cal", &again[0].1).unwrap();
        inq.record("cal", &again[0].1, locate(&s, &weak, 4));
        let Next::Conclude(a) = inq.next_step() else {
            panic!("conclude")
        };
        assert!(a.answer.contains("Morwenna Tregenza"), "{}", a.answer);
        assert_eq!(a.citations[0].node_id, "cal");
        // With no alternate left, a failure leaves the part unanswered.
        let mut inq = inq.clone();
        inq.parts[0].steps[0].result = None;
        assert_eq!(inq.failed("cal", &again[0].1), None);
        let Next::Conclude(a) = inq.next_step() else {
            panic!("conclude")
        };
        assert_eq!(a.status, AnswerStatus::Unknown);
    }

    #[test]
    fn calculations_take_cited_quantities_and_check_units() {
        let uplift = parse_quantity("4,150 litres").unwrap();
        let density = parse_quantity("0.80 kg per litre").unwrap();
        let c = calculate(CalcOp::Product, &uplift, &density).unwrap();
        assert_eq!(c.result, "3,320 kg");
        assert_eq!(c.shown, "4,150 litres × 0.80 kg per litre = 3,320 kg");
        let limit = parse_quantity("2.8 kg").unwrap();
        let mass = parse_quantity("2.35 kg").unwrap();
        let d = calculate(CalcOp::Difference, &mass, &limit).unwrap();
        assert_eq!(d.result, "0.45 kg (450 g)");
        assert!(
            calculate(CalcOp::Difference, &uplift, &limit).is_none(),
            "litres minus kg"
        );
        // A bare count less a counted amount keeps the amount's noun.
        let d = calculate(
            CalcOp::Difference,
            &parse_quantity("14").unwrap(),
            &parse_quantity("9 rolls").unwrap(),
        )
        .unwrap();
        assert_eq!(d.shown, "14 − 9 rolls = 5 rolls");
        assert!(asks_difference(
            "How many extra rolls do we have to buy, after using what's already in the store?"
        ));
        // Added up: two counts as numbers, two measures in the first one's unit, never a
        // rate or amounts of different kinds.
        let (fox, fest) = (
            parse_quantity("11").unwrap(),
            parse_quantity("26 firkins").unwrap(),
        );
        let s = calculate(CalcOp::Sum, &fox, &fest).unwrap();
        assert_eq!(s.shown, "11 + 26 firkins = 37 firkins");
        let s = calculate(CalcOp::Sum, &limit, &parse_quantity("500 g").unwrap()).unwrap();
        assert_eq!(s.result, "3.3 kg");
        assert!(
            calculate(CalcOp::Sum, &uplift, &limit).is_none(),
            "litres plus kg"
        );
        assert!(
            calculate(CalcOp::Sum, &uplift, &density).is_none(),
            "a rate"
        );
        let casks = &decompose("Adding up the Fox and the festival, how many casks are out?")[0];
        assert_eq!(
            calc_op(
                "Adding up the Fox and the festival, how many casks are out?",
                casks,
                None
            ),
            Some(CalcOp::Sum)
        );
        assert!(!asks_sum("How many casks are at the Fox?"));
        assert_eq!(
            asked_unit("What fuel mass in kilograms goes on the sheet?").as_deref(),
            Some("kg")
        );
        assert!(asks_difference("How much more weight can we add?"));
    }

    #[test]
    fn a_total_is_taken_by_the_operation_its_operands_allow() {
        // `come to`, `altogether`, `in total`: a total; a bare `total` names a figure.
        let q = "What will the Fairweather party's updos come to altogether?";
        assert!(asks_total(q));
        assert!(asks_total(
            "What does the pistachio order come to in sterling?"
        ));
        assert!(asks_total("How many casks are out in total?"));
        assert!(!asks_total("What is the total capacity of the hall?"));
        assert!(!asks_total("Who is coming on Tuesday?"));
        // `what does X come to` asks an amount, though no noun names one.
        let sub = &decompose("What does the pistachio paste order come to?")[0];
        assert_eq!(sub.slot, Slot::Quantity, "{sub:?}");
        assert_eq!(calc_op(q, &decompose(q)[0], None), Some(CalcOp::Total));
        // A rate and an amount: their product; two amounts of one kind: their sum; two
        // rates: nothing.
        let (count, rate) = (
            parse_quantity("6 updos").unwrap(),
            parse_quantity("£48 per updo").unwrap(),
        );
        let t = calculate(CalcOp::Total, &count, &rate).unwrap();
        assert_eq!(t.result, "£288");
        let t = calculate(
            CalcOp::Total,
            &parse_quantity("11").unwrap(),
            &parse_quantity("26 firkins").unwrap(),
        )
        .unwrap();
        assert_eq!(t.result, "37 firkins");
        assert!(calculate(CalcOp::Total, &rate, &rate).is_none());
        assert!(
            calculate(
                CalcOp::Total,
                &parse_quantity("£25").unwrap(),
                &parse_quantity("8.3").unwrap()
            )
            .is_none(),
            "money and a bare number"
        );
        // A record's fields give the factors of a product: a count named by its field,
        // a price under `Per X` a rate per X.
        let bookings = document_units(
            "b.md",
            "Changeovers in August: 5 (1, 8, 15, 19 and 26 August)",
        );
        let prices = document_units(
            "p.md",
            "| Property | Per changeover |\n|---|---|\n| Gull Cottage | £65 |\n",
        );
        let (count, per) = (
            &field_quantities(&bookings[0])[0],
            &field_quantities(&prices[0])[0],
        );
        assert_eq!((count.value, count.unit.as_str()), (5.0, "changeovers"));
        assert_eq!(per.per.as_deref(), Some("changeover"), "{per:?}");
        assert_eq!(calculate(CalcOp::Total, count, per).unwrap().result, "£325");
        // Without a total's words, a plain amount question stays direct.
        let plain = "What is the bridal updo price?";
        assert_eq!(calc_op(plain, &decompose(plain)[0], None), None);
    }

    #[test]
    fn a_person_is_not_read_from_a_column_of_another_kind() {
        let sub = &decompose("Who is the driver bringing Mrs Pennington's packs?")[0];
        assert_eq!(sub.slot, Slot::Person);
        let row = document_units(
            "r.md",
            "| Patient | Address | Day | Route |\n|---|---|---|---|\n| Mrs J. Pennington | 4 Alder Rise | Thursday | R2 |\n",
        );
        assert_eq!(row[0].fields.len(), 4, "{:?}", row[0].fields);
        assert_eq!(extract(sub, &row[0]), None, "an address is nobody");
        let named = document_units(
            "d.md",
            "| Route | Driver | Van |\n|---|---|---|\n| R2 | Alfie Stone | 3 |\n",
        );
        assert_eq!(extract(sub, &named[0]).as_deref(), Some("Alfie Stone"));
    }

    #[test]
    fn a_bridge_follows_the_new_holder_not_the_one_a_revision_replaced() {
        let sub = &decompose(
            "What's the mobile number of the locksmith sent to the lockout on Cobham Road?",
        )[0];
        let job = document_units(
            "jobs.md",
            "Address: 22 Cobham Road; Job: lockout; Engineer: Danny Price (reassigned from Kerry Quinn at 13:55); Status: en route",
        );
        let links = link_terms(sub, &job[0]);
        assert!(
            links.contains(&"danni".to_string()) || links.contains(&"danny".to_string()),
            "{links:?}"
        );
        assert!(
            !links
                .iter()
                .any(|l| l.starts_with("kerr") || l.starts_with("quinn")),
            "{links:?}"
        );
        assert_eq!(
            revisions("Engineer: Danny Price (reassigned from Kerry Quinn at 13:55)")[0].0,
            "Kerry Quinn at 13:55"
        );
    }

    #[test]
    fn answers_are_short_cited_and_say_unknown_plainly() {
        let part = |v: Option<&str>| PartAnswer {
            question: "who?".into(),
            value: v.map(str::to_owned),
            citations: Vec::new(),
        };
        assert_eq!(
            compose(&[part(Some("24 degrees")), part(Some("Thursday"))]).answer,
            "24 degrees; Thursday."
        );
        let unknown = compose(&[part(None)]);
        assert_eq!(unknown.status, AnswerStatus::Unknown);
        assert!(unknown.answer.starts_with("unknown:"));
        assert_eq!(
            compose(&[part(Some("x")), part(None)]).status,
            AnswerStatus::Partial
        );
        let long = "word ".repeat(100);
        assert_eq!(
            compose(&[part(Some(&long))])
                .answer
                .split_whitespace()
                .count(),
            MAX_ANSWER_WORDS
        );
    }

    #[test]
    fn a_record_line_knows_what_its_record_is_about() {
        let sheet = "# Call sheet — day 14\n\nLocation: Gullhaven pier\nCrew call: 05:50\n\n\
                     Pier access from 05:00 on other days.\n";
        let units = document_units("call_sheet.md", sheet);
        assert_eq!(units[1].record, "Location: Gullhaven pier");
        assert!(units[2].record.is_empty(), "prose is no record line");
        let sub = &decompose("What time does the crew have to be at Gullhaven pier?")[0];
        // The best unit holding a value (as `best_direct` takes it).
        let best = locate(sub, &units, 4)
            .into_iter()
            .find(|l| l.span.is_some());
        assert_eq!(best.and_then(|l| l.span).as_deref(), Some("05:50"));
    }

    #[test]
    fn prices_people_and_linked_phrases_are_copied_as_asked() {
        let units = document_units(
            "prices.md",
            "| Hut | Member | Non-member |\n|---|---|---|\n| Stainach Hut | €26 | €41 |\n",
        );
        let cost = &decompose("What does a night at the Stainach Hut cost?")[0];
        assert_eq!(extract(cost, &units[0]).as_deref(), Some("€26"));
        // A date has capitals but is nobody.
        let batch = document_units(
            "b.md",
            "| Batch | Mixed on | Mixed by |\n|---|---|---|\n| 14 | 2 May | Arlo Penrose |\n",
        );
        let who = &decompose("Who mixed the batch?")[0];
        assert_eq!(extract(who, &batch[0]).as_deref(), Some("Arlo Penrose"));
        let allergy = document_units("n.md", "Medical history: allergic to latex; gloves only.");
        let what = &decompose("What is Anselm allergic to?")[0];
        assert_eq!(extract(what, &allergy[0]).as_deref(), Some("latex"));
    }

    #[test]
    fn a_lone_capital_names_a_row_and_the_later_record_is_current() {
        let rows = document_units(
            "power.md",
            "| Row | Design power |\n|---|---|\n| J | 150 kW |\n| K | 180 kW |\n",
        );
        let sub = &decompose("What's the power budget for rack row K?")[0];
        assert_eq!(locate(sub, &rows, 1)[0].span.as_deref(), Some("180 kW"));
        let weights = document_units(
            "weights.md",
            "| Date | Animal | Weight |\n|---|---|---|\n| 3 Nov | Tansy | 5.4 kg |\n\
             | 14 Aug | Tansy | 5.1 kg |\n",
        );
        let w = &decompose("How heavy is Tansy?")[0];
        assert_eq!(locate(w, &weights, 1)[0].span.as_deref(), Some("5.4 kg"));
    }

    #[test]
    fn a_conversion_statement_is_a_rate_the_calculator_uses() {
        let q = parse_quantity("1 nautical mile = 1.852 km").expect("a rate");
        assert_eq!(
            (q.value, q.unit.as_str(), q.per.as_deref()),
            (1.852, "km", Some("nmi"))
        );
        let race = parse_quantity("7.5 nautical miles").expect("a length");
        assert_eq!(race.unit, "nmi");
        let c = calculate(CalcOp::Product, &race, &q).expect("converts");
        assert_eq!(c.result, "13.89 km");
        let units = document_units(
            "u.md",
            "1 knot = 1 nautical mile per hour\n1 mile = 1.6 km\n",
        );
        assert_eq!(units.len(), 2, "each statement is a unit of its own");
        // `in the morning` names no unit.
        assert_eq!(asked_unit("How far is it in the morning?"), None);
        assert_eq!(
            asked_unit("How far is it in kilometres?").as_deref(),
            Some("km")
        );
    }

    #[test]
    fn unsettled_facts_and_wrong_kinds_give_no_value() {
        let rows = document_units(
            "s.md",
            "| Number | Choreographer |\n|---|---|\n| Finale | TBC |\n| Opening | Clothilde Renard |\n",
        );
        let who = &decompose("Who is choreographing the finale?")[0];
        let found = locate(who, &rows, 2);
        assert!(found[0].pending && found[0].span.is_none());
        let hits: Vec<NodeHit> = found
            .into_iter()
            .map(|l| NodeHit {
                node_id: "n".into(),
                located: l,
                prior: 0.0,
            })
            .collect();
        assert!(
            best_direct(&hits).is_none(),
            "TBC outranks another row's name"
        );
        // Nor does a bridge from the unsettled row answer (`Finale` → last year's finale).
        assert!(bridge_starts(who, &hits, 2).is_empty());
        // A table under a heading that says it is past is a near miss.
        let old = document_units(
            "takings.md",
            "# Fair takings — last year\n\n| Activity | Price |\n|---|---|\n| Pony rides | £3 |\n",
        );
        let price = &decompose("How much are the pony rides at the fair?")[0];
        let now = document_units(
            "plan.md",
            "| Activity | Price |\n|---|---|\n| Pony rides | £3 |\n",
        );
        let (past, current) = (score_unit(price, &old[0]), score_unit(price, &now[0]));
        assert!(past.unwrap() < current.unwrap(), "{past:?} {current:?}");
        let cost = &decompose("How much will it cost to play the new room?")[0];
        let notes = document_units("r.md", "The new room: a 60 minutes game.");
        assert_eq!(extract(cost, &notes[0]), None, "a duration is no price");
    }

    #[test]
    fn the_planner_asks_for_relaxed_probes_only_for_calculations() {
        let mut p = Planner::new("How many more chairs do we need for the Lark Hall dinner?");
        let PlanStep::Probe(asked) = p.next_step() else {
            panic!("the first step probes the sub-questions");
        };
        assert_eq!(asked.len(), 1);
        let hit = |node: &str, doc: &str, text: &str| {
            let unit = document_units(doc, text).remove(0);
            let sub = &asked[0];
            NodeHit {
                node_id: node.into(),
                located: Located {
                    span: extract(sub, &unit),
                    score: score_unit(sub, &unit).unwrap_or(0.0),
                    unit,
                    pending: false,
                },
                prior: 0.0,
            }
        };
        p.handle(vec![vec![
            hit("a", "guests.md", "Lark Hall dinner: 120 chairs needed."),
            hit("b", "store.md", "Lark Hall store holds 80 chairs."),
        ]]);
        // A difference: the relaxed question (no name required) is probed next.
        let PlanStep::Probe(relaxed) = p.next_step() else {
            panic!("a calculation probes its relaxed question");
        };
        assert!(relaxed[0].terms.iter().all(|t| !t.required));
        p.handle(vec![]);
        let PlanStep::Done(routed) = p.next_step() else {
            panic!("no bridge to follow");
        };
        assert_eq!(routed.len(), 1);

        // A question asking for no difference or conversion gets no relaxed probe.
        let mut q = Planner::new("Who runs the Lark Hall dinner?");
        let PlanStep::Probe(_) = q.next_step() else {
            panic!("the first step probes the sub-questions");
        };
        q.handle(vec![]);
        assert!(
            matches!(q.next_step(), PlanStep::Done(_)),
            "no calculation, no hits: nothing more to probe"
        );
    }

    #[test]
    fn a_revision_at_one_node_demotes_the_old_value_another_node_lists() {
        let mut p = Planner::new("What time does the Marchbank funeral start?");
        let PlanStep::Probe(asked) = p.next_step() else {
            panic!("the first step probes the sub-questions");
        };
        let sub = asked[0].clone();
        let hit = |node: &str, doc: &str, text: &str| {
            let unit = document_units(doc, text).remove(0);
            NodeHit {
                node_id: node.into(),
                located: Located {
                    span: extract(&sub, &unit),
                    score: score_unit(&sub, &unit).unwrap_or(0.0),
                    unit,
                    pending: false,
                },
                prior: 0.0,
            }
        };
        let sheet = hit("a", "marchbank.md", "Marchbank funeral: time booked 11:30.");
        let note = hit(
            "b",
            "amendments.md",
            "24 Nov: Marchbank moved from 11:30 to 12:15 at the family's request.",
        );
        let other = hit("b", "diary.md", "Ferris funeral: time booked 11:45.");
        assert_eq!(sheet.located.span.as_deref(), Some("11:30"));
        assert_eq!(note.located.span.as_deref(), Some("12:15"));
        let before = sheet.located.score;
        p.handle(vec![vec![sheet, note, other]]);
        let hits = &p.hits()[0];
        assert!(
            hits[0].located.score < before,
            "the old value is a near miss"
        );
        assert!(
            hits[1].located.score >= before,
            "the revision takes its place"
        );
        assert_eq!(
            best_direct(hits).and_then(|h| h.located.span.as_deref()),
            Some("12:15")
        );
    }

    #[test]
    fn a_revised_value_is_a_near_miss_and_the_revision_gives_the_new_one() {
        let units = document_units(
            "deliveries.md",
            "| Due | Item |\n|---|---|\n| 10 March | rye flour |\n\n\
             The rye flour delivery was moved from 10 March to 17 March because the mill is shut.\n",
        );
        assert_eq!(
            revisions(&units[1].text),
            vec![("10 March".to_string(), "17 March".to_string())]
        );
        let when = &decompose("When is the rye flour delivery due?")[0];
        let best = locate(when, &units, 2)
            .into_iter()
            .find(|l| l.span.is_some())
            .and_then(|l| l.span);
        assert_eq!(best.as_deref(), Some("17 March"));
        assert_eq!(
            revisions("Lock time: 15:00 (was 14:30 on the spring cycle)"),
            vec![("14:30 on the spring cycle".to_string(), String::new())]
        );
    }

    #[test]
    fn an_update_outranks_the_listing_it_updates() {
        // The row and the note match alike; the note changes the row.
        let units = document_units(
            "kilns.md",
            "| Kiln | Next firing | Load |\n|---|---|---|\n| Big kiln | 4 May | glaze |\n\n\
             Note: the big kiln's next firing is now on 9 May.\n",
        );
        let when = &decompose("When is the next firing of the big kiln?")[0];
        let found = locate(when, &units, 2);
        assert_eq!(found[0].span.as_deref(), Some("9 May"), "{found:?}");
        assert!(is_update("Jun Takeda takes over the alto solo"));
        assert!(is_update("7204 works Diagram A instead on both days"));
        assert!(!is_update("Big kiln | 4 May | glaze"));
        // The new value, not the one it came from.
        assert_eq!(
            {
                let t = "the rye first booked for 10 March was moved to 17 March";
                updated_value(when, t, &revisions(t))
            }
            .as_deref(),
            Some("17 March")
        );
        assert_eq!(
            {
                let t = "Delivery: 5 May (revised: brought forward from 9 May)";
                updated_value(when, t, &revisions(t))
            },
            None
        );
    }

    #[test]
    fn a_number_asked_with_its_noun_matches_a_range_of_that_noun_holding_it() {
        let units = document_units(
            "sittings.md",
            "| Sitting | Year groups | Time |\n|---|---|---|\n\
             | First | Reception, Years 1–2 | 11:45 |\n\
             | Second | Years 3–6 | 12:25 |\n",
        );
        let when =
            &decompose("A parent of a Year 4 child is asking: what time does her year group eat?")
                [0];
        let found = locate(when, &units, 2);
        assert_eq!(found[0].span.as_deref(), Some("12:25"), "{found:?}");
        // Only a range of the noun asked with the number, and only one holding it.
        let ranges = numbered_ranges("Rooms 10 to 14; Years 3–6; pages 7-2");
        assert_eq!(
            ranges,
            vec![("room".to_owned(), 10, 14), ("year".to_owned(), 3, 6)]
        );
        assert!(in_named_range("Which is room 12?", "12", &ranges));
        assert!(!in_named_range("Which is table 12?", "12", &ranges));
        assert!(!in_named_range("Which is room 15?", "15", &ranges));
    }

    #[test]
    fn instead_of_names_the_old_value_after_it_and_the_new_one_before() {
        let t = "11 Nov: Abimbola Straith covers the Sunday night shift instead of Gareth \
                 Pennock (shift swap agreed).";
        assert_eq!(
            revisions(t),
            vec![("Gareth Pennock".to_owned(), String::new())]
        );
        let who = &decompose("Who is on the Sunday night shift?")[0];
        assert_eq!(
            updated_value(who, t, &revisions(t)).as_deref(),
            Some("Abimbola Straith")
        );
        // Elsewhere, the replaced value is a near miss: the note outranks a line naming it.
        let units = document_units(
            "rota.md",
            &format!("Sunday night shift: Gareth Pennock.\n\n{t}\n"),
        );
        let found = locate(who, &units, 2);
        assert_eq!(
            found[0].span.as_deref(),
            Some("Abimbola Straith"),
            "{found:?}"
        );
        // `in place of` and `rather than` name the replaced value the same way.
        let t = "Kiln B is used in place of Kiln A this week.";
        assert_eq!(
            revisions(t),
            vec![("Kiln A this week".to_owned(), String::new())]
        );
        let t = "Book the minibus rather than the coach.";
        assert_eq!(revisions(t), vec![("the coach".to_owned(), String::new())]);
    }

    #[test]
    fn a_change_note_that_names_a_listing_replaces_its_value() {
        let doc = |note: &str| {
            document_units(
                "appointments.md",
                &format!(
                    "| Patient | Appointment | Type |\n|---|---|---|\n\
                     | Ravi Patel | Tue 14 April | dental check-up |\n\
                     | Mia Jones | Wed 15 April | dental check-up |\n\n{note}\n"
                ),
            )
        };
        let when = &decompose("When is Ravi Patel's dental check-up appointment?")[0];
        let best = |units: &[Unit]| {
            locate(when, units, 3)
                .into_iter()
                .find_map(|l| l.span)
                .unwrap_or_default()
        };
        // The note shares only the name with the question, the row every word; the note
        // changes the row, so its value answers.
        let units = doc("Rebooking: Ravi Patel moved to Thu 16 April.");
        assert!(
            best(&units).contains("16 April"),
            "{:?}",
            locate(when, &units, 3)
        );
        // A note about another patient changes nothing of Ravi's row.
        let units = doc("Rebooking: Mia Jones moved to Thu 16 April.");
        assert!(
            best(&units).contains("14 April"),
            "{:?}",
            locate(when, &units, 3)
        );
        // A note whose value is the one it came from (`previously`) is no new value.
        let beds = &decompose("How many beds does the Stainach Hut have?")[0];
        let units = document_units(
            "huts.md",
            "| Hut | Beds |\n|---|---|\n| Stainach Hut | 48 |\n\n\
             Stainach Hut was extended in 2024 (previously 40 beds).\n",
        );
        let found = locate(beds, &units, 2);
        assert_eq!(found[0].span.as_deref(), Some("48"), "{found:?}");
    }

    #[test]
    fn ends_of_ranges_dated_notes_and_fields_named_by_the_question() {
        // `shut` asks for the end of an opening range.
        let shut = &decompose("What time do the glasshouses shut in summer?")[0];
        let hours = document_units("hours.md", "glasshouses (April–September): 10:00–16:30\n");
        assert_eq!(extract(shut, &hours[0]).as_deref(), Some("16:30"));
        let open = &decompose("What time do the glasshouses open in summer?")[0];
        assert_eq!(extract(open, &hours[0]).as_deref(), Some("10:00"));
        // A dated note is dated by its name, not by a past date it mentions.
        let when = &decompose("When did the water lily first flower?")[0];
        let note = document_units(
            "log.md",
            "14 June: water lily, first flower of the season (last year 22 June)\n",
        );
        assert_eq!(extract(when, &note[0]).as_deref(), Some("14 June"));
        // `overnight` names the `Night` column; the lead-in's topic is every clause's.
        let sub =
            &decompose("Visitors ask me about the tropical house: how warm is it overnight?")[0];
        assert!(
            sub.terms.iter().any(|t| t.term == "tropical" && t.context),
            "{sub:?}"
        );
        let row = document_units(
            "temps.md",
            "| House | Day | Night |\n|---|---|---|\n| Tropical House | 26°C | 21°C |\n",
        );
        assert_eq!(extract(sub, &row[0]).as_deref(), Some("21°C"));
    }

    #[test]
    fn a_difference_of_bare_counts_says_what_it_counts() {
        assert_eq!(
            counted_noun("How many more white ranunculus stems do we still have to order?")
                .as_deref(),
            Some("stems")
        );
        assert_eq!(counted_noun("How many are left?"), None);
    }

    #[test]
    fn an_age_group_is_one_term_and_matched_context_breaks_ties() {
        assert_eq!(terms_of("Under-12s"), terms_of("U12"));
        assert_eq!(terms_of("under 12"), terms_of("U-12s"));
        let rows = document_units(
            "fixtures.md",
            "| Age group | Kick-off |\n|---|---|\n| U11 | 09:30 |\n| U12 | 10:30 |\n",
        );
        let sub = &decompose("For our Under-12s game: when does it kick off?")[0];
        let found = locate(sub, &rows, 2);
        assert_eq!(found[0].span.as_deref(), Some("10:30"), "{found:?}");
    }

    #[test]
    fn money_rates_and_exchange_rates_multiply_into_totals() {
        // 7 ringers (a bare count under `Ringers`) at £28 per ringer.
        let ringers = parse_quantity("7").unwrap();
        let fee = parse_quantity("£28 per ringer").unwrap();
        assert_eq!(
            (fee.unit.as_str(), fee.per.as_deref()),
            ("gbp", Some("ringer"))
        );
        let c = calculate(CalcOp::Product, &ringers, &fee).unwrap();
        assert_eq!(c.result, "£196");
        // £520 at a quoting rate of £1 = €1.15.
        let day = parse_quantity("£520").unwrap();
        let rate = parse_quantity("£1 = €1.15").unwrap();
        assert_eq!(
            (rate.unit.as_str(), rate.per.as_deref()),
            ("eur", Some("gbp"))
        );
        let c = calculate(CalcOp::Product, &day, &rate).unwrap();
        assert_eq!(c.result, "€598");
        let c = calculate(CalcOp::Product, &parse_quantity("€240").unwrap(), &{
            let mut r = parse_quantity("€1 = £0.86").unwrap();
            r.text = "£0.86 per €1".into();
            r
        })
        .unwrap();
        assert_eq!(c.result, "£206.40");
        assert_eq!(
            asked_unit("What does that come to in euros?").as_deref(),
            Some("eur")
        );
        // A rate found for a total is one factor of it.
        let q = "What will the couple pay for the ringing?";
        let sub = &decompose(q)[0];
        let unit = document_units("fees.md", "wedding ringing: £28 per ringer\n").remove(0);
        let hit = NodeHit {
            node_id: "n".into(),
            located: Located {
                span: Some("£28 per ringer".into()),
                score: 1.0,
                unit,
                pending: false,
            },
            prior: 0.0,
        };
        assert_eq!(calc_op(q, sub, Some(&hit)), Some(CalcOp::Product));
        assert_eq!(
            calc_op("What is the fee per ringer?", sub, Some(&hit)),
            None
        );
    }

    #[test]
    fn a_bridge_follows_the_planned_entity_whatever_the_reading_order() {
        let q = "Who has the big tile saw out?";
        let sub = decompose(q)[0].clone();
        let units = document_units(
            "a.md",
            "TL-112 wet tile saw (large), water tray\n\n\
             | Item code | Item | Member no. |\n|---|---|---|\n| TL-112 | Tile saw (large) | M-0417 |\n",
        );
        let row = units.iter().find(|u| !u.fields.is_empty()).unwrap().clone();
        let route = Route::Bridge {
            first: "b".into(),
            second: "h".into(),
            link: link_terms(&sub, &row),
        };
        let located = |u: &Unit| Located {
            span: None,
            score: 0.5,
            unit: u.clone(),
            pending: false,
        };
        for found in [
            vec![located(&units[0]), located(&row)],
            vec![located(&row), located(&units[0])],
        ] {
            let mut inq = Inquiry::new(q, "me", vec![(sub.clone(), route.clone())]);
            let Next::Assign(first) = inq.next_step() else {
                panic!("the first node is asked")
            };
            inq.record(&first[0].0, &first[0].1, found);
            let Next::Assign(follow) = inq.next_step() else {
                panic!("the follow-up is asked")
            };
            assert!(follow[0].1.contains("M-0417"), "{follow:?}");
        }
    }

    #[test]
    fn how_long_is_answered_by_a_stated_duration() {
        let units = document_units(
            "moonflower.md",
            "# Moonflower seeds\n\nMoonflower seeds germinate best at 24 degrees Celsius. \
             Below 18 degrees they stay dormant.\n\nSoak the seeds in water for 8 hours \
             before planting them 1 cm deep.\n",
        );
        let subs = decompose(
            "At what temperature do moonflower seeds germinate best, and how long should they soak?",
        );
        assert_eq!(subs.len(), 2, "{subs:?}");
        let soak = &subs[1];
        let best = &locate(soak, &units, 3)[0];
        assert!(best.unit.text.starts_with("Soak the seeds"), "{best:?}");
        assert_eq!(best.span.as_deref(), Some("8 hours"));
        // The words `long`, `length`, `duration` are in no unit: without the stated
        // duration counting for them, the match is a fifth of the clause's weight.
        assert!(best.score > 0.9, "{best:?}");
        // A unit without a duration or length gains nothing.
        let temp = units
            .iter()
            .find(|u| u.text.contains("24 degrees"))
            .expect("unit");
        assert!(score_unit(soak, temp).unwrap_or(0.0) < 0.1);
    }

    #[test]
    fn a_fare_is_money_not_a_distance() {
        let rows = document_units(
            "fares.md",
            "| Journey | Day (06:00–23:00) | Night |\n|---|---|---|\n| Centre → Airport | £46 | £52 |\n",
        );
        let fare = &decompose("What's our set daytime fare out to the Airport?")[0];
        assert_eq!(fare.slot, Slot::Quantity);
        assert_eq!(extract(fare, &rows[0]).as_deref(), Some("£46"));
        let far = &decompose("How far is the Airport from the centre?")[0];
        assert!(unfit(far, "£46"), "{far:?}");
    }

    #[test]
    fn a_morning_question_takes_a_morning_time() {
        let rows = document_units(
            "coach.md",
            "| Leg | Departs |\n|---|---|\n| Return coach | 14:30 |\n| Outbound coach | 08:15 |\n",
        );
        let when = &decompose("What time does the coach leave on Saturday morning?")[0];
        assert_eq!(extract(when, &rows[0]), None);
        assert_eq!(extract(when, &rows[1]).as_deref(), Some("08:15"));
    }

    fn offer(node: &str, agent: &str, bm25: f32, cosine: f32) -> AgentOffer {
        AgentOffer {
            node_id: node.into(),
            agent: agent.into(),
            bm25,
            cosine,
        }
    }

    #[test]
    fn a_question_no_document_holds_goes_to_a_matching_agent_verbatim() {
        let q = "Review this diff for race conditions:\n  - lock(a); lock(b)";
        let routed: Vec<(SubQuestion, Route)> = decompose(q)
            .into_iter()
            .map(|s| (s, Route::NotFound))
            .collect();
        let offers = [
            offer("n-weather", "forecast", 0.0, 0.12),
            offer("n-review", "reviewer", 2.5, 0.41),
        ];
        let (sub, route) = delegate(q, &routed, &offers, None).expect("delegated");
        assert_eq!(sub.text, q, "the task goes verbatim");
        assert_eq!(
            route,
            Route::Agent {
                node_id: "n-review".into(),
                agent: "reviewer".into()
            }
        );
        // Close in meaning without a shared term is enough; neither is not.
        let (_, route) =
            delegate(q, &[], &[offer("n-x", "x", 0.0, MIN_AGENT_COSINE)], None).unwrap();
        assert!(matches!(route, Route::Agent { .. }));
        assert_eq!(delegate(q, &routed, &offers[..1], None), None);
        assert_eq!(delegate(q, &routed, &[], None), None);
        // The asked node's own agent takes what no card matches.
        let own = offer("n-me", "mine", 0.0, 0.0);
        let (_, route) = delegate(q, &routed, &offers[..1], Some(&own)).unwrap();
        assert_eq!(
            route,
            Route::Agent {
                node_id: "n-me".into(),
                agent: "mine".into()
            }
        );
        // A matching card still comes first.
        let (_, route) = delegate(q, &routed, &offers, Some(&own)).unwrap();
        assert!(matches!(route, Route::Agent { node_id, .. } if node_id == "n-review"));
    }

    #[test]
    fn documents_come_before_agents() {
        let q = "Which gate does the Oslo flight leave from?";
        let sub = decompose(q).remove(0);
        let routed = vec![(
            sub,
            Route::Direct {
                node_id: "n-docs".into(),
            },
        )];
        assert_eq!(
            delegate(q, &routed, &[offer("n-a", "a", 9.0, 0.9)], None),
            None
        );
    }

    #[test]
    fn an_agents_answer_comes_back_verbatim_and_cited_as_the_agents() {
        let q = "Summarise the incident.";
        let (sub, route) = delegate(q, &[], &[offer("n-a", "scribe", 1.0, 0.0)], None).unwrap();
        let mut inquiry = Inquiry::new(q, "me", vec![(sub, route)]);
        assert_eq!(inquiry.members(), ["n-a"]);
        assert_eq!(
            inquiry.next_step(),
            Next::Assign(vec![("n-a".into(), q.into())])
        );
        assert!(inquiry.is_agent_step("n-a", q));
        assert_eq!(
            inquiry.step_sub("n-a", q),
            None,
            "no sub-question to locate"
        );
        let long: String = (0..2 * MAX_ANSWER_WORDS)
            .map(|i| format!("w{i} "))
            .collect();
        let mut failed = inquiry.clone();
        inquiry.record_reply("n-a", q, Some(long.clone()));
        let Next::Conclude(a) = inquiry.next_step() else {
            panic!("nothing is pending");
        };
        assert_eq!(a.answer, long, "not cut, not rewritten");
        assert_eq!(a.status, AnswerStatus::Answered);
        assert_eq!(a.citations.len(), 1);
        assert_eq!(a.citations[0].agent.as_deref(), Some("scribe"));
        assert_eq!(a.citations[0].line(), "n-a (agent scribe)");
        // A failed agent leaves the question unknown.
        failed.record_reply("n-a", q, None);
        let Next::Conclude(a) = failed.next_step() else {
            panic!("nothing is pending");
        };
        assert_eq!(a.status, AnswerStatus::Unknown);
        assert!(a.citations.is_empty());
    }
}
