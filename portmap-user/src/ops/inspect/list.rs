//! What `list` shows: every mapping with its owner, pod, traffic counters,
//! live flows and whether its container is still there.

use std::{
    collections::HashMap as StdHashMap,
    net::IpAddr,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use portmap_common::{
    CtEntry, CtKey, FAMILY_V4, MappingCounters, MappingKey, MappingValue, OwnerRecord, ct_kind,
    local::SockCounters, map_names,
};

use super::shared::{InspectError, monotonic_ns, read_error, require_installed};
use crate::dataplane::{
    counters, ledger, maps,
    ownership::{self, KeyDisplay, addr_from_words, protocol_name, record_strings},
    pin::PinLayout,
};
use crate::model::{Liveness, PodIdentity, Sandbox};

/// Which (mapping, container address, container port) a live flow was
/// translated to.
pub type FlowTarget = (MappingKey, [u32; 4], u16);

/// Live translated flows by target: DNAT entries of the open-flow tables
/// (`conntrack`, `conntrack_other`, and `conntrack_new` for flows not yet
/// assured) that have not idled past their timeout at `now_ns`. A TCP flow that closed (FIN both ways, or RST) has left
/// those tables for `conntrack_close` and no longer counts; one that saw
/// only its SYN counts for a minute.
pub fn live_flows(
    entries: impl IntoIterator<Item = (CtKey, CtEntry)>,
    now_ns: u64,
) -> StdHashMap<FlowTarget, u64> {
    let mut flows = StdHashMap::new();
    count_live_flows(&mut flows, entries, now_ns);
    flows
}

/// [`live_flows`] added to `flows`, one entry at a time (a table is never
/// held in memory whole).
fn count_live_flows(
    flows: &mut StdHashMap<FlowTarget, u64>,
    entries: impl IntoIterator<Item = (CtKey, CtEntry)>,
    now_ns: u64,
) {
    for (key, entry) in entries {
        // The open tables' entries, judged as the programs and the sweep
        // judge them.
        if entry.kind & ct_kind::BASE != ct_kind::DNAT
            || ledger::expired(map_names::CONNTRACK, &key, &entry, now_ns)
        {
            continue;
        }
        *flows
            .entry((entry.mapping, entry.nat_addr_be, entry.nat_port_be))
            .or_insert(0) += 1;
    }
}

/// One mapping as `list` shows it.
#[derive(Debug, Clone)]
pub struct MappingRow {
    pub key: MappingKey,
    pub value: MappingValue,
    /// `None` while the owner is being removed (or its record is lost).
    pub owner: Option<OwnerRecord>,
    /// The owner's pod, from CNI_ARGS at ADD (empty when the runtime named
    /// none, or the owner was added by a build that did not record it).
    pub pod: PodIdentity,
    pub counters: MappingCounters,
    /// What the socket hooks translated for it: node processes dialling
    /// the host port, whose connections cross no tc hook and so are not
    /// in `counters`.
    pub sock: SockCounters,
    pub active_flows: u64,
    /// What ADD recorded of the owner's sandbox (`None`: nothing, e.g.
    /// added by an older build).
    pub sandbox: Option<Sandbox>,
    /// Whether the owner's container is still there, as far as can be
    /// proven from here (see `node::sandbox`).
    pub liveness: Liveness,
}

impl MappingRow {
    /// "container namespace gone since 2026-12-03T19:04:33Z (first seen
    /// by GC)" for a mapping whose container is gone; `None` otherwise.
    pub fn gone_marker(&self) -> Option<String> {
        if self.liveness != Liveness::Gone {
            return None;
        }
        Some(
            match self.sandbox.as_ref().and_then(|sandbox| sandbox.gone_since) {
                Some(since) => format!(
                    "container namespace gone since {}",
                    crate::logging::utc_timestamp(UNIX_EPOCH + Duration::from_secs(since))
                ),
                None => "container namespace gone (not yet seen by GC)".into(),
            },
        )
    }

    /// `198.18.0.1:8080/tcp`, `0.0.0.0:8080/udp`, `[::]:80/sctp`.
    pub fn host(&self) -> String {
        KeyDisplay(self.key).to_string()
    }

    /// The host address as `list` shows it: the family's wildcard
    /// (`0.0.0.0`, `::`) for a mapping on every node address.
    pub fn host_addr(&self) -> IpAddr {
        addr_from_words(self.key.family, &self.key.host_addr_be)
    }

    /// The host address, `None` for the family's wildcard.
    pub fn host_ip(&self) -> Option<IpAddr> {
        (self.key.host_addr_be != [0; 4])
            .then(|| addr_from_words(self.key.family, &self.key.host_addr_be))
    }

    pub fn host_port(&self) -> u16 {
        u16::from_be(self.key.host_port_be)
    }

    pub fn protocol(&self) -> &'static str {
        protocol_name(self.key.proto)
    }

    pub fn family(&self) -> &'static str {
        if self.key.family == FAMILY_V4 {
            "ipv4"
        } else {
            "ipv6"
        }
    }

    pub fn container_ip(&self) -> IpAddr {
        addr_from_words(self.key.family, &self.value.container_addr_be)
    }

    pub fn container_port(&self) -> u16 {
        u16::from_be(self.value.container_port_be)
    }

    /// `10.244.0.5:80`, `[fd44::5]:80`.
    pub fn container(&self) -> String {
        match self.container_ip() {
            IpAddr::V4(a) => format!("{a}:{}", self.container_port()),
            IpAddr::V6(a) => format!("[{a}]:{}", self.container_port()),
        }
    }

    /// (network, container ID, ifname); the owner ID in hex when the record
    /// is missing.
    pub fn owner_strings(&self) -> (String, String, String) {
        self.owner.as_ref().map_or_else(
            || {
                (
                    "?".into(),
                    format!("{:016x}", self.value.owner_id),
                    "?".into(),
                )
            },
            record_strings,
        )
    }

    pub fn created(&self) -> Option<SystemTime> {
        self.owner
            .as_ref()
            .filter(|o| o.created_unix != 0)
            .map(|o| UNIX_EPOCH + Duration::from_secs(o.created_unix))
    }

    /// Sort order of `list`: port, protocol, family, address.
    pub fn sort_key(&self) -> (u16, u8, u8, [u8; 16]) {
        let mut addr = [0u8; 16];
        for (i, word) in self.key.host_addr_be.iter().enumerate() {
            addr[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
        }
        (self.host_port(), self.key.proto, self.key.family, addr)
    }
}

/// Every mapping with owner, counters and live flows, sorted by port,
/// protocol, family and address. Counters and flows read as zero when
/// their maps are missing (pins of an older build).
///
/// The maps a `maxMappings` resize replaces (`mappings`, the owners'
/// index, `counters`) are read first, under the writers' lock they take
/// (`Store`), and the lock is released before the slow part: the walk of
/// the conntrack tables (hundreds of thousands of entries, counted as they
/// come, never copied) and the containers' liveness (reads of `/proc`).
/// So a reader holds the lock for a walk of the mappings only, and a
/// resize waiting for it is never kept out for long.
pub fn mapping_rows(layout: &PinLayout) -> Result<Vec<MappingRow>, InspectError> {
    mapping_rows_and_flows(layout).map(|(rows, _)| rows)
}

/// [`mapping_rows`], and every live translated flow by target (those of
/// mappings gone since included), from the one walk of the tables.
pub fn mapping_rows_and_flows(
    layout: &PinLayout,
) -> Result<(Vec<MappingRow>, StdHashMap<FlowTarget, u64>), InspectError> {
    require_installed(layout)?;
    let read = {
        let maps = ownership::Store::open(layout)?;
        let counters_map = maps::counters(layout).ok();
        let sock_map = maps::sock_counters(layout).ok();
        let mut read = Vec::new();
        for entry in &maps.mappings {
            let (key, value) = entry.map_err(read_error("mappings"))?;
            let counters = match &counters_map {
                Some(map) => counters::read(map, &key, value.owner_id)?,
                None => MappingCounters::default(),
            };
            let sock = match &sock_map {
                Some(map) => counters::read_sock(map, &key, value.owner_id)?,
                None => SockCounters::default(),
            };
            read.push((
                key,
                value,
                maps.owners.get(&value.owner_id, 0).ok(),
                maps.pod_of(value.owner_id),
                maps.sandbox_of(value.owner_id),
                counters,
                sock,
            ));
        }
        read
        // The writers' lock is released here.
    };
    let now = monotonic_ns();
    let mut flows = StdHashMap::new();
    // A table missing (pins of an older build) has no flows.
    for table in [
        map_names::CONNTRACK,
        map_names::CONNTRACK_OTHER,
        map_names::CONNTRACK_NEW,
    ] {
        if let Ok(conntrack) = maps::conntrack(layout, table) {
            let mut failed = None;
            let entries = conntrack.iter().map_while(|entry| {
                entry
                    .map_err(|error| failed = Some(read_error(table)(error)))
                    .ok()
            });
            count_live_flows(&mut flows, entries, now);
            if let Some(error) = failed {
                return Err(error);
            }
        }
    }
    let mut judge = crate::node::sandbox::Judge::new();
    let mut judged: StdHashMap<u64, Liveness> = StdHashMap::new();
    let mut rows: Vec<MappingRow> = read
        .into_iter()
        .map(|(key, value, owner, pod, sandbox, counters, sock)| {
            let liveness = judged
                .entry(value.owner_id)
                .or_insert_with(|| match &sandbox {
                    Some(sandbox) => judge.judge(sandbox),
                    None => {
                        Liveness::Unknown("no sandbox recorded (added by an older build)".into())
                    }
                })
                .clone();
            let active_flows = flows
                .get(&(key, value.container_addr_be, value.container_port_be))
                .copied()
                .unwrap_or(0);
            MappingRow {
                key,
                value,
                owner,
                pod,
                counters,
                sock,
                active_flows,
                sandbox,
                liveness,
            }
        })
        .collect();
    rows.sort_by_key(MappingRow::sort_key);
    Ok((rows, flows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ct_entry(kind: u8, port: u16, last_seen_ns: u64) -> CtEntry {
        CtEntry {
            kind,
            nat_addr_be: [1, 0, 0, 0],
            nat_port_be: port.to_be(),
            mapping: MappingKey {
                host_port_be: 8080u16.to_be(),
                proto: 6,
                family: 4,
                ..MappingKey::default()
            },
            last_seen_ns,
            ..CtEntry::default()
        }
    }

    fn ct_key(proto: u8, sport: u16) -> CtKey {
        CtKey {
            src_port_be: sport.to_be(),
            proto,
            family: 4,
            ..CtKey::default()
        }
    }

    #[test]
    fn live_flows_count_fresh_dnat_entries_by_target() {
        let hour = 3_600_000_000_000u64;
        let now = 10 * hour;
        let entries = vec![
            (ct_key(6, 1), ct_entry(ct_kind::DNAT, 80, now - 1)),
            (ct_key(6, 2), ct_entry(ct_kind::DNAT, 80, now - hour)),
            // The reply half of a flow is not a second flow.
            (ct_key(6, 3), ct_entry(ct_kind::REPLY, 80, now)),
            (ct_key(6, 4), ct_entry(ct_kind::PASS, 80, now)),
            // Idle past the TCP timeout.
            (ct_key(6, 5), ct_entry(ct_kind::DNAT, 80, now - 7 * hour)),
            // UDP idles out after two minutes.
            (ct_key(17, 6), ct_entry(ct_kind::DNAT, 53, now - hour)),
            // A TCP flow with only its SYN, after a minute.
            (
                ct_key(6, 8),
                CtEntry {
                    tcp_state: portmap_common::tcp_state::SYN_ONLY,
                    ..ct_entry(ct_kind::DNAT, 80, now - 61_000_000_000)
                },
            ),
            // Another container port: another target.
            (ct_key(6, 7), ct_entry(ct_kind::DNAT, 81, now)),
        ];
        let flows = live_flows(entries, now);
        let target = |port: u16| (ct_entry(0, port, 0).mapping, [1, 0, 0, 0], port.to_be());
        assert_eq!(flows.get(&target(80)), Some(&2));
        assert_eq!(flows.get(&target(81)), Some(&1));
        assert_eq!(flows.get(&target(53)), None);
        assert_eq!(flows.len(), 2);
    }
}
