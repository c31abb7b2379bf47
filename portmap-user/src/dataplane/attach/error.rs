//! What stops the programs from being loaded or attached, and the missing
//! kernel feature that explains a failed load.

use std::{io, path::PathBuf};

use aya::{EbpfError, programs::ProgramError};

use crate::dataplane::{
    attach::cgroup, load::features, pinned::bpffs::BpffsError, pinned::lock::LockError,
};

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(transparent)]
    Feature(#[from] crate::dataplane::load::features::FeatureError),
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    #[error(transparent)]
    Bpffs(#[from] BpffsError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(
        "this kernel lacks {feature}, which ebpf-portmap needs (Linux {since} or later has it)"
    )]
    MissingFeature {
        feature: &'static str,
        since: &'static str,
        /// The load failure that sent us looking.
        #[source]
        cause: Box<AttachError>,
    },
    #[error("cannot load the eBPF object")]
    Load(#[source] Box<EbpfError>),
    #[error("cannot load program {program}")]
    Program {
        program: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("cannot attach {program} to interface {interface} ({direction})")]
    Attach {
        program: &'static str,
        interface: String,
        direction: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("cannot pin {path}")]
    Pin {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "pinned map {path} has key size {key_size} and value size {value_size}, this build expects {expected_key} and {expected_value}: it was made by an incompatible build; remove it with `ebpf-portmap uninstall` or use another pinRoot"
    )]
    IncompatibleMap {
        path: PathBuf,
        key_size: u32,
        value_size: u32,
        expected_key: u32,
        expected_value: u32,
    },
    #[error("interface index {index} does not exist")]
    NoInterface { index: u32 },
    #[error(transparent)]
    Resize(#[from] crate::dataplane::pinned::resize::ResizeError),
    #[error("cannot link the eBPF object's kfunc calls")]
    Kfunc(#[from] crate::dataplane::load::kfunc::KfuncError),
    #[error(transparent)]
    ModuleKfuncLoad(#[from] crate::dataplane::load::program::ProgramLoadError),
    #[error(transparent)]
    Pass(#[from] crate::dataplane::attach::pass::PassError),
}

/// A load failure, explained by the missing feature when the kernel lacks
/// one; any other error is returned as it is.
pub(super) fn explain_load_failure(error: AttachError) -> AttachError {
    if !matches!(error, AttachError::Load(_) | AttachError::Program { .. }) {
        return error;
    }
    match features::first_missing(features::supported) {
        Some(feature) => AttachError::MissingFeature {
            feature: feature.name,
            since: feature.since,
            cause: Box::new(error),
        },
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_feature_message_names_feature_and_kernel() {
        let fib = features::ESSENTIAL
            .iter()
            .find(|f| f.name.contains("bpf_fib_lookup"))
            .unwrap();
        let error = AttachError::MissingFeature {
            feature: fib.name,
            since: fib.since,
            cause: Box::new(AttachError::NoInterface { index: 1 }),
        };
        let text = error.to_string();
        assert!(
            text.contains("bpf_fib_lookup") && text.contains("Linux 4.18 or later"),
            "{text}"
        );
    }
}
