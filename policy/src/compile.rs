//! From text to a [`Policy`]: parse, resolve every name, check the rules
//! against each other, run the tests. Every problem is collected, so an
//! operator fixes a document in one pass; any problem refuses it whole.

use std::collections::BTreeMap;

use toml::Spanned;

use crate::error::{Locator, PolicyError, Problem};
use crate::format::{self, Document};
use crate::groups::Groups;
use crate::pattern::{Pattern, check_name};
use crate::policy::{Identity, LabelMatch, Policy, Role, Rule, Selector};

/// The largest document accepted, in bytes.
pub const MAX_POLICY_BYTES: usize = 1 << 20;
/// At most this many groups.
pub const MAX_GROUPS: usize = 1024;
/// At most this many owner rules plus grants.
pub const MAX_RULES: usize = 8192;
/// At most this many tests.
pub const MAX_TESTS: usize = 8192;

impl Policy {
    /// Parses and checks a document; `Err` lists every problem found.
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        if text.len() > MAX_POLICY_BYTES {
            return Err(one(format!(
                "the document is {} bytes; at most {MAX_POLICY_BYTES}",
                text.len()
            )));
        }
        let doc: Document = toml::from_str(text).map_err(|e| {
            let (line, column) = e
                .span()
                .map_or((0, 0), |s| crate::error::line_column(text, s.start));
            PolicyError {
                problems: vec![Problem {
                    line,
                    column,
                    message: e.message().to_owned(),
                }],
            }
        })?;
        let mut at = Locator::new(text);
        let policy = compile(doc, &mut at);
        if at.problems.is_empty() {
            Ok(policy)
        } else {
            Err(PolicyError {
                problems: at.problems,
            })
        }
    }

    /// Every member may provide and call every service: what
    /// `agentmesh-one`, the test kit and the ladder start with.
    pub fn allow_all() -> Policy {
        Policy::parse(ALLOW_ALL)
            .unwrap_or_else(|_| unreachable!("the built-in allow-all policy parses"))
    }

    /// No group, no owner, no grant: every call is refused. What a control
    /// plane with no policy applied enforces.
    pub fn deny_all() -> Policy {
        Policy {
            names: vec![],
            selectors: vec![],
            owners: vec![],
            grants: vec![],
            reach: vec![],
            tests: 0,
        }
    }
}

/// The text of [`Policy::allow_all`].
pub const ALLOW_ALL: &str = r#"# Every member may provide and call every service.
format = 1

[groups]
members = { role = "member" }

[[owners]]
services = ["*"]
groups = ["members"]

[[grants]]
from = ["members"]
to = ["*"]
"#;

fn one(message: String) -> PolicyError {
    PolicyError {
        problems: vec![Problem {
            line: 0,
            column: 0,
            message,
        }],
    }
}

fn compile(doc: Document, at: &mut Locator<'_>) -> Policy {
    if *doc.format.get_ref() != 1 {
        at.at(
            doc.format.span(),
            format!(
                "format {} is not known; this version reads format 1",
                doc.format.get_ref()
            ),
        );
    }
    if doc.groups.len() > MAX_GROUPS {
        at.at(
            0..0,
            format!("{} groups; at most {MAX_GROUPS}", doc.groups.len()),
        );
    }
    if doc.owners.len() + doc.grants.len() > MAX_RULES {
        at.at(
            0..0,
            format!(
                "{} owner rules and grants; at most {MAX_RULES}",
                doc.owners.len() + doc.grants.len()
            ),
        );
    }
    if doc.tests.len() > MAX_TESTS {
        at.at(
            0..0,
            format!("{} tests; at most {MAX_TESTS}", doc.tests.len()),
        );
    }
    let mut names = Vec::new();
    let mut selectors = Vec::new();
    for (name, sel) in &doc.groups {
        if let Err(why) = check_group_name(name) {
            at.at(sel.span(), format!("group {name:?}: {why}"));
        }
        names.push(name.clone());
        selectors.push(selector(sel, at));
    }
    let index: BTreeMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let owners: Vec<Rule> = doc
        .owners
        .iter()
        .map(|o| {
            rule(
                &o.get_ref().groups,
                &o.get_ref().services,
                o.span(),
                "owner rule",
                &index,
                at,
            )
        })
        .collect();
    let grants: Vec<Rule> = doc
        .grants
        .iter()
        .map(|g| {
            rule(
                &g.get_ref().from,
                &g.get_ref().to,
                g.span(),
                "grant",
                &index,
                at,
            )
        })
        .collect();
    for (grant, doc_grant) in grants.iter().zip(&doc.grants) {
        for (pattern, text) in grant.services.iter().zip(&doc_grant.get_ref().to) {
            let owned = owners
                .iter()
                .any(|o| o.services.iter().any(|p| p.overlaps(pattern)));
            if !owned {
                at.at(
                    text.span(),
                    format!("grant to {pattern}: no owner rule lets anyone provide such a service, so it can never apply"),
                );
            }
        }
    }
    let mut policy = Policy {
        names,
        selectors,
        owners,
        grants,
        reach: vec![],
        tests: doc.tests.len(),
    };
    policy.compute_reach();
    if at.problems.is_empty() {
        run_tests(&policy, &doc.tests, at);
    }
    policy
}

fn check_group_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err("names are 1-64 letters, digits, - _ .".into())
    }
}

fn selector(sel: &Spanned<format::Selector>, at: &mut Locator<'_>) -> Selector {
    let role = sel
        .get_ref()
        .role
        .as_ref()
        .and_then(|r| match Role::parse(r.get_ref()) {
            Ok(role) => Some(role),
            Err(why) => {
                at.at(r.span(), why);
                None
            }
        });
    let labels = sel
        .get_ref()
        .labels
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                if v == "*" {
                    LabelMatch::Present
                } else {
                    LabelMatch::Equals(v.clone())
                },
            )
        })
        .collect();
    Selector { role, labels }
}

fn rule(
    groups: &[Spanned<String>],
    services: &[Spanned<String>],
    span: std::ops::Range<usize>,
    what: &str,
    index: &BTreeMap<&str, usize>,
    at: &mut Locator<'_>,
) -> Rule {
    let mut set = Groups::empty(index.len());
    if groups.is_empty() {
        at.at(span.clone(), format!("{what} names no group"));
    }
    if services.is_empty() {
        at.at(span, format!("{what} names no service"));
    }
    for g in groups {
        match index.get(g.get_ref().as_str()) {
            Some(i) => set.insert(*i),
            None => at.at(
                g.span(),
                format!("{what} names unknown group {:?}", g.get_ref()),
            ),
        }
    }
    let services = services
        .iter()
        .filter_map(|s| match Pattern::parse(s.get_ref()) {
            Ok(p) => Some(p),
            Err(why) => {
                at.at(s.span(), why);
                None
            }
        })
        .collect();
    Rule {
        groups: set,
        services,
    }
}

/// What makes two tests ask the same question: role, labels, call or
/// provide, and the service.
type TestKey = (Option<String>, BTreeMap<String, String>, bool, String);

fn run_tests(policy: &Policy, tests: &[Spanned<format::Test>], at: &mut Locator<'_>) {
    let mut seen: BTreeMap<TestKey, (bool, usize)> = BTreeMap::new();
    for test in tests {
        let t = test.get_ref();
        let role = match &t.from.role {
            None => Role::Member,
            Some(r) => match Role::parse(r.get_ref()) {
                Ok(role) => role,
                Err(why) => {
                    at.at(r.span(), why);
                    continue;
                }
            },
        };
        let want = match t.expect.get_ref().as_str() {
            "allow" => true,
            "deny" => false,
            other => {
                at.at(
                    t.expect.span(),
                    format!("expect {other:?} is neither \"allow\" nor \"deny\""),
                );
                continue;
            }
        };
        let (calls, service) = match (&t.call, &t.provide) {
            (Some(s), None) => (true, s),
            (None, Some(s)) => (false, s),
            _ => {
                at.at(
                    test.span(),
                    "a test names exactly one of `call` or `provide`",
                );
                continue;
            }
        };
        if let Err(why) = check_name(service.get_ref()) {
            at.at(
                service.span(),
                format!("service {:?}: {why}", service.get_ref()),
            );
            continue;
        }
        let key = (
            t.from.role.as_ref().map(|r| r.get_ref().clone()),
            t.from.labels.clone(),
            calls,
            service.get_ref().clone(),
        );
        let line = crate::error::line_column(at.text(), test.span().start).0;
        if let Some((earlier, earlier_line)) = seen.insert(key, (want, line))
            && earlier != want
        {
            at.at(test.span(), format!("contradicts the test on line {earlier_line}: same identity and service, other expectation"));
            continue;
        }
        let groups = policy.groups_of(&Identity {
            role,
            labels: &t.from.labels,
        });
        let got = if calls {
            policy.may_call(&groups, service.get_ref())
        } else {
            policy.may_provide(&groups, service.get_ref())
        };
        if got != want {
            let verb = if calls { "call" } else { "provide" };
            let names = policy.group_names(&groups);
            at.at(
                test.span(),
                format!(
                    "test failed: expected {} to {verb} {:?}, the policy says {} (the identity is in groups {names:?})",
                    if want { "allow" } else { "deny" },
                    service.get_ref(),
                    if got { "allow" } else { "deny" },
                ),
            );
        }
    }
}
