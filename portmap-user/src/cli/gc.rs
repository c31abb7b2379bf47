//! `ebpf-portmap gc`: removes what containers that are gone left behind.

use std::{
    process::ExitCode,
    time::{Duration, UNIX_EPOCH},
};

use portmap_user::{
    logging::utc_timestamp,
    model::Attachment,
    ops::gc::{self, Collected, GoneReclaim, Request, pod_words},
};
use serde_json::json;

use crate::cli::{
    PinRootArg, installed,
    output::{OutputArgs, print, print_json},
};

/// Remove the mappings of containers that no longer exist.
///
/// The runtime normally does this through CNI GC; this is the same for an
/// operator, and conservative: it removes nothing unless told what to keep.
///
/// With --network, every owner of that network that is not listed with
/// --keep CONTAINERID/IFNAME is removed with all its mappings, exactly as a
/// CNI GC with that keep-list would (pass --keep-none to remove them all).
///
/// With --empty-owners, owners of any network that hold no mapping any more
/// (left by an interrupted ADD or DEL) are removed, if they are older than
/// --min-age (an ADD in progress holds none for a moment).
///
/// With --orphans, mappings whose owner record is gone (no DEL will ever
/// remove them; left by an ADD that raced a GC in builds before the fix, or
/// by a record deleted by hand) are removed, once first seen at least
/// --min-age seconds ago by a GC (CNI GC waits a minute).
///
/// With --gone, the mappings of containers whose network namespace is gone
/// (the path the runtime gave at ADD is missing or holds another namespace,
/// and nothing else holds it) are removed once a GC (this one, or the
/// agent's) first found them gone at least --gone-grace seconds ago; each
/// is named with its pod. Containers nothing proves gone (no CNI_NETNS at
/// ADD, added by an older build, a path of a mount namespace this process
/// cannot see) are left and named.
///
/// With --stale-links, the pinned attachments of interfaces that no longer
/// exist (the host ends of removed containers' veths) are unpinned.
///
/// With --expired-flows, the conntrack entries of flows that idled out
/// (which the tables keep until they evict them) are removed and booked,
/// so that what `status` counts as evicted from the assured tables is what
/// live flows lost, and the time the count of live evictions last grew is
/// noted (status calls them history an hour later). The agent does this
/// at every GC run.
///
/// Whatever is asked, traffic counters of mappings that no longer exist are
/// pruned (counted, with --dry-run). Each class asked for is reported, also
/// when it finds nothing; without any, gc is a usage error (exit 2).
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ebpf-portmap gc --network podman --keep 3f2a9c.../eth0 --keep 77b1e0.../eth0 --dry-run
  ebpf-portmap gc --network podman --keep-none
  ebpf-portmap gc --empty-owners --stale-links
  ebpf-portmap gc --orphans --min-age 0
  ebpf-portmap gc --gone --gone-grace 0
  ebpf-portmap gc --expired-flows")]
pub struct GcArgs {
    #[command(flatten)]
    pin: PinRootArg,
    /// Remove owners of this network (the conflist's `name`) not kept.
    #[arg(long, value_name = "NAME", requires = "keep_list")]
    network: Option<String>,
    /// An attachment to keep, as CONTAINERID/IFNAME (repeat it).
    #[arg(
        long,
        value_name = "ID/IFNAME",
        value_parser = parse_attachment,
        group = "keep_list",
        requires = "network"
    )]
    keep: Vec<Attachment>,
    /// With --network: keep nothing, remove every owner of the network.
    #[arg(long, group = "keep_list", requires = "network")]
    keep_none: bool,
    /// Remove owners (of any network) that hold no mapping.
    #[arg(long)]
    empty_owners: bool,
    /// Remove mappings whose owner record is gone.
    #[arg(long)]
    orphans: bool,
    /// With --empty-owners: only owners added at least this many seconds
    /// ago; with --orphans: only orphans a GC first saw this long ago.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    min_age: u64,
    /// Remove the mappings of containers whose network namespace is gone.
    #[arg(long)]
    gone: bool,
    /// With --gone: only containers a GC first found gone this many
    /// seconds ago.
    #[arg(long, value_name = "SECONDS", default_value_t = gc::GONE_GRACE_SECS, requires = "gone")]
    gone_grace: u64,
    /// Unpin the attachments of interfaces that no longer exist.
    #[arg(long)]
    stale_links: bool,
    /// Remove the conntrack entries of flows that idled out.
    #[arg(long)]
    expired_flows: bool,
    /// Say what would be removed, remove nothing.
    #[arg(long)]
    dry_run: bool,
}

fn parse_attachment(text: &str) -> Result<Attachment, String> {
    let (container_id, ifname) = text
        .rsplit_once('/')
        .filter(|(id, ifname)| !id.is_empty() && !ifname.is_empty())
        .ok_or_else(|| format!("{text:?} is not CONTAINERID/IFNAME"))?;
    Ok(Attachment {
        container_id: container_id.to_owned(),
        ifname: ifname.to_owned(),
    })
}

/// "1 mapping", "2 mappings": counts in words an operator reads.
fn count(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

impl GcArgs {
    fn request(&self) -> Request {
        Request {
            network: self.network.clone(),
            keep: self.keep.clone(),
            empty_owners: self.empty_owners,
            orphans: self.orphans,
            min_age: self.min_age,
            gone: self.gone,
            gone_grace: self.gone_grace,
            stale_links: self.stale_links,
            expired_flows: self.expired_flows,
            dry_run: self.dry_run,
        }
    }
}

pub fn run(args: &GcArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    let request = args.request();
    if !request.asks_anything() {
        // The command line is incomplete: a usage error, like clap's own.
        return Ok(crate::cli::usage_refusal(
            "say what to collect: --network NAME with --keep/--keep-none, --empty-owners, --orphans, --gone, --stale-links, or --expired-flows",
            out,
        ));
    }
    let root = &args.pin.pin_root;
    let Some(layout) = installed(root)? else {
        if out.json() {
            print_json(&json!({"installed": false, "pinRoot": root}));
        } else {
            print(&format!(
                "nothing is installed under {}: nothing to collect\n",
                root.display()
            ));
        }
        return Ok(ExitCode::SUCCESS);
    };
    let collected = gc::collect(&layout, &request)?;
    if out.json() {
        print_json(&json_of(&request, &collected, root));
    } else {
        for line in lines(&request, &collected) {
            print(&format!("{line}\n"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// "removed" or "would remove".
fn verb(request: &Request) -> &'static str {
    if request.dry_run {
        "would remove"
    } else {
        "removed"
    }
}

/// What the collection did, a line each, class by class.
fn lines(request: &Request, collected: &Collected) -> Vec<String> {
    let verb = verb(request);
    let mut lines = Vec::new();
    if let Some(owners) = &collected.owners {
        for removed in owners {
            lines.push(match removed.mappings {
                None => format!("{verb} owner {}", removed.owner),
                Some(n) => format!(
                    "{verb} owner {}: {}",
                    removed.owner,
                    count(n, "mapping", "mappings")
                ),
            });
        }
    }
    if let Some(orphans) = &collected.orphans {
        let was = if request.dry_run { "is" } else { "was" };
        for (id, mappings) in &orphans.reclaimed {
            lines.push(format!(
                "{verb} {} of owner {id:016x}, whose record {was} gone",
                count(*mappings, "mapping", "mappings")
            ));
        }
        for (id, first_seen) in &orphans.waiting {
            lines.push(format!(
                "kept the mappings of owner {id:016x}, whose record is gone: first seen {}s ago, less than --min-age {}",
                collected.now.saturating_sub(*first_seen),
                request.min_age
            ));
        }
        if orphans.reclaimed.is_empty() && orphans.waiting.is_empty() {
            lines.push("no mapping without an owner".into());
        }
    }
    if let Some(gone) = &collected.gone {
        gone_lines(request, gone, collected.now, &mut lines);
    }
    if let Some(stale) = collected.traffic_counters {
        lines.push(match stale {
            0 => "no stale traffic counter".into(),
            n => format!(
                "{verb} {}",
                count(n, "stale traffic counter", "stale traffic counters")
            ),
        });
    }
    if collected.sock_counters > 0 {
        lines.push(format!(
            "{verb} {}",
            count(
                collected.sock_counters,
                "stale socket-hook counter",
                "stale socket-hook counters"
            )
        ));
    }
    if let Some(restored) = collected.port_filter_restored.filter(|n| *n > 0) {
        lines.push(format!(
            "restored the port-filter bits of {}",
            count(restored, "mapping", "mappings")
        ));
    }
    if let Some(stale) = &collected.stale_links {
        for pin in stale {
            lines.push(format!("{verb} stale attachment pin {}", pin.display()));
        }
        if stale.is_empty() {
            lines.push("no stale attachment pin".into());
        }
    }
    if let Some(swept) = &collected.expired_flows {
        lines.push(match swept.total() {
            0 => "no expired conntrack entry".into(),
            n => format!(
                "{verb} {} ({} of assured flows, {} of flows never assured, {} closed)",
                count(
                    n as usize,
                    "expired conntrack entry",
                    "expired conntrack entries"
                ),
                swept.live,
                swept.unreplied,
                swept.closed
            ),
        });
    }
    if collected.owners.as_ref().is_some_and(Vec::is_empty) {
        lines.push("no owner to remove".into());
    }
    lines
}

/// --gone: the containers removed (or to be), those within the grace
/// period, and those nothing proves gone.
fn gone_lines(request: &Request, outcome: &GoneReclaim, now: u64, lines: &mut Vec<String>) {
    let verb = verb(request);
    let netns = |path: &Option<std::path::PathBuf>| {
        path.as_deref()
            .map_or_else(|| "?".into(), |p| p.display().to_string())
    };
    for gone in &outcome.removed {
        lines.push(format!(
            "{verb} {} of container {} ({}, network {}): its network namespace {} is gone (first seen {})",
            count(gone.mappings, "mapping", "mappings"),
            gone.container_id,
            pod_words(&gone.pod),
            gone.network,
            netns(&gone.netns),
            timestamp(gone.gone_since),
        ));
    }
    for gone in &outcome.waiting {
        lines.push(format!(
            "kept the mappings of container {} ({}): its network namespace {} is gone, first seen {}s ago, less than --gone-grace {}",
            gone.container_id,
            pod_words(&gone.pod),
            netns(&gone.netns),
            now.saturating_sub(gone.gone_since),
            request.gone_grace
        ));
    }
    for (container_id, why) in &outcome.unproven {
        lines.push(format!(
            "kept the mappings of container {container_id}: nothing proves it gone ({why})"
        ));
    }
    if outcome.removed.is_empty() && outcome.waiting.is_empty() {
        lines.push("no container whose network namespace is gone".into());
    }
}

fn timestamp(unix: u64) -> String {
    utc_timestamp(UNIX_EPOCH + Duration::from_secs(unix))
}

/// `-o json`: the same, keyed.
fn json_of(request: &Request, collected: &Collected, root: &std::path::Path) -> serde_json::Value {
    let owners: Vec<_> = collected
        .owners
        .iter()
        .flatten()
        .map(|removed| match removed.mappings {
            None => json!({"owner": removed.owner}),
            Some(n) => json!({"owner": removed.owner, "mappings": n}),
        })
        .collect();
    let orphans: Vec<_> = collected
        .orphans
        .iter()
        .flat_map(|o| &o.reclaimed)
        .map(|(id, n)| json!({"owner": format!("{id:016x}"), "mappings": n}))
        .collect();
    let mut gone = Vec::new();
    if let Some(outcome) = &collected.gone {
        for owner in &outcome.removed {
            gone.push(json!({
                "containerID": owner.container_id,
                "network": owner.network,
                "ifname": owner.ifname,
                "podNamespace": owner.pod.pod_namespace,
                "podName": owner.pod.pod_name,
                "podUID": owner.pod.pod_uid,
                "netns": owner.netns,
                "goneSince": timestamp(owner.gone_since),
                "mappings": owner.mappings,
                "removed": !request.dry_run,
            }));
        }
        for owner in &outcome.waiting {
            gone.push(json!({
                "containerID": owner.container_id,
                "podUID": owner.pod.pod_uid,
                "goneSince": timestamp(owner.gone_since),
                "removed": false,
            }));
        }
    }
    let pruned_counters = match (collected.traffic_counters, collected.sock_counters) {
        (None, 0) => None,
        (traffic, sock) => Some(traffic.unwrap_or(0) + sock),
    };
    let stale_links: Vec<String> = collected
        .stale_links
        .iter()
        .flatten()
        .map(|pin| pin.display().to_string())
        .collect();
    json!({
        "installed": true,
        "pinRoot": root,
        "dryRun": request.dry_run,
        "owners": owners,
        "orphans": orphans,
        "gone": gone,
        "prunedCounters": pruned_counters,
        "portFilterRestored": collected.port_filter_restored,
        "staleLinks": stale_links,
        "expiredFlows": collected.expired_flows.map(|swept| json!({
            "live": swept.live,
            "unreplied": swept.unreplied,
            "closed": swept.closed,
        })),
    })
}

#[cfg(test)]
mod tests {
    use portmap_user::{
        model::PodIdentity,
        ops::gc::{GoneOwner, OrphanReclaim, RemovedOwner},
    };

    use super::*;

    fn gone(mappings: usize, gone_since: u64) -> GoneOwner {
        GoneOwner {
            id: 7,
            network: "podman".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            pod: PodIdentity::default(),
            netns: None,
            gone_since,
            mappings,
        }
    }

    #[test]
    fn each_class_asked_for_is_reported_in_order_also_when_it_found_nothing() {
        let request = Request {
            network: Some("podman".into()),
            orphans: true,
            min_age: 60,
            gone: true,
            gone_grace: 300,
            stale_links: true,
            ..Request::default()
        };
        let collected = Collected {
            now: 1_000,
            owners: Some(vec![RemovedOwner {
                owner: "c2/eth0 (network podman)".into(),
                mappings: Some(2),
            }]),
            orphans: Some(OrphanReclaim {
                reclaimed: vec![(0xab, 1)],
                waiting: vec![(0xcd, 990)],
            }),
            gone: Some(GoneReclaim {
                removed: Vec::new(),
                waiting: vec![gone(0, 900)],
                unproven: vec![("c3".into(), "no sandbox recorded".into())],
            }),
            traffic_counters: Some(0),
            sock_counters: 1,
            port_filter_restored: Some(3),
            stale_links: Some(Vec::new()),
            expired_flows: None,
        };
        assert_eq!(
            lines(&request, &collected),
            [
                "removed owner c2/eth0 (network podman): 2 mappings",
                "removed 1 mapping of owner 00000000000000ab, whose record was gone",
                "kept the mappings of owner 00000000000000cd, whose record is gone: first seen 10s ago, less than --min-age 60",
                "kept the mappings of container c1 (no known pod): its network namespace ? is gone, first seen 100s ago, less than --gone-grace 300",
                "kept the mappings of container c3: nothing proves it gone (no sandbox recorded)",
                "no stale traffic counter",
                "removed 1 stale socket-hook counter",
                "restored the port-filter bits of 3 mappings",
                "no stale attachment pin",
            ]
        );
        let json = json_of(&request, &collected, std::path::Path::new("/sys/fs/bpf/x"));
        assert_eq!(json["prunedCounters"], 1);
        assert_eq!(json["owners"][0]["mappings"], 2);
        assert_eq!(json["gone"][0]["removed"], false);
    }

    #[test]
    fn a_dry_run_says_would_and_an_owner_class_that_found_none_says_so() {
        let request = Request {
            empty_owners: true,
            orphans: true,
            dry_run: true,
            ..Request::default()
        };
        let collected = Collected {
            owners: Some(Vec::new()),
            orphans: Some(OrphanReclaim {
                reclaimed: vec![(1, 2)],
                waiting: Vec::new(),
            }),
            ..Collected::default()
        };
        assert_eq!(
            lines(&request, &collected),
            [
                "would remove 2 mappings of owner 0000000000000001, whose record is gone",
                "no owner to remove",
            ]
        );
        let json = json_of(&request, &collected, std::path::Path::new("/x"));
        assert_eq!(json["dryRun"], true);
        assert_eq!(json["prunedCounters"], serde_json::Value::Null);
    }
}
