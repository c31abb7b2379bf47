//! Operator verbs, one module each, and what they share: the output
//! options, the exit codes, how a verb finds the state it reads, and how an
//! error is reported.

use std::{
    io,
    path::{Path, PathBuf},
    process::ExitCode,
};

use aya::maps::MapData;
use portmap_user::{
    ops::bpffs,
    ops::pin::PinLayout,
    ops::scope::{self, Access},
};
use serde_json::json;

pub mod chain;
pub mod completions;
pub mod exit;
pub mod gc;
pub mod list;
pub mod man;
pub mod migrate;
pub mod output;
pub mod reconcile;
pub mod status;
pub mod trace;
pub mod uninstall;
pub mod version;

use exit::CannotInspect;
use output::OutputArgs;

/// The `--pin-root` every verb that reads the dataplane takes.
#[derive(Debug, Clone, clap::Args)]
pub struct PinRootArg {
    /// Pin root the plugin was configured with (`pinRoot`).
    #[arg(
        long,
        value_name = "DIR",
        env = "EPM_PIN_ROOT",
        default_value = portmap_user::model::DEFAULT_PIN_ROOT
    )]
    pub pin_root: PathBuf,
}

/// The layout of this network namespace's state under `pin_root` (a pin
/// root is shared by namespaces: see `scope`), after checking that it is on
/// bpffs (else exit code 3).
pub fn layout(pin_root: &Path) -> anyhow::Result<PinLayout> {
    bpffs::check_bpffs(pin_root).map_err(|_| CannotInspect::NotBpffs {
        path: pin_root.display().to_string(),
    })?;
    match scope::resolve(pin_root, Access::Read) {
        Err(scope::ScopeError::InUse { root, owner, .. }) => {
            let root = root.display().to_string();
            Err(match portmap_user::ops::namespace::find(owner) {
                Some(netns) => CannotInspect::InAnotherNamespace {
                    root,
                    netns: netns.display().to_string(),
                    command: std::env::args().collect::<Vec<_>>().join(" "),
                },
                None => CannotInspect::NamespaceGone { root, owner },
            }
            .into())
        }
        resolved => Ok(resolved?),
    }
}

/// The state under `pin_root`: `None` when nothing is installed there (no
/// ADD ran yet, or it was uninstalled), an error when it cannot be looked at
/// (no bpffs there, no permission: exit code 3).
pub fn installed(pin_root: &Path) -> anyhow::Result<Option<PinLayout>> {
    let shown = pin_root.display().to_string();
    let layout = layout(pin_root)?;
    match std::fs::metadata(layout.versioned()) {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(_) => return Err(CannotInspect::Denied { path: shown }.into()),
    }
    // Opening a pinned map is what every verb does first; without the
    // privilege the path lookup or BPF_OBJ_GET says so. A missing map is
    // left to the verb (a partial install is a problem it reports).
    if let Err(error) = MapData::from_pin(layout.map(portmap_common::maps::MAPPINGS))
        && exit::is_denied_error(&error)
    {
        return Err(CannotInspect::Denied { path: shown }.into());
    }
    Ok(Some(layout))
}

/// A verb's error: one line on stderr, and with JSON output also a JSON
/// object on stdout (as `bpftool -j` does), then its exit code.
pub fn failed(error: &anyhow::Error, out: &OutputArgs) -> ExitCode {
    let code = exit::of_error(error);
    eprintln!("ebpf-portmap: {error:#}");
    if out.json() {
        output::print_json(&json!({"error": format!("{error:#}"), "exitCode": code}));
    }
    exit::code(code)
}

/// A command line clap took but a verb finds incomplete: `message` on
/// stderr (and as JSON when asked), exit 2 as for clap's own refusals.
pub fn usage_refusal(message: &str, out: &OutputArgs) -> ExitCode {
    eprintln!("ebpf-portmap: {message}");
    if out.json() {
        output::print_json(&json!({"error": message, "exitCode": exit::USAGE}));
    }
    exit::code(exit::USAGE)
}

/// A command line clap refused (exit 2), or `--help`/`--version` (exit 0).
/// With JSON asked for anywhere on the line, the refusal is also a JSON
/// object on stdout.
pub fn usage_error(error: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        let _ = error.print();
        return ExitCode::SUCCESS;
    }
    let _ = error.print();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if asks_for_json(&args) {
        let message = error.kind().to_string();
        output::print_json(&json!({"error": message, "exitCode": exit::USAGE}));
    }
    exit::code(exit::USAGE)
}

/// Whether a command line asks for JSON output in any spelling clap takes.
fn asks_for_json(args: &[String]) -> bool {
    args.iter().enumerate().any(|(index, arg)| {
        let next_is_json = || args.get(index + 1).is_some_and(|next| next == "json");
        arg == "--json"
            || arg == "--output=json"
            || arg == "-ojson"
            || arg == "-o=json"
            || ((arg == "-o" || arg == "--output") && next_is_json())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &str) -> Vec<String> {
        args.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn every_spelling_of_json_output_is_recognised() {
        for args in [
            "list --json",
            "-o json list",
            "list -o json",
            "list -ojson",
            "list --output=json",
            "list --output json",
        ] {
            assert!(asks_for_json(&line(args)), "{args}");
        }
        for args in ["list", "list -o wide", "chain install --entry json"] {
            assert!(!asks_for_json(&line(args)), "{args}");
        }
    }

    #[test]
    fn a_pin_root_off_bpffs_cannot_be_inspected() {
        let error = installed(Path::new("/proc/self")).expect_err("procfs is not bpffs");
        assert!(
            matches!(error.downcast_ref(), Some(CannotInspect::NotBpffs { .. })),
            "{error}"
        );
    }
}
