//! `cargo xtask check-docs`: what the documentation points at exists.
//!
//! It reads `README.md`, `CHANGELOG.md`, every `docs/**/*.md` and every
//! `operators/**/README.md`, and fails, naming the file and line, on
//!
//! - a relative link (`[text](path)`, `[text](path#anchor)`, `![alt](path)`, or a
//!   reference definition `[name]: path`) to a file that does not exist, or to a heading
//!   that the markdown file it points at does not have (anchors as GitHub makes them:
//!   lowercase, spaces to `-`, punctuation other than `-` and `_` dropped, `-1`, `-2`, ...
//!   for repeated headings);
//! - a `cargo xtask ...` command, in a code block or in inline code, naming a subcommand,
//!   a nested subcommand or a long option that the command line does not have. The
//!   command line is clap's own (`Cli::command()`), so it cannot drift from a list kept by
//!   hand. Placeholders (`<operator>`) stand for any value; `a|b` names alternatives;
//!   `[...]` marks optional parts, whose options are checked all the same.
//!
//! Links to web addresses are not followed.

use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use xtask::support::paths;
use xtask::{say, say_err};

/// One thing wrong in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file, relative to the repository root.
    pub file: PathBuf,
    /// 1-based.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.message)
    }
}

/// Checks the repository's documentation against `cli` (`cargo xtask`'s command line).
pub fn run(cli: clap::Command) -> Result<()> {
    let root = paths::repo_root();
    let files = files(&root)?;
    let problems = check(&root, &files, cli)?;
    if problems.is_empty() {
        say!(
            "check-docs: {} files, every relative link and `cargo xtask` command exists",
            files.len()
        );
        return Ok(());
    }
    for problem in &problems {
        say_err!("{problem}");
    }
    bail!(
        "{} broken link(s) or command(s) in the documentation",
        problems.len()
    )
}

/// The files checked, relative to `root`, sorted.
pub fn files(root: &Path) -> Result<Vec<PathBuf>> {
    fn walk(root: &Path, dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    walk(root, &path, keep, out);
                }
            } else if keep(&path)
                && let Ok(relative) = path.strip_prefix(root)
            {
                out.push(relative.to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    for top in ["README.md", "CHANGELOG.md"] {
        if root.join(top).is_file() {
            out.push(PathBuf::from(top));
        }
    }
    let markdown = |p: &Path| p.extension().is_some_and(|e| e == "md");
    walk(root, &root.join("docs"), &markdown, &mut out);
    let readme = |p: &Path| p.file_name().is_some_and(|n| n == "README.md");
    walk(root, &root.join("operators"), &readme, &mut out);
    out.sort();
    Ok(out)
}

/// Every problem in `files` (relative to `root`).
pub fn check(root: &Path, files: &[PathBuf], cli: clap::Command) -> Result<Vec<Problem>> {
    let mut cli = cli;
    cli.build();
    let mut anchors = Anchors::default();
    let mut problems = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(root.join(file))
            .with_context(|| format!("reading {}", file.display()))?;
        let doc = Doc::parse(&text);
        for (line, destination) in &doc.links {
            if let Err(message) = check_link(root, file, destination, &mut anchors) {
                problems.push(Problem {
                    file: file.clone(),
                    line: *line,
                    message,
                });
            }
        }
        for (line, command) in &doc.commands {
            if let Err(message) = check_command(&cli, command) {
                problems.push(Problem {
                    file: file.clone(),
                    line: *line,
                    message: format!("`cargo xtask{command}`: {message}"),
                });
            }
        }
    }
    Ok(problems)
}

/// What one markdown file mentions: link destinations and `cargo xtask` commands (the text
/// after `cargo xtask`), each with its line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Doc {
    /// Destinations of links, images and reference definitions, outside code.
    pub links: Vec<(usize, String)>,
    /// What follows each `cargo xtask` in code blocks and inline code.
    pub commands: Vec<(usize, String)>,
}

/// A fence that opens a code block: its character and length.
fn fence(line: &str) -> Option<(char, usize)> {
    let trimmed = line.trim_start_matches(' ');
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    let c = trimmed.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let n = trimmed.chars().take_while(|x| *x == c).count();
    (n >= 3).then_some((c, n))
}

/// Whether `line` starts a block of its own (a heading, a list item, a table row, a
/// quote), so that no code span continues into it from the line before.
fn starts_block(line: &str) -> bool {
    let t = line.trim_start();
    let numbered = t.split_once(['.', ')']).is_some_and(|(n, rest)| {
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && rest.starts_with(' ')
    });
    t.starts_with('#')
        || t.starts_with('|')
        || t.starts_with('>')
        || t.starts_with("- ")
        || t.starts_with("* ")
        || t.starts_with("+ ")
        || numbered
}

impl Doc {
    /// Reads a markdown text.
    #[must_use]
    pub fn parse(text: &str) -> Doc {
        let mut doc = Doc::default();
        let lines: Vec<&str> = text.lines().collect();
        let mut open: Option<(char, usize)> = None;
        // A paragraph: its lines, each with its number.
        let mut block: Vec<(usize, &str)> = Vec::new();
        let mut i = 0;
        while i < lines.len() {
            let line = lines[i];
            let number = i + 1;
            i += 1;
            if let Some((c, n)) = open {
                if fence(line).is_some_and(|(c2, n2)| c2 == c && n2 >= n)
                    && line.trim().chars().all(|x| x == c)
                {
                    open = None;
                    continue;
                }
                // A code line; `\` at the end continues the command on the next one.
                let mut code = line.to_owned();
                while code.ends_with('\\') && i < lines.len() && open.is_some() {
                    code.pop();
                    code.push(' ');
                    code.push_str(lines[i]);
                    i += 1;
                }
                doc.code(number, &code);
                continue;
            }
            if let Some(f) = fence(line) {
                doc.prose(&block);
                block.clear();
                open = Some(f);
                continue;
            }
            if line.trim().is_empty() || starts_block(line) {
                doc.prose(&block);
                block.clear();
            }
            if !line.trim().is_empty() {
                block.push((number, line));
            }
            if line.trim_start().starts_with('|') || line.trim_start().starts_with('#') {
                doc.prose(&block);
                block.clear();
            }
        }
        doc.prose(&block);
        doc
    }

    /// A line of a code block.
    fn code(&mut self, number: usize, code: &str) {
        for command in xtask_commands(code) {
            self.commands.push((number, command));
        }
    }

    /// A paragraph outside code blocks: its code spans and its links.
    fn prose(&mut self, block: &[(usize, &str)]) {
        if block.is_empty() {
            return;
        }
        // The paragraph as one text, with the line each byte is on.
        let mut text = String::new();
        let mut line_of = Vec::new();
        for (number, line) in block {
            if !text.is_empty() {
                text.push('\n');
                line_of.push(*number);
            }
            text.push_str(line);
            line_of.extend(std::iter::repeat_n(*number, line.len()));
        }
        line_of.push(block[block.len() - 1].0);
        let bytes = text.as_bytes();
        // Text outside code spans, with where it starts.
        let mut plain: Vec<(usize, &str)> = Vec::new();
        let mut start = 0;
        let mut at = 0;
        while at < bytes.len() {
            if bytes[at] != b'`' {
                at += 1;
                continue;
            }
            let run = bytes[at..].iter().take_while(|b| **b == b'`').count();
            // The closing run: exactly as many backticks.
            let mut close = None;
            let mut j = at + run;
            while j < bytes.len() {
                if bytes[j] == b'`' {
                    let n = bytes[j..].iter().take_while(|b| **b == b'`').count();
                    if n == run {
                        close = Some(j);
                        break;
                    }
                    j += n;
                } else {
                    j += 1;
                }
            }
            let Some(close) = close else {
                at += run;
                continue;
            };
            plain.push((start, &text[start..at]));
            let code = text[at + run..close].replace('\n', " ");
            for command in xtask_commands(&code) {
                self.commands.push((line_of[at], command));
            }
            at = close + run;
            start = at;
        }
        plain.push((start, &text[start..]));
        for (offset, part) in plain {
            for (index, destination) in link_destinations(part) {
                self.links.push((line_of[offset + index], destination));
            }
        }
    }
}

/// The link destinations in `text` (no code in it), each with its byte index: inline
/// links and images `[..](dest)`, and reference definitions `[name]: dest`.
fn link_destinations(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("](") {
        let open = from + found;
        let start = open + 2;
        let rest = &text[start..];
        let destination = if let Some(angled) = rest.strip_prefix('<') {
            angled.split('>').next().unwrap_or_default().to_owned()
        } else {
            let mut depth = 0usize;
            let mut end = rest.len();
            for (i, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => {
                        end = i;
                        break;
                    }
                    ')' => depth -= 1,
                    c if c.is_whitespace() => {
                        end = i;
                        break;
                    }
                    _ => {}
                }
            }
            rest[..end].to_owned()
        };
        out.push((open, destination));
        from = start;
    }
    // `[name]: destination` at the start of a line.
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        if t.starts_with('[')
            && let Some((label, rest)) = t[1..].split_once("]:")
            && !label.is_empty()
            && !label.contains(']')
            && let Some(destination) = rest.split_whitespace().next()
        {
            out.push((offset + line.len() - t.len(), destination.to_owned()));
        }
        offset += line.len();
    }
    out.sort_by_key(|(index, _)| *index);
    out
}

/// Checks one link destination written in `file`.
fn check_link(
    root: &Path,
    file: &Path,
    destination: &str,
    anchors: &mut Anchors,
) -> Result<(), String> {
    if destination.is_empty() {
        return Err("a link without a destination".into());
    }
    if destination.contains("://") || destination.starts_with("mailto:") {
        return Ok(());
    }
    let (path, anchor) = match destination.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (destination, None),
    };
    let path = path
        .split('?')
        .next()
        .unwrap_or_default()
        .replace("%20", " ");
    let target = if path.is_empty() {
        file.to_path_buf()
    } else if let Some(from_root) = path.strip_prefix('/') {
        PathBuf::from(from_root)
    } else {
        file.parent().unwrap_or(Path::new("")).join(&path)
    };
    let Some(target) = normalize(&target) else {
        return Err(format!("`{destination}` leads out of the repository"));
    };
    let full = root.join(&target);
    if !full.exists() {
        return Err(format!("`{destination}`: there is no {}", target.display()));
    }
    let Some(anchor) = anchor.filter(|a| !a.is_empty()) else {
        return Ok(());
    };
    if full.extension().is_none_or(|e| e != "md") {
        return Ok(());
    }
    let known = anchors.of(&full);
    if known.iter().any(|a| a == anchor) {
        return Ok(());
    }
    Err(format!(
        "`{destination}`: {} has no heading with the anchor `#{anchor}`",
        target.display()
    ))
}

/// `path` without `.` and `..` (relative to the repository root); `None` when it climbs
/// above it.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// The heading anchors of markdown files, read once each.
#[derive(Default)]
struct Anchors(BTreeMap<PathBuf, Vec<String>>);

impl Anchors {
    fn of(&mut self, file: &Path) -> &[String] {
        self.0
            .entry(file.to_path_buf())
            .or_insert_with(|| heading_anchors(&std::fs::read_to_string(file).unwrap_or_default()))
    }
}

/// The anchors GitHub gives the headings of a markdown text, in order.
#[must_use]
pub fn heading_anchors(text: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    let mut open: Option<(char, usize)> = None;
    let mut previous = "";
    for line in text.lines() {
        if let Some((c, n)) = open {
            if fence(line).is_some_and(|(c2, n2)| c2 == c && n2 >= n) {
                open = None;
            }
            previous = "";
            continue;
        }
        if let Some(f) = fence(line) {
            open = Some(f);
            previous = "";
            continue;
        }
        let t = line.trim();
        let heading = if let Some(rest) = atx_heading(line) {
            Some(rest)
        } else if !t.is_empty()
            && (t.chars().all(|c| c == '=') || (t.len() >= 2 && t.chars().all(|c| c == '-')))
            && !previous.trim().is_empty()
            && !starts_block(previous)
        {
            // A setext heading: the text is the line before.
            Some(previous.trim().to_owned())
        } else {
            None
        };
        if let Some(heading) = heading {
            let slug = slug(&heading);
            let n = seen.entry(slug.clone()).or_insert(0);
            out.push(if *n == 0 { slug } else { format!("{slug}-{n}") });
            *n += 1;
        }
        previous = line;
    }
    out
}

/// The text of an ATX heading (`## Text ##`).
fn atx_heading(line: &str) -> Option<String> {
    let trimmed = line.trim_start_matches(' ');
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    let level = trimmed.chars().take_while(|c| *c == '#').count();
    if level == 0 || level > 6 {
        return None;
    }
    let rest = &trimmed[level..];
    if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
        return None;
    }
    let rest = rest.trim();
    // A closing sequence of `#`s, after a space.
    let rest = match rest.trim_end_matches('#') {
        r if r.is_empty() || r.ends_with([' ', '\t']) => r.trim_end(),
        _ => rest,
    };
    Some(rest.to_owned())
}

/// GitHub's anchor of a heading's text: link targets dropped (their text stays),
/// lowercase, spaces to `-`, everything but letters, digits, `-` and `_` dropped.
#[must_use]
pub fn slug(heading: &str) -> String {
    // `[text](target)` -> `text`
    let mut text = String::new();
    let mut rest = heading;
    while let Some(i) = rest.find("](") {
        text.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        rest = after.find(')').map_or("", |j| &after[j + 1..]);
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// What follows each `cargo xtask` in a piece of code, up to the end of its shell command.
#[must_use]
pub fn xtask_commands(code: &str) -> Vec<String> {
    const START: &str = "cargo xtask";
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = code[from..].find(START) {
        let start = from + found + START.len();
        from = start;
        let rest = &code[start..];
        if !(rest.is_empty() || rest.starts_with(char::is_whitespace)) {
            continue;
        }
        // The command ends at a comment, a command separator or a closing parenthesis
        // outside a placeholder.
        let mut end = rest.len();
        let mut depth = 0usize;
        let bytes = rest.as_bytes();
        for (i, c) in rest.char_indices() {
            let space_before = i == 0 || bytes[i - 1].is_ascii_whitespace();
            let space_after = bytes.get(i + 1).is_none_or(u8::is_ascii_whitespace);
            match c {
                '<' | '[' => depth += 1,
                '>' | ']' if depth > 0 => depth -= 1,
                '#' if space_before => {
                    end = i;
                    break;
                }
                ';' | ')' | '`' if depth == 0 => {
                    end = i;
                    break;
                }
                '&' | '>' if depth == 0 => {
                    end = i;
                    break;
                }
                '|' if depth == 0 && space_before && space_after => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        out.push(rest[..end].trim_end().to_owned());
    }
    out
}

/// A word that stands for a value: `<operator>`, `$VAR`, `...`.
fn placeholder(word: &str) -> bool {
    word.starts_with('<')
        || word.starts_with('$')
        || word.starts_with('"')
        || word.starts_with('\'')
        || word.chars().all(|c| c == '.' || c == '…')
}

/// Checks what follows `cargo xtask` (`command`) against the command line `cli`.
pub fn check_command(cli: &clap::Command, command: &str) -> Result<(), String> {
    let words = words(command);
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    walk(cli, "cargo xtask", &words)
}

/// The words of a command; placeholders (`<a b>`) stay whole, `[` `]` around optional
/// parts are dropped.
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut depth = 0usize;
    for c in command.chars() {
        match c {
            '<' => {
                depth += 1;
                word.push(c);
            }
            '>' if depth > 0 => {
                depth -= 1;
                word.push(c);
            }
            '[' | ']' if depth == 0 => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            c if c.is_whitespace() && depth == 0 => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

fn walk(command: &clap::Command, path: &str, words: &[&str]) -> Result<(), String> {
    let mut i = 0;
    let mut values = false;
    while i < words.len() {
        let word = words[i];
        i += 1;
        if word == "--" {
            // The rest is for the program `cargo xtask` runs.
            return Ok(());
        }
        if let Some(flag) = word.strip_prefix("--") {
            let (name, inline) = match flag.split_once('=') {
                Some((name, _)) => (name, true),
                None => (flag, false),
            };
            if placeholder(name) {
                continue;
            }
            let arg = command.get_arguments().find(|a| {
                a.get_long() == Some(name) || a.get_all_aliases().is_some_and(|x| x.contains(&name))
            });
            let Some(arg) = arg else {
                return Err(format!("`{path}` has no option `--{name}`"));
            };
            if arg.get_action().takes_values() && !inline {
                i += 1;
            }
            continue;
        }
        if let Some(short) = word.strip_prefix('-').filter(|s| !s.is_empty()) {
            let Some(c) = short.chars().next() else {
                continue;
            };
            let arg = command.get_arguments().find(|a| a.get_short() == Some(c));
            let Some(arg) = arg else {
                return Err(format!("`{path}` has no option `-{c}`"));
            };
            if arg.get_action().takes_values() && short.len() == 1 {
                i += 1;
            }
            continue;
        }
        let takes_values = command.get_positionals().next().is_some();
        if command.has_subcommands() && !values {
            if placeholder(word) {
                // `cargo xtask <command>`: any subcommand.
                return Ok(());
            }
            for alternative in word.split('|') {
                let Some(sub) = command.find_subcommand(alternative) else {
                    let known: Vec<&str> = command
                        .get_subcommands()
                        .map(clap::Command::get_name)
                        .collect();
                    return Err(format!(
                        "`{path}` has no subcommand `{alternative}` (it has: {})",
                        known.join(", ")
                    ));
                };
                walk(sub, &format!("{path} {}", sub.get_name()), &words[i..])?;
            }
            return Ok(());
        }
        if !takes_values {
            return Err(format!("`{path}` takes no argument `{word}`"));
        }
        values = true;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command line shaped like `cargo xtask`'s.
    fn cli() -> clap::Command {
        use clap::{Arg, ArgAction, Command};
        let mut cli = Command::new("cargo xtask")
            .subcommand(
                Command::new("cluster")
                    .subcommand(Command::new("up"))
                    .subcommand(Command::new("down"))
                    .subcommand(Command::new("stop").arg(Arg::new("process"))),
            )
            .subcommand(
                Command::new("deploy")
                    .arg(Arg::new("operator").required(true))
                    .arg(Arg::new("registry").long("registry"))
                    .arg(Arg::new("namespaced").long("namespaced")),
            )
            .subcommand(
                Command::new("bench")
                    .arg(Arg::new("all").long("all").action(ArgAction::SetTrue))
                    .subcommand(
                        Command::new("operator")
                            .arg(Arg::new("objects").long("objects"))
                            .arg(Arg::new("quick").long("quick").action(ArgAction::SetTrue)),
                    ),
            )
            .subcommand(
                Command::new("crds")
                    .arg(Arg::new("check").long("check").action(ArgAction::SetTrue)),
            )
            .subcommand(
                Command::new("run")
                    .arg(Arg::new("operator"))
                    .arg(Arg::new("args").last(true).num_args(0..)),
            );
        cli.build();
        cli
    }

    fn ok(command: &str) -> bool {
        check_command(&cli(), command).is_ok()
    }

    #[test]
    fn slugs_follow_github() {
        assert_eq!(slug("Quick start"), "quick-start");
        assert_eq!(
            slug("Images without a Docker daemon (`cargo xtask image`)"),
            "images-without-a-docker-daemon-cargo-xtask-image"
        );
        assert_eq!(
            slug("Tenants: what one namespace can and cannot do"),
            "tenants-what-one-namespace-can-and-cannot-do"
        );
        assert_eq!(
            slug("Lolcow (`lolcow-operator`) and the web app"),
            "lolcow-lolcow-operator-and-the-web-app"
        );
        assert_eq!(slug("snake_case and 1,000 x 3"), "snake_case-and-1000-x-3");
        assert_eq!(slug("See [the page](page.md) now"), "see-the-page-now");
        assert_ne!(slug("Quick Start!"), "quick-start!");
    }

    #[test]
    fn anchors_of_repeated_and_setext_headings() {
        let text = "# Title\n\n## Usage\n\ntext\n\n## Usage\n\n```sh\n# not a heading\n```\n\nOther\n-----\n";
        assert_eq!(
            heading_anchors(text),
            ["title", "usage", "usage-1", "other"]
        );
    }

    #[test]
    fn links_outside_code_only() {
        let doc = Doc::parse(
            "See [a](a.md) and [b](dir/b.md#part \"title\").\n\
             `[not](code.md)` and ![img](i.svg)\n\
             \n\
             ```md\n[also not](x.md)\n```\n\
             | col | [t](t.md) |\n\
             [ref]: ref.md\n\
             [web](https://example.com/x_(y))\n",
        );
        let links: Vec<(usize, &str)> = doc.links.iter().map(|(l, d)| (*l, d.as_str())).collect();
        assert_eq!(
            links,
            [
                (1, "a.md"),
                (1, "dir/b.md#part"),
                (2, "i.svg"),
                (7, "t.md"),
                (8, "ref.md"),
                (9, "https://example.com/x_(y)"),
            ]
        );
    }

    #[test]
    fn commands_in_code_blocks_and_spans() {
        let doc = Doc::parse(
            "Run `cargo xtask demo`, then\n\
             `cargo xtask\n\
             test --no-e2e` (a span over two lines).\n\
             \n\
             ```sh\n\
             cargo xtask cluster up        # prints the KUBECONFIG line\n\
             export X=$(cargo xtask cluster env) && cargo xtask crds --check\n\
             cargo xtask deploy x \\\n  --registry r\n\
             ```\n\
             Prose about cargo xtask bogus is not code.\n",
        );
        let commands: Vec<(usize, &str)> =
            doc.commands.iter().map(|(l, c)| (*l, c.as_str())).collect();
        assert_eq!(
            commands,
            [
                (1, " demo"),
                (2, " test --no-e2e"),
                (6, " cluster up"),
                (7, " cluster env"),
                (7, " crds --check"),
                (8, " deploy x    --registry r"),
            ]
        );
    }

    #[test]
    fn commands_that_exist_pass() {
        assert!(ok(""));
        assert!(ok(" ..."));
        assert!(ok(" <command>"));
        assert!(ok(" cluster up|down"));
        assert!(ok(" cluster stop etcd"));
        assert!(ok(" deploy <operator> --registry <host:port>"));
        assert!(ok(
            " deploy podset-operator [--registry <host:port>] [--namespaced a,b]"
        ));
        assert!(ok(" deploy x --registry=r"));
        assert!(ok(" bench --all"));
        assert!(ok(" bench operator --objects 1000 --quick"));
        assert!(ok(" crds --check"));
        assert!(ok(" crds --help"));
        assert!(ok(" help deploy"));
        assert!(ok(" run podset-operator -- --watch-namespace=a --anything"));
    }

    #[test]
    fn commands_that_do_not_exist_fail() {
        let err = |c: &str| check_command(&cli(), c).unwrap_err();
        assert!(err(" new thing").contains("no subcommand `new`"));
        assert!(
            err(" cluster sideways").contains("`cargo xtask cluster` has no subcommand `sideways`")
        );
        assert!(err(" cluster up|sideways").contains("`sideways`"));
        assert!(err(" crds --chek").contains("`cargo xtask crds` has no option `--chek`"));
        assert!(err(" bench operator --objects 5 --fast").contains("`--fast`"));
        assert!(err(" deploy x [--image <ref>]").contains("`--image`"));
        assert!(err(" crds extra").contains("takes no argument `extra`"));
        assert!(err(" bench nothing").contains("no subcommand `nothing`"));
    }

    #[test]
    fn broken_links_and_anchors_fail() {
        let root = std::env::temp_dir().join(format!("check-docs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("docs")).unwrap();
        let write = |path: &str, text: &str| std::fs::write(root.join(path), text);
        write(
            "README.md",
            "# Top\n\n## Install\n\n[ok](docs/a.md#part-one) [ok](#install) [dir](docs)\n\
             [gone](docs/gone.md) [no anchor](docs/a.md#part-two) [up](../../x.md)\n\
             `cargo xtask crds --check` `cargo xtask crds --nope`\n",
        )
        .unwrap();
        write(
            "docs/a.md",
            "# A\n\n## Part one\n\n[back](../README.md#top)\n",
        )
        .unwrap();
        let files = files(&root).unwrap();
        assert_eq!(
            files,
            [PathBuf::from("README.md"), PathBuf::from("docs/a.md")]
        );
        let problems = check(&root, &files, cli()).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(shown.len(), 4, "{shown:#?}");
        assert!(shown[0].starts_with("README.md:6: `docs/gone.md`: there is no docs/gone.md"));
        assert!(
            shown[1].starts_with("README.md:6: `docs/a.md#part-two`: docs/a.md has no heading")
        );
        assert!(shown[2].starts_with("README.md:6: `../../x.md` leads out"));
        assert!(shown[3].starts_with("README.md:7: `cargo xtask crds --nope`"));
    }

    /// The repository's own documentation passes, against the real command line.
    #[test]
    fn the_repository_docs_pass() {
        use clap::CommandFactory;
        let root = paths::repo_root();
        let files = files(&root).unwrap();
        assert!(files.iter().any(|f| f == Path::new("README.md")));
        let problems = check(&root, &files, crate::Cli::command()).unwrap();
        let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(shown.is_empty(), "{}", shown.join("\n"));
    }
}
