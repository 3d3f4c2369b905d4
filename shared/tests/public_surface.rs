//! The crate's public surface is exactly what the operators call: every public item (at
//! any public path from the crate root) is named by some operator's source (or by
//! `shared-testing`, their tests' kit; the few types only met through a public signature
//! are listed with their reason), and each
//! name is public at one path only (no `shared::X` beside `shared::module::X`, no two
//! public items of one name). Items public inside private modules are the runner's:
//! `unreachable_pub` (in `lib.rs`) keeps them `pub(crate)`.
//!
//! Read with `syn` from the sources, so the check needs no nightly rustdoc.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use syn::{Item, UseTree, Visibility};

/// Whether `vis` is plain `pub` (not `pub(crate)` or `pub(super)`).
fn is_pub(vis: &Visibility) -> bool {
    matches!(vis, Visibility::Public(_))
}

/// Whether `attrs` hold `#[cfg(test)]`.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && quote::ToTokens::to_token_stream(&a.meta)
                .to_string()
                .contains("test")
    })
}

/// The file of module `name` declared in `file` (`a.rs` declares `a/name.rs` or
/// `a/name/mod.rs`; `lib.rs` and `mod.rs` declare their siblings).
fn module_file(file: &Path, name: &str) -> PathBuf {
    let dir = match file.file_name().and_then(|f| f.to_str()) {
        Some("lib.rs" | "mod.rs") => file.parent().unwrap().to_path_buf(),
        _ => file.with_extension(""),
    };
    let flat = dir.join(format!("{name}.rs"));
    if flat.exists() {
        flat
    } else {
        dir.join(name).join("mod.rs")
    }
}

/// The names a `pub use` tree brings in (`a::{B, c::D as E}` -> `B`, `E`).
fn use_names(tree: &UseTree, out: &mut Vec<String>) {
    match tree {
        UseTree::Path(p) => use_names(&p.tree, out),
        UseTree::Name(n) => out.push(n.ident.to_string()),
        UseTree::Rename(r) => out.push(r.rename.to_string()),
        UseTree::Glob(_) => out.push("*".to_owned()),
        UseTree::Group(g) => g.items.iter().for_each(|t| use_names(t, out)),
    }
}

/// Every public item reachable from the crate root: name -> the paths it is public at.
fn public_items(
    file: &Path,
    items: &[Item],
    prefix: &str,
    out: &mut BTreeMap<String, Vec<String>>,
) {
    for item in items {
        let (vis, name, attrs) = match item {
            Item::Fn(i) => (&i.vis, i.sig.ident.to_string(), &i.attrs),
            Item::Struct(i) => (&i.vis, i.ident.to_string(), &i.attrs),
            Item::Enum(i) => (&i.vis, i.ident.to_string(), &i.attrs),
            Item::Trait(i) => (&i.vis, i.ident.to_string(), &i.attrs),
            Item::Const(i) => (&i.vis, i.ident.to_string(), &i.attrs),
            Item::Static(i) => (&i.vis, i.ident.to_string(), &i.attrs),
            Item::Type(i) => (&i.vis, i.ident.to_string(), &i.attrs),
            Item::Use(i) => {
                if is_pub(&i.vis) && !is_test_only(&i.attrs) {
                    let mut names = Vec::new();
                    use_names(&i.tree, &mut names);
                    for name in names {
                        out.entry(name.clone())
                            .or_default()
                            .push(format!("{prefix}::{name}"));
                    }
                }
                continue;
            }
            Item::Mod(m) => {
                if !is_pub(&m.vis) || is_test_only(&m.attrs) {
                    continue;
                }
                let name = m.ident.to_string();
                let path = format!("{prefix}::{name}");
                match &m.content {
                    Some((_, inline)) => public_items(file, inline, &path, out),
                    None => {
                        let child = module_file(file, &name);
                        let source = std::fs::read_to_string(&child)
                            .unwrap_or_else(|e| panic!("{}: {e}", child.display()));
                        let parsed = syn::parse_file(&source).unwrap();
                        public_items(&child, &parsed.items, &path, out);
                    }
                }
                continue;
            }
            _ => continue,
        };
        if is_pub(vis) && !is_test_only(attrs) {
            let path = format!("{prefix}::{name}");
            out.entry(name).or_default().push(path);
        }
    }
}

/// The crate's public items: name -> paths.
fn surface() -> BTreeMap<String, Vec<String>> {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
    let parsed = syn::parse_file(&std::fs::read_to_string(&lib).unwrap()).unwrap();
    let mut out = BTreeMap::new();
    public_items(&lib, &parsed.items, "shared", &mut out);
    out
}

/// Public items no operator names, each with why it is public all the same.
const PUBLIC_UNNAMED: &[(&str, &str)] = &[
    (
        "Watched",
        "the bound of `Scope::reflect`: operators meet it through the kinds they watch",
    ),
    (
        "Pairs",
        "the type of a cached object's labels (`Slim::labels`, `SlimPod::labels`)",
    ),
    ("SlimPodStatus", "the type of `SlimPod::status`"),
    (
        "MAX_KEPT_FINALIZERS",
        "the bound the crate's test of cached sizes checks (tests/cache_bounds.rs)",
    ),
    (
        "set_field_manager",
        "tests/cache_bounds.rs sets the manager the runner sets at start",
    ),
];

/// Every Rust source of the operators (their binaries and tests; not the apps they ship)
/// and of `shared-testing`, the kit of their reconcile tests.
fn operator_sources() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = String::new();
    let mut dirs = vec![root.join("../operators"), root.join("testing")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                all.push_str(&std::fs::read_to_string(&path).unwrap());
                all.push('\n');
            }
        }
    }
    all
}

/// Whether `word` occurs in `text` as a whole identifier.
fn names(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

#[test]
fn every_public_item_is_named_by_an_operator() {
    let sources = operator_sources();
    let surface = surface();
    for (name, why) in PUBLIC_UNNAMED {
        assert!(
            surface.contains_key(*name) && !names(&sources, name),
            "{name} is listed as public and unnamed ({why}) but is not (any more)"
        );
    }
    let unused: Vec<String> = surface
        .into_iter()
        .filter(|(name, _)| {
            name != "*"
                && !names(&sources, name)
                && !PUBLIC_UNNAMED.iter().any(|(unnamed, _)| unnamed == name)
        })
        .flat_map(|(_, paths)| paths)
        .collect();
    assert!(
        unused.is_empty(),
        "public in `shared` but named by no operator (make them pub(crate), or remove them): {unused:#?}"
    );
}

#[test]
fn each_public_name_is_at_one_path() {
    let twice: Vec<(String, Vec<String>)> = surface()
        .into_iter()
        .filter(|(name, paths)| name == "*" || paths.len() > 1)
        .collect();
    assert!(
        twice.is_empty(),
        "public in `shared` at more than one path (or a glob re-export): {twice:#?}"
    );
}

#[test]
fn the_reader_finds_items_re_exports_and_modules() {
    let source = "pub mod a { pub fn f() {} pub(crate) fn g() {} #[cfg(test)] pub mod t { pub fn h() {} } }\n\
                  mod hidden { pub fn i() {} }\npub use a::{f as j, f};\npub struct S;";
    let parsed = syn::parse_file(source).unwrap();
    let mut out = BTreeMap::new();
    public_items(Path::new("lib.rs"), &parsed.items, "shared", &mut out);
    let found: Vec<(&str, usize)> = out.iter().map(|(n, p)| (n.as_str(), p.len())).collect();
    assert_eq!(found, [("S", 1), ("f", 2), ("j", 1)]);
    assert!(names("use shared::a::f;", "f"));
    assert!(!names("fn fa() {}", "f"));
}
