//! Imports in every crate of the workspace run the way ARCHITECTURE.md
//! says, and no module imports one that imports it back (issue 32): a
//! reader can then take a crate bottom-up, and a change low down cannot
//! depend on what sits above it.
//!
//! Two checks. Each crate's modules fall into the groups ARCHITECTURE.md
//! names (portmap-user's `cni`, `dataplane`, `ops`, `cli`...; the eBPF
//! crate's layers; the harness's `runtime` and its drivers...), and a
//! group imports only the groups its rule lists (issue 54). And no set of
//! modules imports itself round in a circle.
//!
//! The modules are the source files; an edge is any path that names
//! another module of the same crate (`use crate::a::b`, `super::x`,
//! `self::y`, a child named in a `use`, an inline `crate::a::f()`, or, from
//! a binary beside the library, `portmap_user::a`). A binary's root
//! (`main.rs` beside `lib.rs`, `bin/x.rs`) is the module `main` or
//! `bin::x`. Reading the source with a small scanner keeps this test free
//! of a parser dependency; comments and string literals are blanked first
//! so that neither counts as an import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Circles that exist today and are to go, each as its sorted modules.
/// The test fails on any circle not listed here, and on a listed one that
/// no longer exists (so the list only shrinks, and says what is left).
const KNOWN_CIRCLES: &[(&str, &[&str])] = &[];

/// The crates checked: their name, root file, source directory, and the
/// name under which a binary beside the library reaches it (its paths
/// then resolve like `crate::`).
const CRATES: &[(&str, &str, &str, Option<&str>)] = &[
    (
        "portmap-common",
        "portmap-common/src/lib.rs",
        "portmap-common/src",
        None,
    ),
    (
        "portmap-ebpf",
        "portmap-ebpf/src/main.rs",
        "portmap-ebpf/src",
        None,
    ),
    (
        "portmap-user",
        "portmap-user/src/lib.rs",
        "portmap-user/src",
        Some("portmap_user"),
    ),
    (
        "portmap-tests",
        "tests/src/lib.rs",
        "tests/src",
        Some("portmap_tests"),
    ),
    ("portmap-bench", "bench/src/main.rs", "bench/src", None),
    ("xtask", "xtask/src/main.rs", "xtask/src", None),
];

/// A group of a crate's modules: its name, the modules it holds (each
/// with its children; `*` for every module no other group holds), and
/// the groups it may import. Imports inside a group are free (the circle
/// check covers them); the crate's root, which only declares modules, is
/// in no group.
struct Group {
    name: &'static str,
    modules: &'static [&'static str],
    may_import: &'static [&'static str],
}

const fn group(
    name: &'static str,
    modules: &'static [&'static str],
    may_import: &'static [&'static str],
) -> Group {
    Group {
        name,
        modules,
        may_import,
    }
}

/// The direction of every crate, as ARCHITECTURE.md states it.
const LAYERS: &[(&str, &[Group])] = &[
    ("portmap-common", &[group("all", &["*"], &[])]),
    ("portmap-user", PORTMAP_USER),
    ("portmap-ebpf", PORTMAP_EBPF),
    ("portmap-tests", PORTMAP_TESTS),
    ("portmap-bench", PORTMAP_BENCH),
    ("xtask", XTASK),
];

const PORTMAP_USER: &[Group] = &[
    group("model", &["model"], &[]),
    group("cni", &["cni"], &["model"]),
    group("logging", &["logging"], &["model"]),
    group("node", &["node"], &["model"]),
    group("upstream", &["upstream"], &["model", "cni"]),
    group("dataplane", &["dataplane"], &["model", "node", "logging"]),
    group(
        "verbs",
        &["verbs"],
        &["model", "cni", "dataplane", "node", "upstream"],
    ),
    group(
        "ops",
        &["ops"],
        &[
            "model",
            "cni",
            "verbs",
            "dataplane",
            "node",
            "upstream",
            "logging",
        ],
    ),
    group("cli", &["cli"], &["model", "cni", "ops", "logging"]),
    group(
        "agent",
        &["agent"],
        &[
            "model",
            "cni",
            "verbs",
            "dataplane",
            "node",
            "ops",
            "logging",
        ],
    ),
    group(
        "bin/main",
        &["main"],
        &["cli", "cni", "verbs", "dataplane", "logging", "model"],
    ),
    group("bin/agent", &["bin"], &["agent", "ops", "cni", "logging"]),
];

/// The layers of ARCHITECTURE.md's drawing, top down: the entry points,
/// the decisions, the mechanisms, and at the bottom `maps` over `parse`.
/// `log_map` is the object that holds only the log's ring buffer.
const PORTMAP_EBPF: &[Group] = &[
    group(
        "entry points",
        &["tc", "sock", "beacon"],
        &[
            "flow",
            "hand-over",
            "kernel conntrack",
            "mechanisms",
            "maps",
            "parse",
        ],
    ),
    group(
        "flow",
        &["flow", "icmp"],
        &[
            "hand-over",
            "kernel conntrack",
            "mechanisms",
            "maps",
            "parse",
        ],
    ),
    group(
        "hand-over",
        &["fast", "masq"],
        &["kernel conntrack", "mechanisms", "maps", "parse"],
    ),
    group(
        "kernel conntrack",
        &["confirm", "knat"],
        &["mechanisms", "maps", "parse"],
    ),
    group(
        "mechanisms",
        &[
            "ct", "nat", "fib", "counters", "trace", "events", "mark", "kfunc",
        ],
        &["maps", "parse"],
    ),
    group("maps", &["maps"], &["parse"]),
    group("parse", &["parse"], &[]),
    group("log_map", &["log_map"], &[]),
];
/// The harness: the world's modules (namespaces, topology, traffic,
/// plugins...) at the bottom, `runtime` (what every runtime's tests share)
/// over them, the runtime drivers over `runtime`, and what drives a
/// runtime for its own ends (the installer image, the binaries) on top.
const PORTMAP_TESTS: &[Group] = &[
    // The call recorder is the one part of `runtime` below the world: a
    // plugin directory (`plugins`) is traced the way a runtime's is.
    group("world", &["*"], &["recorder"]),
    group("recorder", &["runtime::recorder"], &["world"]),
    group("runtime", &["runtime"], &["world", "recorder"]),
    group(
        "drivers",
        &["containerd", "cri", "podman"],
        &["runtime", "recorder", "world"],
    ),
    group(
        "driver users",
        &["image", "bin"],
        &["drivers", "runtime", "recorder", "world"],
    ),
];

/// The bench: its sections (each measurement), `results` (the judged
/// numbers every section hands over) and `report` (which reads them all).
/// `results` knows no section's own types.
const PORTMAP_BENCH: &[Group] = &[
    group("sections and basics", &["*"], &["results"]),
    group("hairpin", &["hairpin"], &["results", "sections and basics"]),
    group("results", &["results"], &["sections and basics"]),
    group(
        "report",
        &["report"],
        &["results", "hairpin", "sections and basics"],
    ),
];

/// xtask: `plan` (what CI runs, in order) on top, the steps under it,
/// `cmd` (running a command) at the bottom.
const XTASK: &[Group] = &[
    group("plan", &["plan"], &["steps", "cmd"]),
    group("steps", &["*"], &["cmd"]),
    group("cmd", &["cmd"], &[]),
];

/// Imports against the stated direction that exist today and are to go,
/// as (crate, importing module, imported module). The test fails on any
/// crossing not listed, and on a listed one that no longer exists (so the
/// list only shrinks).
const KNOWN_CROSSINGS: &[(&str, &str, &str)] = &[];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let mut found = BTreeSet::new();
    for (name, root, dir, alias) in CRATES {
        let graph = module_graph(&workspace().join(root), &workspace().join(dir), *alias);
        for circle in circles(&graph) {
            found.insert((name.to_string(), circle));
        }
    }
    let known: BTreeSet<(String, Vec<String>)> = KNOWN_CIRCLES
        .iter()
        .map(|(krate, modules)| {
            let mut modules: Vec<String> = modules.iter().map(ToString::to_string).collect();
            modules.sort();
            (krate.to_string(), modules)
        })
        .collect();
    let new: Vec<_> = found.difference(&known).collect();
    let gone: Vec<_> = known.difference(&found).collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "import circles (crate, modules):\n  new: {new:#?}\n  listed but gone (remove them from KNOWN_CIRCLES): {gone:#?}"
    );
}

#[test]
fn each_group_imports_only_what_its_rule_allows() {
    let mut found = BTreeSet::new();
    for (name, root, dir, alias) in CRATES {
        let Some((_, groups)) = LAYERS.iter().find(|(krate, _)| krate == name) else {
            panic!("{name} has no rules in LAYERS");
        };
        let graph = module_graph(&workspace().join(root), &workspace().join(dir), *alias);
        match crossings(groups, &graph) {
            Ok(crossed) => {
                for (from, to) in crossed {
                    found.insert((name.to_string(), from, to));
                }
            }
            Err(unplaced) => panic!(
                "modules of {name} in no group of LAYERS (place them, and say so in ARCHITECTURE.md): {unplaced:?}"
            ),
        }
    }
    let known: BTreeSet<(String, String, String)> = KNOWN_CROSSINGS
        .iter()
        .map(|(krate, from, to)| (krate.to_string(), from.to_string(), to.to_string()))
        .collect();
    let new: Vec<_> = found.difference(&known).collect();
    let gone: Vec<_> = known.difference(&found).collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "imports against the direction ARCHITECTURE.md states (crate, module, imported module):\n  new: {new:#?}\n  listed but gone (remove them from KNOWN_CROSSINGS): {gone:#?}"
    );
}

/// The group of `module`: the one holding the longest prefix of it, else
/// the one holding `*`.
fn group_of<'a>(groups: &'a [Group], module: &str) -> Option<&'a Group> {
    let held = |prefix: &str| module == prefix || module.starts_with(&format!("{prefix}::"));
    groups
        .iter()
        .filter_map(|g| {
            g.modules
                .iter()
                .filter(|m| held(m))
                .map(|m| m.len())
                .max()
                .map(|len| (len, g))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, g)| g)
        .or_else(|| groups.iter().find(|g| g.modules.contains(&"*")))
}

/// The imports of `graph` from one group to another its rule does not
/// list, as (module, imported module); or the modules no group holds.
fn crossings(
    groups: &[Group],
    graph: &BTreeMap<String, BTreeSet<String>>,
) -> Result<BTreeSet<(String, String)>, Vec<String>> {
    let unplaced: Vec<String> = graph
        .keys()
        .filter(|m| !m.is_empty() && group_of(groups, m).is_none())
        .cloned()
        .collect();
    if !unplaced.is_empty() {
        return Err(unplaced);
    }
    let mut crossed = BTreeSet::new();
    for (from, tos) in graph.iter().filter(|(m, _)| !m.is_empty()) {
        let source = group_of(groups, from).unwrap();
        for to in tos.iter().filter(|m| !m.is_empty()) {
            let target = group_of(groups, to).unwrap();
            if target.name != source.name && !source.may_import.contains(&target.name) {
                crossed.insert((from.clone(), to.clone()));
            }
        }
    }
    Ok(crossed)
}

/// Module path (`a::b`, empty for the root) of every source file under
/// `dir`, with the modules each one names.
fn module_graph(
    root: &Path,
    dir: &Path,
    alias: Option<&str>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = BTreeMap::new();
    collect(dir, dir, root, &mut files);
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(module, path)| {
            let text = blank_comments_and_strings(&std::fs::read_to_string(path).unwrap());
            let named = named_modules(module, &text, &modules, alias);
            (module.clone(), named)
        })
        .collect()
}

fn collect(base: &Path, dir: &Path, root: &Path, files: &mut BTreeMap<String, PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(base, &path, root, files);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path.strip_prefix(base).unwrap().with_extension("");
        let mut parts: Vec<String> = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        if path == root {
            parts.clear();
        } else if parts.len() == 1 && parts[0] == "lib" {
            continue;
        }
        // A binary beside the library (main.rs, bin/x.rs) is a crate of
        // its own, named `main` or `bin::x` here: it reaches the library
        // by its name, never by `crate::`, so it joins no circle.
        files.insert(parts.join("::"), path);
    }
}

/// Replaces comments, string and char literals with spaces, keeping
/// lengths and newlines.
fn blank_comments_and_strings(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for b in &mut out[from..to] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    };
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                let end = text[i..].find('\n').map_or(bytes.len(), |n| i + n);
                blank(&mut out, i, end);
                i = end;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let end = text[i + 2..]
                    .find("*/")
                    .map_or(bytes.len(), |n| i + 2 + n + 2);
                blank(&mut out, i, end);
                i = end;
            }
            b'r' if bytes.get(i + 1) == Some(&b'#') || bytes.get(i + 1) == Some(&b'"') => {
                // A raw string: r"..." or r#"..."#.
                let hashes = bytes[i + 1..].iter().take_while(|b| **b == b'#').count();
                if bytes.get(i + 1 + hashes) != Some(&b'"') || is_ident(bytes, i) {
                    i += 1;
                    continue;
                }
                let closing = format!("\"{}", "#".repeat(hashes));
                let start = i + 2 + hashes;
                let end = text[start..]
                    .find(&closing)
                    .map_or(bytes.len(), |n| start + n + closing.len());
                blank(&mut out, i, end);
                i = end;
            }
            b'"' => {
                let mut j = i + 1;
                while j < bytes.len() && bytes[j] != b'"' {
                    j += if bytes[j] == b'\\' { 2 } else { 1 };
                }
                blank(&mut out, i, (j + 1).min(bytes.len()));
                i = j + 1;
            }
            b'\'' => {
                // A char literal ('a', '\n', '\'') but not a lifetime ('a).
                let end = if bytes.get(i + 1) == Some(&b'\\') {
                    text[i + 2..].find('\'').map(|n| i + 2 + n + 1)
                } else if bytes.get(i + 2) == Some(&b'\'') {
                    Some(i + 3)
                } else {
                    None
                };
                match end {
                    Some(end) => {
                        blank(&mut out, i, end);
                        i = end;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    String::from_utf8(out).unwrap()
}

/// Whether the byte before `i` continues an identifier (so `r` at `i` is
/// not the start of a raw string).
fn is_ident(bytes: &[u8], i: usize) -> bool {
    i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')
}

/// The modules of `modules` that the file of `module` names, itself
/// excluded; `alias` is the library's name as its binaries write it.
fn named_modules(
    module: &str,
    text: &str,
    modules: &BTreeSet<String>,
    alias: Option<&str>,
) -> BTreeSet<String> {
    let here: Vec<&str> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").collect()
    };
    let inline = inline_module_spans(text);
    let mut named = BTreeSet::new();
    for (at, path, in_use) in paths(text) {
        // Inside an inline module (`mod tests { ... }`), `super` is this
        // file's module and `self` the inline one.
        let depth = inline.iter().filter(|(s, e)| *s <= at && at < *e).count();
        if let Some(target) = resolve(&here, depth, &path, in_use, modules, alias)
            && target != module
        {
            named.insert(target);
        }
    }
    named
}

/// Byte spans of `mod name { ... }` blocks.
fn inline_module_spans(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    for (at, _) in text.match_indices("mod ") {
        if is_ident(bytes, at) {
            continue;
        }
        let rest = &text[at + 4..];
        let name_len = rest
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
            .count();
        let after = rest[name_len..].trim_start();
        if name_len == 0 || !after.starts_with('{') {
            continue;
        }
        let open = at + 4 + name_len + (rest[name_len..].len() - after.len());
        let mut depth = 0;
        for (offset, b) in text[open..].bytes().enumerate() {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        spans.push((open, open + offset));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    spans
}

/// Every path worth resolving, with its offset and whether it comes from a
/// `use` declaration: the expanded trees of `use` declarations, and inline
/// `crate::`/`super::`/`self::` paths elsewhere.
fn paths(text: &str) -> Vec<(usize, Vec<String>, bool)> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut uses = Vec::new();
    for (at, _) in text.match_indices("use ") {
        if is_ident(bytes, at) {
            continue;
        }
        let Some(end) = text[at..].find(';') else {
            continue;
        };
        uses.push((at, at + end));
        // One space for any run of whitespace, so that `a as b` keeps
        // its keyword apart.
        let tree = text[at + 4..at + end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let tree = tree.trim_start_matches("::");
        for path in expand(tree) {
            found.push((at, path, true));
        }
    }
    for start in [
        "crate::",
        "super::",
        "self::",
        "portmap_user::",
        "portmap_tests::",
    ] {
        for (at, _) in text.match_indices(start) {
            // Not the second `super` of `super::super`, nor inside a `use`.
            if is_ident(bytes, at)
                || text[..at].ends_with("::")
                || uses.iter().any(|(s, e)| *s <= at && at < *e)
            {
                continue;
            }
            let path: Vec<String> = text[at..]
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or("")
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            found.push((at, path, false));
        }
    }
    found
}

/// `a::{b, c::{d, e}}` into `a::b`, `a::c::d`, `a::c::e` (`self` in braces
/// names the prefix itself; `as` renames are dropped).
fn expand(tree: &str) -> Vec<Vec<String>> {
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree);
        return vec![
            path.split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty() && *s != "*")
                .map(str::to_owned)
                .collect(),
        ];
    };
    let prefix: Vec<String> = tree[..open]
        .split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut items = Vec::new();
    let (mut depth, mut from) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[from..]);
    let mut out = Vec::new();
    for item in items.into_iter().map(str::trim).filter(|i| !i.is_empty()) {
        if item == "self" {
            out.push(prefix.clone());
            continue;
        }
        for rest in expand(item) {
            let mut path = prefix.clone();
            path.extend(rest);
            out.push(path);
        }
    }
    out
}

/// The longest module of `modules` that `path` names from the module
/// `here` (`depth` inline modules deep), if any.
fn resolve(
    here: &[&str],
    depth: usize,
    path: &[String],
    in_use: bool,
    modules: &BTreeSet<String>,
    alias: Option<&str>,
) -> Option<String> {
    let first = path.first()?;
    let (mut base, rest): (Vec<String>, &[String]) = match first.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        name if Some(name) == alias => (Vec::new(), &path[1..]),
        "self" => (here.iter().map(ToString::to_string).collect(), &path[1..]),
        "super" => {
            let supers = path.iter().take_while(|s| *s == "super").count();
            // The first `depth` hops leave inline modules within the file.
            let up = supers.saturating_sub(depth);
            let keep = here.len().checked_sub(up)?;
            (
                here[..keep].iter().map(ToString::to_string).collect(),
                &path[supers..],
            )
        }
        // A `use child::...` of a module declared by this file.
        _ if in_use => {
            let mut child: Vec<String> = here.iter().map(ToString::to_string).collect();
            child.push(first.clone());
            if !modules.contains(&child.join("::")) {
                return None;
            }
            (child, &path[1..])
        }
        _ => return None,
    };
    for segment in rest {
        base.push(segment.clone());
        if !modules.contains(&base.join("::")) {
            base.pop();
            break;
        }
    }
    Some(base.join("::"))
}

/// The strongly connected sets of two or more modules, each sorted.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Kosaraju: finish order on the graph, then components on its reverse.
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for start in graph.keys() {
        if seen.contains(start) {
            continue;
        }
        // Iterative DFS recording the finish order.
        let mut stack = vec![(start.clone(), false)];
        while let Some((node, done)) = stack.pop() {
            if done {
                order.push(node);
                continue;
            }
            if !seen.insert(node.clone()) {
                continue;
            }
            stack.push((node.clone(), true));
            for next in graph.get(&node).into_iter().flatten() {
                if !seen.contains(next) {
                    stack.push((next.clone(), false));
                }
            }
        }
    }
    let mut reverse: BTreeMap<&String, Vec<&String>> = BTreeMap::new();
    for (from, tos) in graph {
        for to in tos {
            reverse.entry(to).or_default().push(from);
        }
    }
    let mut assigned = BTreeSet::new();
    let mut found = Vec::new();
    for node in order.iter().rev() {
        if assigned.contains(node) {
            continue;
        }
        let mut component = Vec::new();
        let mut stack = vec![node];
        assigned.insert(node.clone());
        while let Some(n) = stack.pop() {
            component.push(n.clone());
            for prev in reverse.get(n).into_iter().flatten() {
                if assigned.insert((*prev).clone()) {
                    stack.push(prev);
                }
            }
        }
        if component.len() > 1 {
            component.sort();
            found.push(component);
        }
    }
    found
}

#[test]
fn the_scanner_finds_a_circle_through_use_trees_super_and_inline_paths() {
    let modules: BTreeSet<String> = ["", "a", "a::b", "c"]
        .iter()
        .map(ToString::to_string)
        .collect();
    let a = blank_comments_and_strings(
        "use crate::{c::{self, Thing}, x};\n// use crate::a::b;\nfn f() { let s = \"crate::a::b\"; }",
    );
    // `x` is no module: an item of the crate root.
    assert_eq!(
        named_modules("a", &a, &modules, None),
        BTreeSet::from(["".to_owned(), "c".to_owned()])
    );
    let b = "fn g() { super::super::c::h() }\nmod tests { use super::*; }";
    assert_eq!(
        named_modules("a::b", b, &modules, None),
        BTreeSet::from(["c".to_owned()])
    );
    // A module whose name holds "as", and a rename.
    let renamed = blank_comments_and_strings("use crate::{c as cas, a::b::G as Gas};");
    assert_eq!(
        named_modules("", &renamed, &modules, None),
        BTreeSet::from(["a::b".to_owned(), "c".to_owned()])
    );
    let c = "use b::X;\nfn h() { crate::a::b::g() }";
    let named = named_modules("c", c, &modules, None);
    assert_eq!(named, BTreeSet::from(["a::b".to_owned()]));
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_owned(), named_modules("a", &a, &modules, None)),
        ("a::b".to_owned(), named_modules("a::b", b, &modules, None)),
        ("c".to_owned(), named),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        circles(&graph),
        vec![vec!["a::b".to_owned(), "c".to_owned()]]
    );
}

#[test]
fn an_import_against_a_rule_is_found_also_through_the_librarys_name() {
    let modules: BTreeSet<String> = ["dataplane", "dataplane::maps", "ops", "cli", "cli::gc"]
        .iter()
        .map(ToString::to_string)
        .collect();
    const GROUPS: &[Group] = &[
        group("dataplane", &["dataplane"], &[]),
        group("ops", &["ops"], &["dataplane"]),
        group("cli", &["cli"], &["ops"]),
    ];
    // A binary's module names the library by its name: `portmap_user::`
    // resolves like `crate::` there, in a `use` and inline alike.
    let gc = blank_comments_and_strings(
        "use portmap_user::{ops::gc, dataplane::maps::Maps};\nfn f() { portmap_user::ops::g() }",
    );
    let named = named_modules("cli::gc", &gc, &modules, Some("portmap_user"));
    assert_eq!(
        named,
        BTreeSet::from(["dataplane::maps".to_owned(), "ops".to_owned()])
    );
    // Not under another crate's name.
    assert!(named_modules("cli::gc", &gc, &modules, Some("portmap_tests")).is_empty());
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("cli::gc".to_owned(), named),
        (
            "ops".to_owned(),
            BTreeSet::from(["dataplane::maps".to_owned()]),
        ),
        ("dataplane::maps".to_owned(), BTreeSet::new()),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        crossings(GROUPS, &graph),
        Ok(BTreeSet::from([(
            "cli::gc".to_owned(),
            "dataplane::maps".to_owned()
        )]))
    );
    // A module in no group is named, not skipped.
    let mut unplaced = graph.clone();
    unplaced.insert("agent".to_owned(), BTreeSet::new());
    assert_eq!(crossings(GROUPS, &unplaced), Err(vec!["agent".to_owned()]));
}
