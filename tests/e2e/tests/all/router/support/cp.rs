//! The control plane every router test starts (see
//! [`agentmesh_testkit::start_cp_with`]); router tests also install their
//! log subscriber here, before anything runs.

pub(crate) use agentmesh_testkit::{ADMIN, Cp};

/// Starts a control plane with default settings.
pub(crate) async fn start_cp() -> Cp {
    start_cp_with(|_| {}).await
}

/// Starts a control plane after `adjust` edits its config.
pub(crate) async fn start_cp_with(adjust: impl FnOnce(&mut agentmesh_controlplane::Config)) -> Cp {
    super::init_tracing();
    agentmesh_testkit::start_cp_with(adjust).await
}
