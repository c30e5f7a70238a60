//! What an attack counts, declared once per attack: [`counts!`] turns one
//! list of named counts into the report the attack returns (plain `u64`s,
//! printed as `name=value` and turned into the `--json` [`Summary`]) and its
//! live twin of atomics that the attack's tasks bump while it runs.
//! [`Progress`] pairs live counts with a stop switch for attacks whose
//! caller reads them, or stops the attack, while it runs.
//!
//! Every attack had written these three pieces by hand, field by field;
//! a count added to one and forgotten in another went unreported.
//!
//! [`Summary`]: crate::summary::Summary

use tokio::sync::watch;

/// Declares an attack's report and its live counts:
///
/// ```ignore
/// counts! {
///     /// What one run did.
///     pub struct Report (live Counters, attack "router-auth") {
///         /// Connections established.
///         connections,
///     }
/// }
/// ```
///
/// gives `Report` (`Copy`, one `pub u64` per count, [`Counted`] for
/// `--json`, `Display` as `connections=3 ...` in declaration order) and
/// `Counters` (one `AtomicU64` per count, `report()`, [`Live`]).
macro_rules! counts {
    (
        $(#[$meta:meta])*
        $vis:vis struct $report:ident (live $live:ident, attack $attack:literal) {
            $( $(#[$fmeta:meta])* $field:ident, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        $vis struct $report {
            $( $(#[$fmeta])* pub $field: u64, )+
        }

        impl $crate::counts::Counted for $report {
            fn counts(&self) -> $crate::summary::Summary {
                $crate::summary::Summary::new($attack, self.pairs())
            }
        }

        impl $report {
            /// The counts with their names, in declaration order.
            fn pairs(&self) -> Vec<(&'static str, u64)> {
                vec![$( (stringify!($field), self.$field), )+]
            }
        }

        impl ::std::fmt::Display for $report {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                for (i, (name, n)) in self.pairs().into_iter().enumerate() {
                    let sep = if i == 0 { "" } else { " " };
                    write!(f, "{sep}{name}={n}")?;
                }
                Ok(())
            }
        }

        #[doc = concat!("The counts of [`", stringify!($report), "`] while the attack runs.")]
        #[derive(Debug, Default)]
        $vis struct $live {
            $( pub(crate) $field: ::std::sync::atomic::AtomicU64, )+
        }

        impl $crate::counts::Live for $live {
            type Report = $report;

            fn report(&self) -> $report {
                let get = |c: &::std::sync::atomic::AtomicU64| {
                    c.load(::std::sync::atomic::Ordering::Relaxed)
                };
                $report { $( $field: get(&self.$field), )+ }
            }
        }
    };
}
pub(crate) use counts;

/// A report an attack returns.
pub trait Counted: std::fmt::Display {
    /// The counts by name, for `--json`.
    fn counts(&self) -> crate::summary::Summary;
}

/// Live counts that make a report.
pub trait Live {
    /// What the counts make.
    type Report;
    /// The counts so far.
    fn report(&self) -> Self::Report;
}

/// Adds one to a live count.
pub(crate) fn inc(c: &std::sync::atomic::AtomicU64) {
    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The live counts of a running attack and its stop switch, shared with
/// the caller, who may read them while it runs and stop it early.
#[derive(Debug)]
pub struct Progress<L> {
    pub(crate) counts: L,
    stop: watch::Sender<bool>,
}

impl<L: Default> Default for Progress<L> {
    fn default() -> Self {
        Self {
            counts: L::default(),
            stop: watch::Sender::new(false),
        }
    }
}

impl<L: Live> Progress<L> {
    /// Ends the attack at its tasks' next step.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// The counts so far.
    pub fn report(&self) -> L::Report {
        self.counts.report()
    }

    /// Sees [`Progress::stop`]: `wait_for(|s| *s)` completes once stopped.
    pub(crate) fn stopped(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    counts! {
        /// A report for the test.
        pub(crate) struct Sample (live SampleLive, attack "sample") {
            /// First.
            zeta,
            /// Second.
            alpha,
        }
    }

    #[test]
    fn one_list_makes_the_report_its_text_its_json_and_its_live_counts() {
        let p = Progress::<SampleLive>::default();
        inc(&p.counts.zeta);
        inc(&p.counts.zeta);
        inc(&p.counts.alpha);
        let r = p.report();
        assert_eq!(r, Sample { zeta: 2, alpha: 1 });
        assert_eq!(r.to_string(), "zeta=2 alpha=1", "declaration order");
        let s = r.counts();
        assert_eq!(s.attack, "sample");
        assert_eq!(s.counts.get("zeta"), Some(&2));
        assert_eq!(s.counts.get("alpha"), Some(&1));
        let mut stopped = p.stopped();
        assert!(!*stopped.borrow_and_update());
        p.stop();
        assert!(*stopped.borrow());
    }
}
