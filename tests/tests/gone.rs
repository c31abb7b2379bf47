//! A container whose network namespace is gone and whose DEL never comes
//! (a rollback to a plugin that does not know us, a runtime bug, a crashed
//! node): ADD recorded `CNI_NETNS`, the namespace's identity and the pod's
//! `K8S_POD_UID`; `list`, `status` and the agent's metric mark the
//! mapping; the agent's GC removes it after its grace period and logs the
//! container and pod; a namespace whose path is gone but that a bind mount
//! elsewhere still holds is alive, and its mapping stays.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use portmap_tests::PortMapping;
use portmap_tests::agent::{Agent, sample};
use portmap_tests::world::World;
use serde_json::Value;

const GONE_PORT: u16 = 18480;
const KEPT_PORT: u16 = 18481;
/// Short, so the test is: the agent's GC timer and grace period.
const GC_INTERVAL: &str = "1";
const GRACE_SECS: u64 = 3;

/// A bind mount of a namespace file, unmounted (and its file removed) on
/// drop, also when the test fails.
struct BindMount(PathBuf);

impl BindMount {
    fn new(source: &Path, target: PathBuf) -> BindMount {
        std::fs::write(&target, b"").expect("mount point file");
        let guard = BindMount(target);
        let out = Command::new("mount")
            .arg("--bind")
            .arg(source)
            .arg(&guard.0)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mount --bind {} {}: {}",
            source.display(),
            guard.0.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        guard
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).output();
        let _ = std::fs::remove_file(&self.0);
    }
}

fn rows_of(list: &Value, port: u16) -> Vec<&Value> {
    list.as_array()
        .expect("list --json is an array")
        .iter()
        .filter(|row| row["hostPort"] == port)
        .collect()
}

fn pod_args(name: &str, uid: &str) -> Vec<(String, String)> {
    vec![
        ("IgnoreUnknown".into(), "1".into()),
        ("K8S_POD_NAMESPACE".into(), "shop".into()),
        ("K8S_POD_NAME".into(), name.into()),
        ("K8S_POD_UID".into(), uid.into()),
    ]
}

#[test]
fn a_container_whose_namespace_is_gone_is_marked_then_removed_by_the_agent() {
    let world = World::bridge();
    let gone = world.node.add_container("gone");
    let kept = world.node.add_container("kept");
    let gone_id = gone.id.clone();
    let kept_id = kept.id.clone();
    for (container, port, name, uid) in [
        (&gone, GONE_PORT, "web-0", "uid-gone-0001"),
        (&kept, KEPT_PORT, "db-0", "uid-kept-0002"),
    ] {
        let mut rt = container.with_port_mappings(&[PortMapping::tcp(port, 80)]);
        rt.cni_args = pod_args(name, uid);
        world
            .runner
            .add(&world.list, &rt)
            .unwrap_or_else(|e| panic!("ADD {}: {e}\n{}", container.id, world.dump()));
    }
    let gone_path = gone.ns.path().to_path_buf();
    let list = world.list();
    for row in rows_of(&list, GONE_PORT) {
        assert_eq!(
            row["podUID"], "uid-gone-0001",
            "list shows the pod UID: {row}"
        );
        assert_eq!(row["containerState"], "alive", "{row}");
        assert_eq!(
            row["netns"],
            gone_path.display().to_string(),
            "the CNI_NETNS of the ADD: {row}"
        );
    }

    // The kept container's namespace outlives its path: a bind mount
    // elsewhere holds it (as a runtime that moved it would).
    let _held = BindMount::new(kept.ns.path(), world.node.data_dir().join("kept-netns"));
    drop(gone);
    drop(kept);
    assert!(!gone_path.exists(), "the container's namespace is deleted");

    let list = world.list();
    let gone_rows = rows_of(&list, GONE_PORT);
    assert!(
        !gone_rows.is_empty(),
        "no DEL came: the mapping is still there: {list:#}"
    );
    for row in &gone_rows {
        assert_eq!(row["containerState"], "gone", "{row}");
        assert!(
            row["containerNote"]
                .as_str()
                .is_some_and(|note| note.contains("container namespace gone")),
            "list -o json says why: {row}"
        );
    }
    for row in rows_of(&list, KEPT_PORT) {
        assert_eq!(
            row["containerState"], "alive",
            "a namespace held by a bind mount is alive although its path is gone: {row}"
        );
    }
    let text = world.operator(&["list"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("container namespace gone")
            && text.contains(&gone_id[..gone_id.len().min(12)]),
        "list names the container whose namespace is gone:\n{text}"
    );
    let status = world.operator(&["status", "--json"]);
    let status: Value = serde_json::from_slice(&status.stdout).expect("status --json");
    let notes = status["notes"].to_string();
    assert!(
        notes.contains(&gone_id) && notes.contains("container namespace gone"),
        "status notes the gone container within the grace period: {notes}"
    );
    assert!(
        !status["notes"].to_string().contains(&kept_id)
            && !status["problems"].to_string().contains(&kept_id),
        "nothing is said of the live one: {status:#}"
    );

    // The operator's gc waits for the grace period, and records the first
    // sighting the agent then goes by: the grace period counts from here.
    let sighted = Instant::now();
    let out = world.operator(&["gc", "--gone", "--gone-grace", "3600"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains(&format!("kept the mappings of container {gone_id}")),
        "gc --gone keeps it within the grace period: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        rows_of(&world.list(), GONE_PORT)
            .iter()
            .all(|row| row["containerGoneSince"].is_string()),
        "list gives when a GC first found it gone"
    );

    let grace = GRACE_SECS.to_string();
    let agent = Agent::start_with(
        &world,
        &["--gc-interval", GC_INTERVAL, "--gone-grace", &grace],
    );
    let metric = |agent: &Agent| {
        sample(
            &agent.metrics(),
            "ebpf_portmap_mappings_container_gone",
            &[],
        )
    };
    assert_eq!(
        metric(&agent),
        Some(gone_rows.len() as f64),
        "the metric counts the gone container's mappings\n{}",
        agent.log_text()
    );

    let deadline = sighted + Duration::from_secs(GRACE_SECS + 12);
    loop {
        if rows_of(&world.list(), GONE_PORT).is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not remove the gone container's mapping within {:?}\n{}\n{}",
            deadline - sighted,
            agent.log_text(),
            world.dump()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The sighting is kept in whole seconds of the clock (rounded down),
    // and so is the agent's reading of it: the grace period can end up to
    // a second before GRACE_SECS of real time have passed, never sooner.
    let took = sighted.elapsed();
    assert!(
        took >= Duration::from_secs(GRACE_SECS - 1),
        "removed after {took:?}, before the grace period of {GRACE_SECS}s (kept in whole seconds)"
    );
    let log = agent.log_text();
    let removal = log
        .lines()
        .find(|line| line.contains("removed") && line.contains(&gone_id))
        .unwrap_or_else(|| panic!("the agent logs the removal naming the container:\n{log}"));
    assert!(
        removal.contains("shop/web-0") && removal.contains("uid-gone-0001"),
        "the removal names the pod and its UID: {removal}"
    );

    // One more GC period at least: the live one stays.
    std::thread::sleep(Duration::from_millis(2500));
    let list = world.list();
    let kept_rows = rows_of(&list, KEPT_PORT);
    assert!(
        !kept_rows.is_empty(),
        "a mapping whose namespace is alive is never removed\n{}",
        agent.log_text()
    );
    assert_eq!(metric(&agent), Some(0.0), "{}", agent.log_text());
    // The kept container goes as a runtime's GC would remove it.
    let out = world.operator(&["gc", "--network", world.list.name(), "--keep-none"]);
    assert!(
        out.status.success(),
        "gc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
