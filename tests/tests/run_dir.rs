//! The run directory (`/run/ebpf-portmap`), where the pin roots' locks and
//! records live: a symbolic link planted at a lock's path is never
//! followed, and a run directory others can write to is refused with an
//! error naming it and the fix, by real plugin runs. Needs root.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use portmap_tests::bpffs::{RUN_DIR, lock_file};
use portmap_tests::cni::CniCommand;
use portmap_tests::world::{FakeContainer, World};
use portmap_tests::{PortMapping, plugin_bin};

/// Removes a path on drop (also when an assertion fails), so a planted
/// link never outlives its test.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A link planted at the lock's path, pointing at a file that does not
/// exist: an open that followed it would create that file.
#[test]
fn a_link_planted_at_the_lock_is_not_followed() {
    let world = World::plugin_only();
    let container = FakeContainer::new(&world, "planted", 0, vec![PortMapping::tcp(7120, 80)]);
    let lock = lock_file(world.pins.path());
    let target = world.node.data_dir().join("lock-target");
    std::fs::create_dir_all(RUN_DIR).expect("the run directory");
    let _ = std::fs::remove_file(&lock);
    std::os::unix::fs::symlink(&target, &lock).expect("plant a link at the lock");
    let planted = Removed(lock.clone());

    let failure = match world.exec_ours(CniCommand::Add, &container.rt, Some(&container.prev)) {
        Ok(out) => panic!("ADD locked through a planted link: {out:?}"),
        Err(failure) => failure,
    };
    let msg = failure.error_msg().unwrap_or_default();
    assert!(
        msg.contains(&lock.display().to_string()) && msg.contains("not a regular file"),
        "the error names the lock and what is wrong: {failure}"
    );
    assert!(
        !target.exists(),
        "the link was followed: {} was created",
        target.display()
    );
    assert!(
        std::fs::symlink_metadata(&lock).is_ok_and(|m| m.file_type().is_symlink()),
        "the planted link is left for the operator to see"
    );

    drop(planted);
    container.add(&world).expect("ADD once the link is gone");
    assert!(
        std::fs::symlink_metadata(&lock).is_ok_and(|m| m.file_type().is_file()),
        "the lock is a plain file again"
    );
    container.del(&world).expect("DEL");
}

/// Records are written to new files of unpredictable names: links planted
/// at the temporary names older builds used beside a record
/// (`{hash}.local-addrs-new`, `{hash}.ifaces-new`, `{hash}.root-{pid}` is
/// the PID's and not guessable here) are never written through.
#[test]
fn links_planted_at_predictable_temporary_names_are_not_followed() {
    let world = World::plugin_only();
    let container = FakeContainer::new(&world, "temporary", 0, vec![PortMapping::tcp(7122, 80)]);
    let lock = lock_file(world.pins.path());
    std::fs::create_dir_all(RUN_DIR).expect("the run directory");
    let mut planted = Vec::new();
    for extension in ["local-addrs-new", "ifaces-new", "interfaces-new"] {
        let path = lock.with_extension(extension);
        let target = world.node.data_dir().join(extension);
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(&target, &path).expect("plant a link");
        planted.push((Removed(path), target));
    }
    container.add(&world).expect("ADD");
    for (link, target) in &planted {
        assert!(
            !target.exists(),
            "written through the link {}: {} was created",
            link.0.display(),
            target.display()
        );
    }
    let record = portmap_tests::bpffs::local_addrs_record(world.pins.path());
    assert!(
        std::fs::symlink_metadata(&record).is_ok_and(|m| m.file_type().is_file()),
        "ADD recorded the node's addresses in {}",
        record.display()
    );
    container.del(&world).expect("DEL");
}

/// Runs ADD of `container` with a group-writable run directory: a tmpfs of
/// mode 0775 over `/run/ebpf-portmap` in a private mount namespace, so the
/// machine's own run directory (other tests' locks) is left as it is.
fn add_with_writable_run_dir(world: &World, container: &FakeContainer) -> Output {
    let config = world.our_config(&container.rt, Some(&container.prev));
    let script = format!(
        "mkdir -p -m 0700 {RUN_DIR} && mount -t tmpfs -o mode=0775 epm-run {RUN_DIR} && exec \"$0\""
    );
    let mut child = world
        .node
        .ns
        .command("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .arg(plugin_bin())
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", &container.rt.container_id)
        .env("CNI_NETNS", &container.rt.netns_path)
        .env("CNI_IFNAME", &container.rt.ifname)
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn unshare");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(config.to_string().as_bytes())
        .expect("write the config");
    drop(stdin);
    child.wait_with_output().expect("wait")
}

#[test]
fn a_group_writable_run_directory_is_refused() {
    let world = World::plugin_only();
    let container = FakeContainer::new(&world, "writable", 0, vec![PortMapping::tcp(7121, 80)]);
    let out = add_with_writable_run_dir(&world, &container);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "ADD ran with a group-writable run directory\nstdout: {stdout}\nstderr: {stderr}"
    );
    let error: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("no CNI error object ({e})\nstdout: {stdout}\nstderr: {stderr}")
    });
    let msg = error["msg"].as_str().unwrap_or_default();
    for part in [RUN_DIR, "group- or world-writable", "chmod go-w"] {
        assert!(msg.contains(part), "the error names {part:?}: {error:#}");
    }
    // (The pin root's namespace marker is pinned before the lock is taken.)
    let mappings = world.pins.path().join("v1/maps/mappings");
    assert!(!mappings.exists(), "a refused ADD loaded the dataplane");
    assert!(
        Path::new(RUN_DIR).exists(),
        "the machine's run directory is still there"
    );
    // The machine's own run directory (0700) serves as before.
    container
        .add(&world)
        .expect("ADD with the real run directory");
    container.del(&world).expect("DEL");
}
