//! Which node agent keeps a pin root's dataplane: its PID, recorded beside
//! the pin root's lock (`{lock}.agent`) by every pass that reconciled, and
//! removed when it stops. `uninstall` reads it: a running agent re-creates
//! everything within a second of an uninstall, so it must be stopped first.
//! A record whose process is gone, or is no agent, is stale and ignored.

use std::path::PathBuf;

use crate::dataplane::pinned::lock::{read_record, write_record};
use crate::dataplane::pinned::pin::PinLayout;

/// What `/proc/PID/comm` holds for the agent: its name, cut to 15 bytes.
const AGENT_COMM: &str = "ebpf-portmap-ag";

/// The record of `layout`.
pub fn record_path(layout: &PinLayout) -> PathBuf {
    layout.lock_file().with_extension("agent")
}

/// Records this process as the agent of `layout` (best effort; written
/// only when it names another PID).
pub fn claim(layout: &PinLayout) {
    let pid = std::process::id();
    let path = record_path(layout);
    if read_record(&path).is_ok_and(|text| text.trim() == pid.to_string()) {
        return;
    }
    if let Err(error) = write_record(&path, &format!("{pid}\n")) {
        log::debug!("{} not written: {error}", path.display());
    }
}

/// Removes the record of `layout` if it names this process.
pub fn release(layout: &PinLayout) {
    let path = record_path(layout);
    if read_record(&path).is_ok_and(|text| text.trim() == std::process::id().to_string()) {
        let _ = std::fs::remove_file(path);
    }
}

/// The PID of a running agent that keeps `layout`, if any.
pub fn running(layout: &PinLayout) -> Option<u32> {
    let pid: u32 = read_record(&record_path(layout))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (comm.trim() == AGENT_COMM).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_lies_beside_the_lock() {
        let layout = PinLayout::new("/sys/fs/bpf/ebpf-portmap");
        let record = record_path(&layout);
        assert_eq!(record.parent(), layout.lock_file().parent());
        assert_eq!(record.extension().and_then(|e| e.to_str()), Some("agent"));
    }

    #[test]
    fn the_agents_name_is_what_comm_shows() {
        assert!("ebpf-portmap-agent".starts_with(AGENT_COMM));
        assert_eq!(AGENT_COMM.len(), 15, "comm is cut to 15 bytes");
    }
}
