//! The programs' rare events (`portmap_common::datapath_log`), drained from
//! the pinned aya-log ring buffer into the agent's log: a failed rewrite or
//! conntrack insert, no masquerade port or address (warnings), a CPU's
//! first packet handed over by the fast path (information). Each line names
//! the reason as `status` and `trace` do, the interface, and the packet as
//! it arrived.
//!
//! The plugin only pins the ring buffer with the other maps (its runs stay
//! lean: no reader); without the agent it fills and the programs drop
//! further records. aya-log reads it through a loaded object: the agent
//! loads `log_map`, an object with that one map and no program it loads,
//! from the map's pin. A new pin (the dataplane uninstalled and installed
//! again) is taken up at the next drain.

use std::{fmt::Write as _, path::PathBuf};

use aya::{EbpfLoader, maps::MapInfo};
use aya_log::EbpfLogger;
use portmap_common::{
    datapath_log::{BYTES, MAP, PREFIX},
    reason::{Kind, REASONS},
};

use crate::dataplane::pin::PinLayout;

/// An object with aya-log's ring buffer only (portmap-ebpf's `log_map.rs`).
static LOG_MAP_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/log_map"));

#[derive(Debug, thiserror::Error)]
pub enum DatapathLogError {
    #[error(
        "{path} is not the ring buffer of {BYTES} bytes this build logs to (type {map_type}, {max_entries} bytes)"
    )]
    Unexpected {
        path: PathBuf,
        map_type: String,
        max_entries: u32,
    },
    #[error("cannot open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: Box<aya::EbpfError>,
    },
    #[error("cannot read the rare events from {path}")]
    Reader {
        path: PathBuf,
        #[source]
        source: aya_log::Error,
    },
}

/// The reader of one pinned ring buffer.
pub struct DatapathLog {
    logger: EbpfLogger<Lines>,
    /// The pinned map's ID: another one at the pin is a new ring buffer.
    map_id: u32,
}

impl std::fmt::Debug for DatapathLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatapathLog")
            .field("map_id", &self.map_id)
            .finish_non_exhaustive()
    }
}

/// The ID of the ring buffer pinned under `layout`, if one is.
fn pinned_id(layout: &PinLayout) -> Option<u32> {
    MapInfo::from_pin(layout.map(MAP))
        .ok()
        .map(|info| info.id())
}

impl DatapathLog {
    /// Opens the ring buffer pinned under `layout`; `None` when none is
    /// (nothing installed yet, or a build before the log).
    pub fn open(layout: &PinLayout) -> Result<Option<DatapathLog>, DatapathLogError> {
        let path = layout.map(MAP);
        let Ok(info) = MapInfo::from_pin(&path) else {
            return Ok(None);
        };
        // aya maps the ring buffer at the object's size: refuse another.
        let map_type = info.map_type();
        if !matches!(map_type, Ok(aya::maps::MapType::RingBuf)) || info.max_entries() != BYTES {
            return Err(DatapathLogError::Unexpected {
                path,
                map_type: format!("{map_type:?}"),
                max_entries: info.max_entries(),
            });
        }
        // The pin exists: the load opens it (it would create and pin a
        // new one only if it had gone meanwhile, which the ID check of the
        // next drain then replaces).
        let mut ebpf = EbpfLoader::new()
            .map_pin_path(MAP, path.as_path())
            .load(LOG_MAP_OBJECT)
            .map_err(|source| DatapathLogError::Open {
                path: path.clone(),
                source: Box::new(source),
            })?;
        let logger = EbpfLogger::init_with_logger(&mut ebpf, Lines)
            .map_err(|source| DatapathLogError::Reader { path, source })?;
        Ok(Some(DatapathLog {
            logger,
            map_id: info.id(),
        }))
    }

    /// Whether the ring buffer pinned under `layout` is still this one.
    pub fn is_current(&self, layout: &PinLayout) -> bool {
        pinned_id(layout) == Some(self.map_id)
    }

    /// Logs every record the programs wrote since the last drain.
    pub fn drain(&mut self) {
        self.logger.flush();
    }
}

/// The agent's side of aya-log: each record as one line of the agent's
/// log, the reason named (see [`describe`]) and its level by the reason's
/// kind (a problem is a warning).
struct Lines;

impl log::Log for Lines {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        let message = record.args().to_string();
        let (level, line) = match describe(&message, crate::node::netlink::interface_name) {
            Some((Kind::Problem, line)) => (log::Level::Warn, line),
            Some((_, line)) => (log::Level::Info, line),
            None => (record.level(), format!("datapath event: {message}")),
        };
        if level > log::max_level() {
            return;
        }
        log::logger().log(
            &log::Record::builder()
                .args(format_args!("{line}"))
                .level(level)
                .target("datapath")
                .build(),
        );
    }

    fn flush(&self) {}
}

/// A record's message (`reason ID if INDEX proto P [SRC]:PORT > [DST]:PORT`,
/// see portmap-ebpf's `events.rs`) as a line for people: the reason's label
/// and kind, the interface by name (`interface_name` asks the kernel), an
/// IPv4 address without its IPv6 mapping, and what the reason means.
/// `None` for a message of another form.
pub fn describe(
    message: &str,
    interface_name: impl Fn(u32) -> Option<String>,
) -> Option<(Kind, String)> {
    let rest = message.strip_prefix(PREFIX)?;
    let (id, rest) = rest.split_once(' ')?;
    let reason = REASONS.get(id.parse::<usize>().ok()?)?;
    let rest = rest.strip_prefix("if ")?;
    let (ifindex, rest) = rest.split_once(' ')?;
    let ifindex: u32 = ifindex.parse().ok()?;
    let rest = rest.strip_prefix("proto ")?;
    let (proto, tuple) = rest.split_once(' ')?;
    let proto = match proto {
        "6" => "TCP".to_owned(),
        "17" => "UDP".to_owned(),
        "132" => "SCTP".to_owned(),
        other => format!("protocol {other}"),
    };
    // An IPv4 address is logged mapped into IPv6; brackets only for IPv6.
    let mut packet = String::new();
    for (i, end) in tuple.split(" > ").enumerate() {
        let (addr, port) = end.strip_prefix('[')?.split_once("]:")?;
        if i > 0 {
            packet.push_str(" > ");
        }
        match addr.strip_prefix("::ffff:").filter(|v4| v4.contains('.')) {
            Some(v4) => write!(packet, "{v4}:{port}"),
            None => write!(packet, "[{addr}]:{port}"),
        }
        .ok()?;
    }
    let interface = match interface_name(ifindex) {
        Some(name) => format!("{name} (if {ifindex})"),
        None => format!("if {ifindex}"),
    };
    // Only a problem is logged each time (rate-limited); the rest once per
    // CPU (see portmap-ebpf's `events::note_first`).
    let first = if reason.kind == Kind::Problem {
        ""
    } else {
        " (the first on this CPU)"
    };
    Some((
        reason.kind,
        format!(
            "datapath event: {} on {interface}: {proto} {packet}: {}{first}",
            reason.label, reason.meaning
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use portmap_common::stat;

    fn name(ifindex: u32) -> Option<String> {
        (ifindex == 3).then(|| "eth0".to_owned())
    }

    #[test]
    fn a_record_becomes_a_line_with_the_reason_named() {
        let id = stat::REWRITE_FAILED;
        let (kind, line) = describe(
            &format!(
                "reason {id} if 3 proto 6 [::ffff:203.0.113.7]:40123 > [::ffff:198.18.0.1]:8080"
            ),
            name,
        )
        .expect("our form");
        assert_eq!(kind, Kind::Problem);
        assert_eq!(
            line,
            "datapath event: rewrite-failed on eth0 (if 3): TCP 203.0.113.7:40123 > 198.18.0.1:8080: the packet could not be rewritten"
        );
        let (kind, line) = describe(
            &format!(
                "reason {} if 9 proto 17 [fd00::2]:53 > [2001:db8::1]:8053",
                stat::FAST_FORWARD
            ),
            name,
        )
        .expect("our form");
        assert_eq!(kind, Kind::Translated);
        assert!(
            line.starts_with(
                "datapath event: fast-forward on if 9: UDP [fd00::2]:53 > [2001:db8::1]:8053: "
            ) && line.ends_with(" (the first on this CPU)"),
            "{line}"
        );
    }

    #[test]
    fn other_messages_are_not_ours() {
        for message in [
            "never loaded",
            "reason x if 3 proto 6 [::1]:1 > [::1]:2",
            "reason 999 if 3 proto 6 [::1]:1 > [::1]:2",
            "reason 9 if 3 proto 6 ::1:1 > ::1:2",
        ] {
            assert_eq!(describe(message, name), None, "{message}");
        }
    }
}
