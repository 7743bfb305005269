//! `docs/configuration.md` cannot drift from the binary: every `--flag` and
//! every `SETTLED_*` variable that `settled --help` (and `settled serve --help`)
//! lists must appear in it.

use std::collections::BTreeSet;
use std::process::Command;

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_settled"))
        .args(args)
        .env_clear()
        .output()
        .expect("run settled");
    assert!(out.status.success(), "settled {args:?} failed: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8 help")
}

/// Words of `text` made of `[A-Za-z0-9_-]`, so `--listen <LISTEN>` gives
/// `--listen` and `[env: SETTLED_LISTEN=]` gives `SETTLED_LISTEN`.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .filter(|w| !w.is_empty())
}

#[test]
fn configuration_doc_names_every_flag_and_variable_of_settled_help() {
    let mut flags = BTreeSet::new();
    let mut variables = BTreeSet::new();
    for args in [&["--help"][..], &["serve", "--help"][..]] {
        let text = help(args);
        for word in words(&text) {
            if word.len() > 2 && word.starts_with("--") {
                flags.insert(word.to_owned());
            } else if word.starts_with("SETTLED_") {
                variables.insert(word.to_owned());
            }
        }
    }
    assert!(
        flags.contains("--listen") && flags.contains("--database-url"),
        "the help was read: {flags:?}"
    );
    assert!(variables.contains("SETTLED_LISTEN"), "{variables:?}");

    let doc_path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let doc = std::fs::read_to_string(doc_path).expect("docs/configuration.md");
    let documented: BTreeSet<&str> = words(&doc).collect();
    let missing: Vec<&String> = flags
        .iter()
        .chain(&variables)
        .filter(|name| !documented.contains(name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md does not mention {missing:?}, which `settled --help` lists; document them"
    );
}
