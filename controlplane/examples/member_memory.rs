//! Measures what the control plane holds per member: enrolls N fresh keys
//! (each on its own HTTP/2 connection, as N member processes would), then
//! either keeps every connection open (`hold`) or closes them (`close`),
//! prints `ready` and waits for stdin to close, so the caller reads the
//! control plane's RSS (`/proc/PID/status`) in either state.
//!
//! `cargo run --release -p agentmesh-controlplane --example member_memory --
//! URL TOKEN_FILE N hold|close` (the control plane needs an enroll budget
//! for N: `--enroll-rate-per-sec`, `--enroll-burst`).

use std::time::Duration;

use agentmesh_proto::{
    identity::Keypair,
    pb::controlplane::{EnrollRequest, control_plane_client::ControlPlaneClient},
    proof::Bound,
    unix_now,
};
use tonic::transport::Endpoint;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, token_file, n, mode] = args.as_slice() else {
        return Err("usage: member_memory URL TOKEN_FILE N hold|close".into());
    };
    let token = std::fs::read_to_string(token_file)?.trim().to_string();
    let n: usize = n.parse()?;
    let hold = match mode.as_str() {
        "hold" => true,
        "close" => false,
        other => return Err(format!("mode {other:?}: hold or close").into()),
    };
    let mut held = Vec::with_capacity(if hold { n } else { 0 });
    let mut enrolled = 0usize;
    for i in 0..n {
        let ch = Endpoint::from_shared(url.clone())?
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(10))
            .connect()
            .await?;
        let mut c = ControlPlaneClient::new(ch);
        let key = Keypair::generate_ed25519();
        let mut attempts = 0;
        loop {
            let req = EnrollRequest {
                token: token.clone(),
                proof: None,
            }
            .proven(url, &key, unix_now());
            match c.enroll(req).await {
                Ok(_) => break,
                Err(s) if s.code() == tonic::Code::ResourceExhausted && attempts < 50 => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(s) => return Err(format!("member {i}: {s}").into()),
            }
        }
        enrolled += 1;
        if hold {
            held.push(c);
        }
    }
    println!("ready enrolled={enrolled} held={}", held.len());
    // Off the runtime: a blocking read until the caller closes stdin.
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink)
    })
    .await;
    drop(held);
    Ok(())
}
