//! `ebpf-portmap uninstall`: takes the dataplane off the node.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;
use portmap_user::{
    config::DEFAULT_PIN_ROOT,
    scope::{self, Access},
    uninstall,
};

/// Detach the programs and remove every pin, leaving the node as before the
/// first ADD.
///
/// Detaches every tc attachment (tcx links, clsact filters) and other link
/// the plugin made, unpins its programs and maps and removes the pin
/// directories. Refuses while containers still have port mappings, unless
/// --force. The next ADD installs everything again.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ebpf-portmap uninstall
  ebpf-portmap uninstall --pin-root /sys/fs/bpf/ebpf-portmap --force")]
pub struct UninstallArgs {
    /// Pin root the plugin was configured with (`pinRoot`).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_ROOT)]
    pin_root: PathBuf,
    /// Uninstall even though containers still have mappings (their host
    /// ports stop working at once).
    #[arg(long)]
    force: bool,
}

pub fn run(args: &UninstallArgs) -> anyhow::Result<ExitCode> {
    let layout = scope::resolve(&args.pin_root, Access::Read)?;
    if !layout.versioned().exists() {
        println!("nothing installed under {}", args.pin_root.display());
        return Ok(ExitCode::SUCCESS);
    }
    let report = uninstall::uninstall(&layout, args.force).context("cannot uninstall")?;
    for what in &report.detached {
        println!("detached {what}");
    }
    println!("removed {} pin(s) and directories", report.removed.len());
    if report.failures.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        for failure in &report.failures {
            eprintln!("ebpf-portmap: {failure}");
        }
        Ok(ExitCode::FAILURE)
    }
}
