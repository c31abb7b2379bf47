//! `cargo xtask demo`: one container published through a real CNI chain
//! (bridge + host-local + the port-mapping plugin), reached from an external
//! client over IPv4 and IPv6, then torn down. Runs against `ebpf-portmap` by
//! default, or the upstream iptables plugin with `--plugin portmap`.
//!
//! Everything happens inside private network namespaces; everything is
//! removed on exit, also on failure or Ctrl-C. Exits 0 only if every check
//! passed. Needs root.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use portmap_tests::cni::result_addresses;
use portmap_tests::plugins::PLUGIN_TYPE;
use portmap_tests::topology::{EXT_IP4, EXT_IP6, FAR_IP4, NODE_IP4, NODE_IP6};
use portmap_tests::traffic::{echo_reply, http_get, http_server, udp_echo_server, udp_request};
use portmap_tests::{
    CniRunner, Node, PinRoot, PortMapping, bridge_conflist, plugin_bin, plugin_dirs,
};

/// Long enough for a working path, short enough to keep the demo snappy.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait for an answer that must no longer come.
const GONE_TIMEOUT: Duration = Duration::from_secs(1);

const CONTAINER_ID: &str = "demo-1";
const HOST_HTTP_PORT: u16 = 8080;
const CONTAINER_HTTP_PORT: u16 = 80;
const HOST_UDP_PORT: u16 = 5353;
const CONTAINER_UDP_PORT: u16 = 53;
const STEPS: usize = 8;

#[derive(Debug, Parser)]
#[command(
    about = "Publish a container port through bridge + host-local + a port-mapping plugin, and prove it works"
)]
struct Args {
    /// The port-mapping plugin to chain: `ebpf-portmap` (ours, from
    /// $EBPF_PORTMAP_BIN) or `portmap` (upstream, iptables).
    #[arg(long, default_value = PLUGIN_TYPE)]
    plugin: String,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Ctrl-C / SIGTERM only set a flag: the demo stops at the next step and the
/// destructors remove what it created (a killed process could not).
fn install_signal_handlers() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, handler as libc::sighandler_t) };
    }
}

#[derive(Debug, Default)]
struct Tally {
    passed: usize,
    failed: usize,
}

impl Tally {
    fn pass(&mut self, what: &str) {
        self.passed += 1;
        println!("  ok    {what}");
    }

    fn fail(&mut self, what: &str) {
        self.failed += 1;
        let mut lines = what.lines();
        println!("  FAIL  {}", lines.next().unwrap_or_default());
        for line in lines {
            println!("        {line}");
        }
    }
}

fn step(number: usize, title: &str) -> anyhow::Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    println!("\n[{number}/{STEPS}] {title}");
    Ok(())
}

fn note(text: &str) {
    for line in text.lines() {
        println!("        {line}");
    }
}

fn ms(elapsed: Duration) -> String {
    format!("{} ms", elapsed.as_millis())
}

fn main() -> ExitCode {
    install_signal_handlers();
    let args = Args::parse();
    let mut tally = Tally::default();
    println!("demo: publishing a container port with `{}`", args.plugin);
    if args.plugin == PLUGIN_TYPE {
        println!("demo: plugin binary {}", plugin_bin().display());
    }

    // Everything the demo creates lives inside `run`, so it is dropped (and
    // removed) before the summary, whether `run` returns or panics.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&args, &mut tally)));
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tally.fail(&format!("demo stopped early: {e:#}")),
        Err(_) => tally.fail("demo stopped early: a setup step panicked (message above)"),
    }
    println!("\ndemo: removed the demo's namespaces, pins and temp dirs");
    println!("demo: {} passed, {} failed", tally.passed, tally.failed);
    if tally.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run(args: &Args, tally: &mut Tally) -> anyhow::Result<()> {
    step(
        1,
        "Building the test world (network namespaces only; the root namespace is not touched)",
    )?;
    let started = Instant::now();
    let world = Node::new();
    note(&format!(
        "node  {}: eth0 {NODE_IP4}/24 + {NODE_IP6}/64 (uplink), eth1 to far, forwarding on\n\
         ext   {}: {EXT_IP4}, {EXT_IP6} (external client, routes via the node)\n\
         far   {}: {FAR_IP4} (a host behind the node)",
        world.ns.name(),
        world.ext.name(),
        world.far.name()
    ));
    tally.pass(&format!("world ready in {}", ms(started.elapsed())));

    step(
        2,
        &format!(
            "Container {CONTAINER_ID}: HTTP on :{CONTAINER_HTTP_PORT}, UDP echo on :{CONTAINER_UDP_PORT}"
        ),
    )?;
    let container = world.add_container(CONTAINER_ID);
    let body = format!("hello from container {CONTAINER_ID}");
    let _http = http_server(&container.ns, CONTAINER_HTTP_PORT, &body);
    let _udp = udp_echo_server(&container.ns, CONTAINER_UDP_PORT, CONTAINER_ID);
    note(&format!(
        "netns {} (no interface yet: the bridge plugin makes eth0)",
        container.ns.name()
    ));
    tally.pass("servers listening");

    step(
        3,
        &format!(
            "CNI ADD: bridge + host-local + {} with portMappings {HOST_HTTP_PORT}->{CONTAINER_HTTP_PORT}/tcp, {HOST_UDP_PORT}->{CONTAINER_UDP_PORT}/udp",
            args.plugin
        ),
    )?;
    let pin_root = (args.plugin == PLUGIN_TYPE).then(PinRoot::new);
    let plugins = plugin_dirs();
    let runner = CniRunner::new(plugins.paths(), &world.ns);
    let list = bridge_conflist(
        "demo",
        &args.plugin,
        pin_root.as_ref().map(PinRoot::path),
        world.data_dir(),
    );
    if let Some(pin_root) = &pin_root {
        note(&format!("pinRoot {}", pin_root.path().display()));
    }
    let rt = container.with_port_mappings(&[
        PortMapping::tcp(HOST_HTTP_PORT, CONTAINER_HTTP_PORT),
        PortMapping::udp(HOST_UDP_PORT, CONTAINER_UDP_PORT),
    ]);
    let started = Instant::now();
    let result = runner.add(&list, &rt).context("CNI ADD failed")?;
    let elapsed = started.elapsed();
    let ips: Vec<String> = result_addresses(&result)
        .iter()
        .map(ToString::to_string)
        .collect();
    note(&format!("container addresses: {}", ips.join(", ")));
    for call in runner.calls() {
        note(&format!(
            "{} {} took {}",
            call.plugin,
            call.command,
            ms(call.elapsed)
        ));
    }
    tally.pass(&format!("ADD succeeded in {}", ms(elapsed)));

    step(4, "Installed mappings")?;
    show_mappings(&args.plugin, &world, pin_root.as_ref());

    let v4 = SocketAddr::new(IpAddr::V4(NODE_IP4), HOST_HTTP_PORT);
    let v6 = SocketAddr::new(IpAddr::V6(NODE_IP6), HOST_HTTP_PORT);
    for (number, addr) in [(5, v4), (6, v6)] {
        step(number, &format!("GET http://{addr}/ from ext"))?;
        let started = Instant::now();
        match http_get(&world.ext, addr, PROBE_TIMEOUT) {
            Ok(page) if page.status == 200 && page.body == body => tally.pass(&format!(
                "{} {:?} in {}",
                page.status,
                page.body,
                ms(started.elapsed())
            )),
            Ok(page) => tally.fail(&format!("unexpected page: {} {:?}", page.status, page.body)),
            Err(e) => tally.fail(&e.to_string()),
        }
    }

    let udp_addr = SocketAddr::new(IpAddr::V4(NODE_IP4), HOST_UDP_PORT);
    step(7, &format!("UDP datagram to {udp_addr} from ext"))?;
    let expected = echo_reply(CONTAINER_ID, "hello over udp");
    match udp_request(&world.ext, udp_addr, "hello over udp", PROBE_TIMEOUT) {
        Ok(answer) if answer == expected => tally.pass(&format!("answer {answer:?}")),
        Ok(answer) => tally.fail(&format!(
            "unexpected answer {answer:?}, wanted {expected:?}"
        )),
        Err(e) => tally.fail(&e.to_string()),
    }

    step(8, &format!("CNI DEL, then GET http://{v4}/ again"))?;
    let started = Instant::now();
    match runner.del(&list, &rt) {
        Ok(()) => tally.pass(&format!("DEL succeeded in {}", ms(started.elapsed()))),
        Err(e) => tally.fail(&format!("DEL failed: {e}")),
    }
    match http_get(&world.ext, v4, GONE_TIMEOUT) {
        Err(e) if e.is_unreachable() => tally.pass(&format!("no longer reachable: {e}")),
        Err(e) => tally.fail(&format!("unexpected error after DEL: {e}")),
        Ok(page) => tally.fail(&format!(
            "still reachable after DEL: {} {:?}",
            page.status, page.body
        )),
    }
    Ok(())
}

/// Prints what the plugin installed. Informational only: never a check.
fn show_mappings(plugin: &str, world: &Node, pin_root: Option<&PinRoot>) {
    if plugin == PLUGIN_TYPE {
        let mut command = world.ns.command(plugin_bin());
        command.arg("list");
        if let Some(pin_root) = pin_root {
            command.arg("--pin-root").arg(pin_root.path());
        }
        match command.output() {
            Ok(out) if out.status.success() => note(&String::from_utf8_lossy(&out.stdout)),
            Ok(out) => note(&format!(
                "(`ebpf-portmap list` failed with {}: {}; skipping)",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => note(&format!(
                "(could not run `ebpf-portmap list`: {e}; skipping)"
            )),
        }
        if let Some(pin_root) = pin_root {
            let pins: Vec<String> = pin_root
                .pins()
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            note(&format!(
                "pins under {}: {}",
                pin_root.path().display(),
                pins.join(", ")
            ));
        }
    } else if plugin == "portmap" {
        // The upstream plugin's state is iptables rules in the node namespace.
        for tool in ["iptables", "ip6tables"] {
            match world.ns.command(tool).args(["-t", "nat", "-S"]).output() {
                Ok(out) => {
                    let text = String::from_utf8_lossy(&out.stdout);
                    let rules: Vec<&str> = text
                        .lines()
                        .filter(|l| l.contains("DNAT") && l.starts_with("-A"))
                        .collect();
                    note(&format!(
                        "{tool} -t nat (DNAT rules):\n  {}",
                        rules.join("\n  ")
                    ));
                }
                Err(e) => note(&format!("(could not run {tool}: {e})")),
            }
        }
    } else {
        note("(no way to show mappings for this plugin)");
    }
}
