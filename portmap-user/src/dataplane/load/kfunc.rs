//! Links the object's kfunc calls before it is loaded (aya 0.14 cannot):
//! every call instruction carrying a [`Kfunc::marker`] gets that kfunc's
//! BTF ID in the running kernel's BTF, or, when the kernel lacks any of
//! them, every marked call becomes `r0 = 0` and the programs load without
//! them (see `portmap_common::kfunc`).
//!
//! A kfunc is looked up in vmlinux BTF first, then in the BTF of the
//! module that defines it ([`Kfunc::module`]: nf_conntrack, which Debian,
//! Ubuntu, RHEL and SUSE build as a module). A module's kfunc is named by
//! its ID in the module's split BTF and by the index of the module's BTF
//! fd in the load's `fd_array` (the call's `off`), which aya 0.14 cannot
//! pass: programs that call one are loaded by
//! [`program`](crate::dataplane::load::program) instead.
//!
//! The ELF and BTF parsing is pure (section headers, type records) and
//! tested without a kernel.

use portmap_common::kfunc::{self, Kfunc};

/// What linking did, for the features record and `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kfuncs {
    /// Every kfunc found, in vmlinux BTF or in its module's: the calls are
    /// live.
    Linked,
    /// This kfunc is neither in vmlinux BTF nor in its module's (the module
    /// not loaded, or not built, or the kernel older than the kfunc): calls
    /// replaced.
    Missing(&'static str),
    /// The kernel has no readable BTF (`/sys/kernel/btf/vmlinux`): calls
    /// replaced.
    NoBtf,
    /// Every kfunc found, but the kernel's verifier refused the programs
    /// that call them: calls replaced.
    Refused,
}

#[derive(Debug, thiserror::Error)]
pub enum KfuncError {
    #[error("the eBPF object is not an ELF file object can read")]
    NotElf {
        #[source]
        source: object::Error,
    },
    #[error("the eBPF object's section headers reach past its end ({len} bytes)")]
    Truncated { len: usize },
}

/// The object with its kfunc calls linked, 8-byte aligned as the ELF
/// parser wants it.
pub struct Linked {
    words: Vec<u64>,
    len: usize,
    /// The conntrack kfuncs (`kfunc::CONFIRM`): lookup, release, timeout.
    pub kfuncs: Kfuncs,
    /// The kfuncs that make a kernel entry with its NAT (`kfunc::NAT`), for
    /// translation by netfilter: linked only where [`Linked::kfuncs`] are.
    pub nat: Kfuncs,
    /// Call instructions rewritten.
    pub calls: usize,
    /// The modules whose BTF the calls name, in `fd_array` order: the
    /// module at position `i` is the calls' `off` `i + 1` (0 is vmlinux).
    /// Empty: every call is to vmlinux (or replaced), and aya can load the
    /// programs.
    pub modules: Vec<&'static str>,
}

impl Linked {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes; u8 has
        // no alignment or validity requirement.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}

/// Where a kfunc's BTF ID was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    /// Its type ID: in vmlinux BTF, or in its module's split BTF (whose IDs
    /// follow vmlinux's).
    pub id: u32,
    /// `None`: vmlinux; else the module whose BTF holds it.
    pub module: Option<&'static str>,
}

/// A kfunc's BTF ID in the running kernel (`None`: the kernel lacks it).
pub type Resolve<'a> = &'a dyn Fn(&Kfunc) -> Option<Resolved>;

/// Which of the object's kfunc groups a load links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Groups {
    /// Every group the kernel has.
    All,
    /// The conntrack kfuncs only: the kernel's verifier refused the NAT
    /// group's calls.
    WithoutNat,
    /// None: the kernel's verifier refused the conntrack kfuncs' calls.
    None,
}

/// `object` linked with the groups `groups` names, the others replaced (a
/// kernel whose verifier refused them); `Groups::All` is [`link`].
pub fn link_only(
    object: &[u8],
    resolve: Option<Resolve<'_>>,
    groups: Groups,
) -> Result<Linked, KfuncError> {
    match groups {
        Groups::All => link(object, resolve),
        // The NAT group's verdict is then `Refused` (see `link_groups`).
        Groups::WithoutNat => link_groups(object, resolve, false),
        Groups::None => {
            let mut linked = link_groups(object, None, false)?;
            linked.kfuncs = Kfuncs::Refused;
            linked.nat = Kfuncs::Refused;
            Ok(linked)
        }
    }
}

/// Links `object`'s kfunc calls with what `resolve` finds for each kfunc;
/// `resolve` itself `None`: no kernel BTF. The conntrack group
/// (`kfunc::CONFIRM`) is linked whole or replaced whole; the NAT group
/// (`kfunc::NAT`) likewise, and only where the conntrack group is.
pub fn link(object: &[u8], resolve: Option<Resolve<'_>>) -> Result<Linked, KfuncError> {
    link_groups(object, resolve, true)
}

/// [`link`]; `nat`: whether the NAT group may be linked at all.
fn link_groups(
    object: &[u8],
    resolve: Option<Resolve<'_>>,
    nat: bool,
) -> Result<Linked, KfuncError> {
    let mut resolved = [kfunc::MOV_R0_0; kfunc::ALL.len()];
    let mut modules: Vec<&'static str> = Vec::new();
    let (confirm_verdict, nat_verdict) = match resolve {
        None => (Kfuncs::NoBtf, Kfuncs::NoBtf),
        Some(resolve) => {
            let confirm = link_group(&kfunc::CONFIRM, resolve, &mut resolved, &mut modules);
            let nat = match confirm {
                Kfuncs::Linked if nat => {
                    link_group(&kfunc::NAT, resolve, &mut resolved, &mut modules)
                }
                Kfuncs::Linked => Kfuncs::Refused,
                // Allocations need the lookup's release.
                missing => missing,
            };
            (confirm, nat)
        }
    };
    let mut words = vec![0u64; object.len().div_ceil(8)];
    // SAFETY: `words` has at least `object.len()` bytes.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), object.len()) };
    bytes.copy_from_slice(object);
    let mut calls = 0;
    for (start, end) in executable_sections(bytes)? {
        let mut at = start;
        while at + 8 <= end {
            let insn = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
            if let Some(index) = marked(insn) {
                bytes[at..at + 8].copy_from_slice(&resolved[index].to_le_bytes());
                calls += 1;
            }
            at += 8;
        }
    }
    Ok(Linked {
        words,
        len: object.len(),
        kfuncs: confirm_verdict,
        nat: nat_verdict,
        calls,
        modules,
    })
}

/// Resolves one group of kfuncs into `resolved` (indices of
/// `kfunc::ALL`), and the modules their calls name into `modules`: all of
/// them, or none (their slots stay `r0 = 0`, no module added).
fn link_group(
    group: &[Kfunc],
    resolve: Resolve<'_>,
    resolved: &mut [u64; kfunc::ALL.len()],
    modules: &mut Vec<&'static str>,
) -> Kfuncs {
    let mut found = Vec::with_capacity(group.len());
    for wanted in group {
        let Some(at) = resolve(wanted) else {
            return Kfuncs::Missing(wanted.name);
        };
        found.push((wanted, at));
    }
    for (wanted, at) in found {
        let fd_index = match at.module {
            None => 0,
            Some(module) => {
                let position = match modules.iter().position(|&m| m == module) {
                    Some(position) => position,
                    None => {
                        modules.push(module);
                        modules.len() - 1
                    }
                };
                // A few modules at most: far below u16.
                (position + 1) as u16
            }
        };
        resolved[kfunc_index(wanted)] = kfunc::linked_call_insn(at.id, fd_index);
    }
    Kfuncs::Linked
}

/// Which kfunc a raw call instruction names by its marker, if any.
fn marked(insn: u64) -> Option<usize> {
    kfunc::ALL
        .iter()
        .position(|wanted: &Kfunc| insn == kfunc::call_insn(wanted.marker))
}

/// Byte ranges of the sections with `SHF_EXECINSTR` (program code; BPF
/// instructions are 8 bytes, from the section's start).
fn executable_sections(elf: &[u8]) -> Result<Vec<(usize, usize)>, KfuncError> {
    use object::{Object, ObjectSection, SectionFlags, elf::SHF_EXECINSTR};

    let file = object::File::parse(elf).map_err(|source| KfuncError::NotElf { source })?;
    let mut sections = Vec::new();
    for section in file.sections() {
        let SectionFlags::Elf { sh_flags } = section.flags() else {
            continue;
        };
        // `None`: no bytes in the file (`SHT_NOBITS`).
        let (Some((start, size)), true) = (
            section.file_range(),
            sh_flags & u64::from(SHF_EXECINSTR) != 0,
        ) else {
            continue;
        };
        let range = usize::try_from(start)
            .ok()
            .zip(usize::try_from(size).ok())
            .and_then(|(start, size)| Some((start, start.checked_add(size)?)))
            .filter(|&(_, end)| end <= elf.len())
            .ok_or(KfuncError::Truncated { len: elf.len() })?;
        sections.push(range);
    }
    Ok(sections)
}

/// Links `object` against the running kernel's BTF: `vmlinux_btf`
/// (`None`: the kernel has none, or it could not be read), and, for a
/// kfunc not built in, `module_btf(module)`, the raw split BTF of the
/// module that defines it (`None`: the module is not loaded).
pub fn link_for_kernel(
    object: &[u8],
    vmlinux_btf: Option<&[u8]>,
    module_btf: &dyn Fn(&str) -> Option<Vec<u8>>,
    groups: Groups,
) -> Result<Linked, KfuncError> {
    let names = kfunc::ALL.map(|k| k.name);
    let Some(base) = vmlinux_btf.and_then(|btf| scan(btf, &names, None)) else {
        return link_only(object, None, groups);
    };
    // Each module's BTF read and scanned once, on the first kfunc it
    // should hold.
    let mut in_modules: Vec<(&'static str, Option<[Option<u32>; kfunc::ALL.len()]>)> = Vec::new();
    for wanted in &kfunc::ALL {
        if base.ids[kfunc_index(wanted)].is_none()
            && !in_modules
                .iter()
                .any(|(module, _)| *module == wanted.module)
        {
            let ids = module_btf(wanted.module).and_then(|btf| {
                scan(
                    &btf,
                    &names,
                    Some(&Base {
                        types: base.types,
                        strings: base.strings,
                    }),
                )
                .map(|split| split.ids)
            });
            in_modules.push((wanted.module, ids));
        }
    }
    link_only(
        object,
        Some(&|wanted: &Kfunc| {
            let index = kfunc_index(wanted);
            if let Some(id) = base.ids[index] {
                return Some(Resolved { id, module: None });
            }
            let (module, ids) = in_modules.iter().find(|(m, _)| *m == wanted.module)?;
            Some(Resolved {
                id: (*ids)?[index]?,
                module: Some(module),
            })
        }),
        groups,
    )
}

fn kfunc_index(wanted: &Kfunc) -> usize {
    kfunc::ALL
        .iter()
        .position(|k| k == wanted)
        .expect("a kfunc of ALL")
}

/// The BTF a split BTF (a module's) builds on: vmlinux's type count (the
/// module's IDs follow it) and its strings (a module's name offsets below
/// their length are vmlinux's).
pub struct Base<'a> {
    pub types: u32,
    pub strings: &'a [u8],
}

/// What one pass over a raw BTF found.
pub struct Scan<'a, const N: usize> {
    /// The type IDs of the `BTF_KIND_FUNC` types asked for, `None` each
    /// one missing.
    pub ids: [Option<u32>; N],
    /// The last type ID (with a base, counted on from the base's).
    pub types: u32,
    /// The string section.
    pub strings: &'a [u8],
}

/// The type IDs of the `BTF_KIND_FUNC` types named `names` in the raw BTF
/// `btf` (`None` each one missing), in one pass over its types; `None`
/// when `btf` is not BTF this parser reads.
pub fn func_ids<const N: usize>(btf: &[u8], names: &[&str; N]) -> Option<[Option<u32>; N]> {
    scan(btf, names, None).map(|found| found.ids)
}

/// [`func_ids`], with what else a split BTF on top of this one needs;
/// `base`: `btf` is split BTF on top of it (a module's). Written for this
/// one question: aya's `Btf` parses every type into its own form first,
/// and then looks up each name with a pass of its own, which cost a debug
/// build about a quarter of a second per load on 6.18's vmlinux (and an
/// emulated VM's plugin its 60 s).
pub fn scan<'a, const N: usize>(
    btf: &'a [u8],
    names: &[&str; N],
    base: Option<&Base<'_>>,
) -> Option<Scan<'a, N>> {
    const MAGIC: u16 = 0xeb9f;
    const KIND_FUNC: u32 = 12;
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(btf.get(at..at + 4)?.try_into().ok()?))
    };
    if btf.get(0..2)? != MAGIC.to_le_bytes() {
        return None;
    }
    let header_len = u32_at(4)? as usize;
    let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
    let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
    let types = btf.get(header_len + type_off..header_len + type_off + type_len)?;
    let strings = btf.get(header_len + str_off..header_len + str_off + str_len)?;
    let name_at = |offset: usize| -> Option<&[u8]> {
        let rest = match base {
            Some(base) if offset < base.strings.len() => base.strings.get(offset..)?,
            Some(base) => strings.get(offset - base.strings.len()..)?,
            None => strings.get(offset..)?,
        };
        Some(&rest[..rest.iter().position(|&b| b == 0)?])
    };
    let mut found = [None; N];
    let mut at = 0;
    let mut id = base.map_or(1, |base| base.types + 1);
    while at + 12 <= types.len() {
        let word = |offset: usize| -> Option<u32> {
            Some(u32::from_le_bytes(
                types.get(at + offset..at + offset + 4)?.try_into().ok()?,
            ))
        };
        let (name_off, info) = (word(0)? as usize, word(4)?);
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        if kind == KIND_FUNC {
            let name = name_at(name_off)?;
            for (slot, wanted) in found.iter_mut().zip(names) {
                if slot.is_none() && name == wanted.as_bytes() {
                    *slot = Some(id);
                }
            }
        }
        // Each kind's data after the 12-byte common part (BTF_KIND_*).
        let extra = match kind {
            1 | 14 | 17 => 4,
            3 => 12,
            4 | 5 | 15 | 19 => vlen * 12,
            6 | 13 => vlen * 8,
            2 | 7..=12 | 16 | 18 => 0,
            _ => return None,
        };
        at += 12 + extra;
        id += 1;
    }
    Some(Scan {
        ids: found,
        types: id - 1,
        strings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 LE with a null section, one executable section
    /// holding `code` and one data section holding `data`.
    fn elf(code: &[u64], data: &[u64]) -> Vec<u8> {
        let mut out = vec![0u8; 64];
        out[..4].copy_from_slice(b"\x7fELF");
        // ELF64, little-endian, version 1; relocatable, EM_BPF, version 1.
        out[4] = 2;
        out[5] = 1;
        out[6] = 1;
        out[0x10..0x12].copy_from_slice(&1u16.to_le_bytes());
        out[0x12..0x14].copy_from_slice(&247u16.to_le_bytes());
        out[0x14..0x18].copy_from_slice(&1u32.to_le_bytes());
        out[0x34..0x36].copy_from_slice(&64u16.to_le_bytes());
        let code_at = out.len();
        for insn in code {
            out.extend_from_slice(&insn.to_le_bytes());
        }
        let data_at = out.len();
        for word in data {
            out.extend_from_slice(&word.to_le_bytes());
        }
        // The section names: all empty.
        let names_at = out.len();
        out.extend_from_slice(&[0; 8]);
        let shoff = out.len();
        out[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        out[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        out[0x3c..0x3e].copy_from_slice(&4u16.to_le_bytes());
        out[0x3e..0x40].copy_from_slice(&3u16.to_le_bytes());
        let header = |kind: u32, flags: u64, at: usize, size: usize| {
            let mut h = vec![0u8; 64];
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[8..16].copy_from_slice(&flags.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(at as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            h
        };
        out.extend(header(0, 0, 0, 0));
        // SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR.
        out.extend(header(1, 0x6, code_at, code.len() * 8));
        // SHT_PROGBITS, SHF_ALLOC | SHF_WRITE.
        out.extend(header(1, 0x3, data_at, data.len() * 8));
        // SHT_STRTAB: the section names (e_shstrndx).
        out.extend(header(3, 0, names_at, 8));
        out
    }

    fn words(bytes: &[u8], at: usize, count: usize) -> Vec<u64> {
        (0..count)
            .map(|i| u64::from_le_bytes(bytes[at + i * 8..at + i * 8 + 8].try_into().unwrap()))
            .collect()
    }

    const EXIT: u64 = 0x95;

    fn calls() -> Vec<u64> {
        vec![
            kfunc::call_insn(kfunc::CT_LOOKUP.marker),
            kfunc::call_insn(kfunc::CT_CHANGE_TIMEOUT.marker),
            kfunc::call_insn(kfunc::CT_RELEASE.marker),
            EXIT,
        ]
    }

    #[test]
    fn each_marked_call_gets_its_kfuncs_btf_id() {
        let object = elf(&calls(), &[]);
        let ids = |wanted: &Kfunc| {
            Some(Resolved {
                id: match wanted.name {
                    "bpf_skb_ct_lookup" => 65104,
                    "bpf_ct_release" => 63223,
                    "bpf_ct_change_timeout" => 63217,
                    _ => return None,
                },
                module: None,
            })
        };
        let linked = link(&object, Some(&ids)).unwrap();
        assert_eq!(linked.kfuncs, Kfuncs::Linked);
        assert_eq!(linked.calls, 3);
        assert!(linked.modules.is_empty(), "vmlinux only: no fd_array");
        assert_eq!(
            words(linked.bytes(), 64, 4),
            vec![
                (65104 << 32) | 0x2085,
                (63217 << 32) | 0x2085,
                (63223 << 32) | 0x2085,
                EXIT
            ],
            "call, src_reg 2 (kfunc), imm the BTF ID"
        );
    }

    #[test]
    fn one_missing_kfunc_replaces_every_call_with_a_null_result() {
        let object = elf(&calls(), &[]);
        let no_change_timeout = |wanted: &Kfunc| {
            (wanted.name != "bpf_ct_change_timeout").then_some(Resolved {
                id: 7,
                module: Some("nf_conntrack"),
            })
        };
        let linked = link(&object, Some(&no_change_timeout)).unwrap();
        assert_eq!(linked.kfuncs, Kfuncs::Missing("bpf_ct_change_timeout"));
        assert!(linked.modules.is_empty(), "nothing linked: no module");
        assert_eq!(
            words(linked.bytes(), 64, 4),
            vec![kfunc::MOV_R0_0, kfunc::MOV_R0_0, kfunc::MOV_R0_0, EXIT]
        );
        let no_btf = link(&object, None).unwrap();
        assert_eq!(no_btf.kfuncs, Kfuncs::NoBtf);
        assert_eq!(no_btf.calls, 3);
    }

    fn nat_calls() -> Vec<u64> {
        let mut code = calls();
        code.pop();
        code.extend([
            kfunc::call_insn(kfunc::CT_ALLOC.marker),
            kfunc::call_insn(kfunc::CT_SET_NAT.marker),
            kfunc::call_insn(kfunc::CT_INSERT.marker),
            EXIT,
        ]);
        code
    }

    #[test]
    fn the_nat_group_links_from_its_own_module_or_is_replaced_alone() {
        let object = elf(&nat_calls(), &[]);
        // Debian's layout: nf_conntrack's kfuncs in its module, nf_nat's
        // in its own.
        let modules = |wanted: &Kfunc| {
            Some(Resolved {
                id: 100 + (wanted.marker & 0xff),
                module: Some(wanted.module),
            })
        };
        let linked = link(&object, Some(&modules)).unwrap();
        assert_eq!(
            (linked.kfuncs, linked.nat),
            (Kfuncs::Linked, Kfuncs::Linked)
        );
        assert_eq!(linked.modules, vec!["nf_conntrack", "nf_nat"]);
        assert_eq!(
            words(linked.bytes(), 64, 7)[4],
            (106 << 32) | (2 << 16) | 0x2085,
            "bpf_ct_set_nat_info: nf_nat's BTF, the second fd of fd_array"
        );
        // nf_nat not loaded: the conntrack group stays linked, the NAT
        // group's calls return 0 (no allocation), and no nf_nat fd.
        let no_nf_nat = |wanted: &Kfunc| {
            (wanted.module != "nf_nat")
                .then(|| modules(wanted))
                .flatten()
        };
        let linked = link(&object, Some(&no_nf_nat)).unwrap();
        assert_eq!(linked.kfuncs, Kfuncs::Linked);
        assert_eq!(linked.nat, Kfuncs::Missing("bpf_ct_set_nat_info"));
        assert_eq!(linked.modules, vec!["nf_conntrack"]);
        assert_eq!(
            words(linked.bytes(), 64, 7)[3..],
            [kfunc::MOV_R0_0, kfunc::MOV_R0_0, kfunc::MOV_R0_0, EXIT]
        );
        assert_ne!(
            words(linked.bytes(), 64, 1)[0],
            kfunc::MOV_R0_0,
            "the lookup stays linked"
        );
        // The verifier refused the NAT calls: linked without them.
        let without = link_only(&object, Some(&modules), Groups::WithoutNat).unwrap();
        assert_eq!(
            (without.kfuncs, without.nat),
            (Kfuncs::Linked, Kfuncs::Refused)
        );
        assert_eq!(without.modules, vec!["nf_conntrack"]);
        // The conntrack group missing takes the NAT group with it.
        let no_conntrack = |wanted: &Kfunc| {
            (wanted.name != "bpf_skb_ct_lookup")
                .then(|| modules(wanted))
                .flatten()
        };
        let linked = link(&object, Some(&no_conntrack)).unwrap();
        assert_eq!(linked.kfuncs, Kfuncs::Missing("bpf_skb_ct_lookup"));
        assert_eq!(linked.nat, Kfuncs::Missing("bpf_skb_ct_lookup"));
        assert!(linked.modules.is_empty());
        let none = link_only(&object, Some(&modules), Groups::None).unwrap();
        assert_eq!((none.kfuncs, none.nat), (Kfuncs::Refused, Kfuncs::Refused));
        assert!(
            words(none.bytes(), 64, 6)
                .iter()
                .all(|&insn| insn == kfunc::MOV_R0_0)
        );
    }

    #[test]
    fn a_marker_outside_code_is_data_and_left_alone() {
        let marker = kfunc::call_insn(kfunc::CT_LOOKUP.marker);
        let object = elf(&[EXIT], &[marker]);
        let linked = link(
            &object,
            Some(&|_: &Kfunc| {
                Some(Resolved {
                    id: 1,
                    module: None,
                })
            }),
        )
        .unwrap();
        assert_eq!(linked.calls, 0);
        assert_eq!(linked.bytes(), &object[..], "nothing changed");
    }

    /// Raw BTF: the header, then `types` (kind, name) with no extra data
    /// but for an INT (4 bytes) and a two-member STRUCT (24 bytes).
    fn btf(types: &[(u32, &str)]) -> Vec<u8> {
        let mut strings = vec![0u8];
        let mut section = Vec::new();
        for (kind, name) in types {
            let name_off = strings.len() as u32;
            strings.extend_from_slice(name.as_bytes());
            strings.push(0);
            let vlen: u32 = if *kind == 4 { 2 } else { 0 };
            section.extend_from_slice(&name_off.to_le_bytes());
            section.extend_from_slice(&((kind << 24) | vlen).to_le_bytes());
            section.extend_from_slice(&0u32.to_le_bytes());
            section.extend(std::iter::repeat_n(
                0u8,
                match kind {
                    1 => 4,
                    4 => 24,
                    _ => 0,
                },
            ));
        }
        let mut out = Vec::new();
        out.extend_from_slice(&0xeb9fu16.to_le_bytes());
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&24u32.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(section.len() as u32).to_le_bytes());
        out.extend_from_slice(&(section.len() as u32).to_le_bytes());
        out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        out.extend(section);
        out.extend(strings);
        out
    }

    #[test]
    fn a_modules_kfunc_is_called_through_its_fd_array_index() {
        let object = elf(&calls(), &[]);
        // The lookup built in, the other two in nf_conntrack's BTF.
        let mixed = |wanted: &Kfunc| {
            Some(if wanted.name == "bpf_skb_ct_lookup" {
                Resolved {
                    id: 500,
                    module: None,
                }
            } else {
                Resolved {
                    id: 90_000 + wanted.marker % 16,
                    module: Some("nf_conntrack"),
                }
            })
        };
        let linked = link(&object, Some(&mixed)).unwrap();
        assert_eq!(linked.kfuncs, Kfuncs::Linked);
        assert_eq!(
            linked.modules,
            vec!["nf_conntrack"],
            "one module, fd_array[1]"
        );
        assert_eq!(
            words(linked.bytes(), 64, 4),
            vec![
                (500 << 32) | 0x2085,
                (90_003 << 32) | (1 << 16) | 0x2085,
                (90_002 << 32) | (1 << 16) | 0x2085,
                EXIT
            ],
            "off 0 for vmlinux, 1 for the module's fd"
        );
    }

    #[test]
    fn a_modules_split_btf_numbers_its_types_after_vmlinuxs() {
        // vmlinux: 2 types, "bpf_ct_release" a FUNC there. The module: a
        // FUNC of its own name, and one named by a vmlinux string offset.
        let vmlinux = btf(&[(1, "int"), (12, "bpf_ct_release")]);
        let base = scan(&vmlinux, &["bpf_ct_release"], None).expect("BTF");
        assert_eq!(base.ids, [Some(2)]);
        assert_eq!(base.types, 2);
        let mut module = btf(&[(1, "u8"), (12, "bpf_skb_ct_lookup")]);
        // The module's strings start after vmlinux's: shift its offsets.
        let shift = base.strings.len() as u32;
        // The records: an INT (16 bytes) at 24, the FUNC at 40.
        for at in [24, 40] {
            let off = u32::from_le_bytes(module[at..at + 4].try_into().unwrap());
            module[at..at + 4].copy_from_slice(&(off + shift).to_le_bytes());
        }
        let split = scan(
            &module,
            &["bpf_skb_ct_lookup", "bpf_ct_release"],
            Some(&Base {
                types: base.types,
                strings: base.strings,
            }),
        )
        .expect("split BTF");
        assert_eq!(split.ids, [Some(4), None], "IDs go on from vmlinux's 2");
        assert_eq!(split.types, 4);
    }

    #[test]
    fn link_for_kernel_takes_what_vmlinux_lacks_from_the_module() {
        let object = elf(&calls(), &[]);
        let vmlinux = btf(&[(1, "int")]);
        let module = |name: &str| {
            // nf_nat (the NAT group's module) not loaded here.
            if name == "nf_nat" {
                return None;
            }
            assert_eq!(name, "nf_conntrack");
            // Offsets relative to the module's own strings, shifted past
            // vmlinux's 5 bytes ("\0int\0").
            let mut raw = btf(&[
                (12, "bpf_skb_ct_lookup"),
                (12, "bpf_ct_release"),
                (12, "bpf_ct_change_timeout"),
            ]);
            for record in 0..3 {
                let at = 24 + record * 12;
                let off = u32::from_le_bytes(raw[at..at + 4].try_into().unwrap());
                raw[at..at + 4].copy_from_slice(&(off + 5).to_le_bytes());
            }
            Some(raw)
        };
        let linked = link_for_kernel(&object, Some(&vmlinux), &module, Groups::All).unwrap();
        assert_eq!(linked.kfuncs, Kfuncs::Linked);
        assert_eq!(linked.modules, vec!["nf_conntrack"]);
        assert_eq!(
            words(linked.bytes(), 64, 3),
            vec![
                (2 << 32) | (1 << 16) | 0x2085,
                (4 << 32) | (1 << 16) | 0x2085,
                (3 << 32) | (1 << 16) | 0x2085,
            ]
        );
        let unloaded =
            link_for_kernel(&object, Some(&vmlinux), &|_: &str| None, Groups::All).unwrap();
        assert_eq!(unloaded.kfuncs, Kfuncs::Missing("bpf_skb_ct_lookup"));
        assert!(unloaded.modules.is_empty());
    }

    #[test]
    fn func_ids_are_found_by_name_and_kind_in_one_pass() {
        // IDs from 1: an INT, a STRUCT (with member data to skip), a FUNC
        // named like the lookup but a TYPEDEF, then the FUNCs.
        let raw = btf(&[
            (1, "int"),
            (4, "nf_conn"),
            (8, "bpf_ct_release"),
            (12, "bpf_skb_ct_lookup"),
            (12, "bpf_ct_release"),
        ]);
        let ids = func_ids(
            &raw,
            &[
                "bpf_skb_ct_lookup",
                "bpf_ct_release",
                "bpf_ct_change_timeout",
            ],
        )
        .expect("BTF");
        assert_eq!(ids, [Some(4), Some(5), None], "FUNCs only, by type ID");
        assert!(func_ids(b"not btf at all, no", &["x"]).is_none());
        let unknown = btf(&[(31, "future")]);
        assert!(
            func_ids(&unknown, &["x"]).is_none(),
            "an unknown kind stops the parse"
        );
    }

    #[test]
    fn the_running_kernels_btf_names_the_kfuncs_as_bpftool_does() {
        let Ok(raw) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipped: no /sys/kernel/btf/vmlinux");
            return;
        };
        let ours = func_ids(&raw, &kfunc::ALL.map(|k| k.name)).expect("vmlinux BTF parses");
        let aya = aya::Btf::from_sys_fs().expect("aya parses it");
        for (kfunc, id) in kfunc::ALL.iter().zip(ours) {
            assert_eq!(
                id,
                aya.id_by_type_name_kind(kfunc.name, aya_obj::btf::BtfKind::Func)
                    .ok(),
                "{}",
                kfunc.name
            );
        }
    }

    #[test]
    fn not_an_elf_or_cut_short_is_an_error() {
        assert!(matches!(
            link(b"not an elf", None),
            Err(KfuncError::NotElf { .. })
        ));
        let object = elf(&calls(), &[]);
        // Into the code section's header (the second of four, at the end).
        let cut = &object[..object.len() - 4 * 64 + 64 + 30];
        assert!(link(cut, None).is_err());
    }
}
