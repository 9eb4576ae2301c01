//! The DaemonSet's installer (`deploy/install-cni.sh`) run against scratch
//! directories standing in for the host's CNI dirs and the pod's ServiceAccount
//! mount: what it installs (binary, flat file, kubeconfig), with which modes, how
//! it writes (rename, never in place; unchanged files untouched), the IPv6 address
//! form, the `whereabouts` switch, the token-rotation loop and SIGTERM, and the
//! errors that must leave the installed files alone; the optional policy step
//! (each `*.wasm` compiled into a root-owned cache, content-addressed, then
//! installed, and the installed plugin running it through the CNI protocol).
//! Also shellcheck, when present.
//! (The kubeconfig against a real apiserver: tests/k8s-harness/tests/rbac.rs.)

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use thereabouts_e2e::{Call, Invocation, TempDir, built_policy, thereabouts_bin, thereabouts_conf, workspace_root};

const TOKEN: &str = "eyJhbGciOiJSUzI1NiIsImtpZCI6IngifQ.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJl-_x";
const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIBADAKBggqhkjOPQQDAjAAMB4XDTI2MDEwMTAwMDAwMFoX\n-----END CERTIFICATE-----\n";

fn script() -> PathBuf {
    workspace_root().join("deploy/install-cni.sh")
}

/// Scratch host (`bin/`, `net.d/`) and ServiceAccount mount (`sa/`).
struct Node {
    dir: TempDir,
    plugin: PathBuf,
}

impl Node {
    fn new(tag: &str) -> Node {
        Self::with_plugin(tag, &thereabouts_bin())
    }

    fn with_plugin(tag: &str, plugin: &Path) -> Node {
        let dir = TempDir::new(tag);
        let sa = dir.sub("sa");
        std::fs::write(sa.join("token"), format!("{TOKEN}\n")).unwrap();
        std::fs::write(sa.join("ca.crt"), CA).unwrap();
        std::fs::write(sa.join("namespace"), "cni-system").unwrap();
        dir.sub("bin");
        dir.sub("net.d");
        dir.sub("host");
        Node { dir, plugin: plugin.to_path_buf() }
    }

    fn bin(&self) -> PathBuf {
        self.dir.path().join("bin")
    }
    fn conf(&self) -> PathBuf {
        self.dir.path().join("net.d")
    }
    fn sa(&self) -> PathBuf {
        self.dir.path().join("sa")
    }
    fn kubeconfig(&self) -> PathBuf {
        self.conf().join("thereabouts.d/thereabouts.kubeconfig")
    }
    fn flat_file(&self) -> PathBuf {
        self.conf().join("thereabouts.d/thereabouts.conf")
    }
    /// The host's policy cache, as mounted (created by the installer).
    fn cache(&self) -> PathBuf {
        self.dir.path().join("host/var/lib/thereabouts/policies")
    }

    /// The script with every path pointed into the scratch dir; `extra` env on top.
    fn command(&self, args: &[&str], extra: &[(&str, &str)]) -> Command {
        let mut c = Command::new("sh");
        c.arg(script())
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("THEREABOUTS_BINARY", &self.plugin)
            .env("CNI_BIN_DIR", self.bin())
            .env("CNI_CONF_DIR", self.conf())
            .env("HOST_CNI_CONF_DIR", "/etc/cni/net.d")
            .env("SERVICE_ACCOUNT_DIR", self.sa())
            .env("KUBERNETES_SERVICE_HOST", "192.0.2.1")
            .env("KUBERNETES_SERVICE_PORT", "443")
            // No policies unless a test gives some; never the real host paths.
            .env("POLICY_DIR", self.dir.path().join("no-policies"))
            .env("POLICY_CACHE_DIR", self.cache())
            .stdin(Stdio::null());
        for (k, v) in extra {
            c.env(k, v);
        }
        c
    }

    fn run(&self, args: &[&str], extra: &[(&str, &str)]) -> Output {
        self.command(args, extra).output().expect("running sh")
    }

    #[track_caller]
    fn once(&self, extra: &[(&str, &str)]) -> String {
        let out = self.run(&["--once"], extra);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "install-cni.sh --once failed ({}): {stderr}", out.status);
        stderr
    }

    fn kubeconfig_yaml(&self) -> Value {
        let text = std::fs::read_to_string(self.kubeconfig()).unwrap();
        serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("kubeconfig is not YAML: {e}\n{text}"))
    }

    fn server(&self) -> String {
        self.kubeconfig_yaml()["clusters"][0]["cluster"]["server"].as_str().unwrap().to_string()
    }

    /// Files whose name starts with '.' (temporary files) anywhere in the host dirs.
    fn leftovers(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if e.file_name().to_string_lossy().starts_with('.') {
                    out.push(p.clone());
                }
                if p.is_dir() {
                    walk(&p, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.bin(), &mut out);
        walk(&self.conf(), &mut out);
        walk(&self.dir.path().join("host"), &mut out);
        out
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o7777
}

fn inode(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().ino()
}

#[test]
fn installs_binary_flat_file_and_kubeconfig() {
    let node = Node::new("installer");
    std::fs::write(node.bin().join("bridge"), "another plugin").unwrap();
    node.once(&[]);

    // The binary: same bytes, executable, and it still answers as a CNI plugin.
    let installed = node.bin().join("thereabouts");
    assert_eq!(std::fs::read(&installed).unwrap(), std::fs::read(&node.plugin).unwrap());
    assert_eq!(mode(&installed), 0o755);
    let out = Command::new(&installed).env_clear().env("CNI_COMMAND", "VERSION").stdin(Stdio::null()).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).expect("VERSION answers JSON");
    assert!(v["supportedVersions"].is_array(), "{v}");
    assert!(!node.bin().join("whereabouts").exists(), "no whereabouts without the switch");
    assert_eq!(std::fs::read_to_string(node.bin().join("bridge")).unwrap(), "another plugin");

    // The flat file: the Kubernetes datastore, and the kubeconfig's path as the
    // plugin sees it on the host (HOST_CNI_CONF_DIR), not as mounted here.
    let flat: Value = serde_json::from_str(&std::fs::read_to_string(node.flat_file()).unwrap()).expect("the flat file is JSON");
    assert_eq!(
        flat,
        json!({
            "datastore": "kubernetes",
            "configuration_path": "/etc/cni/net.d/thereabouts.d",
            "kubernetes": {"kubeconfig": "/etc/cni/net.d/thereabouts.d/thereabouts.kubeconfig"}
        })
    );
    assert_eq!(mode(&node.flat_file()), 0o644);

    // The kubeconfig: the token, the CA, the apiserver, the namespace file's namespace.
    assert_eq!(mode(&node.kubeconfig()), 0o600, "it holds the token");
    let kc = node.kubeconfig_yaml();
    assert_eq!(kc["apiVersion"], "v1");
    assert_eq!(kc["kind"], "Config");
    let ctx_name = kc["current-context"].as_str().expect("current-context");
    let ctx = kc["contexts"].as_array().unwrap().iter().find(|c| c["name"] == ctx_name).expect("the current context exists")["context"].clone();
    assert_eq!(ctx["namespace"], "cni-system");
    let user = kc["users"].as_array().unwrap().iter().find(|u| u["name"] == ctx["user"]).expect("the context's user exists");
    assert_eq!(user["user"]["token"], TOKEN, "token without its newline");
    let cluster = kc["clusters"].as_array().unwrap().iter().find(|c| c["name"] == ctx["cluster"]).expect("the context's cluster exists");
    assert_eq!(cluster["cluster"]["server"], "https://192.0.2.1:443");
    let ca = base64::engine::general_purpose::STANDARD.decode(cluster["cluster"]["certificate-authority-data"].as_str().unwrap()).expect("CA data is base64");
    assert_eq!(ca, CA.as_bytes());

    assert_eq!(node.leftovers(), Vec::<PathBuf>::new(), "temporary files left");
}

#[test]
fn ipv6_apiserver_address_is_bracketed() {
    let node = Node::new("installer-v6");
    node.once(&[("KUBERNETES_SERVICE_HOST", "2001:db8:10:96::1"), ("KUBERNETES_SERVICE_PORT", "6443")]);
    assert_eq!(node.server(), "https://[2001:db8:10:96::1]:6443");
    // Already bracketed: kept as it is.
    node.once(&[("KUBERNETES_SERVICE_HOST", "[2001:db8::1]")]);
    assert_eq!(node.server(), "https://[2001:db8::1]:443");
    // Names and IPv4 addresses get none.
    node.once(&[("KUBERNETES_SERVICE_HOST", "api.cluster.example")]);
    assert_eq!(node.server(), "https://api.cluster.example:443");
    // THEREABOUTS_NAMESPACE (the DaemonSet's fieldRef) wins over the namespace file;
    // without either, kube-system.
    node.once(&[("THEREABOUTS_NAMESPACE", "kube-system")]);
    let ns = |n: &Node| n.kubeconfig_yaml()["contexts"][0]["context"]["namespace"].clone();
    assert_eq!(ns(&node), "kube-system");
    std::fs::remove_file(node.sa().join("namespace")).unwrap();
    node.once(&[]);
    assert_eq!(ns(&node), "kube-system");
}

#[test]
fn whereabouts_switch_installs_both_names() {
    let node = Node::new("installer-wb");
    // A stale whereabouts installation: its kubeconfig is not ours to touch.
    let wb = node.conf().join("whereabouts.d");
    std::fs::create_dir_all(&wb).unwrap();
    std::fs::write(
        wb.join("whereabouts.conf"),
        r#"{"datastore":"kubernetes","kubernetes":{"kubeconfig":"/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"}}"#,
    )
    .unwrap();
    std::fs::write(wb.join("whereabouts.kubeconfig"), "old").unwrap();
    node.once(&[("INSTALL_AS_WHEREABOUTS", "true")]);

    let plugin = std::fs::read(&node.plugin).unwrap();
    for name in ["thereabouts", "whereabouts"] {
        let p = node.bin().join(name);
        assert_eq!(std::fs::read(&p).unwrap(), plugin, "{name}");
        assert_eq!(mode(&p), 0o755, "{name}");
    }
    // whereabouts' flat-file path is searched first: it now points at our kubeconfig.
    assert_eq!(std::fs::read(wb.join("whereabouts.conf")).unwrap(), std::fs::read(node.flat_file()).unwrap());
    assert_eq!(std::fs::read_to_string(wb.join("whereabouts.kubeconfig")).unwrap(), "old");

    let out = node.run(&["--once"], &[("INSTALL_AS_WHEREABOUTS", "perhaps")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("INSTALL_AS_WHEREABOUTS"));
}

#[test]
fn rerun_replaces_by_rename_and_leaves_equal_files_alone() {
    let work = TempDir::new("installer-src");
    let v1 = work.path().join("plugin");
    std::fs::write(&v1, "#!/bin/sh\necho v1\n").unwrap();
    let node = Node::with_plugin("installer-rerun", &v1);
    node.once(&[]);
    let files = [node.bin().join("thereabouts"), node.flat_file(), node.kubeconfig()];
    let before: Vec<u64> = files.iter().map(|f| inode(f)).collect();

    // Nothing changed: nothing is rewritten (same inodes, nothing logged as written).
    let log = node.once(&[]);
    assert!(!log.contains("wrote"), "{log}");
    assert_eq!(files.iter().map(|f| inode(f)).collect::<Vec<_>>(), before);

    // A wrong mode is corrected even when the content is right.
    std::fs::set_permissions(node.kubeconfig(), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(node.bin().join("thereabouts"), std::fs::Permissions::from_mode(0o600)).unwrap();
    node.once(&[]);
    assert_eq!(mode(&node.kubeconfig()), 0o600);
    assert_eq!(mode(&node.bin().join("thereabouts")), 0o755);

    // A new binary and a new token: new files renamed into place (new inodes), so
    // a plugin running the old binary or reading the old kubeconfig is unaffected.
    let old_binary = std::fs::File::open(node.bin().join("thereabouts")).unwrap();
    std::fs::write(&v1, "#!/bin/sh\necho v2\n").unwrap();
    std::fs::write(node.sa().join("token"), "rotated.token").unwrap();
    let log = node.once(&[]);
    assert!(log.contains("thereabouts.kubeconfig") && log.contains("bin/thereabouts"), "{log}");
    assert_ne!(inode(&files[0]), before[0], "binary replaced in place");
    assert_ne!(inode(&files[2]), before[2], "kubeconfig replaced in place");
    assert_eq!(inode(&files[1]), before[1], "unchanged flat file rewritten");
    assert_eq!(old_binary.metadata().unwrap().ino(), before[0]);
    assert_eq!(std::fs::read_to_string(node.bin().join("thereabouts")).unwrap(), "#!/bin/sh\necho v2\n");
    assert_eq!(node.kubeconfig_yaml()["users"][0]["user"]["token"], "rotated.token");
    assert_eq!(mode(&node.kubeconfig()), 0o600);
    assert_eq!(node.leftovers(), Vec::<PathBuf>::new(), "temporary files left");
}

#[test]
fn errors_exit_1_and_leave_installed_files_alone() {
    let node = Node::new("installer-err");
    node.once(&[]);
    let kubeconfig = std::fs::read(node.kubeconfig()).unwrap();

    let fails = |extra: &[(&str, &str)], args: &[&str], needle: &str| {
        let out = node.run(args, extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?} {args:?}: {stderr}");
        assert!(stderr.contains(needle), "{extra:?}: expected {needle:?} in {stderr}");
        assert_eq!(std::fs::read(node.kubeconfig()).unwrap(), kubeconfig, "{extra:?} changed the kubeconfig");
        assert_eq!(node.leftovers(), Vec::<PathBuf>::new(), "{extra:?}: temporary files left");
    };
    fails(&[("KUBERNETES_SERVICE_HOST", "")], &["--once"], "KUBERNETES_SERVICE_HOST is not set");
    fails(&[("KUBERNETES_SERVICE_HOST", "a\"b")], &["--once"], "not a host name");
    fails(&[("KUBERNETES_SERVICE_HOST", "fe80::1%eth0")], &["--once"], "not a host name");
    fails(&[("KUBERNETES_SERVICE_PORT", "https")], &["--once"], "not a port");
    fails(&[("THEREABOUTS_NAMESPACE", "Kube_System")], &["--once"], "not a valid namespace");
    fails(&[("THEREABOUTS_BINARY", "/nonexistent")], &["--once"], "not found");
    fails(&[("CNI_BIN_DIR", "/nonexistent-thab")], &["--once"], "is not a directory");
    fails(&[("HOST_CNI_CONF_DIR", "/etc/\"cni")], &["--once"], "quote");
    fails(&[("RESYNC_SECONDS", "0")], &[], "RESYNC_SECONDS");
    fails(&[], &["--forever"], "usage");

    std::fs::write(node.sa().join("token"), "abc\"\ndef").unwrap();
    fails(&[], &["--once"], "unexpected characters");
    std::fs::write(node.sa().join("token"), "").unwrap();
    fails(&[], &["--once"], "is empty");
    std::fs::remove_file(node.sa().join("token")).unwrap();
    fails(&[], &["--once"], "no ServiceAccount token");
    std::fs::write(node.sa().join("token"), TOKEN).unwrap();
    std::fs::write(node.sa().join("ca.crt"), "not a certificate").unwrap();
    fails(&[], &["--once"], "no PEM certificate");

    // On a fresh node, a missing token installs no kubeconfig at all.
    let fresh = Node::new("installer-err2");
    std::fs::remove_file(fresh.sa().join("token")).unwrap();
    let out = fresh.run(&["--once"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!fresh.kubeconfig().exists());
}

#[test]
fn a_flat_file_the_plugin_refuses_installs_nothing() {
    let node = Node::new("installer-flat-bad");
    let out = node.run(&["--once"], &[("FLAT_FILE", r#"{"datastore":"kubernetes","log_level":7}"#)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("refuses FLAT_FILE: ipam.log_level: expected a string"), "{stderr}");
    assert!(!node.bin().join("thereabouts").exists() && !node.flat_file().exists());
    assert_eq!(node.leftovers(), Vec::<PathBuf>::new());
    let out = node.run(&["--once"], &[("FLAT_FILE", "datastore=etcd")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a JSON object"));
}

#[test]
fn a_given_flat_file_and_etcd_certificates_are_installed() {
    let node = Node::new("installer-flat-etcd");
    let tls = node.dir.sub("etcd-tls");
    std::fs::write(tls.join("ca.crt"), CA).unwrap();
    std::fs::write(tls.join("tls.key"), "key").unwrap();
    let flat = r#"{"datastore":"etcd","etcd_host":"https://192.0.2.1:2379","etcd_key_file":"/etc/cni/net.d/thereabouts.d/etcd/tls.key"}"#;
    node.once(&[("FLAT_FILE", flat), ("ETCD_TLS_DIR", tls.to_str().unwrap())]);
    assert_eq!(std::fs::read_to_string(node.flat_file()).unwrap(), format!("{flat}\n"));
    let etcd = node.conf().join("thereabouts.d/etcd");
    assert_eq!((mode(&etcd), mode(&etcd.join("tls.key")), mode(&etcd.join("ca.crt"))), (0o700, 0o600, 0o600));
    assert_eq!(std::fs::read_to_string(etcd.join("ca.crt")).unwrap(), CA);
    assert!(!etcd.join("tls.crt").exists(), "only the certificates present are copied");
}

#[test]
fn the_node_name_is_written_where_the_plugin_looks_for_it() {
    let node = Node::new("installer-nodename");
    node.once(&[("NODENAME", "worker-1.example")]);
    assert_eq!(std::fs::read_to_string(node.conf().join("thereabouts.d/nodename")).unwrap(), "worker-1.example\n");
    let out = node.run(&["--once"], &[("NODENAME", "Worker_1")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a Node name"));
}

#[test]
fn loop_follows_token_rotation_and_stops_on_sigterm() {
    let node = Node::new("installer-loop");
    let mut child = node.command(&[], &[("RESYNC_SECONDS", "1")]).stderr(Stdio::piped()).spawn().unwrap();
    let wait_for = |what: &str, ok: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ok() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let token_is = |t: &str| std::fs::read_to_string(node.kubeconfig()).is_ok_and(|k| k.contains(&format!("token: \"{t}\"")));
    wait_for("the first install", &|| token_is(TOKEN));

    // The kubelet rotates the token (atomically, like its projected volumes).
    let tmp = node.sa().join("..token.new");
    std::fs::write(&tmp, "second.token").unwrap();
    std::fs::rename(&tmp, node.sa().join("token")).unwrap();
    wait_for("the rotated token", &|| token_is("second.token"));
    assert_eq!(mode(&node.kubeconfig()), 0o600);

    // Files removed on the host come back.
    std::fs::remove_file(node.flat_file()).unwrap();
    std::fs::remove_file(node.bin().join("thereabouts")).unwrap();
    wait_for("the reinstall", &|| node.flat_file().exists() && node.bin().join("thereabouts").exists());

    // A failed check is logged and retried, not fatal.
    std::fs::remove_file(node.sa().join("token")).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(child.try_wait().unwrap().is_none(), "the loop died on a missing token");
    std::fs::write(node.sa().join("token"), "third.token").unwrap();
    wait_for("the third token", &|| token_is("third.token"));

    // SIGTERM: exits 0 at once, not after the sleep.
    let t0 = Instant::now();
    let kill = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("check failed; retrying"), "{log}");
    assert!(log.contains("stopping"), "{log}");
    assert_eq!(node.leftovers(), Vec::<PathBuf>::new(), "temporary files left");
}

#[test]
fn shellcheck_is_clean() {
    let out = Command::new("shellcheck").args(["-s", "sh"]).arg(script()).output().expect("shellcheck (tests/host-e2e.sh installs it)");
    assert!(out.status.success(), "shellcheck:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// The policy compiler the image ships beside the plugin (scripts/build-plugin.sh).
fn policy_compiler() -> PathBuf {
    let compiler = thereabouts_bin().with_file_name("thereabouts-policy-compiler");
    assert!(compiler.is_file(), "{} not found: run `bash scripts/build-plugin.sh`", compiler.display());
    compiler
}

fn sha256_hex(file: &Path) -> String {
    let out = Command::new("sha256sum").arg(file).output().expect("sha256sum");
    String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap().to_string()
}

/// The artifacts of a policy cache by name (the plugin's ADDs also leave
/// their records there, in `by-file/` and `settings/`).
fn artifacts_in(cache: &Path) -> Vec<String> {
    names_in(cache).into_iter().filter(|n| n.ends_with(".cwasm")).collect()
}

/// Every file of `dir` by name.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn policies_are_compiled_into_the_hosts_cache_and_the_installed_plugin_runs_them() {
    let node = Node::new("installer-policies");
    let source = node.dir.sub("policies");
    std::fs::copy(built_policy("sticky-ordinal"), source.join("sticky-ordinal.wasm")).unwrap();
    std::fs::write(source.join("README"), "not a policy: ignored").unwrap();
    let compiler = policy_compiler();
    let conf_dir = node.conf();
    // The host paths as the plugin sees them are the mounted ones here.
    let env = [("POLICY_DIR", source.to_str().unwrap()), ("POLICY_COMPILER", compiler.to_str().unwrap()), ("HOST_CNI_CONF_DIR", conf_dir.to_str().unwrap())];
    let log = node.once(&env);
    let policies = node.conf().join("thereabouts.d/policies");
    let installed = policies.join("sticky-ordinal.wasm");
    assert_eq!(std::fs::read(&installed).unwrap(), std::fs::read(built_policy("sticky-ordinal")).unwrap());
    assert_eq!(names_in(&policies), ["sticky-ordinal.wasm"], "only *.wasm");

    // The artifact: named by the .wasm's SHA-256 and the plugin's compatibility
    // key, root-owned like everything above it, 0644 in a 0755 cache.
    let key = String::from_utf8(Command::new(&compiler).arg("compat-key").output().unwrap().stdout).unwrap().trim().to_string();
    let artifact_name = format!("{}-{key}.cwasm", sha256_hex(&installed));
    let artifact = node.cache().join(&artifact_name);
    assert_eq!(artifacts_in(&node.cache()), std::slice::from_ref(&artifact_name));
    assert!(log.contains("compiled") && log.contains(&artifact_name), "{log}");
    let me = std::fs::metadata("/proc/self").unwrap().uid();
    for (file, want) in
        [(&artifact, 0o644), (&installed, 0o644), (&node.cache(), 0o755), (&policies, 0o755), (&node.cache().parent().unwrap().to_path_buf(), 0o755)]
    {
        assert_eq!(mode(file), want, "{}", file.display());
        assert_eq!(std::fs::metadata(file).unwrap().uid(), me, "{}", file.display());
    }

    // The plugin as installed, the network config naming the installed file,
    // the cache where the installer put it: an ADD through the CNI protocol,
    // with the policy's answer (first address + base + ordinal).
    let data = node.dir.sub("pools");
    let mut conf = thereabouts_conf("1.0.0", "sticky", &data, None, &["192.0.2.0/24"]);
    conf["ipam"]["policies"] = json!([{"name": "sticky", "path": installed, "settings": {"base": 10}}]);
    let add = |pod: &str, cid: &str| {
        let mut call = Call::pod("ADD", cid, pod);
        call.ifname = "net1".into();
        let out = Invocation::new(call, conf.to_string()).env("THEREABOUTS_POLICY_CACHE", node.cache().to_str().unwrap()).run(&node.bin().join("thereabouts"));
        out.expect_ok(&format!("ADD {pod} with the installed policy"));
        out.ips()
    };
    assert_eq!(add("filler", "c0"), ["192.0.2.1/24"], "no ordinal: the built-in choice");
    assert_eq!(add("web-2", "c1"), ["192.0.2.13/24"], "the policy's choice");

    // Again: the work is done, nothing is compiled or rewritten.
    let inodes = (inode(&installed), inode(&artifact));
    let log = node.once(&env);
    assert!(!log.contains("compiled") && !log.contains("wrote"), "{log}");
    assert_eq!((inode(&installed), inode(&artifact)), inodes);
    // Wrong modes are repaired, like the other files'.
    std::fs::set_permissions(&artifact, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(node.cache(), std::fs::Permissions::from_mode(0o700)).unwrap();
    node.once(&env);
    assert_eq!((mode(&artifact), mode(&node.cache())), (0o644, 0o755));

    // A second policy is compiled; a copy of it under another name is only
    // installed (content-addressed: its artifact exists already).
    std::fs::copy(built_policy("keep-addresses"), source.join("keep.wasm")).unwrap();
    let log = node.once(&env);
    assert_eq!(log.matches("compiled").count(), 1, "{log}");
    assert!(log.contains("keep.wasm"), "{log}");
    std::fs::copy(built_policy("keep-addresses"), source.join("keep-copy.wasm")).unwrap();
    let log = node.once(&env);
    assert!(!log.contains("compiled") && log.contains("keep-copy.wasm"), "{log}");
    assert_eq!(artifacts_in(&node.cache()).len(), 2, "{:?}", names_in(&node.cache()));
    assert_eq!(names_in(&policies), ["keep-copy.wasm", "keep.wasm", "sticky-ordinal.wasm"]);

    // A file that is no policy: exit 1 naming it, nothing of it installed or
    // cached, no temporary file left, the rest as it was.
    std::fs::write(source.join("broken.wasm"), "not WebAssembly").unwrap();
    let out = node.run(&["--once"], &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("broken.wasm") && stderr.contains("could not compile"), "{stderr}");
    assert!(!policies.join("broken.wasm").exists());
    assert_eq!(artifacts_in(&node.cache()).len(), 2);
    assert_eq!(node.leftovers(), Vec::<PathBuf>::new(), "temporary files left");
    std::fs::remove_file(source.join("broken.wasm")).unwrap();

    // Policies but no compiler: a clear error.
    std::fs::remove_file(&installed).unwrap();
    let out = node.run(&["--once"], &[env[0], ("POLICY_COMPILER", "/nonexistent/thereabouts-policy-compiler")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("policy compiler /nonexistent/thereabouts-policy-compiler not found"));
    assert!(!installed.exists());
}
