//! Tests of the token check and the route table (`auth`).

use super::*;
use axum::http::Method;
use utoipa::openapi::path::Operation;

#[test]
fn tokens_parse_and_refuse_bad_entries() {
    let t = Tokens::parse(&["worker:0123456789abcdef", "operator:fedcba9876543210"]).unwrap();
    assert_eq!(t.role_of("0123456789abcdef"), Some(Role::Worker));
    assert_eq!(t.role_of("fedcba9876543210"), Some(Role::Operator));
    assert_eq!(t.role_of("0123456789abcdeF"), None);
    assert_eq!(Tokens::parse(&["worker"]).unwrap_err(), TokenError::Shape);
    assert_eq!(
        Tokens::parse(&["admin:0123456789abcdef"]).unwrap_err(),
        TokenError::Role("admin".into())
    );
    assert_eq!(
        Tokens::parse(&["worker:short"]).unwrap_err(),
        TokenError::Weak
    );
    assert!(!format!("{t:?}").contains("0123"));
}

#[test]
fn tokens_may_carry_a_name() {
    let t = Tokens::parse(&[
        "operator:alice:0123456789abcdef",
        "reader:0123:456789abcdef",
    ])
    .unwrap();
    let alice = t.caller_of("0123456789abcdef").unwrap();
    assert_eq!(
        (alice.role, alice.name.as_deref()),
        (Role::Operator, Some("alice"))
    );
    // Not both parts valid (the rest is too short to be a token): the
    // whole rest is the token, as before names existed.
    assert_eq!(t.role_of("0123:456789abcdef"), Some(Role::Reader));
    assert_eq!(t.caller_of("0123:456789abcdef").unwrap().name, None);
    assert_eq!(
        Tokens::parse(&["worker:bob:short"]).err(),
        Some(TokenError::Weak)
    );
    assert_eq!(
        Tokens::parse(&["operator:a:0123456789abcdef", "reader:b:0123456789abcdef"]).err(),
        Some(TokenError::Repeated)
    );
    assert!(!format!("{t:?}").contains("alice"));
}

#[test]
fn a_v1_operation_without_roles_is_refused() {
    use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
    use utoipa::openapi::security::SecurityRequirement;
    use utoipa::openapi::{OpenApiBuilder, PathsBuilder};
    let doc = |op: Operation| {
        OpenApiBuilder::new()
            .paths(
                PathsBuilder::new()
                    .path("/v1/things/{id}", PathItem::new(HttpMethod::Post, op))
                    .path(
                        "/healthz",
                        PathItem::new(HttpMethod::Get, OperationBuilder::new().build()),
                    ),
            )
            .build()
    };
    let bare = Access::of(&doc(OperationBuilder::new().build()), []);
    assert!(
        bare.unwrap_err()
            .contains("POST /v1/things/{id} declares no role")
    );
    let unknown = OperationBuilder::new()
        .security(SecurityRequirement::new(BEARER, ["admin"]))
        .build();
    assert!(
        Access::of(&doc(unknown), [])
            .unwrap_err()
            .contains("`admin`")
    );
    let declared = OperationBuilder::new()
        .security(SecurityRequirement::new(BEARER, ["worker", "operator"]))
        .build();
    let access = Access::of(&doc(declared), ["/metrics".to_owned()]).unwrap();
    let path = "/v1/things/a%2Fb";
    assert_eq!(access.allows(Role::Worker, &Method::POST, path), Some(true));
    assert_eq!(
        access.allows(Role::Reader, &Method::POST, path),
        Some(false)
    );
    assert_eq!(access.allows(Role::Reader, &Method::GET, path), None);
    assert_eq!(access.allows(Role::Worker, &Method::HEAD, path), None);
    assert_eq!(access.allows(Role::Reader, &Method::GET, "/v1/nope"), None);
    // Routes outside /v1 are in the table (for their labels), with no roles.
    assert_eq!(access.lookup("/healthz").unwrap().template, "/healthz");
    assert_eq!(access.lookup("/metrics").unwrap().template, "/metrics");
    assert_eq!(access.allows(Role::Reader, &Method::GET, "/healthz"), None);
}

#[test]
fn the_bearer_scheme_is_case_insensitive() {
    for value in ["Bearer abc", "bearer abc", "BEARER abc", "BeArEr   abc "] {
        assert_eq!(bearer_token(value), Some("abc"), "{value}");
    }
    for value in ["Basic abc", "Bearer", "Bearer ", "Bearerabc", "abc"] {
        assert_eq!(bearer_token(value), None, "{value}");
    }
}
