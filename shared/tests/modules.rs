//! The crate's modules import each other without circles: each can be read knowing only
//! the ones below it.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The top-level module a source file belongs to (`runner/guard.rs` -> `runner`).
fn module_of(relative: &Path) -> String {
    let first = relative
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    first.trim_end_matches(".rs").to_owned()
}

/// The top-level modules named by `crate::<module>` paths and `use crate::{a, b::c}`
/// groups in `source` (its unit tests left out).
fn imports(source: &str) -> BTreeSet<String> {
    let code = source
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or(source);
    let mut found = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut name = String::new();
            let mut at_start = true;
            for ch in group.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => at_start = true,
                    c if at_start && (c.is_ascii_lowercase() || c == '_') => name.push(c),
                    c if at_start
                        && !name.is_empty()
                        && !(c.is_ascii_alphanumeric() || c == '_') =>
                    {
                        found.insert(std::mem::take(&mut name));
                        at_start = false;
                    }
                    c if at_start && c.is_ascii_uppercase() => at_start = false,
                    _ => {}
                }
            }
            if !name.is_empty() {
                found.insert(name);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let module = module_of(path.strip_prefix(&src).expect("under src"));
            let source = std::fs::read_to_string(&path).expect("a readable source file");
            let deps = graph.entry(module.clone()).or_default();
            deps.extend(imports(&source).into_iter().filter(|m| *m != module));
        }
    }
    graph
}

/// A path from `from` to `to` through the graph, if there is one.
fn path(
    graph: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    to: &str,
    seen: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    for next in graph.get(from).into_iter().flatten() {
        if next == to {
            return Some(vec![from.to_owned(), to.to_owned()]);
        }
        if seen.insert(next.clone())
            && let Some(mut rest) = path(graph, next, to, seen)
        {
            rest.insert(0, from.to_owned());
            return Some(rest);
        }
    }
    None
}

#[test]
fn the_modules_import_each_other_without_circles() {
    let graph = graph();
    assert!(graph.contains_key("runner") && graph["runner"].contains("namespaces"));
    for module in graph.keys() {
        if let Some(circle) = path(&graph, module, module, &mut BTreeSet::new()) {
            panic!(
                "modules import each other in a circle: {}",
                circle.join(" -> ")
            );
        }
    }
}

#[test]
fn imports_are_read_from_paths_and_groups() {
    let source = "use crate::{apply::x, conditions, Error, events::{A, b}};\nfn f() { crate::status::g(); }\n#[cfg(test)]\nmod tests { use crate::run; }";
    let found: Vec<String> = imports(source).into_iter().collect();
    assert_eq!(found, ["apply", "conditions", "events", "status"]);
}
