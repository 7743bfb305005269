//! The source tree keeps the shape docs/architecture.md describes: files a
//! reader can take in (at most 400 lines), the two store backends with the
//! same file for the same operation, and layers that import only downwards
//! (main → server → http → store → domain).

use std::path::{Path, PathBuf};

const MOST_LINES: usize = 400;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn sources(under: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&root().join(under), &mut files);
    files.sort();
    files
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn no_source_file_is_longer_than_a_reader_takes_in() {
    let long: Vec<String> = ["src", "tools"]
        .iter()
        .flat_map(|dir| sources(dir))
        .filter_map(|path| {
            let lines = std::fs::read_to_string(&path)
                .expect("read")
                .lines()
                .count();
            (lines > MOST_LINES).then(|| format!("{} ({lines} lines)", relative(&path)))
        })
        .collect();
    assert!(
        long.is_empty(),
        "over {MOST_LINES} lines; split by what the parts hold: {long:#?}"
    );
}

/// The files of one backend directory, by name.
fn backend_files(backend: &str) -> Vec<String> {
    let dir = root().join("src/store").join(backend);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".rs"))
        .collect();
    names.sort();
    names
}

#[test]
fn both_backends_keep_each_operation_in_a_file_of_the_same_name() {
    // What every store does, one file per job on each backend.
    let operations = [
        "enqueue.rs",
        "claim.rs",
        "outcome.rs",
        "lease.rs",
        "act.rs",
        "read.rs",
        "feed.rs",
        "search.rs",
        "stats.rs",
    ];
    for backend in ["sqlite", "postgres"] {
        let files = backend_files(backend);
        let missing: Vec<&str> = operations
            .iter()
            .copied()
            .filter(|op| !files.iter().any(|f| f == op))
            .collect();
        assert!(
            missing.is_empty(),
            "src/store/{backend}/ has no {missing:?} (it has {files:?})"
        );
    }
}

/// The modules of the crate that `dir`'s sources import (`use crate::x` or
/// `crate::x::` anywhere in the text).
fn imports(dir: &str, of: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for path in sources(dir) {
        let text = std::fs::read_to_string(&path).expect("read");
        for module in of {
            if text.contains(&format!("crate::{module}::"))
                || text.contains(&format!("crate::{module}}}"))
                || text.contains(&format!("crate::{module};"))
                || text.contains(&format!("crate::{{{module}"))
            {
                found.push(format!("{} imports crate::{module}", relative(&path)));
            }
        }
    }
    found
}

#[test]
fn layers_import_only_downwards() {
    let upward = [
        imports("src/domain", &["store", "http", "server", "telemetry"]),
        imports("src/store", &["http", "server"]),
        imports("src/http", &["server"]),
    ]
    .concat();
    assert!(upward.is_empty(), "imports up the layers: {upward:#?}");
}
