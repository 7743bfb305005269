//! Database faults on SQLite, against the real binary: (a) another process
//! holds the database's write lock; (b) the disk holding the database is
//! full. Writes answer 503 class `backend` (no internals), reads keep
//! working, nothing is half-written, and the service recovers by itself once
//! the fault is gone.
//!
//! (Making the file read-only with chmod proves nothing here: the tests run
//! as root, which ignores file permissions. The lock is what a second
//! process, a backup tool or an operator's `sqlite3` shell can really do.)

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};

/// The store's SQLite busy timeout: a write waits this long for the lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

use crate::common::process::{Server, start};

/// SIGTERM and expect exit 0.
fn stop(mut server: Server) {
    server.sigterm();
    let status = server.child.wait().expect("wait");
    assert!(status.success(), "exit 0 on SIGTERM, got {status}");
}

struct Http {
    client: reqwest::Client,
    base: String,
}

impl Http {
    fn new(base: &str) -> Self {
        Self {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(40))
                .build()
                .expect("client"),
            base: base.to_owned(),
        }
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        let bytes = response.bytes().await.expect("body");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, body)
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    async fn counts(&self) -> Value {
        let (status, body) = self.get("/v1/status?limit=4096").await;
        assert_eq!(status, 200, "{body}");
        json!({"counts": body["counts"], "samples": body["samples"]})
    }
}

/// A 503 problem of class `backend` that shows no internals.
#[track_caller]
fn unavailable(answer: &(u16, Value), what: &str, secrets: &[&str]) {
    let (status, body) = answer;
    assert_eq!(*status, 503, "{what}: {body}");
    assert_eq!(body["class"], "backend", "{what}: {body}");
    assert_eq!(body["code"], "backend_unavailable", "{what}: {body}");
    let text = body.to_string().to_lowercase();
    for secret in secrets {
        assert!(
            !text.contains(&secret.to_lowercase()),
            "{what}: the answer leaks {secret:?}: {body}"
        );
    }
}

fn sqlite_url(path: &Path) -> String {
    format!("sqlite:{}", path.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_write_lock_gives_503_within_the_busy_timeout_and_the_service_recovers() {
    let _turn = crate::turn(module_path!());
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("settled.db");
    let url = sqlite_url(&db);
    let server = start(dir.path(), &url);
    let http = Http::new(&server.base);
    assert_eq!(
        http.post(
            "/v1/receipts",
            json!({"receipt_id": "r-1", "finalized_at": 1}),
        )
        .await
        .0,
        201
    );
    let (status, claim) = http
        .post(
            "/v1/receipts/r-1/claim",
            json!({"worker_id": "w", "lease_ms": 600_000}),
        )
        .await;
    assert_eq!(status, 200);
    let before = http.counts().await;
    let view_before = http.get("/v1/receipts/r-1").await;

    // Another process takes the write lock and keeps it.
    let options = SqliteConnectOptions::from_str(&url)
        .expect("url")
        .busy_timeout(Duration::ZERO);
    let mut holder = SqliteConnection::connect_with(&options)
        .await
        .expect("second connection");
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut holder)
        .await
        .expect("lock");
    let secrets = [
        db.to_str().expect("path"),
        "locked",
        "sqlite",
        "busy",
        "SELECT",
        "INSERT",
    ];
    let writes: Vec<(&str, Value)> = vec![
        (
            "/v1/receipts",
            json!({"receipt_id": "r-2", "finalized_at": 2}),
        ),
        (
            "/v1/receipts/r-1/outcome",
            json!({"claim": claim, "outcome": {"kind": "accepted", "transcript_id": "tx-1"}}),
        ),
        (
            "/v1/claims",
            json!({"worker_id": "w", "lease_ms": 1000, "limit": 5}),
        ),
    ];
    let mut slowest = Duration::ZERO;
    for (path, body) in &writes {
        let sent = Instant::now();
        let answer = http.post(path, body.clone()).await;
        let took = sent.elapsed();
        unavailable(&answer, path, &secrets);
        assert!(
            took < BUSY_TIMEOUT + Duration::from_secs(3),
            "{path} answered after {took:?}"
        );
        slowest = slowest.max(took);
        // Reads still work while the lock is held (WAL).
        assert_eq!(http.get("/v1/receipts/r-1").await, view_before);
        assert_eq!(http.get("/readyz").await.0, 200);
    }
    assert_eq!(http.counts().await, before, "nothing half-written");
    assert!(
        server.log_text().contains("backend failure"),
        "the failure is logged"
    );

    // The lock goes away; the same requests now succeed.
    sqlx::query("ROLLBACK")
        .execute(&mut holder)
        .await
        .expect("unlock");
    holder.close().await.expect("close");
    let answer = http.post(writes[0].0, writes[0].1.clone()).await;
    assert_eq!(answer.0, 201, "{answer:?}");
    let answer = http.post(writes[1].0, writes[1].1.clone()).await;
    assert_eq!(answer.0, 200, "{answer:?}");
    assert_eq!(answer.1["kind"], "no_action");
    let (status, body) = http.post(writes[2].0, writes[2].1.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(body["claims"].as_array().map(Vec::len), Some(1));
    let (_, view) = http.get("/v1/receipts/r-1").await;
    assert_eq!(view["state"], "settled");
    assert_eq!(view["history"].as_array().map(Vec::len), Some(1), "{view}");
    let after = http.counts().await;
    assert_eq!(after["counts"]["settled"], 1);
    assert_eq!(after["counts"]["leased"], 1);
    stop(server);
    println!(
        "db_faults lock: writes refused with 503 in at most {slowest:.1?}; recovered; {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// A small tmpfs, unmounted (lazily, so it always goes) when dropped.
struct Tmpfs {
    dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Self, String> {
        let parent = tempfile::tempdir().map_err(|e| e.to_string())?;
        let dir = parent.path().join("disk");
        std::fs::create_dir(&dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Self {
            dir,
            _parent: parent,
        })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// Fill the file system holding `path` to the last byte.
fn fill(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).expect("filler");
    let block = vec![0x5au8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match file.write(&block) {
            Ok(0) | Err(_) => break,
            Ok(n) => written += n as u64,
        }
    }
    // Whatever is left in smaller pieces.
    for size in [4096usize, 512, 1] {
        while file.write_all(&block[..size]).is_ok() {
            written += size as u64;
        }
    }
    let _ = file.sync_all();
    written
}

fn big_batch(prefix: &str, n: usize) -> Value {
    let receipts: Vec<Value> = (0..n)
        .map(|i| {
            json!({"receipt_id": format!("{prefix}-{i}"), "finalized_at": 1,
                   "observation": {"pad": format!("{i}{}", "z".repeat(60 * 1024))}})
        })
        .collect();
    json!({ "receipts": receipts })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_gives_503_writes_nothing_and_a_restart_recovers() {
    let _turn = crate::turn(module_path!());
    full_disk(false).await;
}

/// After SQLite reports the disk full inside a write transaction it rolls the
/// transaction back by itself while sqlx still counts it as open; the writer
/// must reopen its connection so that writes work again once there is room,
/// without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_recovers_by_itself_when_disk_space_returns() {
    let _turn = crate::turn(module_path!());
    full_disk(true).await;
}

/// Fill the disk under a running server, check that writes are refused
/// cleanly, free the space, and check recovery: `in_place` on the same
/// process, otherwise after a restart.
async fn full_disk(in_place: bool) {
    let started = Instant::now();
    let disk = match Tmpfs::mount("2m") {
        Ok(disk) => disk,
        Err(reason) => {
            eprintln!("SKIPPED: a full disk needs a small tmpfs: {reason}");
            return;
        }
    };
    let db = disk.dir.join("settled.db");
    let url = sqlite_url(&db);
    let server = start(&disk.dir, &url);
    let http = Http::new(&server.base);
    let (status, _) = http
        .post(
            "/v1/receipts",
            json!({"receipt_id": "before", "finalized_at": 1}),
        )
        .await;
    assert_eq!(status, 201);
    let filler = disk.dir.join("filler");
    let filled = fill(&filler);
    let before = http.counts().await;
    let secrets = [
        db.to_str().expect("path"),
        "disk",
        "full",
        "sqlite",
        "INSERT",
    ];

    // ~900 KiB of receipts cannot fit: refused whole, nothing of it stored.
    let batch = big_batch("big", 15);
    let answer = http.post("/v1/receipts/batch", batch.clone()).await;
    unavailable(&answer, "batch on a full disk", &secrets);
    assert_eq!(http.counts().await, before, "nothing half-written");
    for i in [0, 14] {
        assert_eq!(http.get(&format!("/v1/receipts/big-{i}")).await.0, 404);
    }
    let answer = http
        .post(
            "/v1/receipts",
            json!({"receipt_id": "big-single", "finalized_at": 1,
                   "observation": {"pad": "y".repeat(60 * 1024)}}),
        )
        .await;
    unavailable(&answer, "one large receipt on a full disk", &secrets);
    // A small write may still fit in pages SQLite already owns; either way the
    // answer tells the truth.
    let small = http
        .post(
            "/v1/receipts",
            json!({"receipt_id": "small", "finalized_at": 1}),
        )
        .await;
    let small_exists = http.get("/v1/receipts/small").await.0 == 200;
    match small.0 {
        201 => assert!(small_exists),
        503 => {
            unavailable(&small, "small receipt on a full disk", &secrets);
            assert!(!small_exists);
        }
        other => panic!("small receipt on a full disk: {other} {}", small.1),
    }
    assert_eq!(http.get("/readyz").await.0, 200, "reads still work");
    assert_eq!(http.get("/v1/receipts/before").await.0, 200);

    // Space comes back: the same batch goes through, once.
    std::fs::remove_file(&filler).expect("free space");
    let (server, http) = if in_place {
        (server, http)
    } else {
        stop(server);
        let server = start(&disk.dir, &url);
        let http = Http::new(&server.base);
        assert_eq!(http.counts().await, before, "nothing half-written survived");
        (server, http)
    };
    let (status, body) = http.post("/v1/receipts/batch", batch.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["results"]
            .as_array()
            .expect("results")
            .iter()
            .all(|r| r["status"] == "created"),
        "{body}"
    );
    let after = http.counts().await;
    let expected = 1 + 15 + u64::from(small_exists);
    assert!(
        !server.log_text().contains("transaction depth"),
        "the writer connection was left inside a transaction"
    );
    assert_eq!(after["counts"]["pending"], expected, "{after}");
    stop(server);
    // The data survived on the (small) disk: a restart finds it all.
    let server = start(&disk.dir, &url);
    let http = Http::new(&server.base);
    assert_eq!(http.counts().await["counts"]["pending"], expected);
    stop(server);
    println!(
        "db_faults disk: filled {filled} bytes; writes refused with 503; recovered {}; {:.1} s",
        if in_place {
            "in place"
        } else {
            "after a restart"
        },
        started.elapsed().as_secs_f64()
    );
}
