//! `ebpf-portmap trace`: a live stream of the dataplane's decisions.

use std::{
    collections::HashMap,
    process::ExitCode,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::Context;
use portmap_common::reason::Kind;
use portmap_user::{
    model::Protocol,
    ops::ledger::{self, Evictions},
    ops::netlink,
    ops::trace::{self, Clock, TraceRecord, TraceRequest, Tracer},
};

use crate::cli::{
    PinRootArg, installed,
    output::{Colour, OutputArgs, print},
};

/// Show, live, what the dataplane decides for each packet.
///
/// Every packet the programs handle while this runs (filtered by --port and
/// --proto) is printed with the interface, direction, addresses and the
/// decision: translated-new / translated (DNAT to the container), reply
/// (source restored to the host port), no-mapping (nothing publishes that
/// port), skipped-not-local (the destination is not this node),
/// skipped-not-syn (no flow start), no-backend (the flow's mapping was
/// deleted or re-pointed), conntrack-full, forwarding-disabled, and more.
/// Without --port only packets the dataplane acted on are shown.
///
/// Connections that node processes open to a host port (node-IP:hostPort,
/// localhost) are pointed at the container by the cgroup socket hooks and
/// cross no translating tc hook: each connect() (and each unconnected
/// sendmsg()) shows as one `sock` line, `sock connect tcp node >
/// 198.18.0.1:8080: socket-translated, now to 10.244.0.5:80`.
///
/// Tracing is off by default and costs the programs one array lookup per
/// packet then; it is switched on while this runs and off when it exits
/// (also on Ctrl-C or SIGTERM). One trace at a time per node.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ebpf-portmap trace --port 8080
  ebpf-portmap trace --port 53 --proto udp --count 10
  ebpf-portmap trace -o json --timeout 30 > trace.jsonl
  ebpf-portmap trace --stop          # switch off tracing left on by a killed trace

With -o json: one JSON object per line. On a node where nothing is installed,
one line says so (exit 1).")]
pub struct TraceArgs {
    #[command(flatten)]
    pin: PinRootArg,
    /// Only packets with this port at either end, before or after
    /// translation (a host port or a container port).
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    port: Option<u16>,
    /// Only this protocol: tcp, udp or sctp.
    #[arg(long, value_name = "PROTO", value_parser = parse_proto)]
    proto: Option<u8>,
    /// Stop after this many events (exit 1 if --timeout ends it first).
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// Take over from another running trace.
    #[arg(long)]
    force: bool,
    /// Switch tracing off (after a trace was killed) and exit.
    #[arg(long, conflicts_with_all = ["port", "proto", "count", "timeout", "force"])]
    stop: bool,
}

fn parse_proto(text: &str) -> Result<u8, String> {
    Protocol::from_name(text)
        .map(Protocol::number)
        .ok_or_else(|| format!("{text:?} is not tcp, udp or sctp"))
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Ctrl-C and SIGTERM end the loop (and so switch tracing off) instead of
/// killing the process with tracing still on.
fn catch_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; no SA_RESTART, so poll() returns EINTR at once.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&raw mut action.sa_mask);
            libc::sigaction(signal, &raw const action, std::ptr::null_mut());
        }
    }
}

/// The colour of a traced packet: its first decision's kind (the reason
/// order puts what was done to the packet first).
fn colour_of(record: &TraceRecord) -> Colour {
    match trace::decisions(&record.event)[0].kind {
        Kind::Translated | Kind::Recorded => Colour::Green,
        Kind::Skipped => Colour::Yellow,
        Kind::Problem => Colour::Red,
    }
}

pub fn run(args: &TraceArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    let Some(layout) = installed(&args.pin.pin_root)? else {
        eprintln!(
            "ebpf-portmap: nothing is installed under {}: no traffic to trace until the first ADD",
            args.pin.pin_root.display()
        );
        return Ok(ExitCode::FAILURE);
    };
    if args.stop {
        let old = trace::clear_filter(&layout).context("cannot switch tracing off")?;
        if old.enabled != 0 {
            eprintln!("tracing switched off (was on for pid {})", old.tracer_pid);
        } else {
            eprintln!("tracing was already off");
        }
        return Ok(ExitCode::SUCCESS);
    }
    catch_signals();
    let request = TraceRequest {
        port: args.port,
        proto: args.proto,
    };
    // Events the programs drop for a full ring buffer from now on: reported
    // as they happen, as `cilium monitor` does. Read before tracing starts,
    // so none of ours is taken for an earlier tracer's.
    let lost_at_start = trace::lost_events(&layout).unwrap_or(0);
    // Evictions, as `status` counts them: reported when they grow, as the
    // lost events are (a walk of the tables, so every few seconds only).
    let mut evicted_seen = ledger::evictions_now(&layout).unwrap_or_default();
    let mut evictions_read = Instant::now();
    let mut tracer = Tracer::start(&layout, request, args.force).context("cannot start tracing")?;
    let what = match args.port {
        Some(port) => format!("port {port}"),
        None => "every translated or skipped packet".into(),
    };
    eprintln!("tracing {what} (Ctrl-C to stop)");

    let style = out.style();
    let clock = Clock::now();
    let deadline = args
        .timeout
        .map(|secs| Instant::now() + Duration::from_secs(secs));
    let mut names: HashMap<u32, String> = HashMap::new();
    let mut seen = 0u64;
    let mut lost_reported = 0;
    let reached = |seen: u64| args.count.is_some_and(|count| seen >= count);
    while !STOP.load(Ordering::SeqCst) && !reached(seen) {
        let wait = match deadline {
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) => left.min(trace::POLL_INTERVAL),
                None => break,
            },
            None => trace::POLL_INTERVAL,
        };
        for event in tracer.poll(wait).context("reading trace events")? {
            if reached(seen) {
                break;
            }
            // A socket hook's event has no interface (index 0): the node
            // process's connect() or sendmsg() itself.
            let interface = names
                .entry(event.ifindex)
                .or_insert_with(|| match event.ifindex {
                    0 => "sock".into(),
                    ifindex => {
                        netlink::interface_name(ifindex).unwrap_or_else(|| format!("if{ifindex}"))
                    }
                })
                .clone();
            let record = TraceRecord {
                time: clock.wall(event.ts_ns),
                interface,
                event,
            };
            if out.json() {
                print(&format!("{}\n", record.to_json()));
            } else {
                print(&format!(
                    "{}\n",
                    style.paint(colour_of(&record), &record.line())
                ));
            }
            seen += 1;
        }
        if evictions_read.elapsed() >= EVICTIONS_INTERVAL {
            evictions_read = Instant::now();
            if let Some(now) = ledger::evictions_now(&layout) {
                report_evictions(evicted_seen, now, out);
                evicted_seen = now;
            }
        }
        let lost = trace::lost_events(&layout)
            .unwrap_or(0)
            .saturating_sub(lost_at_start);
        if lost > lost_reported {
            report_lost(lost - lost_reported, out);
            lost_reported = lost;
        }
    }
    drop(tracer);
    if let Some(count) = args.count
        && seen < count
        && !STOP.load(Ordering::SeqCst)
    {
        eprintln!("timed out after {seen} of {count} event(s)");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// How often `trace` counts the conntrack tables' evictions.
const EVICTIONS_INTERVAL: Duration = Duration::from_secs(5);

/// `evicted ...`: the entries the conntrack tables evicted since the last
/// report, live flows' and unreplied ones apart; on stderr, and as
/// `{"evicted": {"live": N, "unreplied": M}}` in the JSON stream.
fn report_evictions(before: Evictions, now: Evictions, out: &OutputArgs) {
    let live = now.live.saturating_sub(before.live);
    let unreplied = now.unreplied.saturating_sub(before.unreplied);
    if live == 0 && unreplied == 0 {
        return;
    }
    eprintln!(
        "evicted {live} entries of live (assured) flows{} and {unreplied} of flows never assured (conntrack_new) in the last {}s",
        if live > 0 {
            ": connections lost their translation (raise conntrackSize)"
        } else {
            ""
        },
        EVICTIONS_INTERVAL.as_secs()
    );
    if out.json() {
        print(&format!(
            "{}\n",
            serde_json::json!({ "evicted": { "live": live, "unreplied": unreplied } })
        ));
    }
}

/// `lost N event(s)`: on stderr, and as `{"lost": N}` in the JSON stream.
fn report_lost(count: u64, out: &OutputArgs) {
    eprintln!(
        "lost {count} event(s): the ring buffer was full (trace fewer packets with --port/--proto)"
    );
    if out.json() {
        print(&format!("{}\n", serde_json::json!({ "lost": count })));
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use portmap_common::{
        TraceEvent,
        reason::{NO_MAPPING, REASONS},
    };

    use super::*;

    fn record(decisions: u64) -> TraceRecord {
        TraceRecord {
            time: SystemTime::UNIX_EPOCH,
            interface: "eth0".into(),
            event: TraceEvent {
                family: 4,
                proto: 6,
                decisions,
                ..TraceEvent::default()
            },
        }
    }

    #[test]
    fn every_reason_has_the_colour_of_its_kind() {
        for reason in &REASONS {
            let expected = match reason.kind {
                Kind::Translated | Kind::Recorded => Colour::Green,
                Kind::Skipped => Colour::Yellow,
                Kind::Problem => Colour::Red,
            };
            assert_eq!(
                colour_of(&record(1 << reason.id)),
                expected,
                "{} ({:?})",
                reason.label,
                reason.kind
            );
        }
        assert_eq!(colour_of(&record(0)), Colour::Red, "{}", NO_MAPPING.label);
    }

    #[test]
    fn fast_path_hand_overs_are_green_like_the_translations_they_carry() {
        for label in ["fast-forward", "fast-reply"] {
            let reason = REASONS.iter().find(|r| r.label == label).expect(label);
            assert_eq!(colour_of(&record(1 << reason.id)), Colour::Green, "{label}");
        }
    }
}
