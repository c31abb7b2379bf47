//! Bad input and security: every malformed request is refused with a CNI
//! error object (right code, a message that says what to fix), a non-zero
//! exit and no panic, and changes no map. Needs root.

use std::io::Write;
use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use portmap_tests::traffic::tcp_echo_server;
use portmap_tests::world::{FakeContainer, World, fake_prev_result};
use portmap_tests::{Conflist, PortMapping, plugin_bin};
use serde_json::{Value, json};

/// Every pinned map that holds state.
const ALL_MAPS: [&str; 4] = ["mappings", "owners", "owner_slots", "conntrack"];

fn snapshot(world: &World) -> Vec<Value> {
    ALL_MAPS.iter().map(|m| world.dump_map(m)).collect()
}

/// A world whose only plugin is ours, with `extra` keys in its config.
fn world_with(extra: Value) -> World {
    World::with(|name, pins, data| {
        let mut plugin = json!({
            "type": "ebpf-portmap",
            "capabilities": {"portMappings": true},
            "pinRoot": pins,
            "cgroupPath": portmap_tests::cgroup::cgroup_for_pin_root(pins),
            "logFile": data.join(portmap_tests::topology::PLUGIN_LOG),
        });
        if let (Some(plugin), Some(extra)) = (plugin.as_object_mut(), extra.as_object()) {
            plugin.extend(extra.clone());
        }
        Conflist::from_json(json!({"cniVersion": "1.1.0", "name": name, "plugins": [plugin]}))
            .expect("conflist")
    })
}

/// Runs the plugin in the node namespace with exactly `env` and `stdin`.
fn invoke(world: &World, env: &[(&str, String)], stdin: &[u8]) -> Output {
    let mut command = world.node.ns.command(plugin_bin());
    command
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("spawn ebpf-portmap");
    let mut pipe = child.stdin.take().expect("stdin");
    // A refused oversized input may close the pipe early.
    let _ = pipe.write_all(stdin);
    drop(pipe);
    child.wait_with_output().expect("wait")
}

struct Request {
    env: Vec<(&'static str, String)>,
    config: Value,
}

impl Request {
    /// A valid ADD; each case breaks one thing.
    fn add(world: &World) -> Request {
        let netns = world.node.ns.path().display().to_string();
        let prev = fake_prev_result(
            world.node.ns.path(),
            "eth0",
            Some("10.250.0.2".parse().unwrap()),
            Some("fd50::2".parse().unwrap()),
        );
        let mut config = world.our_plugin().clone();
        config["cniVersion"] = json!("1.1.0");
        config["name"] = json!("epm-test");
        config["runtimeConfig"] = json!({"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 8081, "containerPort": 81, "protocol": "udp"},
        ]});
        config["prevResult"] = prev;
        Request {
            env: vec![
                ("CNI_COMMAND", "ADD".into()),
                ("CNI_CONTAINERID", "victim".into()),
                ("CNI_NETNS", netns),
                ("CNI_IFNAME", "eth0".into()),
                ("CNI_PATH", "/usr/lib/cni".into()),
            ],
            config,
        }
    }

    fn env(mut self, key: &'static str, value: Option<&str>) -> Request {
        self.env.retain(|(k, _)| *k != key);
        if let Some(value) = value {
            self.env.push((key, value.to_owned()));
        }
        self
    }

    /// Sets (or adds) the value at a JSON pointer whose parent exists.
    fn set(mut self, pointer: &str, value: Value) -> Request {
        let (parent, key) = pointer.rsplit_once('/').expect("pointer");
        self.config
            .pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .unwrap_or_else(|| panic!("no object at {parent:?}"))
            .insert(key.to_owned(), value);
        self
    }

    fn remove(mut self, pointer: &str) -> Request {
        let (parent, key) = pointer.rsplit_once('/').expect("pointer");
        self.config
            .pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .expect("object")
            .remove(key);
        self
    }

    fn mappings(self, mappings: Value) -> Request {
        self.set("/runtimeConfig/portMappings", mappings)
    }

    fn stdin(&self) -> Vec<u8> {
        self.config.to_string().into_bytes()
    }
}

struct Case {
    what: &'static str,
    request: Request,
    /// Raw stdin instead of the request's config.
    raw: Option<Vec<u8>>,
    code: u64,
    /// Words the message must contain so the user knows what to fix.
    mentions: &'static [&'static str],
}

fn case(
    what: &'static str,
    request: Request,
    code: u64,
    mentions: &'static [&'static str],
) -> Case {
    Case {
        what,
        request,
        raw: None,
        code,
        mentions,
    }
}

fn raw(
    what: &'static str,
    request: Request,
    stdin: &[u8],
    code: u64,
    mentions: &'static [&'static str],
) -> Case {
    Case {
        what,
        request,
        raw: Some(stdin.to_vec()),
        code,
        mentions,
    }
}

fn mapping(host_port: Value, container_port: Value, protocol: Value) -> Value {
    json!([{"hostPort": host_port, "containerPort": container_port, "protocol": protocol}])
}

#[test]
fn every_malformed_request_is_refused_cleanly_and_changes_nothing() {
    let world = world_with(json!({}));
    // A live container first, so the maps exist and hold state to protect.
    let holder = Request::add(&world)
        .env("CNI_CONTAINERID", Some("holder"))
        .mappings(json!([{"hostPort": 7000, "containerPort": 80}]));
    let out = invoke(&world, &holder.env, &holder.stdin());
    assert!(
        out.status.success(),
        "setup ADD: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let before = snapshot(&world);

    let r = || Request::add(&world);
    let many: Vec<Value> = (0..17)
        .map(|i| json!({"hostPort": 10000 + i, "containerPort": 80}))
        .collect();
    let huge = vec![b' '; (1 << 20) + 10];
    let cases = vec![
        // Environment.
        case("empty CNI_COMMAND", r().env("CNI_COMMAND", Some("")), 4, &["CNI_COMMAND"]),
        case("unknown CNI_COMMAND", r().env("CNI_COMMAND", Some("ADDD")), 4, &["CNI_COMMAND", "ADDD"]),
        case("lower-case CNI_COMMAND", r().env("CNI_COMMAND", Some("add")), 4, &["CNI_COMMAND"]),
        case("no CNI_CONTAINERID", r().env("CNI_CONTAINERID", None), 4, &["CNI_CONTAINERID"]),
        case("slash in CNI_CONTAINERID", r().env("CNI_CONTAINERID", Some("a/b")), 4, &["CNI_CONTAINERID"]),
        case("CNI_CONTAINERID starts with -", r().env("CNI_CONTAINERID", Some("-x")), 4, &["CNI_CONTAINERID"]),
        case("space in CNI_CONTAINERID", r().env("CNI_CONTAINERID", Some("a b")), 4, &["CNI_CONTAINERID"]),
        case("no CNI_NETNS", r().env("CNI_NETNS", None), 4, &["CNI_NETNS"]),
        case("CNI_NETNS that does not exist", r().env("CNI_NETNS", Some("/run/netns/epm-nope-0")), 3, &["/run/netns/epm-nope-0"]),
        case("no CNI_IFNAME", r().env("CNI_IFNAME", None), 4, &["CNI_IFNAME"]),
        case("CNI_IFNAME too long", r().env("CNI_IFNAME", Some("eth0123456789abc")), 4, &["CNI_IFNAME"]),
        case("slash in CNI_IFNAME", r().env("CNI_IFNAME", Some("eth/0")), 4, &["CNI_IFNAME"]),
        case("no CNI_PATH", r().env("CNI_PATH", None), 4, &["CNI_PATH"]),
        // Encoding.
        raw("empty stdin", r(), b"", 6, &[]),
        raw("truncated JSON", r(), br#"{"cniVersion":"1.1.0","name":"#, 6, &[]),
        raw("JSON array", r(), b"[]", 6, &[]),
        raw("invalid UTF-8", r(), b"{\"cniVersion\":\"\xff\xfe\"}", 6, &[]),
        raw("more than 1 MiB of stdin", r(), &huge, 6, &[]),
        // Versions.
        case("no cniVersion", r().remove("/cniVersion"), 1, &["cniVersion"]),
        case("unknown cniVersion", r().set("/cniVersion", json!("9.9.9")), 1, &["9.9.9"]),
        case("numeric cniVersion", r().set("/cniVersion", json!(1)), 1, &["cniVersion"]),
        case("CHECK on 0.3.1", r().env("CNI_COMMAND", Some("CHECK")).set("/cniVersion", json!("0.3.1")), 1, &["CHECK"]),
        case("GC on 1.0.0", r().env("CNI_COMMAND", Some("GC")).set("/cniVersion", json!("1.0.0")), 1, &["GC"]),
        // Network configuration.
        case("no name", r().remove("/name"), 7, &["name"]),
        case("slash in name", r().set("/name", json!("a/b")), 7, &["name"]),
        case("no type", r().remove("/type"), 7, &["type"]),
        case("relative pinRoot", r().set("/pinRoot", json!("relative/dir")), 7, &["pinRoot"]),
        case("numeric pinRoot", r().set("/pinRoot", json!(5)), 7, &["pinRoot"]),
        case("interfaces not a list", r().set("/interfaces", json!("eth0")), 7, &["interfaces"]),
        case("bad interface name", r().set("/interfaces", json!(["a b"])), 7, &["interfaces"]),
        case("conntrackSize a string", r().set("/conntrackSize", json!("big")), 7, &["conntrackSize"]),
        case("maxMappings zero", r().set("/maxMappings", json!(0)), 7, &["maxMappings"]),
        case("containerSockets a string", r().set("/containerSockets", json!("yes")), 7, &["containerSockets", "not true or false"]),
        case("runtimeConfig not an object", r().set("/runtimeConfig", json!([])), 7, &["runtimeConfig"]),
        case("portMappings not a list", r().mappings(json!({"hostPort": 80})), 7, &["portMappings"]),
        // Upstream portmap's conditions: the forms ebpf-portmap cannot
        // enforce are refused, naming the argument.
        case("conditionsV4 with a match", r().set("/conditionsV4", json!(["-m", "set", "--match-set", "x", "src"])), 7, &["conditionsV4[0]", "\"-m\" is not supported", "supported are"]),
        case("conditionsV6 with an IPv4 source", r().set("/conditionsV6", json!(["!", "-s", "10.0.0.0/8"])), 7, &["conditionsV6[2]", "IPv4"]),
        case("conditionsV4 -o on STATUS", r().env("CNI_COMMAND", Some("STATUS")).set("/conditionsV4", json!(["-o", "eth0"])), 7, &["conditionsV4[0]", "output interface"]),
        // Port mappings.
        case("hostPort 0", r().mappings(mapping(json!(0), json!(80), json!("tcp"))), 7, &["hostPort", "0"]),
        case("hostPort negative", r().mappings(mapping(json!(-1), json!(80), json!("tcp"))), 7, &["hostPort"]),
        case("hostPort 65536", r().mappings(mapping(json!(65536), json!(80), json!("tcp"))), 7, &["hostPort", "65536"]),
        // containerd's (go-cni's) spelling: errors quote the key as written.
        case("HostPort 0 (Go field names)", r().mappings(json!([{"HostPort": 0, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}])), 7, &["runtimeConfig.portMappings[0].HostPort", "0"]),
        case("HostIP not an address (Go field names)", r().mappings(json!([{"HostPort": 80, "ContainerPort": 80, "Protocol": "tcp", "HostIP": "nope"}])), 7, &["runtimeConfig.portMappings[0].HostIP", "nope"]),
        case("Protocol unknown (Go field names)", r().mappings(json!([{"HostPort": 80, "ContainerPort": 80, "Protocol": "ICMP", "HostIP": ""}])), 7, &["runtimeConfig.portMappings[0].Protocol", "ICMP"]),
        case("ContainerPort missing (Go field names)", r().mappings(json!([{"HostPort": 80, "Protocol": "tcp", "HostIP": ""}])), 7, &["runtimeConfig.portMappings[0].containerPort is missing"]),
        case("hostPort a string", r().mappings(mapping(json!("80"), json!(80), json!("tcp"))), 7, &["hostPort"]),
        case("hostPort 80.5", r().mappings(mapping(json!(80.5), json!(80), json!("tcp"))), 7, &["hostPort"]),
        case("containerPort 0", r().mappings(mapping(json!(8080), json!(0), json!("tcp"))), 7, &["containerPort"]),
        case("no containerPort", r().mappings(json!([{"hostPort": 8080}])), 7, &["containerPort"]),
        case("unknown protocol", r().mappings(mapping(json!(8080), json!(80), json!("icmp"))), 7, &["icmp"]),
        case("numeric protocol", r().mappings(mapping(json!(8080), json!(80), json!(6))), 7, &["protocol"]),
        case("hostIP not an IP", r().mappings(json!([{"hostPort": 8080, "containerPort": 80, "hostIP": "node-1"}])), 7, &["hostIP", "node-1"]),
        case(
            "hostIP of a family the container lacks",
            r().mappings(json!([{"hostPort": 8080, "containerPort": 80, "hostIP": "fd18::1"}]))
                .set("/prevResult", fake_prev_result(Path::new("/run/netns/x"), "eth0", Some("10.250.0.2".parse::<IpAddr>().unwrap()), None)),
            7,
            &["fd18::1"],
        ),
        case(
            "duplicate mappings",
            r().mappings(json!([{"hostPort": 8080, "containerPort": 80}, {"hostPort": 8080, "containerPort": 80}])),
            7,
            &["8080"],
        ),
        case(
            "conflicting mappings in one request",
            r().mappings(json!([{"hostPort": 8080, "containerPort": 80}, {"hostPort": 8080, "containerPort": 81}])),
            7,
            &["8080"],
        ),
        case(
            "more mappings than maxMappings",
            r().mappings(Value::Array(many)).set("/maxMappings", json!(16)),
            7,
            &["17 entries", "maxMappings 16"],
        ),
        // prevResult.
        case("no prevResult", r().remove("/prevResult"), 7, &["prevResult"]),
        case(
            "prevResult without the interface",
            r().set("/prevResult", json!({"cniVersion": "1.1.0", "interfaces": [{"name": "eth9", "sandbox": "/x"}], "ips": [{"interface": 0, "address": "10.250.0.2/24"}]})),
            7,
            &["eth0"],
        ),
        case("prevResult without IPs", r().set("/prevResult", json!({"cniVersion": "1.1.0", "interfaces": [], "ips": []})), 7, &["eth0"]),
        // Valid syntax, impossible on this node: refused by the plugin itself.
        case("an interface the node lacks", r().set("/interfaces", json!(["nosuchif0"])), 7, &["nosuchif0"]),
    ];
    assert!(
        cases.len() >= 40,
        "the issue asks for at least 40 bad inputs"
    );

    for case in &cases {
        let stdin = case.raw.clone().unwrap_or_else(|| case.request.stdin());
        let out = invoke(&world, &case.request.env, &stdin);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{}: must exit non-zero, printed {stdout}",
            case.what
        );
        assert!(
            !stderr.contains("panicked"),
            "{}: panicked: {stderr}",
            case.what
        );
        let error: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "{}: stdout is not one JSON document ({e}): {stdout:?}",
                case.what
            )
        });
        assert_eq!(
            error["code"].as_u64(),
            Some(case.code),
            "{}: wrong code in {error}",
            case.what
        );
        let msg = error["msg"].as_str().unwrap_or_default();
        assert!(!msg.is_empty(), "{}: empty message", case.what);
        for word in case.mentions {
            assert!(
                msg.contains(word),
                "{}: message {msg:?} should mention {word:?}",
                case.what
            );
        }
        assert_eq!(
            snapshot(&world),
            before,
            "{}: a refused request changed a map",
            case.what
        );
    }
    println!("{} bad inputs refused", cases.len());
}

#[test]
fn pins_are_private_to_root() {
    let world = world_with(json!({}));
    let request = Request::add(&world);
    let out = invoke(&world, &request.env, &request.stdin());
    assert!(
        out.status.success(),
        "ADD: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let mut checked = 0;
    let mut stack = vec![world.pins.path().join("v1")];
    while let Some(path) = stack.pop() {
        let meta = std::fs::metadata(&path).expect("stat");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(meta.uid(), 0, "{} is owned by root", path.display());
        assert_eq!(
            meta.mode() & 0o077,
            0,
            "{} is reachable by others: {:o}",
            path.display(),
            meta.mode()
        );
        checked += 1;
        if meta.is_dir() {
            stack.extend(
                std::fs::read_dir(&path)
                    .expect("read dir")
                    .map(|e| e.expect("entry").path()),
            );
        }
    }
    assert!(checked > 8, "maps, programs and links were all checked");
    // An unprivileged process (as a container's would be) cannot read them.
    let map = world.pins.path().join("v1/maps/mappings");
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "bpftool",
            "map",
            "dump",
            "pinned",
        ])
        .arg(&map)
        .output()
        .expect("setpriv");
    assert!(
        !out.status.success(),
        "nobody could dump the mappings: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn without_capabilities_the_plugin_refuses_before_changing_anything() {
    let world = world_with(json!({}));
    let holder = Request::add(&world).env("CNI_CONTAINERID", Some("holder"));
    assert!(
        invoke(&world, &holder.env, &holder.stdin())
            .status
            .success()
    );
    let before = snapshot(&world);
    let request = Request::add(&world)
        .env("CNI_CONTAINERID", Some("nocaps"))
        .mappings(json!([{"hostPort": 9000, "containerPort": 80}]));
    let mut command = world.node.ns.command("setpriv");
    command
        .args(["--inh-caps=-all", "--bounding-set=-all", "--"])
        .arg(plugin_bin())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in &request.env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&request.stdin())
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    let error: Value = serde_json::from_slice(&out.stdout).expect("a CNI error document");
    assert!(!out.status.success());
    assert_eq!(error["code"], 104, "privilege error: {error}");
    assert!(
        error["msg"].as_str().unwrap_or_default().contains("CAP_"),
        "names the capability: {error}"
    );
    assert_eq!(snapshot(&world), before, "nothing changed");
}

#[test]
fn a_host_port_a_node_service_listens_on_is_refused() {
    let world = world_with(json!({}));
    // A node service on 8080 (the test binary itself holds the socket).
    let _service = tcp_echo_server(&world.node.ns, 8080, "node-service");
    let warm = Request::add(&world)
        .env("CNI_CONTAINERID", Some("warm"))
        .mappings(json!([{"hostPort": 7000, "containerPort": 80}]));
    assert!(invoke(&world, &warm.env, &warm.stdin()).status.success());
    let before = snapshot(&world);

    let request = Request::add(&world).mappings(json!([{"hostPort": 8080, "containerPort": 80}]));
    let out = invoke(&world, &request.env, &request.stdin());
    let error: Value = serde_json::from_slice(&out.stdout).expect("error document");
    assert_eq!(error["code"], 105, "host port in use: {error}");
    let msg = error["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains("8080/tcp") && msg.contains("hostPortListeners"),
        "{msg}"
    );
    assert_eq!(snapshot(&world), before, "nothing changed");

    // The operator can choose otherwise.
    let allowing = world_with(json!({"hostPortListeners": "allow"}));
    let _service = tcp_echo_server(&allowing.node.ns, 8080, "node-service");
    let request =
        Request::add(&allowing).mappings(json!([{"hostPort": 8080, "containerPort": 80}]));
    let out = invoke(&allowing, &request.env, &request.stdin());
    assert!(
        out.status.success(),
        "allowed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_runtimes_own_port_reservation_is_not_a_conflict() {
    let world = world_with(json!({}));
    // podman's conmon holds published ports open itself; stand in for it
    // with a listener whose process is called conmon.
    let dir = portmap_tests::tmp::TempDir::new("conmon");
    let conmon = dir.path().join("conmon");
    // A symlink, not a copy: the process name comes from the path executed,
    // and a freshly written copy can be ETXTBSY while parallel tests fork.
    std::os::unix::fs::symlink("/usr/bin/socat", &conmon).expect("link socat");
    let mut reservation = world
        .node
        .ns
        .command(&conmon)
        .args(["TCP-LISTEN:8080,reuseaddr", "/dev/null"])
        .spawn()
        .expect("start the stand-in conmon");
    // Wait until it listens.
    for _ in 0..100 {
        let out = world
            .node
            .ns
            .command("ss")
            .args(["-Htln", "sport = :8080"])
            .output()
            .expect("ss");
        if !out.stdout.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let request = Request::add(&world).mappings(json!([{"hostPort": 8080, "containerPort": 80}]));
    let out = invoke(&world, &request.env, &request.stdin());
    let _ = reservation.kill();
    let _ = reservation.wait();
    assert!(
        out.status.success(),
        "conmon's reservation is not a node service: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_full_mappings_map_fails_with_a_capacity_error_and_rolls_back() {
    let world = world_with(json!({"maxMappings": 16}));
    let filler = Request::add(&world)
        .env("CNI_CONTAINERID", Some("filler"))
        .mappings(Value::Array(
            (0..8)
                .map(|i| json!({"hostPort": 7000 + i, "containerPort": 80}))
                .collect(),
        ));
    let out = invoke(&world, &filler.env, &filler.stdin());
    assert!(
        out.status.success(),
        "16 entries fit: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let before = snapshot(&world);
    let request = Request::add(&world).mappings(json!([{"hostPort": 9000, "containerPort": 80}]));
    let out = invoke(&world, &request.env, &request.stdin());
    let error: Value = serde_json::from_slice(&out.stdout).expect("error document");
    assert_eq!(error["code"], 101, "capacity: {error}");
    assert!(
        error["msg"].as_str().unwrap_or_default().contains("full"),
        "{error}"
    );
    assert_eq!(
        snapshot(&world),
        before,
        "the failed ADD left nothing behind"
    );
}

#[test]
fn a_conflict_at_any_position_rolls_back_the_whole_request() {
    let world = world_with(json!({}));
    let ports = [8000u16, 8001, 8002, 8003];
    for (position, taken) in ports.iter().enumerate() {
        let holder = FakeContainer::new(&world, "holder", 1, vec![PortMapping::tcp(*taken, 80)]);
        holder.add(&world).expect("holder ADD");
        let before = snapshot(&world);
        let request = Request::add(&world).mappings(Value::Array(
            ports
                .iter()
                .map(|p| json!({"hostPort": p, "containerPort": 80}))
                .collect(),
        ));
        let out = invoke(&world, &request.env, &request.stdin());
        let error: Value = serde_json::from_slice(&out.stdout).expect("error document");
        assert_eq!(error["code"], 100, "position {position}: conflict: {error}");
        assert_eq!(
            snapshot(&world),
            before,
            "position {position}: nothing of the request stays"
        );
        holder.del(&world).expect("holder DEL");
    }
    world.assert_clean("after all positions");
}

#[test]
fn upstream_keys_without_use_here_are_accepted_with_one_warning() {
    let world = world_with(json!({
        "markMasqBit": 13,
        "externalSetMarkChain": "KUBE-MARK-MASQ",
        "backend": "nftables",
    }));
    let request = Request::add(&world);
    let out = invoke(&world, &request.env, &request.stdin());
    assert!(
        out.status.success(),
        "ADD with upstream keys: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let log = std::fs::read_to_string(
        world
            .node
            .data_dir()
            .join(portmap_tests::topology::PLUGIN_LOG),
    )
    .expect("the plugin's log");
    let warnings: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("a key of the upstream portmap plugin"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning per ADD: {warnings:#?}");
    for key in ["markMasqBit", "externalSetMarkChain", "backend", "iptables"] {
        assert!(
            warnings[0].contains(key),
            "the warning names {key}: {}",
            warnings[0]
        );
    }
    let del = request.env("CNI_COMMAND", Some("DEL"));
    let out = invoke(&world, &del.env, &del.stdin());
    assert!(
        out.status.success(),
        "DEL: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn del_after_an_add_refused_for_conditions_succeeds() {
    let world = world_with(json!({"conditionsV4": ["-m", "comment", "--comment", "x"]}));
    let add = Request::add(&world);
    let out = invoke(&world, &add.env, &add.stdin());
    assert!(!out.status.success(), "ADD with conditionsV4 is refused");
    // What a runtime sends next: DEL with the same configuration.
    let del = add.env("CNI_COMMAND", Some("DEL"));
    let out = invoke(&world, &del.env, &del.stdin());
    assert!(
        out.status.success(),
        "DEL after the refused ADD: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}
