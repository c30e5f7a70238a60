//! The checked, compiled policy and the three questions every enforcement
//! point asks of it.

use std::collections::BTreeMap;

use crate::groups::Groups;
use crate::pattern::Pattern;

/// Which role a credential carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Member,
    Router,
}

impl Role {
    pub(crate) fn parse(text: &str) -> Result<Role, String> {
        match text {
            "member" => Ok(Role::Member),
            "router" => Ok(Role::Router),
            other => Err(format!(
                "role {other:?} is neither \"member\" nor \"router\""
            )),
        }
    }
}

/// Who is acting: what its credential says (role and labels come from the
/// token it enrolled with, never from the member).
#[derive(Clone, Copy, Debug)]
pub struct Identity<'a> {
    pub role: Role,
    pub labels: &'a BTreeMap<String, String>,
}

#[derive(Clone, Debug)]
pub(crate) enum LabelMatch {
    Equals(String),
    Present,
}

#[derive(Clone, Debug)]
pub(crate) struct Selector {
    pub(crate) role: Option<Role>,
    pub(crate) labels: Vec<(String, LabelMatch)>,
}

impl Selector {
    pub(crate) fn matches(&self, id: &Identity<'_>) -> bool {
        self.role.is_none_or(|r| r == id.role)
            && self
                .labels
                .iter()
                .all(|(key, want)| match (want, id.labels.get(key)) {
                    (LabelMatch::Present, Some(_)) => true,
                    (LabelMatch::Equals(v), Some(have)) => v == have,
                    (_, None) => false,
                })
    }
}

/// An owner or grant rule: these groups, these services.
#[derive(Clone, Debug)]
pub(crate) struct Rule {
    pub(crate) groups: Groups,
    pub(crate) services: Vec<Pattern>,
}

impl Rule {
    fn covers(&self, groups: &Groups, service: &str) -> bool {
        self.groups.intersects(groups) && self.services.iter().any(|p| p.matches(service))
    }
}

/// A policy that parsed, named only groups it defines and passed all its
/// tests. Immutable: a new version is a new value.
#[derive(Clone, Debug)]
pub struct Policy {
    pub(crate) names: Vec<String>,
    pub(crate) selectors: Vec<Selector>,
    pub(crate) owners: Vec<Rule>,
    pub(crate) grants: Vec<Rule>,
    /// `reach[from]` holds every group `to` such that some service a
    /// member of `to` may provide may be called by a member of `from`.
    pub(crate) reach: Vec<Groups>,
    pub(crate) tests: usize,
}

impl Policy {
    /// The groups this identity is in.
    pub fn groups_of(&self, id: &Identity<'_>) -> Groups {
        let mut out = Groups::empty(self.names.len());
        for (i, s) in self.selectors.iter().enumerate() {
            if s.matches(id) {
                out.insert(i);
            }
        }
        out
    }

    /// May a member of these groups publish (and answer for) `service`?
    pub fn may_provide(&self, groups: &Groups, service: &str) -> bool {
        self.owners.iter().any(|r| r.covers(groups, service))
    }

    /// May a member of these groups call `service`?
    pub fn may_call(&self, groups: &Groups, service: &str) -> bool {
        self.grants.iter().any(|r| r.covers(groups, service))
    }

    /// May a circuit run from a member of `from` to a member of `to`: is
    /// there a service `to` may provide that `from` may call? The router
    /// asks this when it relays, knowing both ends but not the service.
    pub fn may_reach(&self, from: &Groups, to: &Groups) -> bool {
        from.indices()
            .any(|g| self.reach.get(g).is_some_and(|r| r.intersects(to)))
    }

    /// The names of the groups in a set, for logs and `/policy`.
    pub fn group_names(&self, groups: &Groups) -> Vec<&str> {
        groups
            .indices()
            .filter_map(|i| self.names.get(i).map(String::as_str))
            .collect()
    }

    /// How many groups, owner rules, grants and tests it holds.
    pub fn summary(&self) -> Summary {
        Summary {
            groups: self.names.len(),
            owners: self.owners.len(),
            grants: self.grants.len(),
            tests: self.tests,
        }
    }

    pub(crate) fn compute_reach(&mut self) {
        let n = self.names.len();
        let mut reach = vec![Groups::empty(n); n];
        for grant in &self.grants {
            for owner in &self.owners {
                let overlap = grant
                    .services
                    .iter()
                    .any(|g| owner.services.iter().any(|o| g.overlaps(o)));
                if !overlap {
                    continue;
                }
                for from in grant.groups.indices() {
                    for to in owner.groups.indices() {
                        if let Some(r) = reach.get_mut(from) {
                            r.insert(to);
                        }
                    }
                }
            }
        }
        self.reach = reach;
    }
}

/// Sizes of a policy, for logs, `/info` and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    pub groups: usize,
    pub owners: usize,
    pub grants: usize,
    pub tests: usize,
}
