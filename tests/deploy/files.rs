//! Reading the deployment files: YAML documents as JSON values, the Dockerfile's instructions,
//! a systemd unit's settings, nginx's directives, and what `settled … --help` lists.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

/// A path in the repository.
pub fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A repository file's text.
pub fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Every document of a YAML file, as JSON values.
pub fn yaml_docs(path: &str) -> Vec<Value> {
    let text = read(path);
    yaml_serde::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{path}: {e}")))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The one document of a YAML file.
pub fn yaml(path: &str) -> Value {
    let mut docs = yaml_docs(path);
    assert_eq!(docs.len(), 1, "{path}: one YAML document");
    docs.remove(0)
}

/// `10s`, `1m30s`, or seconds alone (`40`, as systemd and nginx take them).
pub fn duration(text: &str) -> Duration {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Duration::from_secs(secs);
    }
    humantime::parse_duration(text).unwrap_or_else(|e| panic!("duration {text:?}: {e}"))
}

/// The port of `HOST:PORT` (or `[V6]:PORT`).
pub fn port_of(address: &str) -> u16 {
    let (_, port) = address
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{address:?} has no port"));
    port.parse()
        .unwrap_or_else(|_| panic!("{address:?}: bad port"))
}

/// The `--flags` and `SETTLED_*` variables that `settled ARGS --help` lists.
pub fn help(args: &[&str]) -> (BTreeSet<String>, BTreeSet<String>) {
    let out = Command::new(env!("CARGO_BIN_EXE_settled"))
        .args(args)
        .arg("--help")
        .env_clear()
        .output()
        .expect("run settled --help");
    assert!(out.status.success(), "settled {args:?} --help: {out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8 help");
    let mut flags = BTreeSet::new();
    let mut variables = BTreeSet::new();
    for word in text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .filter(|w| !w.is_empty())
    {
        if word.len() > 2 && word.starts_with("--") {
            flags.insert(word.to_owned());
        } else if word.starts_with("SETTLED_") {
            variables.insert(word.to_owned());
        }
    }
    assert!(flags.contains("--help"), "the help was read: {text}");
    (flags, variables)
}

/// The Dockerfile's instructions of its last stage (the image), continuation lines joined:
/// `(INSTRUCTION, rest)`.
pub fn dockerfile() -> Vec<(String, String)> {
    let text = read("Dockerfile");
    let mut joined = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if current.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
        } else {
            current.push_str(line);
            joined.push(std::mem::take(&mut current));
        }
    }
    let last_from = joined
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .expect("a FROM");
    joined[last_from..]
        .iter()
        .map(|l| {
            let (name, rest) = l.split_once(' ').unwrap_or((l, ""));
            (name.to_ascii_uppercase(), rest.trim().to_owned())
        })
        .collect()
}

/// A unit file's settings: `(section, key, value)` in order.
pub fn systemd_unit(path: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut settings = Vec::new();
    for line in read(path).lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
        } else {
            let (key, value) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("{path}: not KEY=VALUE: {line}"));
            settings.push((
                section.clone(),
                key.trim().to_owned(),
                value.trim().to_owned(),
            ));
        }
    }
    settings
}

/// One nginx directive and, for a block, the directives inside it.
#[derive(Debug)]
pub struct Directive {
    pub name: String,
    pub args: Vec<String>,
    pub block: Vec<Directive>,
}

impl Directive {
    /// The directives named `name` directly inside this block.
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Directive> + 'a {
        self.block.iter().filter(move |d| d.name == name)
    }

    /// The one directive `name` directly inside this block, if any.
    pub fn one<'a>(&'a self, name: &'a str) -> Option<&'a Directive> {
        let mut found = self.all(name);
        let first = found.next();
        assert!(
            found.next().is_none(),
            "{name} given twice in {}",
            self.name
        );
        first
    }
}

/// nginx's configuration syntax: words (quoted or not), `;` ending a directive, `{ … }` a
/// block; `#` comments. The file's directives are the block of a root named `main`.
pub fn nginx(path: &str) -> Directive {
    let text = read(path);
    let mut tokens = Vec::new();
    for line in text.lines() {
        let mut chars = line.chars().peekable();
        while let Some(&c) = chars.peek() {
            match c {
                '#' => break,
                c if c.is_whitespace() => {
                    chars.next();
                }
                ';' | '{' | '}' => {
                    tokens.push(c.to_string());
                    chars.next();
                }
                '"' | '\'' => {
                    chars.next();
                    let word: String = chars.by_ref().take_while(|&q| q != c).collect();
                    tokens.push(word);
                }
                _ => {
                    let mut word = String::new();
                    while let Some(&c) = chars.peek() {
                        if c.is_whitespace() || matches!(c, ';' | '{' | '}') {
                            break;
                        }
                        word.push(c);
                        chars.next();
                    }
                    tokens.push(word);
                }
            }
        }
    }
    let mut tokens = tokens.into_iter();
    let block = nginx_block(&mut tokens, path);
    Directive {
        name: "main".to_owned(),
        args: Vec::new(),
        block,
    }
}

fn nginx_block(tokens: &mut impl Iterator<Item = String>, path: &str) -> Vec<Directive> {
    let mut block = Vec::new();
    let mut words: Vec<String> = Vec::new();
    while let Some(token) = tokens.next() {
        match token.as_str() {
            ";" | "{" => {
                assert!(!words.is_empty(), "{path}: `{token}` without a directive");
                let name = words.remove(0);
                let inner = if token == "{" {
                    nginx_block(tokens, path)
                } else {
                    Vec::new()
                };
                block.push(Directive {
                    name,
                    args: std::mem::take(&mut words),
                    block: inner,
                });
            }
            "}" => {
                assert!(words.is_empty(), "{path}: {words:?} not ended by `;`");
                return block;
            }
            _ => words.push(token),
        }
    }
    assert!(words.is_empty(), "{path}: {words:?} not ended by `;`");
    block
}

/// nginx's size syntax: `1m`, `512k`, `1024`.
pub fn nginx_size(text: &str) -> usize {
    let lower = text.to_ascii_lowercase();
    let (digits, unit) = match lower.strip_suffix('m') {
        Some(d) => (d, 1024 * 1024),
        None => match lower.strip_suffix('k') {
            Some(d) => (d, 1024),
            None => (lower.as_str(), 1),
        },
    };
    digits.parse::<usize>().expect("an nginx size") * unit
}
