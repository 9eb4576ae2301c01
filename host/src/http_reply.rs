//! The one way the binary's HTTP servers (the controller's `/metrics` and
//! probes, the profile provider) build an answer: a status, a content type
//! and a whole body.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};

pub const TEXT: &str = "text/plain; charset=utf-8";
pub const JSON: &str = "application/json";

pub fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
