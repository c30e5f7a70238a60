//! Service names and the patterns owners and grants are written with.

use std::fmt;

/// The longest service name or pattern a policy accepts, in bytes.
pub const MAX_SERVICE_BYTES: usize = 256;

/// A service name (`payments/api`), every name under a prefix
/// (`payments/*`: `payments/api`, `payments/db/replica`, never `payments`
/// itself), or every name (`*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Exactly this name.
    Exact(String),
    /// Every name that starts with this prefix; the prefix ends with `/`.
    Prefix(String),
    /// Every name.
    Any,
}

impl Pattern {
    /// Parses a pattern; `*` is allowed only alone or as the whole last
    /// segment, so every pattern is a name, a prefix or everything.
    pub fn parse(text: &str) -> Result<Pattern, String> {
        if text == "*" {
            return Ok(Pattern::Any);
        }
        let (name, prefix) = match text.strip_suffix("/*") {
            Some(head) => (head, true),
            None => (text, false),
        };
        check_name(name).map_err(|why| format!("service pattern {text:?}: {why}"))?;
        Ok(if prefix {
            Pattern::Prefix(format!("{name}/"))
        } else {
            Pattern::Exact(name.to_owned())
        })
    }

    /// Whether `service` is one of the names this pattern covers.
    pub fn matches(&self, service: &str) -> bool {
        match self {
            Pattern::Exact(name) => name == service,
            Pattern::Prefix(prefix) => service.starts_with(prefix.as_str()),
            Pattern::Any => true,
        }
    }

    /// Whether some name is covered by both patterns.
    pub fn overlaps(&self, other: &Pattern) -> bool {
        match (self, other) {
            (Pattern::Any, _) | (_, Pattern::Any) => true,
            (Pattern::Exact(a), Pattern::Exact(b)) => a == b,
            (Pattern::Exact(name), Pattern::Prefix(prefix))
            | (Pattern::Prefix(prefix), Pattern::Exact(name)) => name.starts_with(prefix.as_str()),
            (Pattern::Prefix(a), Pattern::Prefix(b)) => {
                a.starts_with(b.as_str()) || b.starts_with(a.as_str())
            }
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Exact(name) => f.write_str(name),
            Pattern::Prefix(prefix) => write!(f, "{prefix}*"),
            Pattern::Any => f.write_str("*"),
        }
    }
}

/// A service name as members expose and call it: non-empty segments
/// separated by `/`, each of ASCII letters, digits, `-`, `_` and `.`.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".into());
    }
    if name.len() > MAX_SERVICE_BYTES {
        return Err(format!("longer than {MAX_SERVICE_BYTES} bytes"));
    }
    for segment in name.split('/') {
        if segment.is_empty() {
            return Err("has an empty segment (leading, trailing or doubled `/`)".into());
        }
        if let Some(bad) = segment
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(format!(
                "character {bad:?} is not allowed (letters, digits, - _ . and /)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_three_forms() {
        assert_eq!(Pattern::parse("*"), Ok(Pattern::Any));
        assert_eq!(Pattern::parse("a/*"), Ok(Pattern::Prefix("a/".into())));
        assert_eq!(Pattern::parse("a/b"), Ok(Pattern::Exact("a/b".into())));
        for bad in ["", "a*", "*/a", "a/*/b", "a//b", "/a", "a/", "a b", "a/**"] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn a_prefix_never_covers_its_own_stem() {
        let p = Pattern::parse("payments/*").expect("a prefix");
        assert!(p.matches("payments/api"));
        assert!(p.matches("payments/db/replica"));
        assert!(!p.matches("payments"));
        assert!(!p.matches("paymentsx/api"));
    }

    fn name() -> impl Strategy<Value = String> {
        proptest::collection::vec("[ab]{1,2}", 1..4).prop_map(|s| s.join("/"))
    }

    fn pattern() -> impl Strategy<Value = Pattern> {
        prop_oneof![
            Just(Pattern::Any),
            name().prop_map(Pattern::Exact),
            name().prop_map(|n| Pattern::Prefix(format!("{n}/"))),
        ]
    }

    /// Names that decide overlap: each pattern's own name, or its prefix
    /// extended by one segment, and one name under no prefix.
    fn candidates(patterns: [&Pattern; 2]) -> Vec<String> {
        let mut out = vec!["z".to_owned()];
        for p in patterns {
            match p {
                Pattern::Exact(x) => out.push(x.clone()),
                Pattern::Prefix(x) => out.push(format!("{x}z")),
                Pattern::Any => {}
            }
        }
        out
    }

    proptest! {
        /// Two patterns overlap exactly when some name matches both.
        #[test]
        fn overlap_agrees_with_matching(a in pattern(), b in pattern(), n in name()) {
            if a.matches(&n) && b.matches(&n) {
                prop_assert!(a.overlaps(&b));
            }
            prop_assert_eq!(a.overlaps(&b), b.overlaps(&a));
            let witness = candidates([&a, &b]).into_iter().any(|w| a.matches(&w) && b.matches(&w));
            prop_assert_eq!(a.overlaps(&b), witness);
        }
    }
}
