//! The judge of `status`: what is a problem (`status` exits non-zero) and
//! what is a note, each with its fix. Pure but for the gone containers, so
//! the rules are unit-tested.

use portmap_common::{MappingKey, map_names};

use super::attachments::{SplitKind, TcAttachment};
use super::drift::NodeDrift;
use super::fills::{EvictionReport, FILL_WARNING_PERCENT};
use super::list::mapping_rows;
use super::status::Status;
use crate::dataplane::{
    features::FastPathMode,
    ledger::Evictions,
    ownership::KeyDisplay,
    pin::{Direction, PinLayout},
    trace,
};

/// `status` on containers whose network namespace is gone: a note while
/// a GC may still be within its grace period (the default one), a problem
/// once past it (no agent runs, or it cannot see the runtime's paths).
pub fn judge_gone_containers(
    layout: &PinLayout,
    problems: &mut Vec<String>,
    notes: &mut Vec<String>,
) {
    let Ok(rows) = mapping_rows(layout) else {
        return;
    };
    let now = crate::dataplane::ownership::now_unix();
    let mut seen = std::collections::BTreeSet::new();
    for row in &rows {
        let Some(marker) = row.gone_marker() else {
            continue;
        };
        let (_, container_id, _) = row.owner_strings();
        if !seen.insert(container_id.clone()) {
            continue;
        }
        let mappings = rows
            .iter()
            .filter(|other| other.value.owner_id == row.value.owner_id)
            .count();
        let pod = match (row.pod.label(), &row.pod.pod_uid) {
            (Some(label), Some(uid)) => format!(" (pod {label}, UID {uid})"),
            (Some(label), None) => format!(" (pod {label})"),
            (None, Some(uid)) => format!(" (pod UID {uid})"),
            (None, None) => String::new(),
        };
        let line = format!(
            "container {container_id}{pod} holds {mappings} mapping(s) but its {marker}: they send traffic nowhere"
        );
        let since = row.sandbox.as_ref().and_then(|sandbox| sandbox.gone_since);
        match since {
            Some(since)
                if now.saturating_sub(since) >= crate::dataplane::ownership::GONE_GRACE_SECS =>
            {
                problems.push(format!(
                    "{line}; past the grace period: run `ebpf-portmap gc --gone`, or the agent (it removes them on its GC timer)"
                ));
            }
            _ => notes.push(format!(
                "{line}; the agent's GC (or `ebpf-portmap gc --gone`) removes them after the grace period"
            )),
        }
    }
}

/// Fills `problems` and `notes`. Pure, so the rules are unit-tested.
/// After this long without a new live eviction (as the agent saw it),
/// the ones counted are history: a note, no longer a problem.
pub const LIVE_EVICTIONS_QUIET: std::time::Duration = std::time::Duration::from_secs(3600);

/// What the conntrack tables evicted: live flows' entries are a problem
/// (each was a connection that lost its translation) until the agent has
/// seen no new one for [`LIVE_EVICTIONS_QUIET`]; a flood's unreplied ones
/// are a note.
fn judge_evictions(report: &EvictionReport, problems: &mut Vec<String>, notes: &mut Vec<String>) {
    let Evictions { unreplied, live } = report.counts;
    if live > 0 {
        match report.live_quiet_for {
            Some(quiet) if quiet >= LIVE_EVICTIONS_QUIET => notes.push(format!(
                "{live} entries of live (assured) flows were evicted from conntrack/conntrack_other since the tables were made, none in the last {} min: each was a connection that lost its translation; if it happens again, raise conntrackSize",
                quiet.as_secs() / 60
            )),
            _ => problems.push(format!(
                "{live} entries of live (assured) flows evicted from conntrack/conntrack_other (more live flows than conntrackSize holds): each was a connection that lost its translation, whose container's next packet leaves from its own address and whose client's next TCP segment is recovered (ct_recovered); raise conntrackSize"
            )),
        }
    }
    if unreplied > 0 {
        notes.push(format!(
            "{unreplied} entries of flows never assured evicted from conntrack_new (a flood, a scan, or a burst of new flows): by design, live flows are not affected"
        ));
    }
}

pub fn judge(status: &mut Status) {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    if !status.installed {
        problems.push(format!(
            "nothing is installed under {} (no ADD has run with this pinRoot, or it was uninstalled)",
            status.root.display()
        ));
    } else {
        for name in &status.missing_maps {
            problems.push(format!("map {name} is not pinned"));
        }
        for direction in Direction::BOTH {
            let name = match direction {
                Direction::Ingress => portmap_common::program_names::TC_INGRESS,
                Direction::Egress => portmap_common::program_names::TC_EGRESS,
            };
            if !status.programs.iter().any(|p| p.name == name) {
                problems.push(format!("program {name} is not pinned"));
            }
        }
        if status.programs.iter().any(|p| p.id.is_none()) {
            problems.push("a pinned program cannot be read".into());
        }
        if !status.programs.is_empty() && !status.programs.iter().any(|p| p.current) {
            notes.push(format!(
                "the loaded programs are of another build than this binary ({}); the next ADD replaces them",
                status.build
            ));
        }
        if status.tc.is_empty() {
            problems.push("the programs are attached to no interface".into());
        }
        judge_changes(status, &mut problems);
    }
    let mut interfaces: Vec<u32> = status.tc.iter().map(|a| a.ifindex).collect();
    interfaces.dedup();
    let mut gone = 0;
    for ifindex in interfaces {
        let on_interface: Vec<&TcAttachment> =
            status.tc.iter().filter(|a| a.ifindex == ifindex).collect();
        let Some(label) = on_interface[0].interface.clone() else {
            // The host end of a removed container's veth, typically: the
            // kernel detached it with the interface, only the pin is left.
            gone += 1;
            continue;
        };
        for direction in Direction::BOTH {
            match on_interface.iter().find(|a| a.direction == direction) {
                None => problems.push(format!(
                    "{label}: no {} program attached",
                    direction.as_str()
                )),
                Some(a) if !a.attached => problems.push(format!(
                    "{label}: the pinned {} attachment is not active in the kernel",
                    direction.as_str()
                )),
                Some(_) => {}
            }
        }
    }
    if gone > 0 {
        notes.push(format!(
            "{gone} interface(s) with pinned attachments no longer exist (removed containers, re-created interfaces): harmless; `ebpf-portmap gc --stale-links` removes the pins"
        ));
    }
    judge_drift(&status.drift, &mut problems, &mut notes);
    for map in &status.maps {
        if let Some(percent) = map.percent()
            && percent >= FILL_WARNING_PERCENT
        {
            let fill = format!(
                "map {} is {percent:.0}% full ({} of {})",
                map.name,
                map.entries.unwrap_or(0),
                map.max_entries
            );
            if map.name == map_names::CONNTRACK || map.name == map_names::CONNTRACK_OTHER {
                // Assured flows only (see `portmap_common::maps::CONNTRACK_NEW`):
                // room for the next one is made by evicting a live flow.
                problems.push(format!(
                    "{fill}: it holds assured (live) flows only, so each new one evicts an idle live flow, whose container's next packet leaves untranslated and whose client's next TCP segment is recovered (ct_recovered); raise conntrackSize"
                ));
            } else if map.name == map_names::CONNTRACK_NEW {
                notes.push(format!(
                    "{fill}: new flows not yet assured (a flood, or a burst of new flows) evict each other there, by design; assured flows are not affected"
                ));
            } else if map.recycles() {
                notes.push(format!(
                    "{fill}: it drops its least recently used entries to make room, by design; a table this full under steady load may be worth a larger conntrackSize"
                ));
            } else {
                problems.push(fill);
            }
        }
    }
    if let Some(report) = &status.evictions {
        judge_evictions(report, &mut problems, &mut notes);
    }
    if let Some(filter) = &status.tracing
        && filter.enabled != 0
    {
        if trace::tracer_alive(filter.tracer_pid) {
            notes.push(format!(
                "tracing is on (ebpf-portmap trace, pid {})",
                filter.tracer_pid
            ));
        } else {
            problems.push(format!(
                "tracing was left on by a trace (pid {}) that is gone; every packet pays for it: run `ebpf-portmap trace --stop`",
                filter.tracer_pid
            ));
        }
    }
    for (id, keys) in &status.ownership.orphans {
        problems.push(format!(
            "{} mapping(s) of owner {id:016x} ({}) have no owner record: no DEL removes them and every ADD of these ports fails; `ebpf-portmap gc --orphans` reclaims them (CNI GC does {}s after first seeing them)",
            keys.len(),
            key_list(keys),
            crate::dataplane::ownership::ORPHAN_GRACE_SECS
        ));
    }
    for (owner, key, holder) in &status.ownership.missing {
        problems.push(match holder {
            None => format!(
                "mapping {} of {owner} is missing from the mappings map (deleted behind the plugin's back): its traffic is not forwarded; ADD the container again",
                KeyDisplay(*key)
            ),
            Some(holder) => format!(
                "mapping {} of {owner} is held by {holder}: its traffic goes there; DEL one of them and ADD the other again",
                KeyDisplay(*key)
            ),
        });
    }
    for (owner, key) in &status.ownership.unindexed {
        problems.push(format!(
            "mapping {} of {owner} is not in its owner's index: a DEL of the owner leaves it behind; after that DEL, `ebpf-portmap gc --orphans` removes it",
            KeyDisplay(*key)
        ));
    }
    for (name, value) in &status.stats {
        if *value > 0 && matches!(*name, "rewrite_failed" | "ct_insert_failed") {
            notes.push(format!(
                "{value} packet(s) counted as {name} since the maps were created"
            ));
        }
        if *value > 0 && *name == "ct_recovered" {
            notes.push(format!(
                "{value} mid-flow TCP packet(s) found their flow's entries gone since the maps were created (ct_recovered): evicted from a full conntrack table, idle past their timeout, or older than the maps; translated again by their mapping"
            ));
        }
    }
    for root in &status.stale_roots {
        notes.push(format!(
            "{} is the state of a node whose network namespace is gone: its socket hooks still run (and exit at once) on every connect() in their cgroup until the next plugin run or agent pass removes it, or `ebpf-portmap uninstall --stale` now",
            root.display()
        ));
    }
    for orphan in &status.orphan_records {
        notes.push(format!(
            "pin root {} no longer exists (removed without `ebpf-portmap uninstall`), but {} record(s) of it are left in /run/ebpf-portmap ({}): the next plugin run or agent pass removes them, or `ebpf-portmap uninstall --stale` now",
            orphan.root.display(),
            orphan.records.len(),
            orphan
                .records
                .iter()
                .filter_map(|r| r.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for note in &status.misspelt_keys {
        notes.push(format!(
            "network {}: key {:?} of its configuration is not one ebpf-portmap knows and was ignored by the last ADD; did you mean {:?}? Fix the conflist (the next ADD clears this note)",
            note.network, note.key, note.meant
        ));
    }
    judge_firewalld(status, &mut notes);
    status.problems = problems;
    status.notes = notes;
}

/// What firewalld in the node's namespace means for host ports (README,
/// "Firewalls"): its FORWARD chain accepts flows conntrack holds as DNAT
/// and judges the rest by its zones, and a translated flow is no DNAT to
/// netfilter. A note, not a problem: a layout whose zones forward from
/// the uplinks to the bridge admits the flows, and nothing here can tell
/// the layouts apart.
fn judge_firewalld(status: &Status, notes: &mut Vec<String>) {
    if status.firewalld != Some(true) || !status.installed {
        return;
    }
    let always = status
        .fast_path
        .as_ref()
        .is_some_and(|report| report.mode == FastPathMode::Always);
    // Translated by netfilter: its entries are DNAT, as firewalld wants.
    if status
        .translation
        .as_ref()
        .is_some_and(|report| report.netfilter == [true, true])
    {
        return;
    }
    let masq_all = status
        .translation
        .as_ref()
        .is_some_and(|report| report.masq_all);
    notes.push(if masq_all {
        "firewalld runs in this network namespace: its FORWARD chain accepts flows conntrack holds as DNAT (ct status dnat) and judges the rest by its zones, and with masqAll: true every hostPort flow from outside is translated and masqueraded in tc, no DNAT to netfilter, and never handed past FORWARD (fastPath does not apply to it), so unless the uplinks and the bridge sit in one zone that forwards within itself (or a firewalld policy forwards from the uplinks' zone to the pods'), its clients are refused (admin-prohibited: \"No route to host\") (see README, Firewalls)".to_owned()
    } else if always {
        "firewalld runs in this network namespace: with fastPath: true translated flows from outside skip FORWARD, so its zones, policies and direct rules do not decide them (its own verdict for DNAT flows is accept; with StrictForwardPorts=yes it would refuse them, and here they pass)".to_owned()
    } else {
        "firewalld runs in this network namespace: its FORWARD chain accepts flows conntrack holds as DNAT (ct status dnat) and judges the rest by its zones, and a hostPort flow translated in tc (see translation above: netfilter translates only where the NAT kfuncs linked and a nat chain of the family exists) is no DNAT to netfilter, so unless the uplinks and the bridge sit in one zone that forwards within itself, its clients are refused (admin-prohibited: \"No route to host\"); fastPath: true lets them past FORWARD (see README, Firewalls)".to_owned()
    });
}

/// What `reconcile` (and every plugin run, and the agent's pass) does to
/// an unfinished change: the fix named by its problems.
const FINISH: &str = "run `ebpf-portmap reconcile` (the next CNI ADD, DEL, CHECK or GC, or the node agent's pass, does it too)";

/// The problems of a change of programs or tables (an upgrade, a resize)
/// that did not finish (issue 52): attached programs that read maps no
/// longer pinned, and a pass over the attachments still to do.
fn judge_changes(status: &Status, problems: &mut Vec<String>) {
    for split in &status.splits {
        problems.push(match &split.kind {
            SplitKind::StaleMaps(maps) => format!(
                "{}: its program (ID {}) reads {} in place of the pinned one(s) ({}): the dataplane is split (a resize or an upgrade that did not finish), so traffic there sees other mappings and flows than the plugin's runs write: {FINISH}",
                split.at,
                split.program_id,
                maps.iter()
                    .map(|(name, id, _)| format!("{name} (map ID {id})"))
                    .collect::<Vec<_>>()
                    .join(", "),
                maps.iter()
                    .map(|(_, _, pinned)| format!("ID {pinned}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            SplitKind::Unpinned => format!(
                "{}: runs program ID {}, which is none of the pinned programs (a resize or an upgrade that did not finish left it there; it may read maps no longer pinned): {FINISH}",
                split.at, split.program_id
            ),
        });
    }
    if status.change_unfinished == Some(true) {
        problems.push(format!(
            "the last change of the programs or tables (an install, an upgrade, a resize) has not put them on every attachment yet (a run was killed or failed midway): {FINISH}"
        ));
    }
}

/// Up to three keys, then how many more: for one-line problems.
fn key_list(keys: &[MappingKey]) -> String {
    let mut shown: Vec<String> = keys
        .iter()
        .take(3)
        .map(|k| KeyDisplay(*k).to_string())
        .collect();
    if keys.len() > 3 {
        shown.push(format!("and {} more", keys.len() - 3));
    }
    shown.join(", ")
}

/// The problems and notes of [`NodeDrift`]: each problem with its fix.
fn judge_drift(drift: &NodeDrift, problems: &mut Vec<String>, notes: &mut Vec<String>) {
    const NEXT_RUN: &str = "run `ebpf-portmap reconcile` (the next CNI ADD, DEL, CHECK or GC, or the node agent's pass, does it too)";
    for (name, index) in &drift.unattached {
        problems.push(format!(
            "{name} (index {index}) does not carry the programs (added or re-created since the last plugin run), so host ports get no traffic there: {NEXT_RUN}"
        ));
    }
    for entry in &drift.unmatched {
        notes.push(format!(
            "`interfaces` entry {entry:?} matches no interface of this node (it has {}); skipped",
            drift.interfaces.join(", ")
        ));
    }
    for addr in &drift.unsynced {
        problems.push(format!(
            "node address {addr} is not known to the dataplane (added since the last plugin run), so host ports do not answer on it, from outside or from the node: {NEXT_RUN}"
        ));
    }
    for addr in &drift.stale {
        notes.push(format!(
            "{addr} is still taken for a node address but the node no longer has it (host ports answer on it as if it were): {NEXT_RUN}"
        ));
    }
    for mapping in &drift.absent_host_ips {
        notes.push(format!(
            "mapping {mapping}: its hostIP is not an address of this node (yet), so it sees no traffic until the address exists here"
        ));
    }
    if let Some(error) = &drift.unreadable {
        problems.push(format!(
            "cannot read the node's interfaces and addresses ({error}); run status as root in the node's network namespace"
        ));
    }
}

#[cfg(test)]
mod tests {
    use portmap_common::TraceFilter;

    use super::super::attachments::PinnedProgram;
    use super::super::fills::MapFill;
    use super::super::ownership::Ownership;
    use super::*;
    use crate::dataplane::features::AttachMode;
    fn healthy() -> Status {
        let tc = |direction| TcAttachment {
            ifindex: 2,
            interface: Some("eth0".into()),
            direction,
            mode: AttachMode::Tcx,
            link_id: Some(1),
            program_id: Some(10),
            attached: true,
        };
        let program = |name: &str| PinnedProgram {
            name: name.into(),
            build: "b".into(),
            id: Some(10),
            loaded_at: None,
            current: true,
        };
        Status {
            root: "/sys/fs/bpf/x".into(),
            installed: true,
            kernel: "6.18".into(),
            build: "b".into(),
            mode: Some(AttachMode::Tcx),
            fast_path: None,
            translation: None,
            programs: vec![program("portmap_ingress"), program("portmap_egress")],
            tc: vec![tc(Direction::Ingress), tc(Direction::Egress)],
            drift: NodeDrift::default(),
            other_links: Vec::new(),
            splits: Vec::new(),
            change_unfinished: Some(false),
            bridge_ports: Vec::new(),
            maps: vec![MapFill {
                name: "mappings".into(),
                map_type: "hash".into(),
                entries: Some(10),
                max_entries: 100,
                id: 1,
            }],
            evictions: None,
            missing_maps: Vec::new(),
            stats: Vec::new(),
            tracing: Some(TraceFilter::default()),
            ownership: Ownership::default(),
            problems: Vec::new(),
            notes: Vec::new(),
            stale_roots: Vec::new(),
            orphan_records: Vec::new(),
            misspelt_keys: Vec::new(),
            hooks_cgroup: None,
            firewalld: Some(false),
        }
    }

    fn judged(mut status: Status) -> Status {
        judge(&mut status);
        status
    }

    #[test]
    fn live_evictions_are_a_problem_until_quiet_for_an_hour_and_a_floods_a_note() {
        use std::time::Duration;
        let report = |live, unreplied, quiet: Option<u64>| EvictionReport {
            counts: Evictions { unreplied, live },
            live_quiet_for: quiet.map(Duration::from_secs),
        };
        let with = |evictions| {
            let mut status = healthy();
            status.evictions = Some(evictions);
            judged(status)
        };
        let flooded = with(report(0, 5000, None));
        assert_eq!(flooded.problems, Vec::<String>::new());
        assert!(
            flooded
                .notes
                .iter()
                .any(|n| n
                    .starts_with("5000 entries of flows never assured evicted from conntrack_new")),
            "{:?}",
            flooded.notes
        );
        // No agent has noted the count, or it grew since: a problem.
        for quiet in [None, Some(60)] {
            let lost = with(report(12, 0, quiet));
            assert_eq!(lost.problems.len(), 1, "{:?}", lost.problems);
            assert!(
                lost.problems[0].starts_with(
                    "12 entries of live (assured) flows evicted from conntrack/conntrack_other"
                ),
                "{:?}",
                lost.problems
            );
        }
        // None for an hour: history, a note.
        let once = with(report(12, 0, Some(7200)));
        assert_eq!(once.problems, Vec::<String>::new());
        assert!(
            once.notes
                .iter()
                .any(|n| n.contains("none in the last 120 min")),
            "{:?}",
            once.notes
        );
        assert_eq!(with(report(0, 0, None)).notes, healthy_notes());
    }

    fn healthy_notes() -> Vec<String> {
        judged(healthy()).notes
    }

    #[test]
    fn firewalld_in_the_namespace_is_a_note_naming_what_lets_flows_past_it() {
        use crate::dataplane::features::FastPathReport;
        let mut status = healthy();
        status.firewalld = Some(true);
        status.fast_path = Some(FastPathReport {
            mode: FastPathMode::Confirmed,
            why: String::new(),
        });
        let judged_default = judged(status.clone());
        assert!(judged_default.problems.is_empty());
        assert_eq!(judged_default.notes.len(), 1, "{:?}", judged_default.notes);
        assert!(judged_default.notes[0].contains("ct status dnat"));
        assert!(judged_default.notes[0].contains("fastPath: true lets them past FORWARD"));
        status.fast_path = Some(FastPathReport {
            mode: FastPathMode::Always,
            why: String::new(),
        });
        let judged_fast = judged(status.clone());
        assert!(judged_fast.notes[0].contains("skip FORWARD"));
        status.firewalld = None;
        assert!(judged(status).notes.is_empty(), "unknown: nothing said");
    }

    #[test]
    fn a_healthy_node_has_no_problems() {
        let status = judged(healthy());
        assert!(status.problems.is_empty(), "{:?}", status.problems);
        assert!(status.notes.is_empty(), "{:?}", status.notes);
    }

    #[test]
    fn every_missing_or_degraded_part_is_a_problem() {
        let mut missing_direction = healthy();
        missing_direction.tc.pop();
        assert_eq!(
            judged(missing_direction).problems,
            ["eth0: no egress program attached"]
        );

        let mut detached = healthy();
        detached.tc[0].attached = false;
        assert_eq!(
            judged(detached).problems,
            ["eth0: the pinned ingress attachment is not active in the kernel"]
        );

        let mut gone = healthy();
        for a in &mut gone.tc {
            a.interface = None;
        }
        let gone = judged(gone);
        // Only the pins are left: not a problem, but worth a note.
        assert_eq!(gone.problems, Vec::<String>::new());
        assert!(
            gone.notes[0].starts_with("1 interface(s) with pinned attachments no longer exist")
        );

        let mut full = healthy();
        full.maps[0].entries = Some(95);
        assert_eq!(
            judged(full).problems,
            ["map mappings is 95% full (95 of 100)"]
        );

        // A conntrack table full of flows is what churn leaves: the kernel
        // recycles it. Said, but the node stays healthy.
        let mut churned = healthy();
        churned.maps.push(MapFill {
            name: "conntrack_close".into(),
            map_type: "lru_hash".into(),
            entries: Some(4028),
            max_entries: 4096,
            id: 2,
        });
        let churned = judged(churned);
        assert_eq!(churned.problems, Vec::<String>::new());
        assert!(
            churned
                .notes
                .iter()
                .any(|n| n.starts_with("map conntrack_close is 98% full (4028 of 4096): it drops")),
            "{:?}",
            churned.notes
        );

        // Full of assured flows: each new one evicts a live flow.
        let mut live_evicted = healthy();
        live_evicted.maps.push(MapFill {
            name: "conntrack".into(),
            map_type: "lru_hash".into(),
            entries: Some(1000),
            max_entries: 1024,
            id: 3,
        });
        let live_evicted = judged(live_evicted);
        assert_eq!(
            live_evicted.problems.len(),
            1,
            "{:?}",
            live_evicted.problems
        );
        assert!(
            live_evicted.problems[0].starts_with(
                "map conntrack is 98% full (1000 of 1024): it holds assured (live) flows only"
            ),
            "{:?}",
            live_evicted.problems
        );
        // Full of a flood's unassured flows: said, the node stays healthy.
        let mut flooded = healthy();
        flooded.maps.push(MapFill {
            name: "conntrack_new".into(),
            map_type: "lru_hash".into(),
            entries: Some(1024),
            max_entries: 1024,
            id: 4,
        });
        let flooded = judged(flooded);
        assert_eq!(flooded.problems, Vec::<String>::new());
        assert!(
            flooded.notes[0].contains("assured flows are not affected"),
            "{:?}",
            flooded.notes
        );

        let mut no_program = healthy();
        no_program.programs.remove(1);
        no_program.missing_maps.push("counters");
        assert_eq!(
            judged(no_program).problems,
            [
                "map counters is not pinned",
                "program portmap_egress is not pinned"
            ]
        );

        let mut nothing = healthy();
        nothing.tc.clear();
        assert_eq!(
            judged(nothing).problems,
            ["the programs are attached to no interface"]
        );

        let mut stale_trace = healthy();
        stale_trace.tracing = Some(TraceFilter {
            enabled: 1,
            tracer_pid: u32::MAX,
            ..TraceFilter::default()
        });
        assert!(judged(stale_trace).problems[0].contains("tracing was left on"));

        let mut uninstalled = healthy();
        uninstalled.installed = false;
        uninstalled.tc.clear();
        assert!(judged(uninstalled).problems[0].starts_with("nothing is installed"));
    }

    #[test]
    fn ownership_differences_are_problems() {
        let key = |port: u16| MappingKey {
            host_port_be: port.to_be(),
            proto: 6,
            family: 4,
            ..MappingKey::default()
        };
        let mut status = healthy();
        status.ownership = Ownership {
            orphans: vec![(0xab, vec![key(1), key(2), key(3), key(4)])],
            missing: vec![
                ("c/eth0 (network n)".into(), key(5), None),
                (
                    "c/eth0 (network n)".into(),
                    key(6),
                    Some("d/eth0 (network n)".into()),
                ),
            ],
            unindexed: vec![("d/eth0 (network n)".into(), key(7))],
        };
        let problems = judged(status).problems;
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(
            problems[0].starts_with(
                "4 mapping(s) of owner 00000000000000ab (0.0.0.0:1/tcp, 0.0.0.0:2/tcp, 0.0.0.0:3/tcp, and 1 more) have no owner record"
            ),
            "{problems:#?}"
        );
        assert!(problems[0].contains("gc --orphans"));
        assert!(
            problems[1].starts_with("mapping 0.0.0.0:5/tcp of c/eth0 (network n) is missing"),
            "{problems:#?}"
        );
        assert!(problems[2].contains("is held by d/eth0 (network n)"));
        assert!(
            problems[3].contains("0.0.0.0:7/tcp of d/eth0 (network n) is not in its owner's index")
        );
    }

    #[test]
    fn the_node_moving_on_is_a_problem_with_its_fix() {
        let mut drifted = healthy();
        drifted.drift = NodeDrift {
            unattached: vec![("eth2".into(), 9)],
            unmatched: vec!["bond0.*".into()],
            interfaces: vec!["eth0".into(), "eth2".into()],
            unsynced: vec!["198.18.0.77".parse().unwrap()],
            stale: vec!["198.18.0.66".parse().unwrap()],
            absent_host_ips: vec!["198.18.0.99:8080/tcp".into()],
            covered: vec!["198.18.0.1".parse().unwrap()],
            // Never a problem: the node's on purpose.
            vip_excluded: vec![("10.96.0.1".parse().unwrap(), "kube-ipvs0".into())],
            unreadable: None,
        };
        let drifted = judged(drifted);
        assert_eq!(drifted.problems.len(), 2, "{:?}", drifted.problems);
        assert!(drifted.problems[0].starts_with("eth2 (index 9) does not carry the programs"));
        assert!(drifted.problems[1].starts_with("node address 198.18.0.77 is not known"));
        for problem in &drifted.problems {
            assert!(
                problem.contains("run `ebpf-portmap reconcile`"),
                "{problem}"
            );
        }
        // A pattern for other nodes, an address gone (harmless until the
        // next run) and a VIP not here (yet) are expected.
        assert_eq!(drifted.notes.len(), 3, "{:?}", drifted.notes);
        assert!(drifted.notes[0].contains("\"bond0.*\" matches no interface"));
        assert!(drifted.notes[1].starts_with("198.18.0.66 is still taken"));
        assert!(drifted.notes[2].starts_with("mapping 198.18.0.99:8080/tcp: its hostIP"));
    }

    #[test]
    fn a_split_and_an_unfinished_change_are_problems_naming_reconcile() {
        use super::super::attachments::Split;
        let mut split = healthy();
        split.splits = vec![
            Split {
                at: "eth0 ingress".into(),
                program_id: 7,
                kind: SplitKind::StaleMaps(vec![("mappings".into(), 12, 34)]),
            },
            Split {
                at: "link cg1_connect4".into(),
                program_id: 8,
                kind: SplitKind::Unpinned,
            },
        ];
        split.change_unfinished = Some(true);
        let problems = judged(split).problems;
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(
            problems[0].starts_with(
                "eth0 ingress: its program (ID 7) reads mappings (map ID 12) in place of the pinned one(s) (ID 34): the dataplane is split"
            ),
            "{problems:#?}"
        );
        assert!(
            problems[1].starts_with(
                "link cg1_connect4: runs program ID 8, which is none of the pinned programs"
            ),
            "{problems:#?}"
        );
        assert!(problems[2].starts_with("the last change of the programs or tables"));
        for problem in &problems {
            assert!(
                problem.contains("run `ebpf-portmap reconcile`"),
                "{problem}"
            );
        }

        // Nothing pinned nor attached: nothing to finish.
        let mut nothing = healthy();
        nothing.change_unfinished = None;
        assert!(judged(nothing).problems.is_empty());
    }

    #[test]
    fn another_build_is_a_note_not_a_problem() {
        let mut old = healthy();
        for p in &mut old.programs {
            p.current = false;
        }
        let old = judged(old);
        assert!(old.problems.is_empty());
        assert!(old.notes[0].contains("another build"), "{:?}", old.notes);
    }
}
