use std::collections::BTreeMap;

use crate::{Identity, Policy, Role};

const TEAMS: &str = r#"
format = 1

[groups]
payments = { labels = { team = "payments" } }
web = { role = "member", labels = { team = "web" } }
ops = { labels = { oncall = "*" } }

[[owners]]
services = ["payments/*"]
groups = ["payments"]

[[owners]]
services = ["metrics"]
groups = ["ops"]

[[grants]]
from = ["web"]
to = ["payments/api"]

[[grants]]
from = ["payments", "web"]
to = ["metrics"]

[[tests]]
from = { labels = { team = "web" } }
call = "payments/api"
expect = "allow"

[[tests]]
from = { labels = { team = "web" } }
call = "payments/db"
expect = "deny"

[[tests]]
from = { labels = { team = "web" } }
provide = "payments/api"
expect = "deny"
"#;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn a_team_policy_answers_the_three_questions() {
    let p = Policy::parse(TEAMS).expect("parses");
    let web_labels = labels(&[("team", "web")]);
    let pay_labels = labels(&[("team", "payments")]);
    let ops_labels = labels(&[("oncall", "yes"), ("team", "infra")]);
    let web = p.groups_of(&Identity {
        role: Role::Member,
        labels: &web_labels,
    });
    let pay = p.groups_of(&Identity {
        role: Role::Member,
        labels: &pay_labels,
    });
    let ops = p.groups_of(&Identity {
        role: Role::Member,
        labels: &ops_labels,
    });
    let web_router = p.groups_of(&Identity {
        role: Role::Router,
        labels: &web_labels,
    });

    assert!(p.may_provide(&pay, "payments/api"));
    assert!(
        !p.may_provide(&pay, "payments"),
        "the prefix does not cover its stem"
    );
    assert!(!p.may_provide(&web, "payments/api"));
    assert!(p.may_call(&web, "payments/api"));
    assert!(!p.may_call(&web, "payments/db"));
    assert!(!p.may_call(&ops, "payments/api"));
    assert!(
        !p.may_call(&web_router, "payments/api"),
        "the web group holds members only"
    );

    assert!(
        p.may_reach(&web, &pay),
        "web calls payments/api, which payments provides"
    );
    assert!(
        p.may_reach(&pay, &ops),
        "payments calls metrics, which ops provides"
    );
    assert!(!p.may_reach(&pay, &web), "web provides nothing");
    assert!(!p.may_reach(&ops, &pay), "ops is granted nothing");
    assert_eq!(p.group_names(&ops), vec!["ops"]);
}

#[test]
fn allow_all_allows_members_and_deny_all_denies_everything() {
    let all = Policy::allow_all();
    let none = Policy::deny_all();
    let l = labels(&[("x", "y")]);
    let id = Identity {
        role: Role::Member,
        labels: &l,
    };
    let g = all.groups_of(&id);
    assert!(all.may_provide(&g, "any/thing") && all.may_call(&g, "db") && all.may_reach(&g, &g));
    let g = none.groups_of(&id);
    assert!(g.is_empty());
    assert!(!none.may_provide(&g, "db") && !none.may_call(&g, "db") && !none.may_reach(&g, &g));
}

fn problems(text: &str) -> Vec<String> {
    match Policy::parse(text) {
        Ok(_) => panic!("must be refused:\n{text}"),
        Err(e) => e.problems.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn syntax_errors_say_where() {
    let p = problems("[groups]\nweb = { labels = { team = \"web\" }\n");
    assert_eq!(p.len(), 1);
    assert!(p[0].starts_with("line 2, column"), "{p:?}");
}

#[test]
fn unknown_keys_are_errors_not_ignored_rules() {
    let p = problems("[[grant]]\nfrom = [\"a\"]\nto = [\"b\"]\n");
    assert!(p[0].contains("grant"), "{p:?}");
}

#[test]
fn every_problem_is_listed_with_its_place() {
    let text = r#"
[groups]
web = { labels = { team = "web" } }

[[owners]]
services = ["db"]
groups = ["dbs"]

[[grants]]
from = ["web", "nobody"]
to = ["db", "a//b", "cache"]
"#;
    let p = problems(text);
    assert!(
        p.iter()
            .any(|m| m.starts_with("line 7") && m.contains("unknown group \"dbs\"")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|m| m.starts_with("line 10") && m.contains("unknown group \"nobody\"")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|m| m.starts_with("line 11") && m.contains("a//b")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|m| m.contains("grant to cache") && m.contains("never apply")),
        "{p:?}"
    );
}

#[test]
fn a_failing_test_refuses_the_policy() {
    let text = TEAMS.replace("to = [\"payments/api\"]", "to = [\"payments/*\"]");
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].contains("test failed: expected deny to call \"payments/db\""),
        "{p:?}"
    );
}

#[test]
fn contradicting_tests_are_refused() {
    let text = format!(
        "{TEAMS}\n[[tests]]\nfrom = {{ labels = {{ team = \"web\" }} }}\ncall = \"payments/api\"\nexpect = \"deny\"\n"
    );
    let p = problems(&text);
    assert!(
        p.iter().any(|m| m.contains("contradicts the test on line")),
        "{p:?}"
    );
}

#[test]
fn bad_roles_expectations_and_formats_are_refused() {
    assert!(problems("format = 2\n")[0].contains("format 2"));
    assert!(problems("[groups]\na = { role = \"admin\" }\n")[0].contains("\"admin\""));
    let t = "[[tests]]\nfrom = {}\ncall = \"x\"\nexpect = \"maybe\"\n";
    assert!(problems(t)[0].contains("\"maybe\""));
    let t = "[[tests]]\nfrom = {}\ncall = \"x\"\nprovide = \"x\"\nexpect = \"deny\"\n";
    assert!(problems(t)[0].contains("exactly one"));
}

#[test]
fn an_empty_document_is_deny_all() {
    let p = Policy::parse("").expect("empty parses");
    let l = BTreeMap::new();
    let g = p.groups_of(&Identity {
        role: Role::Member,
        labels: &l,
    });
    assert!(!p.may_call(&g, "x"));
    assert_eq!(p.summary().grants, 0);
}

#[test]
fn oversized_documents_are_refused_before_parsing() {
    let text = " ".repeat(crate::MAX_POLICY_BYTES + 1);
    assert!(problems(&text)[0].contains("bytes; at most"));
}

mod reach {
    //! `may_reach` is what the router asks when it sees both ends of a
    //! circuit but not the service: it must agree exactly with "some
    //! service the destination may provide, the source may call".

    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use crate::{Identity, Pattern, Policy, Role};

    const GROUPS: [&str; 4] = ["g0", "g1", "g2", "g3"];

    fn pattern() -> impl Strategy<Value = String> {
        let name = proptest::collection::vec("[ab]{1,2}", 1..3).prop_map(|s| s.join("/"));
        prop_oneof![
            1 => Just("*".to_string()),
            3 => name.clone(),
            3 => name.prop_map(|n| format!("{n}/*")),
        ]
    }

    /// (groups, patterns) of one owner rule or grant.
    fn rule() -> impl Strategy<Value = (Vec<usize>, Vec<String>)> {
        (
            proptest::collection::vec(0..GROUPS.len(), 1..3),
            proptest::collection::vec(pattern(), 1..3),
        )
    }

    fn list<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
        items
            .map(|i| format!("\"{i}\""))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A policy whose every grant is owned: a group no identity is in owns
    /// every service, so each document passes its checks.
    fn document(
        owners: &[(Vec<usize>, Vec<String>)],
        grants: &[(Vec<usize>, Vec<String>)],
    ) -> String {
        let mut t = String::from("format = 1\n[groups]\n");
        for (i, g) in GROUPS.iter().enumerate() {
            // g0..g2 by team; g3: anyone with an `oncall` label.
            if i < 3 {
                t.push_str(&format!("{g} = {{ labels = {{ team = \"t{i}\" }} }}\n"));
            } else {
                t.push_str(&format!("{g} = {{ labels = {{ oncall = \"*\" }} }}\n"));
            }
        }
        t.push_str("nobody = { labels = { never = \"x\" } }\n");
        t.push_str("[[owners]]\nservices = [\"*\"]\ngroups = [\"nobody\"]\n");
        for (kind, from_key, to_key, rules) in [
            ("owners", "groups", "services", owners),
            ("grants", "from", "to", grants),
        ] {
            for (groups, patterns) in rules {
                t.push_str(&format!(
                    "[[{kind}]]\n{from_key} = [{}]\n{to_key} = [{}]\n",
                    list(groups.iter().map(|g| GROUPS[*g])),
                    list(patterns.iter())
                ));
            }
        }
        t
    }

    /// Names that decide overlap for every pair of the document's patterns.
    fn witnesses(rules: &[&(Vec<usize>, Vec<String>)]) -> Vec<String> {
        let mut out = vec!["z".to_string()];
        for (_, patterns) in rules {
            for p in patterns {
                match Pattern::parse(p).expect("generated patterns parse") {
                    Pattern::Exact(n) => out.push(n),
                    Pattern::Prefix(pre) => out.push(format!("{pre}z")),
                    Pattern::Any => {}
                }
            }
        }
        out
    }

    proptest! {
        #[test]
        fn reach_agrees_with_provide_and_call(
            owners in proptest::collection::vec(rule(), 0..4),
            grants in proptest::collection::vec(rule(), 0..4),
            ids in proptest::collection::vec((0..4usize, any::<bool>()), 2..4),
        ) {
            let text = document(&owners, &grants);
            let p = Policy::parse(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
            let names = witnesses(&owners.iter().chain(&grants).collect::<Vec<_>>());
            let labels: Vec<BTreeMap<String, String>> = ids
                .iter()
                .map(|(team, oncall)| {
                    let mut l = BTreeMap::from([("team".to_string(), format!("t{team}"))]);
                    if *oncall {
                        l.insert("oncall".into(), "yes".into());
                    }
                    l
                })
                .collect();
            let groups: Vec<_> = labels
                .iter()
                .map(|l| p.groups_of(&Identity { role: Role::Member, labels: l }))
                .collect();
            for from in &groups {
                for to in &groups {
                    let witness = names
                        .iter()
                        .any(|s| p.may_provide(to, s) && p.may_call(from, s));
                    prop_assert_eq!(p.may_reach(from, to), witness, "{}", text);
                }
            }
        }
    }
}
