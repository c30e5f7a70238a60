//! The worker process speaks the coordinator protocol: the real
//! `agentmesh-ladder worker` binary answers every command on stdout as JSON
//! lines, reports ticks, and exits after `leave`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command as Process, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use agentmesh_ladder::wire::{Command, Event, Reply};

/// Generous deadline for any one line from the worker.
const LINE_DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn worker_answers_commands_and_leaves() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let token = dir.path().join("token");
    std::fs::write(&token, "unused")?;
    let mut child = Process::new(env!("CARGO_BIN_EXE_agentmesh-ladder"))
        .arg("worker")
        .args(["--control-plane", "http://127.0.0.1:9"])
        .arg("--token-file")
        .arg(&token)
        .arg("--data-dir")
        .arg(dir.path().join("w0"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().expect("stdin piped");
    let stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = mpsc::sync_channel::<Event>(1024);
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let ev: Event = serde_json::from_str(&line).expect("every stdout line is an event");
            if tx.send(ev).is_err() {
                return;
            }
        }
    });
    // A malformed line is skipped, not fatal.
    writeln!(stdin, "not json")?;
    let mut send = |cmd: Command| -> anyhow::Result<()> {
        writeln!(stdin, "{}", serde_json::to_string(&cmd)?)?;
        stdin.flush()?;
        Ok(())
    };
    let wait_reply = |id: u64| -> anyhow::Result<Reply> {
        loop {
            match rx.recv_timeout(LINE_DEADLINE)? {
                Event::Reply { id: got, body } if got == id => return Ok(body),
                _ => {}
            }
        }
    };

    send(Command::HoldStart { id: 1 })?;
    assert_eq!(wait_reply(1)?, Reply::Done);
    // Ticks arrive every second even with no members.
    let tick = loop {
        if let Event::Tick(t) = rx.recv_timeout(LINE_DEADLINE)? {
            break t;
        }
    };
    assert_eq!((tick.alive, tick.ready), (0, 0));
    assert!(tick.fds > 0);
    send(Command::Mark {
        id: 2,
        name: "test".into(),
    })?;
    assert_eq!(wait_reply(2)?, Reply::Done);
    send(Command::WindowReport { id: 3 })?;
    match wait_reply(3)? {
        Reply::Window(w) => assert_eq!((w.members, w.calls_ok, w.calls_failed), (0, 0, 0)),
        other => panic!("expected a window report, got {other:?}"),
    }
    send(Command::HoldReport { id: 4 })?;
    match wait_reply(4)? {
        Reply::Hold(h) => assert_eq!((h.flaps, h.exits), (0, 0)),
        other => panic!("expected a hold report, got {other:?}"),
    }
    send(Command::Leave { id: 5 })?;
    assert_eq!(wait_reply(5)?, Reply::Done);
    let deadline = std::time::Instant::now() + LINE_DEADLINE;
    loop {
        if let Some(status) = child.try_wait()? {
            assert!(status.success(), "worker exited with {status}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "worker did not exit after leave"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
