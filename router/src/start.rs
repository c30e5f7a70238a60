//! Starting the router's long-lived tasks, one function per subsystem:
//! each takes the components it needs and spawns its tasks under their
//! names into the supervisor's set (see `crate::supervisor`). `crate::spawn`
//! calls them in order once the listeners are bound.

use std::net::SocketAddr;
use std::sync::Arc;

use agentmesh_streams::{Control, IncomingStreams};
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::catalog::ProviderQuery;
use crate::resources::slots::{SlotBudget, SlotRefusalReason};
use crate::supervisor::Tasks;
use crate::{Components, SpawnError, auth, catalog, drain, http, policy, streams, trim};

/// What every spawner shares: the components, the stream control, the
/// router-wide cancellation and the supervisor's set.
pub(crate) struct Start<'a> {
    pub(crate) c: &'a Components,
    pub(crate) control: &'a Control,
    pub(crate) cancel: &'a CancellationToken,
    pub(crate) tasks: &'a mut Tasks,
}

/// Binds the metrics listener, if one is configured, and serves `/metrics`,
/// `/readyz`, `/info` and `/drain` on it (task `http`); the bound address.
pub(crate) async fn http(
    s: &mut Start<'_>,
    registry: Arc<Registry>,
) -> Result<Option<SocketAddr>, SpawnError> {
    let c = s.c;
    let Some(addr) = c.config.metrics_addr else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| SpawnError::Metrics { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| SpawnError::Metrics { addr, source })?;
    let http = http::Http {
        config: c.config.clone(),
        metrics: c.metrics.clone(),
        readiness: c.readiness.clone(),
        drain: c.drain.clone(),
    };
    s.tasks.spawn(
        "http",
        http::serve(listener, registry, http, s.cancel.clone()),
    );
    Ok(Some(bound))
}

/// Trimming above the high watermark (task `trim`) and the drain (task
/// `drain`), both closing connections through the swarm loop's `commands`.
pub(crate) fn trim_and_drain(s: &mut Start<'_>, commands: crate::swarm::Commands) {
    let c = s.c;
    let trim = trim::Trim {
        config: c.config.watermarks,
        sizing: c.sizing,
        me: c.peer_id,
        admissions: c.admissions.clone(),
        routers: c.directory.router_set.clone(),
        drain: c.drain.clone(),
        goaways: c.goaways(),
        metrics: c.metrics.clone(),
        control: s.control.clone(),
        commands: commands.clone(),
    };
    s.tasks.spawn("trim", trim::run(trim, s.cancel.clone()));
    let drain = drain::Drain {
        config: c.config.drain,
        rpc_timeout: c.config.control_plane.rpc_timeout,
        state: c.drain.clone(),
        admissions: c.admissions.clone(),
        circuits: c.circuits.clone(),
        readiness: c.readiness.clone(),
        metrics: c.metrics.clone(),
        cp: c.cp(),
        goaways: c.goaways(),
        control: s.control.clone(),
        commands,
    };
    s.tasks.spawn("drain", drain::run(drain, s.cancel.clone()));
}

/// The auth protocol's accept loop (task `auth_accept`): a fair slot per
/// stream served, a bounded queue in front when configured; returns the
/// refusal counter it shares with the catalog's loop.
pub(crate) fn auth(s: &mut Start<'_>, incoming: IncomingStreams) -> Arc<streams::RefusedStreams> {
    let c = s.c;
    let auth = auth::server::AuthServer {
        config: c.config.clone(),
        sizing: c.sizing,
        link: c.link.clone(),
        admissions: c.admissions.clone(),
        tables: c.tables.clone(),
        resources: c.resources.clone(),
        directory: c.directory.clone(),
        goaways: c.goaways(),
        metrics: c.metrics.clone(),
        draining: c.drain.requested(),
        policy: c.policy.clone(),
    };
    let queue = (c.config.auth.queue_max_streams > 0).then(|| {
        let busy = auth.clone();
        streams::Queue {
            places: c
                .resources
                .fair_budget(SlotBudget::AuthQueue, c.config.auth.queue_max_streams),
            wait: c.config.auth.queue_wait,
            retry_after: c.config.auth.busy_retry_after,
            answer: Arc::new(move |info, stream, retry_after| {
                Box::pin(auth::server::busy(busy.clone(), info, stream, retry_after))
            }),
        }
    });
    let refusals = Arc::new(streams::RefusedStreams {
        control: s.control.clone(),
        max: c.config.auth.stranger_refused_streams_max,
        admissions: c.admissions.clone(),
        resources: c.resources.clone(),
        metrics: c.metrics.clone(),
    });
    let accept = streams::Accept {
        slots: c
            .resources
            .fair_budget(SlotBudget::Auth, c.config.auth.max_inflight_streams),
        resources: c.resources.clone(),
        queue,
        refusals: refusals.clone(),
    };
    s.tasks.spawn(
        "auth_accept",
        streams::accept_loop(
            accept,
            incoming,
            s.cancel.clone(),
            |_| Ok(()),
            move |info, stream| auth::server::serve(auth.clone(), info, stream),
        ),
    );
    refusals
}

/// The policy's push to attached members (task `policy_push`) and, when
/// enabled, its control-plane watch (task `policy_watch`).
pub(crate) fn policy(s: &mut Start<'_>) {
    let c = s.c;
    let push = policy::push::Push {
        state: c.policy.clone(),
        admissions: c.admissions.clone(),
        link: c.link.clone(),
        control: s.control.clone(),
        concurrency: c.config.policy.push_concurrency,
        deadline: c.config.policy.push_deadline,
        fallback_delay: c.config.policy.push_fallback_delay,
    };
    s.tasks
        .spawn("policy_push", policy::push::run(push, s.cancel.clone()));
    if c.config.policy.watch {
        let watch = policy::watch::Watch {
            ctx: c.policy_ctx(),
            keypair: c.keypair.clone(),
            client: c.link.client.clone(),
            backoff_max: c.config.policy.watch_backoff_max,
        };
        s.tasks
            .spawn("policy_watch", policy::watch::run(watch, s.cancel.clone()));
    }
}

/// The catalog protocol's accept loop (task `catalog_accept`); provider
/// searches go to the swarm loop through `providers`.
pub(crate) fn catalog(
    s: &mut Start<'_>,
    incoming: IncomingStreams,
    providers: mpsc::Sender<ProviderQuery>,
    refusals: Arc<streams::RefusedStreams>,
) {
    let c = s.c;
    let ctx = catalog::server::CatalogCtx {
        config: c.config.clone(),
        me: c.peer_id,
        metrics: c.metrics.clone(),
        admissions: c.admissions.clone(),
        records: c.records.clone(),
        writer: Arc::new(c.tables.clone()),
        providers,
        control: s.control.clone(),
        ownership: Arc::new(c.ownership()),
        upgrades: c.resources.clone(),
    };
    let accept = streams::Accept {
        slots: c
            .resources
            .fair_budget(SlotBudget::Catalog, c.config.catalog.max_inflight_streams),
        resources: c.resources.clone(),
        queue: None,
        refusals,
    };
    // Every catalog operation needs an admitted peer (withdraw has nothing
    // to withdraw otherwise): strangers get no catalog slot at all.
    let admitted = c.admissions.clone();
    s.tasks.spawn(
        "catalog_accept",
        streams::accept_loop(
            accept,
            incoming,
            s.cancel.clone(),
            move |info| {
                admitted
                    .read()
                    .is_admitted(&info.peer, agentmesh_proto::unix_now())
                    .then_some(())
                    .ok_or(SlotRefusalReason::NotAdmitted)
            },
            move |info, stream| catalog::server::serve(ctx.clone(), info.peer, stream),
        ),
    );
}
