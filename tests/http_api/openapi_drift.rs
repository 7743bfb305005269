//! The committed `openapi.yaml` is exactly what the code generates, and it
//! gives client generators what they need.
//! Regenerate with: cargo run -- openapi > openapi.yaml

use serde_json::Value;

#[test]
fn committed_openapi_yaml_matches_the_code() {
    let generated = settled::http::openapi_yaml();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml");
    let committed = std::fs::read_to_string(path).expect("openapi.yaml is committed");
    assert!(
        generated == committed,
        "openapi.yaml is out of date: run `cargo run -- openapi > openapi.yaml` and commit it"
    );
}

/// A response, or the shared component its `$ref` names.
fn resolve<'a>(doc: &'a Value, response: &'a Value) -> &'a Value {
    match response["$ref"].as_str() {
        Some(reference) => {
            let name = reference
                .strip_prefix("#/components/responses/")
                .unwrap_or_else(|| panic!("unexpected $ref {reference}"));
            &doc["components"]["responses"][name]
        }
        None => response,
    }
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
                let response = resolve(&doc, response);
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
        "v1.receipts.find",
        "v1.claims.create",
        "v1.receipts.claim",
        "v1.receipts.outcome",
        "v1.outcomes.batch",
        "v1.receipts.lease.extend",
        "v1.leases.extend",
        "v1.receipts.lease.release",
        "v1.dead_letters.list",
        "v1.dead_letters.get",
        "v1.dead_letters.redrive",
        "v1.receipts.hold",
        "v1.receipts.unhold",
        "v1.receipts.cancel",
        "v1.bulk.act",
        "v1.groups.list",
        "v1.groups.get",
        "v1.groups.put",
        "v1.status.get",
        "v1.stats.get",
        "v1.info.get",
        "v1.history.list",
        "health.alive",
        "health.ready",
    ];
    for id in expected {
        assert!(ids.iter().any(|i| i == id), "missing operation {id}");
    }
    assert_eq!(ids.len(), expected.len());
}

/// Generated clients send the token, and parse 401/403 (and, where the
/// database is behind, 500/503) as problems; public operations need none.
#[test]
fn every_v1_operation_needs_the_bearer_token_and_documents_its_refusals() {
    let doc = serde_json::to_value(settled::http::openapi()).unwrap();
    let scheme = &doc["components"]["securitySchemes"]["bearer"];
    assert_eq!(scheme["type"], "http");
    assert_eq!(scheme["scheme"], "bearer");
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap();
            let responses = &op["responses"];
            if path.starts_with("/v1/") {
                // One requirement: the bearer scheme, with the roles admitted
                // (OpenAPI 3.1 role names), operator always among them.
                let security = op["security"].as_array().unwrap();
                assert_eq!(security.len(), 1, "{id}");
                let roles = security[0]["bearer"].as_array().unwrap();
                assert!(roles.contains(&serde_json::json!("operator")), "{id}");
                for role in roles {
                    let mention = format!("`{}`", role.as_str().unwrap());
                    let text = op["description"].as_str().unwrap_or_default();
                    assert!(text.contains(&mention), "{id}: {mention} undocumented");
                }
                assert!(responses.get("401").is_some(), "{id}: no 401");
                if id != "v1.info.get" {
                    for status in ["500", "503"] {
                        assert!(responses.get(status).is_some(), "{id}: no {status}");
                    }
                }
                // Every role may read a receipt and the service facts; the rest refuse some.
                let all_roles = matches!(id, "v1.receipts.get" | "v1.info.get");
                assert_eq!(
                    responses.get("403").is_some(),
                    !all_roles || method != "get",
                    "{id}: 403"
                );
            } else {
                assert!(op.get("security").is_none(), "{id} is public");
                assert!(responses.get("401").is_none(), "{id} is public");
            }
        }
    }
}

/// Python gets named classes and TypeScript a tagged union: every `oneOf`
/// that is more than "this or null" has titled `$ref` variants and a
/// discriminator that maps each tag value to one of them.
#[test]
fn unions_are_discriminated_and_closed_sets_are_enums() {
    let doc = serde_json::to_value(settled::http::openapi()).unwrap();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let mut unions = Vec::new();
    for (name, schema) in schemas {
        let Some(variants) = schema["oneOf"].as_array() else {
            continue;
        };
        unions.push(name.as_str());
        let mapping = schema["discriminator"]["mapping"]
            .as_object()
            .unwrap_or_else(|| panic!("{name} has no discriminator mapping"));
        assert_eq!(mapping.len(), variants.len(), "{name}");
        for variant in variants {
            let reference = variant["$ref"].as_str().expect("a $ref variant");
            let target = reference.rsplit('/').next().unwrap();
            let tag = &schemas[target]["properties"]["kind"]["const"];
            assert_eq!(mapping[tag.as_str().unwrap()], reference, "{name}");
            assert_eq!(schemas[target]["title"], target);
        }
    }
    assert_eq!(unions, ["OutcomeIn", "Route"]);
    let enum_of = |schema: &str, field: &str| {
        let property = &schemas[schema]["properties"][field];
        let property = match property["oneOf"].as_array() {
            Some(options) => &options[0],
            None => property,
        };
        let name = property["$ref"]
            .as_str()
            .unwrap_or_else(|| panic!("{schema}.{field} is not a $ref: {property}"))
            .rsplit('/')
            .next()
            .unwrap();
        schemas[name]["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("{schema}.{field} is not an enum"))
            .len()
    };
    assert_eq!(enum_of("Problem", "class"), 8);
    assert!(enum_of("Problem", "code") > 30);
    assert_eq!(enum_of("HistoryEntry", "outcome"), 9);
    assert_eq!(enum_of("HistoryEntry", "route"), 3);
    assert_eq!(enum_of("ReceiptBatchResult", "status"), 4);
    assert_eq!(enum_of("InfoOut", "backend"), 2);
    assert_eq!(enum_of("HealthOut", "status"), 2);
    // A free-form object: TypeScript producers can send any fields, workers read them.
    let observation = &schemas["Observation"];
    assert_eq!(observation["type"], "object");
    assert_eq!(observation["additionalProperties"], true);
}

/// The spec says each problem code is explained in the troubleshooting guide.
#[test]
fn every_problem_code_is_in_the_troubleshooting_table() {
    let doc = serde_json::to_value(settled::http::openapi()).unwrap();
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/troubleshooting.md"
    ))
    .unwrap();
    let codes = doc["components"]["schemas"]["ProblemCode"]["enum"]
        .as_array()
        .unwrap();
    for code in codes {
        let row = format!("| `{}` |", code.as_str().unwrap());
        assert!(
            guide.contains(&row),
            "docs/troubleshooting.md has no row {row}"
        );
    }
}

/// Every `$ref` names a schema the document defines: generators refuse a
/// dangling one (openapi-typescript stops at the first).
#[test]
fn every_schema_reference_resolves() {
    let doc = settled::http::openapi();
    let text = serde_json::to_string(&doc).unwrap();
    let defined: Vec<String> = doc
        .components
        .as_ref()
        .map(|c| c.schemas.keys().cloned().collect())
        .unwrap_or_default();
    let prefix = "#/components/schemas/";
    for (at, _) in text.match_indices(prefix) {
        let name: String = text[at + prefix.len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(defined.contains(&name), "dangling $ref to {name}");
    }
}
