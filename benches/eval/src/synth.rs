//! Seeded generator of synthetic team-formation benchmarks, in the style of the Internet of
//! Agents evaluation: a registry of agent cards with distinct specialities, and tasks written
//! by someone who needs 2–4 of those specialities and describes them in their own words.
//!
//! # Design
//!
//! - **Specialities.** Five domains (documents, software, data analysis, media, operations),
//!   each with 8 actions, 14–16 objects and 6–8 qualifiers (languages, programming
//!   languages, data stores, platforms, regions). A speciality is one
//!   `(action, object, qualifier)`, e.g. *translates* × *legal contracts* × *German*; each
//!   agent has exactly one, so a task's gold team is well defined. The 600 `(action, object)`
//!   pairs are dealt out round-robin, so agents sharing a pair (at 1,200 cards: two per pair)
//!   differ in their qualifier, **and the task always names the qualifier** verbatim: there
//!   are no look-alikes that the task text cannot tell apart.
//! - **Cards** are a sentence or two: the speciality in the card's own key terms
//!   ("translates legal contracts written in German"), then with probability 0.7 a
//!   *distractor* sentence naming another object of the same domain ("Has also worked with
//!   invoices."), and with probability 0.5 a generic filler ("Reports results in plain
//!   language."). Distractors and fillers give many cards overlapping vocabulary.
//! - **Tasks** have one requirement sentence per gold agent, in random order. Within each,
//!   the action and the object are *independently* said with the cards' key terms (with
//!   probability [`SynthConfig::lexical_overlap`], default 0.5) or with a paraphrase the
//!   cards never use ("render the agreements in another tongue"). Up to
//!   [`SynthConfig::context_sentences`] (default 2) context sentences with no requirement
//!   ("Our data team is busy with other projects.") are mixed in as noise.
//! - **Teams** have 2–4 members, every card is in at least one team, a team never has two
//!   agents of the same `(action, object)` pair, and about half of the members come from
//!   the first member's domain.
//!
//! # Difficulty knobs
//!
//! - `lexical_overlap`: 1 makes every requirement reuse the card's terms (easy for BM25), 0
//!   paraphrases everything (BM25 then only has the qualifier and stray words).
//! - `context_sentences`: more noise sentences per task.
//! - `cards`: more cards means more agents per `(action, object)` pair (up to the number of
//!   qualifiers), i.e. more same-topic agents told apart only by the qualifier.
//!
//! The design was fixed before measuring and is not tuned to any target score; the bench
//! README reports what it gives.

use std::collections::HashSet;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::{AgentRecord, TaskRecord};

/// Why a benchmark cannot be generated.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// More cards were asked for than there are distinct skills.
    #[error(
        "at most {max} cards can be generated (one per distinct skill), {asked} were asked for"
    )]
    TooManyCards {
        /// Cards requested.
        asked: usize,
        /// Distinct skills available.
        max: usize,
    },
    /// Tasks of at most four agents cannot cover every card, or there are too few cards.
    #[error(
        "{tasks} tasks of 2-4 agents cannot give all {cards} cards a task: need 4 <= cards <= 4 x tasks"
    )]
    Infeasible {
        /// Cards requested.
        cards: usize,
        /// Tasks requested.
        tasks: usize,
    },
    /// `lexical_overlap` is not a probability.
    #[error("lexical overlap must be within 0 and 1, got {0}")]
    BadOverlap(f64),
}

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynthConfig {
    /// Number of agent cards in the registry (each appears in at least one task).
    pub cards: usize,
    /// Number of tasks.
    pub tasks: usize,
    /// Random seed: equal configs give identical output.
    pub seed: u64,
    /// Probability that a task names an action or an object with the cards' own key term
    /// rather than a paraphrase (default 0.5).
    pub lexical_overlap: f64,
    /// Most context (noise) sentences per task; each task has 0 to this many (default 2).
    pub context_sentences: usize,
}

impl Default for SynthConfig {
    fn default() -> Self {
        Self {
            cards: 1200,
            tasks: 500,
            seed: 1,
            lexical_overlap: 0.5,
            context_sentences: 2,
        }
    }
}

/// An action: phrases for agent cards, and paraphrases for tasks. `{o}` is the object.
struct Action {
    agent: &'static [&'static str],
    task: &'static [&'static str],
}

/// An object: names used by agent cards, and paraphrases used by tasks.
struct Object {
    agent: &'static [&'static str],
    task: &'static [&'static str],
}

/// A domain: its actions, objects and qualifiers (`{q}` in the qualifier phrases).
struct Domain {
    actions: &'static [Action],
    objects: &'static [Object],
    qualifiers: &'static [&'static str],
    agent_qualifier: &'static [&'static str],
    task_qualifier: &'static [&'static str],
}

macro_rules! act {
    ([$($a:expr),*], [$($t:expr),*]) => { Action { agent: &[$($a),*], task: &[$($t),*] } };
}
macro_rules! obj {
    ([$($a:expr),*], [$($t:expr),*]) => { Object { agent: &[$($a),*], task: &[$($t),*] } };
}

const DOMAINS: &[Domain] = &[
    // Documents.
    Domain {
        actions: &[
            act!(
                ["fact-checks {o}", "verifies the claims made in {o}"],
                [
                    "make sure every statement in the {o} is accurate",
                    "double-check the facts in the {o}"
                ]
            ),
            act!(
                ["formats and typesets {o}", "lays out {o} for print"],
                [
                    "make the {o} look professional on the page",
                    "fix the layout of the {o} before printing"
                ]
            ),
            act!(
                ["drafts {o}", "writes {o} from scratch"],
                ["compose the {o}", "put together fresh {o}"]
            ),
            act!(
                ["proofreads {o}", "edits {o} for grammar and style"],
                [
                    "polish the wording of the {o} and fix typos",
                    "check the {o} for spelling slips"
                ]
            ),
            act!(
                ["translates {o} into other languages", "localizes {o}"],
                [
                    "render the {o} in another tongue",
                    "convert the {o} so foreign readers understand them"
                ]
            ),
            act!(
                ["summarizes {o}", "condenses {o} into short briefs"],
                [
                    "boil the {o} down to a one-page digest",
                    "give us the key points of the {o}"
                ]
            ),
            act!(
                [
                    "checks {o} for regulatory compliance",
                    "audits {o} against legal requirements"
                ],
                [
                    "make sure the {o} follow the rules and laws",
                    "confirm the {o} would pass a regulator's inspection"
                ]
            ),
            act!(
                [
                    "extracts structured data from {o}",
                    "parses {o} into tables"
                ],
                [
                    "pull the figures and names out of the {o} into a spreadsheet",
                    "turn the {o} into machine-readable records"
                ]
            ),
        ],
        objects: &[
            obj!(
                ["employment contracts", "job offer letters"],
                ["hiring paperwork", "offers we send to new staff"]
            ),
            obj!(
                ["marketing copy", "ad copy"],
                ["promotional text", "slogans and blurbs for our ads"]
            ),
            obj!(
                ["annual reports"],
                ["yearly shareholder review", "end-of-year company overview"]
            ),
            obj!(
                ["technical specifications", "engineering specs"],
                [
                    "design requirements for the product",
                    "detailed build documents"
                ]
            ),
            obj!(
                ["legal contracts", "commercial contracts"],
                ["agreements", "binding deals signed with partners"]
            ),
            obj!(
                ["invoices"],
                ["bills sent to customers", "billing statements"]
            ),
            obj!(
                ["research papers", "scientific articles"],
                ["academic manuscripts", "scholarly publications"]
            ),
            obj!(
                ["patent applications"],
                [
                    "intellectual property filings",
                    "IP claims for our inventions"
                ]
            ),
            obj!(
                ["medical reports", "clinical notes"],
                ["patient records from the hospital", "doctors' write-ups"]
            ),
            obj!(
                ["user manuals", "product documentation"],
                ["instruction booklets", "how-to guides for our device"]
            ),
            obj!(
                ["press releases"],
                ["media announcements", "news statements for journalists"]
            ),
            obj!(
                ["grant proposals"],
                ["funding applications", "requests for research money"]
            ),
            obj!(
                ["insurance claims"],
                [
                    "claim forms for our insurer",
                    "damage reimbursement requests"
                ]
            ),
            obj!(
                ["resumes", "CVs"],
                ["job applicants' career histories", "candidate profiles"]
            ),
            obj!(
                ["tax returns"],
                [
                    "annual filings for the revenue agency",
                    "yearly income declarations"
                ]
            ),
            obj!(
                ["privacy policies"],
                [
                    "data protection notices",
                    "statements about how we handle personal information"
                ]
            ),
        ],
        qualifiers: &[
            "English",
            "German",
            "Japanese",
            "Spanish",
            "French",
            "Portuguese",
            "Korean",
            "Italian",
        ],
        agent_qualifier: &[" written in {q}", " in {q}"],
        task_qualifier: &[" (the originals are in {q})", "; they are {q} texts"],
    },
    // Software.
    Domain {
        actions: &[
            act!(
                ["documents {o}", "writes technical documentation for {o}"],
                [
                    "explain how our {o} works in a written guide",
                    "produce reference docs for the {o}"
                ]
            ),
            act!(
                ["migrates {o} to new platforms", "ports {o}"],
                [
                    "move our {o} off the old stack",
                    "rewrite the {o} for a newer platform"
                ]
            ),
            act!(
                ["builds {o}", "develops {o}"],
                [
                    "create a new {o} for us",
                    "get a {o} up and running from nothing"
                ]
            ),
            act!(
                ["debugs {o}", "fixes bugs in {o}"],
                [
                    "track down why our {o} keeps crashing",
                    "repair the broken behaviour of our {o}"
                ]
            ),
            act!(
                ["writes automated tests for {o}", "does QA testing of {o}"],
                [
                    "make sure every part of the {o} is verified by a suite of checks",
                    "catch regressions in the {o} before release"
                ]
            ),
            act!(
                [
                    "optimizes the performance of {o}",
                    "profiles and speeds up {o}"
                ],
                [
                    "make our {o} run faster and use less memory",
                    "cut the latency of the {o}"
                ]
            ),
            act!(
                [
                    "performs security audits of {o}",
                    "finds vulnerabilities in {o}"
                ],
                [
                    "look for ways attackers could break into our {o}",
                    "harden the {o} against hacking"
                ]
            ),
            act!(
                [
                    "deploys {o} to the cloud",
                    "sets up hosting and releases for {o}"
                ],
                [
                    "ship the {o} to production servers",
                    "put the {o} live on AWS"
                ]
            ),
        ],
        objects: &[
            obj!(
                ["desktop applications"],
                ["Windows program", "software installed on office PCs"]
            ),
            obj!(
                ["payment systems", "checkout flows"],
                ["card billing code", "the part of our shop that takes money"]
            ),
            obj!(
                ["search engines", "search backends"],
                [
                    "site-wide lookup feature",
                    "the box where users find products"
                ]
            ),
            obj!(
                ["authentication services", "login systems"],
                ["sign-in and password handling", "single sign-on"]
            ),
            obj!(
                ["web applications", "websites"],
                ["browser-based portal", "online storefront"]
            ),
            obj!(
                ["mobile apps", "smartphone applications"],
                ["phone app", "iPhone and Android client"]
            ),
            obj!(
                ["REST APIs", "web services"],
                [
                    "HTTP backend endpoints",
                    "server interface other programs call"
                ]
            ),
            obj!(
                ["databases", "SQL schemas"],
                ["data store", "tables where our records live"]
            ),
            obj!(
                ["data pipelines", "ETL jobs"],
                [
                    "nightly import process",
                    "batch jobs that move records between systems"
                ]
            ),
            obj!(
                ["browser extensions"],
                ["Chrome add-on", "plugin for Firefox"]
            ),
            obj!(
                ["video games", "game engines"],
                ["multiplayer title", "interactive entertainment software"]
            ),
            obj!(
                ["smart contracts", "blockchain programs"],
                ["on-chain token logic", "Ethereum code"]
            ),
            obj!(
                ["command-line tools"],
                ["terminal utility", "shell program"]
            ),
            obj!(
                ["embedded firmware", "microcontroller code"],
                [
                    "software on our IoT sensor boards",
                    "device code for the thermostat"
                ]
            ),
            obj!(
                ["chatbots", "conversational assistants"],
                ["customer service bot", "automated helpdesk agent"]
            ),
            obj!(
                ["machine learning services"],
                [
                    "prediction service built on neural networks",
                    "AI model behind our recommendations"
                ]
            ),
        ],
        qualifiers: &[
            "Python",
            "Rust",
            "Go",
            "Java",
            "TypeScript",
            "Kotlin",
            "C++",
            "Swift",
        ],
        agent_qualifier: &[" in {q}", " using {q}"],
        task_qualifier: &[" (our stack is {q})", "; the codebase is {q}"],
    },
    // Data analysis.
    Domain {
        actions: &[
            act!(
                ["builds dashboards for {o}", "creates live reports on {o}"],
                [
                    "give managers a screen where they can watch the {o}",
                    "set up a live view of the {o}"
                ]
            ),
            act!(
                [
                    "models and explains drivers of {o}",
                    "runs regression analysis on {o}"
                ],
                [
                    "find out what causes changes in the {o}",
                    "explain which factors move the {o}"
                ]
            ),
            act!(
                ["cleans {o}", "deduplicates and validates {o}"],
                [
                    "fix the messy, inconsistent {o}",
                    "remove duplicate and broken entries from the {o}"
                ]
            ),
            act!(
                ["visualizes {o} with charts", "plots {o}"],
                [
                    "draw graphs showing the {o}",
                    "produce diagrams that make the {o} easy to grasp"
                ]
            ),
            act!(
                ["forecasts {o}", "predicts future {o}"],
                [
                    "estimate next quarter's {o}",
                    "project where the {o} will be in the coming months"
                ]
            ),
            act!(
                ["detects anomalies in {o}", "flags outliers in {o}"],
                [
                    "spot unusual spikes in the {o}",
                    "warn us when the {o} look suspicious"
                ]
            ),
            act!(
                ["clusters {o} into segments", "segments {o}"],
                [
                    "group the {o} into similar categories",
                    "find natural groupings within the {o}"
                ]
            ),
            act!(
                [
                    "runs statistical tests on {o}",
                    "performs significance analysis of {o}"
                ],
                [
                    "tell us whether differences in the {o} are real or chance",
                    "measure how confident we can be about trends in the {o}"
                ]
            ),
        ],
        objects: &[
            obj!(
                ["hospital admissions"],
                ["patients arriving at the wards", "bed occupancy"]
            ),
            obj!(
                ["traffic counts", "transport ridership"],
                ["passengers on our buses", "cars passing the junctions"]
            ),
            obj!(
                ["employee engagement surveys"],
                ["staff satisfaction scores", "how happy our workers are"]
            ),
            obj!(
                ["crop yields", "agricultural data"],
                ["harvest per field", "farm output"]
            ),
            obj!(
                ["sales figures", "revenue data"],
                ["how much we sold", "turnover numbers"]
            ),
            obj!(
                ["sensor readings", "IoT telemetry"],
                ["measurements from our machines", "device signals"]
            ),
            obj!(
                ["website traffic", "web analytics"],
                ["visitor counts on our site", "page views"]
            ),
            obj!(
                ["customer churn data"],
                ["subscribers who cancel", "client attrition"]
            ),
            obj!(
                ["survey responses"],
                ["questionnaire answers", "poll results"]
            ),
            obj!(
                ["clinical trial results"],
                ["drug study outcomes", "patient study measurements"]
            ),
            obj!(
                ["stock prices", "market data"],
                ["share price history", "equity quotes"]
            ),
            obj!(
                ["energy consumption data"],
                ["electricity usage", "power bills per building"]
            ),
            obj!(
                ["supply chain records", "logistics data"],
                ["shipment and warehouse logs", "delivery histories"]
            ),
            obj!(
                ["social media posts"],
                ["tweets and comments about our brand", "online mentions"]
            ),
            obj!(
                ["weather records"],
                ["temperature and rainfall history", "climate observations"]
            ),
        ],
        qualifiers: &[
            "Excel",
            "PostgreSQL",
            "CSV files",
            "BigQuery",
            "MongoDB",
            "Parquet files",
        ],
        agent_qualifier: &[" stored in {q}", " from {q}"],
        task_qualifier: &[" (the data sits in {q})", "; everything is kept in {q}"],
    },
    // Media.
    Domain {
        actions: &[
            act!(
                ["writes scripts for {o}", "storyboards {o}"],
                [
                    "plan the story and dialogue of the {o}",
                    "prepare the outline before the {o} are produced"
                ]
            ),
            act!(
                ["localizes {o} for foreign markets", "dubs {o}"],
                [
                    "adapt the {o} for audiences abroad",
                    "make foreign-language versions of the {o}"
                ]
            ),
            act!(
                ["designs {o}", "creates original {o}"],
                ["come up with brand-new {o}", "make eye-catching {o}"]
            ),
            act!(
                ["edits {o}", "cuts and retouches {o}"],
                ["trim and polish our raw {o}", "tidy up the rough {o}"]
            ),
            act!(
                ["adds subtitles and captions to {o}", "transcribes {o}"],
                [
                    "put on-screen text and written transcripts on the {o}",
                    "make the {o} accessible to deaf viewers"
                ]
            ),
            act!(
                [
                    "enhances the audio of {o}",
                    "mixes and masters sound for {o}"
                ],
                [
                    "remove background noise from the {o}",
                    "make the {o} sound clear and balanced"
                ]
            ),
            act!(
                [
                    "converts and compresses {o}",
                    "transcodes {o} between formats"
                ],
                [
                    "shrink the file size of the {o}",
                    "change the {o} to a format that loads quickly"
                ]
            ),
            act!(
                ["reviews {o} and gives creative feedback", "critiques {o}"],
                [
                    "give an honest opinion on the quality of the {o}",
                    "suggest improvements to the {o}"
                ]
            ),
        ],
        objects: &[
            obj!(
                ["short-form clips", "reels"],
                ["snappy vertical videos", "fifteen-second teasers"]
            ),
            obj!(
                ["audiobooks"],
                ["narrated novels", "spoken versions of our books"]
            ),
            obj!(
                ["product packaging"],
                [
                    "boxes and labels for our goods",
                    "wrapping of the items we sell"
                ]
            ),
            obj!(
                ["online courses", "training videos"],
                ["e-learning lessons", "tutorial series for students"]
            ),
            obj!(
                ["product photos", "product photography"],
                ["pictures of the items we sell", "catalog images"]
            ),
            obj!(
                ["marketing videos", "promotional videos"],
                ["advertising clips", "commercial footage"]
            ),
            obj!(
                ["podcast episodes"],
                ["audio shows", "weekly talk recordings"]
            ),
            obj!(
                ["logos", "brand identities"],
                ["company emblem", "visual trademark"]
            ),
            obj!(
                ["explainer animations", "motion graphics"],
                [
                    "animated clips that explain our product",
                    "cartoon walkthroughs"
                ]
            ),
            obj!(["music tracks", "jingles"], ["songs", "background score"]),
            obj!(
                ["infographics"],
                ["illustrated fact sheets", "visual summaries of statistics"]
            ),
            obj!(
                ["slide decks", "presentations"],
                ["pitch slides", "keynote deck"]
            ),
            obj!(
                ["webinar recordings"],
                ["recorded online seminars", "livestream archives"]
            ),
            obj!(
                ["book illustrations"],
                ["drawings for a children's storybook", "artwork for a novel"]
            ),
        ],
        qualifiers: &[
            "YouTube",
            "Instagram",
            "TikTok",
            "Spotify",
            "LinkedIn",
            "Twitch",
        ],
        agent_qualifier: &[" for {q}", " aimed at {q}"],
        task_qualifier: &[" to publish on {q}", " (our audience is on {q})"],
    },
    // Operations.
    Domain {
        actions: &[
            act!(
                ["writes policies for {o}", "documents procedures for {o}"],
                [
                    "put the rules for the {o} on paper",
                    "write down how the {o} should be handled"
                ]
            ),
            act!(
                ["assesses risks of {o}", "runs risk assessments on {o}"],
                [
                    "tell us what could go wrong with the {o}",
                    "list the dangers in the {o}"
                ]
            ),
            act!(
                ["plans {o}", "organizes {o}"],
                ["arrange the {o}", "work out the details of the {o}"]
            ),
            act!(
                ["negotiates {o}", "handles negotiations on {o}"],
                [
                    "bargain for better terms on the {o}",
                    "haggle with counterparts over the {o}"
                ]
            ),
            act!(
                ["tracks {o}", "monitors {o}"],
                [
                    "keep an eye on the {o} day by day",
                    "follow the status of the {o}"
                ]
            ),
            act!(
                ["estimates costs of {o}", "budgets {o}"],
                ["figure out how much the {o} will cost", "price out the {o}"]
            ),
            act!(
                ["researches {o}", "does market research on {o}"],
                [
                    "investigate options for the {o}",
                    "study what competitors do regarding {o}"
                ]
            ),
            act!(
                ["automates {o}", "builds workflows that automate {o}"],
                [
                    "take the manual effort out of the {o}",
                    "let software handle the {o} without human clicks"
                ]
            ),
        ],
        objects: &[
            obj!(
                ["warehouse operations"],
                [
                    "picking and packing at the depot",
                    "the distribution center"
                ]
            ),
            obj!(
                ["fleet management", "company vehicles"],
                ["our delivery vans", "the trucks we own"]
            ),
            obj!(
                ["trade show participation", "exhibition booths"],
                ["our stand at the industry fair", "expo presence"]
            ),
            obj!(
                ["IT asset management", "hardware procurement"],
                [
                    "laptops and phones for staff",
                    "buying computers for the office"
                ]
            ),
            obj!(
                ["business travel", "travel itineraries"],
                ["trips for our staff", "flights and hotels for the team"]
            ),
            obj!(
                ["corporate events", "conferences"],
                ["company offsite", "summit for our partners"]
            ),
            obj!(
                ["recruiting", "hiring pipelines"],
                ["finding new employees", "staffing open positions"]
            ),
            obj!(
                ["customer support tickets"],
                ["complaints from clients", "helpdesk requests"]
            ),
            obj!(
                ["marketing campaigns", "ad campaigns"],
                ["promotional push", "advertising drive"]
            ),
            obj!(
                ["inventory", "stock levels"],
                ["goods in our warehouse", "products on shelves"]
            ),
            obj!(
                ["shipping routes", "freight logistics"],
                ["how parcels reach customers", "cargo transport"]
            ),
            obj!(
                ["supplier relationships", "vendor contracts"],
                [
                    "deals with the companies that supply us",
                    "procurement partners"
                ]
            ),
            obj!(
                ["employee onboarding"],
                ["first weeks of new hires", "welcoming recruits"]
            ),
            obj!(
                ["office relocations", "facility management"],
                ["moving to a new workplace", "our building's upkeep"]
            ),
        ],
        qualifiers: &[
            "Europe",
            "Southeast Asia",
            "North America",
            "Latin America",
            "the Middle East",
            "East Africa",
        ],
        agent_qualifier: &[" in {q}", " across {q}"],
        task_qualifier: &[" (we operate in {q})", " for our {q} branch"],
    },
];

const AGENT_TYPES: &[&str] = &[
    "tool agent",
    "autonomous agent",
    "human proxy",
    "assistant agent",
];

const CARD_OPENERS: &[&str] = &[
    "{name} ",
    "This agent ",
    "A specialist that ",
    "Service that ",
];

/// Second card sentence: a neighbouring object of the same domain the agent has touched.
/// It gives cards overlapping vocabulary (distractors) without claiming a second speciality.
const SECONDARY: &[&str] = &[
    "Has also worked with {o}.",
    "Past projects include some {o}.",
    "Familiar with {o} as well.",
];

/// Generic sentences shared by many cards: vocabulary that matches every task a little.
const FILLERS: &[&str] = &[
    "Fast turnaround and clear progress updates.",
    "Runs on a local node; no data leaves your network.",
    "Available around the clock for teams of any size.",
    "Reports results in plain language.",
    "Works well in teams with other agents.",
    "Pricing per task; small jobs are free.",
    "Backed by years of experience with demanding clients.",
    "Delivers quality work on tight deadlines.",
    "Integrates with common project tools.",
];

/// Context sentences of a task: no requirement, but words that match many cards a little
/// (data, team, report, customers, quality...). Each is a query of its own to a retriever
/// that splits tasks into sentences, so they are real noise.
const CONTEXT: &[&str] = &[
    "We are a small company of about twenty people.",
    "Our team has a deadline next week.",
    "A client asked us for the following.",
    "We are preparing a product launch.",
    "Management wants this done before the quarter ends.",
    "The budget is limited, so please keep it lean.",
    "Quality matters more than speed for this one.",
    "The results will be shown to our board of directors.",
    "We tried to do this ourselves last year and it went badly.",
    "Most of our customers are in retail and hospitality.",
    "Please keep us posted on progress every few days.",
    "Our data team is busy with other projects.",
    "This is part of a larger report for investors.",
];

const LEADS: &[&str] = &[
    "We need someone to ",
    "Please ",
    "We would like an agent to ",
    "We are looking for help to ",
    "Someone has to ",
    "We also want to ",
];

const SYLLABLES: &[&str] = &[
    "va", "ren", "to", "qui", "lo", "mar", "zen", "ka", "bri", "so", "nel", "dar", "fi", "po",
    "lux", "tri", "ven", "o", "sel", "gan", "mi", "ro", "tes", "ul", "cor", "ba", "ny", "ix",
    "dum", "hal",
];
const NAME_SUFFIXES: &[&str] = &["", "", " AI", "-bot", " Pro", " Agent", " Labs"];

/// The identity of one speciality (indices into [`DOMAINS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Skill {
    domain: usize,
    action: usize,
    object: usize,
    qualifier: usize,
}

impl Skill {
    fn pair(self) -> (usize, usize, usize) {
        (self.domain, self.action, self.object)
    }
}

/// Number of distinct specialities, the maximum number of cards.
pub fn max_cards() -> usize {
    DOMAINS
        .iter()
        .map(|d| d.actions.len() * d.objects.len() * d.qualifiers.len())
        .sum()
}

/// Number of distinct (action, object) pairs; agents sharing one are told apart only by
/// their qualifier, which the task always names.
pub fn speciality_pairs() -> usize {
    DOMAINS
        .iter()
        .map(|d| d.actions.len() * d.objects.len())
        .sum()
}

fn pick<'a, R: Rng>(rng: &mut R, items: &'a [&'a str]) -> &'a str {
    items[rng.gen_range(0..items.len())]
}

fn fill(template: &str, o: &str) -> String {
    template.replace("{o}", o)
}

/// Third person to base form of an English verb ("translates" -> "translate", "fixes" ->
/// "fix", "researches" -> "research", "does" -> "do"): what a client writes when they ask
/// for the thing an agent card advertises.
fn base_form(verb: &str) -> String {
    match verb {
        "does" => return "do".into(),
        "has" => return "have".into(),
        _ => {}
    }
    for suffix in ["sses", "shes", "ches", "xes"] {
        if verb.ends_with(suffix) {
            return verb[..verb.len() - 2].to_string();
        }
    }
    if let Some(stem) = verb.strip_suffix("ies") {
        return format!("{stem}y");
    }
    verb.strip_suffix('s').unwrap_or(verb).to_string()
}

/// An agent-card action phrase turned into a request: the first verb takes its base form,
/// and so does a verb joined to it or to its object by "and" ("deduplicates and validates
/// {o}" -> "deduplicate and validate {o}", "reviews {o} and gives" -> "review {o} and
/// give"), but not a noun in a list ("adds subtitles and captions").
fn imperative(phrase: &str) -> String {
    let words: Vec<&str> = phrase.split(' ').collect();
    let mut out: Vec<String> = Vec::with_capacity(words.len());
    for (i, word) in words.iter().enumerate() {
        let verb = i == 0 || (i >= 2 && words[i - 1] == "and" && (i == 2 || words[i - 2] == "{o}"));
        out.push(if verb && *word != "{o}" {
            base_form(word)
        } else {
            word.to_string()
        });
    }
    out.join(" ")
}

fn agent_name<R: Rng>(rng: &mut R, taken: &mut HashSet<String>) -> String {
    loop {
        let n = rng.gen_range(2..=3);
        let mut base: String = (0..n).map(|_| pick(rng, SYLLABLES)).collect();
        if let Some(first) = base.get(..1) {
            base = first.to_uppercase() + &base[1..];
        }
        let name = format!("{base}{}", pick(rng, NAME_SUFFIXES));
        if taken.insert(name.clone()) {
            return name;
        }
    }
}

fn card<R: Rng>(rng: &mut R, skill: Skill, name: String) -> AgentRecord {
    let d = &DOMAINS[skill.domain];
    let action = pick(rng, d.actions[skill.action].agent);
    let object = pick(rng, d.objects[skill.object].agent);
    let qualifier = pick(rng, d.agent_qualifier).replace("{q}", d.qualifiers[skill.qualifier]);
    let opener = pick(rng, CARD_OPENERS).replace("{name}", &name);
    let mut description = format!("{opener}{}{qualifier}.", fill(action, object));
    if rng.gen_bool(0.7) {
        let other = (skill.object + rng.gen_range(1..d.objects.len())) % d.objects.len();
        let o2 = pick(rng, d.objects[other].agent);
        description.push(' ');
        description.push_str(&fill(pick(rng, SECONDARY), o2));
    }
    if rng.gen_bool(0.5) {
        description.push(' ');
        description.push_str(pick(rng, FILLERS));
    }
    AgentRecord {
        agent_name: name,
        agent_type: pick(rng, AGENT_TYPES).to_string(),
        agent_description: description,
    }
}

/// One requirement sentence. The action and the object are each, independently, said with
/// the cards' own key terms (probability `lexical`) or with a paraphrase; the qualifier is
/// always named, since a client asking for a German translation says "German".
fn requirement<R: Rng>(rng: &mut R, skill: Skill, lexical: f64) -> String {
    let d = &DOMAINS[skill.domain];
    let object = if rng.gen_bool(lexical) {
        pick(rng, d.objects[skill.object].agent)
    } else {
        pick(rng, d.objects[skill.object].task)
    };
    let action = if rng.gen_bool(lexical) {
        imperative(pick(rng, d.actions[skill.action].agent))
    } else {
        pick(rng, d.actions[skill.action].task).to_string()
    };
    let templates = if rng.gen_bool(0.5) {
        d.agent_qualifier
    } else {
        d.task_qualifier
    };
    let qualifier = pick(rng, templates).replace("{q}", d.qualifiers[skill.qualifier]);
    format!("{}{}{qualifier}.", pick(rng, LEADS), fill(&action, object))
}

fn task_description<R: Rng>(rng: &mut R, skills: &[Skill], config: &SynthConfig) -> String {
    let mut sentences: Vec<String> = skills
        .iter()
        .map(|&s| requirement(rng, s, config.lexical_overlap))
        .collect();
    sentences.shuffle(rng);
    let context = rng.gen_range(0..=config.context_sentences);
    let mut pool: Vec<&str> = CONTEXT.to_vec();
    pool.shuffle(rng);
    for (i, c) in pool.into_iter().take(context).enumerate() {
        // The first context sentence opens the task; the others fall anywhere.
        let at = if i == 0 {
            0
        } else {
            rng.gen_range(0..=sentences.len())
        };
        sentences.insert(at, c.to_string());
    }
    sentences.join(" ")
}

/// Generates a benchmark: `config.tasks` tasks whose gold teams together cover all
/// `config.cards` agents. The same config always gives the same records.
pub fn generate(config: SynthConfig) -> Result<Vec<TaskRecord>, SynthError> {
    let SynthConfig {
        cards, tasks, seed, ..
    } = config;
    let max = max_cards();
    if cards > max {
        return Err(SynthError::TooManyCards { asked: cards, max });
    }
    if cards < 4 || cards > 4 * tasks {
        return Err(SynthError::Infeasible { cards, tasks });
    }
    if !(0.0..=1.0).contains(&config.lexical_overlap) {
        return Err(SynthError::BadOverlap(config.lexical_overlap));
    }
    let mut rng = StdRng::seed_from_u64(seed);

    // Specialities: the (action, object) pairs are dealt out round-robin in a random order,
    // so they are shared as evenly as possible; agents on one pair get distinct qualifiers.
    let mut pairs: Vec<(usize, usize, usize)> = Vec::new();
    for (domain, d) in DOMAINS.iter().enumerate() {
        for action in 0..d.actions.len() {
            for object in 0..d.objects.len() {
                pairs.push((domain, action, object));
            }
        }
    }
    pairs.shuffle(&mut rng);
    let mut qualifier_orders: Vec<Vec<usize>> = pairs
        .iter()
        .map(|&(domain, _, _)| {
            let mut q: Vec<usize> = (0..DOMAINS[domain].qualifiers.len()).collect();
            q.shuffle(&mut rng);
            q
        })
        .collect();
    let mut skills = Vec::with_capacity(cards);
    let mut round = 0;
    while skills.len() < cards {
        for (p, &(domain, action, object)) in pairs.iter().enumerate() {
            if skills.len() == cards {
                break;
            }
            if let Some(&qualifier) = qualifier_orders[p].get(round) {
                skills.push(Skill {
                    domain,
                    action,
                    object,
                    qualifier,
                });
            }
        }
        round += 1;
    }
    qualifier_orders.clear();
    let mut taken = HashSet::new();
    let agents: Vec<AgentRecord> = skills
        .iter()
        .map(|&s| {
            let name = agent_name(&mut rng, &mut taken);
            card(&mut rng, s, name)
        })
        .collect();

    // Team sizes in 2..=4, raised until every card can have a task.
    let mut sizes: Vec<usize> = (0..tasks).map(|_| rng.gen_range(2..=4)).collect();
    let mut total: usize = sizes.iter().sum();
    while total < cards {
        let i = rng.gen_range(0..tasks);
        if sizes[i] < 4 {
            sizes[i] += 1;
            total += 1;
        }
    }

    // Fill teams: unassigned agents first while they would otherwise run out of slots, and
    // otherwise a related agent (same domain) half of the time, for coherent tasks. A team
    // never holds two agents of the same (action, object) pair when it can be avoided.
    let mut unassigned: Vec<usize> = (0..cards).collect();
    unassigned.shuffle(&mut rng);
    let mut assigned: Vec<usize> = Vec::with_capacity(cards);
    let mut slots_left = total;
    let mut records = Vec::with_capacity(tasks);
    for (t, &size) in sizes.iter().enumerate() {
        let mut team: Vec<usize> = Vec::with_capacity(size);
        for _ in 0..size {
            let domain = team.first().map(|&a| skills[a].domain);
            let fits = |a: usize| {
                !team.contains(&a) && team.iter().all(|&m| skills[m].pair() != skills[a].pair())
            };
            let reusable: Vec<usize> = assigned.iter().copied().filter(|&a| fits(a)).collect();
            let take_new = !unassigned.is_empty()
                && (unassigned.len() >= slots_left || reusable.is_empty() || rng.gen_bool(0.5));
            let chosen = if take_new {
                // Prefer a waiting agent of the team's domain half of the time, and one whose
                // pair the team does not have yet.
                let same_domain = domain.filter(|_| rng.gen_bool(0.5));
                let pos = unassigned
                    .iter()
                    .rposition(|&a| fits(a) && same_domain.is_none_or(|d| skills[a].domain == d))
                    .or_else(|| unassigned.iter().rposition(|&a| fits(a)))
                    .unwrap_or(unassigned.len() - 1);
                let a = unassigned.swap_remove(pos);
                assigned.push(a);
                a
            } else {
                let same: Vec<usize> = match domain {
                    Some(d) if rng.gen_bool(0.5) => reusable
                        .iter()
                        .copied()
                        .filter(|&a| skills[a].domain == d)
                        .collect(),
                    _ => Vec::new(),
                };
                let pool = if !same.is_empty() {
                    same
                } else if !reusable.is_empty() {
                    reusable
                } else {
                    // Every card is assigned here (`take_new` is false with no reusable
                    // agent only when none is waiting), and cards >= 4 > team size.
                    assigned
                        .iter()
                        .copied()
                        .filter(|a| !team.contains(a))
                        .collect()
                };
                pool[rng.gen_range(0..pool.len())]
            };
            team.push(chosen);
            slots_left -= 1;
        }
        let team_skills: Vec<Skill> = team.iter().map(|&a| skills[a]).collect();
        records.push(TaskRecord {
            task_id: format!("task-{:05}", t + 1),
            task_description: task_description(&mut rng, &team_skills, &config),
            agents: team.iter().map(|&a| agents[a].clone()).collect(),
        });
    }
    Ok(records)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_benchmark_other_seed_other_benchmark() {
        let config = SynthConfig {
            cards: 300,
            tasks: 120,
            seed: 7,
            ..SynthConfig::default()
        };
        let a = generate(config).unwrap();
        let b = generate(config).unwrap();
        assert_eq!(a, b);
        let c = generate(SynthConfig { seed: 8, ..config }).unwrap();
        assert_ne!(a, c);
    }

    #[test]
    fn every_card_has_a_task_and_teams_are_distinct_agents() {
        let config = SynthConfig {
            cards: 1200,
            tasks: 400,
            seed: 1,
            ..SynthConfig::default()
        };
        let records = generate(config).unwrap();
        assert_eq!(records.len(), 400);
        let mut names = HashSet::new();
        for r in &records {
            assert!((2..=4).contains(&r.agents.len()), "{}", r.agents.len());
            let team: HashSet<&str> = r.agents.iter().map(|a| a.agent_name.as_str()).collect();
            assert_eq!(
                team.len(),
                r.agents.len(),
                "duplicate agent in {}",
                r.task_id
            );
            names.extend(team.into_iter().map(str::to_string));
            assert!(!r.task_description.is_empty());
        }
        assert_eq!(names.len(), 1200);
    }

    #[test]
    fn lexical_overlap_controls_shared_key_terms() {
        let config = SynthConfig {
            cards: 200,
            tasks: 100,
            seed: 3,
            ..SynthConfig::default()
        };
        let objects: Vec<&str> = DOMAINS
            .iter()
            .flat_map(|d| d.objects.iter().flat_map(|o| o.agent.iter().copied()))
            .collect();
        let with_card_terms = |records: &[TaskRecord]| {
            records
                .iter()
                .filter(|r| objects.iter().any(|o| r.task_description.contains(o)))
                .count()
        };
        let none = generate(SynthConfig {
            lexical_overlap: 0.0,
            ..config
        })
        .unwrap();
        assert_eq!(with_card_terms(&none), 0);
        let half = generate(config).unwrap();
        let n = with_card_terms(&half);
        assert!(n > 50 && n < 100, "{n} of 100 tasks");
        assert!(matches!(
            generate(SynthConfig {
                lexical_overlap: 1.5,
                ..config
            }),
            Err(SynthError::BadOverlap(_))
        ));
    }

    #[test]
    fn tasks_name_the_qualifier_of_every_gold_agent_and_cards_are_distinct() {
        let records = generate(SynthConfig::default()).unwrap();
        let qualifiers: Vec<&str> = DOMAINS
            .iter()
            .flat_map(|d| d.qualifiers.iter().copied())
            .collect();
        let mut specialities = HashSet::new();
        for r in &records {
            for a in &r.agents {
                let first = a.agent_description.split(". ").next().unwrap();
                let named: Vec<&str> = qualifiers
                    .iter()
                    .copied()
                    .filter(|q| first.contains(&format!(" {q}")))
                    .collect();
                assert!(!named.is_empty(), "{first}");
                for q in named {
                    assert!(
                        r.task_description.contains(q),
                        "{q}: {}",
                        r.task_description
                    );
                }
            }
        }
        // Agents sharing an (action, object) pair are spread evenly: at 1,200 cards over
        // 600 pairs, exactly two each.
        assert_eq!(speciality_pairs(), 600);
        for r in &records {
            for a in &r.agents {
                specialities.insert(a.agent_name.clone());
            }
        }
        assert_eq!(specialities.len(), 1200);
    }

    #[test]
    fn card_phrases_become_requests() {
        assert_eq!(
            imperative("translates {o} into other languages"),
            "translate {o} into other languages"
        );
        assert_eq!(
            imperative("deduplicates and validates {o}"),
            "deduplicate and validate {o}"
        );
        assert_eq!(imperative("fixes bugs in {o}"), "fix bugs in {o}");
        assert_eq!(imperative("researches {o}"), "research {o}");
        assert_eq!(imperative("does QA testing of {o}"), "do QA testing of {o}");
        assert_eq!(
            imperative("mixes and masters sound for {o}"),
            "mix and master sound for {o}"
        );
        assert_eq!(
            imperative("parses {o} into tables"),
            "parse {o} into tables"
        );
        assert_eq!(
            imperative("reviews {o} and gives feedback"),
            "review {o} and give feedback"
        );
        assert_eq!(
            imperative("adds subtitles and captions to {o}"),
            "add subtitles and captions to {o}"
        );
    }

    #[test]
    fn infeasible_configs_are_refused() {
        assert!(matches!(
            generate(SynthConfig {
                cards: 100,
                tasks: 10,
                seed: 0,
                ..SynthConfig::default()
            }),
            Err(SynthError::Infeasible { .. })
        ));
        assert!(matches!(
            generate(SynthConfig {
                cards: max_cards() + 1,
                tasks: 10_000,
                seed: 0,
                ..SynthConfig::default()
            }),
            Err(SynthError::TooManyCards { .. })
        ));
    }
}
