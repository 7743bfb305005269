# syntax=docker/dockerfile:1
# Build: docker build -t settled .
# Run:   docker run -p 8080:8080 -v settled-data:/data \
#          -e SETTLED_TOKENS=operator:$(openssl rand -hex 24),worker:$(openssl rand -hex 24) settled
# (tokens are 16..=256 visible ASCII characters; keep them somewhere safe to give to clients)
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# Dependencies first, so source edits do not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src/bin && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && echo 'fn main() {}' > src/bin/settled-bench.rs \
    && cargo build --release --locked --bin settled && rm -rf src
COPY src ./src
COPY migrations ./migrations
COPY assets ./assets
COPY openapi.yaml ./
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin settled

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
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/settled"]
CMD ["serve"]
