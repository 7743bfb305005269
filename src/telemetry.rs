//! OpenTelemetry traces over OTLP (HTTP/protobuf), off unless configured.
//!
//! Configured by the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) turns it on; `OTEL_SERVICE_NAME`
//! (default `settled`), `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`,
//! `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_EXPORTER_OTLP_TIMEOUT` are read by
//! the OpenTelemetry SDK as usual; `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` keep it off.
//!
//! A request never waits for the collector: a finished span goes into a
//! bounded queue ([`QUEUE`] spans) that one task drains in batches. When the
//! queue is full, or a batch cannot be delivered, its spans are dropped and
//! counted (`settled_trace_spans_dropped_total`).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor,
};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

/// Spans waiting for export, at most.
pub const QUEUE: usize = 4096;
/// Spans per export request, at most.
const BATCH: usize = 512;
/// How long a span may wait for its batch to fill.
const LINGER: Duration = Duration::from_secs(1);

/// What a server needs to export its spans.
#[derive(Clone)]
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// Tells the export task to send what is queued and stop.
    stop: Arc<Notify>,
    task: Arc<Mutex<Option<JoinHandle<()>>>>,
    /// Spans dropped: queue full, or their batch not delivered.
    pub dropped: Counter,
    /// Spans delivered to the collector.
    pub exported: Counter,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Telemetry")
    }
}

/// Where and how to export.
#[derive(Debug, Clone)]
pub struct ExportTo {
    /// The full traces URL (`…/v1/traces`); `None`: from the environment.
    pub endpoint: Option<String>,
    /// Spans waiting for export, at most.
    pub queue: usize,
}

impl Telemetry {
    /// From the standard `OTEL_*` variables; `None` when no endpoint is set
    /// or tracing is switched off.
    ///
    /// # Errors
    /// The exporter cannot be built (a malformed endpoint, say).
    pub fn from_env(dropped: Counter, exported: Counter) -> Result<Option<Self>, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let off = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
        let on = var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
            || var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some();
        if off || !on {
            return Ok(None);
        }
        let to = ExportTo {
            endpoint: None,
            queue: QUEUE,
        };
        Self::start(&to, dropped, exported).map(Some)
    }

    /// Export to `to`, on the current tokio runtime, counting spans
    /// `dropped` and `exported` (the counters `/metrics` shows).
    ///
    /// # Errors
    /// The exporter cannot be built.
    pub fn start(to: &ExportTo, dropped: Counter, exported: Counter) -> Result<Self, String> {
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(Client::default())
            .with_protocol(Protocol::HttpBinary);
        if let Some(endpoint) = &to.endpoint {
            builder = builder.with_endpoint(endpoint.clone());
        }
        let mut exporter = builder.build().map_err(|e| format!("OTLP exporter: {e}"))?;
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("settled");
        }
        let resource = resource.build();
        // The export task owns the exporter, so it learns the resource here
        // (a batch processor of the SDK would be told it by the provider).
        exporter.set_resource(&resource);
        let (tx, rx) = mpsc::channel(to.queue.max(1));
        let stop = Arc::new(Notify::new());
        let task = tokio::spawn(drain(
            rx,
            exporter,
            dropped.clone(),
            exported.clone(),
            stop.clone(),
        ));
        let provider = SdkTracerProvider::builder()
            .with_resource(resource)
            .with_span_processor(Queue {
                tx,
                dropped: dropped.clone(),
            })
            .build();
        let tracer = provider.tracer("settled");
        Ok(Self {
            provider,
            tracer,
            stop,
            task: Arc::new(Mutex::new(Some(task))),
            dropped,
            exported,
        })
    }

    /// The tracer spans are made with.
    #[must_use]
    pub const fn tracer(&self) -> &SdkTracer {
        &self.tracer
    }

    /// Send what is queued (waiting at most 5 s for the collector), then
    /// stop exporting.
    pub async fn shutdown(&self) {
        self.stop.notify_one();
        let task = self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        let _ = self.provider.shutdown_with_timeout(Duration::from_secs(1));
    }
}

/// The span processor: hands each finished span to the export task, or
/// drops and counts it when the queue is full. Never blocks.
#[derive(Debug)]
struct Queue {
    tx: mpsc::Sender<SpanData>,
    dropped: Counter,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if self.tx.try_send(span).is_err() {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Send queued spans in batches of up to [`BATCH`], each batch at most
/// [`LINGER`] after its first span; a batch the collector does not take is
/// dropped and counted (the exporter has its own timeout). Told to `stop`,
/// send what is still queued and return.
async fn drain(
    mut rx: mpsc::Receiver<SpanData>,
    exporter: opentelemetry_otlp::SpanExporter,
    dropped: Counter,
    exported: Counter,
    stop: Arc<Notify>,
) {
    let send = |batch: Vec<SpanData>| {
        let n = batch.len() as u64;
        let (exporter, dropped, exported) = (&exporter, &dropped, &exported);
        async move {
            match exporter.export(batch).await {
                Ok(()) => exported.inc_by(n),
                Err(error) => {
                    tracing::debug!(%error, spans = n, "trace export failed");
                    dropped.inc_by(n)
                }
            };
        }
    };
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let first = tokio::select! {
            span = rx.recv() => match span {
                Some(span) => span,
                None => break,
            },
            () = stop.notified() => break,
        };
        batch.push(first);
        let deadline = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) | Err(_) => break,
            }
        }
        send(std::mem::take(&mut batch)).await;
    }
    while let Ok(span) = rx.try_recv() {
        batch.push(span);
        if batch.len() == BATCH {
            send(std::mem::take(&mut batch)).await;
        }
    }
    if !batch.is_empty() {
        send(batch).await;
    }
    let _ = exporter.shutdown();
}

/// The exporter's HTTP client: the reqwest this crate already uses (the
/// exporter's own would pull a second version). Plain HTTP: send to a local
/// collector or agent, which forwards over TLS.
#[derive(Debug, Default)]
struct Client(reqwest::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Client {
    async fn send_bytes(
        &self,
        request: axum::http::Request<opentelemetry_http::Bytes>,
    ) -> Result<axum::http::Response<opentelemetry_http::Bytes>, opentelemetry_http::HttpError>
    {
        let (parts, body) = request.into_parts();
        let mut sending = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body);
        if let Some(timeout) = parts.extensions.get::<Duration>() {
            sending = sending.timeout(*timeout);
        } else {
            sending = sending.timeout(Duration::from_secs(10));
        }
        let answer = sending.send().await?;
        let status = answer.status();
        let body = answer.bytes().await?;
        let mut response = axum::http::Response::new(body);
        *response.status_mut() = status;
        Ok(response)
    }
}

/// Shared handle.
pub type SharedTelemetry = Arc<Telemetry>;
