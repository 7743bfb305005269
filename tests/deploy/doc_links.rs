//! The user documents name only what exists and speak to users.
//!
//! Reads README.md, BENCHMARKS.md, RELIABILITY.md, CHANGELOG.md, SECURITY.md, every
//! `docs/**/*.md` and the client packages' READMEs, and fails listing:
//! - each relative markdown link `[text](path)` (or `[label]: path`) whose file does not exist,
//!   resolved from the document's folder (`#anchors` dropped, `http(s):`/`mailto:` links skipped);
//! - each backticked repository path (`src/…`, `docs/…`, `tests/…`, `bench/…`, `deploy/…`,
//!   `examples/…`, `clients/…`, `migrations/…`, `tools/…`, `assets/…`) that does not exist,
//!   from the repository's root or the document's folder;
//! - each word of the project's own bookkeeping ("issue", "session", "stop" and their forms) in
//!   prose, and any reference to the team's `../shared` folder. Code spans and fenced blocks may
//!   keep identifiers such as `worker.stop()` or `idle_session_timeout`.

use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documents a user reads, as paths from the root.
fn documents() -> Vec<String> {
    let mut docs: Vec<String> = [
        "README.md",
        "BENCHMARKS.md",
        "RELIABILITY.md",
        "CHANGELOG.md",
        "SECURITY.md",
        "clients/python/README.md",
        "clients/typescript/README.md",
        "clients/java/README.md",
    ]
    .iter()
    .filter(|p| root().join(p).is_file())
    .map(|p| p.to_string())
    .collect();
    let mut stack = vec![root().join("docs")];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                let rel = path.strip_prefix(root()).expect("under the root");
                docs.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    docs.sort();
    docs
}

/// A document split into prose and code: fenced blocks and code spans go to `code`, the rest
/// (with a space where code was) to `prose`, line by line so findings can name a line.
struct Parts {
    /// (line number, prose text of that line)
    prose: Vec<(usize, String)>,
    /// (line number, code span content)
    spans: Vec<(usize, String)>,
}

fn split(text: &str) -> Parts {
    let mut prose = Vec::new();
    let mut spans = Vec::new();
    let mut fence: Option<String> = None;
    // A code span may continue onto the next line: (opening run length, content, first line).
    let mut open: Option<(usize, String, usize)> = None;
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let trimmed = line.trim_start();
        if open.is_none() {
            if let Some(marker) = &fence {
                let ch = marker.chars().next().unwrap_or('`');
                let run = trimmed.chars().take_while(|c| *c == ch).count();
                if run >= marker.len() && trimmed.trim_start_matches(ch).trim().is_empty() {
                    fence = None;
                }
                continue;
            }
            if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
                let ch = trimmed.chars().next().unwrap();
                let run: String = trimmed.chars().take_while(|c| *c == ch).collect();
                fence = Some(run);
                continue;
            }
            if line.starts_with("    ")
                && prose
                    .last()
                    .is_none_or(|(_, l): &(usize, String)| l.trim().is_empty())
                && !trimmed.starts_with(['-', '*', '|'])
            {
                // An indented code block after a blank line.
                continue;
            }
        }
        let chars: Vec<char> = line.chars().collect();
        let mut out = String::new();
        let mut i = 0;
        while i < chars.len() {
            if chars[i] == '`' {
                let run = chars[i..].iter().take_while(|c| **c == '`').count();
                if let Some((want, content, first)) = open.as_mut() {
                    if run == *want {
                        spans.push((*first, std::mem::take(content)));
                        open = None;
                        out.push(' ');
                    } else {
                        content.extend(&chars[i..i + run]);
                    }
                    i += run;
                    continue;
                }
                open = Some((run, String::new(), number));
                i += run;
                continue;
            }
            match open.as_mut() {
                Some((_, content, _)) => content.push(chars[i]),
                None => out.push(chars[i]),
            }
            i += 1;
        }
        if let Some((_, content, _)) = open.as_mut() {
            content.push(' ');
        }
        prose.push((number, out));
        // A span left open at a blank line was no span: its text is prose after all.
        if line.trim().is_empty()
            && let Some((_, content, first)) = open.take()
        {
            prose.push((first, content));
        }
    }
    Parts { prose, spans }
}

/// The targets of inline links `](target)` and reference definitions `[label]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or("");
        found.push(target.trim_matches(['<', '>']).to_string());
        rest = &after[end..];
    }
    let trimmed = line.trim_start();
    if trimmed.starts_with('[')
        && let Some(at) = trimmed.find("]: ")
        && let Some(target) = trimmed[at + 3..].split_whitespace().next()
    {
        found.push(target.trim_matches(['<', '>']).to_string());
    }
    found
}

/// The folders a backticked path may start with.
const PREFIXES: &[&str] = &[
    "src/",
    "docs/",
    "tests/",
    "bench/",
    "deploy/",
    "examples/",
    "clients/",
    "migrations/",
    "tools/",
    "assets/",
];

/// The words of the project's own bookkeeping, which a user document does not use in prose.
const TEAM_WORDS: &[&str] = &[
    "issue", "issues", "issued", "issuing", "session", "sessions", "stop", "stops", "stopped",
    "stopping",
];

/// The tokens of a code span that look like repository paths.
fn span_paths(span: &str) -> Vec<String> {
    span.split_whitespace()
        .map(|t| t.trim_matches(|c: char| matches!(c, '(' | ')' | ',' | ';' | '"' | '\'')))
        .filter(|t| PREFIXES.iter().any(|p| t.starts_with(p)))
        .filter(|t| {
            t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-/:".contains(c))
        })
        .map(|t| {
            // `src/x.rs:120` names a line of the file.
            let t = match t.split_once(':') {
                Some((path, line)) if line.chars().all(|c| c.is_ascii_digit() || c == '-') => path,
                _ => t,
            };
            t.trim_end_matches(['.', ':']).to_string()
        })
        .filter(|t| !t.contains(':'))
        .collect()
}

/// Paths a build or the user makes (git ignores them): a Maven or Cargo `target/`, a virtual
/// environment, the generated test clients, compose's `.env`.
fn made_later(path: &str) -> bool {
    path.contains("/target/")
        || path.contains("/.venv/")
        || path.starts_with("tests/clients/generated")
        || path == "deploy/.env"
}

fn exists(doc_dir: &Path, path: &str) -> bool {
    root().join(path).exists() || doc_dir.join(path).exists()
}

struct Findings {
    missing: Vec<String>,
    words: Vec<String>,
    cited_code: Vec<String>,
}

fn check() -> Findings {
    let mut findings = Findings {
        missing: Vec::new(),
        words: Vec::new(),
        cited_code: Vec::new(),
    };
    for doc in documents() {
        let text = std::fs::read_to_string(root().join(&doc)).expect("a readable document");
        let doc_dir = root().join(&doc).parent().expect("a folder").to_path_buf();
        let parts = split(&text);
        for (line, prose) in &parts.prose {
            for target in link_targets(prose) {
                if target.is_empty()
                    || target.starts_with('#')
                    || target.starts_with("http://")
                    || target.starts_with("https://")
                    || target.starts_with("mailto:")
                {
                    continue;
                }
                let path = target.split('#').next().unwrap_or("");
                if !doc_dir.join(path).exists() {
                    findings
                        .missing
                        .push(format!("{doc}:{line}: link ({target})"));
                }
            }
            // Words, outside link targets.
            let mut words_text = prose.clone();
            for target in link_targets(prose) {
                words_text = words_text.replace(&format!("]({target}"), "](");
            }
            let lower = words_text.to_lowercase();
            for word in lower.split(|c: char| !c.is_ascii_alphanumeric()) {
                if TEAM_WORDS.contains(&word) {
                    findings
                        .words
                        .push(format!("{doc}:{line}: {word:?} in {:?}", prose.trim()));
                }
            }
            if lower.contains("../shared") || lower.contains("/work/shared") {
                findings
                    .words
                    .push(format!("{doc}:{line}: the team's shared folder"));
            }
        }
        for (line, span) in &parts.spans {
            if span.contains("../shared") || span.contains("/work/shared") {
                findings.words.push(format!(
                    "{doc}:{line}: the team's shared folder in `{span}`"
                ));
            }
            for path in span_paths(span) {
                if path.contains('*') || made_later(&path) {
                    continue;
                }
                if path.starts_with("src/") || path.starts_with("tools/") {
                    findings.cited_code.push(format!("{doc}:{line}: {path}"));
                }
                if !exists(&doc_dir, &path) {
                    findings.missing.push(format!("{doc}:{line}: `{path}`"));
                }
            }
        }
    }
    findings
}

#[test]
fn doc_links_every_named_path_exists() {
    let findings = check();
    eprintln!(
        "source paths cited by the documents ({}):",
        findings.cited_code.len()
    );
    for cited in &findings.cited_code {
        eprintln!("  {cited}");
    }
    assert!(
        findings.missing.is_empty(),
        "{} paths named in documents do not exist:\n{}",
        findings.missing.len(),
        findings.missing.join("\n")
    );
}

#[test]
fn doc_links_prose_speaks_to_users() {
    let findings = check();
    assert!(
        findings.words.is_empty(),
        "{} places use the project's own bookkeeping words in prose:\n{}",
        findings.words.len(),
        findings.words.join("\n")
    );
}

#[test]
fn doc_links_parser_keeps_code_apart() {
    let parts =
        split("Call `worker.stop()` and\nsee [x](docs/a.md#b).\n\n```sh\nstop\n```\nend `a\nb` c");
    let prose: Vec<&str> = parts.prose.iter().map(|(_, l)| l.as_str()).collect();
    assert!(!prose.iter().any(|l| l.contains("stop")), "{prose:?}");
    assert_eq!(link_targets(prose[1]), vec!["docs/a.md#b".to_string()]);
    let spans: Vec<&str> = parts.spans.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(spans, vec!["worker.stop()", "a b"]);
    assert_eq!(
        span_paths("bash bench/x.sh --y src/a.rs:12 docs/"),
        vec!["bench/x.sh", "src/a.rs", "docs/"]
    );
}
