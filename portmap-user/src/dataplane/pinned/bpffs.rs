//! The bpffs the pins live on: checking a pin root is on one, mounting it
//! where a node has none, the private (0700) directories under it, and
//! taking a pin root's emptied directories away again. Also
//! mount(2) of the other pseudo filesystem we may need (cgroup2).
//!
//! # Whose bpffs
//! A bpffs mounted at /sys/fs/bpf is the node's only where the mount
//! reaches the node: in the node's own mount namespace (PID 1's), or on a
//! mount that propagates (`shared:` in `/proc/self/mountinfo`). A runtime
//! in a container (a KIND node) or a unit with `PrivateMounts` runs the
//! plugin in a private mount namespace: a bpffs mounted there would hold a
//! whole dataplane that dies with that namespace while the port refuses
//! connections, and a DEL there cannot see the node's mappings. So there
//! ADD refuses (naming the fix: bind-mount the node's /sys/fs/bpf into the
//! runtime's namespace), STATUS says the same, and DEL and GC log what
//! they could not reach and leave it to a GC that can.

use crate::model::DEFAULT_PIN_ROOT;
use std::{
    fs, io,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum BpffsError {
    #[error("cannot create {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path} {problem}, so another user could plant or replace ebpf-portmap's locks, records or pins there; {fix}",
        path = path.display(),
        fix = problem.fix(path)
    )]
    UnsafeDir { path: PathBuf, problem: DirProblem },
    #[error("bpffs is not mounted at {path}; mount it with `mount -t bpf bpf /sys/fs/bpf`")]
    NoBpffs { path: PathBuf },
    #[error(
        "the node's bpffs is not visible here: this plugin runs in a mount namespace that is not the node's, without a bpffs at {DEFAULT_MOUNT} (mount {mount} is private: a bpffs mounted there would hold a dataplane that dies with this namespace, not the node's). Bind-mount the node's {DEFAULT_MOUNT} into the container runtime's mount namespace (for example `-v {DEFAULT_MOUNT}:{DEFAULT_MOUNT}`, a hostPath volume, or BindPaths={DEFAULT_MOUNT} for a systemd unit), as Cilium and Calico ask"
    )]
    NotTheNodes { mount: PathBuf },
    #[error(
        "pinRoot {root} is not on a bpffs ({found} is on {filesystem}), so nothing can be pinned there; set pinRoot to a directory on a bpffs mount (the default {DEFAULT_PIN_ROOT} is one; `findmnt -t bpf` lists them)"
    )]
    PinRootNotBpffs {
        root: PathBuf,
        /// The nearest existing directory of the root, which was looked at.
        found: PathBuf,
        filesystem: String,
    },
}

impl BpffsError {
    /// Whether this is a mistake of the configuration (its `pinRoot`)
    /// rather than of the node.
    pub fn is_configuration(&self) -> bool {
        matches!(self, BpffsError::PinRootNotBpffs { .. })
    }
}

/// Where ADD mounts a bpffs when the node has none.
const DEFAULT_MOUNT: &str = "/sys/fs/bpf";

/// What makes an existing directory unfit to hold our locks, records or
/// pins (see [`create_private_dir`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirProblem {
    /// A symbolic link: whoever made it chose where our files go.
    Symlink,
    NotADirectory,
    /// Owned by neither root nor this process's user.
    Owner {
        uid: u32,
    },
    /// Group- or world-writable (the mode's permission bits).
    Writable {
        mode: u32,
    },
}

impl DirProblem {
    /// What an operator runs to put it right.
    fn fix(self, path: &Path) -> String {
        let path = path.display();
        match self {
            DirProblem::Symlink | DirProblem::NotADirectory => {
                format!("remove it (`rm {path}`); the next run creates the directory, mode 0700")
            }
            DirProblem::Owner { .. } => format!("run `chown root:root {path}`"),
            DirProblem::Writable { .. } => {
                format!("run `chmod go-w {path}` (0700 is what we create)")
            }
        }
    }
}

impl std::fmt::Display for DirProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DirProblem::Symlink => f.write_str("is a symbolic link, not a directory"),
            DirProblem::NotADirectory => f.write_str("is not a directory"),
            DirProblem::Owner { uid } => write!(f, "is owned by uid {uid}, not root"),
            DirProblem::Writable { mode } => {
                write!(f, "is group- or world-writable (mode {mode:04o})")
            }
        }
    }
}

/// Whether a directory with `metadata` (from `lstat`) may hold our files
/// for a process of effective uid `euid`: a real directory, owned by root
/// (or by `euid`, for a process given capabilities instead of root),
/// writable by its owner only.
fn dir_problem(metadata: &fs::Metadata, euid: u32) -> Option<DirProblem> {
    use std::os::unix::fs::MetadataExt;
    if metadata.file_type().is_symlink() {
        return Some(DirProblem::Symlink);
    }
    if !metadata.is_dir() {
        return Some(DirProblem::NotADirectory);
    }
    if metadata.uid() != 0 && metadata.uid() != euid {
        return Some(DirProblem::Owner {
            uid: metadata.uid(),
        });
    }
    let mode = metadata.mode() & 0o7777;
    (mode & 0o022 != 0).then_some(DirProblem::Writable { mode })
}

/// Creates `path` and its parents, readable by root only, and checks that
/// `path` (new or found) is ours alone: a real directory, owned by root,
/// not group- or world-writable. A directory that is not is refused,
/// not repaired: someone made it so, and an operator should know.
pub fn create_private_dir(path: &Path) -> Result<(), BpffsError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|source| BpffsError::CreateDir {
            path: path.to_owned(),
            source,
        })?;
    let metadata = fs::symlink_metadata(path).map_err(|source| BpffsError::CreateDir {
        path: path.to_owned(),
        source,
    })?;
    // SAFETY: a plain syscall without arguments.
    let euid = unsafe { libc::geteuid() };
    match dir_problem(&metadata, euid) {
        None => Ok(()),
        Some(problem) => Err(BpffsError::UnsafeDir {
            path: path.to_owned(),
            problem,
        }),
    }
}

/// Whether `path` is on a bpffs (or below a directory that will be on one).
/// Removes the directory of `root` (a pin root whose state is gone) if
/// nothing else lives there; for a namespace's own root under the shared
/// default one (`{root}/netns/{cookie}`), `netns/` and the shared root go
/// too once nobody else's state is in them. `remove_dir` removes one
/// directory and reports it as its caller reports (uninstall, the removal
/// of a gone node's state).
pub fn remove_root_if_empty(root: &Path, remove_dir: &mut dyn FnMut(&Path)) {
    if !fs::read_dir(root).is_ok_and(|mut d| d.next().is_none()) {
        return;
    }
    remove_dir(root);
    if let Some(netns_dir) = root.parent()
        && netns_dir.file_name().is_some_and(|name| name == "netns")
        && fs::remove_dir(netns_dir).is_ok()
        && let Some(shared) = netns_dir.parent()
        && fs::read_dir(shared).is_ok_and(|mut d| d.next().is_none())
    {
        remove_dir(shared);
    }
}

const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// The nearest existing directory of `root` (itself, or a parent) and the
/// type of the filesystem it is on (`None` when statfs fails).
fn filesystem_of(root: &Path) -> (PathBuf, Option<i64>) {
    let mut probe = root.to_path_buf();
    while !probe.exists() {
        if !probe.pop() {
            break;
        }
    }
    let c_path = std::ffi::CString::new(probe.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: statfs is plain old data; all zeroes is a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs with a valid NUL-terminated path and an out struct.
    let ok = unsafe { libc::statfs(c_path.as_ptr(), &raw mut stat) } == 0;
    (probe, ok.then_some(stat.f_type as i64))
}

/// A filesystem type as `mount` names it, for messages.
fn filesystem_name(magic: Option<i64>) -> String {
    let name = match magic {
        None => return "a filesystem that cannot be read (statfs failed)".into(),
        Some(0x0102_1994) => "tmpfs",
        Some(0xef53) => "ext4",
        Some(0x5846_5342) => "xfs",
        Some(0x9123_683e) => "btrfs",
        Some(0x794c_7630) => "overlay",
        Some(0x6265_6572) => "sysfs",
        Some(0x9fa0) => "proc",
        Some(0x6969) => "nfs",
        Some(magic) => return format!("a filesystem of type {magic:#x}"),
    };
    name.into()
}

pub fn check_bpffs(root: &Path) -> Result<(), BpffsError> {
    match filesystem_of(root) {
        (_, Some(BPF_FS_MAGIC)) => Ok(()),
        (probe, _) => Err(BpffsError::NoBpffs { path: probe }),
    }
}

/// Whether `root` can hold pins, as ADD sees it: a root outside
/// /sys/fs/bpf must be on a bpffs already, and one that is not is a
/// mistake of `pinRoot`, named as such; under /sys/fs/bpf, the node's
/// bpffs must be mounted there.
pub fn check_pin_root(root: &Path) -> Result<(), BpffsError> {
    if root.starts_with(DEFAULT_MOUNT) {
        return check_bpffs(root);
    }
    match filesystem_of(root) {
        (_, Some(BPF_FS_MAGIC)) => Ok(()),
        (found, magic) => Err(BpffsError::PinRootNotBpffs {
            root: root.to_path_buf(),
            found,
            filesystem: filesystem_name(magic),
        }),
    }
}

/// A node without bpffs at /sys/fs/bpf gets it mounted, as the kernel docs
/// and every eBPF dataplane expect, where the mount is the node's (see the
/// module docs); other roots must be on a bpffs already
/// ([`check_pin_root`]).
pub fn mount_bpffs_if_missing(root: &Path) -> Result<(), BpffsError> {
    if check_pin_root(root).is_ok() || !root.starts_with(DEFAULT_MOUNT) {
        return check_pin_root(root);
    }
    if let Some(error) = unreachable_node_bpffs(root) {
        return Err(error);
    }
    if let Err(error) = mount_fs("bpf", Path::new(DEFAULT_MOUNT)) {
        log::warn!("mounting bpffs at {DEFAULT_MOUNT}: {error}");
    }
    check_bpffs(root)
}

/// The error of a run that cannot reach the node's bpffs for `root`: a
/// root under /sys/fs/bpf, no bpffs there, and a mount namespace where
/// mounting one would not be the node's. `None` when the bpffs is there,
/// or may be mounted (the node's namespace, or a propagating mount), or
/// for a root elsewhere (which [`check_pin_root`] judges).
pub fn unreachable_node_bpffs(root: &Path) -> Option<BpffsError> {
    if !root.starts_with(DEFAULT_MOUNT) || check_bpffs(root).is_ok() {
        return None;
    }
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    if in_init_mount_namespace(&mountinfo) {
        return None;
    }
    match covering_mount(&mountinfo, Path::new(DEFAULT_MOUNT)) {
        Some(covering) if !covering.shared => Some(BpffsError::NotTheNodes {
            mount: covering.mount_point,
        }),
        _ => None,
    }
}

/// Whether this process runs in the node's mount namespace: PID 1's.
/// Where PID 1's cannot be read (a sandbox that hides it), by the root
/// mount: in the namespace the kernel made at boot it sits on the initial
/// rootfs (mount ID 1); a namespace copied from it (`unshare --mount`, a
/// container, `PrivateMounts`) numbers its mounts anew.
fn in_init_mount_namespace(mountinfo: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (
        fs::metadata("/proc/self/ns/mnt"),
        fs::metadata("/proc/1/ns/mnt"),
    ) {
        (Ok(ours), Ok(init)) => ours.dev() == init.dev() && ours.ino() == init.ino(),
        _ => root_on_initial_rootfs(mountinfo),
    }
}

/// Whether the root mount of `mountinfo` has the initial rootfs (mount
/// ID 1) as its parent.
fn root_on_initial_rootfs(mountinfo: &str) -> bool {
    mountinfo.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        fields.len() > 4 && fields[4] == "/" && fields[1] == "1"
    })
}

/// The mount a new mount at some path would be made on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Covering {
    mount_point: PathBuf,
    /// In a peer group (`shared:N`): mounts on it propagate to its peers.
    shared: bool,
}

/// The mount of `mountinfo` (`/proc/self/mountinfo`'s format) that `path`
/// lies on: the one with the longest mount point containing it, the last
/// listed of equal ones (mounted over the others).
fn covering_mount(mountinfo: &str, path: &Path) -> Option<Covering> {
    let mut best: Option<Covering> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        // id parent major:minor root mount_point options [optional...] - type source super
        let Some(separator) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if separator < 6 {
            continue;
        }
        let mount_point = PathBuf::from(fields[4].replace("\\040", " "));
        if !path.starts_with(&mount_point) {
            continue;
        }
        let longer = best
            .as_ref()
            .is_none_or(|b| mount_point.as_os_str().len() >= b.mount_point.as_os_str().len());
        if longer {
            best = Some(Covering {
                shared: fields[6..separator]
                    .iter()
                    .any(|f| f.starts_with("shared:")),
                mount_point,
            });
        }
    }
    best
}

/// mount(2) of a pseudo filesystem (`fstype`, no device, no options).
pub fn mount_fs(fstype: &str, target: &Path) -> io::Result<()> {
    let c = |s: &[u8]| std::ffi::CString::new(s).unwrap_or_default();
    let (fstype, target) = (
        c(fstype.as_bytes()),
        c(target.as_os_str().as_encoded_bytes()),
    );
    // SAFETY: valid NUL-terminated strings, no data argument.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
24 23 0:22 / /sys/fs/cgroup rw shared:8 - cgroup2 cgroup2 rw
25 23 0:23 / /sys/fs/bpf rw shared:9 - bpf bpf rw,mode=700
";

    /// A directory of the test's own, removed on drop.
    struct TestDir(PathBuf);

    impl TestDir {
        fn new(name: &str) -> TestDir {
            let path = std::env::temp_dir().join(format!(
                "epm-bpffs-{name}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&path);
            fs::create_dir(&path).expect("create the test directory");
            TestDir(path)
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn chmod(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn a_private_dir_is_created_owner_only() {
        use std::os::unix::fs::MetadataExt;
        let test = TestDir::new("create");
        let dir = test.0.join("a/b");
        create_private_dir(&dir).expect("created");
        let mode = fs::metadata(&dir).expect("stat").mode() & 0o777;
        assert_eq!(mode, 0o700, "created {mode:o}");
        create_private_dir(&dir).expect("found again, still fine");
    }

    #[test]
    fn a_group_or_world_writable_dir_is_refused() {
        let test = TestDir::new("writable");
        let dir = test.0.join("run");
        for mode in [0o770, 0o757, 0o1777] {
            fs::create_dir_all(&dir).expect("mkdir");
            chmod(&dir, mode);
            let error = create_private_dir(&dir).expect_err("a writable directory is refused");
            assert!(
                matches!(
                    error,
                    BpffsError::UnsafeDir {
                        problem: DirProblem::Writable { .. },
                        ..
                    }
                ),
                "mode {mode:o}: {error:?}"
            );
            let text = error.to_string();
            assert!(
                text.contains(&dir.display().to_string()) && text.contains("chmod go-w"),
                "names the directory and the fix: {text}"
            );
        }
        chmod(&dir, 0o755);
        create_private_dir(&dir).expect("mode 0755 is the owner's alone to write");
    }

    #[test]
    fn a_symlinked_dir_is_refused() {
        let test = TestDir::new("symlink");
        let elsewhere = test.0.join("elsewhere");
        fs::create_dir(&elsewhere).expect("mkdir");
        chmod(&elsewhere, 0o700);
        let link = test.0.join("run");
        std::os::unix::fs::symlink(&elsewhere, &link).expect("symlink");
        let error = create_private_dir(&link).expect_err("a symlink is refused");
        assert!(
            matches!(
                error,
                BpffsError::UnsafeDir {
                    problem: DirProblem::Symlink,
                    ..
                }
            ),
            "{error:?}"
        );
    }

    #[test]
    fn a_dir_of_another_user_is_refused() {
        // SAFETY: a plain syscall without arguments.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to give a directory away");
            return;
        }
        let test = TestDir::new("owner");
        let dir = test.0.join("run");
        fs::create_dir(&dir).expect("mkdir");
        chmod(&dir, 0o700);
        std::os::unix::fs::chown(&dir, Some(12345), None).expect("chown");
        let error = create_private_dir(&dir).expect_err("another user's directory is refused");
        assert!(
            matches!(
                error,
                BpffsError::UnsafeDir {
                    problem: DirProblem::Owner { uid: 12345 },
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(error.to_string().contains("chown root:root"), "{error}");
    }

    #[test]
    fn the_covering_mount_is_the_longest_prefix() {
        let found = covering_mount(MOUNTINFO, Path::new("/sys/fs/bpf")).expect("a mount");
        assert_eq!(found.mount_point, Path::new("/sys/fs/bpf"));
        let found = covering_mount(MOUNTINFO, Path::new("/sys/fs/bpfx")).expect("a mount");
        assert_eq!(
            found.mount_point,
            Path::new("/sys"),
            "a path prefix, not a string one"
        );
        assert!(found.shared);
    }

    #[test]
    fn the_boot_namespace_has_its_root_on_the_initial_rootfs() {
        assert!(root_on_initial_rootfs(MOUNTINFO));
        let copied = "48 47 254:0 / / rw,relatime - ext4 /dev/vda rw\n";
        assert!(!root_on_initial_rootfs(copied));
    }

    #[test]
    fn a_private_parent_does_not_propagate() {
        // A private mount namespace (`unshare --mount`): no `shared:`
        // tags, and /sys/fs/bpf unmounted.
        let private = "\
122 121 8:1 / / rw,relatime - ext4 /dev/sda1 rw
123 122 0:21 / /sys rw,nosuid master:7 - sysfs sysfs rw
";
        let found = covering_mount(private, Path::new("/sys/fs/bpf")).expect("a mount");
        assert_eq!(found.mount_point, Path::new("/sys"));
        assert!(!found.shared, "master: only receives: {found:?}");
    }

    #[test]
    fn the_last_of_stacked_mounts_counts() {
        let stacked = format!("{MOUNTINFO}26 25 0:24 / /sys/fs/bpf rw - bpf bpf rw\n");
        let found =
            covering_mount(&stacked, Path::new("/sys/fs/bpf/ebpf-portmap")).expect("a mount");
        assert!(!found.shared, "the mount on top decides: {found:?}");
    }
}
