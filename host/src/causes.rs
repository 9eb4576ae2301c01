//! An error with its causes as one line of text, each cause once: the CLI's
//! `error: ...` and the datastores' descriptions of a failed request.

/// `error: cause: cause …`, without repeating a cause whose text is already
/// there (many errors print their source as part of their own message).
pub fn cause_chain(head: String, error: &dyn std::error::Error) -> String {
    let mut text = head;
    let mut source = error.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

/// [`cause_chain`] of an error at the binary's edge, its contexts included.
pub fn describe(error: &anyhow::Error) -> String {
    cause_chain(error.to_string(), error.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Hides(#[source] std::io::Error);

    #[test]
    fn causes_are_appended_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let repeats = Repeats(io());
        assert_eq!(cause_chain(repeats.to_string(), &repeats), "outer: connection refused");
        let hides = Hides(io());
        assert_eq!(cause_chain(hides.to_string(), &hides), "outer: connection refused");
    }

    #[test]
    fn a_context_over_an_error_that_repeats_its_source_reads_once() {
        use anyhow::Context;
        let failed: anyhow::Result<()> = Err(Repeats(std::io::Error::other("bad exclude"))).context("in bad.conf");
        assert_eq!(describe(&failed.unwrap_err()), "in bad.conf: outer: bad exclude");
    }
}
