//! The change listener: `LISTEN agentmesh_changes` on a connection of its
//! own, its messages polled here.
//!
//! Never a pooled connection: a pool spawns each connection's future, and
//! that future drops notifications; and a pooled connection goes back to
//! others between uses, ending the LISTEN with it. TCP keepalive comes with
//! the options (as the pool's), so a server that vanished silently ends
//! this connection within about half a minute and the caller reconnects.

use futures::future::poll_fn;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::{AsyncMessage, Client, Connection, NoTls};

use super::{PgOptions, Tls};
use crate::store::{Change, StoreError};

/// The channel the migration's triggers notify.
const CHANNEL: &str = "agentmesh_changes";

pub(super) async fn listen(
    opts: &PgOptions,
    on_change: &(dyn Fn(Change) + Send + Sync),
) -> Result<(), StoreError> {
    match &opts.tls {
        Tls::Disable => {
            let (client, conn) = opts.config.connect(NoTls).await?;
            drive(client, conn, on_change).await
        }
        Tls::Verify(path) => {
            let (client, conn) = opts.config.connect(PgOptions::rustls(path)?).await?;
            drive(client, conn, on_change).await
        }
    }
}

/// Issues the LISTEN while polling the connection, says [`Change::All`]
/// once it is in place, then hands every notification to `on_change`
/// until the connection ends.
async fn drive<S, T>(
    client: Client,
    mut conn: Connection<S, T>,
    on_change: &(dyn Fn(Change) + Send + Sync),
) -> Result<(), StoreError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    let statement = format!("LISTEN {CHANNEL}");
    let listen = client.batch_execute(&statement);
    tokio::pin!(listen);
    let mut listening = false;
    loop {
        tokio::select! {
            done = &mut listen, if !listening => {
                done?;
                listening = true;
                on_change(Change::All);
            }
            msg = poll_fn(|cx| conn.poll_message(cx)) => match msg {
                Some(Ok(AsyncMessage::Notification(n))) if n.channel() == CHANNEL => {
                    on_change(Change::from_payload(n.payload()).unwrap_or(Change::All));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => {
                    return Err(StoreError::Query(
                        "the change listener's connection closed".into(),
                    ))
                }
            },
        }
    }
}
