//! The Grafana dashboard and the Prometheus alert rules under `deploy/`:
//! each imports as it should, and each query names only series that
//! `/metrics` exports after a short run (a renamed metric fails here, not on
//! a user's wall).

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::common::Fresh;
use crate::common::http::spawn;

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

fn dashboard() -> Value {
    serde_json::from_str(&read("deploy/grafana/settled.json")).expect("the dashboard is JSON")
}

/// Every query of the dashboard, with Grafana's variables as Prometheus
/// would see them after Grafana filled them in.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let panels = dashboard["panels"].as_array().unwrap();
    panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "5m")
                .replace("$group", ".*")
        })
        .collect()
}

/// The `settled_*` names a query reads.
fn names_in(query: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = query;
    while let Some(at) = rest.find("settled_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// What Grafana needs to import a dashboard: a uid and title, a data source
/// variable every panel and query uses, and panels with unique ids laid out
/// on its 24-column grid without overlapping.
#[test]
fn the_dashboard_imports() {
    let d = dashboard();
    assert_eq!(d["uid"], "settled-overview");
    assert!(d["title"].is_string() && d["schemaVersion"].as_u64().unwrap() >= 36);
    let variables = d["templating"]["list"].as_array().unwrap();
    assert!(
        variables
            .iter()
            .any(|v| v["name"] == "datasource" && v["type"] == "datasource"),
        "a data source variable, so the import asks which Prometheus to use"
    );
    let source = json!({"type": "prometheus", "uid": "${datasource}"});
    let mut ids = HashSet::new();
    let mut cells = HashSet::new();
    let panels = d["panels"].as_array().unwrap();
    assert!(panels.len() >= 12, "{} panels", panels.len());
    for p in panels {
        let title = p["title"].as_str().unwrap();
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "id of {title} repeated"
        );
        let at = |k: &str| p["gridPos"][k].as_u64().unwrap();
        let (x, y, w, h) = (at("x"), at("y"), at("w"), at("h"));
        assert!(x + w <= 24 && w > 0 && h > 0, "{title} leaves the grid");
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(cells.insert((cx, cy)), "{title} overlaps another panel");
            }
        }
        if p["type"] == "row" {
            continue;
        }
        assert!(
            ["timeseries", "stat"].contains(&p["type"].as_str().unwrap()),
            "{title}"
        );
        assert_eq!(p["datasource"], source, "{title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title} has no query");
        for t in targets {
            assert_eq!(t["datasource"], source, "{title}");
            assert!(t["refId"].is_string() && t["expr"].is_string(), "{title}");
        }
    }
}

/// The alert rules pass `promtool check rules` and their own tests, and the
/// dashboard's queries parse as PromQL (as rules, to reuse the checker).
#[test]
fn promtool_accepts_the_rules_and_the_queries() {
    let Ok(version) = Command::new("promtool").arg("--version").output() else {
        assert!(
            std::env::var_os("SETTLED_REQUIRE_PROMTOOL").is_none(),
            "SETTLED_REQUIRE_PROMTOOL is set but promtool is not installed"
        );
        eprintln!(
            "SKIPPED: promtool is not installed (Debian package `prometheus`; .ci/run installs it)"
        );
        return;
    };
    assert!(version.status.success());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus");
    let run = |args: &[&str]| {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "promtool {args:?}: {text}");
    };
    run(&["check", "rules", "settled-rules.yml"]);
    run(&["test", "rules", "settled-rules.test.yml"]);
    let tmp = tempfile::tempdir().unwrap();
    let rules: Vec<String> = dashboard_queries(&dashboard())
        .iter()
        .enumerate()
        .map(|(i, q)| {
            format!(
                "      - record: settled:panel_{i}\n        expr: {}\n",
                json!(q)
            )
        })
        .collect();
    let file = tmp.path().join("panels.yml");
    std::fs::write(
        &file,
        format!("groups:\n  - name: panels\n    rules:\n{}", rules.concat()),
    )
    .unwrap();
    run(&["check", "rules", file.to_str().unwrap()]);
}

/// After a run that goes through every route, `/metrics` has every series
/// the dashboard and the alert rules read.
async fn every_series_the_dashboard_and_alerts_read_is_exported(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in ["m1", "m2", "m3"] {
        s.enqueue(id).await;
    }
    let claims = s.claim("w", 3).await;
    let outcomes = [
        json!({"kind": "accepted", "transcript_id": "t"}),
        json!({"kind": "retryable", "code": "rpc", "detail": ""}),
        json!({"kind": "permanent", "code": "signature", "detail": ""}),
    ];
    for (claim, outcome) in claims.iter().zip(outcomes) {
        s.outcome(claim, outcome).await.ok(200);
    }
    let exported: HashSet<String> = super::metrics::parse(&s.get_text("/metrics").await)
        .into_keys()
        .map(|k| k.split('{').next().unwrap().to_owned())
        .collect();
    let histogram = |name: &str| {
        ["_bucket", "_sum", "_count"]
            .iter()
            .any(|suffix| exported.contains(&format!("{name}{suffix}")))
    };
    let rules = read("deploy/prometheus/settled-rules.yml");
    let mut read: BTreeSet<String> = names_in(&rules).into_iter().collect();
    for q in dashboard_queries(&dashboard()) {
        read.extend(names_in(&q));
    }
    assert!(read.len() >= 12, "{read:?}");
    let missing: Vec<_> = read
        .iter()
        .filter(|n| !exported.contains(*n) && !histogram(n))
        .collect();
    assert!(missing.is_empty(), "read but not exported: {missing:?}");
    s.stop().await;
}

crate::on_every_backend!(every_series_the_dashboard_and_alerts_read_is_exported);
