//! The operator's GC (`ebpf-portmap gc`): the owners of a network not
//! kept, owners that hold nothing, mappings whose owner is gone, containers
//! whose namespace is gone, stale traffic counters and attachment pins.
//! Every class asked for is collected (or, on a dry run, only named) here;
//! `cli/gc.rs` prints the [`Collected`] it gets back.

use std::path::PathBuf;

use crate::{
    dataplane::{
        counters::{self, CountersError},
        ledger::{self, Swept},
        maps::{self, MapsError},
        ownership::{Store, StoreError, record_is, record_network_is, record_strings},
        pin::PinLayout,
    },
    model::{Attachment, Liveness, Owner},
    node::sandbox::Judge,
    ops::uninstall::{self, UninstallError},
    verbs::PluginError,
};

pub use crate::dataplane::ownership::{GONE_GRACE_SECS, GoneOwner, GoneReclaim, OrphanReclaim};
pub use crate::verbs::pod_words;

/// What to collect.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// Remove the owners of this network not in `keep`.
    pub network: Option<String>,
    pub keep: Vec<Attachment>,
    /// Remove owners of any network holding no mapping, added at least
    /// `min_age` seconds ago.
    pub empty_owners: bool,
    /// Remove mappings whose owner record is gone, first seen by a GC at
    /// least `min_age` seconds ago.
    pub orphans: bool,
    pub min_age: u64,
    /// Remove the mappings of containers whose namespace a GC first found
    /// gone at least `gone_grace` seconds ago.
    pub gone: bool,
    pub gone_grace: u64,
    /// Unpin the attachments of interfaces that no longer exist.
    pub stale_links: bool,
    /// Remove conntrack entries of flows that idled out (see
    /// `dataplane::ledger`).
    pub expired_flows: bool,
    /// Judge and name, write nothing (not even a first sighting).
    pub dry_run: bool,
}

impl Request {
    /// Whether anything is asked for at all.
    pub fn asks_anything(&self) -> bool {
        self.network.is_some()
            || self.empty_owners
            || self.orphans
            || self.gone
            || self.stale_links
            || self.expired_flows
    }
}

/// An owner removed (or, on a dry run, to be removed).
#[derive(Debug, Clone)]
pub struct RemovedOwner {
    /// `CONTAINERID/IFNAME (network NAME)`.
    pub owner: String,
    /// The mappings it held; `None` on a dry run.
    pub mappings: Option<usize>,
}

/// What a collection did, class by class; a class not asked for is `None`.
#[derive(Debug, Default)]
pub struct Collected {
    /// The Unix time the collection judged ages by.
    pub now: u64,
    /// With `network` or `empty_owners`.
    pub owners: Option<Vec<RemovedOwner>>,
    /// With `orphans`: on a dry run every orphan as reclaimed (owner ID,
    /// mappings), none waiting.
    pub orphans: Option<OrphanReclaim>,
    /// With `gone`.
    pub gone: Option<GoneReclaim>,
    /// Stale traffic counters pruned (counted on a dry run); `None` when
    /// the counters map could not be opened.
    pub traffic_counters: Option<usize>,
    /// Stale socket-hook counters pruned (counted on a dry run).
    pub sock_counters: usize,
    /// Mappings whose port-filter bits were restored; `None` on a dry run.
    pub port_filter_restored: Option<usize>,
    /// With `stale_links`: the attachment pins removed (or to be).
    pub stale_links: Option<Vec<PathBuf>>,
    /// With `expired_flows`: the expired conntrack entries removed (or to
    /// be).
    pub expired_flows: Option<Swept>,
}

#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error("cannot open the maps under {}", root.display())]
    Open {
        root: PathBuf,
        #[source]
        source: Box<MapsError>,
    },
    #[error("reading the {what}")]
    Read {
        what: &'static str,
        #[source]
        source: Box<StoreError>,
    },
    #[error("removing owner {owner}")]
    RemoveOwner {
        owner: String,
        #[source]
        source: Box<StoreError>,
    },
    #[error("reclaiming mappings without an owner")]
    Orphans {
        #[source]
        source: Box<StoreError>,
    },
    #[error("removing the mappings of containers that are gone")]
    Gone {
        #[source]
        source: Box<PluginError>,
    },
    #[error("{} the {what}", if *dry_run { "reading" } else { "pruning" })]
    Counters {
        what: &'static str,
        dry_run: bool,
        #[source]
        source: Box<CountersError>,
    },
    #[error("sweeping expired conntrack entries")]
    ExpiredFlows {
        #[source]
        source: std::io::Error,
    },
    #[error("removing stale attachment pins")]
    StaleLinks {
        #[source]
        source: Box<UninstallError>,
    },
}

/// Collects what `request` asks for under `layout`.
pub fn collect(layout: &PinLayout, request: &Request) -> Result<Collected, GcError> {
    let read = |what| {
        move |source| GcError::Read {
            what,
            source: Box::new(source),
        }
    };
    let mut maps = Store::open(layout).map_err(|source| GcError::Open {
        root: layout.root().to_path_buf(),
        source: Box::new(source),
    })?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut collected = Collected {
        now,
        ..Collected::default()
    };
    if request.network.is_some() || request.empty_owners {
        let held = maps.owners_with_mappings().map_err(read("mappings"))?;
        let mut doomed = Vec::new();
        for (id, record) in maps.owners().map_err(read("owners"))? {
            let (network, container_id, ifname) = record_strings(&record);
            // Matched whole, like CNI GC (`Store::collect_garbage`).
            let by_network = request.network.as_deref().is_some_and(|wanted| {
                record_network_is(id, &record, wanted) == Some(true)
                    && !request.keep.iter().any(|k| {
                        let kept = Owner {
                            network: wanted.to_owned(),
                            container_id: k.container_id.clone(),
                            ifname: k.ifname.clone(),
                        };
                        record_is(id, &record, &kept)
                    })
            });
            let empty = request.empty_owners
                && !held.contains(&id)
                && now.saturating_sub(record.created_unix) >= request.min_age;
            if by_network || empty {
                doomed.push((id, format!("{container_id}/{ifname} (network {network})")));
            }
        }
        let mut owners = Vec::new();
        for (id, owner) in doomed {
            let mappings = if request.dry_run {
                None
            } else {
                Some(
                    maps.remove_owner(id)
                        .map_err(|source| GcError::RemoveOwner {
                            owner: owner.clone(),
                            source: Box::new(source),
                        })?,
                )
            };
            owners.push(RemovedOwner { owner, mappings });
        }
        collected.owners = Some(owners);
    }
    if request.orphans {
        collected.orphans = Some(if request.dry_run {
            OrphanReclaim {
                reclaimed: maps
                    .orphans()
                    .map_err(read("mappings"))?
                    .into_iter()
                    .map(|(id, keys)| (id, keys.len()))
                    .collect(),
                waiting: Vec::new(),
            }
        } else {
            maps.reclaim_orphans(layout, request.min_age, now)
                .map_err(|source| GcError::Orphans {
                    source: Box::new(source),
                })?
        });
    }
    if request.gone {
        collected.gone = Some(if request.dry_run {
            judge_gone(&maps, now)?
        } else {
            crate::verbs::reclaim_gone_containers("gc", &mut maps, request.gone_grace).map_err(
                |source| GcError::Gone {
                    source: Box::new(source),
                },
            )?
        });
    }
    let dry_run = request.dry_run;
    let counters_error = |what| {
        move |source| GcError::Counters {
            what,
            dry_run,
            source: Box::new(source),
        }
    };
    match maps::counters(layout) {
        Ok(mut map) => {
            let stale = if dry_run {
                counters::stale_keys(&map, &maps.mappings)
            } else {
                counters::prune(&mut map, &maps.mappings)
            }
            .map_err(counters_error("traffic counters"))?;
            collected.traffic_counters = Some(stale.len());
        }
        Err(error) => log::warn!("traffic counters not pruned: {error}"),
    }
    // The socket hooks' counters, keyed alike (missing in older pins).
    if let Ok(mut map) = maps::sock_counters(layout) {
        let stale = if dry_run {
            counters::stale_keys(&map, &maps.mappings)
        } else {
            counters::prune(&mut map, &maps.mappings)
        }
        .map_err(counters_error("socket-hook counters"))?;
        collected.sock_counters = stale.len();
    }
    // A mapping whose ports are missing from the programs' port filter is
    // never translated; every GC that writes restores them.
    if !dry_run {
        collected.port_filter_restored = Some(maps.mark_every_mapping());
    }
    if request.stale_links {
        collected.stale_links = Some(uninstall::remove_stale_links(layout, dry_run).map_err(
            |source| GcError::StaleLinks {
                source: Box::new(source),
            },
        )?);
    }
    if request.expired_flows {
        collected.expired_flows = Some(
            ledger::sweep_expired(layout, dry_run)
                .map_err(|source| GcError::ExpiredFlows { source })?,
        );
        // As the agent's GC does after its sweep: when the count of live
        // flows evicted last grew, so that `status` on a node without the
        // agent (a `gc --expired-flows` from cron) tells old evictions
        // from new ones too.
        if !dry_run {
            ledger::note_live(layout);
        }
    }
    Ok(collected)
}

/// A dry run's `--gone`: each owner holding mappings judged, nothing
/// written (not even the first sighting).
fn judge_gone(maps: &Store, now: u64) -> Result<GoneReclaim, GcError> {
    let read = |what| {
        move |source| GcError::Read {
            what,
            source: Box::new(source),
        }
    };
    let mut judge = Judge::new();
    let mut outcome = GoneReclaim::default();
    let held = maps.owners_with_mappings().map_err(read("mappings"))?;
    for (id, record) in maps.owners().map_err(read("owners"))? {
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
    Ok(outcome)
}
