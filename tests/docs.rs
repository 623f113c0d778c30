//! The documents' links hold: every `#anchor` in README.md, BENCHMARKS.md
//! and RELIABILITY.md names one of the heading anchors GitHub makes, and
//! every relative link or image names a file in the repository. A heading
//! lost in an edit, or a screenshot not committed, fails here, not in a
//! reader's browser. Read off the text; no broker needed.

use std::collections::BTreeSet;
use std::path::Path;

const DOCUMENTS: [&str; 3] = ["README.md", "BENCHMARKS.md", "RELIABILITY.md"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// GitHub's anchor of a heading: lower case, punctuation dropped but `-`
/// and `_`, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// A document's lines outside code blocks (and not their fences).
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut in_code = false;
    text.lines().filter(move |line| {
        if line.starts_with("```") {
            in_code = !in_code;
            return false;
        }
        !in_code
    })
}

/// The anchors of a document's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .filter(|line| line.starts_with('#'))
        .map(|line| anchor(line.trim_start_matches('#')))
        .collect()
}

/// Every `](target)` of a document, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                found.push(rest[..end].to_owned());
            }
        }
    }
    found
}

#[test]
fn every_link_names_a_heading_or_a_file() {
    let mut broken = Vec::new();
    for document in DOCUMENTS {
        let text = std::fs::read_to_string(root().join(document)).unwrap();
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() { document } else { file };
            let Ok(target_text) = std::fs::read_to_string(root().join(target)) else {
                if !root().join(target).exists() {
                    broken.push(format!("{document}: {link} (no such file)"));
                }
                continue;
            };
            if !fragment.is_empty() && !anchors(&target_text).contains(fragment) {
                broken.push(format!("{document}: {link} (no such heading)"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(anchor(" Quick start"), "quick-start");
    assert_eq!(
        anchor(" Coming from the x-delayed-message plugin"),
        "coming-from-the-x-delayed-message-plugin"
    );
    assert_eq!(
        anchor(" `GET /v1/tasks/{id}` → `200`"),
        "get-v1tasksid--200"
    );
}
