//! The requests the etcd store sends, behind a small trait of our own, so the
//! store can be tested in process against a model of etcd ([`super::memory`])
//! instead of a server: etcd_client's answers cannot be made outside it.
//!
//! Exactly what the store uses: connecting, a GET of one key, a keys-only
//! probe of the prefix, and a transaction of guards and operations. A failure
//! is already classified ([`Failure`]); the store adds who and what (the
//! endpoints, the action), counts the request and logs it.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, TlsOptions, Txn, TxnOp, TxnOpResponse};

use super::REQUEST_TIMEOUT;
use super::failure;
use super::settings::Settings;
use super::txn::{Guard, Write};
use crate::datastore::client_runtime::ClientRuntime;
use crate::datastore::failure::Class;

/// A key as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
}

/// A GET of one key: the store's revision when it answered, and the key if present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub revision: i64,
    pub kv: Option<KeyValue>,
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Get { key: String },
    Write(Write),
}

/// A transaction's answer: whether every guard held, the store's revision
/// after it, and the result of each [`Op::Get`], in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnAnswer {
    pub succeeded: bool,
    pub revision: i64,
    pub gets: Vec<Option<KeyValue>>,
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// etcd (or the way to it) answered, or did not: `detail` is the cause.
    Failed { class: Class, detail: String },
    /// The client refused to send it (endpoints or arguments it cannot use):
    /// the settings are at fault.
    Config { detail: String },
}

/// The requests of the etcd store. `limit` bounds the wait for the answer.
pub trait Transport: Send + Sync {
    /// Whether [`connect`](Transport::connect) succeeded already.
    fn connected(&self) -> bool;
    /// Connects (authenticating when a user is set).
    fn connect(&self, limit: Duration) -> Result<(), Failure>;
    fn get(&self, key: &str, limit: Duration) -> Result<Read, Failure>;
    /// Reads at most one key under `prefix`, keys only: reachable, a leader,
    /// credentials and read permission.
    fn probe(&self, prefix: &str, limit: Duration) -> Result<(), Failure>;
    fn txn(&self, guards: &[Guard], ops: &[Op], limit: Duration) -> Result<TxnAnswer, Failure>;
}

/// The real thing: etcd_client on a private current-thread tokio runtime (the
/// store stays synchronous), connected on first use.
pub struct EtcdClient {
    runtime: ClientRuntime,
    settings: Settings,
    client: Mutex<Option<Client>>,
}

impl EtcdClient {
    /// Starts the runtime; sends nothing.
    pub fn new(settings: Settings) -> Result<Self, String> {
        let runtime = ClientRuntime::start().map_err(|e| format!("cannot start the etcd client's runtime: {e}"))?;
        Ok(EtcdClient { runtime, settings, client: Mutex::default() })
    }

    /// The connected client (the store connects before any other request).
    fn client(&self) -> Result<Client, Failure> {
        let client = self.client.lock().unwrap_or_else(|e| e.into_inner()).clone();
        client.ok_or_else(|| Failure::Failed { class: Class::Transient, detail: "not connected".into() })
    }

    /// Runs one request future to completion within `limit`.
    fn bounded<T>(&self, limit: Duration, request: impl Future<Output = Result<T, etcd_client::Error>>) -> Result<T, Failure> {
        match self.runtime.within(limit, request) {
            Some(Ok(value)) => Ok(value),
            Some(Err(e)) => Err(failure_of(&e)),
            None => Err(Failure::Failed {
                class: Class::Transient,
                detail: format!("no answer within {} ms (endpoints unreachable, no leader, or a TLS handshake that fails)", limit.as_millis()),
            }),
        }
    }
}

/// How a client of `settings` connects: credentials, TLS, and only to a
/// member that has a leader (a partitioned member must not answer reads).
pub fn connect_options(settings: &Settings) -> ConnectOptions {
    let mut options = ConnectOptions::new().with_connect_timeout(REQUEST_TIMEOUT).with_require_leader(true);
    if let Some((user, password)) = &settings.user {
        options = options.with_user(user.clone(), password.clone());
    }
    if let Some(tls) = &settings.tls {
        let mut config = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        options = options.with_tls(config);
    }
    options
}

fn failure_of(e: &etcd_client::Error) -> Failure {
    if let etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) = e {
        return Failure::Config { detail: failure::error_text(e) };
    }
    let (class, detail) = failure::classify(e);
    Failure::Failed { class, detail }
}

fn key_value(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
    }
}

impl Transport for EtcdClient {
    fn connected(&self) -> bool {
        self.client.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    fn connect(&self, limit: Duration) -> Result<(), Failure> {
        let client = self.bounded(limit, Client::connect(self.settings.endpoints.clone(), Some(connect_options(&self.settings))))?;
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(client);
        Ok(())
    }

    fn get(&self, key: &str, limit: Duration) -> Result<Read, Failure> {
        let mut client = self.client()?;
        let response = self.bounded(limit, client.get(key, None))?;
        Ok(Read { revision: response.header().map(|h| h.revision()).unwrap_or(0), kv: response.kvs().first().map(key_value) })
    }

    fn probe(&self, prefix: &str, limit: Duration) -> Result<(), Failure> {
        let mut client = self.client()?;
        let options = GetOptions::new().with_prefix().with_keys_only().with_limit(1);
        self.bounded(limit, client.get(prefix, Some(options))).map(|_| ())
    }

    fn txn(&self, guards: &[Guard], ops: &[Op], limit: Duration) -> Result<TxnAnswer, Failure> {
        let mut client = self.client()?;
        let compares: Vec<Compare> = guards
            .iter()
            .map(|g| match g {
                Guard::Absent { key } => Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                Guard::Unchanged { key, mod_revision } => Compare::mod_revision(key.as_str(), CompareOp::Equal, *mod_revision),
            })
            .collect();
        let ops: Vec<TxnOp> = ops
            .iter()
            .map(|op| match op {
                Op::Get { key } => TxnOp::get(key.as_str(), None),
                Op::Write(Write::Put { key, value }) => TxnOp::put(key.as_str(), value.clone(), None),
                Op::Write(Write::Delete { key }) => TxnOp::delete(key.as_str(), None),
            })
            .collect();
        let txn = if compares.is_empty() { Txn::new().and_then(ops) } else { Txn::new().when(compares).and_then(ops) };
        let response = self.bounded(limit, client.txn(txn))?;
        let gets = response
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get.kvs().first().map(key_value)),
                _ => None,
            })
            .collect();
        Ok(TxnAnswer { succeeded: response.succeeded(), revision: response.header().map(|h| h.revision()).unwrap_or(0), gets })
    }
}
