//! Names of everything the harness creates on the machine, and the sweep that
//! removes what a killed test run left behind.
//!
//! Format: `<prefix>-<kind>-<pid>-<counter>`, for example `epm-node-4242-7`.
//! The pid is the creating process, so a later run can tell leftovers of a dead
//! process (safe to remove) from resources of a run still in progress (left
//! alone). The prefix defaults to [`DEFAULT_NAME_PREFIX`] and can be changed
//! with the environment variable [`NAME_PREFIX_ENV`], so that two people (or
//! two checkouts) working on one machine never touch each other's namespaces.

use std::path::Path;
use std::process::Command;
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

/// Prefix of every namespace, bpffs directory and temp directory the harness
/// creates, unless [`NAME_PREFIX_ENV`] says otherwise.
pub const DEFAULT_NAME_PREFIX: &str = "epm";

/// Environment variable that overrides [`DEFAULT_NAME_PREFIX`]
/// (ASCII letters and digits only).
pub const NAME_PREFIX_ENV: &str = "EPM_TEST_PREFIX";

/// Where `ip netns add` puts its namespace handles.
pub const NETNS_RUN_DIR: &str = "/run/netns";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The prefix in force for this process.
///
/// # Panics
/// If [`NAME_PREFIX_ENV`] is set to something other than ASCII letters and digits.
pub fn name_prefix() -> String {
    match std::env::var(NAME_PREFIX_ENV) {
        Ok(prefix) if is_valid_prefix(&prefix) => prefix,
        Ok(prefix) => panic!(
            "{NAME_PREFIX_ENV}={prefix:?} is not a usable name prefix: use 1 to 8 ASCII letters or digits"
        ),
        Err(_) => DEFAULT_NAME_PREFIX.to_owned(),
    }
}

fn is_valid_prefix(prefix: &str) -> bool {
    (1..=8).contains(&prefix.len()) && prefix.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// `kind` with every character that is not an ASCII letter, digit, `_` or `-`
/// replaced by `_` (bpffs rejects dots, and names end up in paths).
pub fn sanitize_kind(kind: &str) -> String {
    let cleaned: String = kind
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.is_empty() {
        "x".to_owned()
    } else {
        cleaned
    }
}

/// A name unique on this machine: `<prefix>-<kind>-<pid>-<counter>`.
pub fn unique_name(kind: &str) -> String {
    format_name(
        &name_prefix(),
        &sanitize_kind(kind),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
    )
}

/// The pure formatting behind [`unique_name`].
pub fn format_name(prefix: &str, kind: &str, pid: u32, counter: u64) -> String {
    format!("{prefix}-{kind}-{pid}-{counter}")
}

/// The pid that created `name`, if `name` is one of ours for `prefix`
/// (`<prefix>-<kind>-<pid>-<counter>`; the kind may itself contain dashes).
pub fn owner_pid(name: &str, prefix: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    let mut fields = rest.rsplitn(3, '-');
    let counter = fields.next()?;
    let pid = fields.next()?;
    let kind = fields.next()?;
    if kind.is_empty() || counter.is_empty() || !counter.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

fn process_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Names under `dir` that belong to `prefix` and whose creating process is gone.
fn stale_entries(dir: &Path, prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| owner_pid(name, prefix).is_some_and(|pid| !process_alive(pid)))
        .collect()
}

/// Removes cgroups (with the processes still in them), namespaces, bpffs
/// directories and temp directories that carry this process's prefix and
/// were created by processes that no longer exist (a test run killed by
/// SIGKILL or a timeout cannot run its destructors). Cgroups go first: a
/// runtime's leftovers (podman's conmon and containers, in the cgroup parent
/// the harness named) may still be writing into a temp directory. Runs at
/// most once per process; every constructor of the harness calls it.
pub fn reap_stale() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prefix = name_prefix();
        for hierarchy in crate::cgroup::hierarchies() {
            for name in stale_entries(&hierarchy, &prefix) {
                eprintln!(
                    "harness: removing stale cgroup {} left by a dead test process",
                    hierarchy.join(&name).display()
                );
                crate::cgroup::remove_tree(&hierarchy.join(&name));
            }
        }
        for name in stale_entries(Path::new(NETNS_RUN_DIR), &prefix) {
            let status = Command::new("ip").args(["netns", "del", &name]).status();
            eprintln!("harness: removed stale netns {name} left by a dead test process ({status:?})");
        }
        let bpffs = Path::new(crate::bpffs::BPFFS_MOUNT);
        if crate::bpffs::is_bpffs(bpffs) {
            for name in stale_entries(bpffs, &prefix) {
                let result = crate::bpffs::remove_tree(&bpffs.join(&name));
                eprintln!("harness: removed stale bpffs dir {name} left by a dead test process ({result:?})");
            }
        }
        let tmp = std::env::temp_dir();
        for name in stale_entries(&tmp, &prefix) {
            let result = std::fs::remove_dir_all(tmp.join(&name));
            eprintln!("harness: removed stale temp dir {name} left by a dead test process ({result:?})");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses_round_trip() {
        let name = format_name("epm", "node", 4242, 7);
        assert_eq!(name, "epm-node-4242-7");
        assert_eq!(owner_pid(&name, "epm"), Some(4242));
    }

    #[test]
    fn kinds_with_dashes_parse() {
        assert_eq!(owner_pid("epm-c-web-1-99-3", "epm"), Some(99));
    }

    #[test]
    fn other_prefixes_and_foreign_names_are_not_ours() {
        assert_eq!(
            owner_pid("epmh-node-1-2", "epm"),
            None,
            "epmh is a different prefix than epm"
        );
        assert_eq!(owner_pid("epm-node-1-2", "epmh"), None);
        assert_eq!(owner_pid("epm-node", "epm"), None);
        assert_eq!(owner_pid("epm-1-2", "epm"), None, "a name needs a kind");
        assert_eq!(owner_pid("epm-node-x-2", "epm"), None);
        assert_eq!(owner_pid("epm-node-1-x", "epm"), None);
        assert_eq!(owner_pid("cni-1234", "epm"), None);
    }

    #[test]
    fn kinds_are_sanitized_for_paths_and_bpffs() {
        assert_eq!(sanitize_kind("c.web/1"), "c_web_1");
        assert_eq!(sanitize_kind("ext"), "ext");
        assert_eq!(sanitize_kind(""), "x");
    }

    #[test]
    fn prefix_validation() {
        assert!(is_valid_prefix("epm"));
        assert!(is_valid_prefix("epmh"));
        assert!(!is_valid_prefix(""));
        assert!(!is_valid_prefix("a-b"));
        assert!(!is_valid_prefix("muchtoolong"));
    }

    #[test]
    fn unique_names_differ() {
        assert_ne!(unique_name("k"), unique_name("k"));
    }
}
