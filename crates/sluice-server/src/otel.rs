//! Trace export (`[otel] endpoint`, off by default): the per-stage latency
//! trace objects already carry, as OpenTelemetry spans sent to a
//! collector over OTLP/HTTP with its JSON encoding (`POST /v1/traces`).
//!
//! One span per stage an object went through (queued at the stage's
//! dispatcher to the end of its upcall; attributes: the key, the lambda,
//! the node, queue and compute time) and one root span per traced client
//! request (from the client's send to the first stage's queue), all in
//! one trace per trace id. Span ids are derived from the trace id, the
//! hop's position and its stage, so the nodes of a cluster, each
//! exporting what it ran, build one tree with no coordination.
//!
//! The upcall thread only formats and queues a span (`try_send` on a
//! bounded channel: a full queue drops it, counted); a task of its own
//! batches spans and posts them. With no endpoint nothing is installed
//! and upcalls pay one read lock (`Engine::set_hop_sink`).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sluice_compute::{HopDone, HopSink};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Spans waiting to be sent; past this, new ones are dropped.
const QUEUE_SPANS: usize = 8192;
/// Spans per request to the collector.
const BATCH_SPANS: usize = 512;
/// How long a span waits for its batch to fill.
const FLUSH_EVERY: Duration = Duration::from_millis(500);
/// One post to the collector, connect to reply.
const POST_TIMEOUT: Duration = Duration::from_secs(2);

/// `[otel]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OtelConfig {
    /// The collector's OTLP/HTTP traces URL, e.g.
    /// "http://127.0.0.1:4318/v1/traces" (plain HTTP).
    pub endpoint: Option<String>,
    /// `service.name` of the spans (default "sluice").
    pub service_name: Option<String>,
}

/// Where spans go: host:port and path of an `http://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host_port: String,
    pub path: String,
}

impl Endpoint {
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            format!("otel.endpoint {url:?}: use an http:// URL (e.g. http://127.0.0.1:4318/v1/traces; put a collector next to the node for TLS)")
        })?;
        let (host_port, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/v1/traces"),
        };
        if host_port.is_empty() || !host_port.contains(':') {
            return Err(format!("otel.endpoint {url:?}: name host:port"));
        }
        Ok(Endpoint {
            host_port: host_port.to_string(),
            path: path.to_string(),
        })
    }
}

/// One span.
struct Span<'a> {
    trace_id: u64,
    span_id: u64,
    parent: Option<u64>,
    name: String,
    start_us: u64,
    end_us: u64,
    attrs: &'a [(&'a str, Value)],
    ok: bool,
}

/// A span as OTLP's JSON encoding writes it.
fn span(sp: Span<'_>) -> Value {
    let Span {
        trace_id,
        span_id,
        parent,
        name,
        start_us,
        end_us,
        attrs,
        ok,
    } = sp;
    let attributes: Vec<Value> = attrs
        .iter()
        .map(|(k, v)| {
            let value = match v {
                Value::Number(n) => json!({"intValue": n.to_string()}),
                Value::Bool(b) => json!({"boolValue": b}),
                other => json!({"stringValue": other.as_str().map_or_else(|| other.to_string(), str::to_string)}),
            };
            json!({"key": k, "value": value})
        })
        .collect();
    let mut s = json!({
        // 128-bit trace ids: the 64-bit id in the low half.
        "traceId": format!("{:032x}", trace_id as u128),
        "spanId": format!("{span_id:016x}"),
        "name": name,
        "kind": 1,
        "startTimeUnixNano": (start_us as u128 * 1000).to_string(),
        "endTimeUnixNano": (end_us.max(start_us) as u128 * 1000).to_string(),
        "attributes": attributes,
        "status": {"code": if ok { 1 } else { 2 }},
    });
    if let Some(p) = parent {
        s["parentSpanId"] = json!(format!("{p:016x}"));
    }
    s
}

/// A span's id: the trace, the hop's position, its stage ("" for the
/// client's request). Never 0 (an invalid span id in OTLP).
pub fn span_id(trace_id: u64, position: usize, stage: &str) -> u64 {
    let mut b = Vec::with_capacity(16 + stage.len());
    b.extend_from_slice(&trace_id.to_le_bytes());
    b.extend_from_slice(&(position as u64).to_le_bytes());
    b.extend_from_slice(stage.as_bytes());
    sluice_types::fnv1a64(&b).max(1)
}

/// The spans one finished upcall adds: its own and, for the first stage,
/// the client request's root span.
pub fn spans_of(h: &HopDone<'_>) -> Vec<Value> {
    let t = h.trace;
    let n = t.hops.len();
    let mut out = Vec::with_capacity(2);
    let root = span_id(t.id, 0, "");
    let parent = match t.hops.last() {
        Some(prev) => span_id(t.id, n, &prev.stage),
        None => {
            out.push(span(Span {
                trace_id: t.id,
                span_id: root,
                parent: None,
                name: format!("put {}", h.key),
                start_us: t.client_sent_us,
                end_us: h.enqueued_us,
                attrs: &[("sluice.key", json!(h.key))],
                ok: true,
            }));
            root
        }
    };
    out.push(span(Span {
        trace_id: t.id,
        span_id: span_id(t.id, n + 1, h.stage),
        parent: Some(parent),
        name: h.stage.to_string(),
        start_us: h.enqueued_us,
        end_us: h.finished_us,
        attrs: &[
            ("sluice.key", json!(h.key)),
            ("sluice.udl", json!(h.udl)),
            ("sluice.node", json!(h.node_id)),
            (
                "sluice.queue_us",
                json!(h.started_us.saturating_sub(h.enqueued_us)),
            ),
            (
                "sluice.compute_us",
                json!(h.finished_us.saturating_sub(h.started_us)),
            ),
        ],
        ok: h.ok,
    }));
    out
}

/// The exporter: the engine's `HopSink`, and the task that posts.
pub struct Exporter {
    tx: mpsc::Sender<Value>,
    pub dropped: AtomicU64,
    pub sent: Arc<AtomicU64>,
}

impl Exporter {
    /// Starts the posting task (inside a tokio runtime).
    pub fn start(cfg: &OtelConfig, node_id: u32) -> Result<Option<Arc<Exporter>>, String> {
        let Some(url) = &cfg.endpoint else {
            return Ok(None);
        };
        let ep = Endpoint::parse(url)?;
        let service = cfg.service_name.clone().unwrap_or_else(|| "sluice".into());
        let (tx, rx) = mpsc::channel(QUEUE_SPANS);
        let sent = Arc::new(AtomicU64::new(0));
        tokio::spawn(post_loop(ep, service, node_id, rx, sent.clone()));
        Ok(Some(Arc::new(Exporter {
            tx,
            dropped: AtomicU64::new(0),
            sent,
        })))
    }
}

impl HopSink for Exporter {
    fn on_hop(&self, hop: &HopDone<'_>) {
        for s in spans_of(hop) {
            if self.tx.try_send(s).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The OTLP request body for `spans`.
pub fn body(service: &str, node_id: u32, spans: Vec<Value>) -> Value {
    json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": service}},
            {"key": "service.instance.id", "value": {"stringValue": format!("node-{node_id}")}},
        ]},
        "scopeSpans": [{"scope": {"name": "sluice"}, "spans": spans}],
    }]})
}

async fn post_loop(
    ep: Endpoint,
    service: String,
    node_id: u32,
    mut rx: mpsc::Receiver<Value>,
    sent: Arc<AtomicU64>,
) {
    let mut last_warned: Option<std::time::Instant> = None;
    loop {
        let Some(first) = rx.recv().await else { return };
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + FLUSH_EVERY;
        while batch.len() < BATCH_SPANS {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(s)) => batch.push(s),
                Ok(None) | Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        let text = body(&service, node_id, batch).to_string();
        match tokio::time::timeout(POST_TIMEOUT, post(&ep, &text)).await {
            Ok(Ok(())) => {
                sent.fetch_add(n, Ordering::Relaxed);
            }
            Ok(Err(e)) => warn_rarely(&mut last_warned, &ep, &e, n),
            Err(_) => warn_rarely(&mut last_warned, &ep, "timed out", n),
        }
    }
}

/// A collector that is down costs one warning a minute, not one a batch.
fn warn_rarely(last: &mut Option<std::time::Instant>, ep: &Endpoint, e: &str, n: u64) {
    if last.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
        tracing::warn!(collector = %ep.host_port, error = %e, spans = n, "trace export failed; spans dropped (warned once a minute)");
        *last = Some(std::time::Instant::now());
    }
}

/// One HTTP/1.1 POST; `Ok` on a 2xx status.
async fn post(ep: &Endpoint, body: &str) -> Result<(), String> {
    let mut s = tokio::net::TcpStream::connect(&ep.host_port)
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let req = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        ep.path,
        ep.host_port,
        body.len()
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("sending: {e}"))?;
    let mut head = [0u8; 64];
    let n = s
        .read(&mut head)
        .await
        .map_err(|e| format!("reading the reply: {e}"))?;
    let line = String::from_utf8_lossy(&head[..n]);
    match line.split_whitespace().nth(1) {
        Some(code) if code.starts_with('2') => Ok(()),
        other => Err(format!(
            "collector answered {:?}",
            other.unwrap_or("nothing")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_types::{Hop, Trace};

    fn hop<'a>(t: &'a Trace, stage: &'a str) -> HopDone<'a> {
        HopDone {
            trace: t,
            stage,
            udl: "relay",
            key: "/in/k",
            enqueued_us: 1_000_100,
            started_us: 1_000_110,
            finished_us: 1_000_150,
            ok: true,
            node_id: 3,
        }
    }

    #[test]
    fn endpoints_parse_with_clear_errors() {
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:4318/v1/traces").unwrap(),
            Endpoint {
                host_port: "127.0.0.1:4318".into(),
                path: "/v1/traces".into()
            }
        );
        assert_eq!(Endpoint::parse("http://h:1").unwrap().path, "/v1/traces");
        assert!(Endpoint::parse("https://h:1/v1/traces")
            .unwrap_err()
            .contains("http://"));
        assert!(Endpoint::parse("http:///x").is_err());
    }

    #[test]
    fn stages_chain_under_the_clients_root_span() {
        let mut t = Trace {
            id: 0xabc,
            client_sent_us: 1_000_000,
            hops: vec![],
            emit_depth: 0,
        };
        // The first stage: the root span and its own, a child of it.
        let first = spans_of(&hop(&t, "/in"));
        assert_eq!(first.len(), 2);
        let root = &first[0];
        assert!(root.get("parentSpanId").is_none());
        assert_eq!(root["traceId"], format!("{:032x}", 0xabc));
        assert_eq!(root["startTimeUnixNano"], "1000000000");
        assert_eq!(first[1]["parentSpanId"], root["spanId"]);
        assert_eq!(first[1]["name"], "/in");
        assert_eq!(first[1]["endTimeUnixNano"], "1000150000");
        // The second stage (on any node): a child of the first stage.
        t.hops.push(Hop {
            stage: "/in".into(),
            enqueued_us: 1_000_100,
            started_us: 1_000_110,
            emitted_us: 1_000_140,
        });
        let second = spans_of(&hop(&t, "/mid"));
        assert_eq!(second.len(), 1);
        assert_eq!(second[0]["parentSpanId"], first[1]["spanId"]);
        assert_ne!(second[0]["spanId"], first[1]["spanId"]);
        let attrs = second[0]["attributes"].to_string();
        assert!(
            attrs.contains("sluice.queue_us") && attrs.contains("\"10\""),
            "{attrs}"
        );
    }

    #[tokio::test]
    async fn spans_reach_a_collector_as_otlp_json() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let collector = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // Read until the whole body (Content-Length) is in.
            loop {
                let n = s.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some(i) = text.find("\r\n\r\n") {
                    let len: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .unwrap()
                        .trim()
                        .parse()
                        .unwrap();
                    if buf.len() >= i + 4 + len {
                        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                            .await
                            .unwrap();
                        return (text[..i].to_string(), text[i + 4..].to_string());
                    }
                }
            }
        });
        let cfg = OtelConfig {
            endpoint: Some(format!("http://{addr}/v1/traces")),
            service_name: Some("test".into()),
        };
        let ex = Exporter::start(&cfg, 7).unwrap().unwrap();
        let t = Trace {
            id: 42,
            client_sent_us: 1_000_000,
            hops: vec![],
            emit_depth: 0,
        };
        ex.on_hop(&hop(&t, "/in"));
        let (head, body) = collector.await.unwrap();
        assert!(head.starts_with("POST /v1/traces HTTP/1.1"), "{head}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let rs = &v["resourceSpans"][0];
        assert!(rs["resource"].to_string().contains("\"test\""));
        let spans = rs["scopeSpans"][0]["spans"].as_array().unwrap();
        assert_eq!(spans.len(), 2);
        assert!(spans.iter().all(|s| s["traceId"] == format!("{:032x}", 42)));
        // Counted once the collector said 2xx.
        for _ in 0..200 {
            if ex.sent.load(Ordering::Relaxed) == 2 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the exporter did not count the spans sent");
    }
}
