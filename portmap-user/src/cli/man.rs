//! `ebpf-portmap man`: roff man pages generated from the clap definition,
//! one for the binary and one per verb (`ebpf-portmap-list(1)`, ...), the
//! way git and cargo name theirs.

use std::{fs, io::Write, path::PathBuf, process::ExitCode};

use anyhow::{Context, bail};

/// Print a man page, or write all of them to a directory.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ebpf-portmap man | man -l -              read the main page
  ebpf-portmap man list | man -l -         read the page of `list`
  ebpf-portmap man --out-dir /usr/local/share/man/man1")]
pub struct ManArgs {
    /// The verb whose page to print (default: the binary's own page).
    #[arg(value_name = "VERB", conflicts_with = "out_dir")]
    verb: Option<String>,
    /// Write every page (`ebpf-portmap.1` and `ebpf-portmap-VERB.1`) into this
    /// directory instead of printing one.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

pub fn run(args: &ManArgs, command: clap::Command) -> anyhow::Result<ExitCode> {
    if let Some(dir) = &args.out_dir {
        for (file, page) in pages(&command)? {
            let path = dir.join(&file);
            fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
            println!("{}", path.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let page = match &args.verb {
        None => render(&command)?,
        Some(verb) => {
            let Some(sub) = command.find_subcommand(verb) else {
                let verbs: Vec<&str> = visible_verbs(&command)
                    .map(clap::Command::get_name)
                    .collect();
                bail!("no verb {verb:?}; the verbs are: {}", verbs.join(", "));
            };
            render(&verb_command(&command, sub))?
        }
    };
    std::io::stdout().lock().write_all(&page)?;
    Ok(ExitCode::SUCCESS)
}

/// Every page as (file name, roff): the binary's, then one per visible verb.
pub fn pages(command: &clap::Command) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut pages = vec![(page_file(command.get_name()), render(command)?)];
    for sub in visible_verbs(command) {
        let verb = verb_command(command, sub);
        pages.push((page_file(verb.get_name()), render(&verb)?));
    }
    Ok(pages)
}

fn visible_verbs(command: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    command
        .get_subcommands()
        .filter(|sub| !sub.is_hide_set() && sub.get_name() != "help")
}

/// A verb's page is named `ebpf-portmap-VERB` and shows `ebpf-portmap VERB`
/// in its synopsis.
fn verb_command(parent: &clap::Command, verb: &clap::Command) -> clap::Command {
    let name = format!("{}-{}", parent.get_name(), verb.get_name());
    let bin_name = format!("{} {}", parent.get_name(), verb.get_name());
    verb.clone().name(name).bin_name(bin_name)
}

fn page_file(name: &str) -> String {
    format!("{name}.1")
}

fn render(command: &clap::Command) -> anyhow::Result<Vec<u8>> {
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone())
        .source(concat!("ebpf-portmap ", env!("CARGO_PKG_VERSION")))
        .manual("ebpf-portmap manual")
        .render(&mut page)
        .context("rendering the man page")?;
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> clap::Command {
        clap::Command::new("ebpf-portmap")
            .about("eBPF hostPort mapping for CNI")
            .subcommand(clap::Command::new("list").about("Every published port"))
            .subcommand(clap::Command::new("hidden").hide(true))
    }

    #[test]
    fn one_page_for_the_binary_and_one_per_visible_verb() {
        let pages = pages(&sample()).expect("pages render");
        let names: Vec<&str> = pages.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["ebpf-portmap.1", "ebpf-portmap-list.1"]);
        let list = String::from_utf8(pages[1].1.clone()).expect("roff is UTF-8");
        assert!(
            list.contains(".TH ebpf-portmap-list 1 ") && list.contains(env!("CARGO_PKG_VERSION")),
            "the verb page has its own title: {list}"
        );
        assert!(
            list.contains("ebpf\\-portmap list"),
            "the synopsis shows the command as typed: {list}"
        );
    }
}
