//! Links the object's kfunc calls before it is loaded (aya 0.14 cannot):
//! every call instruction carrying a [`Kfunc::marker`] gets that kfunc's
//! BTF ID in the running kernel's vmlinux BTF, or, when the kernel lacks
//! any of them there, every marked call becomes `r0 = 0` and the programs
//! load without them (see `portmap_common::kfunc`).
//!
//! A kfunc of a module (nf_conntrack built as a module, as Debian's
//! kernels have it) is in that module's BTF, not vmlinux's, and needs the
//! module's BTF fd in the load's `fd_array`, which aya 0.14 cannot pass:
//! such a kernel gets the variant without the calls.
//!
//! The ELF parsing is pure (section headers only) and tested without a
//! kernel.

use portmap_common::kfunc::{self, Kfunc};

/// What linking did, for the features record and `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kfuncs {
    /// Every kfunc found in vmlinux BTF: the calls are live.
    Linked,
    /// This kfunc is not in vmlinux BTF (nf_conntrack is a module, or not
    /// built, or the kernel is older than the kfunc): calls replaced.
    Missing(&'static str),
    /// The kernel has no readable BTF (`/sys/kernel/btf/vmlinux`): calls
    /// replaced.
    NoBtf,
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
    pub kfuncs: Kfuncs,
    /// Call instructions rewritten.
    pub calls: usize,
}

impl Linked {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes; u8 has
        // no alignment or validity requirement.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}

/// A kfunc's BTF ID by its name, in the running kernel's vmlinux BTF.
pub type BtfIdOf<'a> = &'a dyn Fn(&str) -> Option<u32>;

/// Links `object`'s kfunc calls with the IDs `btf_id` gives for each
/// kfunc's name (`None`: the kernel lacks it); `btf_id` itself `None`:
/// no kernel BTF.
pub fn link(object: &[u8], btf_id: Option<BtfIdOf<'_>>) -> Result<Linked, KfuncError> {
    let mut resolved = [0u32; kfunc::ALL.len()];
    let mut verdict = Kfuncs::Linked;
    match btf_id {
        None => verdict = Kfuncs::NoBtf,
        Some(btf_id) => {
            for (slot, wanted) in resolved.iter_mut().zip(kfunc::ALL) {
                match btf_id(wanted.name) {
                    Some(id) => *slot = id,
                    None => {
                        verdict = Kfuncs::Missing(wanted.name);
                        break;
                    }
                }
            }
        }
    }
    let replacement = |index: usize| -> u64 {
        if verdict == Kfuncs::Linked {
            (kfunc::call_insn(kfunc::ALL[index].marker) & 0xffff_ffff)
                | (u64::from(resolved[index]) << 32)
        } else {
            kfunc::MOV_R0_0
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
                bytes[at..at + 8].copy_from_slice(&replacement(index).to_le_bytes());
                calls += 1;
            }
            at += 8;
        }
    }
    Ok(Linked {
        words,
        len: object.len(),
        kfuncs: verdict,
        calls,
    })
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

/// Links `object` against the running kernel's vmlinux BTF (`None`: the
/// kernel has none, or it could not be read).
pub fn link_for_kernel(object: &[u8], vmlinux_btf: Option<&[u8]>) -> Result<Linked, KfuncError> {
    match vmlinux_btf.map(|btf| func_ids(btf, &kfunc::ALL.map(|k| k.name))) {
        Some(Some(ids)) => link(
            object,
            Some(&|name: &str| {
                kfunc::ALL
                    .iter()
                    .position(|k| k.name == name)
                    .and_then(|index| ids[index])
            }),
        ),
        _ => link(object, None),
    }
}

/// The type IDs of the `BTF_KIND_FUNC` types named `names` in the raw BTF
/// `btf` (`None` each one missing), in one pass over its types; `None`
/// when `btf` is not BTF this parser reads. Written for this one question:
/// aya's `Btf` parses every type into its own form first, and then looks
/// up each name with a pass of its own, which cost a debug build about a
/// quarter of a second per load on 6.18's vmlinux (and an emulated VM's
/// plugin its 60 s).
pub fn func_ids<const N: usize>(btf: &[u8], names: &[&str; N]) -> Option<[Option<u32>; N]> {
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
        let rest = strings.get(offset..)?;
        Some(&rest[..rest.iter().position(|&b| b == 0)?])
    };
    let mut found = [None; N];
    let mut at = 0;
    let mut id = 1u32;
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
    Some(found)
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
        let ids = |name: &str| {
            Some(match name {
                "bpf_skb_ct_lookup" => 65104,
                "bpf_ct_release" => 63223,
                "bpf_ct_change_timeout" => 63217,
                _ => return None,
            })
        };
        let linked = link(&object, Some(&ids)).unwrap();
        assert_eq!(linked.kfuncs, Kfuncs::Linked);
        assert_eq!(linked.calls, 3);
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
        let no_change_timeout = |name: &str| (name != "bpf_ct_change_timeout").then_some(7);
        let linked = link(&object, Some(&no_change_timeout)).unwrap();
        assert_eq!(linked.kfuncs, Kfuncs::Missing("bpf_ct_change_timeout"));
        assert_eq!(
            words(linked.bytes(), 64, 4),
            vec![kfunc::MOV_R0_0, kfunc::MOV_R0_0, kfunc::MOV_R0_0, EXIT]
        );
        let no_btf = link(&object, None).unwrap();
        assert_eq!(no_btf.kfuncs, Kfuncs::NoBtf);
        assert_eq!(no_btf.calls, 3);
    }

    #[test]
    fn a_marker_outside_code_is_data_and_left_alone() {
        let marker = kfunc::call_insn(kfunc::CT_LOOKUP.marker);
        let object = elf(&[EXIT], &[marker]);
        let linked = link(&object, Some(&|_: &str| Some(1))).unwrap();
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
