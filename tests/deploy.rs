//! The deployment files agree with the binary, and `settled healthcheck` works.
//!
//! - `healthcheck`: the real binary asked by `settled healthcheck` (exit 0), a closed port and a
//!   silent one (exit 1 with a one-line reason), and the health checks of the Dockerfile and
//!   deploy/compose.yaml run exactly as written against a server configured as the image is.
//! - `consistency`: every `SETTLED_*` variable and `--flag` that the Dockerfile, the compose
//!   file, the Kubernetes manifests and the systemd unit use is one `settled` has; their
//!   container ports, listen addresses, probes, images and stop grace periods agree with each
//!   other and with the server's own limits; the nginx example's body limit and timeouts fit
//!   the API's.
//! - `layout`: the source tree's shape (file lengths, the backends' mirrored files, layers that
//!   import only downwards).
//!
//! - `doc_links`: every path a user document names exists, and its prose speaks to users
//!   (none of the project's own bookkeeping words outside code).
//!
//! The tools made for each file (docker-compose and the compose-spec schema,
//! kubernetes-validate, systemd-analyze, nginx, promtool) check them in tests/deploy/validate.sh,
//! which .ci/run calls.

#[path = "deploy/consistency.rs"]
mod consistency;
#[path = "deploy/doc_links.rs"]
mod doc_links;
#[path = "deploy/files.rs"]
mod files;
#[path = "deploy/healthcheck.rs"]
mod healthcheck;
#[path = "deploy/layout.rs"]
mod layout;
#[path = "common/process.rs"]
#[allow(dead_code, reason = "the process helpers serve several test binaries")]
mod process;
