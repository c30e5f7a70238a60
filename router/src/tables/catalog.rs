//! The catalog's record store as one of the owner's tables: the catalog
//! server asks to publish and withdraw ([`RecordWriter`] on the
//! [`Handle`]), the policy to drop records no longer owned; the swarm loop
//! applies each, and drops records itself when a member goes or a record
//! expires. One writer, so a publish checked against an admission that
//! ends before the write cannot leave a record behind: the owner checks
//! the admission again when it writes.

use agentmesh_proto::credential::Trust;
use agentmesh_proto::pb::mesh::SignedRecord;
use futures::future::BoxFuture;
use libp2p::PeerId;

use super::{AskError, Command, Handle, Reply, Tables};
use crate::admission::AdmissionTable;
use crate::catalog::store::{Publish, RecordFilter, RecordWriter, StoreError, WriteError};

impl Tables {
    pub(super) fn publish(&mut self, p: Publish) -> Reply {
        if !self.admissions.read().may_reserve(&p.provider, p.now) {
            return Reply::Published(Err(StoreError::NotAdmitted));
        }
        let stored = self
            .catalog
            .write()
            .publish(p.provider, p.signed, &p.record, p.now);
        self.catalog_changed |= stored.is_ok();
        Reply::Published(stored)
    }

    pub(super) fn withdraw(&mut self, provider: &PeerId) -> Reply {
        self.catalog_changed |= self.catalog.write().remove(provider);
        Reply::Done
    }

    pub(super) fn drop_records(&mut self, RecordFilter(mut keep): RecordFilter) -> Reply {
        let (trust, admissions) = (self.trust.read(), self.admissions.read());
        let dropped = self
            .catalog
            .write()
            .retain(|p, r| keep(p, r, &trust, &admissions))
            .len();
        drop((trust, admissions));
        self.catalog_changed |= dropped > 0;
        Reply::Dropped(dropped)
    }

    /// Whether a command changed the record store since the last call: the
    /// swarm loop then re-announces what the store holds.
    pub(crate) fn take_catalog_changed(&mut self) -> bool {
        std::mem::take(&mut self.catalog_changed)
    }
}

impl Handle {
    /// Drops every record `keep(provider, record, trust, admissions)` says
    /// no to; how many.
    pub(crate) async fn drop_records(
        &self,
        keep: impl FnMut(&PeerId, &SignedRecord, &Trust, &AdmissionTable) -> bool + Send + 'static,
    ) -> Result<usize, AskError> {
        match self
            .ask(Command::DropRecords(RecordFilter(Box::new(keep))))
            .await?
        {
            Reply::Dropped(n) => Ok(n),
            _ => Ok(0),
        }
    }
}

impl RecordWriter for Handle {
    fn publish(&self, p: Publish) -> BoxFuture<'_, Result<i64, WriteError>> {
        Box::pin(async move {
            match self.ask(Command::Publish(Box::new(p))).await {
                Ok(Reply::Published(r)) => r.map_err(WriteError::from),
                Ok(other) => Err(WriteError::Unanswered(format!(
                    "unexpected answer {other:?}"
                ))),
                Err(e) => Err(WriteError::Unanswered(e.to_string())),
            }
        })
    }

    fn withdraw(&self, provider: PeerId) -> BoxFuture<'_, Result<(), WriteError>> {
        Box::pin(async move {
            self.ask(Command::Withdraw(provider))
                .await
                .map(drop)
                .map_err(|e| WriteError::Unanswered(e.to_string()))
        })
    }
}
