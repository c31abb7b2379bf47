//! `ebpf-portmap chain`: puts the plugin into the node's CNI configuration,
//! or takes it out (what `deploy/install.sh` runs on every node).

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Context;
use portmap_user::ops::chain::{self, DEFAULT_NET_DIR, Placement, Selection};
use serde_json::{Value, json};

use crate::cli::output::{OutputArgs, print, print_json};

/// Chain ebpf-portmap into the CNI configuration the runtime uses, or
/// take it out again.
///
/// Which file: containerd and the kubelet use the lexically first *.conf,
/// *.conflist or *.json file of the configuration directory, and so does
/// this command by default. Runtimes that pick a network by name (podman,
/// Nomad's `cni/<name>`, nerdctl) need --network NAME, which finds the file as
/// libcni does (the first .conflist of that name, else the first .conf);
/// --file PATH names the file outright. `install` puts an ebpf-portmap entry into that file in place of an
/// upstream portmap entry (same position, its capabilities kept), or
/// after the main plugin if there is none; a single-plugin .conf is turned
/// into a .conflist. The file as the main plugin wrote it is kept as
/// <file>.ebpf-portmap.bak. Running it again changes nothing, so it can run
/// in a loop to re-apply the chaining after the main plugin rewrites its
/// file. Nothing is written if the file is not valid, or if the plugin
/// would refuse the chained entry.
///
/// On a CRI-O node (its configuration under /etc/crio or its socket
/// /var/run/crio/crio.sock under --host-root) `install` refuses and changes
/// nothing: CRI-O maps host ports itself and passes none to CNI
/// (cri-o/cri-o#7217), so the plugin would never be asked to map a port.
/// --force chains it anyway.
///
/// `remove` restores every file from its backup. `check` exits 0 when the
/// file the runtime uses is chained as `install` would leave it.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ebpf-portmap chain install
  ebpf-portmap chain install --network mynet         (a runtime that picks the network by name)
  ebpf-portmap chain install --file /etc/cni/net.d/87-podman.conflist
  ebpf-portmap chain install --net-dir /host/etc/cni/net.d --entry '{\"hostPortListeners\":\"allow\"}'
  ebpf-portmap chain check || echo not chained
  ebpf-portmap chain remove

Exit status: 0 done (or, for check, chained), 1 otherwise (the reason is printed).")]
pub struct ChainArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Chain ebpf-portmap into the configuration the runtime uses.
    Install(InstallArgs),
    /// Restore the configurations `install` changed.
    Remove(DirArgs),
    /// Exit 0 if the configuration the runtime uses is chained as `install`
    /// with the same --entry would leave it.
    Check(EntryArgs),
}

#[derive(clap::Args)]
struct DirArgs {
    /// The runtime's CNI configuration directory.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_NET_DIR)]
    net_dir: PathBuf,
    /// The configuration of the network with this "name" (for runtimes
    /// that choose a network by name), not the lexically first file.
    #[arg(long, value_name = "NAME", conflicts_with = "file")]
    network: Option<String>,
    /// This configuration file (its directory replaces --net-dir).
    #[arg(long, value_name = "PATH", conflicts_with = "net_dir")]
    file: Option<PathBuf>,
}

impl DirArgs {
    fn selection(&self) -> Selection {
        match (&self.network, &self.file) {
            (Some(name), _) => Selection::Network(name.clone()),
            (None, Some(file)) => Selection::File(file.clone()),
            (None, None) => Selection::First,
        }
    }
}

#[derive(clap::Args)]
struct EntryArgs {
    #[command(flatten)]
    dir: DirArgs,
    /// Keys for the ebpf-portmap entry, as a JSON object (pinRoot,
    /// hostPortListeners, ...); type and capabilities.portMappings are set.
    #[arg(long, value_name = "JSON")]
    entry: Option<String>,
}

#[derive(clap::Args)]
struct InstallArgs {
    #[command(flatten)]
    entry: EntryArgs,
    /// The node's root directory, where CRI-O's configuration and socket
    /// are looked for (the installer passes its HOST_ROOT).
    #[arg(long, value_name = "DIR", default_value = "/")]
    host_root: PathBuf,
    /// Chain the plugin even on a node that CRI-O runs (where it is never
    /// asked to map a port).
    #[arg(long)]
    force: bool,
}

pub fn run(args: &ChainArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    match &args.action {
        Action::Install(args) => install(args, out),
        Action::Remove(args) => remove(args, out),
        Action::Check(args) => check(args, out),
    }
}

/// Text lines, or with JSON output the one document.
fn emit(out: &OutputArgs, lines: &[String], document: Value) {
    if out.json() {
        print_json(&document);
    } else {
        for line in lines {
            print(&format!("{line}\n"));
        }
    }
}

fn install(install: &InstallArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    let args = &install.entry;
    let crio = chain::crio::crio_markers(&install.host_root);
    if !crio.is_empty() {
        let found: Vec<String> = crio.iter().map(|p| p.display().to_string()).collect();
        let why = format!(
            "CRI-O runs this node (found {}): CRI-O maps host ports itself and passes none to CNI (cri-o/cri-o#7217), so {} would never be asked to map a port",
            found.join(", "),
            chain::PLUGIN_TYPE
        );
        if !install.force {
            eprintln!("ebpf-portmap: {why}; nothing changed (--force chains it anyway)");
            emit_refusal(out, &found);
            return Ok(ExitCode::FAILURE);
        }
        eprintln!("ebpf-portmap: warning: {why}; chaining it anyway (--force)");
    }
    let entry = chain::plugin_entry(args.entry.as_deref()).context("--entry")?;
    let installed = chain::install(&args.dir.net_dir, &args.dir.selection(), &entry)?;
    let plan = &installed.plan;
    let mut document = json!({
        "file": plan.target,
        "source": plan.source,
        "changed": !plan.is_unchanged(),
        "position": plan.chained.position() + 1,
        "plugins": plan.chained.plugin_count(),
        "backup": installed.backup,
    });
    if plan.is_unchanged() {
        let line = format!(
            "{}: {} already chained",
            plan.target.display(),
            chain::PLUGIN_TYPE
        );
        emit(out, &[line], document);
        return Ok(ExitCode::SUCCESS);
    }
    if let Placement::Replaced { replaced, .. } = &plan.chained.placement {
        document["replaced"] = json!(replaced);
    }
    document["carried"] = json!(plan.chained.carried);
    document["dropped"] = json!(
        plan.chained
            .dropped
            .iter()
            .map(|(key, why)| json!({"key": key, "why": why}))
            .collect::<Vec<_>>()
    );
    let position = position(plan);
    let mut line = format!(
        "{}: chained {} as plugin {position}",
        plan.target.display(),
        chain::PLUGIN_TYPE
    );
    if plan.target != plan.source {
        line += &format!(" (converted from {})", file_name(&plan.source));
    }
    if let Some(backup) = &installed.backup {
        line += &format!("; original kept as {}", file_name(backup));
    }
    let mut lines = vec![line];
    if !plan.chained.carried.is_empty() {
        lines.push(format!(
            "  carried over from the replaced entry: {}",
            plan.chained.carried.join(", ")
        ));
    }
    for (key, why) in &plan.chained.dropped {
        lines.push(format!("  left out {key} of the replaced entry: {why}"));
    }
    emit(out, &lines, document);
    Ok(ExitCode::SUCCESS)
}

/// The JSON answer of an install refused on a CRI-O node (text output has
/// only the message on stderr).
fn emit_refusal(out: &OutputArgs, found: &[String]) {
    if out.json() {
        print_json(&json!({"changed": false, "refused": "cri-o", "crio": found}));
    }
}

fn position(plan: &chain::Plan) -> String {
    let count = plan.chained.plugin_count();
    match &plan.chained.placement {
        Placement::Replaced { index, replaced } => {
            format!("{} of {count}, in place of {replaced}", index + 1)
        }
        Placement::Appended { index } => format!("{} of {count}, appended", index + 1),
    }
}

fn remove(args: &DirArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    let selection = args.selection();
    let net_dir = selection.dir(&args.net_dir);
    let removed = chain::remove(&args.net_dir, &selection)?;
    let mut lines = Vec::new();
    for (original, converted) in &removed.restored {
        lines.push(match converted {
            Some(converted) => format!(
                "{}: restored, {} removed",
                original.display(),
                file_name(converted)
            ),
            None => format!("{}: restored", original.display()),
        });
    }
    for backup in &removed.stale {
        lines.push(format!(
            "{}: dropped, the file it was taken from no longer names {}",
            backup.display(),
            chain::PLUGIN_TYPE
        ));
    }
    for file in &removed.foreign {
        eprintln!(
            "ebpf-portmap: warning: {} names {} but was not chained by `chain install`; left as it is",
            file.display(),
            chain::PLUGIN_TYPE
        );
    }
    if removed.restored.is_empty() && removed.stale.is_empty() {
        lines.push(format!("{}: nothing to restore", net_dir.display()));
    }
    let restored: Vec<Value> = removed
        .restored
        .iter()
        .map(|(original, converted)| json!({"file": original, "removed": converted}))
        .collect();
    emit(
        out,
        &lines,
        json!({"restored": restored, "droppedBackups": removed.stale, "foreign": removed.foreign}),
    );
    Ok(ExitCode::SUCCESS)
}

fn check(args: &EntryArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    let entry = chain::plugin_entry(args.entry.as_deref()).context("--entry")?;
    let plan = chain::plan(&args.dir.net_dir, &args.dir.selection(), &entry)?;
    let chained = plan.is_unchanged();
    let line = if chained {
        format!("{}: {} chained", plan.target.display(), chain::PLUGIN_TYPE)
    } else {
        format!(
            "{}: not chained as `chain install` would leave it",
            plan.source.display()
        )
    };
    emit(
        out,
        &[line],
        json!({"file": plan.source, "chained": chained}),
    );
    Ok(if chained {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy()
        .into_owned()
}
