//! Any bytes given as a credential must be refused or accepted, never panic.
#![no_main]

use agentmesh_proto::credential::{Trust, decode_credential, verify};
use agentmesh_proto::pb::credential::Credential;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let trust = Trust::default();
    if let Ok(cred) = decode_credential(data) {
        let _ = verify(&cred, &trust, 0, None, 60);
    }
    let split = data.len() / 2;
    let cred = Credential {
        claims: data[..split].to_vec(),
        signature: data[split..].to_vec(),
    };
    let _ = verify(&cred, &trust, 0, None, 60);
    let _ = agentmesh_proto::credential::peek_claims(&cred);
});
