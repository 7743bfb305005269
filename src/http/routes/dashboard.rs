//! The operator dashboard: one page embedded in the binary, no CDN, no
//! external fonts. It calls the same JSON endpoints as every other client.

use axum::http::header;
use axum::response::IntoResponse;

const PAGE: &str = include_str!("../../../assets/dashboard.html");

/// `GET /`.
pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            ),
            // No other page may frame the dashboard (clickjacking a redrive);
            // X-Frame-Options for browsers that predate frame-ancestors.
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        PAGE,
    )
}
