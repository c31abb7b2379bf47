//! `ebpf-portmap uninstall`: takes the dataplane of one pin root off the
//! node, leaving it as it was before the first ADD.
//!
//! Every attachment under `links/` is detached (tcx links unpinned and
//! released, clsact filters deleted by their fixed priority and handle,
//! other links such as cgroup hooks unpinned and released), then every
//! pinned program and map is unpinned and the directories of the layout are
//! removed; the kernel frees programs and maps once nothing holds them. The
//! pin root itself goes when it is left empty, and the record of the
//! configured `interfaces` beside the lock. Two things stay: a clsact
//! qdisc (other tools may have filters on it) and the empty load-lock file
//! in `/run/ebpf-portmap` (removing a lock file someone may be waiting on
//! would let two loaders run at once; `/run` is emptied at boot).
//!
//! It refuses while mappings exist (their containers would lose their
//! ports), unless forced. It takes the load lock, so a first ADD running at
//! the same time either finishes before or starts after it. Like netavark's
//! teardown, it keeps going after an error and reports every one.

use std::{
    fs, io,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use aya::programs::links::PinnedLink;

use crate::{
    dataplane::attach,
    dataplane::ownership::Store,
    dataplane::pin::{PinLayout, parse_tc_pin_name},
    node::netlink,
};

#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error(
        "{mappings} port mapping(s) of {owners} container(s) are still installed; remove the containers first (or pass --force to cut them off)"
    )]
    InUse { mappings: usize, owners: usize },
    #[error(
        "the node agent (ebpf-portmap-agent, pid {pid}) keeps this dataplane and would re-create it within a second; stop it first (`systemctl stop ebpf-portmap-agent`, or remove the DaemonSet), or pass --stop-agent"
    )]
    AgentRunning { pid: u32 },
    #[error(
        "the node agent (pid {pid}) did not stop within {waited:?} of SIGTERM; nothing was removed"
    )]
    AgentDidNotStop {
        pid: u32,
        waited: std::time::Duration,
    },
    #[error("cannot unpin {path}")]
    Unpin {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What `uninstall` did, and what it could not do.
#[derive(Debug, Default)]
pub struct Report {
    pub detached: Vec<String>,
    pub removed: Vec<PathBuf>,
    pub failures: Vec<String>,
}

/// Mappings and owners still installed under `layout`.
pub fn in_use(layout: &PinLayout) -> (usize, usize) {
    let Ok(maps) = Store::open(layout) else {
        return (0, 0);
    };
    let mappings = maps.mappings.keys().filter(Result::is_ok).count();
    let owners = maps.owners.keys().filter(Result::is_ok).count();
    (mappings, owners)
}

fn lock(layout: &PinLayout) -> Result<Option<fs::File>, UninstallError> {
    let path = layout.lock_file();
    let file = match fs::OpenOptions::new().write(true).open(&path) {
        Ok(file) => file,
        // No lock file: no ADD ever loaded anything with this root here.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(UninstallError::Lock { path, source }),
    };
    // SAFETY: flock on an fd we own; released when `file` is closed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(UninstallError::Lock {
            path,
            source: io::Error::last_os_error(),
        });
    }
    Ok(Some(file))
}

fn remove_pin(path: &Path, report: &mut Report) {
    match fs::remove_file(path) {
        Ok(()) => report.removed.push(path.to_path_buf()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => report
            .failures
            .push(format!("removing {}: {e}", path.display())),
    }
}

fn remove_dir(path: &Path, report: &mut Report) {
    match fs::remove_dir(path) {
        Ok(()) => report.removed.push(path.to_path_buf()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => report
            .failures
            .push(format!("removing {}: {e}", path.display())),
    }
}

fn detach_links(layout: &PinLayout, report: &mut Report) {
    let Ok(entries) = fs::read_dir(layout.links_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let parsed = parse_tc_pin_name(&name);
        match parsed {
            Some((ifindex, direction, true)) => {
                // The marker pin is the program; the filter holds it.
                let what = format!(
                    "clsact {} filter on interface index {ifindex}",
                    direction.as_str()
                );
                match netlink::interface_name(ifindex) {
                    Some(interface) => match attach::detach_clsact(&interface, direction) {
                        Ok(()) => report.detached.push(format!(
                            "clsact {} filter on {interface}",
                            direction.as_str()
                        )),
                        Err(e) => report.failures.push(format!("detaching {what}: {e}")),
                    },
                    // The interface and its filters are gone with it.
                    None => report.detached.push(format!("{what} (interface gone)")),
                }
                remove_pin(&path, report);
            }
            _ => match PinnedLink::from_pin(&path) {
                Ok(link) => match link.unpin() {
                    // Dropping the last reference releases (detaches) the link.
                    Ok(link) => {
                        drop(link);
                        report.removed.push(path.clone());
                        report.detached.push(match parsed {
                            Some((ifindex, direction, _)) => format!(
                                "tcx {} link on {}",
                                direction.as_str(),
                                netlink::interface_name(ifindex)
                                    .unwrap_or_else(|| format!("interface index {ifindex}"))
                            ),
                            None => format!("link {name}"),
                        });
                    }
                    Err(e) => report
                        .failures
                        .push(format!("unpinning {}: {e}", path.display())),
                },
                // Not a link (or unreadable): unpin whatever it is.
                Err(_) => remove_pin(&path, report),
            },
        }
    }
}

fn remove_pins_in(dir: &Path, report: &mut Report) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            remove_pin(&entry.path(), report);
        }
    }
}

/// How long `uninstall --stop-agent` waits for the agent to end its pass
/// and exit.
pub const AGENT_STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Refuses while a node agent keeps `layout` (it would re-create everything
/// within a second), or, with `stop_agent`, stops it (SIGTERM, then waits
/// [`AGENT_STOP_WAIT`] for it to exit). Returns the PID stopped.
pub fn stop_agent_first(
    layout: &PinLayout,
    stop_agent: bool,
) -> Result<Option<u32>, UninstallError> {
    let Some(pid) = crate::dataplane::agent_record::running(layout) else {
        return Ok(None);
    };
    if !stop_agent {
        return Err(UninstallError::AgentRunning { pid });
    }
    // SAFETY: kill(2) with a PID read from the record and checked to be the
    // agent's (its comm) just above.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + AGENT_STOP_WAIT;
    while crate::dataplane::agent_record::running(layout).is_some() {
        if std::time::Instant::now() > deadline {
            return Err(UninstallError::AgentDidNotStop {
                pid,
                waited: AGENT_STOP_WAIT,
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(Some(pid))
}

/// Takes everything of `layout` off the node; see the module docs.
pub fn uninstall(layout: &PinLayout, force: bool) -> Result<Report, UninstallError> {
    let mut report = Report::default();
    let _lock = lock(layout)?;
    let (mappings, owners) = in_use(layout);
    if mappings > 0 && !force {
        return Err(UninstallError::InUse { mappings, owners });
    }
    detach_links(layout, &mut report);
    remove_pins_in(&layout.progs_dir(), &mut report);
    remove_pins_in(&layout.maps_dir(), &mut report);
    for dir in [layout.links_dir(), layout.progs_dir(), layout.maps_dir()] {
        remove_dir(&dir, &mut report);
    }
    remove_dir(&layout.versioned(), &mut report);
    // The `interfaces` of the last sync: a later install must not judge
    // its attachments against a configuration of this one.
    remove_pin(
        &crate::dataplane::node_state::interfaces_record(layout),
        &mut report,
    );
    for record in crate::dataplane::node_state::sync_records(layout) {
        remove_pin(&record, &mut report);
    }
    remove_pin(&crate::dataplane::attach::pass_record(layout), &mut report);
    remove_pin(
        &crate::dataplane::attach::PortsRecord::path(layout),
        &mut report,
    );
    // Likewise the record of the hooks found in place, and the root's
    // registration (see `dataplane::stale`).
    remove_pin(&crate::dataplane::cgroup::hooks_record(layout), &mut report);
    remove_pin(&crate::dataplane::lock::root_record(layout), &mut report);
    remove_pin(
        &crate::dataplane::key_notes::record_path(layout),
        &mut report,
    );
    // Only if nothing else (another layout version, other namespaces'
    // roots) lives there.
    crate::dataplane::bpffs::remove_root_if_empty(layout.root(), &mut |dir| {
        remove_dir(dir, &mut report);
    });
    // With the root gone, every record of it goes too (the probe record,
    // the agent's, the locks), or they would outlive it unnamed; the lock
    // last (a run waiting for it opens the new one, see `lock::lock`).
    if !layout.root().exists() {
        let lock = layout.lock_file();
        for record in crate::dataplane::stale::records_of(layout) {
            if record != lock {
                remove_pin(&record, &mut report);
            }
        }
        remove_pin(&lock, &mut report);
    }
    Ok(report)
}

/// Unpins the tc attachments of interfaces that no longer exist (the host
/// ends of removed containers' veths: the kernel detached them with the
/// interface, only the pins are left). Under the load lock, so an ADD that
/// attaches to a new interface with the same index cannot lose its pin.
/// Returns the pins removed (or, with `dry_run`, that would be).
pub fn remove_stale_links(
    layout: &PinLayout,
    dry_run: bool,
) -> Result<Vec<PathBuf>, UninstallError> {
    let _lock = lock(layout)?;
    let mut stale = Vec::new();
    let Ok(entries) = fs::read_dir(layout.links_dir()) else {
        return Ok(stale);
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some((ifindex, _, _)) = parse_tc_pin_name(&name)
            && netlink::interface_name(ifindex).is_none()
        {
            if !dry_run {
                fs::remove_file(entry.path()).map_err(|source| UninstallError::Unpin {
                    path: entry.path(),
                    source,
                })?;
            }
            stale.push(entry.path());
        }
    }
    stale.sort();
    Ok(stale)
}
