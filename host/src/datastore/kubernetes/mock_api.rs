//! A scripted API server behind a real `kube::Client`, for the store's
//! in-process tests: every request is recorded (method, path with query, JSON
//! body) and gets the next scripted answer, in order. A plain tower service
//! rather than `tower-test`'s mock pair: the store blocks on its own runtime,
//! so an answer must come from inside the request itself, without a second
//! task on the other side of a channel.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kube::client::Body;
use serde_json::{Value, json};

use super::KubernetesStore;
use crate::datastore::client_runtime::ClientRuntime;

/// One answer of the script.
pub enum Answer {
    /// 200 with this object.
    Ok(Value),
    /// This HTTP status with a `Status` document (`details` may be `Null`).
    Status(u16, &'static str, Value),
    /// No HTTP answer at all: the connection failed.
    Unreachable,
    /// No answer ever (the store's own timeout ends the wait).
    Silent,
}

/// A request as the server saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// `METHOD /path?query`.
    pub line: String,
    /// The JSON body, `Null` when there was none.
    pub body: Value,
    /// The `Accept` header, empty when there was none: what representation
    /// was asked for (a metadata-only list names `PartialObjectMetadataList`).
    pub accept: String,
}

/// What the server saw so far.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Sent>>>);

impl Log {
    pub fn lines(&self) -> Vec<String> {
        self.sent().into_iter().map(|s| s.line).collect()
    }
    pub fn sent(&self) -> Vec<Sent> {
        self.0.lock().unwrap().clone()
    }
    /// The body of request `index` (0-based).
    pub fn body(&self, index: usize) -> Value {
        self.sent()[index].body.clone()
    }
}

/// A store in namespace `ns` whose API server answers from `script`; more
/// answers can be queued later through the returned handle.
pub fn store(ns: &str, script: Vec<Answer>) -> (KubernetesStore, Log, Script) {
    let runtime = ClientRuntime::start().unwrap();
    // The client's dispatcher task is spawned where it is made.
    let (client, log, script) = {
        let _inside = runtime.enter();
        client(ns, script)
    };
    let store = KubernetesStore::with_client(runtime, client, "https://mock".into(), ns.into(), PathBuf::from("mock.kubeconfig"));
    (store, log, script)
}

/// A client whose API server answers from `script`; made inside the tokio
/// runtime it will run on (the controller's tests: `#[tokio::test]`).
pub fn client(ns: &str, script: Vec<Answer>) -> (kube::Client, Log, Script) {
    let log = Log::default();
    let script = Script(Arc::new(Mutex::new(script.into())));
    let (seen, answers) = (log.clone(), script.clone());
    let service = tower::service_fn(move |request| serve(request, seen.clone(), answers.clone()));
    (kube::Client::new(service, ns), log, script)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn serve(request: http::Request<Body>, log: Log, script: Script) -> Result<http::Response<Body>, BoxError> {
    let line = format!("{} {}", request.method(), request.uri());
    let accept = request.headers().get(http::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let bytes = request.into_body().collect_bytes().await?;
    let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes)? };
    log.0.lock().unwrap().push(Sent { line: line.clone(), body, accept });
    let answer = script.0.lock().unwrap().pop_front();
    let (code, document) = match answer {
        Some(Answer::Ok(object)) => (200, object),
        Some(Answer::Status(code, reason, details)) => (
            code,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": reason, "reason": reason, "code": code, "details": details}),
        ),
        Some(Answer::Unreachable) => return Err("connection refused".into()),
        Some(Answer::Silent) => {
            std::future::pending::<()>().await;
            unreachable!()
        }
        None => panic!("no answer scripted for {line}"),
    };
    Ok(http::Response::builder().status(code).body(Body::from(serde_json::to_vec(&document)?))?)
}

/// The answers still to come.
#[derive(Clone)]
pub struct Script(Arc<Mutex<VecDeque<Answer>>>);

impl Script {
    pub fn then(&self, answers: Vec<Answer>) {
        self.0.lock().unwrap().extend(answers);
    }
    pub fn is_done(&self) -> bool {
        self.0.lock().unwrap().is_empty()
    }
}
