//! What the running kernel offers: probed, never assumed from its version,
//! and the verdicts that choose a code path kept in the pinned state.
//!
//! - **Attach mode.** tcx links exist from Linux 6.6; older kernels get a
//!   clsact qdisc with a `cls_bpf` filter. The first load under a pin root
//!   probes once and records the answer in `{root}/v1/maps/features`, a
//!   pinned array of `u32` (index [`ATTACH_MODE`]: [`MODE_TCX`] or
//!   [`MODE_CLSACT`]); every later attachment reads it. bpffs lives exactly
//!   as long as the running kernel, so a new kernel is probed anew.
//! - **Conntrack kfuncs.** The load that links the object's kfunc calls
//!   (see [`kfunc`](crate::dataplane::load::kfunc)) records whether the kernel
//!   had them (index [`KFUNCS`]); the fast-path mode every ADD writes to
//!   the node's settings follows from it and `fastPath`
//!   ([`fast_path_flags`]), and `status` explains it ([`FastPathReport`]).
//! - **Essential features.** When the object or a program fails to load,
//!   [`explain_load_failure`] probes what our tc programs need (program
//!   type, map types, helpers) and names the first one missing with the
//!   kernel that introduced it, instead of a bare verifier error.
//!
//! # Minimum kernel version
//! Every essential feature exists since Linux 5.11 (`bpf_ktime_get_coarse_ns`
//! for flow ages; 5.10 for `bpf_redirect_peer`, which the `fastPath` code in
//! the object calls; 5.8 for the ring buffer
//! of `ebpf-portmap trace`; the translation itself needs 4.18 for
//! `bpf_fib_lookup`); tcx since 6.6. Tested in VMs on Debian's 6.1 (clsact) and 6.12 (tcx).

use std::{
    io,
    os::fd::{AsFd as _, AsRawFd as _},
    path::PathBuf,
};

use aya::{
    maps::{Array, MapData, MapType},
    programs::{ProgramType, SchedClassifier, tc::TcError},
    sys::{BpfHelper, is_helper_supported, is_map_supported, is_program_supported},
};

use portmap_common::local::node_flags;

use crate::{
    dataplane::{load::kfunc::Kfuncs, pinned::pin::PinLayout},
    model::FastPathSetting,
};

/// Pinned under `maps/` as `features`, so `uninstall` removes it with the maps.
pub const RECORD: &str = "features";

/// How the tc programs are attached on this node: tcx links (Linux 6.6) or
/// filters on the clsact qdisc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    Tcx,
    Clsact,
}

impl AttachMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachMode::Tcx => "tcx",
            AttachMode::Clsact => "clsact",
        }
    }
}

/// Index of the attach-mode entry in the record.
pub const ATTACH_MODE: u32 = 0;
pub const MODE_TCX: u32 = 1;
pub const MODE_CLSACT: u32 = 2;
/// Index of the kfunc entry in the record: [`KFUNCS_LINKED`],
/// [`KFUNCS_NO_BTF`], [`KFUNCS_REFUSED`], or [`KFUNCS_MISSING`] plus the index of the first
/// missing kfunc in `portmap_common::kfunc::ALL`; 0: no load recorded it.
pub const KFUNCS: u32 = 1;
pub const KFUNCS_LINKED: u32 = 1;
pub const KFUNCS_NO_BTF: u32 = 2;
pub const KFUNCS_REFUSED: u32 = 3;
pub const KFUNCS_MISSING: u32 = 16;
/// Index of the NAT kfuncs' entry (`portmap_common::kfunc::NAT`), valued
/// as [`KFUNCS`]'s.
pub const NAT_KFUNCS: u32 = 2;
/// Entries of the record: room for later verdicts without a layout change.
const RECORD_ENTRIES: u32 = 8;

/// `BPF_LINK_CREATE` and `BPF_TCX_INGRESS` from `include/uapi/linux/bpf.h`.
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_TCX_INGRESS: u32 = 46;
/// The kernel-internal ENOTSUPP that some BPF paths return to userspace.
const ENOTSUPP: i32 = 524;

#[derive(Debug, thiserror::Error)]
pub enum FeatureError {
    #[error(
        "this kernel has neither tcx (Linux 6.6) nor the clsact qdisc (Linux 4.5, CONFIG_NET_SCH_INGRESS, module sch_ingress): no way to attach tc programs to {interface}"
    )]
    NoTcHook {
        interface: String,
        #[source]
        source: TcError,
    },
    #[error("cannot add the clsact qdisc to {interface}")]
    ClsactQdisc {
        interface: String,
        #[source]
        source: TcError,
    },
    #[error("cannot probe whether the kernel has tcx (BPF_LINK_CREATE)")]
    Probe(#[source] io::Error),
    #[error("cannot record the probed features in {path}")]
    Record {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// How to ask the kernel about one feature.
#[derive(Debug, Clone, Copy)]
pub enum Probe {
    Program(ProgramType),
    Map(MapType),
    Helper(BpfHelper),
}

/// Something our tc programs cannot do without.
#[derive(Debug, Clone, Copy)]
pub struct Feature {
    pub name: &'static str,
    /// The first mainline kernel that has it.
    pub since: &'static str,
    pub probe: Probe,
}

/// What the tc programs use, roughly oldest first (the first missing one is
/// reported). Helpers are probed for
/// `BPF_PROG_TYPE_SCHED_CLS`, where our programs call them.
pub const ESSENTIAL: &[Feature] = &[
    Feature {
        name: "hash maps (BPF_MAP_TYPE_HASH)",
        since: "3.19",
        probe: Probe::Map(MapType::Hash),
    },
    Feature {
        name: "tc classifier programs (BPF_PROG_TYPE_SCHED_CLS)",
        since: "4.1",
        probe: Probe::Program(ProgramType::SchedClassifier),
    },
    Feature {
        name: "per-CPU array maps (BPF_MAP_TYPE_PERCPU_ARRAY)",
        since: "4.6",
        probe: Probe::Map(MapType::PerCpuArray),
    },
    Feature {
        name: "LRU hash maps (BPF_MAP_TYPE_LRU_HASH, the conntrack table)",
        since: "4.10",
        probe: Probe::Map(MapType::LruHash),
    },
    Feature {
        name: "the bpf_skb_store_bytes helper",
        since: "4.1",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_skb_store_bytes),
    },
    Feature {
        name: "the bpf_l3_csum_replace helper",
        since: "4.1",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_l3_csum_replace),
    },
    Feature {
        name: "the bpf_l4_csum_replace helper",
        since: "4.1",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_l4_csum_replace),
    },
    Feature {
        name: "the bpf_ktime_get_ns helper",
        since: "4.1",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_ktime_get_ns),
    },
    Feature {
        name: "the bpf_ktime_get_coarse_ns helper (flow ages)",
        since: "5.11",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_ktime_get_coarse_ns),
    },
    Feature {
        name: "the bpf_jiffies64 helper (when to read the clock again)",
        since: "5.5",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_jiffies64),
    },
    Feature {
        name: "the bpf_skb_load_bytes helper",
        since: "4.5",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_skb_load_bytes),
    },
    Feature {
        name: "the bpf_csum_diff helper",
        since: "4.6",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_csum_diff),
    },
    Feature {
        name: "the bpf_fib_lookup helper (tells node-local traffic from transit)",
        since: "4.18",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_fib_lookup),
    },
    Feature {
        name: "per-CPU hash maps (BPF_MAP_TYPE_PERCPU_HASH, the traffic counters)",
        since: "4.6",
        probe: Probe::Map(MapType::PerCpuHash),
    },
    Feature {
        name: "ring buffer maps (BPF_MAP_TYPE_RINGBUF, the trace events)",
        since: "5.8",
        probe: Probe::Map(MapType::RingBuf),
    },
    Feature {
        name: "the bpf_redirect_peer helper (the fastPath hand-over to a container)",
        since: "5.10",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_redirect_peer),
    },
];

/// Asks the running kernel; `None` when the probe itself failed (no
/// privilege, ...), which proves nothing either way.
pub fn supported(probe: Probe) -> Option<bool> {
    match probe {
        Probe::Program(program_type) => is_program_supported(program_type).ok(),
        Probe::Map(map_type) => is_map_supported(map_type).ok(),
        Probe::Helper(helper) => is_helper_supported(ProgramType::SchedClassifier, helper).ok(),
    }
}

/// The first essential feature `supported` says is missing. Unknown
/// answers count as present: only a definite "no" is reported.
pub fn first_missing(supported: impl Fn(Probe) -> Option<bool>) -> Option<&'static Feature> {
    ESSENTIAL
        .iter()
        .find(|feature| supported(feature.probe) == Some(false))
}

/// What `BPF_LINK_CREATE` for tcx with no target interface answers: a
/// kernel with tcx looks the interface up and says ENODEV; one without
/// refuses the attach type (EINVAL, or ENOTSUPP/EOPNOTSUPP). Nothing is
/// attached either way.
pub fn tcx_verdict(errno: Option<i32>) -> Result<bool, io::Error> {
    match errno {
        Some(libc::ENODEV) => Ok(true),
        Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP) => Ok(false),
        Some(other) => Err(io::Error::from_raw_os_error(other)),
        None => Err(io::Error::other(
            "BPF_LINK_CREATE succeeded without an interface",
        )),
    }
}

/// Probes tcx with a loaded tc program (any will do: nothing is attached).
pub fn probe_tcx(program: &SchedClassifier) -> Result<bool, FeatureError> {
    #[repr(C)]
    struct LinkCreate {
        prog_fd: u32,
        target_ifindex: u32,
        attach_type: u32,
        flags: u32,
        /// The rest of `union bpf_attr`'s link_create: zero.
        rest: [u64; 4],
    }
    let fd = program
        .fd()
        .map_err(|e| FeatureError::Probe(io::Error::other(e.to_string())))?;
    let attr = LinkCreate {
        prog_fd: fd.as_fd().as_raw_fd() as u32,
        target_ifindex: 0,
        attach_type: BPF_TCX_INGRESS,
        flags: 0,
        rest: [0; 4],
    };
    // SAFETY: a valid, fully initialised attr of the size passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_CREATE,
            &raw const attr,
            std::mem::size_of::<LinkCreate>(),
        )
    };
    let errno = if rc >= 0 {
        // SAFETY: closing the link fd the kernel just handed us.
        unsafe { libc::close(rc as i32) };
        None
    } else {
        io::Error::last_os_error().raw_os_error()
    };
    tcx_verdict(errno).map_err(FeatureError::Probe)
}

fn mode_from_record(value: u32) -> Option<AttachMode> {
    match value {
        MODE_TCX => Some(AttachMode::Tcx),
        MODE_CLSACT => Some(AttachMode::Clsact),
        _ => None,
    }
}

fn record_value(mode: AttachMode) -> u32 {
    match mode {
        AttachMode::Tcx => MODE_TCX,
        AttachMode::Clsact => MODE_CLSACT,
    }
}

/// Entry `index` of the record pinned under `layout`, if there is one.
fn recorded(layout: &PinLayout, index: u32) -> Option<u32> {
    let data = MapData::from_pin(layout.map(RECORD)).ok()?;
    let record: Array<MapData, u32> = Array::try_from(aya::maps::Map::Array(data)).ok()?;
    record.get(&index, 0).ok()
}

/// The attach mode recorded under `layout`, if a probe recorded one.
pub fn recorded_attach_mode(layout: &PinLayout) -> Option<AttachMode> {
    mode_from_record(recorded(layout, ATTACH_MODE)?)
}

/// The attach mode for `layout`: the recorded verdict, or a fresh probe
/// (with `program`, a loaded tc program) that is then recorded. Called with
/// the pin root's load lock held.
pub fn attach_mode(
    layout: &PinLayout,
    program: &SchedClassifier,
) -> Result<AttachMode, FeatureError> {
    if let Some(mode) = recorded_attach_mode(layout) {
        return Ok(mode);
    }
    let mode = if probe_tcx(program)? {
        AttachMode::Tcx
    } else {
        AttachMode::Clsact
    };
    let path = layout.map(RECORD);
    let record_error = |source: io::Error| FeatureError::Record {
        path: path.clone(),
        source,
    };
    let mut record = Array::<MapData, u32>::create(RECORD_ENTRIES, 0)
        .map_err(|e| record_error(io::Error::other(e.to_string())))?;
    record
        .set(ATTACH_MODE, record_value(mode), 0)
        .map_err(|e| record_error(io::Error::other(e.to_string())))?;
    // A record left by a run that died before using it is replaced.
    let _ = std::fs::remove_file(&path);
    record
        .pin(&path)
        .map_err(|e| record_error(io::Error::other(e.to_string())))?;
    log::info!("kernel probed: attaching through {}", mode.as_str());
    Ok(mode)
}

/// The record's value for what linking the kfuncs found.
pub fn kfuncs_value(kfuncs: Kfuncs) -> u32 {
    match kfuncs {
        Kfuncs::Linked => KFUNCS_LINKED,
        Kfuncs::NoBtf => KFUNCS_NO_BTF,
        Kfuncs::Refused => KFUNCS_REFUSED,
        Kfuncs::Missing(name) => {
            let index = portmap_common::kfunc::ALL
                .iter()
                .position(|k| k.name == name)
                .unwrap_or(0);
            KFUNCS_MISSING + index as u32
        }
    }
}

/// What a record's value says, if anything.
pub fn kfuncs_from_value(value: u32) -> Option<Kfuncs> {
    match value {
        KFUNCS_LINKED => Some(Kfuncs::Linked),
        KFUNCS_NO_BTF => Some(Kfuncs::NoBtf),
        KFUNCS_REFUSED => Some(Kfuncs::Refused),
        v if v >= KFUNCS_MISSING => portmap_common::kfunc::ALL
            .get((v - KFUNCS_MISSING) as usize)
            .map(|k| Kfuncs::Missing(k.name)),
        _ => None,
    }
}

/// Records what the load that pinned this build's programs found of the
/// kfuncs (the conntrack group's, then the NAT group's), in the record
/// [`attach_mode`] made.
pub fn record_kfuncs(layout: &PinLayout, kfuncs: Kfuncs, nat: Kfuncs) -> Result<(), FeatureError> {
    let path = layout.map(RECORD);
    let record_error = |source: io::Error| FeatureError::Record {
        path: path.clone(),
        source,
    };
    let data =
        MapData::from_pin(&path).map_err(|e| record_error(io::Error::other(e.to_string())))?;
    let mut record: Array<MapData, u32> = Array::try_from(aya::maps::Map::Array(data))
        .map_err(|e| record_error(io::Error::other(e.to_string())))?;
    for (index, verdict) in [(KFUNCS, kfuncs), (NAT_KFUNCS, nat)] {
        record
            .set(index, kfuncs_value(verdict), 0)
            .map_err(|e| record_error(io::Error::other(e.to_string())))?;
    }
    Ok(())
}

/// What the load of the pinned programs recorded of the kfuncs.
pub fn recorded_kfuncs(layout: &PinLayout) -> Option<Kfuncs> {
    kfuncs_from_value(recorded(layout, KFUNCS)?)
}

/// What the load of the pinned programs recorded of the NAT kfuncs.
pub fn recorded_nat_kfuncs(layout: &PinLayout) -> Option<Kfuncs> {
    kfuncs_from_value(recorded(layout, NAT_KFUNCS)?)
}

/// The fast-path bits of the node's settings (`node_flags`) for the
/// configured `setting` on a kernel whose kfuncs are as `kfuncs` says
/// (`None`: not recorded, as if missing), with `forward_hooked` whether
/// anything is hooked at netfilter's FORWARD (`None`: cannot tell; asked
/// only for the fallback, see [`needs_forward_probe`]):
/// - `fastPath: true`: [`node_flags::FAST_PATH`] (every flow);
/// - unset, the kfuncs linked: [`node_flags::FAST_CONFIRMED`];
/// - unset without them: every flow if nothing is hooked at FORWARD (the
///   fast path skips no rule there), else the normal path;
/// - `fastPath: false`: the normal path.
///
/// The bits only `status` reads say which case it was.
pub fn fast_path_flags(
    setting: FastPathSetting,
    kfuncs: Option<Kfuncs>,
    forward_hooked: Option<bool>,
) -> u32 {
    match (setting, kfuncs, forward_hooked) {
        (FastPathSetting::Always, ..) => node_flags::FAST_PATH,
        (FastPathSetting::Never, ..) => node_flags::FAST_PATH_OFF,
        (FastPathSetting::Confirmed, Some(Kfuncs::Linked), _) => node_flags::FAST_CONFIRMED,
        (FastPathSetting::Confirmed, _, Some(false)) => {
            node_flags::FAST_PATH | node_flags::FAST_UNHOOKED
        }
        (FastPathSetting::Confirmed, _, Some(true)) => node_flags::FAST_FORWARD_HOOKED,
        (FastPathSetting::Confirmed, _, None) => 0,
    }
}

/// Per family (IPv4, IPv6), whether new TCP and UDP flows from outside are
/// translated by the node's netfilter (`knat` in the eBPF crate), with
/// `fastPath` configured as `setting`, the NAT kfuncs as the load found
/// them (`nat_kfuncs`), and netfilter's NAT hooked per family as
/// `nat_hooked` says (`None`: cannot tell). With `fastPath: true`, which
/// hands every flow over past netfilter from its first packet, the same
/// flag has the programs make the kernel's DNAT entry of each such flow
/// and still translate it in tc (see knat.rs), so that `conntrack -L`
/// shows the flow and netfilter can translate its answers should our
/// entries be lost.
pub fn kernel_nat(
    _setting: FastPathSetting,
    nat_kfuncs: Option<Kfuncs>,
    nat_hooked: Option<[bool; 2]>,
) -> [bool; 2] {
    match (nat_kfuncs, nat_hooked) {
        (Some(Kfuncs::Linked), Some(hooked)) => hooked,
        _ => [false; 2],
    }
}

/// Whether [`kernel_nat`] can be anything but "no": whether to ask what
/// is hooked.
pub fn needs_nat_probe(_setting: FastPathSetting, nat_kfuncs: Option<Kfuncs>) -> bool {
    nat_kfuncs == Some(Kfuncs::Linked)
}

/// Whether [`fast_path_flags`] needs to know what is hooked at FORWARD.
pub fn needs_forward_probe(setting: FastPathSetting, kfuncs: Option<Kfuncs>) -> bool {
    setting == FastPathSetting::Confirmed && kfuncs != Some(Kfuncs::Linked)
}

/// Which flows take the fast path on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastPathMode {
    Always,
    Confirmed,
    Never,
}

impl FastPathMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FastPathMode::Always => "always",
            FastPathMode::Confirmed => "confirmed",
            FastPathMode::Never => "never",
        }
    }
}

/// The node's fast-path mode and why, for `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FastPathReport {
    pub mode: FastPathMode,
    pub why: String,
}

/// What the node's settings (`flags`, as the last ADD wrote them) and the
/// kfunc record say of the fast path.
pub fn fast_path_report(flags: u32, kfuncs: Option<Kfuncs>) -> FastPathReport {
    let (mode, why) = if flags & node_flags::MASQ_ALL != 0
        && flags & (node_flags::FAST_PATH | node_flags::FAST_CONFIRMED) != 0
    {
        (
            FastPathMode::Never,
            "masqAll is on: its masquerade is done on the normal path, so no flow is handed over"
                .to_owned(),
        )
    } else if flags & node_flags::FAST_PATH != 0 && flags & node_flags::FAST_UNHOOKED != 0 {
        (
            FastPathMode::Always,
            format!(
                "fastPath unset, and {}; nothing is hooked at FORWARD (nfnetlink_hook), so skipping it skips no rule: every translated flow is handed over (from outside from its first packet, hairpin from its second; a FORWARD rule added later counts from the next ADD or agent pass)",
                no_kfuncs(kfuncs)
            ),
        )
    } else if flags & node_flags::FAST_PATH != 0 {
        (
            FastPathMode::Always,
            "fastPath: true: every translated flow is handed over (from outside from its first packet, hairpin from its second), and skips the node's FORWARD rules"
                .to_owned(),
        )
    } else if flags & node_flags::FAST_CONFIRMED != 0 {
        (
            FastPathMode::Confirmed,
            "fastPath unset: a flow is handed over once the kernel's conntrack holds it as confirmed (its first packets passed the node's firewall); bpf_skb_ct_lookup is linked from vmlinux BTF".to_owned(),
        )
    } else if flags & node_flags::FAST_PATH_OFF != 0 {
        (
            FastPathMode::Never,
            "fastPath: false: every packet takes the normal path".to_owned(),
        )
    } else if flags & node_flags::FAST_FORWARD_HOOKED != 0 {
        (
            FastPathMode::Never,
            format!(
                "fastPath unset, but {}, and something is hooked at FORWARD: every packet takes the normal path",
                no_kfuncs(kfuncs)
            ),
        )
    } else {
        (
            FastPathMode::Never,
            format!(
                "fastPath unset, but {}, and whether anything is hooked at FORWARD cannot be told (nfnetlink_hook, Linux 5.14): every packet takes the normal path",
                no_kfuncs(kfuncs)
            ),
        )
    };
    FastPathReport { mode, why }
}

/// Where new hostPort flows from outside are translated, per family, and
/// why (`status`, `version`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranslationReport {
    /// IPv4 and IPv6: by the node's netfilter (its conntrack entry holds
    /// the DNAT), else in tc.
    pub netfilter: [bool; 2],
    /// `masqAll: true`: every flow from outside is masqueraded, in tc,
    /// and never handed over to the fast path.
    pub masq_all: bool,
    pub why: String,
}

impl TranslationReport {
    /// `netfilter` or `tc`, for one family (0: IPv4, 1: IPv6).
    pub fn place(&self, family: usize) -> &'static str {
        if self.netfilter[family] {
            "netfilter"
        } else {
            "tc"
        }
    }
}

/// Per family (IPv4, IPv6), whether the node's settings (`flags`) have
/// new TCP and UDP flows from outside translated by netfilter: the
/// family's kernel-NAT flag, unless masqAll masquerades every such flow,
/// in tc, so translated there too, or `fastPath: true` hands every flow
/// over from its first packet, translated in tc (with the kernel's DNAT
/// entry made beside, see [`kernel_entries`]; knat.rs in the eBPF crate).
pub fn netfilter_translates(flags: u32) -> [bool; 2] {
    let tc = flags & node_flags::MASQ_ALL != 0 || fast_path_always(flags);
    [
        flags & node_flags::KERNEL_NAT4 != 0 && !tc,
        flags & node_flags::KERNEL_NAT6 != 0 && !tc,
    ]
}

/// Per family, whether new TCP and UDP flows from outside get the
/// kernel's DNAT entry, whoever translates them: netfilter (see
/// [`netfilter_translates`]), or tc with `fastPath: true`. Not with
/// masqAll (masqueraded in tc, no entry).
pub fn kernel_entries(flags: u32) -> [bool; 2] {
    let masq_all = flags & node_flags::MASQ_ALL != 0;
    [
        flags & node_flags::KERNEL_NAT4 != 0 && !masq_all,
        flags & node_flags::KERNEL_NAT6 != 0 && !masq_all,
    ]
}

/// The names of the families (IPv4, IPv6) whose entry of `per_family` is
/// `wanted`.
fn family_names(per_family: [bool; 2], wanted: bool) -> Vec<&'static str> {
    ["IPv4", "IPv6"]
        .into_iter()
        .zip(per_family)
        .filter(|&(_, set)| set == wanted)
        .map(|(family, _)| family)
        .collect()
}

/// Whether `flags` hand every flow over from its first packet
/// (`fastPath: true`; not the fallback of a kernel without the conntrack
/// kfuncs, `FAST_UNHOOKED`, which never has the kernel-NAT flags).
fn fast_path_always(flags: u32) -> bool {
    flags & node_flags::FAST_PATH != 0 && flags & node_flags::FAST_UNHOOKED == 0
}

/// What the node's settings (`flags`) and the NAT kfuncs' record
/// (`nat_kfuncs`) say of where new flows are translated; `nat_hooked`, per
/// family, whether netfilter's NAT is hooked now (`None`: cannot tell),
/// for the why.
pub fn translation_report(
    flags: u32,
    nat_kfuncs: Option<Kfuncs>,
    nat_hooked: Option<[bool; 2]>,
) -> TranslationReport {
    let masq_all = flags & node_flags::MASQ_ALL != 0;
    let netfilter = netfilter_translates(flags);
    const SEEN: &str = "TCP and UDP flows from outside get the kernel's conntrack entry upstream's DNAT would make (conntrack -L, ct status dnat and ct original rules see the host port), and netfilter's NAT translates them; SCTP, masqueraded (hairpin, masqAll) and node-opened flows are translated in tc";
    let why = if netfilter == [true, true] {
        SEEN.to_owned()
    } else if masq_all {
        "masqAll: true masquerades every flow from outside in tc, so tc translates them too (netfilter sees them already translated and masqueraded, with no DNAT), and none is handed over to the fast path".to_owned()
    } else if fast_path_always(flags) {
        let entries = kernel_entries(flags);
        let families = family_names(entries, true);
        if families.is_empty() {
            "fastPath: true hands every flow over past netfilter, so tc translates them (netfilter sees the flow already translated, and no DNAT)".to_owned()
        } else {
            format!(
                "fastPath: true hands every flow over past netfilter from its first packet, so tc translates them; {} TCP and UDP flows from outside still get the kernel's conntrack entry upstream's DNAT would make (conntrack -L shows the host port), which netfilter's NAT uses for answers whose entries of ours were lost",
                families.join(" and ")
            )
        }
    } else {
        match nat_kfuncs {
            Some(Kfuncs::Linked) => {
                let missing = family_names(netfilter, false);
                let hooks = match nat_hooked {
                    Some(_) => "no nat chain or table, or no rule that uses conntrack, of",
                    None => "nf_tables could not be asked about the nat chains of",
                };
                format!(
                    "{}{hooks} {} in the node's network namespace when the last ADD ran (netfilter applies a conntrack entry's NAT only where a nat chain of its family exists and conntrack tracks the family, which a rule that uses it turns on; kube-proxy, firewalld, podman and Docker all have both): those flows are translated in tc, and netfilter sees them already translated, with no DNAT; rules made later count from the next ADD",
                    if netfilter.contains(&true) {
                        format!("{SEEN} where the family allows; ")
                    } else {
                        String::new()
                    },
                    missing.join(" and ")
                )
            }
            Some(Kfuncs::Missing(name)) => format!(
                "the kernel had no {name} when the programs were loaded (Linux 6.1 with nf_conntrack and nf_nat; nf_nat, where it is a module, loads with the first nat chain or table): flows are translated in tc, and netfilter sees them already translated, with no DNAT; programs loaded after the first nat chain exists get it"
            ),
            Some(Kfuncs::NoBtf) => "the kernel has no BTF: flows are translated in tc".to_owned(),
            Some(Kfuncs::Refused) => {
                "the kernel's verifier refused the NAT kfuncs' calls: flows are translated in tc"
                    .to_owned()
            }
            None => {
                "not recorded by the load of the programs: flows are translated in tc".to_owned()
            }
        }
    };
    TranslationReport {
        netfilter,
        masq_all,
        why,
    }
}

/// Why the kernel cannot say which flows its firewall accepted.
fn no_kfuncs(kfuncs: Option<Kfuncs>) -> String {
    match kfuncs {
        Some(Kfuncs::Missing(name)) => format!(
            "the kernel has no {name} in its vmlinux BTF nor in nf_conntrack's (the module not loaded when the programs were, nf_conntrack not built, or a kernel older than the kfunc), so it cannot tell which flows its firewall accepted"
        ),
        Some(Kfuncs::NoBtf) => {
            "the kernel has no BTF (/sys/kernel/btf/vmlinux), so the conntrack kfuncs cannot be linked".to_owned()
        }
        Some(Kfuncs::Refused) => {
            "the kernel's verifier refused the programs' conntrack kfunc calls, so they run without them and cannot tell which flows the firewall accepted".to_owned()
        }
        Some(Kfuncs::Linked) | None => {
            "no ADD has set the node's fast-path mode with this build's programs yet".to_owned()
        }
    }
}

/// Adds the clsact qdisc `interface` needs (one already there is fine);
/// a kernel without it is named as such.
pub fn ensure_clsact(interface: &str) -> Result<(), FeatureError> {
    let error = match aya::programs::tc::qdisc_add_clsact(interface) {
        Ok(()) | Err(TcError::AlreadyAttached) => return Ok(()),
        Err(error) => error,
    };
    let errno = match &error {
        TcError::NetlinkError(e) => e.raw_os_error(),
        TcError::IoError(e) => e.raw_os_error(),
        _ => None,
    };
    let interface = interface.to_owned();
    Err(match errno {
        Some(libc::EEXIST) => return Ok(()),
        // "Specified qdisc kind is unknown": no sch_ingress.
        Some(libc::ENOENT | libc::EOPNOTSUPP) => FeatureError::NoTcHook {
            interface,
            source: error,
        },
        _ => FeatureError::ClsactQdisc {
            interface,
            source: error,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcx_is_told_by_the_errno_of_a_targetless_link() {
        assert!(
            tcx_verdict(Some(libc::ENODEV)).unwrap(),
            "6.6+: looks up ifindex 0"
        );
        for old in [libc::EINVAL, libc::EOPNOTSUPP, ENOTSUPP] {
            assert!(!tcx_verdict(Some(old)).unwrap(), "errno {old}: no tcx");
        }
        assert!(
            tcx_verdict(Some(libc::EPERM)).is_err(),
            "no privilege proves nothing"
        );
        assert!(tcx_verdict(None).is_err());
    }

    #[test]
    fn the_first_definitely_missing_feature_is_named() {
        assert!(first_missing(|_| Some(true)).is_none());
        assert!(first_missing(|_| None).is_none(), "unknown is not missing");
        let no_fib = first_missing(|probe| {
            Some(!matches!(
                probe,
                Probe::Helper(BpfHelper::BPF_FUNC_fib_lookup)
            ))
        })
        .expect("fib_lookup missing");
        assert!(no_fib.name.contains("bpf_fib_lookup"));
        assert_eq!(no_fib.since, "4.18");
        let no_lru = first_missing(|probe| {
            Some(!matches!(
                probe,
                Probe::Map(MapType::LruHash) | Probe::Helper(BpfHelper::BPF_FUNC_fib_lookup)
            ))
        })
        .expect("two missing");
        assert_eq!(no_lru.since, "4.10", "the oldest missing one comes first");
    }

    #[test]
    fn kfunc_records_round_trip() {
        for kfuncs in [
            Kfuncs::Linked,
            Kfuncs::NoBtf,
            Kfuncs::Refused,
            Kfuncs::Missing("bpf_skb_ct_lookup"),
            Kfuncs::Missing("bpf_ct_change_timeout"),
        ] {
            assert_eq!(kfuncs_from_value(kfuncs_value(kfuncs)), Some(kfuncs));
        }
        assert_eq!(kfuncs_from_value(0), None, "no load recorded it");
    }

    #[test]
    fn the_fast_path_mode_follows_the_setting_and_the_kernel() {
        use FastPathSetting::{Always, Confirmed, Never};
        let linked = Some(Kfuncs::Linked);
        let missing = Some(Kfuncs::Missing("bpf_skb_ct_lookup"));
        let cases = [
            (
                Confirmed,
                linked,
                None,
                FastPathMode::Confirmed,
                "conntrack holds it as confirmed",
            ),
            (
                Confirmed,
                missing,
                Some(false),
                FastPathMode::Always,
                "nothing is hooked at FORWARD",
            ),
            (
                Confirmed,
                missing,
                Some(true),
                FastPathMode::Never,
                "something is hooked at FORWARD",
            ),
            (
                Confirmed,
                missing,
                None,
                FastPathMode::Never,
                "cannot be told",
            ),
            (
                Confirmed,
                Some(Kfuncs::NoBtf),
                Some(true),
                FastPathMode::Never,
                "no BTF",
            ),
            (Confirmed, None, None, FastPathMode::Never, "no ADD has set"),
            (
                Always,
                missing,
                Some(true),
                FastPathMode::Always,
                "fastPath: true",
            ),
            (Always, linked, None, FastPathMode::Always, "fastPath: true"),
            (
                Never,
                linked,
                Some(false),
                FastPathMode::Never,
                "fastPath: false",
            ),
        ];
        for (setting, kfuncs, hooked, mode, why) in cases {
            let report = fast_path_report(fast_path_flags(setting, kfuncs, hooked), kfuncs);
            assert_eq!(
                report.mode, mode,
                "{setting:?} with {kfuncs:?}, FORWARD {hooked:?}"
            );
            assert!(
                report.why.contains(why),
                "{setting:?} with {kfuncs:?}, FORWARD {hooked:?}: {}",
                report.why
            );
        }
        assert!(needs_forward_probe(Confirmed, missing));
        assert!(!needs_forward_probe(Confirmed, linked), "the kfuncs decide");
        assert!(!needs_forward_probe(Always, missing), "the setting decides");
        let masq_all = fast_path_flags(Confirmed, linked, None) | node_flags::MASQ_ALL;
        let report = fast_path_report(masq_all, linked);
        assert_eq!(report.mode, FastPathMode::Never);
        assert!(report.why.contains("masqAll"), "{}", report.why);
    }

    #[test]
    fn record_values_round_trip() {
        for mode in [AttachMode::Tcx, AttachMode::Clsact] {
            assert_eq!(mode_from_record(record_value(mode)), Some(mode));
        }
        assert_eq!(mode_from_record(0), None, "an unset entry is no verdict");
    }

    #[test]
    fn netfilter_translates_where_the_nat_kfuncs_linked_and_its_family_is_hooked() {
        use FastPathSetting::{Always, Confirmed, Never};
        let linked = Some(Kfuncs::Linked);
        let both = Some([true, true]);
        assert_eq!(kernel_nat(Confirmed, linked, both), [true, true]);
        assert_eq!(
            kernel_nat(Never, linked, Some([true, false])),
            [true, false]
        );
        assert_eq!(
            kernel_nat(Always, linked, both),
            [true, true],
            "fastPath: true makes the kernel's entries too"
        );
        assert_eq!(
            kernel_nat(
                Confirmed,
                Some(Kfuncs::Missing("bpf_ct_set_nat_info")),
                both
            ),
            [false; 2]
        );
        assert_eq!(
            kernel_nat(Confirmed, linked, None),
            [false; 2],
            "cannot tell: tc"
        );
        assert!(needs_nat_probe(Confirmed, linked));
        assert!(needs_nat_probe(Always, linked));
        assert!(!needs_nat_probe(Confirmed, None));

        let flags = |nat: [bool; 2]| {
            (if nat[0] { node_flags::KERNEL_NAT4 } else { 0 })
                | (if nat[1] { node_flags::KERNEL_NAT6 } else { 0 })
        };
        let report = translation_report(flags([true, true]), linked, both);
        assert_eq!(
            (report.place(0), report.place(1)),
            ("netfilter", "netfilter")
        );
        assert!(report.why.contains("conntrack -L"), "{}", report.why);
        let report = translation_report(flags([true, false]), linked, Some([true, false]));
        assert_eq!((report.place(0), report.place(1)), ("netfilter", "tc"));
        assert!(
            report
                .why
                .contains("no rule that uses conntrack, of IPv6 in"),
            "{}",
            report.why
        );
        let report = translation_report(0, Some(Kfuncs::Missing("bpf_ct_set_nat_info")), both);
        assert!(report.why.contains("bpf_ct_set_nat_info"), "{}", report.why);
        let report = translation_report(node_flags::FAST_PATH, linked, both);
        assert!(report.why.contains("fastPath: true"), "{}", report.why);
        let report = translation_report(flags([true, false]) | node_flags::FAST_PATH, linked, both);
        assert_eq!(
            (report.place(0), report.place(1)),
            ("tc", "tc"),
            "fastPath: true translates in tc"
        );
        assert!(
            report.why.contains("IPv4 TCP and UDP") && report.why.contains("conntrack -L"),
            "{}",
            report.why
        );
        assert_eq!(
            kernel_entries(flags([true, false]) | node_flags::FAST_PATH),
            [true, false]
        );
        let report = translation_report(flags([true, true]) | node_flags::MASQ_ALL, linked, both);
        assert_eq!((report.place(0), report.place(1)), ("tc", "tc"));
        assert!(
            report.masq_all && report.why.contains("masqAll"),
            "{}",
            report.why
        );
    }
}
