//! The committed `openapi.yaml` is exactly what the code generates.
//! Regenerate with: cargo run -- openapi > openapi.yaml

#[test]
fn committed_openapi_yaml_matches_the_code() {
    let generated = settled::http::openapi().to_yaml().expect("render");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml");
    let committed = std::fs::read_to_string(path).expect("openapi.yaml is committed");
    assert!(
        generated == committed,
        "openapi.yaml is out of date: run `cargo run -- openapi > openapi.yaml` and commit it"
    );
}

#[test]
fn every_documented_operation_has_a_stable_dotted_id_and_problem_errors() {
    let doc = serde_json::to_value(settled::http::openapi()).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    let mut ids = Vec::new();
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path} has no id"));
            assert!(id.contains('.'), "{id}");
            ids.push(id.to_owned());
            for (status, response) in op["responses"].as_object().unwrap() {
                if status.starts_with('4') || status.starts_with('5') {
                    assert!(
                        response["content"]
                            .get("application/problem+json")
                            .is_some(),
                        "{method} {path} {status} is not problem+json"
                    );
                }
            }
        }
    }
    let expected = [
        "v1.receipts.create",
        "v1.receipts.batch",
        "v1.receipts.get",
        "v1.claims.create",
        "v1.receipts.claim",
        "v1.receipts.outcome",
        "v1.outcomes.batch",
        "v1.receipts.lease.extend",
        "v1.receipts.lease.release",
        "v1.dead_letters.list",
        "v1.dead_letters.get",
        "v1.dead_letters.redrive",
        "v1.status.get",
        "v1.info.get",
        "health.alive",
        "health.ready",
    ];
    for id in expected {
        assert!(ids.iter().any(|i| i == id), "missing operation {id}");
    }
    assert_eq!(ids.len(), expected.len());
}
