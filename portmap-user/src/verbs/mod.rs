//! The CNI verbs on the real dataplane: what `cni::run` calls. One file per
//! verb ([`add`], [`del`], [`check`], [`gc`], [`status`]); [`interfaces`] says
//! which interfaces carry the programs and reconciles them on every run. Here:
//! the `Plugin` implementation, the verbs' error and its CNI codes, and what
//! several verbs share. [`logged`] and [`recorded`] wrap the plugin to log
//! and to count each run.

mod add;
mod check;
mod del;
mod gc;
pub use gc::{collect_node_garbage, pod_words, reclaim_gone_containers};
pub mod interfaces;
pub mod logged;
pub mod recorded;
mod shared;
mod status;

pub use shared::{PluginError, who};

use crate::{
    cni::netconf::NetConf,
    cni::{CniError, GcRequest, Plugin, Request},
    dataplane::scope,
};

/// One warning naming the upstream `portmap` keys of the configuration
/// that ebpf-portmap accepts without using, and what it does instead. Only
/// ADD logs it: STATUS every 5 seconds would bury the log in it.
fn warn_upstream_unused(conf: &NetConf) {
    if conf.upstream_unused.is_empty() {
        return;
    }
    let notes: Vec<String> = conf
        .upstream_unused
        .iter()
        .map(ToString::to_string)
        .collect();
    log::warn!("network {}: {}", conf.name, notes.join("; "));
}

/// One warning per key of the configuration that is a typo away from one
/// of ours (ignored as it is), and the same kept for `status`
/// ([`crate::dataplane::key_notes`]). ADD only, like the upstream keys'
/// warning.
fn warn_misspelt(conf: &NetConf) {
    for misspelt in &conf.misspelt_keys {
        log::warn!("network {}: {misspelt}", conf.name);
    }
    if let Some(layout) = scope::last_resolved() {
        crate::dataplane::key_notes::record(
            &layout,
            &conf.name,
            conf.misspelt_keys.iter().map(|m| (m.key.as_str(), m.meant)),
        );
    }
}

/// The plugin as the binary runs it.
#[derive(Debug, Default)]
pub struct Dataplane;

impl Plugin for Dataplane {
    fn add(&mut self, req: &Request) -> Result<(), CniError> {
        warn_upstream_unused(&req.conf);
        let result = add::add(req).map_err(CniError::from);
        warn_misspelt(&req.conf);
        result
    }

    fn del(&mut self, req: &Request) -> Result<(), CniError> {
        // Never an error: see `del`'s module docs.
        del::del(req);
        Ok(())
    }

    fn check(&mut self, req: &Request) -> Result<(), CniError> {
        check::check(req).map_err(CniError::from)
    }

    fn gc(&mut self, req: &GcRequest) -> Result<(), CniError> {
        gc::gc(req).map_err(CniError::from)
    }

    fn status(&mut self, conf: &NetConf) -> Result<(), CniError> {
        status::status(conf)
    }
}
