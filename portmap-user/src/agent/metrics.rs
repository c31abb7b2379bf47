//! `/metrics`: the dataplane's state read from the kernel, encoded by
//! `prometheus-client` in the OpenMetrics or the Prometheus text format.
//!
//! One read at a time serves every scrape that came while it ran
//! ([`Collections`]): however many scrapes overlap, the kernel is read
//! once at a time, and the exposition is encoded once per format, from a
//! copy (no lock is held while encoding). A read holds the mappings'
//! writers lock only while it walks the mappings
//! ([`inspect::mapping_rows_and_flows`]), so a resize waiting for it
//! finds it free for most of each read.
//!
//! Labels are bounded: aggregates by default (per reason, per map, per
//! attached interface and direction, per protocol and family, per CNI verb
//! and result code). Series per mapping (its pod's namespace and name, its
//! host port and traffic) are off unless asked for
//! (`--metrics-per-mapping`): about ten series per mapping, the bulk of a
//! node's exposition, as kube-proxy and Cilium keep per-pod series off. The
//! list with meanings is in the README ("Metrics").

use std::{
    collections::BTreeMap,
    sync::{Arc, OnceLock, atomic::Ordering},
};

use hyper::body::Bytes;
use portmap_common::{
    reason::{Kind, REASONS},
    verb_stats,
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::{Registry, Unit},
};

use super::worker::Shared;
use crate::{
    dataplane::{
        attach, object,
        pin::{Direction, PinLayout},
        sizing::{self, InForce},
        trace,
        verb_stats::{VerbRecord, VerbStats, records},
    },
    ops::inspect::{self, MapFill, MappingRow, TcAttachment},
};

/// Everything one scrape shows, read in one go.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub kernel: String,
    pub attach_mode: String,
    pub installed: bool,
    pub mappings: Vec<MappingRow>,
    pub reasons: Vec<(&'static str, u64)>,
    pub maps: Vec<MapFill>,
    /// What the conntrack tables evicted, by group (`None`: no ledger).
    pub evictions: Option<inspect::EvictionReport>,
    /// Kernel memory (`memlock`) of each pinned map, and where the sizes
    /// in force come from.
    pub sizes: InForce,
    /// Live translated flows by protocol name.
    pub flows: BTreeMap<&'static str, u64>,
    pub attachments: Vec<TcAttachment>,
    pub verbs: Vec<VerbRecord>,
    /// Trace events lost to a full ring buffer (`None`: not counted).
    pub trace_lost: Option<u64>,
    pub passes_ok: u64,
    pub passes_failed: u64,
    pub gc_runs: u64,
    pub netlink_events: u64,
    pub netlink_overruns: u64,
}

impl Snapshot {
    /// Reads the state under `layout` (blocking: bpf syscalls).
    pub fn read(shared: &Shared, layout: Option<&PinLayout>) -> Snapshot {
        let mut snapshot = Snapshot {
            kernel: inspect::kernel_release(),
            passes_ok: shared.passes_ok.load(Ordering::Relaxed),
            passes_failed: shared.passes_failed.load(Ordering::Relaxed),
            gc_runs: shared.gc_runs.load(Ordering::Relaxed),
            netlink_events: shared.netlink_events.load(Ordering::Relaxed),
            netlink_overruns: shared.netlink_overruns.load(Ordering::Relaxed),
            ..Snapshot::default()
        };
        let Some(layout) = layout else {
            return snapshot;
        };
        snapshot.installed = layout.versioned().exists();
        snapshot.attach_mode = attach::attach_mode(layout)
            .map(|mode| mode.as_str().to_owned())
            .unwrap_or_default();
        if !snapshot.installed {
            return snapshot;
        }
        // One walk of the conntrack tables gives the flows of each
        // mapping and of each protocol.
        let (mappings, flows) = inspect::mapping_rows_and_flows(layout).unwrap_or_else(|error| {
            log::warn!("metrics: mappings not read: {error}");
            Default::default()
        });
        snapshot.mappings = mappings;
        for ((mapping, _, _), count) in flows {
            *snapshot
                .flows
                .entry(crate::dataplane::ownership::protocol_name(mapping.proto))
                .or_insert(0) += count;
        }
        snapshot.reasons = inspect::stats(layout);
        snapshot.maps = inspect::map_fills(layout).0;
        snapshot.evictions = inspect::evictions(layout, &snapshot.maps);
        snapshot.sizes = InForce::read(layout);
        snapshot.attachments = inspect::attachments(layout).tc;
        snapshot.trace_lost = trace::lost_events(layout);
        snapshot.verbs = match VerbStats::open(layout) {
            Ok(Some(stats)) => records(&stats.snapshot()),
            Ok(None) => records(&vec![0; verb_stats::SLOTS]),
            Err(error) => {
                log::warn!("metrics: CNI verb counts not read: {error}");
                Vec::new()
            }
        };
        snapshot
    }
}

/// The labels of one mapping's series.
fn mapping_labels(row: &MappingRow) -> Vec<(&'static str, String)> {
    let (network, _, _) = row.owner_strings();
    let pod = &row.pod;
    vec![
        // The wildcard as `list` shows it, so a series and a row match.
        ("host_ip", row.host_addr().to_string()),
        ("host_port", row.host_port().to_string()),
        ("protocol", row.protocol().to_owned()),
        ("family", row.family().to_owned()),
        ("network", network),
        (
            "namespace",
            pod.pod_namespace
                .clone()
                .or_else(|| pod.nomad_namespace.clone())
                .unwrap_or_default(),
        ),
        (
            "pod",
            pod.pod_name
                .clone()
                .or_else(|| pod.nomad_alloc_id.clone())
                .unwrap_or_default(),
        ),
    ]
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Translated => "translated",
        Kind::Recorded => "recorded",
        Kind::Skipped => "skipped",
        Kind::Problem => "problem",
    }
}

type Labels = Vec<(&'static str, String)>;

fn counter_family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    series: &[(Labels, u64)],
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (labels, value) in series {
        ConstCounter::new(*value).encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

fn gauge_family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[(Labels, i64)],
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in series {
        ConstGauge::new(*value).encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

/// A snapshot as one exposition shows it.
#[derive(Debug)]
struct Shown {
    snapshot: Arc<Snapshot>,
    per_mapping: bool,
}

impl Collector for Shown {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.snapshot.encode(encoder, self.per_mapping)
    }
}

impl Snapshot {
    fn encode(
        &self,
        mut encoder: DescriptorEncoder,
        per_mapping: bool,
    ) -> Result<(), std::fmt::Error> {
        let e = &mut encoder;
        {
            let labels: Labels = vec![
                ("version", env!("CARGO_PKG_VERSION").to_owned()),
                ("build_id", format!("{:016x}", object::build_id())),
                ("kernel", self.kernel.clone()),
                ("attach_mode", self.attach_mode.clone()),
            ];
            let mut metric = e.encode_descriptor(
                "ebpf_portmap_build",
                "This build, the kernel and the attach mode in use (tcx or clsact; empty before the first install)",
                None,
                MetricType::Info,
            )?;
            metric.encode_info(&labels)?;
        }
        gauge_family(
            e,
            "ebpf_portmap_installed",
            "1 when the dataplane is installed under the pin root",
            &[(vec![], i64::from(self.installed))],
        )?;

        {
            let mut by_kind: BTreeMap<(&str, &str), i64> = BTreeMap::new();
            for protocol in ["tcp", "udp", "sctp"] {
                for family in ["ipv4", "ipv6"] {
                    by_kind.insert((protocol, family), 0);
                }
            }
            for row in &self.mappings {
                *by_kind.entry((row.protocol(), row.family())).or_insert(0) += 1;
            }
            gauge_family(
                e,
                "ebpf_portmap_mappings",
                "Host port mappings in the mappings map, by protocol and family",
                &by_kind
                    .iter()
                    .map(|((protocol, family), count)| {
                        (
                            vec![
                                ("protocol", (*protocol).to_owned()),
                                ("family", (*family).to_owned()),
                            ],
                            *count,
                        )
                    })
                    .collect::<Vec<_>>(),
            )?;
        }
        if per_mapping {
            self.encode_mappings(e)?;
        }
        counter_family(
            e,
            "ebpf_portmap_datapath_decisions",
            "What the programs did with packets, by reason (see `ebpf-portmap trace` for the meanings); kind problem is worth a look",
            None,
            &REASONS
                .iter()
                .filter_map(|reason| {
                    let value = self.reasons.get(reason.id as usize)?.1;
                    Some((
                        vec![
                            ("reason", reason.name.to_owned()),
                            ("kind", kind_name(reason.kind).to_owned()),
                        ],
                        value,
                    ))
                })
                .collect::<Vec<_>>(),
        )?;
        gauge_family(
            e,
            "ebpf_portmap_map_entries",
            "Entries in use in a pinned hash map",
            &self
                .maps
                .iter()
                .filter_map(|map| Some((vec![("map", map.name.clone())], map.entries? as i64)))
                .collect::<Vec<_>>(),
        )?;
        if let Some(report) = &self.evictions {
            counter_family(
                e,
                "ebpf_portmap_conntrack_evicted_entries",
                "Conntrack entries the tables evicted since they were made: flows=\"live\" are assured flows' (connections that lost their translation: raise conntrackSize), flows=\"unreplied\" those of flows never assured (a flood's, by design)",
                None,
                &[
                    (vec![("flows", "live".to_owned())], report.counts.live),
                    (
                        vec![("flows", "unreplied".to_owned())],
                        report.counts.unreplied,
                    ),
                ],
            )?;
        }
        gauge_family(
            e,
            "ebpf_portmap_map_capacity",
            "Capacity (max_entries) of a pinned map",
            &self
                .maps
                .iter()
                .map(|map| (vec![("map", map.name.clone())], i64::from(map.max_entries)))
                .collect::<Vec<_>>(),
        )?;
        gauge_family(
            e,
            "ebpf_portmap_mappings_container_gone",
            "Mappings whose container's network namespace is gone (no DEL came): they send traffic nowhere until the node GC removes them after its grace period (--gone-grace)",
            &[(
                vec![],
                self.mappings
                    .iter()
                    .filter(|row| row.liveness == crate::model::Liveness::Gone)
                    .count() as i64,
            )],
        )?;
        gauge_family(
            e,
            "ebpf_portmap_bpf_memory_bytes",
            "Kernel memory of the pinned maps in all (bytes_memlock): what the memory cgroup of the process that made them is charged",
            &[(vec![], self.sizes.memory_bytes() as i64)],
        )?;
        gauge_family(
            e,
            "ebpf_portmap_map_memory_bytes",
            "Kernel memory (bytes_memlock) of a pinned map",
            &self
                .sizes
                .memory
                .iter()
                .map(|(name, bytes)| (vec![("map", name.clone())], *bytes as i64))
                .collect::<Vec<_>>(),
        )?;
        {
            let recorded = self.sizes.recorded.as_ref();
            let labels: Labels = vec![
                ("conntrack", sizing::conntrack_reason(recorded)),
                ("mappings", sizing::mappings_reason(recorded)),
            ];
            let mut metric = e.encode_descriptor(
                "ebpf_portmap_map_sizes",
                "Where the sizes of the conntrack tables and the mappings map come from (the node formula, the default or the conflist)",
                None,
                MetricType::Info,
            )?;
            metric.encode_info(&labels)?;
        }
        gauge_family(
            e,
            "ebpf_portmap_conntrack_flows",
            "Live translated flows in the conntrack tables, by protocol",
            &["tcp", "udp", "sctp"]
                .iter()
                .map(|proto| {
                    (
                        vec![("protocol", (*proto).to_owned())],
                        self.flows.get(proto).copied().unwrap_or(0) as i64,
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        gauge_family(
            e,
            "ebpf_portmap_attachment_up",
            "1 when the kernel runs the program on the interface in that direction, 0 when its pin is there but the attachment is not",
            &self
                .attachments
                .iter()
                .map(|a| {
                    (
                        vec![
                            (
                                "interface",
                                a.interface
                                    .clone()
                                    .unwrap_or_else(|| format!("index {}", a.ifindex)),
                            ),
                            (
                                "direction",
                                match a.direction {
                                    Direction::Ingress => "ingress",
                                    Direction::Egress => "egress",
                                }
                                .to_owned(),
                            ),
                            ("mode", a.mode.as_str().to_owned()),
                        ],
                        i64::from(a.attached),
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        counter_family(
            e,
            "ebpf_portmap_trace_events_lost",
            "Trace events the programs could not emit, the ring buffer being full (a tracer reading too slowly)",
            None,
            &self
                .trace_lost
                .map(|lost| vec![(vec![], lost)])
                .unwrap_or_default(),
        )?;
        counter_family(
            e,
            "ebpf_portmap_cni_requests",
            "CNI verbs the plugin ran, by result code (0 success; see the README's error codes), requests refused for their configuration or environment included",
            None,
            &self
                .verbs
                .iter()
                .flat_map(|record| {
                    record.codes.iter().map(|(code, count)| {
                        (
                            vec![
                                ("verb", record.verb.to_owned()),
                                (
                                    "code",
                                    code.map_or_else(|| "other".into(), |c| c.to_string()),
                                ),
                            ],
                            *count,
                        )
                    })
                })
                .collect::<Vec<_>>(),
        )?;
        {
            let mut metric = e.encode_descriptor(
                "ebpf_portmap_cni_request_duration",
                "How long the plugin's CNI verbs took",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for record in &self.verbs {
                let buckets: Vec<(f64, u64)> = record
                    .buckets
                    .iter()
                    .map(|(bound, count)| {
                        (bound.map_or(f64::INFINITY, |us| us as f64 / 1e6), *count)
                    })
                    .collect();
                let labels: Labels = vec![("verb", record.verb.to_owned())];
                metric.encode_family(&labels)?.encode_histogram::<Labels>(
                    record.sum_ns as f64 / 1e9,
                    record.count(),
                    &buckets,
                    None,
                )?;
            }
        }
        counter_family(
            e,
            "ebpf_portmap_agent_reconciliations",
            "Reconciliation passes of the agent, by result",
            None,
            &[
                (vec![("result", "ok".to_owned())], self.passes_ok),
                (vec![("result", "failed".to_owned())], self.passes_failed),
            ],
        )?;
        counter_family(
            e,
            "ebpf_portmap_agent_gc_runs",
            "Node GC runs of the agent (ownerless mappings, stale counters, pod and fast-path records)",
            None,
            &[(vec![], self.gc_runs)],
        )?;
        counter_family(
            e,
            "ebpf_portmap_agent_netlink_events",
            "rtnetlink link and address events the agent received",
            None,
            &[(vec![], self.netlink_events)],
        )?;
        counter_family(
            e,
            "ebpf_portmap_agent_netlink_overruns",
            "Times the agent's rtnetlink socket overflowed (events lost; the node is read afresh)",
            None,
            &[(vec![], self.netlink_overruns)],
        )?;
        Ok(())
    }

    /// The series of each mapping (`--metrics-per-mapping`).
    fn encode_mappings(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = &self.mappings;
        let by_way = |packets: bool| -> Vec<(Labels, u64)> {
            rows.iter()
                .flat_map(|row| {
                    let c = row.counters;
                    let (inbound, outbound) = if packets {
                        (c.packets_in, c.packets_out)
                    } else {
                        (c.bytes_in, c.bytes_out)
                    };
                    [("in", inbound), ("out", outbound)].map(|(way, value)| {
                        let mut labels = mapping_labels(row);
                        labels.push(("direction", way.to_owned()));
                        (labels, value)
                    })
                })
                .collect()
        };
        counter_family(
            e,
            "ebpf_portmap_mapping_packets",
            "Packets translated for a mapping: in towards the container, out the replies",
            None,
            &by_way(true),
        )?;
        counter_family(
            e,
            "ebpf_portmap_mapping",
            "Bytes translated for a mapping: in towards the container, out the replies",
            Some(&Unit::Bytes),
            &by_way(false),
        )?;
        counter_family(
            e,
            "ebpf_portmap_mapping_socket_translations",
            "Node processes' connect() and sendmsg() calls the socket hooks pointed at a mapping's container (their packets cross no translating tc hook, so they are not in mapping_packets)",
            None,
            &rows
                .iter()
                .flat_map(|row| {
                    [
                        ("connect", row.sock.connects),
                        ("sendmsg", row.sock.sendmsgs),
                    ]
                    .map(|(hook, value)| {
                        let mut labels = mapping_labels(row);
                        labels.push(("hook", hook.to_owned()));
                        (labels, value)
                    })
                })
                .collect::<Vec<_>>(),
        )?;
        gauge_family(
            e,
            "ebpf_portmap_mapping_active_flows",
            "Live translated flows of a mapping",
            &rows
                .iter()
                .map(|row| (mapping_labels(row), row.active_flows as i64))
                .collect::<Vec<_>>(),
        )?;
        Ok(())
    }
}

/// Which text format a scraper asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Prometheus,
}

impl Format {
    /// OpenMetrics when the `Accept` header names it (Prometheus does),
    /// else the classic text format (curl, promtool).
    pub fn of_accept(accept: Option<&str>) -> Format {
        if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// One read of the kernel, and its encodings, each made the first time a
/// scrape asks for it and shared by every scrape that reads it.
#[derive(Debug)]
pub struct Exposition {
    shown: Arc<Snapshot>,
    per_mapping: bool,
    open_metrics: OnceLock<Option<Bytes>>,
    prometheus: OnceLock<Option<Bytes>>,
}

impl Exposition {
    /// Reads the state (blocking: bpf syscalls).
    pub fn read(shared: &Shared, per_mapping: bool) -> Exposition {
        let start = std::time::Instant::now();
        let layout = shared.layout().ok();
        let snapshot = Snapshot::read(shared, layout.as_ref());
        log::debug!("metrics: read in {:?}", start.elapsed());
        Exposition::of(snapshot, per_mapping)
    }

    pub fn of(snapshot: Snapshot, per_mapping: bool) -> Exposition {
        Exposition {
            shown: Arc::new(snapshot),
            per_mapping,
            open_metrics: OnceLock::new(),
            prometheus: OnceLock::new(),
        }
    }

    /// The text in `format`; `None` if it could not be encoded.
    pub fn text(&self, format: Format) -> Option<Bytes> {
        let cell = match format {
            Format::OpenMetrics => &self.open_metrics,
            Format::Prometheus => &self.prometheus,
        };
        cell.get_or_init(
            || match render(self.shown.clone(), self.per_mapping, format) {
                Ok(text) => Some(Bytes::from(text)),
                Err(error) => {
                    log::warn!("metrics: encoding failed: {error}");
                    None
                }
            },
        )
        .clone()
    }
}

/// The reads the scrapes share: one at a time, each answering every
/// scrape that came while it ran.
pub type Collections = super::single_flight::SingleFlight<Exposition>;

/// The exposition of `snapshot`; the series of each mapping only if
/// `per_mapping`.
pub fn render(
    snapshot: Arc<Snapshot>,
    per_mapping: bool,
    format: Format,
) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Shown {
        snapshot,
        per_mapping,
    }));
    let mut text = String::new();
    match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, &registry)?,
        Format::Prometheus => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)?;
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_snapshot_still_says_what_runs() {
        let snapshot = Snapshot {
            kernel: "6.18.0".into(),
            passes_ok: 3,
            verbs: records(&vec![0; verb_stats::SLOTS]),
            ..Snapshot::default()
        };
        let text = render(Arc::new(snapshot), false, Format::OpenMetrics).unwrap();
        assert!(
            text.contains("ebpf_portmap_build_info{version=\""),
            "{text}"
        );
        assert!(text.contains("kernel=\"6.18.0\""), "{text}");
        assert!(
            text.contains("ebpf_portmap_agent_reconciliations_total{result=\"ok\"} 3"),
            "{text}"
        );
        assert!(
            text.contains(
                "ebpf_portmap_cni_request_duration_seconds_bucket{le=\"+Inf\",verb=\"ADD\"} 0"
            ),
            "{text}"
        );
        assert!(text.contains("ebpf_portmap_bpf_memory_bytes 0"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        let classic = render(Arc::default(), false, Format::Prometheus).unwrap();
        assert!(!classic.contains("# EOF"), "{classic}");
    }

    #[test]
    fn series_per_mapping_only_when_asked_for() {
        use portmap_common::{FAMILY_V4, MappingKey, MappingValue};
        let row = MappingRow {
            key: MappingKey {
                host_port_be: 8080u16.to_be(),
                proto: 6,
                family: FAMILY_V4,
                ..MappingKey::default()
            },
            value: MappingValue::default(),
            owner: None,
            pod: crate::model::PodIdentity {
                pod_namespace: Some("shop".into()),
                pod_name: Some("web-0".into()),
                ..Default::default()
            },
            counters: Default::default(),
            sock: Default::default(),
            active_flows: 3,
            sandbox: None,
            liveness: crate::model::Liveness::Alive,
        };
        let snapshot = Arc::new(Snapshot {
            mappings: vec![row],
            ..Snapshot::default()
        });
        let aggregate = render(snapshot.clone(), false, Format::Prometheus).unwrap();
        assert!(
            aggregate.contains("ebpf_portmap_mappings{protocol=\"tcp\",family=\"ipv4\"} 1"),
            "{aggregate}"
        );
        assert!(!aggregate.contains("ebpf_portmap_mapping_"), "{aggregate}");
        assert!(!aggregate.contains("web-0"), "{aggregate}");
        let per_mapping = render(snapshot, true, Format::Prometheus).unwrap();
        assert!(
            per_mapping.lines().any(
                |line| line.starts_with("ebpf_portmap_mapping_active_flows{")
                    && line.contains("pod=\"web-0\"")
                    && line.ends_with(" 3")
            ),
            "{per_mapping}"
        );
    }
}
