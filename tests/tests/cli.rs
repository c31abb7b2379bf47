//! The operator CLI's conventions, as a script or a person meets them:
//! the one exit-code table (0 ok, 1 problem, 2 usage, 3 cannot inspect),
//! `-o table|wide|json` with `--json` as an alias and JSON errors on
//! stdout, `--color`, `EPM_PIN_ROOT`, `list --watch`, and every verb on a
//! node where nothing is installed. Needs root (pin roots on bpffs, a real
//! ADD for the tests that read state).

use std::path::Path;
use std::process::{Command, Output};

use portmap_tests::world::World;
use portmap_tests::{PinRoot, PortMapping, plugin_bin};
use serde_json::Value;

fn ebpf_portmap(args: &[&str]) -> Command {
    let mut command = Command::new(plugin_bin());
    command
        .args(args)
        .env_remove("CNI_COMMAND")
        .env_remove("EPM_PIN_ROOT")
        .env_remove("NO_COLOR");
    command
}

fn run(args: &[&str], pins: &Path) -> Output {
    ebpf_portmap(args)
        .arg("--pin-root")
        .arg(pins)
        .output()
        .unwrap_or_else(|e| panic!("running ebpf-portmap {args:?}: {e}"))
}

/// `ebpf-portmap <args>` in the node's namespace: a pin root holds the
/// state of one network namespace, and the interfaces it reports on live
/// there.
fn in_node(world: &World, args: &[&str]) -> Command {
    let mut command = world.node.ns.command(plugin_bin());
    command
        .args(args)
        .env_remove("CNI_COMMAND")
        .env_remove("EPM_PIN_ROOT")
        .env_remove("NO_COLOR");
    command
}

/// `ebpf-portmap <args> --pin-root <pins>` in the node's namespace.
fn op(world: &World, args: &[&str]) -> Output {
    world.operator(args)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(out: &Output, what: &str) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{what}: stdout is not JSON ({e}): {}", stdout(out)))
}

fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

/// A node with one container publishing 8080/tcp.
fn published() -> (World, portmap_tests::Container) {
    let world = World::bridge();
    let web = world.node.add_container("web");
    world.add(&web, &[PortMapping::tcp(8080, 80)]);
    (world, web)
}

#[test]
fn every_verb_on_an_empty_node_says_so_in_one_line() {
    let pins = PinRoot::new();
    let root = pins.path();

    for args in [
        &["list", "--json"][..],
        &["-o", "json", "list"],
        &["list", "-o", "json"],
    ] {
        let out = run(args, root);
        assert_eq!(code(&out), Some(0), "{args:?}: {}", stderr(&out));
        assert_eq!(json(&out, "list"), Value::Array(vec![]), "{args:?}");
    }
    let out = run(&["list"], root);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).lines().count(),
        1,
        "a pipe gets the header only: {}",
        stdout(&out)
    );

    for args in [
        &["gc", "--stale-links"][..],
        &["gc", "--empty-owners"],
        &["uninstall"],
    ] {
        let out = run(args, root);
        assert_eq!(code(&out), Some(0), "{args:?}: {}", stderr(&out));
        let text = stdout(&out);
        assert_eq!(text.lines().count(), 1, "{args:?}: one line: {text}");
        assert!(text.contains("nothing"), "{args:?}: {text}");
        assert!(text.contains("installed"), "{args:?}: {text}");
    }
    let out = run(&["gc", "--stale-links", "-o", "json"], root);
    assert_eq!(json(&out, "gc")["installed"], false);

    let out = run(&["trace", "--timeout", "1"], root);
    assert_eq!(code(&out), Some(1), "{}", stderr(&out));
    let text = stderr(&out);
    assert_eq!(text.lines().count(), 1, "one line: {text}");
    assert!(text.contains("nothing is installed"), "{text}");
    assert!(
        !text.contains("BPF_OBJ_GET"),
        "no raw syscall error: {text}"
    );

    let out = run(&["status"], root);
    assert_eq!(code(&out), Some(1), "not installed is a problem for status");
}

#[test]
fn exit_codes_are_kept_apart() {
    let pins = PinRoot::new();
    for args in [
        &["list", "--bogus"][..],
        &["list", "-o", "yaml"],
        &["frobnicate"],
    ] {
        let out = run(args, pins.path());
        assert_eq!(
            code(&out),
            Some(2),
            "usage error {args:?}: {}",
            stderr(&out)
        );
    }
    // A pin root that is not on bpffs cannot be inspected at all.
    let out = run(&["list"], Path::new("/proc/self"));
    assert_eq!(code(&out), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("bpffs"), "{}", stderr(&out));

    // Without privilege (nobody, no capabilities) the state cannot be read.
    let (world, _web) = published();
    for verb in ["list", "status"] {
        let out = world
            .node
            .ns
            .command("/usr/bin/setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["--inh-caps=-all", "--bounding-set=-all"])
            .arg(plugin_bin())
            .args([verb, "--pin-root"])
            .arg(world.pins.path())
            .env_remove("CNI_COMMAND")
            .output()
            .expect("running setpriv");
        assert_eq!(
            code(&out),
            Some(3),
            "{verb} as nobody must be 'cannot inspect': {}{}",
            stdout(&out),
            stderr(&out)
        );
    }
    let out = op(&world, &["status"]);
    assert_eq!(
        code(&out),
        Some(0),
        "healthy: {}{}",
        stdout(&out),
        stderr(&out)
    );
}

#[test]
fn with_json_asked_errors_are_json_on_stdout() {
    let out = run(&["-o", "json", "list"], Path::new("/proc/self"));
    assert_eq!(code(&out), Some(3));
    let error = json(&out, "a cannot-inspect error");
    assert_eq!(error["exitCode"], 3);
    assert!(
        error["error"].as_str().is_some_and(|e| e.contains("bpffs")),
        "{error}"
    );

    let pins = PinRoot::new();
    let out = run(&["list", "--json", "--bogus"], pins.path());
    assert_eq!(code(&out), Some(2));
    assert_eq!(json(&out, "a usage error")["exitCode"], 2);

    let out = run(&["gc", "-o", "json"], pins.path());
    assert_eq!(
        code(&out),
        Some(2),
        "gc without a what is refused as a usage error"
    );
    assert!(
        json(&out, "a refusal")["error"]
            .as_str()
            .is_some_and(|e| e.contains("say what to collect")),
    );
}

#[test]
fn every_printing_verb_speaks_json() {
    let (world, web) = published();
    for args in [
        &["list", "-o", "json"][..],
        &["status", "-o", "json"],
        &["version", "-o", "json"],
        &["gc", "--stale-links", "--dry-run", "-o", "json"],
    ] {
        let out = op(&world, args);
        assert_eq!(
            code(&out),
            Some(0),
            "{args:?}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        json(&out, &format!("{args:?}"));
    }
    let list = json(&op(&world, &["list", "--json"]), "list");
    assert_eq!(
        list.as_array().map(Vec::len),
        Some(2),
        "8080/tcp on IPv4 and IPv6: {list}"
    );

    let net_dir = portmap_tests::tmp::TempDir::new("cli-chain");
    std::fs::write(
        net_dir.path().join("10-bridge.conflist"),
        r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}"#,
    )
    .expect("write");
    let chain = |action: &str| {
        ebpf_portmap(&["chain", action, "-o", "json", "--net-dir"])
            .arg(net_dir.path())
            .output()
            .expect("running chain")
    };
    let out = chain("check");
    assert_eq!(code(&out), Some(1), "not chained yet");
    assert_eq!(json(&out, "chain check")["chained"], false);
    let out = chain("install");
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    assert_eq!(json(&out, "chain install")["changed"], true);
    assert_eq!(json(&chain("check"), "chain check")["chained"], true);
    let restored = json(&chain("remove"), "chain remove");
    assert_eq!(restored["restored"].as_array().map(Vec::len), Some(1));

    world.del(&web, &[PortMapping::tcp(8080, 80)]);
    let out = op(&world, &["uninstall", "-o", "json"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    assert_eq!(json(&out, "uninstall")["installed"], true);
}

#[test]
fn wide_adds_columns_and_epm_pin_root_is_the_default() {
    let (world, _web) = published();
    let root = world.pins.path();
    let header = |args: &[&str]| {
        let out = op(&world, args);
        assert_eq!(code(&out), Some(0), "{}", stderr(&out));
        stdout(&out).lines().next().unwrap_or_default().to_owned()
    };
    let table = header(&["list"]);
    let wide = header(&["list", "-o", "wide"]);
    assert!(!table.contains("CONTAINER ID"), "{table}");
    assert!(
        wide.starts_with(&table) && wide.contains("CONTAINER ID") && wide.contains("CREATED"),
        "wide is the table plus columns: {wide}"
    );

    let out = in_node(&world, &["list", "--json"])
        .env("EPM_PIN_ROOT", root)
        .output()
        .expect("running list");
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    assert_eq!(
        json(&out, "list").as_array().map(Vec::len),
        Some(2),
        "EPM_PIN_ROOT names the pin root (8080/tcp on IPv4 and IPv6)"
    );
    let empty = PinRoot::new();
    let out = in_node(&world, &["list", "--json", "--pin-root"])
        .arg(empty.path())
        .env("EPM_PIN_ROOT", root)
        .output()
        .expect("running list");
    assert_eq!(
        json(&out, "list"),
        Value::Array(vec![]),
        "--pin-root beats EPM_PIN_ROOT"
    );
}

#[test]
fn colour_follows_the_flag_the_terminal_and_no_color() {
    let (world, _web) = published();
    let root = world.pins.path();
    let escapes = |out: &Output| stdout(out).contains("\x1b[");
    assert!(escapes(&op(&world, &["list", "--color", "always"])));
    assert!(!escapes(&op(&world, &["list", "--color", "never"])));
    assert!(
        !escapes(&op(&world, &["list"])),
        "auto: no colour into a pipe"
    );

    // On a terminal (util-linux `script` gives the command a pty).
    let on_terminal = |extra: &str, no_color: bool| {
        let command = format!(
            "{} list --pin-root {} {extra}",
            plugin_bin().display(),
            root.display()
        );
        let mut script = world.node.ns.command("script");
        script
            .args(["--quiet", "--return", "--command", &command, "/dev/null"])
            .env_remove("CNI_COMMAND")
            .env_remove("NO_COLOR");
        if no_color {
            script.env("NO_COLOR", "1");
        }
        script.output().expect("running script")
    };
    assert!(escapes(&on_terminal("", false)), "auto colours a terminal");
    assert!(!escapes(&on_terminal("", true)), "NO_COLOR turns auto off");
    assert!(
        escapes(&on_terminal("--color always", true)),
        "an explicit --color always wins over NO_COLOR"
    );
}

#[test]
fn list_watch_prints_one_json_document_per_refresh_into_a_pipe() {
    let (world, _web) = published();
    let out = op(&world, &["list", "--watch", "1", "--count", "2"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "two refreshes, one line each: {text}");
    for line in lines {
        let list: Value = serde_json::from_str(line).expect("each line is a JSON document");
        assert_eq!(list[0]["hostPort"], 8080, "{list}");
    }
    let out = op(&world, &["list", "--count", "2"]);
    assert_eq!(code(&out), Some(2), "--count needs --watch");
}
