//! Schema-driven fuzzing with schemathesis against the real binary, through
//! `tests/fuzz/run-schemathesis.sh`. It needs Python and PyPI (for the pinned
//! schemathesis in `.venv-fuzz`) and takes a few minutes, so it runs only when
//! `SETTLED_FUZZ=1` or `CI` is set.

use std::process::Command;
use std::time::Instant;

#[test]
fn schemathesis_finds_no_server_error_and_no_spec_mismatch() {
    let _turn = crate::turn(module_path!());
    if std::env::var_os("SETTLED_FUZZ").is_none() && std::env::var_os("CI").is_none() {
        eprintln!(
            "SKIPPED: schema fuzzing runs with SETTLED_FUZZ=1 (or CI set): \
             SETTLED_FUZZ=1 cargo test --test schemathesis -- --nocapture, \
             or tests/fuzz/run-schemathesis.sh directly \
             (SETTLED_FUZZ_EXAMPLES=N examples per operation, SETTLED_FUZZ_SEED=N)"
        );
        return;
    }
    let started = Instant::now();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fuzz/run-schemathesis.sh"
    );
    let status = Command::new("bash")
        .arg(script)
        .env("SETTLED_BIN", env!("CARGO_BIN_EXE_settled"))
        .status()
        .expect("run tests/fuzz/run-schemathesis.sh");
    assert!(
        status.success(),
        "schemathesis found failures (see its report above): {status}"
    );
    println!(
        "schemathesis: passed in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
