//! What one plugin call does, counted on an untimed run of it: its
//! `bpf()` calls by command (strace) and the plugin's own debug account
//! line (netlink reads, bytes, records). Both sections' rows use it: one
//! more pod's ADD and DEL, and STATUS.

use std::collections::BTreeMap;
use std::ffi::OsString;

use super::node::PodNode;
use crate::invoke::{Timed, Wrapper};
use crate::results::CallAccount;

impl PodNode {
    /// One untimed call under `strace` with the plugin's debug log on:
    /// `run` gets the wrapper and makes the call.
    pub(super) fn counted(
        &self,
        account_verb: Option<&str>,
        run: impl FnOnce(&Wrapper<'_>) -> Timed,
    ) -> Result<CallAccount, String> {
        let trace = self.trace_dir.path().join("strace.out");
        let _ = std::fs::remove_file(&trace);
        let prefix: Vec<OsString> = [
            "strace",
            "-f",
            "-qq",
            "-e",
            "trace=bpf",
            "-e",
            "signal=none",
            "-o",
        ]
        .iter()
        .map(OsString::from)
        .chain([trace.clone().into_os_string()])
        .collect();
        let env = [("EPM_LOG_LEVEL", "debug")];
        let timed = run(&Wrapper {
            prefix: &prefix,
            env: &env,
        });
        timed.result?;
        let text = std::fs::read_to_string(&trace)
            .map_err(|e| format!("strace wrote nothing at {}: {e}", trace.display()))?;
        let bpf_by_command = count_bpf(&text);
        let netlink = match account_verb {
            Some(verb) => last_account(
                &std::fs::read_to_string(self.log()).unwrap_or_default(),
                verb,
            ),
            None => Default::default(),
        };
        Ok(CallAccount {
            bpf_calls: bpf_by_command.values().sum(),
            program_loads: bpf_by_command.get("BPF_PROG_LOAD").copied().unwrap_or(0),
            bpf_by_command,
            netlink,
        })
    }
}

/// `bpf()` calls by command (`BPF_OBJ_GET`, ...) in an `strace -e
/// trace=bpf` log.
fn count_bpf(trace: &str) -> BTreeMap<String, u64> {
    let mut by_command = BTreeMap::new();
    for line in trace.lines() {
        let Some((_, call)) = line.split_once("bpf(") else {
            continue;
        };
        let command = call.split([',', ')']).next().unwrap_or_default().trim();
        *by_command.entry(command.to_owned()).or_default() += 1;
    }
    by_command
}

/// The `key=value` pairs of the last `{verb} account:` line of a plugin log.
fn last_account(log: &str, verb: &str) -> BTreeMap<String, u64> {
    let marker = format!("{verb} account:");
    log.lines()
        .rev()
        .find_map(|line| line.split_once(&marker).map(|(_, rest)| rest))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strace_lines_count_bpf_calls_and_program_loads() {
        let trace = "123 bpf(BPF_OBJ_GET, {pathname=\"/sys/fs/bpf/x\"}, 24) = 3\n\
                     123 bpf(BPF_PROG_LOAD, {prog_type=BPF_PROG_TYPE_SCHED_CLS}, 148 <unfinished ...>\n\
                     124 <... bpf resumed>) = 4\n\
                     123 bpf(BPF_MAP_LOOKUP_ELEM, {map_fd=3}, 32) = -1 ENOENT\n";
        let counted = count_bpf(trace);
        assert_eq!(counted.get("BPF_OBJ_GET"), Some(&1));
        assert_eq!(counted.get("BPF_PROG_LOAD"), Some(&1));
        assert_eq!(counted.get("BPF_MAP_LOOKUP_ELEM"), Some(&1));
        assert_eq!(counted.values().sum::<u64>(), 3);
        assert!(count_bpf("").is_empty());
    }

    #[test]
    fn the_last_account_line_of_the_verb_is_read() {
        let log = "2026-12-03T11:00:00Z DEBUG [1] ADD account: netlink_reads=9 link_records=4\n\
                   2026-12-03T11:00:01Z DEBUG [2] DEL account: netlink_reads=5\n\
                   2026-12-03T11:00:02Z DEBUG [3] ADD account: netlink_reads=7 netlink_bytes=900 link_records=3\n";
        let add = last_account(log, "ADD");
        assert_eq!(add.get("netlink_reads"), Some(&7));
        assert_eq!(add.get("netlink_bytes"), Some(&900));
        assert_eq!(last_account(log, "DEL").len(), 1);
        assert!(last_account(log, "CHECK").is_empty());
    }
}
