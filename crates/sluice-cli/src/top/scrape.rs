//! Reading a node's `/metrics` (Prometheus text format, as the node's
//! exporter writes it): one HTTP GET, then the samples.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// One sample: a series' name, its labels and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, k: &str) -> &str {
        self.labels.get(k).map(String::as_str).unwrap_or("")
    }
}

/// A scrape's response is at most this big (a node with thousands of
/// series writes well under 1 MiB).
const SCRAPE_BYTES_MAX: u64 = 16 << 20;

/// `GET /metrics` from `addr` (host:port), within `timeout`.
pub fn fetch(addr: &str, timeout: Duration) -> Result<String> {
    let sa = addr
        .to_socket_addrs()
        .with_context(|| format!("metrics address {addr:?}"))?
        .next()
        .ok_or_else(|| anyhow!("metrics address {addr:?} resolves to nothing"))?;
    let mut s = TcpStream::connect_timeout(&sa, timeout).with_context(|| {
        format!("connecting to {addr} for /metrics (is the node started with --metrics {addr}?)")
    })?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    if let Err(e) = s.take(SCRAPE_BYTES_MAX).read_to_end(&mut raw) {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            bail!(
                "no answer to GET /metrics within {timeout:?} (is the node paused, stopped or overloaded?)"
            );
        }
        return Err(e).with_context(|| format!("reading /metrics from {addr}"));
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("{addr}: not an HTTP response"))?;
    let status = head.lines().next().unwrap_or("");
    if !status.contains(" 200") {
        bail!("{addr}/metrics answered {status:?}");
    }
    if head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    }) {
        return Ok(dechunk(body));
    }
    Ok(body.to_string())
}

/// The body of a chunked HTTP/1.1 response.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The samples of a Prometheus text exposition (comments skipped; a line
/// that does not parse is skipped too, so one odd series cannot hide the
/// rest).
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let mut labels = BTreeMap::new();
    let rest = if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices();
        let end;
        loop {
            // key
            let start = chars.clone().next()?.0;
            let (eq, _) = chars.by_ref().find(|&(_, c)| c == '=')?;
            let key = r[start..eq].trim_start_matches(',').trim().to_string();
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut val = String::new();
            loop {
                match chars.next()?.1 {
                    '\\' => match chars.next()?.1 {
                        'n' => val.push('\n'),
                        c => val.push(c),
                    },
                    '"' => break,
                    c => val.push(c),
                }
            }
            labels.insert(key, val);
            match chars.next()? {
                (i, '}') => {
                    end = i;
                    break;
                }
                (_, ',') => {
                    if let Some((i, '}')) = chars.clone().next() {
                        chars.next();
                        end = i;
                        break;
                    }
                }
                _ => return None,
            }
        }
        &r[end + 1..]
    } else {
        rest
    };
    let value = match rest.split_whitespace().next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_and_without_labels_escapes_and_infinities() {
        let text = "# HELP x y\n# TYPE a counter\na 3\n\
            b{op=\"put\",pool=\"/vol\"} 1.5\n\
            c_bucket{op=\"get\",le=\"+Inf\"} 7\n\
            d{v=\"say \\\"hi\\\"\\\\\",} 2\n\
            broken{op=\"x} 1\n\
            e{le=\"0.001\"} +Inf\n";
        let s = parse(text);
        assert_eq!(s.len(), 5, "{s:?}");
        assert_eq!((s[0].name.as_str(), s[0].value), ("a", 3.0));
        assert_eq!(s[1].label("op"), "put");
        assert_eq!(s[1].label("pool"), "/vol");
        assert_eq!(s[1].value, 1.5);
        assert_eq!(s[2].label("le"), "+Inf");
        assert_eq!(s[3].label("v"), "say \"hi\"\\");
        assert_eq!(s[4].value, f64::INFINITY);
    }

    /// A node that accepts and never answers (paused: SIGSTOP) is said to
    /// be silent, within the timeout (it was "Resource temporarily
    /// unavailable (os error 11)").
    #[test]
    fn a_silent_endpoint_is_said_to_be_silent() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let e = fetch(&addr, Duration::from_millis(200)).unwrap_err();
        assert!(
            format!("{e:#}").contains("no answer to GET /metrics within 200ms (is the node paused"),
            "{e:#}"
        );
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(dechunk("4\r\nab\nc\r\n3\r\nd 1\r\n0\r\n\r\n"), "ab\ncd 1");
    }
}
