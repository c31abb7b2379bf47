//! `ebpf-portmap`: a CNI plugin when `CNI_COMMAND` is set, the operator CLI
//! otherwise.

use std::{
    io::{Cursor, Read},
    process::ExitCode,
};

use clap::{CommandFactory, Parser, Subcommand};
use portmap_user::{
    cni,
    cni::netconf,
    logging,
    verbs::{Dataplane, logged::Logged, recorded},
};

mod cli;

/// dlmalloc instead of the C library's allocator. The plugin ships as a
/// static musl binary (fast to start), and musl's allocator gives freed
/// pages back at once: an ADD made about 50 `mmap` and 45 `munmap` calls,
/// a quarter of its CPU time. dlmalloc keeps them until the process exits.
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

#[derive(Parser)]
#[command(
    name = "ebpf-portmap",
    version,
    about = "eBPF hostPort mapping for CNI",
    long_about = "eBPF hostPort mapping for CNI.\n\nRun by a container runtime (CNI_COMMAND set), this is the CNI plugin; \
run by a person, these commands show and manage the dataplane on this node. \
They take --pin-root, the plugin's `pinRoot` (default $EPM_PIN_ROOT, else /sys/fs/bpf/ebpf-portmap), \
and -o table|wide|json. \
`chain` puts the plugin into the node's CNI configuration (what the Kubernetes installer runs).\n\n\
Exit codes (every verb): 0 done or healthy; 1 a problem found or left (degraded, not chained, refused); \
2 usage; 3 cannot inspect (no permission, no bpffs at the pin root, the pin root of another network namespace).",
    after_help = "Examples:
  ebpf-portmap list                    every published port, its container and traffic
  ebpf-portmap status                  is the dataplane healthy? (exit 1 if not)
  ebpf-portmap trace --port 8080       watch what happens to traffic for port 8080
  ebpf-portmap chain install           chain the plugin into /etc/cni/net.d
  ebpf-portmap version                 this build, its eBPF object and the kernel's features
  ebpf-portmap help <command>          more about one command"
)]
struct Args {
    /// Also log what the command does (to stderr).
    #[arg(long, short, global = true)]
    verbose: bool,
    #[command(flatten)]
    output: cli::output::OutputArgs,
    #[command(subcommand)]
    command: Verb,
}

#[derive(Subcommand)]
enum Verb {
    List(cli::list::ListArgs),
    Status(cli::status::StatusArgs),
    Trace(cli::trace::TraceArgs),
    Gc(cli::gc::GcArgs),
    Uninstall(cli::uninstall::UninstallArgs),
    Reconcile(cli::reconcile::ReconcileArgs),
    Chain(cli::chain::ChainArgs),
    Version(cli::version::VersionArgs),
    Completions(cli::completions::CompletionsArgs),
    Man(cli::man::ManArgs),
}

/// The CNI plugin. Stdin is read before anything else: the log file is part
/// of the configuration, and even a request that fails to parse is logged.
fn run_plugin() -> ExitCode {
    // One run, then exit: unmapping the port filter and the verb record
    // on the way would cost TLB-flush IPIs that exit does not.
    portmap_user::dataplane::maps::leave_mappings_to_exit();
    let mut stdin = std::io::stdin().lock();
    let mut head = Vec::new();
    // A read error is met again, and reported, by `cni::run` reading the rest.
    let _ = (&mut stdin)
        .take(cni::MAX_STDIN_BYTES as u64 + 1)
        .read_to_end(&mut head);
    logging::init_plugin(&netconf::log_file_of(&head));
    let started = std::time::Instant::now();
    let mut input = Cursor::new(&head[..]).chain(stdin);
    let env = |name: &str| std::env::var(name).ok();
    let outcome = cni::run_for_outcome(
        &env,
        &mut input,
        &mut std::io::stdout().lock(),
        &mut Logged(Dataplane),
    );
    recorded::record(&outcome, started.elapsed(), || netconf::pin_root_of(&head));
    ExitCode::from(outcome.exit as u8)
}

fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        return run_plugin();
    }
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) => return cli::usage_error(&error),
    };
    logging::init_cli(args.verbose);
    let out = &args.output;
    let result = match &args.command {
        Verb::List(list) => cli::list::run(list, out),
        Verb::Status(status) => cli::status::run(status, out),
        Verb::Trace(trace) => cli::trace::run(trace, out),
        Verb::Gc(gc) => cli::gc::run(gc, out),
        Verb::Uninstall(uninstall) => cli::uninstall::run(uninstall, out),
        Verb::Reconcile(reconcile) => cli::reconcile::run(reconcile, out),
        Verb::Chain(chain) => cli::chain::run(chain, out),
        Verb::Version(version) => cli::version::run(version, out),
        Verb::Completions(completions) => cli::completions::run(completions, Args::command()),
        Verb::Man(man) => cli::man::run(man, Args::command()),
    };
    match result {
        Ok(code) => code,
        Err(error) => cli::failed(&error, out),
    }
}
