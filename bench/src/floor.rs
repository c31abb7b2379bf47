//! The floor under the "what the programs cost traffic they do not
//! translate" rows: programs that do nothing (bench/floor), attached
//! where ebpf-portmap's are. A hook costs a packet or a `connect()`
//! something before any program decides anything (the kernel's dispatch,
//! the call, the return); measured with these, that part is told apart
//! from what ebpf-portmap's own code costs.

use std::fs::File;
use std::path::Path;

use aya::Ebpf;
use aya::programs::{CgroupAttachMode, CgroupSockAddr, SchedClassifier, TcAttachType};
use portmap_tests::netns::NsHandle;

/// The floor programs' object, built by build.rs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/floor"));

/// One tc hook: an interface and a direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    pub interface: String,
    pub ingress: bool,
}

impl Hook {
    fn attach_type(&self) -> TcAttachType {
        if self.ingress {
            TcAttachType::Ingress
        } else {
            TcAttachType::Egress
        }
    }
}

/// A pod's bridge port (the host end of its veth), which carries
/// ebpf-portmap's ingress program: each world's pods have veths of their
/// own names, so a hook there is named by its role and found again in
/// the world the floor goes to.
pub const POD_PORT: &str = "<every pod's bridge port>";

/// The tc hooks in `ns` that run one of ebpf-portmap's programs (whose
/// names start with `portmap_`), found by asking the kernel; a bridge
/// port's as [`POD_PORT`].
pub fn hooks_of_ebpf_portmap(ns: &NsHandle) -> Result<Vec<Hook>, String> {
    let interfaces = interfaces(ns)?;
    ns.run(|| {
        let mut hooks = Vec::new();
        for (interface, port) in interfaces {
            for ingress in [true, false] {
                let hook = Hook {
                    interface: interface.clone(),
                    ingress,
                };
                // An interface without tcx (or gone since the dump) has
                // none of ours.
                let Ok((_, programs)) = SchedClassifier::query_tcx(&interface, hook.attach_type())
                else {
                    continue;
                };
                if programs
                    .iter()
                    .any(|p| p.name_as_str().is_some_and(|n| n.starts_with("portmap_")))
                {
                    hooks.push(match port {
                        true => Hook {
                            interface: POD_PORT.into(),
                            ..hook
                        },
                        false => hook,
                    });
                }
            }
        }
        Ok(hooks)
    })
}

/// The interface names of `ns`, each with whether it is a port of a
/// bridge or bond, as the harness lists them elsewhere (`ip -j link show`;
/// not /sys/class/net, which shows the namespace that mounted it).
fn interfaces(ns: &NsHandle) -> Result<Vec<(String, bool)>, String> {
    let shown: serde_json::Value = serde_json::from_str(&ns.exec("ip", &["-j", "link", "show"]))
        .map_err(|e| format!("ip -j link show: {e}"))?;
    Ok(shown
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|link| {
            let name = link["ifname"].as_str()?.to_owned();
            Some((name, link.get("master").is_some()))
        })
        .collect())
}

/// The floor tc program on a set of hooks, attached while this lives (the
/// links go with the object).
pub struct TcFloor {
    ebpf: Ebpf,
}

impl TcFloor {
    /// Attaches the floor program at each of `hooks` in `ns`, the way
    /// ebpf-portmap attaches its own (tcx where the kernel has it).
    pub fn attach(ns: &NsHandle, hooks: &[Hook]) -> Result<TcFloor, String> {
        // [`POD_PORT`]: every port of this world's bridge.
        let ports: Vec<String> = interfaces(ns)?
            .into_iter()
            .filter_map(|(name, port)| port.then_some(name))
            .collect();
        let hooks: Vec<Hook> = hooks
            .iter()
            .flat_map(|hook| match hook.interface == POD_PORT {
                true => ports
                    .iter()
                    .map(|port| Hook {
                        interface: port.clone(),
                        ingress: hook.ingress,
                    })
                    .collect(),
                false => vec![hook.clone()],
            })
            .collect();
        // One pod's port per world now, but never a hook twice.
        let mut hooks = hooks;
        hooks.sort_by(|a, b| (&a.interface, a.ingress).cmp(&(&b.interface, b.ingress)));
        hooks.dedup();
        ns.run(|| {
            let mut ebpf =
                Ebpf::load(OBJECT).map_err(|e| format!("loading the floor object: {e}"))?;
            let program: &mut SchedClassifier = ebpf
                .program_mut("floor_tc")
                .ok_or("the floor object has no floor_tc")?
                .try_into()
                .map_err(|e| format!("floor_tc: {e}"))?;
            program
                .load()
                .map_err(|e| format!("loading floor_tc: {e}"))?;
            for hook in &hooks {
                program
                    .attach(&hook.interface, hook.attach_type())
                    .map_err(|e| format!("attaching floor_tc to {hook:?}: {e}"))?;
            }
            Ok(TcFloor { ebpf })
        })
    }

    /// The kernel's id of the floor tc program (for its run statistics).
    pub fn program_id(&self) -> Option<u32> {
        program_id(&self.ebpf, "floor_tc")
    }
}

/// The floor connect4 program on a cgroup, attached while this lives.
pub struct CgroupFloor {
    ebpf: Ebpf,
}

impl CgroupFloor {
    /// Attaches the floor connect4 program to `cgroup`, in the mode
    /// ebpf-portmap attaches its socket hooks.
    pub fn attach(cgroup: &Path) -> Result<CgroupFloor, String> {
        let file =
            File::open(cgroup).map_err(|e| format!("opening cgroup {}: {e}", cgroup.display()))?;
        let mut ebpf = Ebpf::load(OBJECT).map_err(|e| format!("loading the floor object: {e}"))?;
        let program: &mut CgroupSockAddr = ebpf
            .program_mut("floor_connect4")
            .ok_or("the floor object has no floor_connect4")?
            .try_into()
            .map_err(|e| format!("floor_connect4: {e}"))?;
        program
            .load()
            .map_err(|e| format!("loading floor_connect4: {e}"))?;
        program
            .attach(&file, CgroupAttachMode::Single)
            .map_err(|e| format!("attaching floor_connect4 to {}: {e}", cgroup.display()))?;
        Ok(CgroupFloor { ebpf })
    }

    /// The kernel's id of the floor connect4 program.
    pub fn program_id(&self) -> Option<u32> {
        program_id(&self.ebpf, "floor_connect4")
    }
}

fn program_id(ebpf: &Ebpf, name: &str) -> Option<u32> {
    Some(ebpf.program(name)?.info().ok()?.id())
}
