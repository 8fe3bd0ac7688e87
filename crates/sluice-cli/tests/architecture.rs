//! ARCHITECTURE.md tells the truth about the crate graph and the modules:
//! its dependency table lists exactly the Sluice crates each crate's
//! Cargo.toml depends on, and each crate's section names every module of
//! that crate. A crate edge or a module added without the document fails
//! here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn crates() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("Cargo.toml").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// The Sluice crates `name`'s Cargo.toml depends on (normal dependencies),
/// without the `sluice-` prefix.
fn cargo_deps(name: &str) -> BTreeSet<String> {
    let text =
        std::fs::read_to_string(root().join("crates").join(name).join("Cargo.toml")).unwrap();
    let t: toml::Table = toml::from_str(&text).unwrap();
    t.get("dependencies")
        .and_then(|d| d.as_table())
        .map(|d| {
            d.keys()
                .filter_map(|k| k.strip_prefix("sluice-"))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The rows of the table under "## Dependency direction":
/// `| \`sluice-x\` | a, b | why |`.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let section = doc
        .split("## Dependency direction")
        .nth(1)
        .expect("ARCHITECTURE.md has a \"Dependency direction\" section");
    let section = section.split("\n## ").next().unwrap();
    let mut out = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `sluice-")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`').to_string();
        let uses: BTreeSet<String> = cells[2]
            .split(',')
            .map(|s| s.trim().trim_matches('`').to_string())
            .filter(|s| !s.is_empty() && s != "(none)")
            .collect();
        assert!(
            out.insert(name.clone(), uses).is_none(),
            "{name} is in the table twice"
        );
    }
    out
}

#[test]
fn the_dependency_table_matches_every_cargo_toml() {
    let table = documented();
    let mut wrong = Vec::new();
    for c in crates() {
        let actual = cargo_deps(&c);
        match table.get(&c) {
            None => wrong.push(format!("{c} is not in ARCHITECTURE.md's dependency table")),
            Some(doc) if *doc != actual => wrong.push(format!(
                "{c}: ARCHITECTURE.md says it uses {doc:?}, Cargo.toml says {actual:?}"
            )),
            Some(_) => {}
        }
    }
    for c in table.keys() {
        if !crates().contains(c) {
            wrong.push(format!("{c} is in the table but is no crate"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_module_is_named_in_its_crates_section() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    for c in crates() {
        let head = format!("### `{c}`");
        let Some(section) = doc.split(&head).nth(1) else {
            missing.push(format!("{c} has no section ({head})"));
            continue;
        };
        let section = section
            .split("\n### ")
            .next()
            .unwrap()
            .split("\n## ")
            .next()
            .unwrap();
        let src = root().join("crates").join(&c).join("src");
        for e in std::fs::read_dir(&src).unwrap().filter_map(|e| e.ok()) {
            let p = e.path();
            let module = if p.is_dir() {
                p.file_name().unwrap().to_string_lossy().into_owned()
            } else if p.extension().is_some_and(|x| x == "rs") {
                p.file_stem().unwrap().to_string_lossy().into_owned()
            } else {
                continue;
            };
            if module == "lib" || module == "main" {
                continue;
            }
            if !section.contains(&format!("`{module}`")) {
                missing.push(format!(
                    "{c}: module `{module}` is not named in its section"
                ));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// Issue #15: no function in the server or the CLI grows past what a
/// reader can hold (120 lines, signature to closing brace).
#[test]
fn no_function_in_the_server_or_the_cli_is_longer_than_120_lines() {
    let mut long = Vec::new();
    for c in ["sluice-server", "sluice-cli"] {
        let mut stack = vec![root().join("crates").join(c).join("src")];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()) {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                if p.extension().is_none_or(|x| x != "rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                let lines: Vec<&str> = text.lines().collect();
                for (i, l) in lines.iter().enumerate() {
                    let t = l.trim_start();
                    let indent = l.len() - t.len();
                    let t = t
                        .trim_start_matches("pub(crate) ")
                        .trim_start_matches("pub(super) ")
                        .trim_start_matches("pub ")
                        .trim_start_matches("async ");
                    if !t.starts_with("fn ") {
                        continue;
                    }
                    // The closing brace at the signature's indentation.
                    let close = format!("{}}}", " ".repeat(indent));
                    if let Some(j) = lines[i + 1..].iter().position(|x| *x == close) {
                        if j + 2 > 120 {
                            long.push(format!("{}:{} ({} lines)", p.display(), i + 1, j + 2));
                        }
                    }
                }
            }
        }
    }
    assert!(long.is_empty(), "functions over 120 lines: {long:?}");
}
