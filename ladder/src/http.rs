//! A raw HTTP/1.1 GET over TCP or a Unix socket, for `/readyz` and `/metrics`.
//!
//! The ladder only reads small answers from programs it started, so a
//! hand-written GET with `Connection: close` is enough and keeps a second
//! HTTP stack out of the tree.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use crate::error::{LadderError, Result};

/// Largest answer read (metrics of a busy router fit easily).
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// A status code and body.
#[derive(Debug, Clone)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The body, decoded from chunked encoding if needed.
    pub body: String,
}

/// GET `path` from `addr` within `timeout`.
pub async fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<Response> {
    let target = format!("http://{addr}{path}");
    let fut = async {
        let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        exchange(stream, path).await
    };
    run(target, timeout, fut).await
}

/// GET `path` over the Unix socket at `socket` within `timeout`.
pub async fn get_unix(socket: &Path, path: &str, timeout: Duration) -> Result<Response> {
    let target = format!("unix:{}{path}", socket.display());
    let fut = async {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|e| e.to_string())?;
        exchange(stream, path).await
    };
    run(target, timeout, fut).await
}

async fn run(
    target: String,
    timeout: Duration,
    fut: impl std::future::Future<Output = std::result::Result<Response, String>>,
) -> Result<Response> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(message)) => Err(LadderError::Http { target, message }),
        Err(_) => Err(LadderError::Http {
            target,
            message: format!("no answer within {timeout:?}"),
        }),
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    path: &str,
) -> std::result::Result<Response, String> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    (&mut stream)
        .take(MAX_RESPONSE_BYTES as u64)
        .read_to_end(&mut raw)
        .await
        .map_err(|e| e.to_string())?;
    parse(&raw)
}

fn parse(raw: &[u8]) -> std::result::Result<Response, String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no header terminator in answer")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let mut lines = head.lines();
    let status_line = lines.next().ok_or("empty answer")?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok(Response {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn dechunk(mut body: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunk size")?;
        let size_text = String::from_utf8_lossy(&body[..eol]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        body = &body[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&body[..size]);
        body = body.get(size + 2..).unwrap_or(&[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_answers() {
        let plain = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").expect("plain");
        assert_eq!((plain.status, plain.body.as_str()), (200, "ok"));
        let chunked = parse(
            b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nnot\r\n6\r\n ready\r\n0\r\n\r\n",
        )
        .expect("chunked");
        assert_eq!((chunked.status, chunked.body.as_str()), (503, "not ready"));
        assert!(parse(b"garbage").is_err());
    }

    #[tokio::test]
    async fn gets_from_a_real_listener() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
                .await;
        });
        let r = get(addr, "/readyz", Duration::from_secs(30))
            .await
            .expect("get");
        assert_eq!((r.status, r.body.as_str()), (200, "hello"));
    }
}
