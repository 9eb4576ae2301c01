//! The controller's requests, raw: paths and JSON bodies it builds itself, and
//! answers decoded into the few fields it reads (`pods.rs`, `kube_store.rs`),
//! with every failure counted by class for `thereabouts_api_errors_total`.

use http::Method;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::metrics::Metrics;
// Continue tokens are base64 (`=`, `+`, `/`): encoded as path segments are.
use crate::datastore::kubernetes::crd::escape;

/// A request that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The apiserver answered with a failure status.
    #[error("{method} {path}: {code} {message}")]
    Status { method: Method, path: String, code: u16, message: String },
    /// No answer (connection refused, reset, timed out).
    #[error("{method} {path}: {detail}")]
    Transport { method: Method, path: String, detail: String },
}

impl ApiError {
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Status { code, .. } => Some(*code),
            ApiError::Transport { .. } => None,
        }
    }

    /// The `class` label: what an operator acts on.
    pub fn class(&self) -> &'static str {
        match self.code() {
            None => "unreachable",
            Some(401 | 403) => "denied",
            Some(404) => "not_found",
            Some(409 | 422) => "conflict",
            Some(408 | 429 | 500..=599) => "unavailable",
            Some(_) => "rejected",
        }
    }
}

/// The client, the metrics its failures go to, and the field manager its
/// writes name (so that an object's `managedFields` tell the controller's
/// writes from the plugins').
#[derive(Clone)]
pub struct Api {
    pub client: kube::Client,
    pub metrics: Metrics,
}

/// Requests whose writes the apiserver records under this manager.
pub const FIELD_MANAGER: &str = "thereabouts-controller";

impl Api {
    pub async fn send(&self, method: Method, path: &str, body: Option<(&str, &Value)>) -> Result<Value, ApiError> {
        let text = self.send_text(method, path, body).await?;
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text)
            .map_err(|e| self.failed(ApiError::Transport { method: Method::GET, path: path.into(), detail: format!("answer is not JSON: {e}") }))
    }

    /// A GET decoded into `T` (serde skips every field `T` does not name).
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        let text = self.send_text(Method::GET, path, None).await?;
        serde_json::from_str(&text)
            .map_err(|e| self.failed(ApiError::Transport { method: Method::GET, path: path.into(), detail: format!("answer unreadable: {e}") }))
    }

    async fn send_text(&self, method: Method, path: &str, body: Option<(&str, &Value)>) -> Result<String, ApiError> {
        let mut request = http::Request::builder().method(method.clone()).uri(path).header(http::header::ACCEPT, "application/json");
        let bytes = match body {
            Some((content_type, value)) => {
                request = request.header(http::header::CONTENT_TYPE, content_type);
                serde_json::to_vec(value).unwrap_or_default()
            }
            None => Vec::new(),
        };
        let request = request.body(bytes).map_err(|e| ApiError::Transport { method: method.clone(), path: path.into(), detail: e.to_string() })?;
        let answer = tokio::time::timeout(crate::datastore::kubernetes::REQUEST_TIMEOUT, self.client.request_text(request)).await;
        match answer {
            Ok(Ok(text)) => Ok(text),
            Ok(Err(kube::Error::Api(status))) => {
                Err(self.failed(ApiError::Status { method, path: path.into(), code: status.code, message: status.message.clone() }))
            }
            Ok(Err(e)) => Err(self.failed(ApiError::Transport { method, path: path.into(), detail: crate::datastore::kubernetes::kubeconfig::error_text(&e) })),
            Err(_) => Err(self.failed(ApiError::Transport { method, path: path.into(), detail: "no answer within the request timeout".into() })),
        }
    }

    fn failed(&self, e: ApiError) -> ApiError {
        self.metrics.api_error(e.class());
        e
    }

    /// Every item of a collection, page by page (`limit` items each), each
    /// handed to `each` as it is decoded: a page at a time in memory.
    pub async fn list_pages<T: DeserializeOwned>(&self, path: &str, limit: u32, each: impl FnMut(T)) -> Result<(), ApiError> {
        self.list_sized_pages(path, || limit, each).await
    }

    /// [`Api::list_pages`] with each page's `limit` asked of `limit` just
    /// before it is requested (after the items of the page before were handed over).
    pub async fn list_sized_pages<T: DeserializeOwned>(&self, path: &str, mut limit: impl FnMut() -> u32, mut each: impl FnMut(T)) -> Result<(), ApiError> {
        let mut token: Option<String> = None;
        let separator = if path.contains('?') { '&' } else { '?' };
        loop {
            let mut page_path = format!("{path}{separator}limit={}", limit());
            if let Some(t) = &token {
                page_path.push_str(&format!("&continue={}", escape(t)));
            }
            let page: Page<T> = self.get_page(&page_path).await?;
            page.items.into_iter().for_each(&mut each);
            token = page.metadata.continue_token.filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(());
            }
        }
    }

    /// One page, asked again alone when the apiserver did not answer in time
    /// or said it was too busy: in a saturated apiserver, failing the whole
    /// list for one slow page threw away the pages before it and started over
    /// (a pass of 30 000 pods failed seven times in a row that way). A
    /// continue token outlives these pauses (it expires with etcd's
    /// compaction, minutes later); an expired one (410) still fails the list.
    async fn get_page<T: DeserializeOwned>(&self, path: &str) -> Result<Page<T>, ApiError> {
        let mut pause = PAGE_RETRY_PAUSE;
        for _ in 0..PAGE_RETRIES {
            match self.get(path).await {
                Err(e) if matches!(e.class(), "unreachable" | "unavailable") => {
                    crate::logging::verbose(format!("controller: {e}; asking for that page again"));
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                answer => return answer,
            }
        }
        self.get(path).await
    }
}

/// How many times one page is asked again, and the pause before the first
/// retry (doubling after each).
const PAGE_RETRIES: u32 = 2;
const PAGE_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(serde::Deserialize)]
struct Page<T> {
    #[serde(default)]
    metadata: PageMeta,
    #[serde(default = "Vec::new")]
    items: Vec<T>,
}

#[derive(serde::Deserialize, Default)]
struct PageMeta {
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::datastore::kubernetes::mock_api::{self, Answer};

    #[test]
    fn failures_are_classed_for_the_metric() {
        let status = |code| ApiError::Status { method: Method::GET, path: "/".into(), code, message: String::new() };
        assert_eq!(status(403).class(), "denied");
        assert_eq!(status(422).class(), "conflict");
        assert_eq!(status(503).class(), "unavailable");
        assert_eq!(ApiError::Transport { method: Method::GET, path: "/".into(), detail: String::new() }.class(), "unreachable");
        assert_eq!(escape("a+b/c="), "a%2Bb%2Fc%3D", "a continue token stays one query value");
    }

    /// The pods of a three-page list whose second page first finds the
    /// apiserver unreachable (as a timed-out request is classed).
    async fn list_with(second_try: Answer) -> (Result<Vec<String>, ApiError>, Vec<String>) {
        let page = |names: &[&str], next: &str| {
            let items: Vec<Value> = names.iter().map(|n| json!({"metadata": {"name": n}})).collect();
            Answer::Ok(json!({"metadata": {"continue": next}, "items": items}))
        };
        let script = vec![page(&["a"], "t1"), Answer::Unreachable, second_try, page(&["c"], "")];
        let (client, log, _) = mock_api::client("kube-system", script);
        let api = Api { client, metrics: Metrics::new() };
        let mut names = Vec::new();
        let listed = api.list_pages::<Value>("/api/v1/pods", 1, |p| names.push(p["metadata"]["name"].as_str().unwrap_or_default().to_string())).await;
        (listed.map(|_| names), log.lines())
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_page_with_no_answer_is_asked_again_alone() {
        let b = Answer::Ok(json!({"metadata": {"continue": "t2"}, "items": [{"metadata": {"name": "b"}}]}));
        let (names, lines) = list_with(b).await;
        assert_eq!(names.unwrap(), ["a", "b", "c"]);
        let second = "GET /api/v1/pods?limit=1&continue=t1";
        assert_eq!(lines, ["GET /api/v1/pods?limit=1", second, second, "GET /api/v1/pods?limit=1&continue=t2"]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_expired_continue_token_fails_the_list() {
        let (names, lines) = list_with(Answer::Status(410, "Expired", Value::Null)).await;
        assert_eq!(names.unwrap_err().code(), Some(410));
        assert_eq!(lines.len(), 3, "asked once more after no answer, then not again: {lines:?}");
    }
}
