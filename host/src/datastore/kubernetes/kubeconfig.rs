//! The kubeconfig named by `kubernetes.kubeconfig`: the client configuration and
//! the namespace the pools live in, as whereabouts reads them — the current
//! context's namespace, `kube-system` when the context names none.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::causes::cause_chain;

/// Where pools and reservations live when the current context names no namespace.
pub const DEFAULT_NAMESPACE: &str = "kube-system";

/// The namespace of the current context, [`DEFAULT_NAMESPACE`] if it sets none.
/// A kubeconfig without a (resolvable) current context is an error, as in
/// whereabouts (`k8s config: namespace not present in context`).
pub fn namespace_of(config: &Kubeconfig) -> Result<String, String> {
    let current = config.current_context.as_deref().filter(|c| !c.is_empty()).ok_or_else(|| "it has no current-context".to_string())?;
    let context = config.contexts.iter().find(|c| c.name == current).ok_or_else(|| format!("its current-context {current:?} is not among its contexts"))?;
    Ok(context.context.as_ref().and_then(|c| c.namespace.clone()).filter(|ns| !ns.is_empty()).unwrap_or_else(|| DEFAULT_NAMESPACE.to_string()))
}

/// Reads the kubeconfig file: `(parsed file, namespace)`. Relative file
/// references inside it resolve against its directory (kube does this).
pub fn read(path: &Path) -> Result<(Kubeconfig, String), String> {
    let config = Kubeconfig::read_from(path).map_err(|e| match e {
        // kube's text repeats the path the caller already names.
        kube::config::KubeconfigError::ReadConfig(source, _) => format!("cannot read it: {source}"),
        other => error_text(&other),
    })?;
    let namespace = namespace_of(&config)?;
    Ok((config, namespace))
}

/// The client configuration of the current context. Needs no runtime but is
/// async in kube's API; the caller drives it.
pub async fn client_config(config: Kubeconfig) -> Result<kube::Config, String> {
    kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default()).await.map_err(|e| error_text(&e))
}

/// `e: source: source ...` (see [`cause_chain`]).
pub fn error_text(e: &dyn std::error::Error) -> String {
    cause_chain(e.to_string(), e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(yaml).unwrap()
    }

    const BASE: &str =
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:6443'}\nusers:\n- name: u\n  user: {token: t}\n";

    #[test]
    fn namespace_comes_from_the_current_context() {
        let kc = parse(&format!(
            "{BASE}contexts:\n- name: a\n  context: {{cluster: c, user: u, namespace: whereabouts}}\n- name: b\n  context: {{cluster: c, user: u, namespace: other}}\ncurrent-context: a\n"
        ));
        assert_eq!(namespace_of(&kc).unwrap(), "whereabouts");
    }

    #[test]
    fn namespace_defaults_to_kube_system() {
        let kc = parse(&format!("{BASE}contexts:\n- name: a\n  context: {{cluster: c, user: u}}\ncurrent-context: a\n"));
        assert_eq!(namespace_of(&kc).unwrap(), "kube-system");
        let kc = parse(&format!("{BASE}contexts:\n- name: a\n  context: {{cluster: c, user: u, namespace: ''}}\ncurrent-context: a\n"));
        assert_eq!(namespace_of(&kc).unwrap(), "kube-system");
    }

    #[test]
    fn a_missing_current_context_is_an_error() {
        let kc = parse(&format!("{BASE}contexts:\n- name: a\n  context: {{cluster: c, user: u}}\n"));
        assert!(namespace_of(&kc).unwrap_err().contains("no current-context"));
        let kc = parse(&format!("{BASE}contexts:\n- name: a\n  context: {{cluster: c, user: u}}\ncurrent-context: b\n"));
        assert!(namespace_of(&kc).unwrap_err().contains("\"b\""));
    }

    #[test]
    fn unreadable_files_name_the_cause() {
        let e = read(Path::new("/nonexistent/dir/kubeconfig")).unwrap_err();
        assert_eq!(e, "cannot read it: No such file or directory (os error 2)");
        let dir = std::env::temp_dir().join(format!("thereabouts-kc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("bad.kubeconfig");
        std::fs::write(&file, "clusters: [unterminated").unwrap();
        assert!(read(&file).unwrap_err().to_lowercase().contains("yaml"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
