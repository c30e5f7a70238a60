//! The namespace tests' skip rule, shared by every test that builds hosts.

/// Whether a namespace test is skipped here (after printing `SKIPPED:`):
/// namespaces are unavailable (not root). Panics instead when they are
/// required (`AGENTMESH_REQUIRE_NETNS=1`, as `.ci/run` sets as root).
pub(crate) fn skipped(test: &str) -> bool {
    let Some(why) = agentmesh_netns::unavailable() else {
        return false;
    };
    assert!(
        !agentmesh_netns::required(),
        "{test}: {why}; {}=1 here, so the namespace tests fail rather than skip",
        agentmesh_netns::REQUIRE_ENV
    );
    eprintln!("SKIPPED: {test}: {why}");
    true
}
