//! The control plane every router test starts: real gRPC on loopback port
//! 0, SQLite in a temp dir, an admin token for minting tokens.

use std::collections::BTreeMap;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig};
use agentmesh_proto::credential::map_to_labels;
use agentmesh_proto::pb::controlplane::CreateTokenRequest;
use agentmesh_proto::pb::credential::{Credential, Role, TokenKind};
use libp2p::identity::Keypair;

/// The admin bearer token of test control planes.
pub(crate) const ADMIN: &str = "test-admin-token-0123456789abcdef";

/// A control plane on loopback with its SQLite file in a temp dir.
pub(crate) struct Cp {
    pub(crate) handle: agentmesh_controlplane::Handle,
    pub(crate) url: String,
    pub(crate) client: Client,
    _dir: tempfile::TempDir,
}

/// Starts a control plane with default settings.
pub(crate) async fn start_cp() -> Cp {
    start_cp_with(|_| {}).await
}

/// Starts a control plane after `adjust` edits its config.
pub(crate) async fn start_cp_with(adjust: impl FnOnce(&mut agentmesh_controlplane::Config)) -> Cp {
    super::init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = agentmesh_controlplane::Config {
        grpc_addr: "127.0.0.1:0".parse().expect("addr"),
        http_addr: "127.0.0.1:0".parse().expect("addr"),
        db: format!("sqlite://{}", dir.path().join("cp.db").display()),
        admin_token: Some(ADMIN.to_string()),
        ..Default::default()
    };
    adjust(&mut config);
    let handle = agentmesh_controlplane::spawn(config)
        .await
        .expect("control plane");
    let url = handle.public_url().to_string();
    let client = Client::new(ClientConfig {
        url: url.clone(),
        ca_pem: None,
        retry_budget: Duration::from_secs(30),
        rpc_timeout: Duration::from_secs(10),
    })
    .expect("client");
    Cp {
        handle,
        url,
        client,
        _dir: dir,
    }
}

impl Cp {
    /// A bootstrap token of `role` without labels (100 uses, 1 h).
    pub(crate) async fn token(&self, role: Role) -> String {
        self.token_labelled(role, &BTreeMap::new()).await
    }

    /// A bootstrap token of `role` whose members get `labels`.
    pub(crate) async fn token_labelled(
        &self,
        role: Role,
        labels: &BTreeMap<String, String>,
    ) -> String {
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
    pub(crate) async fn enroll(&self, token: &str, key: &Keypair) -> Credential {
        self.client
            .enroll(token, key)
            .await
            .expect("enroll")
            .credential
            .expect("credential")
    }

    /// Enrolls `key` as a member.
    pub(crate) async fn member_credential(&self, key: &Keypair) -> Credential {
        let token = self.token(Role::Member).await;
        self.enroll(&token, key).await
    }
}
