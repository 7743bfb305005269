# syntax=docker/dockerfile:1
# Build: docker build -t settled .
# Run:   docker run -p 8080:8080 -v settled-data:/data --stop-timeout 40 \
#          -e SETTLED_TOKENS=operator:$(openssl rand -hex 24),worker:$(openssl rand -hex 24) settled
# (tokens are 16..=256 visible ASCII characters; keep them somewhere safe to give to clients)
# (docs/deployment.md; deploy/ has compose, Kubernetes, systemd and proxy files)
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# Dependencies first, so source edits do not rebuild them.
# The tools are workspace members: their manifests (with empty sources) let Cargo read the
# workspace; only the settled package is built.
COPY Cargo.toml Cargo.lock ./
COPY tools/settled-bench/Cargo.toml tools/settled-bench/
COPY tools/settled-faults/Cargo.toml tools/settled-faults/
COPY tools/test-support/Cargo.toml tools/test-support/
RUN mkdir -p src tools/settled-bench/src tools/settled-faults/src tools/test-support/src \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && echo 'fn main() {}' > tools/settled-bench/src/main.rs \
    && echo 'fn main() {}' > tools/settled-faults/src/main.rs \
    && touch tools/test-support/src/lib.rs \
    && cargo build --release --locked -p settled --bin settled && rm -rf src
COPY src ./src
COPY migrations ./migrations
COPY assets ./assets
COPY openapi.yaml ./
RUN touch src/main.rs src/lib.rs && cargo build --release --locked -p settled --bin settled

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin settled \
    && mkdir -p /data && chown settled /data
COPY --from=build /src/target/release/settled /usr/local/bin/settled
USER settled
WORKDIR /data
VOLUME ["/data"]
ENV SETTLED_LISTEN=0.0.0.0:8080 \
    SETTLED_DATABASE_URL=sqlite:/data/settled.db \
    SETTLED_LOG_FORMAT=json
EXPOSE 8080
# `settled healthcheck` asks /readyz on the port SETTLED_LISTEN names (the image
# has no curl): change the port with SETTLED_LISTEN, not --listen, to keep the
# check on it. The start period covers migrations, which run before the first
# request is answered.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/settled", "healthcheck", "--timeout", "4s"]
# On SIGTERM settled drains for at most 35 s: stop it with --stop-timeout 40.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/settled"]
CMD ["serve"]
