//! AMQP topic patterns over destinations: `*` stands for exactly one word,
//! `#` for zero or more, as RabbitMQ's topic exchange matches them. Pure.

/// A destination pattern a client may publish to, checked when configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DestinationPattern {
    text: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("destination pattern {pattern:?}: {reason}")]
pub struct PatternError {
    pub pattern: String,
    pub reason: String,
}

impl DestinationPattern {
    /// Dot-separated words of `[A-Za-z0-9_-]`, `*` or `#`, like a destination
    /// with wildcards.
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let error = |reason: String| PatternError {
            pattern: text.to_owned(),
            reason,
        };
        if text.is_empty() {
            return Err(error(
                "must not be empty (use \"#\" for every destination)".into(),
            ));
        }
        for word in text.split('.') {
            let valid = word == "*"
                || word == "#"
                || (!word.is_empty()
                    && word
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-')));
            if !valid {
                return Err(error(format!(
                    "{word:?} is not a word, \"*\" or \"#\" (words hold A-Z, a-z, 0-9, '_', '-')"
                )));
            }
        }
        Ok(Self {
            text: text.to_owned(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The one destination this pattern matches, when it has no wildcard.
    pub fn exact(&self) -> Option<&str> {
        let wild = self.text.split('.').any(|word| word == "*" || word == "#");
        (!wild).then_some(self.text.as_str())
    }

    /// Whether `destination` (a valid one) matches, as RabbitMQ would route it.
    pub fn matches(&self, destination: &str) -> bool {
        let pattern: Vec<&str> = self.text.split('.').collect();
        let words: Vec<&str> = destination.split('.').collect();
        matches_words(&pattern, &words)
    }

    /// Whether every destination `inner` matches, this pattern matches too:
    /// a client whose destinations cover a limit's may set it. Conservative:
    /// `true` is always right, and `false` only for odd pairs (a `#` covered
    /// by `*` words and a `#`, say).
    pub fn covers(&self, inner: &DestinationPattern) -> bool {
        let outer: Vec<&str> = self.text.split('.').collect();
        let inner: Vec<&str> = inner.text.split('.').collect();
        covers_words(&outer, &inner)
    }
}

/// `outer` covers `inner` by dynamic programming over (inner suffix, outer
/// suffix): `covered[i][j]` says `inner[i..]` is within `outer[j..]`.
fn covers_words(outer: &[&str], inner: &[&str]) -> bool {
    let mut covered = vec![vec![false; outer.len() + 1]; inner.len() + 1];
    for i in (0..=inner.len()).rev() {
        for j in (0..=outer.len()).rev() {
            covered[i][j] = match (inner.get(i), outer.get(j)) {
                // A `#` takes nothing, or the next part whatever it is.
                (_, Some(&"#")) => covered[i][j + 1] || (i < inner.len() && covered[i + 1][j]),
                (None, None) => true,
                (None, Some(_)) | (Some(_), None) => false,
                (Some(&"#"), Some(_)) => false,
                (Some(&"*"), Some(&part)) => part == "*" && covered[i + 1][j + 1],
                (Some(word), Some(&part)) => {
                    (part == "*" || part == *word) && covered[i + 1][j + 1]
                }
            };
        }
    }
    covered[0][0]
}

/// Dynamic programming over (pattern prefix, word prefix): linear in both,
/// whatever the number of `#`, so no pattern can make a request slow.
fn matches_words(pattern: &[&str], words: &[&str]) -> bool {
    // `row[j]`: the pattern so far matches the first `j` words.
    let mut row = vec![false; words.len() + 1];
    row[0] = true;
    for part in pattern {
        let mut next = vec![false; words.len() + 1];
        for j in 0..=words.len() {
            next[j] = match *part {
                "#" => row[j] || (j > 0 && next[j - 1]),
                "*" => j > 0 && row[j - 1],
                word => j > 0 && row[j - 1] && words[j - 1] == word,
            };
        }
        row = next;
    }
    row[words.len()]
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn matches(pattern: &str, destination: &str) -> bool {
        DestinationPattern::parse(pattern)
            .unwrap()
            .matches(destination)
    }

    #[test]
    fn wildcards_match_as_rabbitmq_routes() {
        assert!(matches("billing.#", "billing"));
        assert!(matches("billing.#", "billing.invoice.eu"));
        assert!(!matches("billing.#", "billingx.invoice"));
        assert!(!matches("billing.#", "orders.billing"));
        assert!(matches("orders.*.eu", "orders.new.eu"));
        assert!(!matches("orders.*.eu", "orders.eu"));
        assert!(!matches("orders.*.eu", "orders.new.x.eu"));
        assert!(matches("#", "anything.at.all"));
        assert!(matches("#.eu", "eu"));
        assert!(matches("#.eu", "a.b.eu"));
        assert!(!matches("#.eu", "a.b.us"));
        assert!(matches("a.#.z", "a.z"));
        assert!(matches("a.#.z", "a.b.c.z"));
        assert!(matches("*", "one"));
        assert!(!matches("*", "one.two"));
        assert!(matches("exact.name", "exact.name"));
        assert!(!matches("exact.name", "exact.names"));
    }

    #[test]
    fn a_pattern_covers_narrower_ones() {
        let covers = |outer: &str, inner: &str| {
            DestinationPattern::parse(outer)
                .unwrap()
                .covers(&DestinationPattern::parse(inner).unwrap())
        };
        assert!(covers("#", "billing.#"));
        assert!(covers("billing.#", "billing.#"));
        assert!(covers("billing.#", "billing.*.eu"));
        assert!(covers("billing.#", "billing"));
        assert!(covers("billing.*", "billing.invoice"));
        assert!(covers("*.*", "*.eu"));
        assert!(!covers("billing.*", "billing.#"));
        assert!(!covers("billing.invoice", "billing.*"));
        assert!(!covers("billing.#", "#"));
        assert!(!covers("orders.#", "billing.invoice"));
    }

    #[test]
    fn malformed_patterns_are_refused() {
        for bad in ["", "a..b", "a.b*", "bill#", "a b", ".a", "a."] {
            assert!(DestinationPattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// A reference matcher written differently: by recursion on the pattern.
    fn reference(pattern: &[String], words: &[String]) -> bool {
        match pattern.split_first() {
            None => words.is_empty(),
            Some((first, rest)) if first == "#" => {
                (0..=words.len()).any(|taken| reference(rest, &words[taken..]))
            }
            Some((first, rest)) => match words.split_first() {
                Some((word, remaining)) if first == "*" || first == word => {
                    reference(rest, remaining)
                }
                _ => false,
            },
        }
    }

    proptest! {
        #[test]
        fn agrees_with_a_reference_matcher(
            pattern in prop::collection::vec(prop_oneof!["a", "b", Just("*".to_owned()), Just("#".to_owned())], 1..7),
            words in prop::collection::vec(prop_oneof!["a", "b", "c"], 1..8),
        ) {
            let text = pattern.join(".");
            let destination = words.join(".");
            prop_assert_eq!(
                DestinationPattern::parse(&text).unwrap().matches(&destination),
                reference(&pattern, &words),
                "{} vs {}", text, destination
            );
        }

        /// `covers` is never wrong: whatever the inner pattern matches, the
        /// outer one matches.
        #[test]
        fn a_pattern_covers_only_what_it_matches(
            outer in prop::collection::vec(prop_oneof!["a", "b", Just("*".to_owned()), Just("#".to_owned())], 1..5),
            inner in prop::collection::vec(prop_oneof!["a", "b", Just("*".to_owned()), Just("#".to_owned())], 1..5),
            words in prop::collection::vec(prop::collection::vec(prop_oneof!["a", "b", "c"], 1..7), 1..20),
        ) {
            let outer = DestinationPattern::parse(&outer.join(".")).unwrap();
            let inner = DestinationPattern::parse(&inner.join(".")).unwrap();
            if outer.covers(&inner) {
                for words in words {
                    let destination = words.join(".");
                    prop_assert!(!inner.matches(&destination) || outer.matches(&destination),
                        "{} covers {} but not {}", outer.as_str(), inner.as_str(), destination);
                }
            }
        }

        #[test]
        fn a_destination_matches_itself_and_hash(words in prop::collection::vec("[a-z0-9_-]{1,5}", 1..6)) {
            let destination = words.join(".");
            prop_assert!(DestinationPattern::parse(&destination).unwrap().matches(&destination));
            prop_assert!(DestinationPattern::parse("#").unwrap().matches(&destination));
        }
    }
}
