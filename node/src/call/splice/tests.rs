//! The splice on in-memory pipes with paused time: what ends a call, and
//! what keeps it alive.

use std::sync::atomic::AtomicUsize;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream, duplex};

use super::*;

const IDLE: Duration = Duration::from_secs(10);

/// The caller's end and the splice's end of a call stream, and the
/// splice's end and the backend's end of the local connection.
struct Pipes {
    caller: DuplexStream,
    stream: DuplexStream,
    local: DuplexStream,
    backend: DuplexStream,
}

fn pipes() -> Pipes {
    let (caller, stream) = duplex(1024);
    let (local, backend) = duplex(1024);
    Pipes {
        caller,
        stream,
        local,
        backend,
    }
}

fn never() -> impl Future<Output = &'static str> {
    std::future::pending()
}

async fn run(
    stream: &mut DuplexStream,
    local: &mut DuplexStream,
    closed: &ConnectionClosed,
    idle: Option<Duration>,
    stop: impl Future<Output = &'static str>,
) -> Outcome {
    let on_activity = || {};
    let limits = Limits {
        buffer: 64,
        idle,
        closed,
        on_activity: &on_activity,
    };
    splice(stream, local, limits, stop).await
}

#[tokio::test(start_paused = true)]
async fn a_call_silent_both_ways_ends_at_the_idle_deadline() {
    let Pipes {
        caller: _caller,
        mut stream,
        mut local,
        backend: _backend,
    } = pipes();
    let closed = ConnectionClosed::unattached();
    let start = Instant::now();
    let out = run(&mut stream, &mut local, &closed, Some(IDLE), never()).await;
    assert_eq!(out.end, End::IdleTimeout);
    assert_eq!(out.end.label(), "idle_timeout");
    assert!(start.elapsed() >= IDLE, "{:?}", start.elapsed());
}

/// A byte every 6 s for 30 s keeps a call with a 10 s deadline alive (in
/// either direction); it ends 10 s after the last.
#[tokio::test(start_paused = true)]
async fn bytes_either_way_push_the_deadline_on() {
    let Pipes {
        mut caller,
        mut stream,
        mut local,
        mut backend,
    } = pipes();
    let closed = ConnectionClosed::unattached();
    let start = Instant::now();
    let traffic = async move {
        for n in 0..5u8 {
            tokio::time::sleep(Duration::from_secs(6)).await;
            if n % 2 == 0 {
                caller.write_all(&[n]).await.expect("caller writes");
                let mut b = [0u8; 1];
                backend.read_exact(&mut b).await.expect("backend reads");
            } else {
                backend.write_all(&[n]).await.expect("backend writes");
                let mut b = [0u8; 1];
                caller.read_exact(&mut b).await.expect("caller reads");
            }
        }
        (caller, backend)
    };
    let (out, _ends) = tokio::join!(
        run(&mut stream, &mut local, &closed, Some(IDLE), never()),
        traffic
    );
    assert_eq!(out.end, End::IdleTimeout);
    assert_eq!((out.from_stream, out.to_stream), (3, 2));
    assert!(start.elapsed() >= Duration::from_secs(30) + IDLE);
}

#[tokio::test(start_paused = true)]
async fn without_a_deadline_only_the_connection_ends_a_silent_call() {
    let Pipes {
        mut caller,
        mut stream,
        mut local,
        backend: _backend,
    } = pipes();
    let closed = ConnectionClosed::unattached();
    // The caller half-closes: the splice no longer reads its stream, and
    // the backend never answers.
    caller.shutdown().await.expect("half-close");
    let fire = async {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        closed.fire();
    };
    let (out, ()) = tokio::join!(run(&mut stream, &mut local, &closed, None, never()), fire);
    assert_eq!(out.end, End::ConnectionClosed);
    assert_eq!(out.end.label(), "connection_closed");
}

#[tokio::test(start_paused = true)]
async fn a_closed_connection_ends_the_call_at_once() {
    let Pipes {
        caller: _caller,
        mut stream,
        mut local,
        backend: _backend,
    } = pipes();
    let closed = ConnectionClosed::unattached();
    closed.fire();
    let start = Instant::now();
    let out = run(&mut stream, &mut local, &closed, Some(IDLE), never()).await;
    assert_eq!(out.end, End::ConnectionClosed);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn the_holder_stops_it_with_its_reason() {
    let Pipes {
        caller: _caller,
        mut stream,
        mut local,
        backend: _backend,
    } = pipes();
    let closed = ConnectionClosed::unattached();
    let stop = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        "preempted"
    };
    let out = run(&mut stream, &mut local, &closed, Some(IDLE), stop).await;
    assert_eq!(out.end, End::Stopped("preempted"));
    assert_eq!(out.end.label(), "preempted");
}

#[tokio::test(start_paused = true)]
async fn both_sides_done_is_finished_with_the_bytes_counted() {
    let Pipes {
        mut caller,
        mut stream,
        mut local,
        mut backend,
    } = pipes();
    let closed = ConnectionClosed::unattached();
    let ends = async move {
        caller.write_all(b"ping").await.expect("write");
        caller.shutdown().await.expect("half-close");
        let mut got = Vec::new();
        backend.read_to_end(&mut got).await.expect("backend reads");
        backend.write_all(b"pong!").await.expect("answer");
        backend.shutdown().await.expect("close");
        let mut back = Vec::new();
        caller.read_to_end(&mut back).await.expect("caller reads");
        (got, back)
    };
    let (out, (got, back)) = tokio::join!(
        run(&mut stream, &mut local, &closed, Some(IDLE), never()),
        ends
    );
    assert_eq!(out.end, End::Finished);
    assert_eq!(
        (got.as_slice(), back.as_slice()),
        (&b"ping"[..], &b"pong!"[..])
    );
    assert_eq!((out.from_stream, out.to_stream), (4, 5));
}

/// A stream that fails is counted as its connection closing only if the
/// connection's signal comes (within the settle bound).
#[tokio::test(start_paused = true)]
async fn a_failed_stream_settles_by_its_connections_signal() {
    for connection_goes in [false, true] {
        let Pipes {
            caller,
            mut stream,
            mut local,
            mut backend,
        } = pipes();
        let closed = ConnectionClosed::unattached();
        // The caller's end is gone: what the backend sends cannot be written.
        drop(caller);
        backend.write_all(b"late").await.expect("backend writes");
        let out = run(&mut stream, &mut local, &closed, Some(IDLE), never()).await;
        assert_eq!(out.end, End::StreamFailed);
        assert!(out.error.is_some());
        if connection_goes {
            closed.fire();
        }
        let settled = out.settle(&closed).await;
        let want = if connection_goes {
            End::ConnectionClosed
        } else {
            End::StreamError
        };
        assert_eq!(settled.end, want);
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_local_side_is_a_local_error() {
    let Pipes {
        mut caller,
        mut stream,
        mut local,
        backend,
    } = pipes();
    let closed = ConnectionClosed::unattached();
    drop(backend);
    caller.write_all(b"to nobody").await.expect("caller writes");
    let out = run(&mut stream, &mut local, &closed, Some(IDLE), never()).await;
    assert_eq!(out.end, End::LocalError);
    let settled = out.settle(&closed).await;
    assert_eq!(settled.end.label(), "local_error");
}

#[tokio::test(start_paused = true)]
async fn every_transfer_is_reported() {
    let Pipes {
        mut caller,
        mut stream,
        mut local,
        mut backend,
    } = pipes();
    let closed = ConnectionClosed::unattached();
    let seen = AtomicUsize::new(0);
    let on_activity = || {
        seen.fetch_add(1, Ordering::Relaxed);
    };
    let ends = async move {
        caller.write_all(b"x").await.expect("write");
        caller.shutdown().await.expect("half-close");
        let mut got = Vec::new();
        backend.read_to_end(&mut got).await.expect("read");
        backend.shutdown().await.expect("close");
        (caller, backend)
    };
    let limits = Limits {
        buffer: 64,
        idle: Some(IDLE),
        closed: &closed,
        on_activity: &on_activity,
    };
    let (out, _ends) = tokio::join!(splice(&mut stream, &mut local, limits, never()), ends);
    assert_eq!(out.end, End::Finished);
    // One read from the stream and one write to the local side.
    assert_eq!(seen.load(Ordering::Relaxed), 2);
}
