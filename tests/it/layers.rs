//! The library's modules form layers, written once: the table under `## Layers` in
//! `docs/design.md`. A module may use only the modules of lower layers, never one of its own
//! layer or above, the top layer's included: so no import cycle exists among them. A module is
//! `src/<module>.rs`, or a folder `src/<module>/` (with everything in it); what it uses is every
//! `crate::<module>` it names, grouped imports (`use crate::{a, b::c}`) included.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The layers, bottom to top, from the table in docs/design.md: rows `| <n> | `a`, `b` | ... |`.
fn layers() -> Vec<Vec<String>> {
    let path = root().join("docs/design.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let section = text
        .split("\n## Layers")
        .nth(1)
        .expect("docs/design.md has a `## Layers` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut layers = vec![];
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let Some(n) = cells.get(1).and_then(|c| c.parse::<usize>().ok()) else {
            continue;
        };
        assert_eq!(
            n,
            layers.len() + 1,
            "layer {n} out of order in docs/design.md"
        );
        let modules: Vec<String> = cells[2]
            .split(',')
            .map(|m| m.trim().trim_matches('`').to_string())
            .collect();
        assert!(
            modules.iter().all(|m| is_module_name(m)),
            "layer {n}: {modules:?}"
        );
        layers.push(modules);
    }
    assert!(layers.len() >= 2, "no layer table found in docs/design.md");
    layers
}

fn is_module_name(m: &str) -> bool {
    !m.is_empty() && m.chars().all(|c| c.is_ascii_lowercase() || c == '_')
}

fn layer_of(layers: &[Vec<String>], module: &str) -> Option<usize> {
    layers.iter().position(|l| l.iter().any(|m| m == module))
}

/// The text of `module`: src/<module>.rs and every file under src/<module>/.
fn source_of(module: &str) -> String {
    let src = root().join("src");
    let mut text = std::fs::read_to_string(src.join(format!("{module}.rs"))).unwrap_or_default();
    let dir = src.join(module);
    if dir.is_dir() {
        for file in rust_files(&dir) {
            text.push_str(&std::fs::read_to_string(file).unwrap());
        }
    }
    assert!(!text.is_empty(), "no source for module {module}");
    text
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The modules of the crate that `text` names: `crate::m`, and each top-level name of a group
/// `crate::{m, n::x, o::{y, z}}`.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            let mut at_start = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if at_start && !item.is_empty() {
                            used.insert(std::mem::take(&mut item));
                        }
                        at_start = true;
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 && at_start {
                    if c.is_ascii_lowercase() || c == '_' {
                        item.push(c);
                        continue;
                    }
                    if !item.is_empty() {
                        used.insert(std::mem::take(&mut item));
                        at_start = false;
                    }
                }
            }
            if at_start && !item.is_empty() {
                used.insert(item);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !name.is_empty() {
                used.insert(name);
            }
        }
    }
    used
}

#[test]
fn grouped_imports_are_seen() {
    let text = "use crate::{attempt, guard::LockGuard, lock::{A, b}};\nuse crate::raw::Call;\nx: crate::keys::K";
    let used: Vec<String> = crate_paths(text).into_iter().collect();
    assert_eq!(used, ["attempt", "guard", "keys", "lock", "raw"]);
}

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let layers = layers();
    let mut wrong = vec![];
    for (layer, modules) in layers.iter().enumerate() {
        for module in modules {
            let uses: Vec<String> = crate_paths(&source_of(module))
                .into_iter()
                .filter(|u| u != module && layer_of(&layers, u).is_some())
                .collect();
            // the import graph, for `--nocapture`: each module and the modules it uses
            println!("{:>2} {module} -> {}", layer + 1, uses.join(", "));
            for used in crate_paths(&source_of(module)) {
                let Some(at) = layer_of(&layers, &used) else {
                    continue;
                };
                if used == *module || at < layer {
                    continue;
                }
                wrong.push(format!(
                    "{module} (layer {}) uses {used} (layer {})",
                    layer + 1,
                    at + 1
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "arrows pointing up or sideways: {wrong:?}"
    );
}

#[test]
fn every_module_of_the_library_has_a_layer() {
    let layers = layers();
    for entry in std::fs::read_dir(root().join("src")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let module = match name.strip_suffix(".rs") {
            Some(m) => m.to_string(),
            None if path.is_dir() && name != "bin" => name.clone(),
            None => continue,
        };
        assert!(
            module == "lib" || layer_of(&layers, &module).is_some(),
            "src/{name} is in no layer of docs/design.md's Layers table"
        );
    }
}
