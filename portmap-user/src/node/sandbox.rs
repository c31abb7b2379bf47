//! Whether a container's network namespace is still there: what ADD
//! records of it ([`observe`]) and how GC judges it later ([`Judge`]).
//!
//! A path (`CNI_NETNS`) means something only in the mount namespace it was
//! given in, so ADD records that namespace's identity too. The judge reads
//! the path in its own mount namespace when it is that one, through
//! `/proc/1/root` when PID 1's is (an agent in a pod with `hostPID`), and
//! otherwise proves nothing. A path that is missing, or now holds another
//! namespace, is not yet proof of death: a namespace lives on while any
//! process (thread), mount (a bind mount elsewhere) or open file holds it,
//! so those are looked for, once per judge, before a namespace is called
//! gone. Every error is "no proof", never "gone".

use std::{
    collections::HashSet,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::model::{Liveness, NsId, Sandbox};

fn ns_id(path: &Path) -> std::io::Result<NsId> {
    let meta = fs::metadata(path)?;
    Ok(NsId {
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

/// What ADD records of the container's sandbox: the namespace at `netns`
/// (if the runtime gave one) and the mount namespace this process sees it
/// in, with the pod UID.
pub fn observe(netns: Option<&Path>, pod_uid: Option<&str>) -> Sandbox {
    let netns = netns.filter(|path| !path.as_os_str().is_empty());
    let netns_id = netns.and_then(|path| ns_id(path).ok());
    Sandbox {
        netns: netns.filter(|_| netns_id.is_some()).map(Path::to_path_buf),
        netns_id,
        mntns_id: netns_id.and_then(|_| ns_id(Path::new("/proc/self/ns/mnt")).ok()),
        pod_uid: pod_uid.map(str::to_owned),
        gone_since: None,
    }
}

/// Judges sandboxes; reads the node's namespaces at most once.
#[derive(Debug)]
pub struct Judge {
    own_mnt: Option<NsId>,
    host_mnt: Option<NsId>,
    /// Inodes of every network namespace held by a thread, an open file
    /// or a mount, read on the first need; `Err` when some process could
    /// not be read (then a missing path proves nothing).
    held: Option<Result<HashSet<u64>, String>>,
}

impl Default for Judge {
    fn default() -> Self {
        Self::new()
    }
}

impl Judge {
    pub fn new() -> Judge {
        Judge {
            own_mnt: ns_id(Path::new("/proc/self/ns/mnt")).ok(),
            host_mnt: ns_id(Path::new("/proc/1/ns/mnt")).ok(),
            held: None,
        }
    }

    /// Where `sandbox`'s path can be read from here, if anywhere.
    fn reachable(&self, sandbox: &Sandbox, path: &Path) -> Result<PathBuf, String> {
        let Some(mnt) = sandbox.mntns_id else {
            return Err("the mount namespace of its ADD is not recorded".into());
        };
        if self.own_mnt == Some(mnt) {
            return Ok(path.to_path_buf());
        }
        if self.host_mnt == Some(mnt) {
            let relative = path.strip_prefix("/").unwrap_or(path);
            return Ok(Path::new("/proc/1/root").join(relative));
        }
        Err(format!(
            "{} is a path of another mount namespace (the runtime's), which this process cannot see",
            path.display()
        ))
    }

    pub fn judge(&mut self, sandbox: &Sandbox) -> Liveness {
        let (Some(path), Some(id)) = (&sandbox.netns, sandbox.netns_id) else {
            return Liveness::Unknown(
                "the runtime gave no network namespace (CNI_NETNS) at ADD".into(),
            );
        };
        let at = match self.reachable(sandbox, path) {
            Ok(at) => at,
            Err(why) => return Liveness::Unknown(why),
        };
        match ns_id(&at) {
            Ok(now) if now == id => return Liveness::Alive,
            Ok(_) => {}
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) => {}
            Err(error) => {
                return Liveness::Unknown(format!("{} cannot be read: {error}", at.display()));
            }
        }
        match self.held.get_or_insert_with(held_net_namespaces) {
            Ok(held) if held.contains(&id.ino) => Liveness::Alive,
            Ok(_) => Liveness::Gone,
            Err(why) => Liveness::Unknown(format!(
                "{} is gone, but whether another process holds the namespace is not known: {why}",
                path.display()
            )),
        }
    }
}

/// `4026532281` of `net:[4026532281]`.
fn net_inode(link: &str) -> Option<u64> {
    link.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// The nsfs inode of every network namespace a mount holds, from one
/// `mountinfo` (field 4, the root, is `net:[INODE]` for such a mount).
fn mounted_net_inodes(mountinfo: &str) -> impl Iterator<Item = u64> + '_ {
    mountinfo.lines().filter_map(|line| {
        let (fields, fs) = line.split_once(" - ")?;
        if !fs.starts_with("nsfs ") {
            return None;
        }
        net_inode(fields.split(' ').nth(3)?)
    })
}

/// Every network namespace held by a thread, an open file descriptor, or
/// a mount of any mount namespace, as seen through this process's /proc
/// (or PID 1's when this process is in another mount namespace).
///
/// Without CAP_SYS_PTRACE a process that cannot be read makes the answer
/// unknown: a namespace it holds would be missed. With it, a process that
/// is still refused is one a security module hides from every reader (a
/// sandbox's supervisor), not a runtime or a pod's process: it is skipped.
/// One that exits meanwhile holds nothing.
fn held_net_namespaces() -> Result<HashSet<u64>, String> {
    let mut held = HashSet::new();
    let mut mount_namespaces = HashSet::new();
    let processes = fs::read_dir("/proc").map_err(|error| format!("/proc: {error}"))?;
    let strict = !crate::node::privilege::may_read_processes();
    let denied = |error: &std::io::Error| {
        matches!(error.kind(), std::io::ErrorKind::PermissionDenied)
            || error.raw_os_error() == Some(libc::EPERM)
    };
    let link = |path: PathBuf, held: &mut HashSet<u64>| -> Result<(), String> {
        match fs::read_link(&path) {
            Ok(target) => {
                held.extend(net_inode(&target.to_string_lossy()));
                Ok(())
            }
            Err(error) if denied(&error) && strict => Err(format!(
                "{} cannot be read ({error}; the process needs CAP_SYS_PTRACE)",
                path.display()
            )),
            Err(_) => Ok(()),
        }
    };
    for process in processes.flatten() {
        let name = process.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let dir = process.path();
        for sub in ["task", "fd"] {
            let entries = match fs::read_dir(dir.join(sub)) {
                Ok(entries) => entries,
                Err(error) if denied(&error) && strict => {
                    return Err(format!(
                        "{} cannot be read ({error}; the process needs CAP_SYS_PTRACE)",
                        dir.join(sub).display()
                    ));
                }
                Err(_) => continue,
            };
            for entry in entries.flatten() {
                let path = match sub {
                    "task" => entry.path().join("ns/net"),
                    _ => entry.path(),
                };
                link(path, &mut held)?;
            }
        }
        if let Ok(mnt) = ns_id(&dir.join("ns/mnt"))
            && mount_namespaces.insert(mnt.ino)
            && let Ok(text) = fs::read_to_string(dir.join("mountinfo"))
        {
            held.extend(mounted_net_inodes(&text));
        }
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_inodes_are_read_from_links_and_mountinfo() {
        assert_eq!(net_inode("net:[4026532281]"), Some(4026532281));
        assert_eq!(net_inode("mnt:[4026531841]"), None);
        assert_eq!(net_inode("socket:[123]"), None);
        let mountinfo = "\
22 1 0:21 / /proc rw,nosuid - proc proc rw
512 30 0:4 net:[4026532401] /run/netns/web rw - nsfs nsfs rw
513 30 0:4 mnt:[4026532402] /run/mnt rw - nsfs nsfs rw
514 30 0:4 net:[4026532403] /var/run/netns/db rw shared:5 - nsfs nsfs rw";
        assert_eq!(
            mounted_net_inodes(mountinfo).collect::<Vec<_>>(),
            vec![4026532401, 4026532403]
        );
    }

    #[test]
    fn without_a_path_or_its_mount_namespace_nothing_is_proven() {
        let mut judge = Judge::new();
        let none = Sandbox::default();
        assert!(matches!(judge.judge(&none), Liveness::Unknown(why) if why.contains("CNI_NETNS")));
        let elsewhere = Sandbox {
            netns: Some("/run/netns/x".into()),
            netns_id: Some(NsId { dev: 4, ino: 1 }),
            mntns_id: Some(NsId { dev: 4, ino: 1 }),
            ..Sandbox::default()
        };
        assert!(
            matches!(judge.judge(&elsewhere), Liveness::Unknown(why) if why.contains("another mount namespace")),
            "a path of a mount namespace this process is not in proves nothing"
        );
    }
}
