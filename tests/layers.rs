//! The library's modules form layers (README: Architecture): a module may use only the modules
//! before it in [`LAYERS`], never one after it. Only the top layer's modules refer to each other:
//! `lock` and `guard`, the handle and its guard, as `lock_api`'s `Mutex` and `MutexGuard` do, and
//! `attempt`, the acquisition a handle runs and that makes a guard.

use std::collections::BTreeSet;

/// Bottom to top; each entry is one layer (modules of one layer do not use each other, except
/// in the last one).
const LAYERS: &[&[&str]] = &[
    &["limits", "redact"],
    &["error"],
    &[
        "keys",
        "boot_clock",
        "server_check",
        "sentinel",
        "lease_estimate",
    ],
    &["config", "connection"],
    &["raw"],
    &["hold"],
    &["watchdog", "janitor", "waker", "master_watch"],
    &["client"],
    &["status"],
    &["lock", "guard", "attempt"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The modules of ours that `src/<module>.rs` names as `crate::<module>`.
fn uses(module: &str) -> BTreeSet<String> {
    let path = format!("{}/src/{module}.rs", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.match_indices("crate::")
        .map(|(i, _)| {
            text[i + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect::<String>()
        })
        .filter(|m| layer_of(m).is_some() && m != module)
        .collect()
}

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let mut wrong = vec![];
    for (layer, modules) in LAYERS.iter().enumerate() {
        for module in *modules {
            for used in uses(module) {
                let below = layer_of(&used).is_some_and(|l| l < layer);
                let pair = layer == LAYERS.len() - 1 && modules.contains(&used.as_str());
                if !below && !pair {
                    wrong.push(format!("{module} uses {used}"));
                }
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
    let dir = format!("{}/src", env!("CARGO_MANIFEST_DIR"));
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if let Some(module) = name.strip_suffix(".rs") {
            assert!(
                module == "lib" || layer_of(module).is_some(),
                "src/{name} is in no layer of tests/layers.rs (and the README's Architecture)"
            );
        }
    }
}
