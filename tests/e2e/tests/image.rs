//! The container image (`scripts/build-image.sh`, an OCI layout built without a
//! daemon), checked by tools that are not ours: skopeo, the OCI image
//! validator, umoci, and runc running it with a read-only root file system.
//! Needs root and the packages tests/host-e2e.sh installs; ships the plugin
//! tests/host-e2e.sh built (`target/plugin`).

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use thereabouts_e2e::{TempDir, workspace_root};

const NAME: &str = "ghcr.io/thereabouts/thereabouts";

fn version() -> String {
    let cargo = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
    cargo.lines().find_map(|l| l.strip_prefix("version = \"")).and_then(|v| v.strip_suffix('"')).expect("workspace version").to_string()
}

fn ok(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The image built into `dir` (its `oci/` and `context/`), with the process
/// umask `umask`; returns the manifest digest the script printed.
fn build(dir: &Path, umask: &str) -> String {
    let script = format!("umask {umask} && bash scripts/build-image.sh");
    let out = Command::new("bash").args(["-c", &script]).current_dir(workspace_root()).env("IMAGE_DIR", dir).env("SKIP_PLUGIN_BUILD", "1").output().unwrap();
    ok(out, "build-image.sh").trim().to_string()
}

/// A built image, and its layout as an `oci:` reference.
struct Image {
    dir: TempDir,
    digest: String,
}

impl Image {
    fn new(tag: &str) -> Image {
        let dir = TempDir::new(tag);
        let digest = build(dir.path(), "022");
        Image { dir, digest }
    }

    fn reference(&self) -> String {
        format!("{}:{}", self.dir.path().join("oci").display(), version())
    }

    /// The image unpacked by umoci into a runtime bundle (`config.json`, `rootfs/`).
    fn unpack(&self, name: &str) -> PathBuf {
        let bundle = self.dir.path().join(name);
        ok(Command::new("umoci").args(["unpack", "--image", &self.reference()]).arg(&bundle).output().unwrap(), "umoci unpack");
        bundle
    }
}

/// Every file below `root`, by relative path: its kind, permission bits, owner,
/// and content (a file's bytes, a link's target).
fn tree(root: &Path) -> BTreeMap<String, (char, u32, u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let relative = path.strip_prefix(root).unwrap().display().to_string();
            let mode = meta.permissions().mode() & 0o7777;
            let node = if meta.file_type().is_symlink() {
                ('l', 0o777, meta.uid(), std::fs::read_link(&path).unwrap().into_os_string().into_encoded_bytes())
            } else if meta.is_dir() {
                stack.push(path.clone());
                ('d', mode, meta.uid(), Vec::new())
            } else {
                ('f', mode, meta.uid(), std::fs::read(&path).unwrap())
            };
            out.insert(relative, node);
        }
    }
    out
}

#[test]
fn the_same_sources_give_the_same_image_byte_for_byte() {
    let (a, b) = (TempDir::new("image-a"), TempDir::new("image-b"));
    // Another umask changes the modes of whatever the build writes on disk,
    // never the image.
    let (first, second) = (build(a.path(), "022"), build(b.path(), "077"));
    assert!(first.starts_with("sha256:") && first.len() == 71, "{first}");
    assert_eq!(first, second, "manifest digests of two builds");
    let files = |d: &Path| -> BTreeMap<String, Vec<u8>> { tree(&d.join("oci")).into_iter().map(|(p, (_, _, _, bytes))| (p, bytes)).collect() };
    assert_eq!(files(a.path()), files(b.path()), "the two layouts differ");
    println!("image: {NAME}:{} {first}, the same twice", version());
}

#[test]
fn skopeo_and_the_oci_validator_accept_it_under_its_full_name() {
    let image = Image::new("image-check");
    let inspected: Value =
        serde_json::from_str(&ok(Command::new("skopeo").args(["inspect", &format!("oci:{}", image.reference())]).output().unwrap(), "skopeo inspect")).unwrap();
    assert_eq!(inspected["Digest"], image.digest.as_str());
    assert_eq!((&inspected["Architecture"], &inspected["Os"]), (&json!("amd64"), &json!("linux")));
    assert_eq!(inspected["Labels"]["org.opencontainers.image.version"], version().as_str());
    assert_eq!(inspected["Layers"].as_array().map(Vec::len), Some(1), "one layer, no base image");
    let validated = Command::new("oci-image-tool")
        .args(["validate", "--type", "image", "--ref", &format!("name={}", version())])
        .arg(image.dir.path().join("oci"))
        .output()
        .unwrap();
    ok(validated, "oci-image-tool validate");
    // containerd names an imported image by this annotation (else import-DATE).
    let index: Value = serde_json::from_slice(&std::fs::read(image.dir.path().join("oci/index.json")).unwrap()).unwrap();
    assert_eq!(index["manifests"][0]["annotations"]["io.containerd.image.name"], format!("{NAME}:{}", version()));
    let blob = |digest: &str| std::fs::read(image.dir.path().join("oci/blobs/sha256").join(digest.trim_start_matches("sha256:"))).unwrap();
    let manifest: Value = serde_json::from_slice(&blob(&image.digest)).unwrap();
    let size = manifest["layers"][0]["size"].as_u64().expect("the layer's size");
    println!("image: one layer of {:.2} MiB compressed ({size} bytes)", size as f64 / 1048576.0);
}

/// What `docker build` makes of the Containerfile and its context: the
/// context's `rootfs/` copied to `/`, owned by root. It must be the layer.
#[test]
fn the_containerfile_builds_the_same_tree_as_the_layer() {
    let image = Image::new("image-context");
    let containerfile = std::fs::read_to_string(image.dir.path().join("context/Containerfile")).unwrap();
    assert!(containerfile.lines().any(|l| l == "FROM scratch") && containerfile.lines().any(|l| l == "COPY rootfs/ /"), "{containerfile}");
    let bundle = image.unpack("bundle");
    let as_docker_copies =
        |root: &Path| -> BTreeMap<String, (char, u32, u32, Vec<u8>)> { tree(root).into_iter().map(|(p, (k, m, _, c))| (p, (k, m, 0, c))).collect() };
    let layer = tree(&bundle.join("rootfs"));
    assert_eq!(as_docker_copies(&image.dir.path().join("context/rootfs")), layer);
    assert!(layer.values().all(|(_, _, uid, _)| *uid == 0), "every file of the layer belongs to root");
}

/// A runtime bundle that runs `args` on a read-only root without
/// capabilities, with `binds` (host path, container path) mounted read-write.
fn runnable(bundle: &Path, args: &[&str], env: &[&str], binds: &[(&Path, &str)]) {
    let path = bundle.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["process"]["terminal"] = json!(false);
    config["process"]["args"] = json!(args);
    config["process"]["env"] = json!(["PATH=/bin"].iter().chain(env).collect::<Vec<_>>());
    config["root"]["readonly"] = json!(true);
    // As the DaemonSet runs it: no capability at all, no privilege escalation.
    for set in ["bounding", "effective", "inheritable", "permitted", "ambient"] {
        config["process"]["capabilities"][set] = json!([]);
    }
    config["process"]["noNewPrivileges"] = json!(true);
    let mounts = config["mounts"].as_array_mut().unwrap();
    for (source, destination) in binds {
        mounts.push(json!({"destination": destination, "type": "bind", "source": source, "options": ["rbind", "rw"]}));
    }
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
}

fn run(bundle: &Path, id: &str) -> Output {
    let id = format!("thab-{id}-{}", std::process::id());
    let out = Command::new("runc").args(["run", "--bundle"]).arg(bundle).arg(&id).output().unwrap();
    let _ = Command::new("runc").args(["delete", "--force", &id]).output();
    out
}

#[test]
fn the_installer_runs_from_the_image_on_a_read_only_root() {
    let image = Image::new("image-run");
    let bundle = image.unpack("bundle");
    let host = TempDir::new("image-host");
    let (bin, conf, sa, cache) = (host.sub("opt-cni-bin"), host.sub("etc-cni-net.d"), host.sub("sa"), host.sub("policies"));
    std::fs::write(sa.join("token"), "token-1").unwrap();
    std::fs::write(sa.join("ca.crt"), "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").unwrap();
    std::fs::write(sa.join("namespace"), "kube-system").unwrap();
    runnable(
        &bundle,
        &["/opt/thereabouts/install-cni.sh", "--once"],
        &["KUBERNETES_SERVICE_HOST=192.0.2.1", "KUBERNETES_SERVICE_PORT=6443"],
        &[
            (&bin, "/host/opt/cni/bin"),
            (&conf, "/host/etc/cni/net.d"),
            (&sa, "/var/run/secrets/kubernetes.io/serviceaccount"),
            (&cache, "/host/var/lib/thereabouts/policies"),
        ],
    );
    ok(run(&bundle, "install"), "runc run install-cni.sh --once");
    let shipped = std::fs::read(bundle.join("rootfs/opt/thereabouts/thereabouts")).unwrap();
    assert_eq!(std::fs::read(bin.join("thereabouts")).unwrap(), shipped, "the plugin on the host is the image's");
    let flat: Value = serde_json::from_slice(&std::fs::read(conf.join("thereabouts.d/thereabouts.conf")).unwrap()).unwrap();
    assert_eq!(flat["datastore"], "kubernetes");
    let kubeconfig = std::fs::read_to_string(conf.join("thereabouts.d/thereabouts.kubeconfig")).unwrap();
    assert!(kubeconfig.contains("https://192.0.2.1:6443") && kubeconfig.contains("token-1"), "{kubeconfig}");
    // The plugin the image put there runs on the host.
    let version = Command::new(bin.join("thereabouts")).arg("--version").output().unwrap();
    assert!(ok(version, "installed plugin --version").starts_with("thereabouts "));
}

/// Every file under /opt/thereabouts that a manifest in deploy/ names is in
/// the image, and each binary runs there (whereabouts' arm64 image once
/// shipped without two of its binaries: whereabouts PR #705).
#[test]
fn every_binary_the_manifests_name_is_in_the_image_and_runs() {
    let image = Image::new("image-binaries");
    let bundle = image.unpack("bundle");
    let mut named = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(workspace_root().join("deploy")).unwrap().flatten() {
        if entry.path().extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap();
        for word in text.split(|c: char| c.is_whitespace() || "\"',[]".contains(c)) {
            if word.starts_with("/opt/thereabouts/") && !word.ends_with('/') && !word.contains("/policies") {
                named.insert(word.to_string());
            }
        }
    }
    assert!(named.contains("/opt/thereabouts/install-cni.sh") && named.contains("/opt/thereabouts/thereabouts"), "{named:?}");
    for path in &named {
        let meta = std::fs::metadata(bundle.join("rootfs").join(path.trim_start_matches('/'))).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(meta.permissions().mode() & 0o111 != 0, "{path} is not executable");
    }
    for binary in ["thereabouts", "thereabouts-policy-compiler"] {
        let path = format!("/opt/thereabouts/{binary}");
        runnable(&bundle, &[&path, "--version"], &[], &[]);
        let out = run(&bundle, binary);
        assert_eq!(ok(out, &path).trim(), format!("{binary} {}", version()));
    }
    runnable(&bundle, &["/bin/sh", "-c", "echo ok"], &[], &[]);
    assert_eq!(ok(run(&bundle, "sh"), "/bin/sh").trim(), "ok");
}

/// `IMAGE_PLATFORMS="amd64 arm64"`: the tag names an index of one manifest per
/// architecture, the amd64 one the single-architecture build's; the arm64
/// image holds arm64 binaries, each of which runs (under qemu's user-mode
/// emulation) and answers `--version`. Ships target/plugin-arm64, which
/// tests/host-e2e.sh cross-builds.
#[test]
fn the_arm64_image_shares_the_tag_and_its_binaries_run() {
    let single = Image::new("image-amd64");
    let dir = TempDir::new("image-multi");
    let built = Command::new("bash")
        .arg("scripts/build-image.sh")
        .current_dir(workspace_root())
        .env("IMAGE_DIR", dir.path())
        .env("SKIP_PLUGIN_BUILD", "1")
        .env("IMAGE_PLATFORMS", "amd64 arm64")
        .output()
        .unwrap();
    ok(built, "build-image.sh for amd64 and arm64");
    let layout = dir.path().join("oci");
    let reference = format!("oci:{}:{}", layout.display(), version());
    let raw: Value =
        serde_json::from_str(&ok(Command::new("skopeo").args(["inspect", "--raw", &reference]).output().unwrap(), "skopeo inspect --raw")).unwrap();
    let platforms: Vec<(&str, &str)> =
        raw["manifests"].as_array().unwrap().iter().map(|m| (m["platform"]["architecture"].as_str().unwrap(), m["digest"].as_str().unwrap())).collect();
    assert_eq!(platforms.len(), 2, "{raw}");
    assert_eq!(platforms[0], ("amd64", single.digest.as_str()));
    assert_eq!(platforms[1].0, "arm64");
    // The validator knows no nested index in a layout: it checks the index as a
    // document, and the arm64 image once skopeo has copied it out on its own.
    let top: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let nested = layout.join("blobs/sha256").join(top["manifests"][0]["digest"].as_str().unwrap().trim_start_matches("sha256:"));
    ok(Command::new("oci-image-tool").args(["validate", "--type", "imageIndex"]).arg(&nested).output().unwrap(), "oci-image-tool validate (index)");
    let arm = format!("{}:{}", dir.path().join("arm64").display(), version());
    ok(Command::new("skopeo").args(["copy", "--override-arch", "arm64", &reference, &format!("oci:{arm}")]).output().unwrap(), "skopeo copy arm64");
    let validated = Command::new("oci-image-tool")
        .args(["validate", "--type", "image", "--ref", &format!("name={}", version())])
        .arg(dir.path().join("arm64"))
        .output()
        .unwrap();
    ok(validated, "oci-image-tool validate (arm64)");
    let bundle = dir.path().join("bundle");
    ok(Command::new("umoci").args(["unpack", "--image", &arm]).arg(&bundle).output().unwrap(), "umoci unpack");
    let rootfs = bundle.join("rootfs");
    for binary in ["thereabouts", "thereabouts-policy-compiler"] {
        let path = rootfs.join("opt/thereabouts").join(binary);
        let elf = std::fs::read(&path).unwrap();
        assert_eq!(&elf[18..20], &[0xb7, 0x00], "{binary} is not an aarch64 ELF executable");
        let ran = Command::new("qemu-aarch64-static").arg(&path).arg("--version").output().unwrap();
        assert_eq!(ok(ran, binary).trim(), format!("{binary} {}", version()));
    }
    let shell = Command::new("qemu-aarch64-static").arg(rootfs.join("bin/busybox")).args(["sh", "-c", "echo ok"]).output().unwrap();
    assert_eq!(ok(shell, "busybox sh").trim(), "ok");
}
