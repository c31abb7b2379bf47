//! `ebpf-portmap`: a CNI plugin when `CNI_COMMAND` is set, the operator CLI
//! otherwise.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use portmap_user::{cni, plugin::Dataplane};

mod cli;

#[derive(Parser)]
#[command(
    name = "ebpf-portmap",
    version,
    about = "eBPF hostPort mapping for CNI"
)]
struct Args {
    #[command(subcommand)]
    command: Verb,
}

#[derive(Subcommand)]
enum Verb {
    /// List every port mapping on the node.
    ///
    /// Example: ebpf-portmap list --json
    List(cli::list::ListArgs),
}

fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        let env = |name: &str| std::env::var(name).ok();
        let code = cni::run(
            &env,
            &mut std::io::stdin().lock(),
            &mut std::io::stdout().lock(),
            &mut Dataplane,
        );
        return ExitCode::from(code as u8);
    }
    let args = Args::parse();
    let result = match args.command {
        Verb::List(list) => cli::list::run(&list),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ebpf-portmap: {error:#}");
            ExitCode::FAILURE
        }
    }
}
