//! `ebpf-portmap-agent`: the node agent (see `portmap_user::agent`). A
//! binary of its own, so the plugin, which runtimes start for every ADD and
//! DEL, carries none of the agent's event loop, HTTP server or encoder.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::Parser;
use portmap_user::{
    agent::{self, Settings, worker::Timing},
    ops::conf::ConfSource,
};

#[derive(Parser)]
#[command(
    name = "ebpf-portmap-agent",
    version,
    about = "ebpf-portmap node agent: reconciliation, metrics and health probes",
    long_about = "The ebpf-portmap node agent. Keeps the dataplane of this node right between CNI calls \
(new and re-created interfaces get the programs, node addresses are synced, within a second of the \
rtnetlink event; stale state is collected on a timer) and serves /metrics (Prometheus/OpenMetrics), \
/healthz and /readyz. It reconciles with the plugin's own entry of the node's CNI configuration. \
The plugin works without it. Stops on SIGTERM."
)]
struct Args {
    /// Address to serve /metrics, /healthz and /readyz on. The default,
    /// the node's loopback, is reached by the kubelet's probes and by node
    /// processes (a kube-rbac-proxy in front, for Prometheus), not by pods;
    /// an address pods reach shows them every mapping's pod and addresses.
    #[arg(long, value_name = "ADDR:PORT", env = "EPM_AGENT_LISTEN", default_value = agent::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Also serve series per mapping in /metrics (traffic, flows and socket
    /// translations by host port, pod namespace and name): about ten series
    /// per mapping, so off by default, as kube-proxy and Cilium keep
    /// per-pod series off.
    #[arg(long)]
    metrics_per_mapping: bool,
    /// The CNI configuration file (.conflist or .conf) whose ebpf-portmap
    /// entry to reconcile with; default: the first file of --cni-conf-dir
    /// that names the plugin.
    #[arg(long, value_name = "FILE")]
    cni_conf: Option<PathBuf>,
    /// Directory of the runtime's CNI configuration.
    #[arg(long, value_name = "DIR", default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// Seconds between node GC runs.
    #[arg(long, value_name = "SECONDS", default_value_t = agent::DEFAULT_GC_INTERVAL.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    gc_interval: u64,
    /// Seconds the node GC leaves the mappings of a container whose network
    /// namespace is gone (no DEL came) before it removes them.
    #[arg(long, value_name = "SECONDS", default_value_t = portmap_user::ops::gc::GONE_GRACE_SECS)]
    gone_grace: u64,
    /// At most one log line per datapath problem reason in this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = agent::DEFAULT_RARE_EVENT_INTERVAL.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    rare_event_interval: u64,
    /// What the agent is for: `watch` keeps the dataplane right; `cleanup`
    /// (the DaemonSet's removal mode) also waits until no pod holds a
    /// mapping (each one's mappings go once its network namespace is gone,
    /// see --gone-grace), then uninstalls the dataplane and idles. The
    /// DaemonSet sets it from EPM_ACTION, like the installer's.
    #[arg(long, value_name = "ACTION", env = "EPM_ACTION", default_value = "watch", value_parser = ["watch", "install", "cleanup", "uninstall"])]
    action: String,
    /// Also log debug lines.
    #[arg(long, short)]
    verbose: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    portmap_user::logging::init_agent(args.verbose);
    let settings = Settings {
        conf: match args.cni_conf {
            Some(file) => ConfSource::File(file),
            None => ConfSource::Dir(args.cni_conf_dir),
        },
        listen: args.listen,
        per_mapping_metrics: args.metrics_per_mapping,
        timing: Timing {
            gc_interval: Duration::from_secs(args.gc_interval),
            gone_grace: Duration::from_secs(args.gone_grace),
            rare_event_interval: Duration::from_secs(args.rare_event_interval),
            cleanup: matches!(args.action.as_str(), "cleanup" | "uninstall"),
        },
    };
    match agent::run(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!(
                "ebpf-portmap-agent: {}",
                portmap_user::cni::error::with_sources(&error)
            );
            ExitCode::FAILURE
        }
    }
}
