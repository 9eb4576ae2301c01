//! The Helm chart (charts/thereabouts): the plain manifests of deploy/ are it,
//! rendered; `helm lint --strict` and its values schema; and `helm install`,
//! `upgrade` and `uninstall` against a real kube-apiserver (Helm v4 applies
//! server-side with strict field validation), beside CRDs already installed.
//!
//! helm, kubeconform and the schemas: `$THEREABOUTS_TOOLS` (tests/k8s.sh builds them
//! with tests/k8s-bins/build-tools.sh), helm also as `$THEREABOUTS_HELM`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use thereabouts_e2e::TempDir;
use thereabouts_e2e::{Call, Invocation, thereabouts_bin};
use thereabouts_k8s_harness::controller::{self, Controller, Settings};
use thereabouts_k8s_harness::etcd::{Etcd, PLUGIN_PREFIX};
use thereabouts_k8s_harness::plugin::kubernetes_conf;
use thereabouts_k8s_harness::{Cluster, NAMESPACE, block_on, deploy_dir, wait_until};

fn helm() -> PathBuf {
    PathBuf::from(std::env::var_os("THEREABOUTS_HELM").expect("THEREABOUTS_HELM: the helm binary (tests/k8s.sh sets it)"))
}

fn tools() -> PathBuf {
    PathBuf::from(std::env::var_os("THEREABOUTS_TOOLS").expect("THEREABOUTS_TOOLS: tests/k8s-bins/build-tools.sh's directory (tests/k8s.sh sets it)"))
}

fn chart() -> PathBuf {
    deploy_dir().join("../charts/thereabouts")
}

fn run(args: &[&str]) -> Output {
    Command::new(helm()).args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn ok(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what}: {}", text(&out));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_plain_manifests_are_the_chart_rendered() {
    let out = TempDir::new("rendered");
    let script = deploy_dir().join("../scripts/render-manifests.sh");
    let rendered = Command::new("bash").arg(&script).arg(out.path()).env("HELM", helm()).output().unwrap();
    ok(rendered, "scripts/render-manifests.sh");
    let mut files: Vec<PathBuf> = std::fs::read_dir(out.path()).unwrap().flatten().map(|e| e.path()).collect();
    files.sort();
    assert_eq!(files.len(), 7, "{files:?}");
    for file in files {
        let name = file.file_name().unwrap();
        let committed = std::fs::read_to_string(deploy_dir().join(name)).unwrap_or_default();
        assert!(
            committed == std::fs::read_to_string(&file).unwrap(),
            "deploy/{} differs from the chart: run scripts/render-manifests.sh",
            Path::new(name).display()
        );
    }
    // The chart's CRDs are deploy/crds itself.
    assert_eq!(std::fs::canonicalize(chart().join("crds")).unwrap(), std::fs::canonicalize(deploy_dir().join("crds")).unwrap());
}

#[test]
fn helm_lint_is_strictly_clean_and_the_schema_refuses_bad_values() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    ok(run(&["lint", "--strict", chart]), "helm lint --strict");
    for (set, names) in [
        ("image.tagg=1", "tagg"),
        ("controller.replicas=two", "replicas"),
        ("installer.installAsWhereabouts=maybe", "installAsWhereabouts"),
        ("flowcontrol.enabled=true", "flowcontrol"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("flatFile.datastore=file", "datastore"),
        ("flatFile.datastore=etcd", "hosts"),
        ("flatFile.settings.datastore=etcd", "propertyName 'datastore'"),
        ("flatFile.kubernetes.kubeconfig=relative/kubeconfig", "kubeconfig"),
        ("policies.wasm.policy=AAAA", "wasm"),
    ] {
        let out = run(&["template", "t", chart, "--set", set]);
        assert!(!out.status.success(), "--set {set} was accepted");
        assert!(text(&out).contains(names), "--set {set}: {}", text(&out));
    }
    // What NOTES.txt tells after an install as whereabouts.
    let notes = ok(run(&["install", "t", chart, "--dry-run=client", "--set", "installer.installAsWhereabouts=true", "-n", "kube-system"]), "dry run");
    assert!(notes.contains("also installed as `whereabouts`"), "{notes}");
}

#[test]
fn helm_installs_upgrades_and_uninstalls_on_a_real_apiserver() {
    // A control plane of its own: the shared one holds deploy/'s objects,
    // which Helm would rightly refuse to take over.
    let cluster = Cluster::start().expect("starting a control plane");
    block_on(cluster.install_crds()).expect("CRDs installed before the chart, as whereabouts' would be");
    let kubeconfig = cluster.admin_kubeconfig();
    let kubeconfig = kubeconfig.to_str().unwrap();
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let helm_on = |args: &[&str]| -> String {
        let mut all = args.to_vec();
        all.extend(["--kubeconfig", kubeconfig, "--namespace", NAMESPACE]);
        ok(run(&all), &args.join(" "))
    };
    helm_on(&["install", "thereabouts", chart]);
    assert_eq!(installer_env(&cluster, "INSTALL_AS_WHEREABOUTS").as_deref(), Some("false"));
    assert!(exists(&cluster, namespaced::<ServiceAccount>, "thereabouts") && exists(&cluster, namespaced::<ServiceAccount>, "thereabouts-controller"));
    let controller = get(&cluster, namespaced::<Deployment>, "thereabouts-controller").expect("the controller's Deployment");
    assert_eq!(controller.spec.unwrap().replicas, Some(2));
    assert!(!exists(&cluster, Api::<ClusterRole>::all, "thereabouts-pod-labels"), "pod-label RBAC is opt-in");

    // A policy given as a value lands, byte for byte, in the ConfigMap the installer reads.
    let policy = std::fs::read(thereabouts_e2e::built_policy("sticky-ordinal")).unwrap();
    let values = TempDir::new("policy-values");
    let values = values.path().join("values.json");
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(&policy);
    std::fs::write(&values, serde_json::json!({"policies": {"wasm": {"sticky-ordinal.wasm": encoded}}}).to_string()).unwrap();
    helm_on(&[
        "upgrade",
        "thereabouts",
        chart,
        "-f",
        values.to_str().unwrap(),
        "--set",
        "installer.installAsWhereabouts=true",
        "--set",
        "podLabelsRbac.enabled=true",
        "--set",
        "controller.enabled=false",
    ]);
    assert_eq!(installer_env(&cluster, "INSTALL_AS_WHEREABOUTS").as_deref(), Some("true"));
    assert!(exists(&cluster, Api::<ClusterRole>::all, "thereabouts-pod-labels"), "pod-label RBAC turned on");
    assert!(!exists(&cluster, namespaced::<Deployment>, "thereabouts-controller"), "the controller is gone with controller.enabled=false");
    let policies = get(&cluster, namespaced::<ConfigMap>, "thereabouts-policies").expect("the policies' ConfigMap");
    assert_eq!(policies.binary_data.unwrap()["sticky-ordinal.wasm"].0, policy);

    helm_on(&["uninstall", "thereabouts"]);
    assert!(!exists(&cluster, namespaced::<DaemonSet>, "thereabouts") && !exists(&cluster, namespaced::<ServiceAccount>, "thereabouts"));
    assert!(!exists(&cluster, Api::<ClusterRole>::all, "thereabouts-pod-labels"));
    assert!(!exists(&cluster, namespaced::<ConfigMap>, "thereabouts-policies"));
}

/// The installer container of `templates/daemonset.yaml` rendered with `values`.
fn rendered_installer(values: &serde_json::Value) -> k8s_openapi::api::core::v1::Container {
    let dir = TempDir::new("values");
    let file = dir.path().join("values.json");
    std::fs::write(&file, values.to_string()).unwrap();
    let chart = chart();
    let yaml = ok(run(&["template", "t", chart.to_str().unwrap(), "-f", file.to_str().unwrap(), "--show-only", "templates/daemonset.yaml"]), "helm template");
    let ds: DaemonSet = serde_yaml_ng::from_str(&yaml).unwrap();
    ds.spec.unwrap().template.spec.unwrap().containers.remove(0)
}

fn env_of(c: &k8s_openapi::api::core::v1::Container, name: &str) -> Option<String> {
    c.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.clone())
}

/// `install-cni.sh --once` on the scratch node `node` (its `sa/`, `bin/` and
/// `net.d/`), with `extra` environment on top; returns the CNI conf dir.
fn install_once(node: &TempDir, extra: &[(&str, &str)]) -> PathBuf {
    let (sa, bin, conf) = (node.sub("sa"), node.sub("bin"), node.sub("net.d"));
    std::fs::write(sa.join("token"), "token").unwrap();
    std::fs::write(sa.join("ca.crt"), "-----BEGIN CERTIFICATE-----\n").unwrap();
    let installed = Command::new("sh")
        .arg(deploy_dir().join("install-cni.sh"))
        .arg("--once")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("THEREABOUTS_BINARY", thereabouts_bin())
        .env("CNI_BIN_DIR", &bin)
        .env("CNI_CONF_DIR", &conf)
        .env("SERVICE_ACCOUNT_DIR", &sa)
        .env("POLICY_DIR", node.path().join("none"))
        .env("KUBERNETES_SERVICE_HOST", "192.0.2.1")
        .envs(extra.iter().copied())
        .output()
        .unwrap();
    assert!(installed.status.success(), "install-cni.sh --once: {}", text(&installed));
    conf
}

#[test]
fn the_default_flat_file_is_the_installers_own() {
    let node = TempDir::new("flat-default");
    let conf = install_once(&node, &[]);
    let own: serde_json::Value = serde_json::from_slice(&std::fs::read(conf.join("thereabouts.d/thereabouts.conf")).unwrap()).unwrap();
    let rendered = env_of(&rendered_installer(&serde_json::json!({})), "FLAT_FILE").unwrap();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&rendered).unwrap(), own);
}

/// flatFile values for etcd (hosts, the TLS Secret, the user in `settings`) reach
/// a node through the installer as the chart runs it, and an ADD through the
/// CNI protocol allocates in that etcd. The node's CNI conf dir is a scratch
/// dir here, so the rendered host paths are moved there.
#[test]
fn the_charts_etcd_settings_serve_an_add_through_the_installer() {
    let etcd = Etcd::start_secured().expect("starting a secured etcd");
    let access = etcd.access().clone();
    let ((ca, cert, key), (user, password)) = (access.tls.clone().unwrap(), access.user.clone().unwrap());
    let values = serde_json::json!({"flatFile": {
        "datastore": "etcd",
        "etcd": {"hosts": [access.endpoint], "tlsSecret": "etcd-client"},
        "settings": {"etcd_username": user, "etcd_password": password},
    }});
    let installer = rendered_installer(&values);
    let mount = env_of(&installer, "ETCD_TLS_DIR").expect("ETCD_TLS_DIR with a tlsSecret");
    assert!(installer.volume_mounts.iter().flatten().any(|m| m.mount_path == mount), "the Secret is mounted at ETCD_TLS_DIR");

    let node = TempDir::new("flat-etcd");
    let (conf, secret) = (node.sub("net.d"), node.sub("etcd-client"));
    for (from, to) in [(&ca, "ca.crt"), (&cert, "tls.crt"), (&key, "tls.key")] {
        std::fs::copy(from, secret.join(to)).unwrap();
    }
    let flat = env_of(&installer, "FLAT_FILE").unwrap().replace("/etc/cni/net.d", conf.to_str().unwrap());
    let (conf_dir, secret_dir) = (conf.to_str().unwrap(), secret.to_str().unwrap());
    install_once(&node, &[("HOST_CNI_CONF_DIR", conf_dir), ("FLAT_FILE", &flat), ("ETCD_TLS_DIR", secret_dir)]);

    let flat_file = conf.join("thereabouts.d/thereabouts.conf");
    let network = serde_json::json!({"cniVersion": "1.1.0", "name": "chart-etcd", "type": "thereabouts",
        "ipam": {"type": "thereabouts", "range": "192.0.2.0/29", "configuration_path": flat_file}});
    let added = Invocation::new(Call::pod("ADD", "cid-chart-etcd", "chart-etcd"), network.to_string()).run(&node.path().join("bin/thereabouts"));
    assert_eq!(added.expect_ok("ADD").ips(), ["192.0.2.1/29"]);
    let entries = etcd.pool_entries(PLUGIN_PREFIX, "192.0.2.0-29", "192.0.2.0/29").unwrap();
    assert_eq!(entries.keys().map(|a| a.to_string()).collect::<Vec<_>>(), ["192.0.2.1"]);
}

/// The object `name` as the admin reads it through the API `api` makes.
fn get<K>(cluster: &Cluster, api: fn(kube::Client) -> Api<K>, name: &str) -> Option<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    block_on(async { api(cluster.admin_client().await.unwrap()).get_opt(name).await.unwrap() })
}

fn namespaced<K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>>(client: kube::Client) -> Api<K> {
    Api::namespaced(client, NAMESPACE)
}

fn exists<K>(cluster: &Cluster, api: fn(kube::Client) -> Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    get(cluster, api, name).is_some()
}

/// The value of the installer container's environment variable `name`.
fn installer_env(cluster: &Cluster, name: &str) -> Option<String> {
    let ds = get(cluster, namespaced::<DaemonSet>, "thereabouts").expect("the installer DaemonSet");
    let container = &ds.spec?.template.spec?.containers[0];
    container.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.clone())
}

/// The alert expressions of the chart's PrometheusRule.
fn alert_expressions() -> Vec<String> {
    let chart = chart();
    let args = ["template", "t", chart.to_str().unwrap(), "--set", "metrics.prometheusRule.enabled=true", "--show-only", "templates/monitoring.yaml"];
    let rendered = ok(run(&args), "helm template (PrometheusRule)");
    let rule: serde_json::Value = serde_yaml_ng::from_str(rendered.trim_start_matches("---\n")).unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    rule["spec"]["groups"][0]["rules"].as_array().unwrap().iter().map(|r| r["expr"].as_str().unwrap().to_string()).collect()
}

/// A label matcher of a selector: (label, operator, value).
type Matcher = (String, String, String);

/// Every `metric{matchers}` (or bare `metric`) of `expr` named `thereabouts_*`.
/// Enough PromQL for the rules we write.
fn selectors(expr: &str) -> Vec<(String, Vec<Matcher>)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("thereabouts_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        let (name, after) = tail.split_at(end);
        let mut matchers = Vec::new();
        rest = after;
        if let Some(inner) = after.strip_prefix('{') {
            let close = inner.find('}').expect("a closed selector");
            for matcher in inner[..close].split(',').map(str::trim).filter(|m| !m.is_empty()) {
                let op = ["!=", "=~", "!~", "="].into_iter().find(|op| matcher.contains(op)).expect("a matcher operator");
                let (label, value) = matcher.split_once(op).unwrap();
                matchers.push((label.trim().to_string(), op.to_string(), value.trim().trim_matches('"').to_string()));
            }
            rest = &inner[close..];
        }
        out.push((name.to_string(), matchers));
    }
    out
}

/// The series of a Prometheus text page: (name, labels).
fn series(page: &str) -> Vec<(String, Vec<(String, String)>)> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let (head, _) = line.rsplit_once(' ').unwrap();
            match head.split_once('{') {
                None => (head.to_string(), Vec::new()),
                Some((name, labels)) => {
                    let labels = labels.trim_end_matches('}').split("\",").filter(|p| !p.is_empty());
                    let pairs = labels.map(|p| p.split_once("=\"").map(|(k, v)| (k.to_string(), v.trim_end_matches('"').to_string())).unwrap()).collect();
                    (name.to_string(), pairs)
                }
            }
        })
        .collect()
}

/// Spiderpool's alerts query metric names its code never exports; ours are
/// checked against a real controller's page: every selector of every alert
/// selects at least one series.
#[test]
fn every_alert_selects_series_a_running_controller_exports() {
    let expressions = alert_expressions();
    assert!(expressions.len() >= 3, "{expressions:?}");
    let cluster = Cluster::prepared().expect("a control plane");
    let kubeconfig = block_on(controller::install(&cluster)).unwrap();
    // One pod's addresses, so the pool metrics have a pool to report.
    let conf = kubernetes_conf("alerts", &cluster.plugin_kubeconfig(), None, &["192.0.2.0/28"]).to_string();
    Invocation::new(Call::pod("ADD", "cid-alerts", "alerts"), conf).run(&thereabouts_bin()).expect_ok("ADD");
    let tmp = TempDir::new("alerts");
    let running = Controller::run(&thereabouts_bin(), &kubeconfig, &Settings::default(), &tmp.path().join("controller.log")).unwrap();
    wait_until("the controller leads and reports the pool", std::time::Duration::from_secs(30), std::time::Duration::from_millis(200), || {
        running.scrape().is_ok_and(|page| page.contains("thereabouts_leader 1") && page.contains("thereabouts_pool_addresses{"))
    });
    let page = series(&running.scrape().unwrap());
    for expr in &expressions {
        for (name, matchers) in selectors(expr) {
            let selected = page.iter().filter(|(n, _)| *n == name).filter(|(_, labels)| {
                matchers.iter().all(|(label, op, value)| {
                    let have = labels.iter().find(|(k, _)| k == label).map_or("", |(_, v)| v.as_str());
                    match op.as_str() {
                        "=" => have == value,
                        "!=" => have != value,
                        other => panic!("{other}: no regex matchers in our rules"),
                    }
                })
            });
            assert!(selected.count() > 0, "{name}{matchers:?} of `{expr}` selects nothing the controller exports");
        }
    }
}

/// A distribution registry (Debian's docker-registry) on a loopback port,
/// stopped by its PID when dropped.
struct Registry {
    child: std::process::Child,
    port: u16,
    _dir: TempDir,
}

impl Registry {
    fn start() -> Registry {
        let dir = TempDir::new("registry");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config = dir.path().join("config.yml");
        let storage = dir.sub("storage");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog: {{level: error}}\nstorage: {{filesystem: {{rootdirectory: {}}}}}\nhttp: {{addr: 127.0.0.1:{port}}}\n",
                storage.display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("docker-registry (tests/k8s.sh installs it)");
        wait_until("the registry answers", std::time::Duration::from_secs(20), std::time::Duration::from_millis(100), || {
            controller::http_get(port, "/v2/").is_ok_and(|body| body.trim() == "{}")
        });
        Registry { child, port, _dir: dir }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sha256(path: &Path) -> String {
    let out = ok(Command::new("sha256sum").arg(path).output().unwrap(), "sha256sum");
    out.split_whitespace().next().unwrap().to_string()
}

/// `Digest: sha256:…` of a `helm push`.
fn pushed_digest(output: &Output) -> String {
    let text = text(output);
    text.lines().find_map(|l| l.strip_prefix("Digest: ")).unwrap_or_else(|| panic!("no digest in: {text}")).trim().to_string()
}

#[test]
fn the_chart_and_the_image_are_reproducible_and_keep_their_digests_through_a_registry() {
    let root = deploy_dir().join("..");
    let package = |out: &Path| -> PathBuf {
        let built = Command::new("bash").arg(root.join("scripts/package-chart.sh")).arg(out).env("HELM", helm()).output().unwrap();
        PathBuf::from(ok(built, "package-chart.sh").trim())
    };
    let (a, b) = (TempDir::new("chart-a"), TempDir::new("chart-b"));
    let (first, second) = (package(a.path()), package(b.path()));
    assert_eq!(sha256(&first), sha256(&second), "two packages of the same sources");

    let registry = Registry::start();
    let repository = format!("oci://{}/charts", registry.host());
    let push = |pkg: &Path| run(&["push", pkg.to_str().unwrap(), &repository, "--plain-http"]);
    let (pushed, again) = (push(&first), push(&second));
    assert!(pushed.status.success() && again.status.success(), "{}{}", text(&pushed), text(&again));
    assert_eq!(pushed_digest(&pushed), pushed_digest(&again), "the same package pushed twice, the same manifest");
    let pulled = TempDir::new("chart-pulled");
    let version = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap().lines().find_map(|l| l.strip_prefix("version: ").map(str::to_string)).unwrap();
    let reference = format!("{repository}/thereabouts");
    ok(run(&["pull", &reference, "--version", &version, "--plain-http", "--destination", pulled.path().to_str().unwrap()]), "helm pull");
    assert_eq!(sha256(&pulled.path().join(format!("thereabouts-{version}.tgz"))), sha256(&first), "pulled back byte for byte");

    // The image: the digest the build printed is the one the registry serves.
    let image = TempDir::new("image");
    let built = Command::new("bash").arg(root.join("scripts/build-image.sh")).env("IMAGE_DIR", image.path()).env("SKIP_PLUGIN_BUILD", "1").output().unwrap();
    let digest = ok(built, "build-image.sh").trim().to_string();
    let source = format!("oci:{}:{version}", image.path().join("oci").display());
    let destination = format!("docker://{}/thereabouts/thereabouts:{version}", registry.host());
    ok(Command::new("skopeo").args(["copy", "--dest-tls-verify=false", &source, &destination]).output().unwrap(), "skopeo copy");
    let inspected = ok(Command::new("skopeo").args(["inspect", "--tls-verify=false", &destination]).output().unwrap(), "skopeo inspect");
    let served: serde_json::Value = serde_json::from_str(&inspected).unwrap();
    assert_eq!(served["Digest"], digest.as_str(), "the registry serves the image under the digest it was built with");
    println!("registry round trip: chart {} (sha256 {}), image {digest}", first.display(), sha256(&first));
}

/// chart-testing's lint: Chart.yaml against its schema, yamllint on Chart.yaml
/// and values.yaml, `helm lint` once per ci/*-values.yaml.
fn ct_lint(chart_dir: &Path) -> Output {
    let tools = tools();
    let path = format!("{}:{}:{}", tools.display(), tools.join("py-bin").display(), std::env::var("PATH").unwrap_or_default());
    Command::new(tools.join("ct"))
        .args(["lint", "--validate-maintainers=false", "--check-version-increment=false", "--charts"])
        .arg(chart_dir)
        .arg("--chart-yaml-schema")
        .arg(tools.join("ct-etc/chart_schema.yaml"))
        .arg("--lint-conf")
        .arg(tools.join("ct-etc/lintconf.yaml"))
        .env("PATH", path)
        .output()
        .unwrap()
}

#[test]
fn ct_lint_passes_with_every_ci_values_file_and_names_a_yaml_error() {
    let linted = ct_lint(&chart());
    assert!(linted.status.success(), "ct lint: {}", text(&linted));
    for entry in std::fs::read_dir(chart().join("ci")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(text(&linted).contains(&format!("ci/{name}")), "ct lint did not render {name}: {}", text(&linted));
    }
    // A copy of the chart whose values.yaml has a key twice.
    let copy = TempDir::new("ct-chart");
    let dir = copy.path().join("thereabouts");
    let copied = Command::new("cp").arg("-rL").arg(chart()).arg(&dir).output().unwrap();
    assert!(copied.status.success());
    let values = std::fs::read_to_string(dir.join("values.yaml")).unwrap();
    std::fs::write(dir.join("values.yaml"), format!("{values}\npodLabelsRbac:\n  enabled: true\n")).unwrap();
    let refused = ct_lint(&dir);
    assert!(!refused.status.success());
    assert!(text(&refused).contains("duplication of key \"podLabelsRbac\""), "{}", text(&refused));
}

/// kubeconform, strict, offline: Kubernetes' schemas of the apiserver's minor
/// version and this project's CRDs (converted into `crds`).
fn kubeconform(crds: &Path, files: &[PathBuf]) -> Output {
    let tools = tools();
    let kubernetes = format!(
        "{}/{{{{.NormalizedKubernetesVersion}}}}-local{{{{.StrictSuffix}}}}/{{{{.ResourceKind}}}}{{{{.KindSuffix}}}}.json",
        tools.join("schemas").display()
    );
    let ours = format!("{}/{{{{.Group}}}}_{{{{.ResourceKind}}}}_{{{{.ResourceAPIVersion}}}}.json", crds.display());
    Command::new(tools.join("kubeconform"))
        .args(["-strict", "-summary", "-kubernetes-version", "1.36.0", "-schema-location", &kubernetes, "-schema-location", &ours])
        .args(files)
        .output()
        .unwrap()
}

#[test]
fn kubeconform_accepts_every_rendering_offline_and_names_a_misspelt_field() {
    let root = deploy_dir().join("..");
    let crds = TempDir::new("crd-schemas");
    let mut convert = Command::new(tools().join("venv/bin/python"));
    convert.arg(root.join("tests/k8s-bins/crd-schemas.py")).arg(crds.path());
    for entry in std::fs::read_dir(deploy_dir().join("crds")).unwrap().flatten() {
        convert.arg(entry.path());
    }
    ok(convert.output().unwrap(), "crd-schemas.py");

    let work = TempDir::new("kubeconform");
    let chart = chart();
    let render = |name: &str, flags: &[&str]| -> PathBuf {
        let mut args = vec!["template", "thereabouts", chart.to_str().unwrap(), "--namespace", "kube-system"];
        args.extend(flags);
        let path = work.path().join(name);
        std::fs::write(&path, ok(run(&args), name)).unwrap();
        path
    };
    let ci = |name: &str| chart.join("ci").join(name).to_str().unwrap().to_string();
    // ct lint's ci/ values (not monitoring-values.yaml: no schemas of the
    // Prometheus Operator's kinds here).
    let (whereabouts, etcd) = (ci("whereabouts-values.yaml"), ci("etcd-values.yaml"));
    let mut files = vec![
        render("defaults.yaml", &[]),
        render("whereabouts.yaml", &["-f", &whereabouts]),
        render("etcd.yaml", &["-f", &etcd]),
        render("minimal.yaml", &["--set", "controller.enabled=false", "--set", "flowControl.enabled=false", "--set", "admissionPolicies.enabled=false"]),
    ];
    let mut deploy: Vec<PathBuf> =
        std::fs::read_dir(deploy_dir()).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "yaml")).collect();
    deploy.extend(std::fs::read_dir(deploy_dir().join("crds")).unwrap().flatten().map(|e| e.path()));
    deploy.sort();
    files.extend(deploy);
    let objects = work.path().join("objects.yaml");
    std::fs::write(
        &objects,
        "apiVersion: whereabouts.cni.cncf.io/v1alpha1\nkind: IPPool\nmetadata: {name: 192.0.2.0-24, namespace: kube-system}\n\
         spec: {range: 192.0.2.0/24, allocations: {\"1\": {id: c1, podref: default/p, ifname: eth0}}}\n---\n\
         apiVersion: whereabouts.cni.cncf.io/v1alpha1\nkind: NodeSlicePool\nmetadata: {name: net, namespace: kube-system}\n\
         spec: {range: 192.0.2.0/24, sliceSize: /28}\n",
    )
    .unwrap();
    files.push(objects);
    let checked = kubeconform(crds.path(), &files);
    let summary = ok(checked, "kubeconform");
    assert!(summary.contains("Invalid: 0, Errors: 0, Skipped: 0"), "{summary}");
    println!("kubeconform: {}", summary.trim());

    // A misspelt field is named, in a built-in kind and in ours.
    let typos = work.path().join("typos.yaml");
    let daemonset = std::fs::read_to_string(deploy_dir().join("daemonset.yaml")).unwrap().replace("hostNetwork:", "hostNetwrk:");
    std::fs::write(&typos, format!("{daemonset}\n---\napiVersion: whereabouts.cni.cncf.io/v1alpha1\nkind: IPPool\nmetadata: {{name: p}}\nspec: {{rnage: 192.0.2.0/24, allocations: {{}}}}\n")).unwrap();
    let refused = kubeconform(crds.path(), &[typos]);
    assert!(!refused.status.success());
    let report = text(&refused);
    assert!(report.contains("hostNetwrk") && report.contains("rnage"), "{report}");
}
