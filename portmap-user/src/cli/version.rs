//! `ebpf-portmap version`: what this binary is (version, the build ID of the
//! embedded eBPF object, which names its pinned programs) and what the
//! node's kernel offers it, for bug reports and version-skew checks.

use std::process::ExitCode;

use portmap_user::{
    ops::features,
    ops::inspect::kernel_release,
    ops::kfunc::Kfuncs,
    ops::object,
    ops::pin::PinLayout,
    ops::privilege,
    ops::scope::{self, Access},
    ops::sizing::{self, InForce, NodeShape},
};
use serde_json::json;

use super::{
    PinRootArg,
    output::{OutputArgs, print, print_json},
};

/// Print the version, the eBPF object's build ID, the kernel's features,
/// the map sizes in force under the pin root (and why), their kernel
/// memory, and the default conntrack size the node formula gives here.
///
/// The build ID is the one `status` shows for pinned programs: when it
/// differs from the pinned one, the next ADD replaces the programs in place.
/// Each feature the tc programs need is asked of the running kernel (`yes`,
/// `no`, or `unknown` without the privilege to ask).
#[derive(clap::Args)]
pub struct VersionArgs {
    /// For the attach mode recorded there.
    #[command(flatten)]
    pin: PinRootArg,
}

fn answer(supported: Option<bool>) -> &'static str {
    match supported {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    }
}

pub fn run(args: &VersionArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    // Not installed, or no bpffs: nothing recorded there, the rest still holds.
    let layout = scope::resolve(&args.pin.pin_root, Access::Read)
        .unwrap_or_else(|_| PinLayout::new(&args.pin.pin_root));
    let build = format!("{:016x}", object::build_id());
    let kernel = kernel_release();
    let mode = features::recorded_attach_mode(&layout)
        .map(portmap_user::ops::features::AttachMode::as_str);
    let fast_path = portmap_user::ops::inspect::fast_path(&layout);
    // Whether this kernel has the conntrack kfuncs in vmlinux BTF, as a
    // load would link them (no program is loaded to tell).
    let linked = portmap_user::ops::object::linked_for_this_kernel(
        false,
        portmap_user::ops::kfunc::Groups::All,
    )
    .ok();
    let kfuncs = linked.as_ref().map(|linked| linked.kfuncs);
    let nat_kfuncs = linked.as_ref().map(|linked| linked.nat);
    let nat_hooks = portmap_user::ops::nft_tables::nat_hooked();
    let modules = linked.map(|linked| linked.modules).unwrap_or_default();
    // What the fallback without them reads: anything hooked at FORWARD in
    // this network namespace (`None`: nfnetlink_hook cannot tell).
    let forward_hooks = portmap_user::ops::forward_hooks::count();
    let kfuncs_text = match kfuncs {
        Some(Kfuncs::Linked) if modules.is_empty() => {
            "yes (bpf_skb_ct_lookup, bpf_ct_change_timeout, bpf_ct_release in vmlinux BTF)"
                .to_owned()
        }
        Some(Kfuncs::Linked) => format!(
            "yes (bpf_skb_ct_lookup, bpf_ct_change_timeout, bpf_ct_release, in the BTF of module {})",
            modules.join(", ")
        ),
        Some(Kfuncs::Missing(name)) => {
            format!("no: {name} is neither in vmlinux BTF nor in a loaded nf_conntrack module's")
        }
        Some(Kfuncs::NoBtf) => "no: the kernel has no BTF".to_owned(),
        // Linking never says so: only a load that the verifier refused.
        Some(Kfuncs::Refused) => "no: the kernel's verifier refused the calls".to_owned(),
        None => "unknown: the eBPF object could not be read".to_owned(),
    };
    let nat_kfuncs_text = match nat_kfuncs {
        Some(Kfuncs::Linked) => {
            "yes (bpf_skb_ct_alloc, bpf_ct_set_nat_info, bpf_ct_insert_entry)".to_owned()
        }
        Some(Kfuncs::Missing(name)) => format!(
            "no: {name} is neither in vmlinux BTF nor in a loaded module's (nf_conntrack, nf_nat: nf_nat loads with the first nat chain or table)"
        ),
        Some(Kfuncs::NoBtf) => "no: the kernel has no BTF".to_owned(),
        Some(Kfuncs::Refused) => "no: the kernel's verifier refused the calls".to_owned(),
        None => "unknown: the eBPF object could not be read".to_owned(),
    };
    let yes = |hooked: bool| if hooked { "yes" } else { "no" };
    let nat_hooks_text = match &nat_hooks {
        Ok([v4, v6]) => format!("IPv4 {}, IPv6 {}", yes(*v4), yes(*v6)),
        Err(error) => format!("cannot tell (nf_tables: {error})"),
    };
    let probed: Vec<(&str, &str, &str)> = features::ESSENTIAL
        .iter()
        .map(|feature| {
            (
                feature.name,
                feature.since,
                answer(features::supported(feature.probe)),
            )
        })
        .collect();
    // Why a feature reads "unknown": asking the kernel is a BPF load,
    // which needs privilege.
    let missing = privilege::missing();
    let unknown_because = (probed.iter().any(|(_, _, answer)| *answer == "unknown")
        && !missing.is_empty())
    .then(|| {
        format!(
            "asking the kernel loads a test program, which needs {}; run `ebpf-portmap version` as root",
            missing.join(" and ")
        )
    });
    let sizes = InForce::read(&layout);
    let node = NodeShape::this();
    let formula = json!({
        "memoryMiB": node.memory_mib(),
        "cpus": node.cpus,
        "conntrack": sizing::conntrack_for(node),
        "conntrackClosed": sizing::closed_for(sizing::conntrack_for(node), node.cpus),
    });
    if out.json() {
        let features: Vec<_> = probed
            .iter()
            .map(|(name, since, supported)| json!({"name": name, "since": since, "supported": supported}))
            .collect();
        let document = json!({
            "version": env!("CARGO_PKG_VERSION"),
            "build": build,
            "ebpfSources": object::EBPF_SOURCES,
            "kernel": kernel,
            "attachMode": mode,
            "conntrackKfuncs": kfuncs_text,
            "natKfuncs": nat_kfuncs_text,
            "natHooked": nat_hooks.as_ref().ok().map(|[v4, v6]| json!({"ipv4": v4, "ipv6": v6})),
            "forwardHooks": forward_hooks.as_ref().ok(),
            "forwardHooksUnknownBecause": forward_hooks.as_ref().err().map(ToString::to_string),
            "fastPath": fast_path.as_ref().map(|report| json!({
                "mode": report.mode.as_str(),
                "why": report.why,
            })),
            "features": features,
            "featuresUnknownBecause": unknown_because,
            "sizes": super::status::sizes_json(&sizes),
            "defaultSizesHere": formula,
        });
        print_json(&document);
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = format!(
        "ebpf-portmap {}\neBPF object build: {build}\neBPF sources: {}\nkernel: {kernel}\nattach mode: {}\nkernel features:\n",
        env!("CARGO_PKG_VERSION"),
        object::EBPF_SOURCES,
        mode.unwrap_or("not recorded yet (the first ADD probes tcx, else clsact)"),
    );
    text.push_str(&format!(
        "conntrack kfuncs (the default fast path): {kfuncs_text}\n"
    ));
    text.push_str(&format!(
        "NAT kfuncs (translation by netfilter): {nat_kfuncs_text}\nnetfilter's NAT hooked in this network namespace: {nat_hooks_text}\n"
    ));
    text.push_str(&match forward_hooks {
        Ok(hooks) => format!("hooked at FORWARD in this network namespace: {hooks}\n"),
        Err(error) => format!("hooked at FORWARD in this network namespace: cannot tell (nfnetlink_hook, Linux 5.14: {error})\n"),
    });
    text.push_str(&match &fast_path {
        Some(report) => format!("fast path: {} ({})\n", report.mode.as_str(), report.why),
        None => "fast path: not set yet (the first ADD sets it)\n".to_owned(),
    });
    for (name, since, supported) in &probed {
        text.push_str(&format!("  {supported:<7} {name} (Linux {since})\n"));
    }
    if let Some(why) = &unknown_because {
        text.push_str(&format!("  (unknown: {why})\n"));
    }
    text.push_str(&format!(
        "default conntrack on this node: {} open TCP and other entries, {} closed (formula: {} MiB, {} CPUs)\n",
        sizing::conntrack_for(node),
        sizing::closed_for(sizing::conntrack_for(node), node.cpus),
        node.memory_mib(),
        node.cpus
    ));
    text.push_str(&super::status::sizes_text(&sizes));
    print(&text);
    Ok(ExitCode::SUCCESS)
}
