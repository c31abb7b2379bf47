//! `ebpf-portmap gc`: removes what containers that are gone left behind.

use std::{
    process::ExitCode,
    time::{Duration, UNIX_EPOCH},
};

use anyhow::Context;
use portmap_user::{
    dataplane::counters,
    dataplane::maps,
    dataplane::maps::Maps,
    dataplane::ownership::{GoneOwner, GoneReclaim, record_is, record_network_is, record_strings},
    logging::utc_timestamp,
    model::{Attachment, Liveness, Owner, PodIdentity},
    node::sandbox::Judge,
    ops::uninstall,
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
/// Whatever is asked, traffic counters of mappings that no longer exist are
/// pruned (counted, with --dry-run). Each class asked for is reported, also
/// when it finds nothing; without any, gc is a usage error (exit 2).
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ebpf-portmap gc --network podman --keep 3f2a9c.../eth0 --keep 77b1e0.../eth0 --dry-run
  ebpf-portmap gc --network podman --keep-none
  ebpf-portmap gc --empty-owners --stale-links
  ebpf-portmap gc --orphans --min-age 0
  ebpf-portmap gc --gone --gone-grace 0")]
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
    #[arg(long, value_name = "SECONDS", default_value_t = portmap_user::dataplane::ownership::GONE_GRACE_SECS, requires = "gone")]
    gone_grace: u64,
    /// Unpin the attachments of interfaces that no longer exist.
    #[arg(long)]
    stale_links: bool,
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

/// "pod default/web (UID 5c9e…)", "pod UID 5c9e…", "no known pod".
fn pod_words(pod: &PodIdentity) -> String {
    let mut named = pod.clone();
    let uid = named.pod_uid.take();
    match (named.is_empty(), uid) {
        (false, Some(uid)) => format!("{named} (UID {uid})"),
        (false, None) => named.to_string(),
        (true, Some(uid)) => format!("pod UID {uid}"),
        (true, None) => "no known pod".into(),
    }
}

/// --gone: removes (or, with --dry-run, names) the owners whose container's
/// namespace is gone, and says which it cannot judge.
fn gone_containers(
    args: &GcArgs,
    maps: &mut Maps,
    now: u64,
    lines: &mut Vec<String>,
    json_out: &mut Vec<serde_json::Value>,
) -> anyhow::Result<()> {
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    let outcome = if args.dry_run {
        // Judged, nothing written (not even the first sighting).
        let mut judge = Judge::new();
        let mut outcome = GoneReclaim::default();
        let held = maps
            .owners_with_mappings()
            .context("reading the mappings")?;
        for (id, record) in maps.owners().context("reading the owners")? {
            if !held.contains(&id) {
                continue;
            }
            let (network, container_id, ifname) = record_strings(&record);
            let Some(sandbox) = maps.sandbox_of(id) else {
                outcome.unproven.push((
                    container_id,
                    "no sandbox recorded (added by an older build)".into(),
                ));
                continue;
            };
            match judge.judge(&sandbox) {
                Liveness::Alive => {}
                Liveness::Unknown(why) => outcome.unproven.push((container_id, why)),
                Liveness::Gone => outcome.removed.push(GoneOwner {
                    id,
                    network,
                    container_id,
                    ifname,
                    pod: maps.pod_of(id),
                    netns: sandbox.netns.clone(),
                    gone_since: sandbox.gone_since.unwrap_or(now),
                    mappings: maps.owner_index(id).map_or(0, |keys| keys.len()),
                }),
            }
        }
        outcome
    } else {
        portmap_user::verbs::reclaim_gone_containers("gc", maps, args.gone_grace)
            .context("removing the mappings of containers that are gone")?
    };
    for gone in &outcome.removed {
        lines.push(format!(
            "{verb} {} of container {} ({}, network {}): its network namespace {} is gone (first seen {})",
            count(gone.mappings, "mapping", "mappings"),
            gone.container_id,
            pod_words(&gone.pod),
            gone.network,
            gone.netns.as_deref().map_or_else(|| "?".into(), |p| p.display().to_string()),
            utc_timestamp(UNIX_EPOCH + Duration::from_secs(gone.gone_since)),
        ));
        json_out.push(json!({
            "containerID": gone.container_id,
            "network": gone.network,
            "ifname": gone.ifname,
            "podNamespace": gone.pod.pod_namespace,
            "podName": gone.pod.pod_name,
            "podUID": gone.pod.pod_uid,
            "netns": gone.netns,
            "goneSince": utc_timestamp(UNIX_EPOCH + Duration::from_secs(gone.gone_since)),
            "mappings": gone.mappings,
            "removed": !args.dry_run,
        }));
    }
    for gone in &outcome.waiting {
        lines.push(format!(
            "kept the mappings of container {} ({}): its network namespace {} is gone, first seen {}s ago, less than --gone-grace {}",
            gone.container_id,
            pod_words(&gone.pod),
            gone.netns.as_deref().map_or_else(|| "?".into(), |p| p.display().to_string()),
            now.saturating_sub(gone.gone_since),
            args.gone_grace
        ));
        json_out.push(json!({
            "containerID": gone.container_id,
            "podUID": gone.pod.pod_uid,
            "goneSince": utc_timestamp(UNIX_EPOCH + Duration::from_secs(gone.gone_since)),
            "removed": false,
        }));
    }
    for (container_id, why) in &outcome.unproven {
        lines.push(format!(
            "kept the mappings of container {container_id}: nothing proves it gone ({why})"
        ));
    }
    if outcome.removed.is_empty() && outcome.waiting.is_empty() {
        lines.push("no container whose network namespace is gone".into());
    }
    Ok(())
}

pub fn run(args: &GcArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    if args.network.is_none()
        && !args.empty_owners
        && !args.stale_links
        && !args.orphans
        && !args.gone
    {
        // The command line is incomplete: a usage error, like clap's own.
        return Ok(crate::cli::usage_refusal(
            "say what to collect: --network NAME with --keep/--keep-none, --empty-owners, --orphans, --gone, or --stale-links",
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
    let mut maps = Maps::open(&layout)
        .with_context(|| format!("cannot open the maps under {}", root.display()))?;
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    let mut lines: Vec<String> = Vec::new();
    let mut doomed: Vec<(u64, String)> = Vec::new();
    let held = maps
        .owners_with_mappings()
        .context("reading the mappings")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    for (id, record) in maps.owners().context("reading the owners")? {
        let (network, container_id, ifname) = record_strings(&record);
        // Matched whole, like CNI GC (`Maps::collect_garbage`).
        let by_network = args.network.as_deref().is_some_and(|wanted| {
            record_network_is(id, &record, wanted) == Some(true)
                && !args.keep.iter().any(|k| {
                    let kept = Owner {
                        network: wanted.to_owned(),
                        container_id: k.container_id.clone(),
                        ifname: k.ifname.clone(),
                    };
                    record_is(id, &record, &kept)
                })
        });
        let empty = args.empty_owners
            && !held.contains(&id)
            && now.saturating_sub(record.created_unix) >= args.min_age;
        if by_network || empty {
            doomed.push((id, format!("{container_id}/{ifname} (network {network})")));
        }
    }
    let mut owners = Vec::new();
    for (id, owner) in &doomed {
        if args.dry_run {
            lines.push(format!("{verb} owner {owner}"));
            owners.push(json!({"owner": owner}));
            continue;
        }
        let removed = maps
            .remove_owner(*id)
            .with_context(|| format!("removing owner {owner}"))?;
        lines.push(format!(
            "{verb} owner {owner}: {}",
            count(removed, "mapping", "mappings")
        ));
        owners.push(json!({"owner": owner, "mappings": removed}));
    }
    let mut orphans = Vec::new();
    if args.orphans {
        if args.dry_run {
            for (id, keys) in maps.orphans().context("reading the mappings")? {
                lines.push(format!(
                    "{verb} {} of owner {id:016x}, whose record is gone",
                    count(keys.len(), "mapping", "mappings")
                ));
                orphans.push(json!({"owner": format!("{id:016x}"), "mappings": keys.len()}));
            }
            if orphans.is_empty() {
                lines.push("no mapping without an owner".into());
            }
        } else {
            let outcome = maps
                .reclaim_orphans(&layout, args.min_age, now)
                .context("reclaiming mappings without an owner")?;
            for (id, count_of) in &outcome.reclaimed {
                lines.push(format!(
                    "{verb} {} of owner {id:016x}, whose record was gone",
                    count(*count_of, "mapping", "mappings")
                ));
                orphans.push(json!({"owner": format!("{id:016x}"), "mappings": count_of}));
            }
            for (id, first_seen) in &outcome.waiting {
                lines.push(format!(
                    "kept the mappings of owner {id:016x}, whose record is gone: first seen {}s ago, less than --min-age {}",
                    now.saturating_sub(*first_seen),
                    args.min_age
                ));
            }
            if outcome.reclaimed.is_empty() && outcome.waiting.is_empty() {
                lines.push("no mapping without an owner".into());
            }
        }
    }
    let mut gone = Vec::new();
    if args.gone {
        gone_containers(args, &mut maps, now, &mut lines, &mut gone)?;
    }
    // With --dry-run: how many a run would prune.
    let mut pruned_counters = None;
    match maps::counters(&layout) {
        Ok(mut map) => {
            let stale = if args.dry_run {
                counters::stale_keys(&map, &maps.mappings)
                    .context("reading the traffic counters")?
            } else {
                counters::prune(&mut map, &maps.mappings).context("pruning the traffic counters")?
            };
            lines.push(match stale.len() {
                0 => "no stale traffic counter".into(),
                n => format!(
                    "{verb} {}",
                    count(n, "stale traffic counter", "stale traffic counters")
                ),
            });
            pruned_counters = Some(stale.len());
        }
        Err(error) => log::warn!("traffic counters not pruned: {error}"),
    }
    // The socket hooks' counters, keyed alike (missing in older pins):
    // counted with the traffic counters.
    if let Ok(mut map) = maps::sock_counters(&layout) {
        let stale = if args.dry_run {
            counters::stale_keys(&map, &maps.mappings)
                .context("reading the socket-hook counters")?
        } else {
            counters::prune(&mut map, &maps.mappings).context("pruning the socket-hook counters")?
        };
        if !stale.is_empty() {
            lines.push(format!(
                "{verb} {}",
                count(
                    stale.len(),
                    "stale socket-hook counter",
                    "stale socket-hook counters"
                )
            ));
            pruned_counters = Some(pruned_counters.unwrap_or(0) + stale.len());
        }
    }
    // A mapping whose ports are missing from the programs' port filter is
    // never translated; every GC that writes restores them.
    let mut port_filter_restored = None;
    if !args.dry_run {
        let restored = maps.mark_every_mapping();
        if restored > 0 {
            lines.push(format!(
                "restored the port-filter bits of {}",
                count(restored, "mapping", "mappings")
            ));
        }
        port_filter_restored = Some(restored);
    }
    let mut stale_links = Vec::new();
    if args.stale_links {
        let stale = uninstall::remove_stale_links(&layout, args.dry_run)
            .context("removing stale attachment pins")?;
        for pin in &stale {
            lines.push(format!("{verb} stale attachment pin {}", pin.display()));
            stale_links.push(pin.display().to_string());
        }
        if stale.is_empty() {
            lines.push("no stale attachment pin".into());
        }
    }
    if doomed.is_empty() && (args.network.is_some() || args.empty_owners) {
        lines.push("no owner to remove".into());
    }
    if out.json() {
        print_json(&json!({
            "installed": true,
            "pinRoot": root,
            "dryRun": args.dry_run,
            "owners": owners,
            "orphans": orphans,
            "gone": gone,
            "prunedCounters": pruned_counters,
            "portFilterRestored": port_filter_restored,
            "staleLinks": stale_links,
        }));
    } else {
        for line in lines {
            print(&format!("{line}\n"));
        }
    }
    Ok(ExitCode::SUCCESS)
}
