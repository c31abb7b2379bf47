//! The node agent (`ebpf-portmap-agent`): a long-running process that keeps
//! the node's dataplane right between CNI calls and says how it is doing.
//!
//! - rtnetlink link and address events wake a reconciliation pass, the
//!   plugin's own (attachments, node addresses), so a new or re-created
//!   uplink carries the programs within a second;
//! - a timer runs the node GC (ownerless mappings after their grace period,
//!   stale counters, pod and fast-path records);
//! - `/metrics`, `/healthz`, `/readyz` over HTTP, on the node's loopback
//!   by default ([`http`]);
//! - the datapath's rare problems (counted by the programs) are logged,
//!   rate-limited, and each rare event the programs log through aya-log
//!   (a failed rewrite or conntrack insert, no masquerade port or address,
//!   the fast path's first packet) is drained into the agent's log with
//!   its packet ([`datapath_log`]).
//!
//! The agent is not in the data path and the plugin does not need it: a
//! node without it (podman, Nomad, plain containerd) converges at the next
//! CNI call instead. It takes the pin root's lock as the plugin does, only
//! to change something.
//!
//! Threads: the tokio event loop (one thread: the events, the timers and
//! the HTTP endpoint) and one worker thread for the blocking work
//! ([`worker`]); scrapes and readiness checks run on tokio's blocking pool.

use std::{
    net::SocketAddr,
    sync::{Arc, atomic::Ordering, mpsc},
    time::Duration,
};

pub mod datapath_log;
pub mod events;
pub mod http;
pub mod metrics;
pub mod single_flight;
pub mod worker;

use crate::ops::conf::{ConfError, ConfSource};

/// Where `/metrics`, `/healthz` and `/readyz` are served unless
/// `--listen` says otherwise: the node's loopback, which no pod reaches
/// (kube-proxy's default for its metrics too).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9965";

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Conf(#[from] ConfError),
    #[error(transparent)]
    Scope(#[from] crate::dataplane::scope::ScopeError),
    #[error(transparent)]
    Plugin(#[from] crate::verbs::PluginError),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot subscribe to rtnetlink events")]
    Subscribe(#[source] std::io::Error),
    #[error("cannot start the event loop")]
    Runtime(#[source] std::io::Error),
    #[error("cannot start the worker thread")]
    Worker(#[source] std::io::Error),
    #[error("cannot wait for signals")]
    Signals(#[source] std::io::Error),
}

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub conf: ConfSource,
    pub listen: SocketAddr,
    /// Series per mapping in `/metrics` (`--metrics-per-mapping`).
    pub per_mapping_metrics: bool,
    pub timing: worker::Timing,
}

/// Runs the agent until SIGTERM or SIGINT; returns once the worker has
/// finished its pass (a pass is never cut off halfway).
pub fn run(settings: Settings) -> Result<(), AgentError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .build()
        .map_err(AgentError::Runtime)?;
    runtime.block_on(serve(settings))
}

async fn serve(settings: Settings) -> Result<(), AgentError> {
    use tokio::signal::unix::{SignalKind, signal};

    let shared = Arc::new(worker::Shared::new(settings.conf.clone()));
    // Subscribed before the worker's first pass dumps the node: an event
    // that comes after the dump is then always seen.
    let events = events::subscribe().map_err(AgentError::Subscribe)?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|source| AgentError::Listen {
            addr: settings.listen,
            source,
        })?;
    let mut terminate = signal(SignalKind::terminate()).map_err(AgentError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(AgentError::Signals)?;

    // One slot: a pending wake-up already means "look again".
    let (wake, woken) = mpsc::sync_channel(1);
    let worker = {
        let shared = shared.clone();
        let timing = settings.timing;
        std::thread::Builder::new()
            .name("reconcile".into())
            .spawn(move || worker::run(shared, woken, timing))
            .map_err(AgentError::Worker)?
    };
    log::info!(
        "agent started: metrics on http://{}/metrics, configuration from {:?}",
        settings.listen,
        settings.conf
    );
    let watch = tokio::spawn(events::watch(events, shared.clone(), wake.clone()));
    let endpoint = Arc::new(http::Endpoint::new(
        shared.clone(),
        settings.per_mapping_metrics,
    ));
    let http = tokio::spawn(http::run(listener, endpoint));

    tokio::select! {
        _ = terminate.recv() => log::info!("SIGTERM: stopping"),
        _ = interrupt.recv() => log::info!("SIGINT: stopping"),
    }
    watch.abort();
    http.abort();
    shared.stop.store(true, Ordering::Relaxed);
    let _ = wake.try_send(());
    drop(wake);
    // The worker ends its pass and returns; bounded by the pass itself.
    let joined = tokio::task::spawn_blocking(move || worker.join()).await;
    if !matches!(joined, Ok(Ok(()))) {
        log::warn!("the worker thread did not end cleanly");
    }
    if let Some(layout) = shared
        .layout
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
    {
        crate::dataplane::agent_record::release(layout);
    }
    log::info!("agent stopped");
    Ok(())
}

/// Default of `--gc-interval`.
pub const DEFAULT_GC_INTERVAL: Duration = Duration::from_secs(60);
/// Default of `--rare-event-interval`.
pub const DEFAULT_RARE_EVENT_INTERVAL: Duration = Duration::from_secs(10);
