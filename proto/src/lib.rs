//! Everything agentmesh puts on the wire: the control plane's gRPC service, the
//! messages of our libp2p protocols, the credential and its offline check.
//!
//! This crate does no I/O: it holds the messages and how to check them;
//! how a message travels on a stream (framing, deadlines) is
//! `agentmesh-wire`'s.

pub mod credential;
pub mod enforce;
pub mod order;
pub mod policy;
pub mod proof;
pub mod protocols;
pub mod record;
pub mod revocations;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

/// Generated protobuf and gRPC code.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod pb {
    /// `agentmesh.*` packages.
    pub mod agentmesh {
        /// `agentmesh.credential.*`.
        pub mod credential {
            /// `agentmesh.credential.v1`.
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/agentmesh.credential.v1.rs"));
            }
        }
        /// `agentmesh.controlplane.*`.
        pub mod controlplane {
            /// `agentmesh.controlplane.v1`.
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/agentmesh.controlplane.v1.rs"));
            }
        }
        /// `agentmesh.mesh.*`.
        pub mod mesh {
            /// `agentmesh.mesh.v1`.
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/agentmesh.mesh.v1.rs"));
            }
        }
    }
    pub use agentmesh::controlplane::v1 as controlplane;
    pub use agentmesh::credential::v1 as credential;
    pub use agentmesh::mesh::v1 as mesh;

    /// Encoded `FileDescriptorSet` of every agentmesh proto, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/agentmesh_descriptor.bin"));
}

pub use libp2p_identity as identity;

/// Seconds since the Unix epoch, from the wall clock.
///
/// Credentials carry wall-clock instants; monotonic clocks are for deadlines.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
