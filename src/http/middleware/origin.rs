//! What a web page in the operator's browser must not be able to do.
//!
//! Cross-site request forgery: every state-changing request must carry
//! `Content-Type: application/json`, which an HTML form cannot send and which
//! a script on another site can only send after a CORS preflight that settled
//! never grants. Requests that a browser marks as coming from another site
//! (`Sec-Fetch-Site`) or from another origin (`Origin`) are refused as well.
//!
//! DNS rebinding: an anonymous server (no tokens, loopback only) answers only
//! requests addressed to a loopback name (or a configured one), so a page on an
//! attacker's domain that resolves to 127.0.0.1 cannot read or change anything.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::http::error::{ApiError, ProblemCode};

/// Host names an anonymous server answers to; `None` (a server with
/// tokens) answers to any.
#[derive(Debug, Clone)]
pub struct AllowedHosts(Option<Arc<Vec<String>>>);

impl AllowedHosts {
    /// Loopback names only.
    #[must_use]
    pub fn loopback() -> Self {
        Self(Some(Arc::default()))
    }

    /// Any name (a server with tokens).
    #[must_use]
    pub const fn any() -> Self {
        Self(None)
    }

    /// Loopback names (`localhost`, `*.localhost`, `127.x.y.z`, `[::1]`) and `extra`.
    pub fn loopback_and<S: AsRef<str>>(extra: &[S]) -> Result<Self, String> {
        let mut names = Vec::new();
        for name in extra {
            let name = name.as_ref().trim().to_ascii_lowercase();
            let valid = !name.is_empty()
                && name.len() <= 253
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b));
            if !valid {
                return Err(format!(
                    "`{name}` is not a host name (give a name such as settled.internal, without port)"
                ));
            }
            names.push(name);
        }
        Ok(Self(Some(Arc::new(names))))
    }

    /// Whether every name is answered (a server with tokens).
    #[must_use]
    pub fn allows_any(&self) -> bool {
        self.0.is_none()
    }

    /// Whether a request addressed to `authority` (`host[:port]`) is answered.
    #[must_use]
    pub fn allows(&self, authority: &str) -> bool {
        let Some(extra) = &self.0 else {
            return true;
        };
        let host = host_of(authority).to_ascii_lowercase();
        is_loopback_name(&host) || extra.contains(&host)
    }
}

/// The host part of `host[:port]` (`[v6]` keeps its brackets).
fn host_of(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority
            .find(']')
            .map_or(authority, |end| &authority[..=end]);
    }
    authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host)
}

fn is_loopback_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    host == "localhost"
        || host.ends_with(".localhost")
        || host == "[::1]"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Methods that change nothing; everything else must be JSON and same-origin.
fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

fn is_json(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

/// The authority a request is addressed to: the HTTP/2 `:authority`, or `Host`.
fn authority(request: &Request) -> Option<&str> {
    request.uri().authority().map(|a| a.as_str()).or_else(|| {
        request
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
    })
}

/// Whether `origin` (`scheme://host[:port]`) names the same host and port as
/// `authority`. The scheme is not compared: behind a TLS proxy the page is
/// `https://` while settled itself is reached over plain HTTP.
fn same_origin(origin: &str, authority: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    let default_port = match scheme {
        "http" => ":80",
        "https" => ":443",
        _ => return false,
    };
    let strip = |a: &str| -> String {
        let a = a.to_ascii_lowercase();
        a.strip_suffix(default_port)
            .map_or(a.clone(), str::to_owned)
    };
    strip(rest) == strip(authority)
}

fn refuse(status: StatusCode, code: ProblemCode, detail: &str) -> Response {
    ApiError::auth(status, code, detail).into_response()
}

/// Refuse requests to a name an anonymous server does not answer to, and
/// state-changing requests a cross-site page could have made.
pub async fn guard(State(hosts): State<AllowedHosts>, request: Request, next: Next) -> Response {
    let authority = authority(&request);
    // No (readable) Host at all is refused too when the names are restricted.
    if !hosts.allows_any() && !authority.is_some_and(|a| hosts.allows(a)) {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            ProblemCode::HostNotAllowed,
            "without tokens settled answers only requests addressed to localhost, a loopback \
             address or a name given with --allowed-host",
        );
    }
    if is_safe(request.method()) {
        return next.run(request).await;
    }
    let fetch_site = request
        .headers()
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok());
    if fetch_site.is_some_and(|site| !matches!(site, "same-origin" | "none")) {
        return refuse(
            StatusCode::FORBIDDEN,
            ProblemCode::CrossSiteRequest,
            "state-changing requests from another site are refused",
        );
    }
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok());
    if let Some(origin) = origin
        && !authority.is_some_and(|a| same_origin(origin, a))
    {
        return refuse(
            StatusCode::FORBIDDEN,
            ProblemCode::CrossSiteRequest,
            "state-changing requests from another origin are refused",
        );
    }
    if !is_json(&request) {
        return ApiError::unsupported_media_type().into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_configured_ones_are_allowed() {
        let hosts = AllowedHosts::loopback_and(&["Settled.Internal"]).unwrap();
        for ok in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.:1",
            "app.localhost:3000",
            "127.0.0.1",
            "127.8.9.10:8080",
            "[::1]:8080",
            "[::1]",
            "settled.internal:8080",
            "SETTLED.INTERNAL",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "10.0.0.1:8080",
            "[::2]:8080",
            "settled.internal.evil",
        ] {
            assert!(!hosts.allows(bad), "{bad}");
        }
        assert!(AllowedHosts::any().allows("evil.example"));
        assert!(!AllowedHosts::loopback().allows("evil.example"));
        assert!(AllowedHosts::loopback_and(&["a b"]).is_err());
    }

    #[test]
    fn origins_match_by_host_and_port() {
        assert!(same_origin("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(same_origin("https://settled.example", "settled.example"));
        assert!(same_origin(
            "https://settled.example",
            "settled.example:443"
        ));
        assert!(!same_origin("http://127.0.0.1:8081", "127.0.0.1:8080"));
        assert!(!same_origin("http://evil.example", "127.0.0.1:8080"));
        assert!(!same_origin("null", "127.0.0.1:8080"));
    }
}
