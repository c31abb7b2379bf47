//! The documentation a newcomer reads: the README's first screen names an
//! install recipe for every runtime, and no link in the README, CONTRIBUTING,
//! ARCHITECTURE or docs/ points at a heading or a file that does not exist. Needs no root.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use portmap_tests::plugins::workspace_root;

/// GitHub's heading anchors: lower case, punctuation but `-` and `_`
/// dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if !in_code && line.starts_with('#') {
            found.insert(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

/// Every `](target)` link of a Markdown file, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut found = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            rest = &rest[start + 2..];
            if let Some(end) = rest.find(')') {
                found.push(rest[..end].to_owned());
                rest = &rest[end..];
            }
        }
    }
    found
}

fn markdown_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = vec![
        root.join("README.md"),
        root.join("CONTRIBUTING.md"),
        root.join("ARCHITECTURE.md"),
    ];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn every_link_points_at_an_existing_file_and_heading() {
    for file in markdown_files() {
        let text = read(&file);
        let dir = file.parent().expect("a parent");
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (path, fragment) = match link.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            assert!(
                target.exists(),
                "{}: the link {link} points at {}, which does not exist",
                file.display(),
                target.display()
            );
            if let Some(fragment) = fragment {
                let headings = anchors(&read(&target));
                assert!(
                    headings.contains(fragment),
                    "{}: the link {link} names no heading of {}",
                    file.display(),
                    target.display()
                );
            }
        }
    }
}

#[test]
fn the_first_screen_of_the_readme_has_an_install_recipe_per_runtime() {
    let readme = read(&workspace_root().join("README.md"));
    let first_screen: String = readme.lines().take(40).collect::<Vec<_>>().join("\n");
    for runtime in [
        "Kubernetes",
        "containerd",
        "CRI-O",
        "podman 4",
        "Nomad",
        "Docker",
    ] {
        let row = first_screen
            .lines()
            .find(|line| line.starts_with('|') && line.contains(runtime))
            .unwrap_or_else(|| {
                panic!("the README's first 40 lines have no install row for {runtime}")
            });
        assert!(
            runtime == "Docker" || row.contains("](#"),
            "the row for {runtime} links its recipe: {row}"
        );
    }
}
