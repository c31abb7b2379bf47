//! `ebpf-portmap uninstall`: takes the dataplane off the node.

use std::process::ExitCode;

use anyhow::Context;
use portmap_user::ops::uninstall;
use serde_json::json;

use crate::cli::{
    PinRootArg, installed,
    output::{OutputArgs, print, print_json},
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
    #[command(flatten)]
    pin: PinRootArg,
    /// Uninstall even though containers still have mappings (their host
    /// ports stop working at once).
    #[arg(long)]
    force: bool,
}

pub fn run(args: &UninstallArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    let root = &args.pin.pin_root;
    let Some(layout) = installed(root)? else {
        if out.json() {
            print_json(
                &json!({"installed": false, "pinRoot": root, "detached": [], "removed": 0, "failures": []}),
            );
        } else {
            print(&format!("nothing installed under {}\n", root.display()));
        }
        return Ok(ExitCode::SUCCESS);
    };
    let report = uninstall::uninstall(&layout, args.force).context("cannot uninstall")?;
    let failures: Vec<String> = report.failures.iter().map(ToString::to_string).collect();
    if out.json() {
        let detached: Vec<String> = report.detached.iter().map(ToString::to_string).collect();
        print_json(&json!({
            "installed": true,
            "pinRoot": root,
            "detached": detached,
            "removed": report.removed.len(),
            "failures": failures,
        }));
    } else {
        for what in &report.detached {
            print(&format!("detached {what}\n"));
        }
        print(&format!(
            "removed {} pin(s) and directories\n",
            report.removed.len()
        ));
        for failure in &failures {
            eprintln!("ebpf-portmap: {failure}");
        }
    }
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
