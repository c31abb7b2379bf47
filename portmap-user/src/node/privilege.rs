//! The capabilities the plugin needs, checked before it changes anything,
//! so a run without them fails with a clear message instead of halfway.

use caps::CapSet;

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

/// Effective capability set of this process, as a bit mask: one `capget`
/// (reading `CapEff` from /proc/self/status cost every ADD 25-40 us).
fn effective() -> Option<u64> {
    let set = caps::read(None, CapSet::Effective).ok()?;
    Some(set.iter().fold(0, |mask, cap| mask | cap.bitmask()))
}

/// What is missing from `caps` for loading programs and attaching them to
/// interfaces: CAP_BPF (or CAP_SYS_ADMIN, before 5.8) and CAP_NET_ADMIN.
pub fn missing_from(caps: u64) -> Vec<&'static str> {
    let has = |cap: u32| caps & (1 << cap) != 0;
    let mut missing = Vec::new();
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF (or CAP_SYS_ADMIN)");
    }
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    missing
}

/// Whether this process may read every other process's namespaces and
/// open files (CAP_SYS_PTRACE).
pub fn may_read_processes() -> bool {
    effective().is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0)
}

/// Capabilities this process lacks; empty when it has what it needs.
pub fn missing() -> Vec<&'static str> {
    effective().map_or_else(|| vec!["(capget failed)"], missing_from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_bpf_or_sys_admin_and_net_admin() {
        assert_eq!(missing_from(u64::MAX), Vec::<&str>::new());
        assert_eq!(
            missing_from((1 << CAP_BPF) | (1 << CAP_NET_ADMIN)),
            Vec::<&str>::new()
        );
        assert_eq!(
            missing_from((1 << CAP_SYS_ADMIN) | (1 << CAP_NET_ADMIN)),
            Vec::<&str>::new()
        );
        assert_eq!(
            missing_from(1 << CAP_NET_ADMIN),
            vec!["CAP_BPF (or CAP_SYS_ADMIN)"]
        );
        assert_eq!(missing_from(0).len(), 2);
    }
}
