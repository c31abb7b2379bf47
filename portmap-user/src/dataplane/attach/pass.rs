//! The records that let a run trust the attachments without looking at
//! them, beside the pin root's lock (outside bpffs, which holds no files):
//! that a run of this build put its programs on every attachment
//! ([`PassRecord`], `{lock}.tc`) and on every pod's bridge port
//! ([`PortsRecord`], `{lock}.ports`). A change of the programs or the
//! tables they read removes them before its first step
//! ([`invalidate_pass`]); `attach/ensure.rs` writes the first back after its
//! verified pass, `verbs::interfaces` the second after its walk of the
//! ports.

use std::{fs, io, path::PathBuf};

use crate::dataplane::{attach::cgroup, load::object::build_id, pinned::pin::PinLayout};

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error(
        "cannot write or remove {path}, a record of which programs the attachments run, before changing them; nothing was changed"
    )]
    Invalidate {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The record that a run of this build has put its tc programs on every
/// interface attached before, and its socket hooks in place, and then
/// found them all there (`{lock}.tc`, the build ID in hex, beside the
/// lock). Until it is written, no run takes the fast path, and each
/// slow-path run looks at every attachment: a change of programs or
/// tables (an upgrade, a resize) makes it say `pending` before its first
/// step (see [`invalidate_pass`]), so a run killed at any step of one
/// leaves the next run, or the agent's pass, to finish it.
pub(crate) struct PassRecord;

/// Where [`PassRecord`] is: an uninstall removes it with the programs.
pub fn pass_record(layout: &PinLayout) -> PathBuf {
    PassRecord::path(layout)
}

/// What the record of the attach pass says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// No record: nothing installed yet, or pins of a build before the
    /// record (it wrote none), or an uninstall.
    Nothing,
    /// A change of the programs or tables began and its pass has not
    /// finished: the next run must do it.
    Pending,
    /// The pass of this build (its ID) is done.
    Done(u64),
}

/// What the record says: `status` compares it with the pinned programs.
pub fn recorded_pass(layout: &PinLayout) -> Recorded {
    let Ok(text) = fs::read_to_string(PassRecord::path(layout)) else {
        return Recorded::Nothing;
    };
    if text == PENDING {
        return Recorded::Pending;
    }
    u64::from_str_radix(text.trim(), 16).map_or(Recorded::Nothing, Recorded::Done)
}

/// The record's text while a change is under way.
const PENDING: &str = "pending\n";

/// Marks a change of the programs or of the tables they read (a load of
/// programs, a resize) as begun, the first step of each, under the pin
/// root's lock before anything is changed: [`PassRecord`] says `pending`
/// (a record written whole, see `lock::write_record`), and the records of
/// the bridge ports and of the socket hooks, which let a run trust them
/// without looking, are removed. From then until a pass has put the new
/// programs everywhere and found them there, every run does that pass: a
/// run killed midway leaves one whole dataplane running (the links hold
/// the old programs and the tables they read until each is replaced) and
/// the next run (any CNI call, the agent's pass, `reconcile`) finishes the
/// change; `status` says it is unfinished. A record that cannot be
/// written or removed changes nothing and fails the run.
pub fn invalidate_pass(layout: &PinLayout) -> Result<(), PassError> {
    let path = PassRecord::path(layout);
    crate::dataplane::pinned::lock::write_record(&path, PENDING)
        .map_err(|source| PassError::Invalidate { path, source })?;
    for path in [PortsRecord::path(layout), cgroup::hooks_record(layout)] {
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(PassError::Invalidate { path, source }),
        }
    }
    Ok(())
}

impl PassRecord {
    fn path(layout: &PinLayout) -> PathBuf {
        layout.lock_file().with_extension("tc")
    }

    pub(crate) fn text() -> String {
        format!("{:016x}\n", build_id())
    }

    pub(crate) fn is_current(layout: &PinLayout) -> bool {
        std::fs::read_to_string(Self::path(layout)).is_ok_and(|text| text == Self::text())
    }

    /// Best effort: without it the next slow path looks at everything again.
    pub(crate) fn write(layout: &PinLayout) {
        let path = Self::path(layout);
        if let Err(error) = crate::dataplane::pinned::lock::write_record(&path, &Self::text()) {
            log::debug!("attachment record {} not written: {error}", path.display());
        }
    }
}

/// The record that a run of this build has put the ingress program on
/// every pod's bridge port of the node (`{lock}.ports`, the build ID in
/// hex, beside the lock). Until then a run does that node-wide: the pods
/// made before the dataplane existed (an ADD without mappings installs
/// nothing) or before this build (an upgrade) have none.
pub struct PortsRecord;

impl PortsRecord {
    pub fn path(layout: &PinLayout) -> PathBuf {
        layout.lock_file().with_extension("ports")
    }

    pub fn is_current(layout: &PinLayout) -> bool {
        std::fs::read_to_string(Self::path(layout)).is_ok_and(|text| text == PassRecord::text())
    }

    /// Best effort: without it the next run walks the ports again.
    pub fn write(layout: &PinLayout) {
        let path = Self::path(layout);
        if let Err(error) = crate::dataplane::pinned::lock::write_record(&path, &PassRecord::text())
        {
            log::debug!(
                "bridge ports record {} not written: {error}",
                path.display()
            );
        }
    }
}
