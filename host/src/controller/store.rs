//! The shared datastore a reconciler serves, whichever it is: the same three
//! operations on the Kubernetes CRDs (`kube_store.rs`) and on etcd
//! (`etcd_store.rs`), so the pass (`reconcile.rs`) and the CLI tools do not
//! care which.

use std::collections::BTreeSet;

use super::api::ApiError;
use super::etcd_store::EtcdStore;
use super::held::{Entry, Holdings, Reservation};
use super::kube_store::{KubeStore, Written};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("etcd {endpoints}: {detail}")]
    Etcd { endpoints: String, detail: String },
}

pub enum Store {
    Kube(KubeStore),
    /// Boxed: its client is large, and a controller holds a few stores.
    Etcd(Box<EtcdStore>),
}

impl Store {
    /// Every pool entry and reservation; with `only`, only those of these
    /// podrefs are kept (a delete pass: a few pods among 50 000 entries).
    pub async fn read(&self, only: Option<&BTreeSet<String>>) -> Result<Holdings, StoreError> {
        match self {
            Store::Kube(s) => Ok(s.read(only).await?),
            Store::Etcd(s) => s.read(only).await,
        }
    }

    /// Removes `entries` of `pool`, each only if it is still as read.
    pub async fn remove_entries(&self, pool: &str, entries: &[&Entry]) -> Result<Vec<Written>, StoreError> {
        match self {
            Store::Kube(s) => Ok(s.remove_entries(pool, entries).await?),
            Store::Etcd(s) => s.remove_entries(pool, entries).await,
        }
    }

    /// Deletes `r`, only if it is still as read.
    pub async fn delete_reservation(&self, r: &Reservation) -> Result<Written, StoreError> {
        match self {
            Store::Kube(s) => Ok(s.delete_reservation(r).await?),
            Store::Etcd(s) => s.delete_reservation(r).await,
        }
    }

    /// The `datastore` label of its metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Kube(_) => "kubernetes",
            Store::Etcd(_) => "etcd",
        }
    }

    /// Where the pools are, for messages.
    pub fn describe(&self) -> String {
        match self {
            Store::Kube(s) => format!("kubernetes, namespace {}", s.namespace),
            Store::Etcd(s) => format!("etcd {}", s.endpoints),
        }
    }
}
