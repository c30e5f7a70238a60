//! The starting corpus: for each target a handful of real encoded inputs,
//! valid and invalid, each with the outcomes it must reach. The
//! `fuzz-seeds` binary writes them into `proto/fuzz/corpus/<target>/`; the
//! replay test checks the outcomes, so the seeds prove the harness gets
//! past the signature to expiry, subject, revocation and key grace.

use agentmesh_proto::identity::PeerId;
use agentmesh_proto::pb::controlplane::{EnrollRequest, RefreshRequest, RouterLoad};
use agentmesh_proto::pb::credential::{
    KeySet, PolicyDocument, PublicKey as KeyEntry, Revocation, RevocationList, Role,
};
use agentmesh_proto::pb::mesh::{
    Admitted, Alternative, AuthRefusal, AuthRequest, AuthResponse, CallRefusal, CallRequest,
    CallResponse, CatalogError, CatalogRequest, CatalogResponse, GoAway, GoAwayAck, GoAwayReason,
    Lookup, LookupResult, PolicyAck, PolicyPush, PublishAck, Purpose as AuthPurpose, Refused,
    ServiceRecord, Withdraw, auth_response, catalog_request, catalog_response,
};
use agentmesh_proto::policy::sign_policy;
use agentmesh_proto::proof::{Bound, Purpose};
use agentmesh_proto::record::sign_record;
use agentmesh_proto::revocations::sign_revocations;
use agentmesh_wire::frame::encode;
use prost::Message;

use crate::keys::{self, NOW, peer, peers};
use crate::targets::{
    credential, enroll_proof, policy_frames, record, revocation_list, trust_keys,
};

/// One corpus file and what running it must reach.
#[derive(Debug, Clone)]
pub struct Seed {
    /// The target (and corpus directory).
    pub target: &'static str,
    /// The file name.
    pub name: &'static str,
    /// The input.
    pub data: Vec<u8>,
    /// `(step, outcome)` pairs the run's [`crate::Report`] must hold.
    pub expect: Vec<(&'static str, &'static str)>,
}

fn seed(
    target: &'static str,
    name: &'static str,
    data: Vec<u8>,
    expect: &[(&'static str, &'static str)],
) -> Seed {
    Seed {
        target,
        name,
        data,
        expect: expect.to_vec(),
    }
}

/// Every seed of every target.
pub fn all() -> Vec<Seed> {
    let mut out = Vec::new();
    out.extend(credential_seeds());
    out.extend(enroll_proof_seeds());
    out.extend(auth_seeds());
    out.extend(goaway_seeds());
    out.extend(catalog_seeds());
    out.extend(call_seeds());
    out.extend(policy_seeds());
    out.extend(record_seeds());
    out.extend(trust_keys_seeds());
    out.extend(revocation_list_seeds());
    out
}

fn credential_seeds() -> Vec<Seed> {
    let mut out = credential_validity_seeds();
    out.extend(credential_key_seeds());
    out
}

/// Valid credentials and the time, subject and revocation checks.
fn credential_validity_seeds() -> Vec<Seed> {
    use credential::{Case, Expect, Signer};
    let t = "credential";
    let c0 = keys::member_claims(0, Role::Member);
    let valid = Case::signed(&c0, Signer::Current, Expect::Subject, NOW);
    let relative = |now| Case {
        relative: true,
        now,
        ..valid.clone()
    };
    let ok = [("credential", "ok")];
    vec![
        seed(t, "valid", valid.encode(), &ok),
        seed(
            t,
            "valid_no_peer",
            Case {
                expect: Expect::Nobody,
                ..valid.clone()
            }
            .encode(),
            &ok,
        ),
        // Issued NOW-60, expires NOW+3600, skew 60.
        seed(
            t,
            "expired",
            relative(3_721).encode(),
            &[("credential", "expired")],
        ),
        seed(t, "expiry_edge", relative(3_720).encode(), &ok),
        seed(
            t,
            "not_yet_valid",
            relative(-61).encode(),
            &[("credential", "not_yet_valid")],
        ),
        seed(
            t,
            "wrong_peer",
            Case {
                expect: Expect::Other,
                ..valid.clone()
            }
            .encode(),
            &[("credential", "wrong_peer")],
        ),
        seed(
            t,
            "revoked",
            Case {
                revoke: true,
                revoked_until: 10,
                ..valid.clone()
            }
            .encode(),
            &[("credential", "revoked")],
        ),
        seed(
            t,
            "revocation_over",
            Case {
                revoke: true,
                revoked_until: -1,
                ..valid.clone()
            }
            .encode(),
            &ok,
        ),
        seed(
            t,
            "revoked_by_list",
            Case::signed(
                &keys::member_claims(3, Role::Member),
                Signer::Current,
                Expect::Subject,
                NOW,
            )
            .encode(),
            &[("credential", "revoked")],
        ),
        seed(
            t,
            "stranger_key",
            Case {
                signer: Signer::Stranger,
                ..valid.clone()
            }
            .encode(),
            &[("credential", "bad_signature")],
        ),
    ]
}

/// Signatures, signing keys and malformed credentials.
fn credential_key_seeds() -> Vec<Seed> {
    use credential::{Case, Expect, Signer};
    let t = "credential";
    let c0 = keys::member_claims(0, Role::Member);
    let valid = Case::signed(&c0, Signer::Current, Expect::Subject, NOW);
    let with = |f: &dyn Fn(&mut agentmesh_proto::pb::credential::Claims)| {
        let mut c = c0.clone();
        f(&mut c);
        Case::signed(&c, Signer::Current, Expect::Subject, NOW)
    };
    let retired = |now| {
        let mut c = c0.clone();
        c.key_id = keys::RETIRED_KEY_ID.into();
        c.issued_at_unix_secs = NOW - 7_200;
        c.expires_at_unix_secs = NOW - 3_000;
        Case::signed(&c, Signer::Retired, Expect::Subject, now)
    };
    let ok = [("credential", "ok")];
    vec![
        seed(
            t,
            "flipped_signature",
            Case {
                signer: Signer::Flipped,
                ..valid.clone()
            }
            .encode(),
            &[("credential", "bad_signature")],
        ),
        seed(
            t,
            "retired_in_grace",
            retired(keys::RETIRED_UNTIL - 10).encode(),
            &ok,
        ),
        seed(
            t,
            "retired_after_grace",
            retired(keys::RETIRED_UNTIL + 1).encode(),
            &[("credential", "expired")],
        ),
        seed(
            t,
            "unknown_key",
            with(&|c| c.key_id = "k9".into()).encode(),
            &[("credential", "unknown_key")],
        ),
        seed(
            t,
            "broken_key",
            with(&|c| c.key_id = keys::BROKEN_KEY_ID.into()).encode(),
            &[("credential", "unknown_key")],
        ),
        seed(
            t,
            "subject_not_a_peer",
            with(&|c| c.subject = b"junk".to_vec()).encode(),
            &[("credential", "malformed")],
        ),
        seed(
            t,
            "extreme_times",
            Case {
                skew: u16::MAX,
                now: 0,
                ..with(&|c| {
                    c.issued_at_unix_secs = i64::MIN;
                    c.expires_at_unix_secs = i64::MAX;
                })
            }
            .encode(),
            &ok,
        ),
        seed(
            t,
            "claims_garbage",
            Case {
                body: vec![0xff, 0xff, 0xff],
                ..valid.clone()
            }
            .encode(),
            &[("credential", "malformed")],
        ),
        seed(
            t,
            "raw_valid",
            Case {
                raw: true,
                body: keys::member_credential(0, Role::Member).encode_to_vec(),
                ..valid.clone()
            }
            .encode(),
            &ok,
        ),
        seed(
            t,
            "raw_garbage",
            Case {
                raw: true,
                body: vec![0x0a, 0xff],
                ..valid.clone()
            }
            .encode(),
            &[("decode", "malformed")],
        ),
        seed(t, "empty", Vec::new(), &[("credential", "unknown_key")]),
    ]
}

fn enroll_proof_seeds() -> Vec<Seed> {
    let mut out = enroll_proof_binding_seeds();
    out.extend(enroll_proof_broken_seeds());
    out.extend(enroll_proof_moved_seeds());
    out.extend(enroll_proof_enroll_request_seeds());
    out.extend(enroll_proof_request_seeds());
    out
}

/// What a proof is bound to: endpoint, purpose and age.
fn enroll_proof_binding_seeds() -> Vec<Seed> {
    use enroll_proof::{CP_URL, Case, Field, Verifier};
    let t = "enroll_proof";
    let valid = Case::structured("http://cp.test:7400/", NOW, 0);
    let ok = [("proof", "ok")];
    let bad = [("proof", "bad_signature")];
    let structured = |name, case: Case, expect: &[(&'static str, &'static str)]| {
        seed(t, name, case.encode(), expect)
    };
    // The harness's request of `purpose`, proven by its key, as a peer
    // sends it (and the same with `moved` to move before the check).
    let lease = |moved: Field| Case {
        signed: Purpose::Lease,
        verified: Purpose::Lease,
        key: 2,
        moved,
        ..valid.clone()
    };
    let moved = |purpose: Purpose, field: Field| Case {
        signed: purpose,
        verified: purpose,
        moved: field,
        ..valid.clone()
    };
    vec![
        structured("valid", valid.clone(), &ok),
        structured(
            "trailing_slash",
            Case {
                verifier: Verifier::Slash,
                ..valid.clone()
            },
            &ok,
        ),
        structured(
            "other_endpoint",
            Case {
                verifier: Verifier::Other,
                ..valid.clone()
            },
            &bad,
        ),
        structured(
            "other_purpose",
            Case {
                verified: Purpose::Refresh,
                ..valid.clone()
            },
            &bad,
        ),
        structured(
            "refresh_proof_as_watch",
            Case {
                signed: Purpose::Refresh,
                verified: Purpose::Watch,
                ..valid.clone()
            },
            &bad,
        ),
        structured("lease", lease(Field::None), &ok),
        structured("watch", moved(Purpose::Watch, Field::None), &ok),
        structured(
            "age_edge",
            Case {
                now: 300,
                ..valid.clone()
            },
            &ok,
        ),
        structured(
            "future_edge",
            Case {
                now: -300,
                ..valid.clone()
            },
            &ok,
        ),
        structured(
            "stale",
            Case {
                now: 301,
                ..valid.clone()
            },
            &[("proof", "stale")],
        ),
        structured(
            "extreme_timestamp",
            Case::structured(CP_URL, i64::MIN, i64::MAX),
            &[("proof", "stale")],
        ),
        structured(
            "max_timestamp",
            Case::structured(CP_URL, i64::MAX, -200),
            &ok,
        ),
    ]
}

/// Proofs with a broken signature or key.
fn enroll_proof_broken_seeds() -> Vec<Seed> {
    use enroll_proof::{Breakage, Case};
    let t = "enroll_proof";
    let valid = Case::structured("http://cp.test:7400/", NOW, 0);
    let bad = [("proof", "bad_signature")];
    let structured = |name, case: Case, expect: &[(&'static str, &'static str)]| {
        seed(t, name, case.encode(), expect)
    };
    vec![
        structured(
            "flipped_signature",
            Case {
                breakage: Breakage::Flipped,
                ..valid.clone()
            },
            &bad,
        ),
        structured(
            "no_signature",
            Case {
                breakage: Breakage::Empty,
                ..valid.clone()
            },
            &bad,
        ),
        structured(
            "cut_signature",
            Case {
                breakage: Breakage::Cut,
                ..valid.clone()
            },
            &bad,
        ),
        structured(
            "cut_key",
            Case {
                cut_key: true,
                ..valid.clone()
            },
            &[("proof", "bad_key")],
        ),
    ]
}

/// Proofs moved onto another request, and the old unbound format.
fn enroll_proof_moved_seeds() -> Vec<Seed> {
    use enroll_proof::{Case, Field, Verifier};
    let t = "enroll_proof";
    let valid = Case::structured("http://cp.test:7400/", NOW, 0);
    let ok = [("proof", "ok")];
    let bad = [("proof", "bad_signature")];
    let structured = |name, case: Case, expect: &[(&'static str, &'static str)]| {
        seed(t, name, case.encode(), expect)
    };
    // The harness's request of `purpose`, proven by its key, as a peer
    // sends it (and the same with `moved` to move before the check).
    let lease = |moved: Field| Case {
        signed: Purpose::Lease,
        verified: Purpose::Lease,
        key: 2,
        moved,
        ..valid.clone()
    };
    let moved = |purpose: Purpose, field: Field| Case {
        signed: purpose,
        verified: purpose,
        moved: field,
        ..valid.clone()
    };
    vec![
        // Moved onto another request: refused when the request carries
        // the field, accepted when it does not.
        structured(
            "enroll_other_token",
            moved(Purpose::Enroll, Field::Token),
            &bad,
        ),
        structured(
            "enroll_moved_credential",
            moved(Purpose::Enroll, Field::Credential),
            &ok,
        ),
        structured(
            "refresh_other_credential",
            moved(Purpose::Refresh, Field::Credential),
            &bad,
        ),
        structured(
            "watch_other_credential",
            moved(Purpose::Watch, Field::Credential),
            &bad,
        ),
        structured("lease_other_credential", lease(Field::Credential), &bad),
        structured("lease_other_addrs", lease(Field::Addrs), &bad),
        structured("lease_other_labels", lease(Field::Labels), &bad),
        structured("lease_other_load", lease(Field::Load), &bad),
        structured("lease_no_load", lease(Field::LoadPresence), &bad),
        structured("lease_draining", lease(Field::Draining), &bad),
        structured("lease_moved_token", lease(Field::Token), &ok),
        // The old, unbound format: named as such, whatever was moved.
        structured(
            "old_format",
            Case {
                old_format: true,
                ..valid.clone()
            },
            &[("proof", "old_format")],
        ),
        structured(
            "old_format_other_token",
            Case {
                old_format: true,
                ..moved(Purpose::Enroll, Field::Token)
            },
            &[("proof", "old_format")],
        ),
        structured(
            "old_format_other_endpoint",
            Case {
                old_format: true,
                verifier: Verifier::Other,
                ..valid.clone()
            },
            &bad,
        ),
    ]
}

/// A whole enrollment request, as a peer sends it.
fn enroll_proof_enroll_request_seeds() -> Vec<Seed> {
    use enroll_proof::{CP_URL, Case, Field, Req};
    let t = "enroll_proof";
    // The harness's request of `purpose`, proven by its key, as a peer
    // sends it (and the same with `moved` to move before the check).
    let request = |purpose: Purpose, key: u8, moved: Field| Case {
        moved,
        ..Case::request(
            purpose,
            NOW + 5,
            Req::fixed(purpose, key)
                .proven(CP_URL, &peers()[usize::from(key)], NOW)
                .encode(),
        )
    };
    vec![seed(
        t,
        "enroll_request",
        request(Purpose::Enroll, 0, Field::None).encode(),
        &[("decode", "ok"), ("proof", "ok")],
    )]
}

/// The other whole requests (enroll, refresh, lease, watch) and garbage.
fn enroll_proof_request_seeds() -> Vec<Seed> {
    use enroll_proof::{CP_URL, Case, Field, Req};
    let t = "enroll_proof";
    // The harness's request of `purpose`, proven by its key, as a peer
    // sends it (and the same with `moved` to move before the check).
    let request = |purpose: Purpose, key: u8, moved: Field| Case {
        moved,
        ..Case::request(
            purpose,
            NOW + 5,
            Req::fixed(purpose, key)
                .proven(CP_URL, &peers()[usize::from(key)], NOW)
                .encode(),
        )
    };
    vec![
        seed(
            t,
            "enroll_request_other_token",
            request(Purpose::Enroll, 0, Field::Token).encode(),
            &[("proof", "ok"), ("moved", "bad_signature")],
        ),
        seed(
            t,
            "enroll_without_proof",
            Case::request(
                Purpose::Enroll,
                NOW,
                EnrollRequest {
                    token: "tok-123".into(),
                    proof: None,
                }
                .encode_to_vec(),
            )
            .encode(),
            &[("proof", "missing")],
        ),
        seed(
            t,
            "refresh_request",
            request(Purpose::Refresh, 0, Field::None).encode(),
            &[("proof", "ok"), ("credential", "ok")],
        ),
        seed(
            t,
            "refresh_request_other_credential",
            request(Purpose::Refresh, 0, Field::Credential).encode(),
            &[
                ("proof", "ok"),
                ("credential", "ok"),
                ("moved", "bad_signature"),
            ],
        ),
        seed(
            t,
            "refresh_someone_elses_credential",
            Case::request(
                Purpose::Refresh,
                NOW,
                RefreshRequest {
                    credential: Some(keys::member_credential(1, Role::Member)),
                    proof: None,
                }
                .proven(CP_URL, &peers()[0], NOW)
                .encode_to_vec(),
            )
            .encode(),
            &[("proof", "ok"), ("credential", "wrong_peer")],
        ),
        seed(
            t,
            "lease_request",
            request(Purpose::Lease, 2, Field::None).encode(),
            &[("proof", "ok"), ("credential", "ok")],
        ),
        seed(
            t,
            "lease_request_draining",
            request(Purpose::Lease, 2, Field::Draining).encode(),
            &[("proof", "ok"), ("moved", "bad_signature")],
        ),
        seed(
            t,
            "lease_request_moved_token",
            request(Purpose::Lease, 2, Field::Token).encode(),
            &[("proof", "ok"), ("moved", "ok")],
        ),
        seed(
            t,
            "watch_request",
            request(Purpose::Watch, 2, Field::None).encode(),
            &[("proof", "ok"), ("credential", "ok")],
        ),
        seed(
            t,
            "request_garbage",
            Case::request(Purpose::Refresh, NOW, vec![0x12, 0xff]).encode(),
            &[("decode", "malformed")],
        ),
    ]
}

fn truncated(frame: &[u8]) -> Vec<u8> {
    frame[..frame.len() - 1].to_vec()
}

fn trailing(frame: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    f.push(0);
    f
}

/// A length prefix announcing 1 MiB, and nothing after it.
fn too_large() -> Vec<u8> {
    vec![0x80, 0x80, 0x40]
}

fn auth_seeds() -> Vec<Seed> {
    let mut out = auth_request_seeds();
    out.extend(auth_answer_and_framing_seeds());
    out
}

/// Auth requests: purposes, roles and bad credentials.
fn auth_request_seeds() -> Vec<Seed> {
    let t = "auth_frames";
    let req = |i: usize, role: Role, purpose: AuthPurpose| AuthRequest {
        credential: Some(keys::member_credential(i, role)),
        purpose: purpose as i32,
        attached_routers: vec![peer(1).to_bytes(), b"not a peer".to_vec()],
        ..Default::default()
    };
    let attach = encode(&req(0, Role::Member, AuthPurpose::Attach));
    let mut expired = keys::member_claims(0, Role::Member);
    expired.expires_at_unix_secs = NOW - 61;
    let mut forged = req(0, Role::Member, AuthPurpose::Attach);
    forged.credential = Some(agentmesh_proto::credential::sign(
        &keys::member_claims(0, Role::Member),
        &keys::signing().stranger,
    ));
    vec![
        seed(
            t,
            "attach",
            attach.clone(),
            &[
                ("request", "ok"),
                ("purpose", "attach"),
                ("credential", "ok"),
            ],
        ),
        seed(
            t,
            "transit_someone_elses_credential",
            encode(&req(1, Role::Member, AuthPurpose::Transit)),
            &[("purpose", "transit"), ("credential", "wrong_peer")],
        ),
        seed(
            t,
            "router",
            encode(&req(0, Role::Router, AuthPurpose::Router)),
            &[("purpose", "router"), ("credential", "ok")],
        ),
        seed(
            t,
            "expired_credential",
            encode(&AuthRequest {
                credential: Some(agentmesh_proto::credential::sign(
                    &expired,
                    &keys::signing().current,
                )),
                ..req(0, Role::Member, AuthPurpose::Attach)
            }),
            &[("credential", "expired")],
        ),
        seed(
            t,
            "forged_credential",
            encode(&forged),
            &[("credential", "bad_signature")],
        ),
        seed(
            t,
            "no_credential",
            encode(&AuthRequest {
                credential: None,
                ..req(0, Role::Member, AuthPurpose::Unspecified)
            }),
            &[("purpose", "malformed"), ("credential", "missing")],
        ),
    ]
}

/// Auth answers, and frames cut, padded or oversized.
fn auth_answer_and_framing_seeds() -> Vec<Seed> {
    let t = "auth_frames";
    let req = |i: usize, role: Role, purpose: AuthPurpose| AuthRequest {
        credential: Some(keys::member_credential(i, role)),
        purpose: purpose as i32,
        attached_routers: vec![peer(1).to_bytes(), b"not a peer".to_vec()],
        ..Default::default()
    };
    let attach = encode(&req(0, Role::Member, AuthPurpose::Attach));
    let mut expired = keys::member_claims(0, Role::Member);
    expired.expires_at_unix_secs = NOW - 61;
    let mut forged = req(0, Role::Member, AuthPurpose::Attach);
    forged.credential = Some(agentmesh_proto::credential::sign(
        &keys::member_claims(0, Role::Member),
        &keys::signing().stranger,
    ));
    let answer = |r: auth_response::Result| encode(&AuthResponse { result: Some(r) });
    vec![
        seed(
            t,
            "admitted",
            answer(auth_response::Result::Admitted(Admitted {
                until_unix_secs: NOW + 3_600,
                policy: None,
                observed_addr: Vec::new(),
            })),
            &[("response", "admitted")],
        ),
        seed(
            t,
            "refused",
            answer(auth_response::Result::Refused(Refused {
                reason: AuthRefusal::Revoked as i32,
                detail: "credential subject is revoked".into(),
                retry_after_ms: 0,
            })),
            &[("response", "refused")],
        ),
        seed(
            t,
            "go_away",
            answer(auth_response::Result::GoAway(go_away())),
            &[("response", "go_away")],
        ),
        seed(
            t,
            "empty",
            encode(&AuthResponse { result: None }),
            &[("response", "empty"), ("request", "ok")],
        ),
        seed(
            t,
            "truncated",
            truncated(&attach),
            &[
                ("request", "length_mismatch"),
                ("response", "length_mismatch"),
            ],
        ),
        seed(
            t,
            "trailing_byte",
            trailing(&attach),
            &[("request", "length_mismatch")],
        ),
        seed(t, "too_large", too_large(), &[("request", "too_large")]),
        seed(
            t,
            "bad_length",
            vec![0xff; 11],
            &[("request", "bad_length")],
        ),
    ]
}

fn go_away() -> GoAway {
    GoAway {
        reason: GoAwayReason::Draining as i32,
        retry_after_secs: 30,
        alternatives: vec![
            Alternative {
                peer_id: peer(1).to_bytes(),
                addrs: vec![
                    "/ip4/127.0.0.1/tcp/4001".into(),
                    "/dns4/router.test/udp/4001/quic-v1".into(),
                ],
                load: Some(RouterLoad {
                    attached_members: 10,
                    transit_connections: 0,
                    high_watermark: 100,
                    low_watermark: 85,
                }),
            },
            Alternative {
                peer_id: b"junk".to_vec(),
                addrs: vec!["/ip4/127.0.0.1/tcp/4002".into()],
                load: None,
            },
            Alternative {
                peer_id: peer(2).to_bytes(),
                addrs: vec!["not an address".into()],
                load: None,
            },
        ],
    }
}

fn goaway_seeds() -> Vec<Seed> {
    let t = "goaway_frames";
    let draining = encode(&go_away());
    vec![
        seed(
            t,
            "draining",
            draining.clone(),
            &[
                ("go_away", "ok"),
                ("reason", "draining"),
                ("alternative", "ok"),
                ("alternative", "bad_peer"),
                ("alternative", "no_addrs"),
            ],
        ),
        seed(
            t,
            "overloaded",
            encode(&GoAway {
                reason: GoAwayReason::Overloaded as i32,
                retry_after_secs: u32::MAX,
                alternatives: vec![],
            }),
            &[("reason", "overloaded")],
        ),
        seed(
            t,
            "ack",
            encode(&GoAwayAck {}),
            &[("ack", "ok"), ("reason", "unspecified")],
        ),
        seed(
            t,
            "truncated",
            truncated(&draining),
            &[("go_away", "length_mismatch")],
        ),
        seed(t, "too_large", too_large(), &[("go_away", "too_large")]),
    ]
}

/// A structured policy input (mode 2): signer, flags, held, epoch,
/// version, issued offset, then the text.
fn policy_input(signer: u8, flags: u8, held: u8, epoch: u8, version: u8, text: &str) -> Vec<u8> {
    let mut d = vec![2, signer, flags, held, epoch, version, 10];
    d.extend_from_slice(text.as_bytes());
    d
}

/// A policy document for the raw mode (1) and for whole frames (0).
fn policy_document(epoch: u64, version: u64, key_id: &str) -> PolicyDocument {
    PolicyDocument {
        epoch,
        version,
        issued_at_unix_secs: NOW,
        text: POLICY_TEXT.into(),
        key_id: key_id.into(),
    }
}

/// A policy with a group, an owner and a grant, so the parser's paths
/// beyond the header are in the corpus.
const POLICY_TEXT: &str = r#"format = 1

[groups]
team = { role = "member", labels = { team = "fuzz" } }

[[owners]]
services = ["echo"]
groups = ["team"]

[[grants]]
from = ["team"]
to = ["echo"]
"#;

fn policy_seeds() -> Vec<Seed> {
    let mut out = policy_document_seeds();
    out.extend(policy_frame_seeds());
    out
}

/// Policy documents: versions, epochs, keys and signatures.
fn policy_document_seeds() -> Vec<Seed> {
    use policy_frames::{HELD_EPOCH, HELD_VERSION};
    let t = "policy_frames";
    let (e, v) = (HELD_EPOCH as u8, HELD_VERSION as u8);
    let raw = |signer: u8, flags: u8, held: u8, doc: &PolicyDocument| {
        let mut d = vec![1, signer, flags, held];
        d.extend_from_slice(&doc.encode_to_vec());
        d
    };
    vec![
        seed(
            t,
            "newer_version",
            policy_input(0, 0, 1, e, v + 1, POLICY_TEXT),
            &[("push", "ok"), ("policy", "accepted")],
        ),
        seed(
            t,
            "same_version_stale",
            policy_input(0, 0, 1, e, v, "format = 1\n"),
            &[("policy", "stale")],
        ),
        seed(
            t,
            "other_epoch_issued_earlier",
            policy_input(0, 0, 2, e, 200, "format = 1\n"),
            &[("policy", "stale")],
        ),
        seed(
            t,
            "retired_key_still_verifies",
            policy_input(1, 2, 0, 1, 1, "format = 1\n"),
            &[("policy", "accepted")],
        ),
        seed(
            t,
            "stranger_key",
            policy_input(2, 0, 0, 1, 1, "format = 1\n"),
            &[("policy", "bad_signature")],
        ),
        seed(
            t,
            "unknown_key_id",
            policy_input(3, 0, 0, 1, 1, "format = 1\n"),
            &[("policy", "unknown_key")],
        ),
        seed(
            t,
            "tampered_signature",
            policy_input(0, 1, 0, 1, 1, "format = 1\n"),
            &[("policy", "bad_signature")],
        ),
        seed(
            t,
            "unparsable_text",
            policy_input(0, 0, 0, 1, 1, "format = 99\n[[[not toml"),
            &[("policy", "unparsable")],
        ),
        seed(
            t,
            "raw_document",
            raw(0, 0, 0, &policy_document(1, 1, keys::CURRENT_KEY_ID)),
            &[("policy", "accepted")],
        ),
    ]
}

/// Policy pushes and acks as frames, whole and broken.
fn policy_frame_seeds() -> Vec<Seed> {
    use policy_frames::{HELD_EPOCH, HELD_VERSION};
    let t = "policy_frames";
    let pushed = PolicyPush {
        policy: Some(sign_policy(
            &policy_document(HELD_EPOCH, HELD_VERSION + 1, keys::CURRENT_KEY_ID),
            &keys::signing().current,
        )),
        revocations: Some(revocation_list(1, 1, NOW, keys::CURRENT_KEY_ID)),
    };
    let push_frame = {
        let mut d = vec![0];
        d.extend_from_slice(&encode(&pushed));
        d
    };
    let frame_of = |bytes: Vec<u8>| {
        let mut d = vec![0];
        d.extend_from_slice(&bytes);
        d
    };
    vec![
        seed(
            t,
            "raw_not_a_document",
            {
                let mut d = vec![1, 0, 0, 0];
                d.extend_from_slice(&[0xff; 8]);
                d
            },
            &[("policy", "malformed")],
        ),
        seed(
            t,
            "push_frame",
            push_frame.clone(),
            &[("push", "ok"), ("policy", "accepted"), ("policy", "stale")],
        ),
        seed(
            t,
            "push_without_policy",
            frame_of(encode(&PolicyPush {
                policy: None,
                revocations: None,
            })),
            &[("push", "ok"), ("policy", "absent"), ("ack", "ok")],
        ),
        seed(
            t,
            "ack",
            frame_of(encode(&PolicyAck {
                epoch: 5,
                version: 6,
                ignored: "stale".into(),
                revocations_epoch: 5,
                revocations_generation: 9,
                revocations_ignored: "bad_signature".into(),
            })),
            &[("ack", "ok")],
        ),
        seed(
            t,
            "truncated",
            truncated(&push_frame),
            &[("push", "length_mismatch")],
        ),
        seed(
            t,
            "too_large",
            frame_of(too_large()),
            &[("ack", "too_large")],
        ),
    ]
}

fn service_record(i: usize, expires: i64) -> ServiceRecord {
    ServiceRecord {
        provider: peer(i).to_bytes(),
        services: vec!["echo".into(), "kv".into()],
        routers: vec![peer(1).to_bytes()],
        issued_at_unix_secs: NOW - 10,
        expires_at_unix_secs: expires,
        credential: None,
    }
}

/// A PeerId that is a SHA-256 multihash: it names no inline key.
fn hashed_peer() -> Vec<u8> {
    let mut b = vec![0x12, 0x20];
    b.extend_from_slice(&[7; 32]);
    assert!(PeerId::from_bytes(&b).is_ok());
    b
}

fn catalog_seeds() -> Vec<Seed> {
    let t = "catalog_frames";
    let valid = sign_record(&service_record(0, NOW + 600), &peers()[0]);
    let expired = sign_record(&service_record(0, NOW - 1), &peers()[0]);
    let forged = sign_record(&service_record(0, NOW + 600), &peers()[1]);
    let req = |op| encode(&CatalogRequest { op: Some(op) });
    let resp = |r| encode(&CatalogResponse { result: Some(r) });
    let lookup = Lookup {
        service: "echo".into(),
        limit: 5,
    };
    let publish = req(catalog_request::Op::Publish(valid.clone()));
    vec![
        seed(
            t,
            "publish",
            publish.clone(),
            &[("request", "publish"), ("record", "ok")],
        ),
        seed(
            t,
            "publish_expired",
            req(catalog_request::Op::Publish(expired)),
            &[("record", "expired")],
        ),
        seed(
            t,
            "publish_forged",
            req(catalog_request::Op::Publish(forged.clone())),
            &[("record", "bad_signature")],
        ),
        seed(
            t,
            "withdraw",
            req(catalog_request::Op::Withdraw(Withdraw {})),
            &[("request", "withdraw")],
        ),
        seed(
            t,
            "lookup",
            req(catalog_request::Op::Lookup(lookup.clone())),
            &[("request", "lookup")],
        ),
        seed(
            t,
            "local_lookup",
            req(catalog_request::Op::LocalLookup(lookup)),
            &[("request", "local_lookup")],
        ),
        seed(
            t,
            "providers",
            resp(catalog_response::Result::Providers(LookupResult {
                records: vec![
                    valid,
                    sign_record(&service_record(2, NOW + 60), &peers()[2]),
                    forged,
                ],
            })),
            &[
                ("response", "providers"),
                ("record", "ok"),
                ("record", "bad_signature"),
            ],
        ),
        seed(
            t,
            "ack",
            resp(catalog_response::Result::Ack(PublishAck {
                expires_at_unix_secs: NOW + 600,
            })),
            &[("response", "ack")],
        ),
        seed(
            t,
            "error",
            resp(catalog_response::Result::Error(CatalogError {
                reason: "publish needs an admitted attach".into(),
            })),
            &[("response", "error")],
        ),
        seed(
            t,
            "empty",
            encode(&CatalogRequest { op: None }),
            &[("request", "empty"), ("response", "empty")],
        ),
        seed(
            t,
            "truncated",
            truncated(&publish),
            &[("request", "length_mismatch")],
        ),
    ]
}

fn call_seeds() -> Vec<Seed> {
    let t = "call_frames";
    let req = |cred| {
        encode(&CallRequest {
            service: "echo".into(),
            credential: cred,
            probe: false,
        })
    };
    let call = req(Some(keys::member_credential(0, Role::Member)));
    vec![
        seed(
            t,
            "request",
            call.clone(),
            &[("request", "ok"), ("credential", "ok")],
        ),
        seed(
            t,
            "someone_elses_credential",
            req(Some(keys::member_credential(1, Role::Member))),
            &[("credential", "wrong_peer")],
        ),
        seed(t, "no_credential", req(None), &[("credential", "missing")]),
        seed(
            t,
            "accepted",
            encode(&CallResponse {
                accepted: true,
                refusal: 0,
                detail: String::new(),
            }),
            &[("response", "accepted")],
        ),
        seed(
            t,
            "refused",
            encode(&CallResponse {
                accepted: false,
                refusal: CallRefusal::TooManyCalls as i32,
                detail: "busy".into(),
            }),
            &[("response", "refused")],
        ),
        seed(
            t,
            "unknown_refusal",
            encode(&CallResponse {
                accepted: false,
                refusal: 999,
                detail: String::new(),
            }),
            &[("response", "refused_unspecified")],
        ),
        seed(
            t,
            "truncated",
            truncated(&call),
            &[("request", "length_mismatch")],
        ),
        seed(t, "too_large", too_large(), &[("response", "too_large")]),
    ]
}

fn record_seeds() -> Vec<Seed> {
    use record::{Case, Signer};
    let t = "record";
    let r0 = service_record(0, NOW + 600);
    let valid = Case::signed(&r0, Signer::First, NOW);
    let with = |f: &dyn Fn(&mut ServiceRecord)| {
        let mut r = r0.clone();
        f(&mut r);
        Case::signed(&r, Signer::First, NOW)
    };
    let ok = [("record", "ok")];
    let bad = [("record", "bad_signature")];
    let signer = |s| Case {
        signer: s,
        ..valid.clone()
    };
    vec![
        seed(t, "valid", valid.encode(), &ok),
        seed(
            t,
            "expiry_edge",
            Case {
                relative: true,
                now: 0,
                ..valid.clone()
            }
            .encode(),
            &ok,
        ),
        seed(
            t,
            "expired",
            Case {
                relative: true,
                now: 1,
                ..valid.clone()
            }
            .encode(),
            &[("record", "expired")],
        ),
        seed(t, "other_signer", signer(Signer::Second).encode(), &bad),
        seed(
            t,
            "flipped_signature",
            signer(Signer::Flipped).encode(),
            &bad,
        ),
        seed(t, "unsigned", signer(Signer::Unsigned).encode(), &bad),
        seed(
            t,
            "hashed_provider",
            with(&|r| r.provider = hashed_peer()).encode(),
            &[("record", "no_inline_key")],
        ),
        seed(
            t,
            "provider_not_a_peer",
            with(&|r| r.provider = b"junk".to_vec()).encode(),
            &[("record", "malformed")],
        ),
        seed(
            t,
            "too_many_services",
            with(&|r| r.services = (0..65).map(|i| format!("s{i}")).collect()).encode(),
            &[("record", "malformed")],
        ),
        seed(
            t,
            "raw_valid",
            Case {
                raw: true,
                body: sign_record(&r0, &peers()[0]).encode_to_vec(),
                ..valid.clone()
            }
            .encode(),
            &ok,
        ),
        seed(
            t,
            "raw_garbage",
            Case {
                raw: true,
                body: vec![0x0a, 0x05, 0x01],
                ..valid.clone()
            }
            .encode(),
            &[("decode", "malformed")],
        ),
        seed(
            t,
            "record_garbage",
            Case {
                body: vec![0xff],
                ..valid.clone()
            }
            .encode(),
            &[("record", "malformed")],
        ),
    ]
}

fn trust_keys_seeds() -> Vec<Seed> {
    let t = "trust_keys";
    let dir = |entries: Vec<Revocation>| {
        RevocationList {
            entries,
            ..Default::default()
        }
        .encode_to_vec()
    };
    let member_until = |until| Revocation {
        peer_id: peer(0).to_bytes(),
        until_unix_secs: until,
        reason: "test".into(),
        token_id: String::new(),
    };
    let published = keys::key_set().encode_to_vec();
    let k = keys::signing();
    let entry = |id: &str, key: &agentmesh_proto::identity::ed25519::Keypair| KeyEntry {
        key_id: id.into(),
        ed25519: key.public().to_bytes().to_vec(),
        active_from_unix_secs: 0,
        verify_until_unix_secs: 0,
    };
    let duplicates = KeySet {
        keys: vec![
            entry(keys::CURRENT_KEY_ID, &k.stranger),
            entry(keys::CURRENT_KEY_ID, &k.current),
        ],
        ..Default::default()
    }
    .encode_to_vec();
    vec![
        seed(
            t,
            "published",
            trust_keys::encode(NOW, &published, &dir(keys::revocations())),
            &[("keys", "ok"), ("key", "ok"), ("key", "expired")],
        ),
        seed(
            t,
            "in_grace",
            trust_keys::encode(keys::RETIRED_UNTIL, &published, &dir(keys::revocations())),
            &[("key", "ok")],
        ),
        seed(
            t,
            "member_revoked",
            trust_keys::encode(NOW, &published, &dir(vec![member_until(NOW + 10)])),
            &[("key", "revoked"), ("revocations", "ok")],
        ),
        seed(
            t,
            "duplicates_last_wins",
            trust_keys::encode(
                NOW,
                &duplicates,
                &dir(vec![member_until(i64::MAX), member_until(NOW - 1)]),
            ),
            &[("key", "ok")],
        ),
        seed(
            t,
            "garbage",
            trust_keys::encode(NOW, &[0xff], &[0xff]),
            &[("keys", "malformed"), ("revocations", "malformed")],
        ),
        seed(
            t,
            "empty",
            Vec::new(),
            &[("keys", "empty"), ("revocations", "none")],
        ),
    ]
}

/// A revocation list signed with the current key (`keys::revocations()`).
fn revocation_list(
    epoch: u64,
    generation: u64,
    issued: i64,
    key_id: &str,
) -> agentmesh_proto::pb::credential::SignedRevocations {
    sign_revocations(
        &RevocationList {
            epoch,
            generation,
            issued_at_unix_secs: issued,
            entries: keys::revocations(),
            key_id: key_id.into(),
        },
        &keys::signing().current,
    )
}

/// Mode 2 of `revocation_list`: a one-entry list naming `token`.
fn list_input(
    signer: u8,
    flags: u8,
    held: u8,
    epoch: u8,
    generation: u8,
    issued: i8,
    token: &str,
) -> Vec<u8> {
    let mut d = vec![2, signer, flags, held, epoch, generation, issued as u8];
    d.extend_from_slice(token.as_bytes());
    d
}

fn revocation_list_seeds() -> Vec<Seed> {
    let mut out = revocation_list_document_seeds();
    out.extend(revocation_list_frame_seeds());
    out
}

/// Revocation lists: generations, epochs, keys and signatures.
fn revocation_list_document_seeds() -> Vec<Seed> {
    use revocation_list::{HELD_EPOCH, HELD_GENERATION};
    let t = "revocation_list";
    let (e, g) = (HELD_EPOCH as u8, HELD_GENERATION as u8);
    vec![
        seed(
            t,
            "newer_generation",
            list_input(0, 0, 1, e, g + 1, -10, "t-leaked"),
            &[("list", "accepted")],
        ),
        seed(
            t,
            "rollback_older_generation",
            list_input(0, 0, 1, e, g - 1, 100, "t-leaked"),
            &[("list", "stale")],
        ),
        seed(
            t,
            "same_generation_member_refuses_router_takes_resigned",
            list_input(0, 0, 1, e, g, 10, "t-leaked"),
            &[("list", "stale"), ("list", "accepted")],
        ),
        seed(
            t,
            "other_epoch_issued_earlier",
            list_input(0, 0, 2, e, 200, 0, "t"),
            &[("list", "stale")],
        ),
        seed(
            t,
            "new_epoch_issued_later",
            list_input(0, 0, 1, e + 2, 0, 1, "t"),
            &[("list", "accepted")],
        ),
        seed(
            t,
            "retired_key_past_grace",
            list_input(1, 0, 0, 1, 1, 0, "t"),
            &[("list", "key_retired")],
        ),
        seed(
            t,
            "retired_key_within_grace",
            list_input(1, 2, 0, 1, 1, 0, "t"),
            &[("list", "accepted")],
        ),
        seed(
            t,
            "stranger_key_forges",
            list_input(2, 0, 1, e, 200, 0, "t-honest"),
            &[("list", "bad_signature")],
        ),
        seed(
            t,
            "unknown_key_id",
            list_input(3, 0, 0, 1, 1, 0, "t"),
            &[("list", "unknown_key")],
        ),
        seed(
            t,
            "tampered_signature",
            list_input(0, 1, 0, 1, 1, 0, "t"),
            &[("list", "bad_signature")],
        ),
    ]
}

/// Revocation lists raw and as pushes, whole and broken.
fn revocation_list_frame_seeds() -> Vec<Seed> {
    use revocation_list::{HELD_EPOCH, HELD_GENERATION};
    let t = "revocation_list";
    let frame_of = |bytes: Vec<u8>| {
        let mut d = vec![0];
        d.extend_from_slice(&bytes);
        d
    };
    let push = |list| {
        frame_of(encode(&PolicyPush {
            policy: None,
            revocations: Some(list),
        }))
    };
    let raw = |signer: u8, flags: u8, held: u8, list: &RevocationList| {
        let mut d = vec![1, signer, flags, held];
        d.extend_from_slice(&list.encode_to_vec());
        d
    };
    let newer_push = push(revocation_list(
        HELD_EPOCH,
        HELD_GENERATION + 1,
        NOW,
        keys::CURRENT_KEY_ID,
    ));
    vec![
        seed(
            t,
            "raw_list",
            raw(
                0,
                0,
                0,
                &RevocationList {
                    epoch: 1,
                    generation: 1,
                    issued_at_unix_secs: NOW,
                    entries: keys::revocations(),
                    key_id: keys::CURRENT_KEY_ID.into(),
                },
            ),
            &[("list", "accepted")],
        ),
        seed(
            t,
            "raw_not_a_list",
            {
                let mut d = vec![1, 0, 0, 0];
                d.extend_from_slice(&[0xff; 8]);
                d
            },
            &[("list", "malformed")],
        ),
        seed(
            t,
            "push_frame",
            newer_push.clone(),
            &[("push", "ok"), ("list", "accepted"), ("list", "stale")],
        ),
        seed(
            t,
            "push_unsigned",
            push(agentmesh_proto::pb::credential::SignedRevocations {
                list: RevocationList {
                    epoch: HELD_EPOCH,
                    generation: 99,
                    entries: keys::revocations(),
                    key_id: keys::CURRENT_KEY_ID.into(),
                    ..Default::default()
                }
                .encode_to_vec(),
                signature: Vec::new(),
            }),
            &[("push", "ok"), ("list", "bad_signature")],
        ),
        seed(
            t,
            "push_without_list",
            frame_of(encode(&PolicyPush::default())),
            &[("push", "ok"), ("list", "absent")],
        ),
        seed(
            t,
            "truncated",
            truncated(&newer_push),
            &[("push", "length_mismatch")],
        ),
        seed(t, "short_header", vec![2, 0, 0], &[("header", "short")]),
    ]
}
