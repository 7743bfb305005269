//! What the derived OpenAPI document needs besides the routes' own
//! annotations, so that generated clients and `/docs` work: the bearer
//! scheme and the roles of each operation (as its handler declares them), the
//! answers the middleware and the store can give to every operation (shared
//! response components), tagged unions as named variants with a
//! discriminator, and a realistic example for every request body (`examples`).

use axum::http::Method;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{Discriminator, Schema};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, HeaderBuilder, OpenApi, Ref, RefOr, Required, Response, ResponseBuilder, Type,
};

use super::examples::request_example;
use crate::http::middleware::auth::{BEARER, Role, declared_roles};

/// Shared responses: (component name, status, description).
const SHARED: [(&str, &str, &str); 10] = [
    (
        "MalformedJson",
        "400",
        "The body is not JSON (`malformed_json`)",
    ),
    (
        "Unauthorized",
        "401",
        "The server has tokens and the request has no valid one (`unauthorized`): send \
         `Authorization: Bearer <token>`",
    ),
    (
        "Forbidden",
        "403",
        "This token's role may not call this operation (`forbidden`)",
    ),
    (
        "CrossSiteRequest",
        "403",
        "Sent by a browser from another site or origin (`cross_site_request`)",
    ),
    (
        "ForbiddenOrCrossSite",
        "403",
        "This token's role may not call this operation (`forbidden`), or a browser sent it \
         from another site or origin (`cross_site_request`)",
    ),
    (
        "RequestTimeout",
        "408",
        "The request body stopped arriving (`request_timeout`)",
    ),
    ("BodyTooLarge", "413", "Body over 1 MiB (`body_too_large`)"),
    (
        "UnsupportedMediaType",
        "415",
        "Not sent with `Content-Type: application/json` (`unsupported_media_type`); required \
         on every POST and DELETE, with or without a body",
    ),
    (
        "InvalidRecord",
        "500",
        "A stored value is corrupt or an update would overflow (`invalid_record`); nothing \
         was changed",
    ),
    (
        "Unavailable",
        "503",
        "The database is unavailable, or the request reached the server's time limit \
         (`backend_unavailable`): retry later with backoff",
    ),
];

/// A server without tokens answers only loopback names; on every operation.
const MISDIRECTED: (&str, &str, &str) = (
    "HostNotAllowed",
    "421",
    "A server without tokens answers only requests addressed to a loopback name or an \
     `--allowed-host` (`host_not_allowed`)",
);

/// Operations under `/v1` that do not reach the database.
const NOT_STORE_BACKED: [&str; 1] = ["v1.info.get"];

/// Tagged unions: (schema, tag property). Their variants carry titles.
const TAGGED: [(&str, &str); 2] = [("OutcomeIn", "kind"), ("Route", "kind")];

/// Everything this module adds, in place.
pub fn refine(doc: &mut OpenApi) {
    let components = doc.components.get_or_insert_with(Default::default);
    for (name, status, description) in SHARED.iter().chain([&MISDIRECTED]) {
        components
            .responses
            .insert((*name).to_owned(), RefOr::T(problem(status, description)));
    }
    components.security_schemes.insert(
        BEARER.to_owned(),
        RefOr::T(SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "A token given to the server with `--token ROLE:TOKEN`; the scheme name is \
                     case-insensitive. Needed on every `/v1` operation when the server has \
                     tokens; a server without tokens (loopback only) needs none.",
                ))
                .build(),
        )),
    );
    for (path, item) in &mut doc.paths.paths {
        for (method, operation) in [
            (Method::GET, &mut item.get),
            (Method::POST, &mut item.post),
            (Method::PUT, &mut item.put),
            (Method::PATCH, &mut item.patch),
            (Method::DELETE, &mut item.delete),
        ] {
            if let Some(operation) = operation {
                document_operation(path, &method, operation);
            }
        }
    }
    for (name, tag) in TAGGED {
        name_variants(doc, name, tag);
    }
}

fn problem(status: &str, description: &str) -> Response {
    let content = ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("Problem")))
        .build();
    let mut response = ResponseBuilder::new()
        .description(description)
        .content("application/problem+json", content);
    if status == "401" {
        let header = HeaderBuilder::new()
            .schema(Some(
                utoipa::openapi::ObjectBuilder::new().schema_type(Type::String),
            ))
            .description(Some("`Bearer`"))
            .build();
        response = response.header("WWW-Authenticate", header);
    }
    response.build()
}

fn shared(operation: &mut Operation, status: &str, name: &str) {
    operation.responses.responses.insert(
        status.to_owned(),
        RefOr::Ref(Ref::new(format!("#/components/responses/{name}"))),
    );
}

/// Security, roles and the answers an operation can give before or besides
/// its handler's own.
fn document_operation(path: &str, method: &Method, operation: &mut Operation) {
    let id = operation.operation_id.clone().unwrap_or_default();
    let changes = *method != Method::GET;
    let v1 = path.starts_with("/v1/");
    if changes {
        shared(operation, "415", "UnsupportedMediaType");
        // A body the handler reads (a redrive's optional body is ignored).
        let read = matches!(&operation.request_body,
            Some(RefOr::T(body)) if body.required == Some(Required::True));
        if read {
            shared(operation, "400", "MalformedJson");
            shared(operation, "408", "RequestTimeout");
            shared(operation, "413", "BodyTooLarge");
        }
    }
    shared(operation, MISDIRECTED.1, MISDIRECTED.0);
    let mut refused = false;
    if v1 {
        // Declared by the handler (see `auth::Access`); none is caught there.
        let roles: Vec<&str> = declared_roles(operation)
            .unwrap_or_default()
            .into_iter()
            .map(Role::as_str)
            .collect();
        refused = roles.len() < Role::ALL.len();
        shared(operation, "401", "Unauthorized");
        let roles = format!(
            "Token roles allowed: {}.",
            roles
                .iter()
                .map(|r| format!("`{r}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        operation.description = Some(match operation.description.take() {
            Some(text) => format!("{text}\n\n{roles}"),
            None => roles,
        });
        if !NOT_STORE_BACKED.contains(&id.as_str()) {
            shared(operation, "500", "InvalidRecord");
            shared(operation, "503", "Unavailable");
        }
    }
    match (refused, changes) {
        (true, true) => shared(operation, "403", "ForbiddenOrCrossSite"),
        (true, false) => shared(operation, "403", "Forbidden"),
        (false, true) => shared(operation, "403", "CrossSiteRequest"),
        (false, false) => {}
    }
    if let Some(RefOr::T(body)) = &mut operation.request_body
        && body.required != Some(Required::True)
    {
        for content in body.content.values_mut() {
            if let RefOr::T(content) = content {
                optional_not_null(&mut content.schema);
            }
        }
    }
    if let Some(example) = request_example(&id)
        && let Some(RefOr::T(body)) = &mut operation.request_body
        && let Some(RefOr::T(content)) = body.content.get_mut("application/json")
    {
        content.example = Some(example);
    }
}

/// An optional body (`Option<T>`) is left out, never sent as null: document
/// `T` alone, or generators send `null` when the caller gives no body.
fn optional_not_null(schema: &mut Option<RefOr<Schema>>) {
    if let Some(RefOr::T(Schema::OneOf(union))) = schema
        && let [object @ RefOr::Ref(_), RefOr::T(Schema::Object(null))] = union.items.as_slice()
        && null.schema_type == Type::Null.into()
    {
        *schema = Some(object.clone());
    }
}

/// Turn the inline, titled variants of the tagged union `name` into schemas
/// of their own (named by their titles) with a constant tag, and tell
/// generators which tag value means which: Python gets `AcceptedOutcome`,
/// not `OutcomeInType0`.
fn name_variants(doc: &mut OpenApi, name: &str, tag: &str) {
    let schemas = &mut doc.components.as_mut().expect("components").schemas;
    let Some(RefOr::T(Schema::OneOf(union))) = schemas.get_mut(name) else {
        panic!("{name} is not a oneOf schema");
    };
    let mut discriminator = Discriminator::new(tag);
    let mut variants = Vec::new();
    for item in &mut union.items {
        let RefOr::T(Schema::Object(object)) = item else {
            panic!("{name}: a variant is not an inline object");
        };
        let title = object
            .title
            .clone()
            .unwrap_or_else(|| panic!("{name}: a variant has no title"));
        let Some(RefOr::T(Schema::Object(property))) = object.properties.get_mut(tag) else {
            panic!("{name}.{title} has no `{tag}`");
        };
        let value = match property.enum_values.take().as_deref() {
            Some([value]) => value.clone(),
            _ => panic!("{name}.{title}.{tag} is not one value"),
        };
        let label = value.as_str().expect("tag values are strings").to_owned();
        // `const` rather than a one-value enum: Python gets `Literal["accepted"]`.
        property
            .extensions
            .get_or_insert_with(Default::default)
            .insert("const".to_owned(), value);
        let reference = format!("#/components/schemas/{title}");
        discriminator.mapping.insert(label, reference.clone());
        let variant = std::mem::replace(item, RefOr::Ref(Ref::new(reference)));
        variants.push((title, variant));
    }
    union.discriminator = Some(discriminator);
    for (title, variant) in variants {
        schemas.insert(title, variant);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_body_has_an_example() {
        let doc = crate::http::openapi();
        for (path, item) in &doc.paths.paths {
            for operation in [&item.post, &item.put, &item.patch, &item.delete]
                .into_iter()
                .flatten()
            {
                let Some(RefOr::T(body)) = &operation.request_body else {
                    continue;
                };
                let Some(RefOr::T(content)) = body.content.get("application/json") else {
                    panic!("{path}: no JSON body");
                };
                assert!(content.example.is_some(), "{path}: no example");
            }
        }
    }
}
