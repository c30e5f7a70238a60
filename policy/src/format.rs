//! The document as an operator writes it (TOML), before any check. Every
//! table refuses unknown keys, so a misspelt key is an error, never a rule
//! silently ignored.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// The whole document.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Document {
    /// The format's version; only 1 exists.
    #[serde(default = "format_one")]
    pub(crate) format: Spanned<u32>,
    /// Group name -> selector.
    #[serde(default)]
    pub(crate) groups: BTreeMap<String, Spanned<Selector>>,
    #[serde(default)]
    pub(crate) owners: Vec<Spanned<Owner>>,
    #[serde(default)]
    pub(crate) grants: Vec<Spanned<Grant>>,
    #[serde(default)]
    pub(crate) tests: Vec<Spanned<Test>>,
}

fn format_one() -> Spanned<u32> {
    Spanned::new(0..0, 1)
}

/// Which identities a group holds: all conditions must hold.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Selector {
    /// `member` or `router`; absent: either.
    pub(crate) role: Option<Spanned<String>>,
    /// Label key -> required value; the value `*` requires only the key.
    #[serde(default)]
    pub(crate) labels: BTreeMap<String, String>,
}

/// Who may provide which services.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Owner {
    pub(crate) services: Vec<Spanned<String>>,
    pub(crate) groups: Vec<Spanned<String>>,
}

/// Who may call which services.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Grant {
    pub(crate) from: Vec<Spanned<String>>,
    pub(crate) to: Vec<Spanned<String>>,
}

/// One expectation the policy must meet before it is applied.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Test {
    /// The identity acting, as its credential would carry it.
    pub(crate) from: Subject,
    /// The service it calls...
    pub(crate) call: Option<Spanned<String>>,
    /// ...or the service it provides (exactly one of the two).
    pub(crate) provide: Option<Spanned<String>>,
    /// `allow` or `deny`.
    pub(crate) expect: Spanned<String>,
}

/// An identity in a test.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Subject {
    pub(crate) role: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) labels: BTreeMap<String, String>,
}
