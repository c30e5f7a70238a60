//! A plain HTTP/1.1 GET (`Connection: close`) for `/readyz` and `/metrics`
//! of programs on a host: hand-written, as a scraper would send it, so the
//! testbed needs no HTTP stack.

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// Largest answer read, bytes (a busy router's metrics fit easily).
pub const MAX_RESPONSE_BYTES: u64 = 16 * 1024 * 1024;

/// A status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// HTTP status code.
    pub status: u16,
    /// The body (chunked encoding decoded).
    pub body: String,
}

/// Sends `GET path` on `stream` and reads the whole answer.
pub(crate) async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    path: &str,
) -> Result<HttpResponse, String> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: testbed\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    (&mut stream)
        .take(MAX_RESPONSE_BYTES)
        .read_to_end(&mut raw)
        .await
        .map_err(|e| e.to_string())?;
    parse(&raw)
}

/// Parses a whole HTTP/1.1 answer.
pub(crate) fn parse(raw: &[u8]) -> Result<HttpResponse, String> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no end of headers in {} bytes", raw.len()))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_string()
    };
    Ok(HttpResponse { status, body })
}

fn dechunk(mut s: &str) -> Result<String, String> {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").ok_or("truncated chunk size")?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| format!("chunk size {size:?}: {e}"))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest.get(..size).ok_or("truncated chunk")?;
        out.push_str(chunk);
        s = rest
            .get(size..)
            .and_then(|r| r.strip_prefix("\r\n"))
            .ok_or("no chunk end")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_chunked_answers_parse() {
        let plain =
            parse(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 9\r\n\r\nnot ready")
                .expect("parse");
        assert_eq!((plain.status, plain.body.as_str()), (503, "not ready"));
        let chunked = parse(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .expect("parse");
        assert_eq!((chunked.status, chunked.body.as_str()), (200, "abcde"));
        assert!(parse(b"garbage").is_err());
    }
}
