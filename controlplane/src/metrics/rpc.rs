//! Per-call metrics: calls by method and code, latency, requests refused
//! before a handler, authentication failures, enrollments.

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::{
    AUTH_REASONS, AuthLabel, CODES, HistogramFamily, MALFORMED_REASONS, METHODS, MethodCode,
    MethodLabel, MethodReason, ResultLabel, code_name, rpc_histogram,
};

#[derive(Clone)]
pub(super) struct RpcMetrics {
    pub(super) rpc: Family<MethodCode, Counter>,
    pub(super) rpc_duration: HistogramFamily<MethodLabel>,
    pub(super) malformed: Family<MethodReason, Counter>,
    pub(super) auth_failures: Family<AuthLabel, Counter>,
    pub(super) enrollments: Family<ResultLabel, Counter>,
}

impl RpcMetrics {
    /// Registers these metrics under `r` with every label value created.
    pub(super) fn register(r: &mut Registry) -> Self {
        let m = Self {
            rpc: Family::default(),
            rpc_duration: Family::new_with_constructor(rpc_histogram),
            malformed: Family::default(),
            auth_failures: Family::default(),
            enrollments: Family::default(),
        };
        r.register("rpc", "gRPC calls by method and status code", m.rpc.clone());
        r.register(
            "rpc_duration_seconds",
            "gRPC call latency by method",
            m.rpc_duration.clone(),
        );
        r.register(
            "malformed_requests",
            "Requests refused before their handler because tonic could not read them, by \
             method and reason (undecodable: answered INVALID_ARGUMENT; too_large: \
             OUT_OF_RANGE; unsupported_encoding: UNIMPLEMENTED); each is a failure of its \
             source for the failure guard and spends its unauthenticated share",
            m.malformed.clone(),
        );
        r.register(
            "auth_failures",
            "Requests refused for authentication or authorization, by reason",
            m.auth_failures.clone(),
        );
        r.register(
            "enrollments",
            "Successful enrollments: enrolled (a token use spent) or re_enrolled (none spent)",
            m.enrollments.clone(),
        );
        for method in METHODS {
            for reason in MALFORMED_REASONS {
                let _ = m.malformed.get_or_create(&MethodReason {
                    method: (*method).into(),
                    reason: (*reason).into(),
                });
            }
            for code in CODES {
                let _ = m.rpc.get_or_create(&MethodCode {
                    method: (*method).into(),
                    code: code_name(*code),
                });
            }
            let _ = m.rpc_duration.get_or_create(&MethodLabel {
                method: (*method).into(),
            });
            for reason in AUTH_REASONS {
                let _ = m.auth_failures.get_or_create(&AuthLabel {
                    method: (*method).into(),
                    reason: (*reason).into(),
                });
            }
        }
        for r in ["enrolled", "re_enrolled"] {
            let _ = m
                .enrollments
                .get_or_create(&ResultLabel { result: r.into() });
        }
        m
    }
}
