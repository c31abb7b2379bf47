//! Live tracing of the dataplane's per-packet decisions.
//!
//! A [`Tracer`] writes the `trace_filter` map (pinned), which turns event
//! emission on in the programs, reads [`TraceEvent`]s from the `trace_events`
//! ring buffer (not pinned: found through the map IDs of the pinned
//! programs) and turns the filter off again when dropped. While nobody
//! traces, each packet costs the programs one array lookup.
//!
//! One tracer at a time: the filter is shared by the whole node and a ring
//! buffer has a single consumer position. The filter records the tracer's
//! PID, so a tracer that was killed (and could not switch tracing off) is
//! recognised and replaced.

use std::{
    fs,
    net::IpAddr,
    os::fd::{AsFd, AsRawFd},
    path::PathBuf,
    time::{Duration, SystemTime},
};

use aya::{
    maps::{Array, Map, MapData, MapError, MapInfo, RingBuf},
    programs::{ProgramError, ProgramInfo},
};
use portmap_common::{
    TraceEvent, TraceFilter, map_names,
    reason::{NO_MAPPING, REASONS, Reason},
    trace_direction,
};
use serde_json::{Value, json};

use crate::{
    dataplane::ownership::{addr_from_words, protocol_name},
    dataplane::pinned::maps::{self, MapsError},
    dataplane::pinned::pin::PinLayout,
};

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Maps(#[from] MapsError),
    #[error("cannot read the programs pinned under {path}")]
    Programs {
        path: PathBuf,
        #[source]
        source: ProgramError,
    },
    #[error(
        "the pinned programs have no {} map; they were built without tracing (run an ADD with this build to upgrade them)",
        map_names::TRACE_EVENTS
    )]
    NoRingBuffer,
    #[error("cannot open the {} ring buffer", map_names::TRACE_EVENTS)]
    RingBuffer(#[source] MapError),
    #[error("another trace is running (pid {pid}); stop it first, or pass --force to take over")]
    Busy { pid: u32 },
    #[error("cannot {operation} the trace filter")]
    Filter {
        operation: &'static str,
        #[source]
        source: MapError,
    },
    #[error("waiting for trace events")]
    Poll(#[source] std::io::Error),
}

/// What to trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceRequest {
    /// Only packets with this port at either end, before or after translation.
    pub port: Option<u16>,
    /// Only this IP protocol number.
    pub proto: Option<u8>,
}

impl TraceRequest {
    pub fn filter(&self, tracer_pid: u32) -> TraceFilter {
        TraceFilter {
            enabled: 1,
            tracer_pid,
            port_be: self.port.unwrap_or(0).to_be(),
            proto: self.proto.unwrap_or(0),
            ..TraceFilter::default()
        }
    }
}

/// Whether `pid` is a running `ebpf-portmap` process.
pub fn tracer_alive(pid: u32) -> bool {
    pid != 0
        && fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim_end().starts_with("ebpf-portmap"))
}

/// The filter as it is now (all zero when tracing is off).
pub fn current_filter(layout: &PinLayout) -> Result<TraceFilter, TraceError> {
    let filter = maps::trace_filter(layout)?;
    filter.get(&0, 0).map_err(|source| TraceError::Filter {
        operation: "read",
        source,
    })
}

/// Turns tracing off (for a tracer that was killed); returns the old filter.
pub fn clear_filter(layout: &PinLayout) -> Result<TraceFilter, TraceError> {
    let mut filter = maps::trace_filter(layout)?;
    let old = filter.get(&0, 0).map_err(|source| TraceError::Filter {
        operation: "read",
        source,
    })?;
    filter
        .set(0, TraceFilter::default(), 0)
        .map_err(|source| TraceError::Filter {
            operation: "clear",
            source,
        })?;
    Ok(old)
}

/// The ring buffers of the pinned programs (normally one; two while a new
/// build replaces an old one).
fn ring_buffers(layout: &PinLayout) -> Result<Vec<RingBuf<MapData>>, TraceError> {
    let progs = layout.progs_dir();
    let mut ids = Vec::new();
    let entries = fs::read_dir(&progs).map_err(|e| TraceError::Programs {
        path: progs.clone(),
        source: ProgramError::IOError(e),
    })?;
    for entry in entries.flatten() {
        let info = ProgramInfo::from_pin(entry.path()).map_err(|source| TraceError::Programs {
            path: entry.path(),
            source,
        })?;
        let map_ids = info.map_ids().map_err(|source| TraceError::Programs {
            path: entry.path(),
            source,
        })?;
        for id in map_ids.unwrap_or_default() {
            let Ok(map) = MapInfo::from_id(id) else {
                continue;
            };
            if map.name_as_str() == Some(map_names::TRACE_EVENTS) && !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    if ids.is_empty() {
        return Err(TraceError::NoRingBuffer);
    }
    ids.into_iter()
        .map(|id| {
            let data = MapData::from_id(id).map_err(TraceError::RingBuffer)?;
            let map = Map::from_map_data(data).map_err(TraceError::RingBuffer)?;
            RingBuf::try_from(map).map_err(TraceError::RingBuffer)
        })
        .collect()
}

/// Trace events the programs could not emit since the dataplane was
/// installed, the ring buffer being full (summed over CPUs; `None` when
/// the pins are of a build that did not count them).
pub fn lost_events(layout: &PinLayout) -> Option<u64> {
    let map: aya::maps::PerCpuArray<MapData, u64> =
        crate::dataplane::pinned::maps::open(layout, portmap_common::TRACE_LOST_MAP).ok()?;
    map.get(&0, 0).ok().map(|values| values.iter().sum())
}

/// How long a tracer waits between two reads of the ring buffer. The buffer
/// holds about 2500 events; more than that within one interval are lost.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// A running trace; tracing stops when it is dropped.
pub struct Tracer {
    filter: Array<MapData, TraceFilter>,
    rings: Vec<RingBuf<MapData>>,
    pid: u32,
}

impl Tracer {
    /// Starts tracing. Fails if another live tracer holds the filter, unless
    /// `force`.
    pub fn start(
        layout: &PinLayout,
        request: TraceRequest,
        force: bool,
    ) -> Result<Tracer, TraceError> {
        let mut filter = maps::trace_filter(layout)?;
        let current = filter.get(&0, 0).map_err(|source| TraceError::Filter {
            operation: "read",
            source,
        })?;
        let pid = std::process::id();
        if current.enabled != 0
            && current.tracer_pid != pid
            && tracer_alive(current.tracer_pid)
            && !force
        {
            return Err(TraceError::Busy {
                pid: current.tracer_pid,
            });
        }
        let mut rings = ring_buffers(layout)?;
        // Left over from a tracer that died: not ours to show.
        for ring in &mut rings {
            while ring.next().is_some() {}
        }
        filter
            .set(0, request.filter(pid), 0)
            .map_err(|source| TraceError::Filter {
                operation: "set",
                source,
            })?;
        Ok(Tracer { filter, rings, pid })
    }

    /// Returns the events that arrived, waiting up to `timeout` when there
    /// are none yet (less when a signal interrupts the wait). The programs
    /// submit without waking the reader (a wake-up costs a traced packet
    /// about 10 µs), so events are picked up when the wait ends: call this
    /// with a short timeout, such as [`POLL_INTERVAL`].
    pub fn poll(&mut self, timeout: Duration) -> Result<Vec<TraceEvent>, TraceError> {
        let mut events = self.drain();
        if !events.is_empty() {
            return Ok(events);
        }
        let mut fds: Vec<libc::pollfd> = self
            .rings
            .iter()
            .map(|ring| libc::pollfd {
                fd: ring.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `fds` is a valid array of pollfd for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
        if rc < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::Interrupted {
                return Err(TraceError::Poll(error));
            }
        }
        events.extend(self.drain());
        Ok(events)
    }

    fn drain(&mut self) -> Vec<TraceEvent> {
        let mut events = Vec::new();
        for ring in &mut self.rings {
            while let Some(item) = ring.next() {
                if item.len() >= std::mem::size_of::<TraceEvent>() {
                    // SAFETY: the record holds a TraceEvent written by the
                    // programs (plain integers); read unaligned to be safe.
                    events.push(unsafe {
                        std::ptr::read_unaligned(item.as_ptr().cast::<TraceEvent>())
                    });
                }
            }
        }
        events
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        // Only our own filter: a tracer that took over with --force keeps its.
        if self
            .filter
            .get(&0, 0)
            .is_ok_and(|filter| filter.tracer_pid == self.pid)
            && let Err(error) = self.filter.set(0, TraceFilter::default(), 0)
        {
            log::error!("could not switch tracing off: {error}");
        }
    }
}

/// The decisions of an event, in reason order; [`NO_MAPPING`] alone when
/// it counted nothing.
pub fn decisions(event: &TraceEvent) -> Vec<&'static Reason> {
    let mut reasons: Vec<_> = REASONS
        .iter()
        .filter(|reason| event.decisions & (1u64 << reason.id) != 0)
        .collect();
    if reasons.is_empty() {
        reasons.push(&NO_MAPPING);
    }
    reasons
}

fn endpoint(family: u8, addr: &[u32; 4], port_be: u16) -> String {
    match addr_from_words(family, addr) {
        IpAddr::V4(a) => format!("{a}:{}", u16::from_be(port_be)),
        IpAddr::V6(a) => format!("[{a}]:{}", u16::from_be(port_be)),
    }
}

fn tcp_flags(flags: u8) -> String {
    // tcpdump's order: [S.] for a SYN-ACK, [P.] for data with an ACK.
    let names = [
        (0x02, 'S'),
        (0x01, 'F'),
        (0x04, 'R'),
        (0x08, 'P'),
        (0x10, '.'),
    ];
    names
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|(_, name)| *name)
        .collect()
}

/// Converts `bpf_ktime_get_ns` stamps (CLOCK_MONOTONIC) to wall-clock time.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall_at_boot: SystemTime,
}

impl Clock {
    pub fn now() -> Clock {
        let monotonic = Duration::from_nanos(crate::dataplane::pinned::ledger::monotonic_ns());
        Clock {
            wall_at_boot: SystemTime::now() - monotonic,
        }
    }

    pub fn wall(&self, ts_ns: u64) -> SystemTime {
        self.wall_at_boot + Duration::from_nanos(ts_ns)
    }
}

/// A traced packet with the names a person needs.
#[derive(Debug, Clone)]
pub struct TraceRecord {
    pub time: SystemTime,
    pub interface: String,
    pub event: TraceEvent,
}

impl TraceRecord {
    pub fn direction(&self) -> &'static str {
        match self.event.direction {
            trace_direction::INGRESS => "ingress",
            trace_direction::SOCK_CONNECT => "connect",
            trace_direction::SOCK_SENDMSG => "sendmsg",
            _ => "egress",
        }
    }

    /// Whether the event is a socket hook's translation of a node process's
    /// connect() or sendmsg(), not a packet: no interface, no source yet.
    pub fn is_sock(&self) -> bool {
        matches!(
            self.event.direction,
            trace_direction::SOCK_CONNECT | trace_direction::SOCK_SENDMSG
        )
    }

    /// "node" for a socket hook's event: the kernel picks the source after
    /// the hook ran.
    fn from(&self) -> String {
        let e = &self.event;
        if self.is_sock() {
            return "node".into();
        }
        endpoint(e.family, &e.src_addr_be, e.sport_be)
    }

    fn to(&self) -> String {
        let e = &self.event;
        endpoint(e.family, &e.dst_addr_be, e.dport_be)
    }

    /// What the program changed, as "to X" / "from X", if anything.
    fn rewrite(&self) -> Option<String> {
        let e = &self.event;
        let new_to = endpoint(e.family, &e.new_dst_addr_be, e.new_dport_be);
        let new_from = endpoint(e.family, &e.new_src_addr_be, e.new_sport_be);
        if new_to != self.to() {
            Some(format!("now to {new_to}"))
        } else if !self.is_sock() && new_from != self.from() {
            Some(format!("now from {new_from}"))
        } else {
            None
        }
    }

    /// One line for people: time, interface, direction, packet, decisions.
    /// A socket hook's event reads `sock connect tcp node > ADDR:PORT`
    /// (`sendmsg` for an unconnected datagram) in place of interface,
    /// direction and source.
    pub fn line(&self) -> String {
        let e = &self.event;
        let mut line = format!(
            "{} {} {:<7} {} {} > {}",
            crate::logging::utc_time_of_day(self.time),
            self.interface,
            self.direction(),
            protocol_name(e.proto),
            self.from(),
            self.to(),
        );
        if e.proto == portmap_common::PROTO_TCP && !self.is_sock() {
            line.push_str(&format!(" [{}]", tcp_flags(e.flags)));
        }
        let reasons = decisions(e);
        let labels: Vec<&str> = reasons.iter().map(|reason| reason.label).collect();
        line.push_str(&format!(": {}", labels.join(", ")));
        if let Some(rewrite) = self.rewrite() {
            line.push_str(&format!(", {rewrite}"));
        }
        line.push_str(&format!(" ({})", reasons[0].meaning));
        line
    }

    /// The same as a JSON object, one per line with `--json`.
    pub fn to_json(&self) -> Value {
        let e = &self.event;
        let reasons = decisions(e);
        json!({
            "time": crate::logging::utc_timestamp(self.time),
            "interface": self.interface,
            "ifindex": e.ifindex,
            "direction": self.direction(),
            "protocol": protocol_name(e.proto),
            "from": self.from(),
            "to": self.to(),
            "newFrom": if self.is_sock() { self.from() } else { endpoint(e.family, &e.new_src_addr_be, e.new_sport_be) },
            "newTo": endpoint(e.family, &e.new_dst_addr_be, e.new_dport_be),
            "tcpFlags": if e.proto == portmap_common::PROTO_TCP && !self.is_sock() { Value::from(tcp_flags(e.flags)) } else { Value::Null },
            "length": e.len,
            "decisions": reasons.iter().map(|reason| reason.label).collect::<Vec<_>>(),
            "meaning": reasons[0].meaning,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::ownership::words_from_addr;
    use portmap_common::stat;
    use std::time::UNIX_EPOCH;

    fn record(event: TraceEvent) -> TraceRecord {
        TraceRecord {
            time: UNIX_EPOCH + Duration::from_millis(3_723_004),
            interface: "eth0".into(),
            event,
        }
    }

    fn v4(text: &str) -> [u32; 4] {
        words_from_addr(text.parse().unwrap())
    }

    #[test]
    fn a_translated_syn_reads_naturally() {
        let event = TraceEvent {
            src_addr_be: v4("198.18.0.2"),
            dst_addr_be: v4("198.18.0.1"),
            new_src_addr_be: v4("198.18.0.2"),
            new_dst_addr_be: v4("10.244.0.5"),
            sport_be: 40000u16.to_be(),
            dport_be: 8080u16.to_be(),
            new_sport_be: 40000u16.to_be(),
            new_dport_be: 80u16.to_be(),
            decisions: 1 << stat::DNAT_NEW,
            direction: trace_direction::INGRESS,
            family: 4,
            proto: 6,
            flags: 0x02,
            ..TraceEvent::default()
        };
        let record = record(event);
        assert_eq!(
            record.line(),
            "01:02:03.004000 eth0 ingress tcp 198.18.0.2:40000 > 198.18.0.1:8080 [S]: translated-new, now to 10.244.0.5:80 (new flow translated to the container)"
        );
        let json = record.to_json();
        assert_eq!(json["decisions"], json!(["translated-new"]));
        assert_eq!(json["newTo"], "10.244.0.5:80");
        assert_eq!(json["time"], "1970-01-01T01:02:03.004000Z");
    }

    #[test]
    fn a_reply_shows_the_restored_source() {
        let fd = |text: &str| words_from_addr(text.parse().unwrap());
        let event = TraceEvent {
            src_addr_be: fd("fd44::5"),
            dst_addr_be: fd("fd18::2"),
            new_src_addr_be: fd("fd18::1"),
            new_dst_addr_be: fd("fd18::2"),
            sport_be: 53u16.to_be(),
            dport_be: 5000u16.to_be(),
            new_sport_be: 5353u16.to_be(),
            new_dport_be: 5000u16.to_be(),
            decisions: 1 << stat::REPLY,
            direction: trace_direction::EGRESS,
            family: 6,
            proto: 17,
            ..TraceEvent::default()
        };
        let line = record(event).line();
        assert!(
            line.contains(
                "egress  udp [fd44::5]:53 > [fd18::2]:5000: reply, now from [fd18::1]:5353"
            ),
            "{line}"
        );
    }

    #[test]
    fn a_socket_hook_translation_reads_as_a_sock_line() {
        let event = TraceEvent {
            dst_addr_be: v4("198.18.0.1"),
            new_dst_addr_be: v4("10.244.0.5"),
            dport_be: 8080u16.to_be(),
            new_dport_be: 80u16.to_be(),
            decisions: 1 << stat::SOCK_TRANSLATED,
            direction: trace_direction::SOCK_CONNECT,
            family: 4,
            proto: 6,
            ..TraceEvent::default()
        };
        let mut record = record(event);
        record.interface = "sock".into();
        assert_eq!(
            record.line(),
            "01:02:03.004000 sock connect tcp node > 198.18.0.1:8080: socket-translated, now to 10.244.0.5:80 (a connect()/sendmsg() on the node was pointed at the container)"
        );
        let json = record.to_json();
        assert_eq!(json["direction"], "connect");
        assert_eq!(json["interface"], "sock");
        assert_eq!(json["from"], "node");
        assert_eq!(json["newTo"], "10.244.0.5:80");
        assert_eq!(json["tcpFlags"], Value::Null);
        record.event.direction = trace_direction::SOCK_SENDMSG;
        record.event.proto = 17;
        assert!(
            record
                .line()
                .contains(" sock sendmsg udp node > 198.18.0.1:8080: "),
            "{}",
            record.line()
        );
    }

    #[test]
    fn nothing_counted_means_no_mapping() {
        let event = TraceEvent {
            family: 4,
            proto: 6,
            ..TraceEvent::default()
        };
        assert_eq!(decisions(&event), vec![&NO_MAPPING]);
        assert!(record(event).line().contains(": no-mapping ("));
    }

    #[test]
    fn every_reason_shows_its_label_and_meaning() {
        for reason in &REASONS {
            let event = TraceEvent {
                family: 4,
                proto: 17,
                decisions: 1 << reason.id,
                ..TraceEvent::default()
            };
            assert_eq!(decisions(&event), vec![reason]);
            let line = record(event).line();
            assert!(
                line.ends_with(&format!(": {} ({})", reason.label, reason.meaning)),
                "{} shows as {line:?}",
                reason.name
            );
        }
    }

    #[test]
    fn filters_carry_port_in_network_order() {
        let filter = TraceRequest {
            port: Some(8080),
            proto: Some(6),
        }
        .filter(42);
        assert_eq!(filter.enabled, 1);
        assert_eq!(filter.tracer_pid, 42);
        assert_eq!(filter.port_be, 8080u16.to_be());
        assert_eq!(filter.proto, 6);
        assert_eq!(TraceRequest::default().filter(1).port_be, 0, "any port");
    }
}
