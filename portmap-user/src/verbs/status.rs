//! STATUS: whether an ADD would succeed on this node, cheaply enough to be
//! asked every 5 seconds (containerd 2.x sends STATUS each time the kubelet
//! asks for the runtime's status, and marks the node NetworkReady=false on
//! any error).
//!
//! Every STATUS checks, with no lock and no program load: the privileges
//! ADD needs, that the pin root is this network namespace's, that it is on
//! a bpffs (or under /sys/fs/bpf, where ADD mounts one when the mount is
//! the node's; see `bpffs`), and that no pinned
//! map has a layout this build would refuse. Whether the kernel loads and
//! verifies this build's tc programs is asked once per boot and build:
//!
//! # The probe record
//! `/run/ebpf-portmap/{fnv1a64(pin root):016x}.status`, beside the pin
//! root's lock and hooks record (outside bpffs, which holds no files):
//!
//! ```text
//! boot 786f4ce9-6186-454d-84b2-59c9c206afe0   (/proc/sys/kernel/random/boot_id)
//! build 1f2e3d4c5b6a7980                        (the eBPF object's build id)
//! jit 1 0                                       (net.core.bpf_jit_enable, bpf_jit_harden)
//! ```
//!
//! (The JIT settings exist only in the first network namespace; a node in
//! another one records `jit - -`.)
//!
//! written (a whole file renamed over the old one) once the kernel has
//! loaded and verified this build's tc programs, by a probe load or because
//! they are pinned. A STATUS that finds the record of this boot, build and
//! JIT setting loads nothing. A new kernel (boot), an upgrade (build) or a
//! changed JIT setting, which change what the verifier and the JIT do,
//! make the next STATUS probe again. A missing or unreadable record only
//! costs one probe.
//!
//! Codes: 50 when an ADD would fail; 51 when, in addition, this pin root
//! already holds a dataplane (containers with host ports), which this build
//! cannot keep in line with the node (new interfaces, upgrades) until the
//! cause is fixed.

use std::fs;
use std::path::{Path, PathBuf};

use super::shared::PluginError;
use super::shared::require_privilege;
use crate::cni::CniError;
use crate::cni::error::code;
use crate::cni::netconf::NetConf;
use crate::dataplane::attach;
use crate::dataplane::bpffs;
use crate::dataplane::object::build_id;
use crate::dataplane::pin::PinLayout;
use crate::dataplane::scope;
use crate::node::netlink;

/// Where ADD mounts a bpffs when there is none (see `bpffs::mount_bpffs_if_missing`).
const DEFAULT_BPFFS: &str = "/sys/fs/bpf";

/// The STATUS verb, with its netlink account in the debug log (a count
/// per call that must not grow with the pods on the node).
pub(super) fn status(conf: &NetConf) -> Result<(), CniError> {
    let result = answer(conf);
    log::debug!("STATUS account: {}", netlink::account());
    result
}

fn answer(conf: &NetConf) -> Result<(), CniError> {
    require_privilege()
        .map_err(|error| CniError::from_error(code::PLUGIN_NOT_AVAILABLE, &error))?;
    // A mount namespace that is not the node's and has no bpffs: ADD
    // refuses there with the same message (see `bpffs`'s module docs).
    if let Some(error) = bpffs::unreachable_node_bpffs(&conf.pin_root) {
        return Err(CniError::from_error(code::PLUGIN_NOT_AVAILABLE, &error));
    }
    let layout = scope::resolve(&conf.pin_root, scope::Access::Read).map_err(|error| {
        CniError::from_error(code::PLUGIN_NOT_AVAILABLE, &PluginError::from(error))
    })?;
    let unavailable = |error: &dyn std::error::Error| {
        let code = if installed(&layout) {
            code::PLUGIN_NOT_AVAILABLE_LIMITED_CONNECTIVITY
        } else {
            code::PLUGIN_NOT_AVAILABLE
        };
        CniError::from_error(code, error)
    };
    if !layout.root().starts_with(DEFAULT_BPFFS) {
        // ADD answers a pinRoot off bpffs with code 7 (the configuration's
        // mistake); STATUS speaks the spec's two codes (the plugin cannot
        // serve ADD), with the same message naming pinRoot. containerd
        // turns either into NetworkReady=false with that message.
        bpffs::check_pin_root(layout.root()).map_err(|error| unavailable(&error))?;
    }
    attach::check_pinned_layouts(&layout).map_err(|error| unavailable(&error))?;
    let Some(key) = ProbeKey::now() else {
        // No boot ID to key a record by: probe every time.
        return attach::probe(&layout).map_err(|error| unavailable(&error));
    };
    let record = record_path(&layout);
    if fs::read_to_string(&record).is_ok_and(|text| text == key.text()) {
        return Ok(());
    }
    attach::probe(&layout).map_err(|error| unavailable(&error))?;
    write_record(&record, &key.text());
    Ok(())
}

/// Whether the pin root holds a dataplane that containers may depend on.
fn installed(layout: &PinLayout) -> bool {
    layout.map(portmap_common::map_names::OWNERS).exists()
}

/// The probe record of `layout` (see the module docs).
fn record_path(layout: &PinLayout) -> PathBuf {
    layout.lock_file().with_extension("status")
}

/// What a probe's verdict depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProbeKey {
    boot_id: String,
    build: u64,
    jit_enable: String,
    jit_harden: String,
}

impl ProbeKey {
    fn now() -> Option<ProbeKey> {
        let read = |path: &str| {
            fs::read_to_string(path)
                .ok()
                .map(|text| text.trim().to_owned())
        };
        let boot_id = read("/proc/sys/kernel/random/boot_id").filter(|id| !id.is_empty())?;
        Some(ProbeKey {
            boot_id,
            build: build_id(),
            // Absent without CONFIG_BPF_JIT: recorded as such.
            jit_enable: read("/proc/sys/net/core/bpf_jit_enable").unwrap_or_else(|| "-".into()),
            jit_harden: read("/proc/sys/net/core/bpf_jit_harden").unwrap_or_else(|| "-".into()),
        })
    }

    fn text(&self) -> String {
        format!(
            "boot {}\nbuild {:016x}\njit {} {}\n",
            self.boot_id, self.build, self.jit_enable, self.jit_harden
        )
    }
}

/// Writes the record atomically (a whole file renamed over the old one);
/// best effort: without it the next STATUS probes again.
fn write_record(path: &Path, text: &str) {
    if let Err(error) = crate::dataplane::lock::write_record(path, text) {
        log::debug!("probe record {} not written: {error}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_names_boot_build_and_jit() {
        let key = ProbeKey {
            boot_id: "786f4ce9-6186-454d-84b2-59c9c206afe0".into(),
            build: 0x1f2e_3d4c_5b6a_7980,
            jit_enable: "1".into(),
            jit_harden: "0".into(),
        };
        assert_eq!(
            key.text(),
            "boot 786f4ce9-6186-454d-84b2-59c9c206afe0\nbuild 1f2e3d4c5b6a7980\njit 1 0\n"
        );
        let other_boot = ProbeKey {
            boot_id: "00000000-0000-0000-0000-000000000000".into(),
            ..key.clone()
        };
        assert_ne!(key.text(), other_boot.text(), "another boot probes again");
        let other_build = ProbeKey {
            build: 1,
            ..key.clone()
        };
        assert_ne!(key.text(), other_build.text(), "another build probes again");
    }

    #[test]
    fn the_record_lies_beside_the_lock() {
        let layout = PinLayout::new("/sys/fs/bpf/ebpf-portmap");
        let record = record_path(&layout);
        assert_eq!(record.parent(), layout.lock_file().parent());
        assert_eq!(record.extension().and_then(|e| e.to_str()), Some("status"));
    }
}
