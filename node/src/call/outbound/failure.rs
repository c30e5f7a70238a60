//! How one attempt at one provider failed, as a type: [`AttemptError`]
//! says by its variant whether the route failed (worth a retry on another
//! route), the attempt timed out, the provider refused or a router refused
//! the circuit by its policy (final); the text is only for people.

use agentmesh_proto::pb::mesh::CallRefusal;
use agentmesh_wire::ExchangeFailure as _;
use agentmesh_wire::auth::AuthError;
use agentmesh_wire::call::CallExchangeError;
use libp2p::PeerId;
use libp2p::swarm::ConnectionId;

use crate::command::{CircuitRefusal, ConnectError, TransitError};

/// A route failure's reason: a [`crate::metrics::CALL_RETRY_REASONS`] value.
pub(super) const CONNECT_FAILED: &str = "connect_failed";
/// See [`CONNECT_FAILED`].
pub(super) const STREAM_FAILED: &str = "stream_failed";

/// How a failure happened on the route to a provider (before it answered).
#[derive(Debug, Clone, Copy)]
pub(super) struct RouteFailure {
    /// A [`crate::metrics::CALL_RETRY_REASONS`] value.
    pub(super) reason: &'static str,
    /// The router the route went through.
    pub(super) via: PeerId,
    /// The direct connection a stream failed on, when it was one: the
    /// router was not on the path, and the retry drops only this
    /// connection (the relayed ones are the fallback).
    pub(super) direct: Option<ConnectionId>,
}

/// One failed attempt at one provider.
#[derive(Debug)]
pub(super) enum AttemptError {
    /// No relayed connection to `provider` through router `via`.
    Circuit {
        via: PeerId,
        provider: PeerId,
        error: ConnectError,
    },
    /// No transit admission at the provider's router `via`.
    Transit { via: PeerId, error: TransitError },
    /// The call exchange with the provider failed, on the route through
    /// `via`; `on`: the connection the stream was to open on (the
    /// provider's newest when it was asked) and whether it is relayed.
    Stream {
        via: PeerId,
        error: CallExchangeError,
        on: Option<(ConnectionId, bool)>,
    },
    /// The provider answered with a refusal.
    Refused {
        provider: PeerId,
        refusal: CallRefusal,
        detail: String,
    },
    /// A router refused the circuit by its access policy: final. Carries
    /// why, judged with the node's own copy of the policy.
    Denied { detail: String },
    /// None of the provider's routers is in our directory.
    NoRoute { provider: PeerId, routers: usize },
    /// No provider could be tried.
    NoAttempt,
}

impl AttemptError {
    /// The route failure, when the route failed (not the provider, not the
    /// node stopping); a retry on another route may help. A connect that
    /// timed out is not one; an exchange that timed out is (a circuit
    /// that died without a reset).
    pub(super) fn route(&self) -> Option<RouteFailure> {
        let (reason, via, direct) = match self {
            Self::Circuit { via, error, .. }
            | Self::Transit {
                via,
                error: TransitError::Connect(error),
            } if error.is_route_failure() => (CONNECT_FAILED, *via, None),
            Self::Transit {
                via,
                error: TransitError::Wire(e),
            } if auth_route_failed(e) => (CONNECT_FAILED, *via, None),
            Self::Stream { via, error, on }
                if error.is_timeout() || error.is_connection_failure() =>
            {
                let direct = on.and_then(|(id, relayed)| (!relayed).then_some(id));
                (STREAM_FAILED, *via, direct)
            }
            _ => return None,
        };
        Some(RouteFailure {
            reason,
            via,
            direct,
        })
    }

    /// Whether the attempt timed out.
    pub(super) fn timed_out(&self) -> bool {
        match self {
            Self::Circuit { error, .. }
            | Self::Transit {
                error: TransitError::Connect(error),
                ..
            } => error.is_timeout(),
            Self::Transit {
                error: TransitError::TimedOut { .. },
                ..
            } => true,
            Self::Transit {
                error: TransitError::Wire(e),
                ..
            } => e.is_timeout(),
            Self::Stream { error, .. } => error.is_timeout(),
            _ => false,
        }
    }

    /// Whether the provider refused.
    pub(super) fn refused(&self) -> bool {
        matches!(self, Self::Refused { .. })
    }

    /// The provider's refusal, when it refused.
    pub(super) fn refusal(&self) -> Option<CallRefusal> {
        match self {
            Self::Refused { refusal, .. } => Some(*refusal),
            _ => None,
        }
    }
}

/// Whether a transit auth failed on its route (timed out or lost its
/// connection or stream).
fn auth_route_failed(e: &AuthError) -> bool {
    e.is_timeout() || e.is_connection_failure()
}

impl std::fmt::Display for AttemptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Circuit {
                via,
                provider,
                error,
            } => f.write_str(&explain_circuit_failure(error, *via, *provider)),
            Self::Transit { error, .. } => write!(f, "{error}"),
            Self::Stream { error, .. } => write!(f, "{error}"),
            Self::Refused {
                provider,
                refusal,
                detail,
            } => write!(
                f,
                "provider {provider} refused: {} {detail}",
                refusal.as_str_name()
            ),
            Self::Denied { detail } => f.write_str(detail),
            Self::NoRoute { provider, routers } => write!(
                f,
                "none of provider {provider}'s {routers} routers is in our directory"
            ),
            Self::NoAttempt => f.write_str("no attempt made"),
        }
    }
}

/// A relayed dial's failure in words a caller can act on: libp2p reports a
/// router's refusal of the circuit as a nested transport error; say which
/// router refused which provider and why.
fn explain_circuit_failure(error: &ConnectError, via: PeerId, provider: PeerId) -> String {
    // libp2p's nested dial errors span lines; a reason is one line.
    let detail = error
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let ConnectError::Dial {
        circuit: Some(refusal),
        ..
    } = error
    else {
        return detail;
    };
    let why = match refusal {
        CircuitRefusal::ResourceLimitExceeded => {
            "the router refused the circuit: resource limit exceeded (it carries as many \
             circuits as it allows)"
        }
        CircuitRefusal::ConnectionFailed => {
            "the router refused or could not open the circuit to the provider (at its \
             circuits-per-destination or stream limit for the provider, or the provider is gone)"
        }
        CircuitRefusal::NoReservation => {
            "the provider has no reservation on that router (it moved)"
        }
        CircuitRefusal::PermissionDenied => "the router denied the circuit",
    };
    format!("router {via} could not carry a call to provider {provider}: {why} [{detail}]")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn dial(circuit: Option<CircuitRefusal>, detail: &str) -> ConnectError {
        ConnectError::Dial {
            peer: PeerId::random(),
            circuit,
            detail: detail.into(),
        }
    }

    #[test]
    fn circuit_refusals_name_the_router_the_provider_and_the_reason() {
        let (via, provider) = (PeerId::random(), PeerId::random());
        let e = explain_circuit_failure(
            &dial(
                Some(CircuitRefusal::ResourceLimitExceeded),
                "connect to x: Failed to negotiate transport protocol(s): [(/p2p-circuit: \
                 Failed to connect to destination.: Remote reported resource limit exceeded.)]",
            ),
            via,
            provider,
        );
        assert!(e.contains(&via.to_string()), "{e}");
        assert!(e.contains(&provider.to_string()), "{e}");
        assert!(
            e.contains("refused the circuit: resource limit exceeded"),
            "{e}"
        );
        let e = explain_circuit_failure(
            &dial(
                Some(CircuitRefusal::ConnectionFailed),
                "Relay failed to connect to destination.",
            ),
            via,
            provider,
        );
        assert!(e.contains("circuits-per-destination"), "{e}");
        // Anything else is left as it was, on one line.
        assert_eq!(
            explain_circuit_failure(&dial(None, "a:\n   b"), via, provider),
            "a: b"
        );
        let plain = ConnectError::TimedOut {
            peer: provider,
            after: Duration::from_secs(10),
        };
        assert_eq!(
            explain_circuit_failure(&plain, via, provider),
            plain.to_string()
        );
    }

    #[test]
    fn only_failed_routes_are_retried_and_timeouts_and_refusals_say_so() {
        let (via, provider) = (PeerId::random(), PeerId::random());
        let circuit = |error| AttemptError::Circuit {
            via,
            provider,
            error,
        };
        let failed = circuit(dial(Some(CircuitRefusal::NoReservation), "gone"));
        assert_eq!(failed.route().map(|r| r.reason), Some(CONNECT_FAILED));
        assert!(!failed.timed_out());
        let late = circuit(ConnectError::TimedOut {
            peer: provider,
            after: Duration::from_secs(1),
        });
        assert!(late.route().is_none() && late.timed_out());
        assert!(circuit(ConnectError::Stopping).route().is_none());
        let transit_late = AttemptError::Transit {
            via,
            error: TransitError::TimedOut {
                router: via,
                after: Duration::from_secs(1),
            },
        };
        assert!(transit_late.route().is_none() && transit_late.timed_out());
        let refused = AttemptError::Refused {
            provider,
            refusal: CallRefusal::NotAllowed,
            detail: "no".into(),
        };
        assert!(refused.refused() && refused.route().is_none());
    }
}
