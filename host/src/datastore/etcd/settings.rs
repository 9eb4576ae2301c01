//! From the config's whereabouts-era etcd keys (`etcd_host`, `etcd_username`,
//! `etcd_password`, `etcd_key_file`, `etcd_cert_file`, `etcd_ca_cert_file`) to
//! endpoints and client options. Files are read here, when the store opens, so a
//! wrong path is a config error naming the key and the file before anything is
//! sent.

use std::path::Path;

use thereabouts_allocator::model::DatastoreSettings;

/// TLS material, as read from the configured files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_pem: Vec<u8>,
    /// Client certificate and key (mutual TLS), when configured.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// With their scheme: `https://` when TLS is configured, else `http://`.
    pub endpoints: Vec<String>,
    pub user: Option<(String, String)>,
    pub tls: Option<TlsFiles>,
}

impl Settings {
    /// Endpoints joined for messages.
    pub fn endpoints_text(&self) -> String {
        self.endpoints.join(",")
    }
}

fn non_empty(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

fn read_pem(key: &str, path: &str, what: &str) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(Path::new(path)).map_err(|e| format!("{key} {path}: cannot read the {what}: {e}"))?;
    if !String::from_utf8_lossy(&bytes).contains("-----BEGIN ") {
        return Err(format!("{key} {path}: holds no PEM-encoded {what}"));
    }
    Ok(bytes)
}

/// Reads the settings; the error names the offending key (and file).
pub fn read(d: &DatastoreSettings) -> Result<Settings, String> {
    let hosts: Vec<&str> = d.etcd_hosts.iter().map(|h| h.trim()).filter(|h| !h.is_empty()).collect();
    if hosts.is_empty() {
        return Err("the etcd datastore needs \"etcd_host\": one endpoint or more (\"https://etcd-1:2379,https://etcd-2:2379\")".into());
    }
    let ca = non_empty(&d.etcd_ca_cert_file);
    let cert = non_empty(&d.etcd_cert_file);
    let key = non_empty(&d.etcd_key_file);
    let tls = match (ca, cert, key) {
        (None, None, None) => None,
        (None, _, _) => return Err("etcd TLS needs \"etcd_ca_cert_file\": the CA that signed etcd's serving certificate".into()),
        (Some(_), Some(_), None) => return Err("\"etcd_cert_file\" is set without \"etcd_key_file\"".into()),
        (Some(_), None, Some(_)) => return Err("\"etcd_key_file\" is set without \"etcd_cert_file\"".into()),
        (Some(ca), cert, key) => {
            let ca_pem = read_pem("etcd_ca_cert_file", ca, "CA certificate")?;
            let identity = match (cert, key) {
                (Some(cert), Some(key)) => Some((read_pem("etcd_cert_file", cert, "client certificate")?, read_pem("etcd_key_file", key, "client key")?)),
                _ => None,
            };
            Some(TlsFiles { ca_pem, identity })
        }
    };
    let mut endpoints = Vec::with_capacity(hosts.len());
    for host in hosts {
        let endpoint = match (host.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase()), tls.is_some()) {
            (None, true) => format!("https://{host}"),
            (None, false) => format!("http://{host}"),
            (Some(s), true) if s == "https" => host.to_string(),
            (Some(s), false) if s == "http" => host.to_string(),
            (Some(s), true) if s == "http" => return Err(format!("etcd_host {host} is plain http, but etcd TLS files are configured: use https://")),
            (Some(s), false) if s == "https" => {
                return Err(format!("etcd_host {host} is https: set \"etcd_ca_cert_file\" (and the client certificate and key if etcd asks for them)"));
            }
            (Some(s), _) => return Err(format!("etcd_host {host}: unknown scheme {s:?} (http or https)")),
        };
        endpoints.push(endpoint);
    }
    let user = non_empty(&d.etcd_username).map(|u| (u.to_string(), d.etcd_password.clone().unwrap_or_default()));
    Ok(Settings { endpoints, user, tls })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(hosts: &[&str]) -> DatastoreSettings {
        DatastoreSettings { kind: Some("etcd".into()), etcd_hosts: hosts.iter().map(|h| h.to_string()).collect(), ..Default::default() }
    }

    #[test]
    fn plain_endpoints_get_a_scheme() {
        let s = read(&DatastoreSettings { etcd_username: Some("cni".into()), ..settings(&["127.0.0.1:2379", " http://etcd-2:2379 "]) }).unwrap();
        assert_eq!(s.endpoints, ["http://127.0.0.1:2379", "http://etcd-2:2379"]);
        assert_eq!(s.user, Some(("cni".into(), String::new())));
        assert!(s.tls.is_none());
        assert!(read(&settings(&[])).unwrap_err().contains("etcd_host"));
        assert!(read(&settings(&["https://etcd:2379"])).unwrap_err().contains("etcd_ca_cert_file"));
        assert!(read(&settings(&["unix://x"])).unwrap_err().contains("unknown scheme"));
    }

    #[test]
    fn tls_files_are_read_and_named_when_wrong() {
        let dir = std::env::temp_dir().join(format!("thereabouts-etcd-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pem = dir.join("ca.pem");
        std::fs::write(&pem, "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not pem").unwrap();
        let p = |p: &Path| Some(p.to_str().unwrap().to_string());
        let with = |ca, cert, key| DatastoreSettings { etcd_ca_cert_file: ca, etcd_cert_file: cert, etcd_key_file: key, ..settings(&["127.0.0.1:2379"]) };

        let s = read(&with(p(&pem), p(&pem), p(&pem))).unwrap();
        assert_eq!(s.endpoints, ["https://127.0.0.1:2379"]);
        assert!(s.tls.as_ref().unwrap().identity.is_some());
        let missing = read(&with(p(&pem), p(&dir.join("nope.pem")), p(&pem))).unwrap_err();
        assert!(missing.starts_with("etcd_cert_file ") && missing.contains("nope.pem"), "{missing}");
        assert!(read(&with(p(&junk), None, None)).unwrap_err().contains("no PEM"));
        assert!(read(&with(None, p(&pem), p(&pem))).unwrap_err().contains("etcd_ca_cert_file"));
        assert!(read(&with(p(&pem), p(&pem), None)).unwrap_err().contains("etcd_key_file"));
        let http = DatastoreSettings { etcd_hosts: vec!["http://127.0.0.1:2379".into()], ..with(p(&pem), None, None) };
        assert!(read(&http).unwrap_err().contains("plain http"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
