//! The plugin with each run's outcome and duration recorded in the pinned
//! `verb_stats` map ([`crate::dataplane::verb_stats`]), which the node agent
//! exports. Nothing is created on a node where the dataplane is not
//! installed (a DEL there must leave nothing behind), and a failure to
//! record is logged at debug level only: the verb's result never depends on
//! its record.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use portmap_common::verb_stats::VERBS;

use crate::{
    cni::netconf::NetConf,
    cni::{CniError, GcRequest, Plugin, Request},
    dataplane::{scope, verb_stats::VerbStats},
};

/// Records the outcome of one run under `pin_root` (best effort).
fn record(pin_root: &Path, verb: usize, result: &Result<(), CniError>, took: Duration) {
    // Where the verb found this namespace's state; a verb that never
    // looked (a request refused before) has nothing to count into.
    let Some(layout) = scope::last_resolved(pin_root) else {
        return;
    };
    let code = result.as_ref().err().map_or(0, |error| error.code);
    let stats = match VerbStats::open(&layout) {
        Ok(Some(stats)) => Ok(stats),
        // Nothing installed (never an ADD here, or uninstalled): nothing
        // to count into, and a run must not start a pin tree of its own.
        Ok(None) if !layout.maps_dir().exists() => return,
        Ok(None) => VerbStats::open_or_create(&layout),
        Err(error) => Err(error),
    };
    match stats {
        Ok(stats) => stats.record(verb, code, took),
        Err(error) => log::debug!("{} not recorded: {error}", VERBS[verb]),
    }
}

/// The plugin, each run recorded.
pub struct Recorded<P>(pub P);

/// Runs `run` and records its outcome and duration as one run of `verb`.
fn timed(
    pin_root: &Path,
    verb: usize,
    run: impl FnOnce() -> Result<(), CniError>,
) -> Result<(), CniError> {
    let start = Instant::now();
    let result = run();
    record(pin_root, verb, &result, start.elapsed());
    result
}

impl<P: Plugin> Plugin for Recorded<P> {
    fn add(&mut self, req: &Request) -> Result<(), CniError> {
        timed(&req.conf.pin_root, 0, || self.0.add(req))
    }

    fn del(&mut self, req: &Request) -> Result<(), CniError> {
        timed(&req.conf.pin_root, 1, || self.0.del(req))
    }

    fn check(&mut self, req: &Request) -> Result<(), CniError> {
        timed(&req.conf.pin_root, 2, || self.0.check(req))
    }

    fn gc(&mut self, req: &GcRequest) -> Result<(), CniError> {
        timed(&req.conf.pin_root, 3, || self.0.gc(req))
    }

    fn status(&mut self, conf: &NetConf) -> Result<(), CniError> {
        timed(&conf.pin_root, 4, || self.0.status(conf))
    }
}
