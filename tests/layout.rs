//! The code's shape, as the README's Development section promises it: no
//! import cycle between the files of one folder of `src/`, and no function
//! of product code longer than a screen (80 lines), but for declarative
//! registration. Read off the source text; no broker needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FUNCTION_LINES: usize = 80;
/// Declarative: one metric registered after another, and the table of
/// error codes with the README's words for each.
const LONG_BY_DESIGN: [(&str, &str); 2] =
    [("src/metrics/mod.rs", "new"), ("src/http/codes.rs", "when")];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The product code of a file: without its `#[cfg(test)] mod tests`, and
/// nothing of the files that are tests only. Comment lines are kept blank
/// (a link in a doc comment is no import).
fn product_text(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    if matches!(name, "tests.rs" | "fuzz.rs" | "build.rs") {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    let code = text.lines().map(|line| {
        if line.trim_start().starts_with("//") {
            ""
        } else {
            line
        }
    });
    Some(code.collect::<Vec<_>>().join("\n"))
}

/// The module path of a file: `src/ledger/writer.rs` is `["ledger", "writer"]`.
fn module_of(path: &Path) -> Vec<String> {
    let relative = path.strip_prefix(src()).unwrap().with_extension("");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_str().unwrap().to_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The file that defines module `path` (the deepest one that exists).
fn file_of(mut path: Vec<String>) -> Option<PathBuf> {
    while !path.is_empty() {
        let base = src().join(path.join("/"));
        for candidate in [base.with_extension("rs"), base.join("mod.rs")] {
            if candidate.is_file() {
                return Some(candidate);
            }
        }
        path.pop();
    }
    None
}

/// The paths a text names through `crate::` and `super::`, with the first
/// level of a `{…}` group expanded.
fn named_paths(text: &str, own: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    for (at, root) in text
        .match_indices("crate::")
        .chain(text.match_indices("super::"))
    {
        let before = text[..at].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let mut base: Vec<String> = if root == "crate::" {
            Vec::new()
        } else {
            own[..own.len().saturating_sub(1)].to_vec()
        };
        let mut rest = &text[at + root.len()..];
        loop {
            let word: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if word.is_empty() {
                break;
            }
            base.push(word.clone());
            rest = &rest[word.len()..];
            match rest.strip_prefix("::") {
                Some(tail) => rest = tail,
                None => break,
            }
        }
        if let Some(group) = rest.strip_prefix('{') {
            for item in group_items(group) {
                let word: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !word.is_empty() && word != "self" {
                    let mut path = base.clone();
                    path.push(word);
                    paths.push(path);
                }
            }
        }
        paths.push(base);
    }
    paths
}

/// The items of a `{…}` group (its text after the `{`), at its first level.
fn group_items(group: &str) -> Vec<String> {
    let (mut depth, mut item, mut items) = (0, String::new(), Vec::new());
    for c in group.chars() {
        match c {
            '}' if depth == 0 => break,
            ',' if depth == 0 => items.push(std::mem::take(&mut item)),
            _ => {
                depth += i32::from(c == '{') - i32::from(c == '}');
                item.push(c);
            }
        }
    }
    items.push(item);
    items
}

#[test]
fn no_import_cycle_between_the_files_of_one_folder() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    // Edges between sibling files; a folder's mod.rs (or lib.rs) is its
    // root, which declares the others, and is left out.
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in &files {
        let name = file.file_name().unwrap().to_str().unwrap();
        if matches!(name, "mod.rs" | "lib.rs" | "main.rs") {
            continue;
        }
        let Some(text) = product_text(file) else {
            continue;
        };
        let own = module_of(file);
        let targets = edges.entry(file.clone()).or_default();
        for path in named_paths(&text, &own) {
            let Some(target) = file_of(path) else {
                continue;
            };
            let root = target.file_name().unwrap() == "mod.rs";
            if target != *file && !root && target.parent() == file.parent() {
                targets.insert(target);
            }
        }
    }
    for start in edges.keys() {
        // Depth-first from each file: reaching it again is a cycle.
        let mut stack: Vec<(PathBuf, Vec<PathBuf>)> = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                let mut trail = trail.clone();
                trail.push(next.clone());
                assert!(
                    next != start,
                    "an import cycle: {:?}",
                    trail
                        .iter()
                        .map(|p| p.strip_prefix(src()).unwrap().display().to_string())
                        .collect::<Vec<_>>()
                );
                if seen.insert(next.clone()) {
                    stack.push((next.clone(), trail));
                }
            }
        }
    }
    assert!(edges.len() > 40, "too few files read: {}", edges.len());
}

#[test]
fn no_product_function_is_longer_than_a_screen() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut long = Vec::new();
    for file in &files {
        let Some(text) = product_text(file) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        for (start, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            let signature = ["fn ", "pub fn ", "async fn ", "pub async fn ", "const fn "]
                .iter()
                .chain(&["pub(crate) fn ", "pub(super) fn ", "pub(crate) async fn "])
                .chain(&["pub(super) async fn ", "pub const fn "])
                .find_map(|prefix| trimmed.strip_prefix(prefix));
            let Some(signature) = signature else {
                continue;
            };
            let name: String = signature
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            // A declaration without a body (a trait's) ends with `;`.
            let opens = lines[start..]
                .iter()
                .find(|l| l.trim_end().ends_with('{') || l.trim_end().ends_with(';'));
            if opens.is_none_or(|l| l.trim_end().ends_with(';')) {
                continue;
            }
            let close = format!("{indent}}}");
            let Some(end) = lines[start..].iter().position(|l| *l == close) else {
                continue;
            };
            let relative = file
                .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                .unwrap()
                .display()
                .to_string();
            if end + 1 > MAX_FUNCTION_LINES
                && !LONG_BY_DESIGN.contains(&(relative.as_str(), name.as_str()))
            {
                long.push(format!("{relative}: {name} ({} lines)", end + 1));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines: {long:#?}"
    );
}
