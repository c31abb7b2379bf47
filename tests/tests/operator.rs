//! The operator verbs (`list`, `status`, `trace`, `gc`, `uninstall`) and the
//! plugin's log, checked against real state: a real bridge chain, real
//! traffic from the external client, and the kernel's own view (bpftool,
//! program and link IDs). Needs root; every test has its own namespaces,
//! pin root and log file.

#![allow(
    clippy::result_large_err,
    reason = "CniFailure carries the whole plugin exchange on purpose (see cni.rs)"
)]

use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use portmap_tests::cni::CniCommand;
use portmap_tests::operator::{
    BOUND, containerd_pod, eventually, fake_owner, hosts, json_of, log_lines, num, op, op_ok,
    readme_hand_run_json, row, status_json, tcx_world,
};
use portmap_tests::topology::{EXT_IP4, EXT_IP6, NODE_IP4, NODE_IP6};
use portmap_tests::traffic::{
    echo_reply, tcp_connect, tcp_echo_server, tcp_request, udp_echo_server, udp_request,
};
use portmap_tests::world::{PROBE, World, sock, trace_events, wait_bounded};
use portmap_tests::{PortMapping, RuntimeAttachment, plugin_bin};
use serde_json::{Value, json};

#[test]
fn list_shows_owners_counters_and_live_flows() {
    let world = tcx_world();
    let web = world.node.add_container("web");
    let api = world.node.add_container("api");
    let _web_tcp = tcp_echo_server(&web.ns, 80, "web");
    let _web_udp = udp_echo_server(&web.ns, 53, "web");
    let _api_tcp = tcp_echo_server(&api.ns, 80, "api");
    let web_mappings = [PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)];
    let api_mappings = [PortMapping::tcp(9090, 80)];
    world.add(&web, &web_mappings);
    world.add(&api, &api_mappings);

    let list = json_of(&world, &["list", "--json"]);
    assert_eq!(
        hosts(&list),
        [
            "0.0.0.0:5353/udp",
            "[::]:5353/udp",
            "0.0.0.0:8080/tcp",
            "[::]:8080/tcp",
            "0.0.0.0:9090/tcp",
            "[::]:9090/tcp"
        ],
        "sorted by port, protocol, family"
    );
    let web8080 = row(&list, "0.0.0.0:8080/tcp");
    assert_eq!(web8080["containerID"], "web");
    assert_eq!(web8080["ifname"], "eth0");
    assert_eq!(web8080["network"], world.list.name());
    assert_eq!(web8080["podNamespace"], Value::Null, "no CNI_ARGS, no pod");
    assert_eq!(web8080["podName"], Value::Null);
    assert_eq!(web8080["hostPort"], 8080);
    assert_eq!(web8080["protocol"], "tcp");
    assert_eq!(web8080["containerPort"], 80);
    assert!(
        web8080["containerIP"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.244.0.")),
        "the container address from host-local: {web8080:#}"
    );
    assert!(web8080["ageSeconds"].as_u64().is_some(), "{web8080:#}");
    for r in list.as_array().expect("array") {
        for key in ["packets", "bytes", "activeFlows"] {
            assert_eq!(num(r, key), 0, "no traffic yet: {r:#}");
        }
    }

    // A TCP connection over IPv4 that stays open while we look.
    let mut session =
        tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE).expect("connect to 8080");
    let mut payload_bytes = 0;
    for i in 0..3 {
        let payload = format!("request {i}");
        payload_bytes += payload.len() as u64 + 1;
        assert_eq!(
            session.request(&payload, PROBE).expect("request"),
            echo_reply("web", &payload)
        );
    }
    // One UDP exchange over IPv6.
    let query = "query";
    world.expect_answer(
        "UDP [fd18::1]:5353",
        udp_request(&world.node.ext, sock(NODE_IP6, 5353), query, PROBE),
        &echo_reply("web", query),
    );

    let list = json_of(&world, &["list", "--json"]);
    let tcp = row(&list, "0.0.0.0:8080/tcp");
    // SYN + one segment per request at least, and a SYN-ACK + an answer each.
    assert!(num(tcp, "packetsIn") >= 4, "{tcp:#}");
    assert!(num(tcp, "packetsOut") >= 4, "{tcp:#}");
    assert!(
        num(tcp, "bytesIn") > payload_bytes,
        "payload plus headers: {tcp:#}"
    );
    assert!(num(tcp, "bytesOut") > payload_bytes, "{tcp:#}");
    assert_eq!(num(tcp, "activeFlows"), 1, "the open connection: {tcp:#}");
    assert_eq!(
        num(tcp, "packets"),
        num(tcp, "packetsIn") + num(tcp, "packetsOut")
    );

    // UDP: bytes are whole frames at the tc hook (Ethernet, IPv6, UDP,
    // payload), so they are exact whatever the number of datagrams (the
    // probe re-sends while no answer came).
    let udp6 = row(&list, "[::]:5353/udp");
    assert!(
        num(udp6, "packetsIn") >= 1 && num(udp6, "packetsOut") >= 1,
        "{udp6:#}"
    );
    let frame = |payload: usize| (14 + 40 + 8 + payload) as u64;
    assert_eq!(
        num(udp6, "bytesIn"),
        num(udp6, "packetsIn") * frame(query.len()),
        "{udp6:#}"
    );
    assert_eq!(
        num(udp6, "bytesOut"),
        num(udp6, "packetsOut") * frame(echo_reply("web", query).len()),
        "{udp6:#}"
    );
    assert_eq!(num(udp6, "activeFlows"), 1, "{udp6:#}");
    for untouched in [
        "[::]:8080/tcp",
        "0.0.0.0:5353/udp",
        "0.0.0.0:9090/tcp",
        "[::]:9090/tcp",
    ] {
        let r = row(&list, untouched);
        assert_eq!(
            num(r, "packets"),
            0,
            "no traffic went to {untouched}: {r:#}"
        );
    }

    // Filters.
    assert_eq!(
        hosts(&json_of(&world, &["list", "--json", "--port", "5353"])),
        ["0.0.0.0:5353/udp", "[::]:5353/udp"]
    );
    assert_eq!(
        hosts(&json_of(&world, &["list", "--json", "--container", "ap"])),
        ["0.0.0.0:9090/tcp", "[::]:9090/tcp"],
        "--container matches an ID prefix"
    );
    assert_eq!(
        hosts(&json_of(
            &world,
            &["list", "--json", "--container", "web", "--port", "8080"]
        )),
        ["0.0.0.0:8080/tcp", "[::]:8080/tcp"]
    );
    assert_eq!(
        json_of(&world, &["list", "--json", "--port", "1"]),
        json!([])
    );

    // Not a terminal: plain tab-separated text, no colour codes.
    let text = op_ok(&world, &["list"]);
    assert!(
        !text.contains('\x1b'),
        "no escape codes in a pipe: {text:?}"
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "HOST\tCONTAINER\tOWNER\tPOD\tIFNAME\tNETWORK\tAGE\tPACKETS IN/OUT\tSOCK CONNECT/SENDMSG\tBYTES IN/OUT\tFLOWS"
    );
    let cells = |host: &str| -> Vec<String> {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("{host}\t")))
            .unwrap_or_else(|| panic!("a line for {host}: {text}"))
            .split('\t')
            .map(str::to_owned)
            .collect()
    };
    let tcp_cells = cells("0.0.0.0:8080/tcp");
    assert_eq!(tcp_cells[2], "web", "OWNER is the short container ID");
    assert_eq!(tcp_cells[3], "-", "POD: the runtime named none");
    assert_eq!(tcp_cells[10], "1", "FLOWS");
    // The UDP exchange is over, so its counters stand still.
    assert_eq!(
        cells("[::]:5353/udp")[7],
        format!("{}/{}", num(udp6, "packetsIn"), num(udp6, "packetsOut"))
    );
    drop(session);

    // DEL drops the owner's counters with its mappings.
    world.del(&web, &web_mappings);
    assert_eq!(
        hosts(&json_of(&world, &["list", "--json"])),
        ["0.0.0.0:9090/tcp", "[::]:9090/tcp"]
    );
    assert_eq!(
        world.dump_map("counters"),
        json!([]),
        "DEL removed the traffic counters of web"
    );
    world.del(&api, &api_mappings);
}

#[test]
fn status_reports_tcx_programs_fill_levels_and_counters() {
    let world = tcx_world();
    let (code, status) = status_json(&world);
    assert!(!code.success(), "nothing installed yet: {status:#}");
    assert_eq!(status["installed"], false);
    assert!(
        status["problems"][0]
            .as_str()
            .is_some_and(|p| p.contains("nothing is installed")),
        "{status:#}"
    );

    let web = world.node.add_container("web");
    let _tcp = tcp_echo_server(&web.ns, 80, "web");
    let mappings = [PortMapping::tcp(8080, 80)];
    world.add(&web, &mappings);
    for ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        world.expect_answer(
            &format!("TCP via {ip}"),
            tcp_request(&world.node.ext, sock(ip, 8080), "hi", PROBE),
            &echo_reply("web", "hi"),
        );
    }

    let (code, status) = status_json(&world);
    assert!(code.success(), "a healthy node exits 0: {status:#}");
    assert_eq!(status["healthy"], true);
    assert_eq!(status["problems"], json!([]));
    assert_eq!(status["attachMode"], "tcx");
    assert!(
        status["kernel"]
            .as_str()
            .is_some_and(|k| k.starts_with(char::is_numeric)),
        "{status:#}"
    );
    let eth0: Vec<&Value> = status["interfaces"]
        .as_array()
        .expect("interfaces")
        .iter()
        .filter(|i| i["interface"] == "eth0")
        .collect();
    assert_eq!(eth0.len(), 2, "ingress and egress on eth0: {status:#}");
    for (attachment, program) in eth0.iter().zip(["portmap_ingress", "portmap_egress"]) {
        assert_eq!(attachment["mode"], "tcx");
        assert_eq!(attachment["attached"], true);
        let id = num(attachment, "programID");
        // The kernel agrees: that program ID is our program.
        let shown = Command::new("bpftool")
            .args(["--json", "prog", "show", "id", &id.to_string()])
            .output()
            .expect("bpftool prog show");
        let shown: Value = serde_json::from_slice(&shown.stdout).expect("bpftool JSON");
        assert_eq!(shown["name"], program, "program {id}: {shown:#}");
        let pinned = status["programs"]
            .as_array()
            .expect("programs")
            .iter()
            .find(|p| p["name"] == program)
            .expect("the program is listed");
        assert_eq!(num(pinned, "id"), id);
        assert_eq!(pinned["currentBuild"], true);
    }

    let map = |name: &str| {
        status["maps"]
            .as_array()
            .expect("maps")
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("map {name} in {status:#}"))
            .clone()
    };
    assert_eq!(num(&map("mappings"), "entries"), 2, "IPv4 and IPv6 of 8080");
    assert_eq!(num(&map("mappings"), "maxEntries"), 65536);
    assert_eq!(num(&map("owners"), "entries"), 1);
    assert_eq!(num(&map("owner_slots"), "entries"), 2);
    assert_eq!(
        num(&map("counters"), "entries"),
        2,
        "both families saw traffic"
    );
    // The flows closed: their entries moved to the closed-flow table.
    assert!(
        num(&map("conntrack"), "entries") + num(&map("conntrack_close"), "entries") >= 4,
        "two entries per flow, two flows: {status:#}"
    );
    assert_eq!(map("stats")["entries"], Value::Null, "an array has no fill");

    // The node-wide counters agree with the per-mapping ones. The two are
    // read one after the other while the connections' last segments (the
    // client's final ACK) may still be on their way: read both again until
    // they agree or BOUND runs out, then compare the last reading.
    let sum = |list: &Value, key: &str| -> u64 {
        list.as_array()
            .expect("array")
            .iter()
            .map(|r| num(r, key))
            .sum()
    };
    let deadline = Instant::now() + BOUND;
    let (counters, list) = loop {
        let counters = status_json(&world).1["counters"].clone();
        let list = json_of(&world, &["list", "--json"]);
        let agree = num(&counters, "dnat_new") + num(&counters, "dnat") == sum(&list, "packetsIn")
            && num(&counters, "reply") == sum(&list, "packetsOut");
        if agree || Instant::now() > deadline {
            break (counters, list);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        num(&counters, "dnat_new") >= 2,
        "a new flow per family: {counters:#}"
    );
    assert_eq!(
        num(&counters, "dnat_new") + num(&counters, "dnat"),
        sum(&list, "packetsIn"),
        "{counters:#} {list:#}"
    );
    assert_eq!(num(&counters, "reply"), sum(&list, "packetsOut"));
    assert_eq!(num(&counters, "rewrite_failed"), 0);

    // Human form: the same facts, plain in a pipe.
    let text = String::from_utf8(op(&world, &["status"]).stdout).expect("UTF-8");
    assert!(text.contains("attach mode: tcx"), "{text}");
    assert!(text.contains("\nhealthy\n"), "{text}");
    assert!(!text.contains('\x1b'), "{text:?}");

    // Take the egress program off eth0 behind the plugin's back.
    let eth0_index = num(eth0[0], "ifindex");
    let egress_link = world
        .pins
        .path()
        .join(format!("v1/links/if{eth0_index}_egress"));
    std::fs::remove_file(&egress_link).expect("unpin eth0's egress link");
    let (code, status) = status_json(&world);
    assert!(!code.success(), "degraded exits non-zero: {status:#}");
    assert_eq!(
        status["problems"],
        json!(["eth0: no egress program attached"])
    );

    // The next ADD repairs it.
    let other = world.node.add_container("other");
    world.add(&other, &[PortMapping::tcp(9090, 80)]);
    let (code, status) = status_json(&world);
    assert!(code.success(), "repaired: {status:#}");
    world.del(&other, &[PortMapping::tcp(9090, 80)]);
    world.del(&web, &mappings);
}

#[test]
fn trace_shows_decisions_for_the_traced_port_only() {
    let world = tcx_world();
    let web = world.node.add_container("web");
    let _tcp = tcp_echo_server(&web.ns, 80, "web");
    let _udp = udp_echo_server(&web.ns, 53, "web");
    world.add(
        &web,
        &[PortMapping::tcp(8080, 80), PortMapping::udp(5353, 53)],
    );
    let container_ip =
        row(&json_of(&world, &["list", "--json"]), "0.0.0.0:8080/tcp")["containerIP"]
            .as_str()
            .expect("container IP")
            .to_owned();

    // Trace 8080 while UDP 5353 also flows: only 8080 shows.
    let trace = world.start_trace(&["--port", "8080", "--json", "--count", "4"], BOUND);
    world.expect_answer(
        "UDP 5353 while tracing 8080",
        udp_request(&world.node.ext, sock(NODE_IP4, 5353), "q", PROBE),
        &echo_reply("web", "q"),
    );
    let mut session = tcp_connect(&world.node.ext, sock(NODE_IP4, 8080), PROBE).expect("connect");
    let client = session.local_addr().expect("client address");
    assert_eq!(
        session.request("traced", PROBE).expect("request"),
        echo_reply("web", "traced")
    );
    let out = wait_bounded(trace, BOUND, "trace --count 4");
    assert!(
        out.status.success(),
        "trace: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = trace_events(&out);
    assert_eq!(events.len(), 4, "--count 4: {events:#?}");
    for event in &events {
        assert_eq!(event["protocol"], "tcp", "only port 8080: {event:#}");
        assert_eq!(event["interface"], "eth0");
    }
    let syn = &events[0];
    assert_eq!(syn["direction"], "ingress");
    // Over the fast path (EPM_TEST_FAST_PATH=1) a packet translated on its
    // way in is also handed straight to the container.
    let inbound = |decision: &str| {
        if portmap_tests::topology::fast_path_everywhere() {
            json!([decision, "fast-forward"])
        } else {
            json!([decision])
        }
    };
    assert_eq!(syn["decisions"], inbound("translated-new"));
    assert_eq!(syn["tcpFlags"], "S");
    assert_eq!(syn["from"], client.to_string());
    assert_eq!(syn["to"], format!("{NODE_IP4}:8080"));
    assert_eq!(syn["newTo"], format!("{container_ip}:80"));
    let syn_ack = &events[1];
    assert_eq!(syn_ack["direction"], "egress");
    assert_eq!(syn_ack["decisions"], json!(["reply"]));
    assert_eq!(syn_ack["from"], format!("{container_ip}:80"));
    assert_eq!(syn_ack["newFrom"], format!("{NODE_IP4}:8080"));
    assert_eq!(syn_ack["to"], client.to_string());
    // In the default configuration the first packet past the handshake
    // each way also asks the kernel's conntrack whether it holds the flow
    // (nothing in this node namespace uses conntrack: it does not).
    let asked = |decisions: &serde_json::Value| {
        *decisions == json!(["translated", "kernel-unconfirmed"])
            || *decisions == json!(["reply", "kernel-unconfirmed"])
    };
    // The client's ACK completes the handshake: the flow is assured.
    assert!(
        events[2]["decisions"]
            .as_array()
            .is_some_and(|d| d.contains(&json!("flow-assured"))),
        "the handshake's last packet assures the flow: {events:#?}"
    );
    let assured = |decisions: &serde_json::Value| {
        let mut decisions = decisions.clone();
        if let Some(list) = decisions.as_array_mut() {
            list.retain(|d| d != "flow-assured");
        }
        decisions
    };
    assert!(
        events[2..]
            .iter()
            .map(|e| assured(&e["decisions"]))
            .all(|d| d == inbound("translated")
                || d == json!(["reply"])
                || (!portmap_tests::topology::fast_path_everywhere() && asked(&d))),
        "the rest of the flow: {events:#?}"
    );
    let (_, status) = status_json(&world);
    assert_eq!(status["tracing"], Value::Null, "tracing is off again");
    drop(session);

    // A port nothing publishes: the trace says so.
    let trace = world.start_trace(&["--port", "7777", "--json", "--count", "1"], BOUND);
    let refused = tcp_request(&world.node.ext, sock(NODE_IP6, 7777), "x", PROBE);
    assert!(refused.is_err(), "nothing listens on 7777");
    let out = wait_bounded(trace, BOUND, "trace --port 7777");
    let events = trace_events(&out);
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["decisions"], json!(["no-mapping"]));
    assert_eq!(events[0]["to"], format!("[{NODE_IP6}]:7777"));
    assert_eq!(
        events[0]["from"]
            .as_str()
            .map(|f| f.starts_with(&format!("[{EXT_IP6}]:"))),
        Some(true)
    );

    // Ctrl-C ends a trace and switches tracing off; a second tracer is
    // refused while one runs.
    let trace = world.start_trace(&["--port", "8080"], BOUND);
    let second = op(&world, &["trace", "--port", "8080", "--count", "1"]);
    assert!(!second.status.success(), "one tracer at a time");
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("another trace is running"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(trace.id() as i32, libc::SIGINT) }, 0);
    let out = wait_bounded(trace, BOUND, "trace after SIGINT");
    assert!(
        out.status.success(),
        "Ctrl-C is a normal end: {}",
        out.status
    );
    let (_, status) = status_json(&world);
    assert_eq!(
        status["tracing"],
        Value::Null,
        "tracing is off after Ctrl-C"
    );

    // Human form of a traced connection.
    let trace = world
        .node
        .ns
        .command(plugin_bin())
        .args(["trace", "--port", "8080", "--count", "1", "--pin-root"])
        .arg(world.pins.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn trace");
    let pid = trace.id();
    eventually("trace on", || {
        status_json(&world).1["tracing"]["pid"] == pid
    });
    world.expect_answer(
        "TCP 8080",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "again", PROBE),
        &echo_reply("web", "again"),
    );
    let out = wait_bounded(trace, BOUND, "trace, human form");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let decisions = if portmap_tests::topology::fast_path_everywhere() {
        "translated-new, fast-forward"
    } else {
        "translated-new"
    };
    assert!(
        text.contains(&format!("eth0 ingress tcp {EXT_IP4}:"))
            && text.contains(&format!(
                "> {NODE_IP4}:8080 [S]: {decisions}, now to {container_ip}:80"
            )),
        "{text}"
    );
}

#[test]
fn uninstall_takes_everything_off_the_node() {
    let world = tcx_world();
    let web = world.node.add_container("web");
    let _tcp = tcp_echo_server(&web.ns, 80, "web");
    let mappings = [PortMapping::tcp(8080, 80)];
    world.add(&web, &mappings);
    let (_, status) = status_json(&world);
    let ids = |key: &str, field: &str| -> Vec<u64> {
        status[key]
            .as_array()
            .expect("array")
            .iter()
            .filter_map(|v| v[field].as_u64())
            .collect()
    };
    let programs = ids("programs", "id");
    let mut links = ids("interfaces", "linkID");
    links.extend(ids("otherLinks", "linkID"));
    let maps = ids("maps", "id");
    assert!(
        programs.len() >= 2,
        "tc ingress and egress at least: {status:#}"
    );
    assert!(
        links.len() >= 2,
        "eth0 ingress and egress at least: {status:#}"
    );

    let refused = op(&world, &["uninstall"]);
    assert!(!refused.status.success(), "mappings are still installed");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("still installed"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(
        world.pins.path().join("v1").exists(),
        "a refused uninstall changes nothing"
    );

    world.del(&web, &mappings);
    op_ok(&world, &["uninstall"]);
    assert!(
        !world.pins.path().join("v1").exists(),
        "no pins left: {:?}",
        world.pins.pins()
    );
    // Nothing holds our programs, links or maps any more: the kernel frees them.
    for (kind, list) in [("prog", &programs), ("link", &links), ("map", &maps)] {
        for id in list {
            eventually(&format!("{kind} {id} is freed"), || {
                !Command::new("bpftool")
                    .args([kind, "show", "id", &id.to_string()])
                    .output()
                    .expect("bpftool")
                    .status
                    .success()
            });
        }
    }
    let (code, status) = status_json(&world);
    assert!(!code.success());
    assert_eq!(status["installed"], false, "{status:#}");
    assert_eq!(status["interfaces"], json!([]));

    // The next ADD installs everything again.
    world.add(&web, &mappings);
    world.expect_answer(
        "TCP after reinstall",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "back", PROBE),
        &echo_reply("web", "back"),
    );
    let (code, status) = status_json(&world);
    assert!(code.success(), "{status:#}");
    // --force takes it off even with mappings.
    op_ok(&world, &["uninstall", "--force"]);
    assert!(!world.pins.path().join("v1").exists());
    assert!(
        tcp_request(
            &world.node.ext,
            sock(NODE_IP4, 8080),
            "gone",
            Duration::from_millis(700)
        )
        .is_err(),
        "no dataplane, no mapping"
    );
}

#[test]
fn the_plugin_logs_every_decision_with_the_container_id() {
    let world = World::plugin_only();
    let first = [PortMapping::tcp(8080, 80)];
    let (a, a_prev) = fake_owner(&world, "alpha", 2, &first);
    let (b, b_prev) = fake_owner(&world, "bravo", 3, &first);
    let ours =
        |command, rt: &RuntimeAttachment, prev: Option<&Value>| world.exec_ours(command, rt, prev);
    let added = ours(CniCommand::Add, &a, Some(&a_prev)).expect("ADD alpha");
    // stdout is the CNI result and nothing else.
    let result: Value =
        serde_json::from_str(&added.stdout).expect("ADD stdout is one JSON document");
    assert!(result.get("ips").is_some(), "{result:#}");
    ours(CniCommand::Check, &a, Some(&a_prev)).expect("CHECK alpha");
    let conflict = ours(CniCommand::Add, &b, Some(&b_prev)).expect_err("bravo wants alpha's port");
    assert!(
        conflict
            .stderr
            .contains("already mapped by container alpha"),
        "errors also go to stderr: {:?}",
        conflict.stderr
    );
    ours(CniCommand::Del, &b, None).expect("DEL bravo");
    ours(CniCommand::Del, &a, None).expect("DEL alpha");
    world
        .runner
        .gc(&world.list, &[])
        .unwrap_or_else(|e| panic!("GC: {e}"));

    let lines = log_lines(world.node.data_dir());
    let find = |needles: &[&str]| {
        lines
            .iter()
            .find(|l| needles.iter().all(|n| l.contains(n)))
            .unwrap_or_else(|| panic!("no log line with {needles:?} in:\n{}", lines.join("\n")))
    };
    find(&[
        " INFO ",
        "ADD container=alpha ifname=eth0 network=epm-test mappings=[*:8080->80/tcp]: ok",
    ]);
    find(&["CHECK container=alpha", ": ok"]);
    find(&[
        "ADD container=bravo",
        "failed (code 100)",
        "already mapped by container alpha",
    ]);
    find(&[" ERROR ", "already mapped by container alpha"]);
    find(&["DEL container=bravo ifname=eth0 network=epm-test: ok"]);
    find(&["DEL container=alpha ifname=eth0 network=epm-test: ok"]);
    find(&["GC network=epm-test keep=[]: ok"]);
    for line in &lines {
        // 2026-05-20T08:15:02.123456Z INFO  [pid] ...
        let stamp = line.get(..27).unwrap_or_default();
        assert!(
            stamp.len() == 27 && stamp.as_bytes()[4] == b'-' && stamp.ends_with('Z'),
            "every line starts with a UTC timestamp: {line:?}"
        );
    }
}

#[test]
fn gc_removes_only_what_is_not_kept() {
    let world = World::plugin_only();
    let (a, a_prev) = fake_owner(&world, "keepme", 2, &[PortMapping::tcp(8001, 80)]);
    let (b, b_prev) = fake_owner(&world, "dropme", 3, &[PortMapping::tcp(8002, 80)]);
    world
        .exec_ours(CniCommand::Add, &a, Some(&a_prev))
        .expect("ADD keepme");
    world
        .exec_ours(CniCommand::Add, &b, Some(&b_prev))
        .expect("ADD dropme");
    let network = world.list.name().to_owned();

    let usage = op(&world, &["gc", "--network", &network]);
    assert!(
        !usage.status.success(),
        "--network needs --keep or --keep-none"
    );

    let dry = op_ok(
        &world,
        &[
            "gc",
            "--network",
            &network,
            "--keep",
            "keepme/eth0",
            "--dry-run",
        ],
    );
    assert!(dry.contains("would remove owner dropme/eth0"), "{dry}");
    assert_eq!(
        hosts(&json_of(&world, &["list", "--json"])),
        ["0.0.0.0:8001/tcp", "0.0.0.0:8002/tcp"],
        "a dry run removes nothing"
    );

    let done = op_ok(
        &world,
        &["gc", "--network", &network, "--keep", "keepme/eth0"],
    );
    assert!(done.contains("removed owner dropme/eth0"), "{done}");
    assert_eq!(
        hosts(&json_of(&world, &["list", "--json"])),
        ["0.0.0.0:8001/tcp"]
    );
    assert_eq!(
        world.dump_map("owners").as_array().map(Vec::len),
        Some(1),
        "dropme's owner record is gone too"
    );
    // Another network's name touches nothing.
    op_ok(&world, &["gc", "--network", "other-net", "--keep-none"]);
    assert_eq!(
        hosts(&json_of(&world, &["list", "--json"])),
        ["0.0.0.0:8001/tcp"]
    );
}

#[test]
fn every_pinned_map_dumps_with_named_fields() {
    let world = tcx_world();
    let web = world.node.add_container("web");
    let _tcp = tcp_echo_server(&web.ns, 80, "web");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    world.expect_answer(
        "TCP",
        tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "x", PROBE),
        &echo_reply("web", "x"),
    );
    let dir = world.pins.path().join("v1/maps");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("maps dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for expected in ["counters", "mappings", "trace_filter"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} is pinned: {names:?}"
        );
    }
    for name in &names {
        // Maps bpftool cannot show with names: `sock_origin` is socket
        // storage, keyed by socket (the kernel has no key walk for it), and
        // `features` (portmap-user/src/dataplane/features.rs), `netns_owner`
        // (scope.rs), `specific_ports` and `orphans_seen` (store.rs),
        // `owner_sandboxes` (dataplane/maps.rs, a user map like `owner_pods`),
        // `verb_stats` (dataplane/verb_stats.rs, an array of u64 slots) and
        // `sizing` (dataplane/sizing.rs) are created by userspace without
        // BTF, so they dump in hex. `AYA_LOGS` (the programs' log,
        // portmap_common::datapath_log) is a ring buffer: records, no keys,
        // nothing bpftool dumps.
        if [
            portmap_common::datapath_log::MAP,
            "sock_origin",
            "features",
            "netns_owner",
            "specific_ports",
            "orphans_seen",
            "owner_sandboxes",
            "verb_stats",
            "sizing",
        ]
        .contains(&name.as_str())
        {
            continue;
        }
        // `masq_owners` is an array of 2^18 slots: a dump takes bpftool
        // half a minute, one slot shows its BTF as well.
        if name == "masq_owners" {
            let out = Command::new("bpftool")
                .args(["--json", "map", "lookup", "pinned"])
                .arg(dir.join(name))
                .args(["key", "0", "0", "0", "0"])
                .output()
                .expect("run bpftool");
            let slot: Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
            assert!(
                slot.get("formatted").is_some(),
                "{name}: bpftool shows named fields (BTF): {slot:#}"
            );
            continue;
        }
        let entries = world.dump_map(name);
        let entries = entries.as_array().expect("a JSON array");
        for entry in entries {
            assert!(
                entry.get("formatted").is_some(),
                "{name}: bpftool shows named fields (BTF): {entry:#}"
            );
        }
    }
    let mapping = &world.dump_map("mappings")[0]["formatted"];
    assert_eq!(
        mapping["key"]["host_port_be"],
        8080u16.to_be(),
        "{mapping:#}"
    );
    let counters = &world.dump_map("counters")[0]["formatted"];
    let cpus = counters["values"].as_array().expect("per-CPU values");
    let packets_in: u64 = cpus
        .iter()
        .map(|cpu| cpu["value"]["packets_in"].as_u64().expect("packets_in"))
        .sum();
    let list = json_of(&world, &["list", "--json"]);
    assert_eq!(packets_in, num(row(&list, "0.0.0.0:8080/tcp"), "packetsIn"));
}

#[test]
fn removed_containers_leave_a_note_and_gc_unpins_their_attachments() {
    // ptp: each container's host-side veth carries the programs (a bridge's
    // ports do not: the bridge device's hooks see their traffic).
    let world = World::ptp();
    let gone = world.node.add_container("gone");
    let stays = world.node.add_container("stays");
    world.add(&gone, &[PortMapping::tcp(8080, 80)]);
    world.add(&stays, &[PortMapping::tcp(8081, 80)]);
    let links = || {
        world
            .pins
            .pins()
            .into_iter()
            .filter(|p| p.to_string_lossy().starts_with("v1/links/if"))
            .count()
    };
    let before = links();
    world.del(&gone, &[PortMapping::tcp(8080, 80)]);
    // The runtime removes the namespace, and with it the veth.
    drop(gone);
    eventually("the veth of the removed container is gone", || {
        let (_, status) = status_json(&world);
        status["interfaces"]
            .as_array()
            .is_some_and(|list| list.iter().any(|i| i["interface"].is_null()))
    });
    let (code, status) = status_json(&world);
    assert!(
        code.success(),
        "a removed container is no problem: {status:#}"
    );
    assert!(
        status["notes"][0]
            .as_str()
            .is_some_and(|n| n.contains("no longer exist")),
        "{status:#}"
    );

    let dry = op_ok(&world, &["gc", "--stale-links", "--dry-run"]);
    assert_eq!(
        dry.matches("would remove stale attachment pin").count(),
        2,
        "{dry}"
    );
    assert_eq!(links(), before, "a dry run unpins nothing");
    let done = op_ok(&world, &["gc", "--stale-links"]);
    assert_eq!(
        done.matches("removed stale attachment pin").count(),
        2,
        "{done}"
    );
    assert_eq!(
        links(),
        before - 2,
        "ingress and egress of the removed veth"
    );
    let (code, status) = status_json(&world);
    assert!(code.success(), "{status:#}");
    assert_eq!(status["notes"], json!([]), "{status:#}");
    world.del(&stays, &[PortMapping::tcp(8081, 80)]);
}

#[test]
fn a_containerd_pod_is_mapped_and_named_in_list_conflicts_and_the_log() {
    let world = tcx_world();
    let web = world.node.add_container("3a1b2c3d4e5f6a7b8c9d0e1f");
    let _web_tcp = tcp_echo_server(&web.ns, 80, "web");
    let web_rt = containerd_pod(&web, "default", "web-7f9c", 18080);
    world
        .runner
        .add(&world.list, &web_rt)
        .unwrap_or_else(|e| panic!("containerd's ADD must succeed: {e}\n{}", world.dump()));
    for ip in [IpAddr::V4(NODE_IP4), IpAddr::V6(NODE_IP6)] {
        world.expect_answer(
            &format!("TCP via {ip}:18080"),
            tcp_request(&world.node.ext, sock(ip, 18080), "hello", PROBE),
            &echo_reply("web", "hello"),
        );
    }

    // A container without CNI_ARGS next to it: no pod.
    let plain = world.node.add_container("plain");
    world.add(&plain, &[PortMapping::tcp(9090, 80)]);

    let list = json_of(&world, &["list", "--json"]);
    let pod_row = row(&list, "0.0.0.0:18080/tcp");
    assert_eq!(pod_row["podNamespace"], "default", "{pod_row:#}");
    assert_eq!(pod_row["podName"], "web-7f9c", "{pod_row:#}");
    assert_eq!(pod_row["nomadAllocID"], Value::Null, "{pod_row:#}");
    assert_eq!(
        pod_row["podUID"], "5c9e8a4e-7d6b-4c1a-9a53-0f2f4e6b8c10",
        "list shows K8S_POD_UID: {pod_row:#}"
    );
    let plain_row = row(&list, "0.0.0.0:9090/tcp");
    assert_eq!(
        (&plain_row["podNamespace"], &plain_row["podName"]),
        (&Value::Null, &Value::Null),
        "{plain_row:#}"
    );
    let text = op_ok(&world, &["list"]);
    let pod_cell = |host: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{host}\t")))
            .and_then(|l| l.split('\t').nth(3))
            .unwrap_or_else(|| panic!("a POD cell for {host}: {text}"))
            .to_owned()
    };
    assert_eq!(pod_cell("[::]:18080/tcp"), "default/web-7f9c");
    assert_eq!(pod_cell("0.0.0.0:9090/tcp"), "-");

    // Another pod asking for the same host port is told who holds it.
    let rival = world.node.add_container("rival");
    let error = world
        .runner
        .add(&world.list, &containerd_pod(&rival, "prod", "api-1", 18080))
        .expect_err("the host port is taken");
    assert!(
        error.to_string().contains(
            "is already mapped by pod default/web-7f9c (container 3a1b2c3d4e5f…, network"
        ),
        "{error}"
    );

    let log = log_lines(world.node.data_dir());
    assert!(
        log.iter()
            .any(|l| l.contains("ADD container=3a1b2c3d4e5f6a7b8c9d0e1f")
                && l.contains("pod=default/web-7f9c")
                && l.ends_with(": ok")),
        "the ADD line names the pod: {log:#?}"
    );

    world
        .runner
        .del(&world.list, &web_rt)
        .unwrap_or_else(|e| panic!("DEL: {e}"));
    let log = log_lines(world.node.data_dir());
    assert!(
        log.iter().any(
            |l| l.contains("DEL 3a1b2c3d4e5f6a7b8c9d0e1f (pod default/web-7f9c): 2 mapping(s)")
        ),
        "the DEL line names the pod: {log:#?}"
    );
    let pods = world.pins.path().join("v1/maps/owner_pods");
    let dump = Command::new("bpftool")
        .args(["map", "dump", "pinned"])
        .arg(&pods)
        .output()
        .expect("bpftool");
    assert!(
        String::from_utf8_lossy(&dump.stdout).contains("Found 0 elements"),
        "DEL removes the pod record: {}{}",
        String::from_utf8_lossy(&dump.stdout),
        String::from_utf8_lossy(&dump.stderr)
    );
    world.del(&plain, &[PortMapping::tcp(9090, 80)]);
}

#[test]
fn the_readmes_hand_run_example_maps_a_port() {
    let world = World::plugin_only();
    let web = world.node.add_container("hand");
    let node = &world.node.ns;
    node.add_veth_to("veth-web", "eth0", &web.ns);
    node.ip(&["addr", "add", "10.99.0.1/24", "dev", "veth-web"]);
    node.ip(&["link", "set", "veth-web", "up"]);
    web.ns.ip(&["addr", "add", "10.99.0.2/24", "dev", "eth0"]);
    web.ns.ip(&["link", "set", "eth0", "up"]);
    web.ns.ip(&["route", "add", "default", "via", "10.99.0.1"]);
    let _server = tcp_echo_server(&web.ns, 80, "hand");

    let mut config = readme_hand_run_json();
    let netns = web.ns.path().display().to_string();
    assert_eq!(
        config["prevResult"]["interfaces"][1]["sandbox"],
        "/run/netns/web"
    );
    config["prevResult"]["interfaces"][1]["sandbox"] = json!(netns);
    for key in ["pinRoot", "cgroupPath", "logFile"] {
        config[key] = world.our_plugin()[key].clone();
    }
    let rt = RuntimeAttachment {
        container_id: "web-1".to_owned(),
        netns_path: web.ns.path().to_path_buf(),
        ifname: "eth0".to_owned(),
        capability_args: Value::Null,
        cni_args: Vec::new(),
    };
    world
        .runner
        .exec_plugin("ebpf-portmap", CniCommand::Add, Some(&rt), &config)
        .unwrap_or_else(|e| panic!("the README's ADD failed: {e}"));
    let answer = tcp_request(&world.node.ext, sock(NODE_IP4, 8080), "readme", BOUND)
        .unwrap_or_else(|e| panic!("the README's mapping does not answer: {e:?}"));
    assert_eq!(answer, echo_reply("hand", "readme"));
    assert_eq!(
        hosts(&json_of(&world, &["list", "--json"])),
        ["0.0.0.0:8080/tcp"]
    );

    world
        .runner
        .exec_plugin("ebpf-portmap", CniCommand::Del, Some(&rt), &config)
        .unwrap_or_else(|e| panic!("the README's DEL failed: {e}"));
    assert!(hosts(&json_of(&world, &["list", "--json"])).is_empty());
}

/// Issue 38 item 11: a problem `status` reports names the operator command
/// that fixes it, and that command does: an interface added after the last
/// plugin run lacks the programs until `reconcile`, which reads the
/// plugin's entry of the conflist as the runtime would.
#[test]
fn reconcile_fixes_what_status_reports() {
    let world = World::bridge();
    let web = world.node.add_container("reconcile");
    let _server = tcp_echo_server(&web.ns, 80, "reconcile");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    let side = world
        .node
        .add_side_link("eth2", "198.20.0.1/24", "198.20.0.2/24");
    let (code, doc) = status_json(&world);
    let problems = doc["problems"].to_string();
    assert!(
        !code.success() && problems.contains("eth2") && problems.contains("ebpf-portmap reconcile"),
        "status names the new interface and the command: {doc:#}"
    );

    let conflist = world.node.data_dir().join("reconcile.conflist");
    let plugins = world.list.plugins().to_vec();
    let list = json!({"cniVersion": world.list.cni_version(), "name": world.list.name(), "plugins": plugins});
    std::fs::write(&conflist, list.to_string()).expect("write the conflist");
    let reconcile = |extra: &[&str]| {
        world
            .node
            .ns
            .command(plugin_bin())
            .arg("reconcile")
            .args(extra)
            .env_remove("CNI_COMMAND")
            .output()
            .expect("run ebpf-portmap reconcile")
    };
    let missing = reconcile(&["--cni-conf", "/nonexistent/none.conflist"]);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/none.conflist"));
    let out = reconcile(&["--cni-conf", conflist.to_str().expect("UTF-8 path")]);
    assert!(out.status.success(), "reconcile: {out:?}");

    let (code, doc) = status_json(&world);
    assert!(code.success(), "healthy after reconcile: {doc:#}");
    let answer = tcp_request(
        &side,
        sock(Ipv4Addr::new(198, 20, 0, 1), 8080),
        "fixed",
        BOUND,
    )
    .unwrap_or_else(|e| panic!("the new interface carries the mapping: {e:?}"));
    assert_eq!(answer, echo_reply("reconcile", "fixed"));
}
