//! The agent's one worker thread: every blocking call (bpf syscalls, the
//! pin root's lock, rtnetlink dumps) runs here, off the event loop.
//!
//! It waits for a wake-up from the rtnetlink watcher, at most a second, and
//! then: runs a reconciliation pass if anything happened (wake-ups that
//! arrived meanwhile are folded into the one pass); runs the node GC when
//! its interval is up; reads the datapath's problem counters for the
//! rare-event log, and drains the events the programs logged
//! ([`super::datapath_log`]); and beats the heart `/healthz` looks at.
//!
//! A pass is the plugin's own reconciliation ([`verbs::reconcile`], what
//! every DEL and GC run does), so it takes the pin root's lock only to
//! change something (an attachment to make or drop, node state to write):
//! a few milliseconds, between CNI verbs, never around one.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{Receiver, RecvTimeoutError},
    },
    time::{Duration, Instant},
};

use portmap_common::reason::{Kind, REASONS};

use super::{AgentError, datapath_log::DatapathLog};
use crate::{
    cni::error::with_sources,
    dataplane::{
        ledger,
        ownership::Store,
        pin::PinLayout,
        scope::{self, Access},
    },
    node::netlink::Rtnl,
    ops::{
        conf::{ConfError, ConfSource},
        inspect,
    },
    verbs::{
        self,
        interfaces::{NodeView, Pass, reconcile},
    },
};

/// What the worker and the event loop share.
#[derive(Debug)]
pub struct Shared {
    pub conf: ConfSource,
    /// When the worker last turned (ms since `started`).
    pub heartbeat_ms: AtomicU64,
    pub started: Instant,
    pub passes_ok: AtomicU64,
    pub passes_failed: AtomicU64,
    pub gc_runs: AtomicU64,
    pub netlink_events: AtomicU64,
    /// Times the event socket overflowed (events lost: a pass follows).
    pub netlink_overruns: AtomicU64,
    /// Why the last pass failed (`None`: it succeeded).
    pub last_error: Mutex<Option<String>>,
    /// The state the last pass worked on.
    pub layout: Mutex<Option<PinLayout>>,
    pub stop: AtomicBool,
}

impl Shared {
    pub fn new(conf: ConfSource) -> Shared {
        Shared {
            conf,
            heartbeat_ms: AtomicU64::new(0),
            started: Instant::now(),
            passes_ok: AtomicU64::new(0),
            passes_failed: AtomicU64::new(0),
            gc_runs: AtomicU64::new(0),
            netlink_events: AtomicU64::new(0),
            netlink_overruns: AtomicU64::new(0),
            last_error: Mutex::new(None),
            layout: Mutex::new(None),
            stop: AtomicBool::new(false),
        }
    }

    fn beat(&self) {
        self.heartbeat_ms
            .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long ago the worker last turned.
    pub fn heartbeat_age(&self) -> Duration {
        let now = self.started.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.heartbeat_ms.load(Ordering::Relaxed)))
    }

    /// The pin layout the agent works on: the last pass's, else the one
    /// the configuration names now.
    pub fn layout(&self) -> Result<PinLayout, AgentError> {
        if let Some(layout) = self
            .layout
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
        {
            return Ok(layout);
        }
        let conf = self.conf.load()?;
        Ok(scope::resolve(&conf.pin_root, Access::Read)?)
    }
}

/// How the worker is tuned.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub gc_interval: Duration,
    /// How long GC leaves the mappings of a container whose network
    /// namespace is gone (see `verbs::reclaim_gone_containers`).
    pub gone_grace: Duration,
    /// At most one rare-event line per reason in this time.
    pub rare_event_interval: Duration,
    /// The DaemonSet's removal mode (see [`Cleanup`]).
    pub cleanup: bool,
}

/// The removal mode: the node's CNI configuration no longer names the
/// plugin (the installer restored it), so no DEL will come for the pods
/// still running with our mappings. The GC removes each one's mappings
/// once its network namespace is gone (past the grace period); when none
/// is left, the agent uninstalls the dataplane (programs, pins, records)
/// and idles, and the installer then removes the binary. Nobody has to
/// step in.
#[derive(Debug, Default)]
struct Cleanup {
    /// What the last round said, so an unchanged wait is logged once.
    said: String,
    done: bool,
}

/// Whether the CNI configuration still names the plugin (a configuration
/// that cannot be read counts as naming it: nothing proves it restored).
fn chained(shared: &Shared) -> bool {
    !matches!(
        shared.conf.load(),
        Err(ConfError::NotChained { .. } | ConfError::NoneInDir { .. })
    )
}

impl Cleanup {
    fn say(&mut self, line: String) {
        if line != self.said {
            log::info!("{line}");
            self.said = line;
        }
    }

    /// Whether reconciliation passes still run: while the configuration
    /// names the plugin (pods may still be added) and until uninstalled
    /// (a pass would install the dataplane again).
    fn passes(&self, shared: &Shared) -> bool {
        !self.done && chained(shared)
    }

    /// One round, after the node GC.
    fn round(&mut self, shared: &Shared, layout: &PinLayout) {
        if self.done {
            return;
        }
        if chained(shared) {
            self.say(
                "cleanup: the CNI configuration still names ebpf-portmap; waiting for it to be restored (install.sh cleanup does)".into(),
            );
            return;
        }
        let left = match Store::open_existing(layout) {
            Ok(None) => Vec::new(),
            Ok(Some(maps)) => match (maps.owners_with_mappings(), maps.owners()) {
                (Ok(held), Ok(owners)) => {
                    let mut left: Vec<String> = owners
                        .iter()
                        .filter(|(id, _)| held.contains(id))
                        .map(|(id, record)| {
                            let (_, container_id, _) =
                                crate::dataplane::ownership::record_strings(record);
                            let pod = maps.pod_of(*id);
                            match pod.label() {
                                Some(label) => format!("{container_id} (pod {label})"),
                                None => container_id,
                            }
                        })
                        .collect();
                    // Mappings without an owner record go through GC's
                    // orphan reclaim: wait for them too.
                    if left.is_empty() && !held.is_empty() {
                        left.push("mappings without an owner record".into());
                    }
                    left
                }
                (Err(error), _) | (_, Err(error)) => {
                    self.say(format!("cleanup: the mappings cannot be read: {error}"));
                    return;
                }
            },
            Err(error) => {
                self.say(format!("cleanup: the maps cannot be opened: {error}"));
                return;
            }
        };
        if !left.is_empty() {
            self.say(format!(
                "cleanup: waiting for {} container(s) to go (their mappings are removed once their network namespace is gone past the grace period): {}",
                left.len(),
                left.join(", ")
            ));
            return;
        }
        // `uninstall` refuses while the agent record names a live agent;
        // this agent is the one uninstalling.
        crate::dataplane::agent_record::release(layout);
        match crate::ops::uninstall::uninstall(layout, false) {
            Ok(report) => {
                for failure in &report.failures {
                    log::warn!("cleanup: {failure}");
                }
                log::info!(
                    "cleanup: no mapping left; uninstalled the dataplane under {} ({} attachment(s) detached, {} pin(s) removed); idle until stopped",
                    layout.root().display(),
                    report.detached.len(),
                    report.removed.len()
                );
                self.done = true;
            }
            Err(error) => self.say(format!(
                "cleanup: uninstall failed, retried on the next GC: {}",
                with_sources(&error)
            )),
        }
    }
}

/// One reconciliation pass: the configuration as it is now, one link and
/// one address dump, and the plugin's reconciliation with them.
fn pass(shared: &Shared) -> Result<PinLayout, AgentError> {
    let conf = shared.conf.load()?;
    // As an ADD does: the root becomes this network namespace's, and a
    // node with nothing installed yet gets the dataplane (a node without
    // hostPort pods is then ready, and the first one's ADD finds it).
    let layout = scope::resolve(&conf.pin_root, Access::Claim)?;
    let mut rtnl = Rtnl::open().map_err(verbs::PluginError::from)?;
    // No container's interfaces: the agent acts for none (the same view a
    // DEL or GC run has).
    let node = NodeView::read(&mut rtnl, &conf, &[])?;
    reconcile(&mut rtnl, &layout, &conf, &node, Pass::Node)?;
    Ok(layout)
}

fn node_gc(layout: &PinLayout, gone_grace: Duration) -> Result<(), AgentError> {
    // Other nodes of this machine whose namespace went away send this one
    // no event: the GC timer is when the agent looks for their state.
    crate::dataplane::stale::sweep(layout);
    let Some(mut maps) = Store::open_existing(layout).map_err(verbs::PluginError::from)? else {
        return Ok(());
    };
    verbs::collect_node_garbage("agent GC", layout, &mut maps)?;
    // A container whose DEL never came (a rollback to a plugin that does
    // not know us, a runtime bug, a node that crashed): its namespace is
    // the proof that it is gone.
    verbs::reclaim_gone_containers("agent GC", &mut maps, gone_grace.as_secs())?;
    // Entries of flows that idled out, which an LRU keeps until it evicts
    // them: swept, so that what the ledger counts as evicted from the
    // assured tables was a live flow's; only where a table may be near
    // evicting (a walk of every entry).
    match ledger::sweep_due(layout).then(|| ledger::sweep_expired(layout, false)) {
        None => {}
        Some(Ok(swept)) if swept.total() > 0 => log::debug!(
            "agent GC: swept {} expired conntrack entries ({} of assured flows, {} never assured, {} closed)",
            swept.total(),
            swept.live,
            swept.unreplied,
            swept.closed
        ),
        Some(Ok(_)) => {}
        Some(Err(error)) => log::warn!("agent GC: expired conntrack entries not swept: {error}"),
    }
    let seen = ledger::Ledger::open(layout)
        .ok()
        .flatten()
        .map(|l| l.value(portmap_common::ct_ledger::LIVE_SEEN));
    if let (Some(now), Some(seen)) = (ledger::note_live(layout), seen)
        && now.live > seen
    {
        log::warn!(
            "{} entries of live (assured) flows evicted from conntrack/conntrack_other since the last GC ({} since the tables were made): more live flows than conntrackSize holds; raise it",
            now.live - seen,
            now.live
        );
    }
    Ok(())
}

/// Rate-limited log lines for the datapath's rare events: the reasons of
/// kind [`Kind::Problem`] (a failed rewrite, a conntrack insert that
/// failed, no masquerade port free ...). The programs count them (see
/// `portmap_common::reason`); the agent logs when a count grows, at most
/// once per reason per interval, with how many happened since its last line.
#[derive(Debug, Default)]
pub struct RareEvents {
    /// Last value seen, and when a line was last written, by reason ID.
    seen: BTreeMap<u32, (u64, Option<Instant>, u64)>,
}

impl RareEvents {
    /// Takes the counters' current values; returns the lines to log.
    pub fn observe(
        &mut self,
        counters: &[(&'static str, u64)],
        now: Instant,
        interval: Duration,
    ) -> Vec<String> {
        let mut lines = Vec::new();
        for reason in REASONS.iter().filter(|r| r.kind == Kind::Problem) {
            let Some(&(_, value)) = counters.get(reason.id as usize) else {
                continue;
            };
            let entry = self.seen.entry(reason.id).or_insert((value, None, value));
            let (last, logged_at, logged_value) = entry;
            if value < *last {
                // The maps were re-created (uninstall, new pin root).
                *logged_value = value;
            }
            *last = value;
            let due = logged_at.is_none_or(|at| now.duration_since(at) >= interval);
            if value > *logged_value && due {
                lines.push(format!(
                    "datapath: {} {} time(s) since the last report ({}); see `ebpf-portmap trace` for the packets",
                    reason.label,
                    value - *logged_value,
                    reason.meaning
                ));
                *logged_at = Some(now);
                *logged_value = value;
            }
        }
        lines
    }
}

/// The reader of the programs' log (see [`super::datapath_log`]), opened
/// once the dataplane has pinned it and again when the pin is replaced.
#[derive(Debug, Default)]
struct ProgramLog {
    reader: Option<DatapathLog>,
    /// The last failure to open it, so that it is logged once.
    said: Option<String>,
}

impl ProgramLog {
    fn drain(&mut self, layout: &PinLayout) {
        if let Some(reader) = self.reader.as_mut()
            && !reader.is_current(layout)
        {
            // What the old ring buffer still holds, then the new one.
            reader.drain();
            self.reader = None;
        }
        if self.reader.is_none() {
            match DatapathLog::open(layout) {
                Ok(reader) => {
                    if reader.is_some() {
                        log::debug!("draining the programs' log");
                        self.said = None;
                    }
                    self.reader = reader;
                }
                Err(error) => {
                    let text = with_sources(&error);
                    if self.said.as_deref() != Some(text.as_str()) {
                        log::warn!("the programs' rare events are not logged: {text}");
                        self.said = Some(text);
                    }
                }
            }
        }
        if let Some(reader) = self.reader.as_mut() {
            reader.drain();
        }
    }
}

/// Runs until `shared.stop` is set (or every sender is gone).
pub fn run(shared: Arc<Shared>, wake: Receiver<()>, timing: Timing) {
    let mut dirty = true;
    let mut last_gc = Instant::now();
    let mut rare = RareEvents::default();
    let mut program_log = ProgramLog::default();
    let mut cleanup = timing.cleanup.then(Cleanup::default);
    loop {
        shared.beat();
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        if dirty && cleanup.as_ref().is_some_and(|c| !c.passes(&shared)) {
            dirty = false;
        }
        if dirty {
            dirty = false;
            let start = Instant::now();
            match pass(&shared) {
                Ok(layout) => {
                    shared.passes_ok.fetch_add(1, Ordering::Relaxed);
                    let mut last = shared
                        .last_error
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if last.take().is_some() {
                        log::info!("reconciliation succeeds again");
                    }
                    // `uninstall` refuses while this record names a live agent.
                    crate::dataplane::agent_record::claim(&layout);
                    *shared
                        .layout
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(layout);
                    log::debug!("reconciled in {:?}", start.elapsed());
                }
                Err(error) => {
                    shared.passes_failed.fetch_add(1, Ordering::Relaxed);
                    let text = error.to_string();
                    let mut last = shared
                        .last_error
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    // Logged when it changes, not every second.
                    if last.as_deref() != Some(text.as_str()) {
                        log::warn!("reconciliation failed: {}", with_sources(&error));
                    }
                    *last = Some(text);
                }
            }
        }
        if last_gc.elapsed() >= timing.gc_interval && !cleanup.as_ref().is_some_and(|c| c.done) {
            last_gc = Instant::now();
            if let Ok(layout) = shared.layout() {
                match node_gc(&layout, timing.gone_grace) {
                    Ok(()) => {
                        shared.gc_runs.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => log::warn!("node GC failed: {}", with_sources(&error)),
                }
                if let Some(cleanup) = cleanup.as_mut() {
                    cleanup.round(&shared, &layout);
                }
            }
            // Dead attachment pins go in the pass.
            dirty = true;
        }
        if let Ok(layout) = shared.layout() {
            let counters = inspect::stats(&layout);
            for line in rare.observe(&counters, Instant::now(), timing.rare_event_interval) {
                log::warn!("{line}");
            }
            program_log.drain(&layout);
        }
        match wake.recv_timeout(Duration::from_secs(1)) {
            Ok(()) => {
                // Every wake-up queued meanwhile is served by one pass.
                while wake.try_recv().is_ok() {}
                dirty = true;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portmap_common::stat;

    fn counters(values: &[(u32, u64)]) -> Vec<(&'static str, u64)> {
        let mut all: Vec<(&'static str, u64)> = stat::NAMES.iter().map(|n| (*n, 0)).collect();
        for &(id, value) in values {
            all[id as usize].1 = value;
        }
        all
    }

    #[test]
    fn rare_events_are_logged_when_they_grow_at_most_once_per_interval() {
        let mut rare = RareEvents::default();
        let start = Instant::now();
        let interval = Duration::from_secs(10);
        let second = |n| start + Duration::from_secs(n);
        assert!(
            rare.observe(&counters(&[(stat::CT_INSERT_FAILED, 5)]), start, interval)
                .is_empty(),
            "what was counted before the agent started is not news"
        );
        let lines = rare.observe(
            &counters(&[(stat::CT_INSERT_FAILED, 7)]),
            second(1),
            interval,
        );
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("2 time(s)"), "{lines:?}");
        assert!(
            rare.observe(
                &counters(&[(stat::CT_INSERT_FAILED, 9)]),
                second(5),
                interval
            )
            .is_empty(),
            "rate limited"
        );
        let lines = rare.observe(
            &counters(&[(stat::CT_INSERT_FAILED, 10)]),
            second(11),
            interval,
        );
        assert!(
            lines[0].contains("3 time(s)"),
            "the held-back ones are in the next line: {lines:?}"
        );
        assert!(
            rare.observe(&counters(&[(stat::DNAT, 1000)]), second(30), interval)
                .is_empty(),
            "translations are no problem"
        );
    }
}
