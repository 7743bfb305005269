//! The forms of `--database-url` that name several hosts, on the shared
//! server: a first host that refuses connections is passed over for the
//! next. A parameter settled would not honour (libpq's load balancing, a
//! standby as the target, anything it does not know) is refused at start-up
//! by name, before anything is created, rather than silently ignored.

use super::*;

use sqlx::Connection;
use std::process::{Command, Stdio};

/// A refusal must come within this (it needs no server).
const REFUSAL_BOUND: Duration = Duration::from_secs(10);

/// The shared server's address and credentials, from a test database's URL.
struct Shared {
    host: String,
    port: u16,
    user: String,
    password: Option<String>,
}

impl Shared {
    fn of(url: &str) -> (Self, String) {
        let parsed = reqwest::Url::parse(url).expect("postgres URL");
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let shared = Self {
            host: parsed.host_str().expect("host").to_owned(),
            port: parsed.port().unwrap_or(5432),
            user: decode(parsed.username()),
            password: parsed.password().map(decode),
        };
        (shared, parsed.path().trim_start_matches('/').to_owned())
    }

    fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// `user[:password]@`, encoded for a URL.
    fn userinfo(&self) -> String {
        let encode = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        match &self.password {
            Some(password) => format!("{}:{}@", encode(&self.user), encode(password)),
            None => format!("{}@", encode(&self.user)),
        }
    }

    /// ` password=...` for the keyword/value form, if there is one.
    fn password_keyword(&self) -> String {
        self.password
            .as_ref()
            .map(|p| {
                format!(
                    " password='{}'",
                    p.replace('\\', "\\\\").replace('\'', "\\'")
                )
            })
            .unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_host_urls_and_unhonoured_parameters() {
    let _turn = crate::turn(module_path!());
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let (shared, db) = Shared::of(&url);
    let (host, port, real) = (&shared.host, shared.port, shared.addr());
    let down = "127.0.0.1:1";
    let forms = [
        format!(
            "postgres://{}{down},{real}/{db}?target_session_attrs=read-write",
            shared.userinfo()
        ),
        format!(
            "host=127.0.0.1,{host} port=1,{port} user={} dbname={db} \
             target_session_attrs=read-write{}",
            shared.user,
            shared.password_keyword()
        ),
        format!(
            "postgres:///{db}?host=127.0.0.1,{host}&port=1,{port}&user={}{}",
            shared.user,
            shared
                .password
                .as_ref()
                .map(|p| format!("&password={p}"))
                .unwrap_or_default()
        ),
    ];
    let dir = tempfile::tempdir().expect("temp dir");
    for (n, form) in forms.iter().enumerate() {
        let server = Launch::new(dir.path())
            .database(form)
            .spawn()
            .ready_async()
            .await;
        let _witness = Witness::of(&[(form.as_str(), &server)]);
        let api = Api::new(form, &server);
        api.until_ready_is(200, Instant::now(), Duration::from_secs(10))
            .await;
        let info = api.info().await;
        let database = database_of(&info);
        assert_eq!(database["primary"], real.as_str(), "{form}: {info}");
        assert_eq!(database["hosts"], json!([down, real]), "{form}: {info}");
        assert_eq!(database["writable"], true, "{form}: {info}");
        api.enqueue(&format!("form-{n}"), None).await;
        let _ = server.kill();
    }

    // Refusals, on a database of their own that must stay as it is.
    let Some(empty) = common::fresh_postgres_url().await else {
        return;
    };
    let base = std::env::var(common::POSTGRES_ENV).expect("set");
    let (before_schemas, before_databases) = leftovers(&empty, &base).await;
    let (_, empty_db) = Shared::of(&empty);
    let keyword = format!(
        "host={host} port={port} user={} dbname={empty_db}{} gssencmode=require",
        shared.user,
        shared.password_keyword()
    );
    for (given, name) in [
        (
            format!("{empty}?load_balance_hosts=random"),
            "load_balance_hosts",
        ),
        (
            format!("{empty}?target_session_attrs=standby"),
            "target_session_attrs",
        ),
        (format!("{empty}?foo=bar"), "foo"),
        (keyword, "gssencmode"),
    ] {
        let (code, output, took) = refused(&given);
        // Named alone, or with the value that cannot be honoured.
        assert!(
            output.contains(&format!("`{name}`")) || output.contains(&format!("`{name}=")),
            "{given}: the refusal does not name `{name}`: {output}"
        );
        eprintln!(
            "pg_failover [urls]: {name} refused (exit {code:?}) in {} ms",
            took.as_millis()
        );
    }
    assert_eq!(
        leftovers(&empty, &base).await,
        (before_schemas, before_databases),
        "a refused start left something behind"
    );
}

/// Start settled on `url`; it must exit non-zero before listening, within
/// [`REFUSAL_BOUND`]. Its exit code, everything it printed, how long it took.
fn refused(url: &str) -> (Option<i32>, String, Duration) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = |name: &str| std::fs::File::create(dir.path().join(name)).expect("output file");
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_settled"))
        .current_dir(dir.path())
        .env_remove("SETTLED_DATABASE_URL")
        .env_remove("SETTLED_LISTEN")
        .env_remove("SETTLED_TOKENS")
        .env_remove("SETTLED_PG_SCHEMA")
        .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
        .args(["--database-url", url])
        .stdin(Stdio::null())
        .stdout(file("stdout"))
        .stderr(file("stderr"))
        .spawn()
        .expect("spawn settled");
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > REFUSAL_BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{url}: still running after {REFUSAL_BOUND:?} instead of refusing: {}{}",
                read("stdout"),
                read("stderr")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = started.elapsed();
    let output = format!("{}{}", read("stdout"), read("stderr"));
    assert!(!status.success(), "{url}: should be refused: {output}");
    let listened = output.lines().any(|line| {
        serde_json::from_str::<Value>(line)
            .is_ok_and(|entry| entry["fields"]["address"].is_string())
    });
    assert!(!listened, "{url}: listened before refusing: {output}");
    (status.code(), output, took)
}

/// The schemas of the database at `url`, and the databases of the server
/// but the test databases (other tests', which come and go meanwhile).
async fn leftovers(url: &str, base: &str) -> (Vec<String>, Vec<String>) {
    let mut db = sqlx::PgConnection::connect(url).await.expect("connect");
    let schemas = sqlx::query_scalar("SELECT nspname::text FROM pg_namespace ORDER BY 1")
        .fetch_all(&mut db)
        .await
        .expect("schemas");
    let mut admin = sqlx::PgConnection::connect(base).await.expect("connect");
    let databases = sqlx::query_scalar(
        "SELECT datname::text FROM pg_database \
         WHERE datname NOT LIKE 'settled\\_test\\_%' ORDER BY 1",
    )
    .fetch_all(&mut admin)
    .await
    .expect("databases");
    (schemas, databases)
}
