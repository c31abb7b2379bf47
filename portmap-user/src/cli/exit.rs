//! The operator verbs' exit codes, one table for all of them (the README's
//! "Exit codes" section is this table):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done; for `status` and `chain check`: healthy, chained |
//! | 1 | a problem was found or left (degraded dataplane, not chained, a refusal, a failed step) |
//! | 2 | usage: the command line is wrong (clap's own code) |
//! | 3 | cannot inspect: no permission (not root, no CAP_BPF/CAP_SYS_ADMIN), no bpffs at the pin root, or the pin root is another network namespace's |

use std::{io, process::ExitCode};

pub const PROBLEM: u8 = 1;
pub const USAGE: u8 = 2;
pub const CANNOT_INSPECT: u8 = 3;

pub fn code(code: u8) -> ExitCode {
    ExitCode::from(code)
}

/// The exit code for a verb's error: [`CANNOT_INSPECT`] when anything in
/// its chain is a denied permission, else [`PROBLEM`].
pub fn of_error(error: &anyhow::Error) -> u8 {
    let denied = error.chain().any(|cause| {
        cause.downcast_ref::<io::Error>().is_some_and(is_denied)
            || cause.downcast_ref::<CannotInspect>().is_some()
    });
    if denied { CANNOT_INSPECT } else { PROBLEM }
}

/// Whether `error` or any of its sources is a denied permission.
pub fn is_denied_error(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(current) = cause {
        if current.downcast_ref::<io::Error>().is_some_and(is_denied) {
            return true;
        }
        cause = current.source();
    }
    false
}

fn is_denied(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::PermissionDenied
        || matches!(error.raw_os_error(), Some(libc::EPERM | libc::EACCES))
}

/// A verb could not look at the node's state at all.
#[derive(Debug, thiserror::Error)]
pub enum CannotInspect {
    #[error(
        "{path} is not on a bpffs mount; mount one (`mount -t bpf bpf /sys/fs/bpf`) or pass the plugin's pinRoot"
    )]
    NotBpffs { path: String },
    #[error("reading {path} needs root (CAP_BPF and CAP_SYS_ADMIN)")]
    Denied { path: String },
    #[error(
        "{root} holds the state of the node in network namespace {netns}, not of the one this command runs in; operator commands read the node of the namespace they run in: run it there, `nsenter --net={netns} {command}`"
    )]
    InAnotherNamespace {
        root: String,
        netns: String,
        command: String,
    },
    #[error(
        "{root} holds the state of another network namespace (cookie {owner:#x}) that no /run/netns name and no process is in any more: that node is gone; `ebpf-portmap uninstall --stale` (run in the namespace of a live node) removes what it left"
    )]
    NamespaceGone { root: String, owner: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denied_permission_anywhere_in_the_chain_is_cannot_inspect() {
        let denied = anyhow::Error::new(io::Error::from_raw_os_error(libc::EPERM))
            .context("cannot list the mappings");
        assert_eq!(of_error(&denied), CANNOT_INSPECT);
        let access = anyhow::Error::new(io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(of_error(&access), CANNOT_INSPECT);
        let other = anyhow::Error::new(io::Error::from_raw_os_error(libc::ENOSPC)).context("x");
        assert_eq!(of_error(&other), PROBLEM);
        let typed = anyhow::Error::new(CannotInspect::NotBpffs {
            path: "/tmp".into(),
        });
        assert_eq!(of_error(&typed), CANNOT_INSPECT);
    }
}
