//! `ebpf-portmap completions SHELL`: the shell completion script, generated
//! from the same clap definition the binary parses with, so it never lags
//! behind a verb or a flag.

use std::{io::Write, process::ExitCode};

use clap_complete::Shell;

/// Print a shell completion script.
#[derive(clap::Args)]
#[command(after_help = "Install:
  ebpf-portmap completions bash > /etc/bash_completion.d/ebpf-portmap
  ebpf-portmap completions zsh  > /usr/local/share/zsh/site-functions/_ebpf-portmap
  ebpf-portmap completions fish > /etc/fish/completions/ebpf-portmap.fish")]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

pub fn run(args: &CompletionsArgs, mut command: clap::Command) -> anyhow::Result<ExitCode> {
    let name = command.get_name().to_owned();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, name, &mut script);
    std::io::stdout().lock().write_all(&script)?;
    Ok(ExitCode::SUCCESS)
}
