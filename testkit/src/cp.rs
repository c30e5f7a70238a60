//! The control plane every test starts: real gRPC on loopback port 0,
//! SQLite in a temp dir, an admin token for minting bootstrap tokens, the
//! allow-all policy (tests that need another apply it, or start with
//! `policy` set and `policy_allow_all` cleared).

use std::collections::BTreeMap;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig, Connections};
use agentmesh_proto::credential::map_to_labels;
use agentmesh_proto::pb::controlplane::CreateTokenRequest;
use agentmesh_proto::pb::credential::{Credential, Role, TokenKind};
use libp2p::identity::Keypair;

/// The admin bearer token of test control planes (tests revoke and mint with it).
pub const ADMIN: &str = "test-admin-token-0123456789abcdef";

/// A control plane on loopback with its SQLite file in a temp dir that is
/// removed when this is dropped.
pub struct Cp {
    /// The running control plane.
    pub handle: agentmesh_controlplane::Handle,
    /// Its gRPC URL, as routers and nodes are configured with it: its
    /// `--public-url`, which a test may set to a name that does not
    /// answer (then routers and nodes need `endpoints`, see
    /// [`Cp::endpoint`]).
    pub url: String,
    /// A client for admin calls and enrollment.
    pub client: Client,
    _dir: tempfile::TempDir,
}

/// Starts a control plane with default settings.
pub async fn start_cp() -> Cp {
    start_cp_with(|_| {}).await
}

/// Starts a control plane after `adjust` edits its config (addresses,
/// database and admin token are set first; `adjust` may override them).
pub async fn start_cp_with(adjust: impl FnOnce(&mut agentmesh_controlplane::Config)) -> Cp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = agentmesh_controlplane::Config {
        grpc_addr: "127.0.0.1:0".parse().expect("addr"),
        http_addr: "127.0.0.1:0".parse().expect("addr"),
        db: format!("sqlite://{}", dir.path().join("cp.db").display()),
        admin_token: Some(ADMIN.to_string()),
        // Every member may provide and call every service unless a test
        // applies its own policy (`adjust` may set `policy` instead; then
        // clear this).
        policy_allow_all: true,
        ..Default::default()
    };
    adjust(&mut config);
    let handle = agentmesh_controlplane::spawn(config)
        .await
        .expect("control plane");
    let url = handle.public_url().to_string();
    // Dials the address it listens on, whatever its public URL says.
    let client = Client::with_endpoints(
        ClientConfig {
            url: url.clone(),
            ca_pem: None,
            retry_budget: Duration::from_secs(30),
            rpc_timeout: Duration::from_secs(10),
        },
        Connections::Held,
        &[endpoint_of(&handle)],
    )
    .expect("client");
    Cp {
        handle,
        url,
        client,
        _dir: dir,
    }
}

/// The address `handle` listens on, as a URL to dial.
fn endpoint_of(handle: &agentmesh_controlplane::Handle) -> String {
    format!("http://{}", handle.grpc_addr())
}

impl Cp {
    /// The address it listens on, as an endpoint to dial
    /// (`--control-plane-endpoint`).
    pub fn endpoint(&self) -> String {
        endpoint_of(&self.handle)
    }

    /// A bootstrap token of `role` without labels (100 uses, 1 h).
    pub async fn token(&self, role: Role) -> String {
        self.token_labelled(role, &BTreeMap::new()).await
    }

    /// A bootstrap token of `role` whose members get `labels` (100 uses, 1 h).
    pub async fn token_labelled(&self, role: Role, labels: &BTreeMap<String, String>) -> String {
        self.client
            .create_token(
                ADMIN,
                CreateTokenRequest {
                    kind: TokenKind::Bootstrap as i32,
                    role: role as i32,
                    labels: map_to_labels(labels),
                    max_uses: 100,
                    ttl_secs: 3600,
                },
            )
            .await
            .expect("create token")
            .token
    }

    /// Enrolls `key` with `token` and returns its credential.
    pub async fn enroll(&self, token: &str, key: &Keypair) -> Credential {
        self.client
            .enroll(token, key)
            .await
            .expect("enroll")
            .credential
            .expect("credential")
    }

    /// Rotates the signing key and enrolls `key` as a member until the
    /// credential is signed by the new key: a credential a router that
    /// synced its keys before the rotation does not hold the key for.
    /// `started` is a Unix second before the first key was loaded: the new
    /// key must activate in a later second to sign first.
    pub async fn credential_from_a_new_key(&self, key: &Keypair, started: i64) -> Credential {
        crate::eventually("the clock moves past the first key's second", || async {
            (agentmesh_proto::unix_now() > started).then_some(())
        })
        .await;
        let rotated = self.client.rotate_key_now(ADMIN).await.expect("rotate");
        let token = self.token(Role::Member).await;
        crate::eventually("a credential signed by the new key", || async {
            let c = self.enroll(&token, key).await;
            let claims = agentmesh_proto::credential::peek_claims(&c).expect("claims");
            (claims.key_id == rotated.key_id).then_some(c)
        })
        .await
    }

    /// Enrolls `key` as a member (with a fresh member token).
    pub async fn member_credential(&self, key: &Keypair) -> Credential {
        let token = self.token(Role::Member).await;
        self.enroll(&token, key).await
    }
}
