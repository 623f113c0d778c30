//! The code's shape, as the map at the top of `src/lib.rs` and the guide's
//! Development page (`docs/development.md`) promise it: no import circle
//! between any two files of `src/`; every room imports only rooms the map lists after it;
//! configuration, the wall clock, header names and the statements on tasks
//! each in the one place the map names; and no function of product code
//! longer than a screen (80 lines), but for declarative registration; the
//! Development page names every room and every test module. Read
//! off the source text; no broker needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FUNCTION_LINES: usize = 80;
/// Declarative: one metric registered after another, and the table of
/// error codes with the API reference's words for each.
const LONG_BY_DESIGN: [(&str, &str); 2] = [
    ("src/metrics/registry.rs", "new"),
    ("src/http/codes.rs", "when"),
];

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
    let text = match text.find("#[cfg(test)]\nmod tests {") {
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

/// The child modules a `mod.rs` (or `lib.rs`) declares.
fn declared_children(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = ["pub mod ", "pub(crate) mod ", "mod "]
                .iter()
                .find_map(|prefix| line.strip_prefix(prefix))?;
            rest.strip_suffix(';').map(str::to_owned)
        })
        .collect()
}

/// What a folder's root says of its children, without what it only hands
/// on: `pub use child::…` re-exports and `mod child;` declarations are no
/// arrows; any other mention of a child (`child::f()`, `use child::X`) is.
fn uses_of_children(text: &str, own: &[String]) -> Vec<Vec<String>> {
    let children = declared_children(text);
    let mut paths = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("pub use ")
            || trimmed.starts_with("pub(crate) use ")
            || trimmed.starts_with("mod ")
            || trimmed.starts_with("pub mod ")
            || trimmed.starts_with("pub(crate) mod ")
        {
            continue;
        }
        for child in &children {
            let needle = format!("{child}::");
            for (at, _) in line.match_indices(&needle) {
                let before = line[..at].chars().last();
                if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    let mut path = own.to_vec();
                    path.push(child.clone());
                    paths.push(path);
                }
            }
        }
    }
    paths
}

/// The names a folder's root (`mod.rs`, `lib.rs`) hands on, each with the
/// module path it comes from: `pub use publisher::{Publisher, …};` in
/// `broker/mod.rs` maps `Publisher` to `["broker", "publisher", "Publisher"]`.
fn re_exports(root: &Path) -> BTreeMap<String, Vec<String>> {
    let Some(text) = product_text(root) else {
        return BTreeMap::new();
    };
    let own = module_of(root);
    let mut names = BTreeMap::new();
    for statement in text.split(';') {
        let statement = statement.trim();
        let Some(path) = ["pub use ", "pub(crate) use "]
            .iter()
            .find_map(|prefix| statement.strip_prefix(prefix))
        else {
            continue;
        };
        let (base, items) = match path.split_once("::{") {
            Some((base, group)) => (base, group_items(group)),
            None => match path.rsplit_once("::") {
                Some((base, item)) => (base, vec![item.to_owned()]),
                None => continue,
            },
        };
        let mut from: Vec<String> = base.split("::").map(str::to_owned).collect();
        match from[0].as_str() {
            "crate" => {
                from.remove(0);
            }
            "super" => {
                from.remove(0);
                from.splice(0..0, own[..own.len().saturating_sub(1)].iter().cloned());
            }
            _ => {
                from.splice(0..0, own.iter().cloned());
            }
        }
        for item in items {
            let item = item.trim();
            let (original, name) = item.split_once(" as ").unwrap_or((item, item));
            if name.is_empty() || name == "self" {
                continue;
            }
            let mut path = from.clone();
            path.extend(original.trim().split("::").map(str::to_owned));
            names.insert(name.trim().to_owned(), path);
        }
    }
    names
}

/// The file that defines what `path` names, through the re-exports of
/// folder roots: a name a `mod.rs` only hands on is its child's.
fn defining_file(path: Vec<String>, depth: usize) -> Option<PathBuf> {
    let file = file_of(path.clone())?;
    let name = file.file_name()?.to_str()?;
    if depth < 6 && matches!(name, "mod.rs" | "lib.rs") {
        let module = module_of(&file);
        if let Some(item) = path.get(module.len())
            && let Some(origin) = re_exports(&file).remove(item)
        {
            return defining_file(origin, depth + 1).or(Some(file));
        }
    }
    Some(file)
}

/// Every product file of `src/` with the files it imports (`crate::` and
/// `super::` paths, and a folder root's own uses of its children), each
/// import followed through re-exports to the file that defines the name.
fn import_graph() -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in &files {
        let name = file.file_name().unwrap().to_str().unwrap();
        if name == "main.rs" {
            continue;
        }
        let Some(text) = product_text(file) else {
            continue;
        };
        let own = module_of(file);
        let mut paths = named_paths(&text, &own);
        if matches!(name, "mod.rs" | "lib.rs") {
            paths.extend(uses_of_children(&text, &own));
        }
        let targets = edges.entry(file.clone()).or_default();
        for path in paths {
            if let Some(target) = defining_file(path, 0).filter(|t| t != file) {
                targets.insert(target);
            }
        }
    }
    edges
}

fn shown(path: &Path) -> String {
    path.strip_prefix(src()).unwrap().display().to_string()
}

#[test]
fn no_import_circle_between_any_two_files() {
    let edges = import_graph();
    for start in edges.keys() {
        // Depth-first from each file: reaching it again is a circle.
        let mut stack: Vec<(PathBuf, Vec<PathBuf>)> = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                let mut trail = trail.clone();
                trail.push(next.clone());
                let circle: Vec<String> = trail.iter().map(|p| shown(p)).collect();
                assert!(next != start, "an import circle: {circle:?}");
                if seen.insert(next.clone()) {
                    stack.push((next.clone(), trail));
                }
            }
        }
    }
    assert!(edges.len() > 80, "too few files read: {}", edges.len());
}

/// The rooms of `lib.rs`'s map, in the order it lists them (top floor first).
fn rooms_of_the_map() -> Vec<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let mut rooms = Vec::new();
    for line in lib.lines() {
        let Some(bullet) = line.strip_prefix("//! - ") else {
            continue;
        };
        let head = bullet.split(':').next().unwrap_or_default();
        for link in head.split(", ") {
            if let Some(room) = link.strip_prefix("[`").and_then(|l| l.strip_suffix("`]")) {
                rooms.push(room.to_owned());
            }
        }
    }
    rooms
}

/// The room a file belongs to: `src/ledger/sql.rs` is `ledger`.
fn room_of(path: &Path) -> String {
    let first = path.strip_prefix(src()).unwrap().iter().next().unwrap();
    first.to_str().unwrap().trim_end_matches(".rs").to_owned()
}

#[test]
fn every_room_imports_only_rooms_the_map_lists_after_it() {
    let rooms = rooms_of_the_map();
    assert!(rooms.len() >= 20, "the map lists too few rooms: {rooms:?}");
    let place = |room: &str| rooms.iter().position(|r| r == room);
    let mut wrong = Vec::new();
    for (file, targets) in import_graph() {
        let from = room_of(&file);
        if from == "lib" {
            continue;
        }
        let Some(from_at) = place(&from) else {
            panic!("{} is in no room of the map", shown(&file));
        };
        for target in targets {
            let to = room_of(&target);
            if to != from && place(&to).is_none_or(|to_at| to_at < from_at) {
                wrong.push(format!("{} -> {}", shown(&file), shown(&target)));
            }
        }
    }
    assert!(wrong.is_empty(), "imports running up the map: {wrong:#?}");
}

/// Product files (as `src/`-relative paths) whose code `matches`.
fn files_where(matches: impl Fn(&str) -> bool) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut found: Vec<String> = files
        .iter()
        .filter(|file| product_text(file).is_some_and(|text| matches(&text)))
        .map(|file| shown(file))
        .collect();
    found.sort();
    found
}

/// Whether `text` holds one of `words` not followed by a letter, digit or `_`.
fn has_word(text: &str, words: &[String]) -> bool {
    words.iter().any(|word| {
        text.match_indices(word.as_str()).any(|(at, _)| {
            let after = text[at + word.len()..].chars().next();
            !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    })
}

#[test]
fn configuration_is_imported_only_by_the_rooms_above_config() {
    let rooms = rooms_of_the_map();
    let config = rooms.iter().position(|r| r == "config").unwrap();
    let above = &rooms[..config];
    let importers = files_where(|text| has_word(text, &["crate::config".to_owned()]));
    let below: Vec<&String> = importers
        .iter()
        .filter(|file| !above.contains(&room_of(&src().join(file))))
        .filter(|file| file.as_str() != "config.rs")
        .collect();
    assert!(below.is_empty(), "config imported below it: {below:?}");
    assert!(importers.len() >= 3, "{importers:?}");
}

#[test]
fn the_wall_clock_is_read_only_in_the_clock_room() {
    let readers = files_where(|text| text.contains("SystemTime::now()"));
    assert_eq!(readers, ["clock.rs"]);
}

/// A task's route, the shard its id picks and its due time are decided in
/// one place, `task::Itinerary`, for every entry point (the compiler sees
/// that no task is written as a literal outside `task/model.rs`). Moving
/// a chain's raw messages (`broker/migrate.rs`) shards messages, not tasks.
#[test]
fn a_tasks_shard_is_chosen_only_where_its_itinerary_is_made() {
    let choosers = files_where(|text| text.contains(".in_task_shard("));
    assert_eq!(choosers, ["broker/migrate.rs", "task/model.rs"]);
}

/// The control plane reaches a way of delaying through the seam the
/// Development page describes (`Cascade`'s methods, `Route`,
/// `TopologyPlan`, `release::ArrivalWatch`), never through the cascade's
/// internals: those are the cascade's run time's (`chain`), the broker's
/// (which declares and moves the chain's objects) and `message`'s.
#[test]
fn the_control_plane_names_none_of_the_cascades_internals() {
    let internals = [
        "LossWindow",
        "LevelLoad",
        "Planned",
        "Evidence",
        "LevelWatch",
        "digit_position",
        "levels_left",
        "probe_units",
        "units_below",
        "destination_of",
        "digit_pattern",
        "ledger_marker_name",
        "level_exchange_name",
        "level_queue_name",
        "poison_queue_name",
        "release_queue_name",
        "unroutable_exchange_name",
        "unroutable_queue_name",
        "unroutable_seen_queue_name",
    ];
    let control_plane = ["scheduler/", "release/", "ingress/", "http/", "operations/"];
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut named = Vec::new();
    for file in &files {
        let shown = shown(file);
        if !control_plane.iter().any(|room| shown.starts_with(room)) {
            continue;
        }
        let Some(text) = product_text(file) else {
            continue;
        };
        for item in paths_into_cascade(&text) {
            if internals.contains(&item.as_str()) {
                named.push(format!("{shown}: {item}"));
            }
        }
    }
    assert!(
        named.is_empty(),
        "the cascade's internals named by the control plane: {named:?}"
    );
}

/// Every name a path into the cascade's module reaches, however the path
/// starts (`crate::cascade::X`, or `cascade::X` after `use crate::cascade;`,
/// `super::cascade::`) and however deep it goes (`cascade::plan::X`,
/// `cascade::{plan::{X, Y}}`): a check that read only `crate::cascade::X`
/// let the other spellings through.
fn paths_into_cascade(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in text.match_indices("cascade::") {
        let before = text[..at].chars().next_back();
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            names.extend(names_on_path(&text[at + "cascade::".len()..]));
        }
    }
    names
}

/// The names a path's rest reaches: `a::b::C` gives a, b and C; a group
/// (`{a::B, C}`) every name in it, up to its closing brace.
fn names_on_path(rest: &str) -> Vec<String> {
    let is_name = |c: char| c.is_alphanumeric() || c == '_';
    if rest.starts_with('{') {
        let mut depth = 0;
        let group: String = rest
            .chars()
            .take_while(|c| {
                depth += i32::from(*c == '{') - i32::from(*c == '}');
                depth > 0
            })
            .collect();
        return group
            .split(|c: char| !is_name(c))
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
            .collect();
    }
    let name: String = rest.chars().take_while(|c| is_name(*c)).collect();
    let mut names = vec![name.clone()];
    if let Some(deeper) = rest[name.len()..].strip_prefix("::") {
        names.extend(names_on_path(deeper));
    }
    names
}

#[test]
fn a_path_into_the_cascade_is_read_however_it_is_spelled() {
    let text = "use crate::cascade;\nfn f(l: cascade::LevelLoad, b: Bar) {}\n\
                use super::cascade::{plan::{Planned, x}, y};\nlet w = crate::cascade::spread::LossWindow;";
    let names = paths_into_cascade(text);
    for name in ["LevelLoad", "Planned", "x", "y", "LossWindow", "spread"] {
        assert!(names.contains(&name.to_owned()), "{name} in {names:?}");
    }
    assert!(!names.contains(&"Bar".to_owned()), "{names:?}");
    assert!(paths_into_cascade("my_cascade::LevelLoad").is_empty());
}

/// Logs show what they name as text: an AMQP property logged with `?`
/// read `message_id=Some(ShortString("nb-bad-1"))`, a list of ids as Rust's
/// debug form of a vector.
#[test]
fn logs_name_ids_as_text_not_in_rusts_debug_form() {
    let debug_forms = files_where(|text| {
        text.lines().any(|line| {
            line.split(" = ?").skip(1).any(|value| {
                value.contains("message_id()")
                    || value.contains("properties")
                    || value.contains("ids")
            })
        })
    });
    assert!(debug_forms.is_empty(), "{debug_forms:?}");
}

#[test]
fn header_names_are_written_only_in_message_headers() {
    // The quoted start of every header name delayline writes or reads.
    let names = [
        "\"x-delay\"",
        "\"x-delay-ms\"",
        "\"x-deliver-at\"",
        "\"x-deliver-at-ms\"",
        "\"x-delayline-",
        "\"x-death",
        "\"x-first-death",
        "\"x-last-death",
        "\"x-delivery-count\"",
        "\"x-acquired-count\"",
    ];
    let writers = files_where(|text| names.iter().any(|name| text.contains(name)));
    assert_eq!(writers, ["message/headers.rs"]);
}

#[test]
fn statements_on_tasks_are_written_only_in_the_ledgers_sql() {
    let statements = |tables: &[&str]| -> Vec<String> {
        let verbs = ["INSERT INTO", "UPDATE", "DELETE FROM", "FROM", "JOIN"];
        let words: Vec<String> = verbs
            .iter()
            .flat_map(|verb| tables.iter().map(move |table| format!("{verb} {table}")))
            .collect();
        files_where(|text| has_word(text, &words))
    };
    assert_eq!(statements(&["tasks", "task_changes"]), ["ledger/sql.rs"]);
    // The planner's steps are written in the tasks' group commit, with the
    // group's other statements (issue 71).
    assert_eq!(
        statements(&["schedules"]),
        ["ledger/schedules.rs", "ledger/sql.rs"]
    );
}

/// Lines of code in `text`: neither blank nor comment (`product_text`
/// blanks comments).
fn code_lines(text: &str) -> usize {
    text.lines().filter(|line| !line.trim().is_empty()).count()
}

#[test]
fn a_folders_mod_rs_declares_and_hands_on_and_the_scheduler_holds_its_facade() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut working = Vec::new();
    for file in files.iter().filter(|f| f.file_name().unwrap() == "mod.rs") {
        let lines = code_lines(&product_text(file).unwrap());
        if lines > 60 && shown(file) != "scheduler/mod.rs" {
            working.push(format!("{} ({lines} lines of code)", shown(file)));
        }
    }
    assert!(working.is_empty(), "a mod.rs doing work: {working:?}");
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

/// The modules a test binary's `main.rs` declares, but its helpers.
fn test_modules(binary: &str) -> Vec<String> {
    let main = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/{binary}/main.rs"));
    std::fs::read_to_string(main)
        .unwrap()
        .lines()
        .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
        .filter(|module| *module != "common")
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_development_page_names_every_room_and_every_test_module() {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/development.md");
    let page = std::fs::read_to_string(page).unwrap();
    // The rooms' table: from its head to the first line that is not a row.
    let table: String = page
        .lines()
        .skip_while(|line| !line.starts_with("| module | holds |"))
        .take_while(|line| line.starts_with('|'))
        .collect();
    let rooms = rooms_of_the_map();
    let tests: Vec<String> = ["it", "alone"]
        .iter()
        .flat_map(|b| test_modules(b))
        .collect();
    assert!(tests.len() >= 25, "too few test modules read: {tests:?}");
    let named = |text: &str, name: &String| text.contains(&format!("`{name}`"));
    let missing: Vec<&String> = (rooms.iter().filter(|room| !named(&table, room)))
        .chain(tests.iter().filter(|module| !named(&page, module)))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/development.md does not name these rooms or test modules: {missing:?}"
    );
}
