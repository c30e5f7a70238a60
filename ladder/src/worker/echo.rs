//! The echo backend providers expose: a TCP listener that writes back what it reads.

use std::net::SocketAddr;

use tokio::net::TcpListener;

/// Binds 127.0.0.1:0 and echoes every connection until it closes; returns the address.
pub(crate) async fn spawn_echo() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((mut stream, _)) => {
                    tokio::spawn(async move {
                        let (mut r, mut w) = stream.split();
                        let _ = tokio::io::copy(&mut r, &mut w).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "echo accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn echoes() {
        let addr = spawn_echo().await.expect("echo");
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"ping").await.expect("write");
        let mut back = [0u8; 4];
        s.read_exact(&mut back).await.expect("read");
        assert_eq!(&back, b"ping");
    }
}
