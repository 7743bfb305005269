//! The deployment files agree with the binary and with each other. Each assertion names the
//! file and what to change.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use settled::http::wire::{MAX_BODY_BYTES, MAX_WAIT_MS};

use crate::files::{self, Directive};

/// The image every deployment file runs: the Dockerfile's, tagged with this version.
fn image() -> String {
    format!("settled:{}", env!("CARGO_PKG_VERSION"))
}

/// How long settled may take to exit after SIGTERM: its drain, bounded by the shutdown grace.
const DRAIN: Duration = settled::server::SHUTDOWN_GRACE;

/// How often an idle history stream sends a comment (`KEEP_ALIVE` in src/http/routes/history/stream.rs).
const STREAM_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The flags and variables of `settled serve`.
fn serve_help() -> &'static (BTreeSet<String>, BTreeSet<String>) {
    static HELP: OnceLock<(BTreeSet<String>, BTreeSet<String>)> = OnceLock::new();
    HELP.get_or_init(|| files::help(&["serve"]))
}

/// `name` is a variable `settled serve` reads (variables of other programs are left alone).
fn assert_variable(file: &str, name: &str) {
    if name.starts_with("SETTLED_") {
        assert!(
            serve_help().1.contains(name),
            "{file}: {name} is not a variable of `settled serve --help`: {:?}",
            serve_help().1
        );
    }
}

/// `args` are `serve` (optional) and flags `settled serve` has.
fn assert_serve_args(file: &str, args: &[String]) {
    let args = match args.first().map(String::as_str) {
        Some("serve") => &args[1..],
        _ => args,
    };
    for arg in args.iter().filter(|a| a.starts_with("--")) {
        let flag = arg.split_once('=').map_or(arg.as_str(), |(f, _)| f);
        assert!(
            serve_help().0.contains(flag),
            "{file}: {flag} is not a flag of `settled serve --help`"
        );
    }
}

/// `argv` (after the binary) is `healthcheck` with flags it has.
fn assert_healthcheck_args(file: &str, argv: &[String]) {
    assert_eq!(
        argv.first().map(String::as_str),
        Some("healthcheck"),
        "{file}: {argv:?}"
    );
    let (flags, _) = files::help(&["healthcheck"]);
    for arg in argv.iter().filter(|a| a.starts_with("--")) {
        let flag = arg.split_once('=').map_or(arg.as_str(), |(f, _)| f);
        assert!(flags.contains(flag), "{file}: healthcheck has no {flag}");
    }
}

/// The paths served as GET in openapi.yaml.
fn served_paths() -> BTreeSet<String> {
    let spec = files::yaml("openapi.yaml");
    spec["paths"]
        .as_object()
        .expect("openapi paths")
        .iter()
        .filter(|(_, ops)| ops.get("get").is_some())
        .map(|(path, _)| path.clone())
        .collect()
}

/// The image's `ENV` settings.
fn image_env() -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for (_, rest) in files::dockerfile().iter().filter(|(n, _)| n == "ENV") {
        for pair in rest.split_whitespace() {
            let (key, value) = pair.split_once('=').expect("ENV KEY=VALUE");
            env.insert(key.to_owned(), value.to_owned());
        }
    }
    env
}

/// The port every file must agree on: the one the image listens on.
fn listen_port() -> u16 {
    files::port_of(&image_env()["SETTLED_LISTEN"])
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().expect("a string").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_dockerfile_runs_what_the_other_files_expect() {
    let file = "Dockerfile";
    let image = files::dockerfile();
    let get = |name: &str| {
        image
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, rest)| rest.clone())
            .collect::<Vec<_>>()
    };
    for name in image_env().keys() {
        assert_variable(file, name);
    }
    assert_eq!(
        get("EXPOSE"),
        [listen_port().to_string()],
        "{file}: EXPOSE the listen port"
    );
    assert_eq!(get("ENTRYPOINT"), [r#"["/usr/local/bin/settled"]"#]);
    assert_eq!(get("CMD"), [r#"["serve"]"#]);
    assert_eq!(get("STOPSIGNAL"), ["SIGTERM"]);
    let healthcheck = get("HEALTHCHECK");
    let (options, exec) = healthcheck[0]
        .split_once("CMD ")
        .expect("HEALTHCHECK … CMD");
    let argv: Vec<String> = serde_json::from_str(exec).expect("exec form");
    assert_eq!(argv[0], "/usr/local/bin/settled");
    assert_healthcheck_args(file, &argv[1..]);
    assert_check_timing(
        file,
        options
            .split_whitespace()
            .filter_map(|o| o.strip_prefix("--")),
        &argv,
    );
}

/// Docker's `timeout` of a check outlasts the check's own `--timeout`, so that the check's
/// reason, not Docker's, is what is recorded.
fn assert_check_timing<'a>(file: &str, options: impl Iterator<Item = &'a str>, argv: &[String]) {
    let options: BTreeMap<&str, &str> = options.filter_map(|o| o.split_once('=')).collect();
    let docker = files::duration(options.get("timeout").expect("a timeout"));
    let own = argv
        .iter()
        .position(|a| a == "--timeout")
        .map_or(Duration::from_secs(5), |i| files::duration(&argv[i + 1]));
    assert!(
        own < docker,
        "{file}: healthcheck --timeout {own:?} must be below Docker's {docker:?}"
    );
}

#[test]
fn compose_agrees_with_the_binary_and_the_other_files() {
    let file = "deploy/compose.yaml";
    let compose = files::yaml(file);
    let services = compose["services"].as_object().expect("services");
    let settled = &services["settled"];
    assert_eq!(
        settled["image"],
        image(),
        "{file}: the image of this version"
    );
    let context = settled["build"]["context"].as_str().expect("build context");
    assert!(
        files::repo("deploy")
            .join(context)
            .join("Dockerfile")
            .exists(),
        "{file}: the build context holds the Dockerfile"
    );
    let env = settled["environment"]
        .as_object()
        .expect("a map of variables");
    for name in env.keys() {
        assert_variable(file, name);
    }
    let listen = env["SETTLED_LISTEN"].as_str().expect("SETTLED_LISTEN");
    assert_eq!(
        files::port_of(listen),
        listen_port(),
        "{file}: SETTLED_LISTEN"
    );
    for port in strings(&settled["ports"]) {
        assert_eq!(
            files::port_of(&port),
            listen_port(),
            "{file}: container port of {port}"
        );
    }
    assert_serve_args(file, &strings(&settled["command"]));
    assert!(
        settled.get("entrypoint").is_none(),
        "{file}: the image's entry point"
    );
    let grace = files::duration(
        settled["stop_grace_period"]
            .as_str()
            .expect("stop_grace_period"),
    );
    assert!(
        grace > DRAIN,
        "{file}: stop_grace_period {grace:?} must exceed the drain {DRAIN:?}"
    );
    let check = &settled["healthcheck"];
    let argv = strings(&check["test"]);
    assert_eq!(argv[..2], ["CMD", "/usr/local/bin/settled"]);
    assert_healthcheck_args(file, &argv[2..]);
    let timeout = format!("timeout={}", check["timeout"].as_str().expect("a timeout"));
    assert_check_timing(file, std::iter::once(timeout.as_str()), &argv);
    for (name, service) in services {
        let restart = service["restart"].as_str().unwrap_or_default();
        assert!(
            ["always", "on-failure", "unless-stopped"].contains(&restart),
            "{file}: {name} needs a restart policy that restarts it, not {restart:?}"
        );
    }

    // Every file mounted from the repository is there.
    for (name, service) in services {
        for volume in strings(&service["volumes"]) {
            if let Some(source) = volume.strip_prefix("./") {
                let source = source.split(':').next().unwrap();
                assert!(
                    files::repo("deploy").join(source).exists(),
                    "{file}: {name} mounts ./{source}, which is missing"
                );
            }
        }
    }
    let mounts = |service: &str| -> BTreeMap<String, String> {
        strings(&services[service]["volumes"])
            .iter()
            .filter_map(|v| {
                let mut parts = v.split(':');
                let source = parts.next()?.strip_prefix("./")?;
                Some((parts.next()?.to_owned(), source.to_owned()))
            })
            .collect()
    };

    // Prometheus scrapes settled's port and loads the shipped rules from beside its config.
    let prometheus = mounts("prometheus");
    let config_at = Path::new("/etc/prometheus/prometheus.yml");
    let config = files::yaml(&format!(
        "deploy/{}",
        prometheus[config_at.to_str().unwrap()]
    ));
    for target in config["scrape_configs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|job| job["static_configs"].as_array().unwrap())
        .flat_map(|c| strings(&c["targets"]))
    {
        assert_eq!(
            target,
            format!("settled:{}", listen_port()),
            "{file}: scrape target"
        );
    }
    for rules in strings(&config["rule_files"]) {
        let at = config_at.parent().unwrap().join(&rules);
        assert_eq!(
            prometheus.get(at.to_str().unwrap()).map(String::as_str),
            Some(format!("prometheus/{rules}").as_str()),
            "{file}: the shipped {rules} mounted beside the Prometheus config"
        );
    }

    // Grafana loads the shipped dashboard from where its provider looks.
    let grafana = mounts("grafana");
    let (dashboard_at, _) = grafana
        .iter()
        .find(|(_, source)| *source == "grafana/settled.json")
        .expect("the shipped dashboard mounted into grafana");
    let provisioning = grafana
        .iter()
        .find(|(at, _)| at.as_str() == "/etc/grafana/provisioning")
        .map(|(_, source)| source.clone())
        .expect("grafana's provisioning directory mounted");
    let providers = files::yaml(&format!("deploy/{provisioning}/dashboards/settled.yml"));
    assert_eq!(
        providers["providers"][0]["options"]["path"].as_str(),
        Path::new(dashboard_at).parent().and_then(Path::to_str),
        "{file}: the dashboard provider's path holds the dashboard"
    );
}

/// The manifests of deploy/kubernetes (kustomizations aside), with the file each came from.
fn manifests() -> Vec<(String, Value)> {
    let mut found = Vec::new();
    let mut dirs = vec![files::repo("deploy/kubernetes")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("deploy/kubernetes") {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml")
                && !path.ends_with("kustomization.yaml")
            {
                let name = path
                    .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .trim_start_matches('/')
                    .to_owned();
                for doc in files::yaml_docs(&name) {
                    found.push((name.clone(), doc));
                }
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// `labels` holds every pair of `selector`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

#[test]
fn kubernetes_manifests_agree_with_the_binary_and_each_other() {
    let manifests = manifests();
    let paths = served_paths();
    let secret = manifests
        .iter()
        .find(|(_, m)| m["kind"] == "Secret")
        .map(|(_, m)| m.clone())
        .expect("a Secret example");
    let mut workloads = 0;
    for (file, m) in &manifests {
        let dir = Path::new(file).parent().unwrap();
        let kind = m["kind"].as_str().unwrap_or_default();
        match kind {
            "Deployment" | "StatefulSet" => {
                workloads += 1;
                let pod = &m["spec"]["template"];
                assert!(
                    selects(
                        &m["spec"]["selector"]["matchLabels"],
                        &pod["metadata"]["labels"]
                    ),
                    "{file}: the selector matches the pod's labels"
                );
                let replicas = m["spec"]["replicas"].as_u64().expect("replicas");
                check_pod(file, kind, replicas, pod, &secret, &paths);
            }
            "Service" | "PodDisruptionBudget" => {
                let selector = if kind == "Service" {
                    &m["spec"]["selector"]
                } else {
                    &m["spec"]["selector"]["matchLabels"]
                };
                let pods: Vec<&Value> = manifests
                    .iter()
                    .filter(|(f, w)| {
                        Path::new(f).parent() == Some(dir)
                            && matches!(w["kind"].as_str(), Some("Deployment" | "StatefulSet"))
                    })
                    .map(|(_, w)| &w["spec"]["template"])
                    .filter(|pod| selects(selector, &pod["metadata"]["labels"]))
                    .collect();
                assert_eq!(
                    pods.len(),
                    1,
                    "{file}: the {kind} selects the workload beside it"
                );
                if kind == "Service" {
                    for port in m["spec"]["ports"].as_array().unwrap() {
                        let target = &port["targetPort"];
                        let container = pods[0]["spec"]["containers"][0]["ports"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .find(|p| p["name"] == *target || p["containerPort"] == *target);
                        assert!(
                            container.is_some(),
                            "{file}: targetPort {target} is a container port"
                        );
                    }
                }
            }
            "Secret" => {}
            other => panic!("{file}: a {other} this test does not know"),
        }
    }
    assert_eq!(
        workloads, 2,
        "the SQLite StatefulSet and the PostgreSQL Deployment"
    );

    // Each kustomization lists every manifest beside it, and only existing ones.
    for dir in ["deploy/kubernetes/sqlite", "deploy/kubernetes/postgres"] {
        let kustomization = files::yaml(&format!("{dir}/kustomization.yaml"));
        let listed: BTreeSet<String> = strings(&kustomization["resources"]).into_iter().collect();
        let beside: BTreeSet<String> = manifests
            .iter()
            .filter(|(f, _)| Path::new(f).parent() == Some(Path::new(dir)))
            .map(|(f, _)| {
                Path::new(f)
                    .file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(
            listed, beside,
            "{dir}/kustomization.yaml lists the manifests beside it"
        );
    }
}

/// One settled pod template: image, variables, flags, ports, probes, Secret keys, stop.
fn check_pod(
    file: &str,
    kind: &str,
    replicas: u64,
    pod: &Value,
    secret: &Value,
    paths: &BTreeSet<String>,
) {
    let spec = &pod["spec"];
    let containers = spec["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1, "{file}: one container");
    let c = &containers[0];
    assert_eq!(c["image"], image(), "{file}: the image of this version");
    assert_serve_args(file, &strings(&c["args"]));
    assert!(
        c.get("command").is_none(),
        "{file}: the image's entry point"
    );
    let mut env = BTreeMap::new();
    for var in c["env"].as_array().expect("env") {
        let name = var["name"].as_str().unwrap().to_owned();
        assert_variable(file, &name);
        if let Some(key) = var["valueFrom"]["secretKeyRef"].as_object() {
            assert_eq!(
                key["name"], secret["metadata"]["name"],
                "{file}: {name}'s Secret"
            );
            let key = key["key"].as_str().unwrap();
            assert!(
                secret["stringData"].get(key).is_some(),
                "{file}: {name} reads key {key}, which the Secret example lacks"
            );
            env.insert(name, None);
        } else {
            env.insert(name, var["value"].as_str().map(str::to_owned));
        }
    }
    assert!(
        env.contains_key("SETTLED_TOKENS"),
        "{file}: tokens, to listen beyond loopback"
    );
    let listen = env["SETTLED_LISTEN"].clone().expect("SETTLED_LISTEN given");
    assert_eq!(
        files::port_of(&listen),
        listen_port(),
        "{file}: SETTLED_LISTEN"
    );
    let ports = c["ports"].as_array().expect("ports");
    assert_eq!(ports.len(), 1, "{file}: one port");
    assert_eq!(
        ports[0]["containerPort"],
        listen_port(),
        "{file}: the container port is the listen port"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["prometheus.io/port"],
        listen_port().to_string(),
        "{file}: Prometheus scrapes the listen port"
    );
    let port_name = &ports[0]["name"];
    for (probe, want) in [
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ] {
        let get = &c[probe]["httpGet"];
        let path = get["path"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: {probe}.httpGet"));
        assert_eq!(path, want, "{file}: {probe}");
        assert!(
            paths.contains(path),
            "{file}: {probe} asks {path}, which settled does not serve"
        );
        assert!(
            get["port"] == *port_name || get["port"] == listen_port(),
            "{file}: {probe} asks the listen port"
        );
    }
    for resource in ["cpu", "memory"] {
        assert!(
            c["resources"]["requests"].get(resource).is_some(),
            "{file}: a {resource} request"
        );
    }
    // SIGTERM comes after preStop; both within the grace period.
    let pre_stop = strings(&c["lifecycle"]["preStop"]["exec"]["command"]);
    let pause = match pre_stop.as_slice() {
        [] => Duration::ZERO,
        [sleep, secs] if sleep == "sleep" => files::duration(secs),
        other => panic!("{file}: preStop {other:?}"),
    };
    let grace = Duration::from_secs(
        spec["terminationGracePeriodSeconds"]
            .as_u64()
            .expect("terminationGracePeriodSeconds"),
    );
    assert!(
        grace > pause + DRAIN,
        "{file}: terminationGracePeriodSeconds {grace:?} must exceed preStop {pause:?} plus the drain {DRAIN:?}"
    );
    match kind {
        "StatefulSet" => {
            assert_eq!(
                replicas, 1,
                "{file}: a SQLite database has ONE writer: one replica, never more"
            );
            let url = env["SETTLED_DATABASE_URL"].clone().expect("a SQLite URL");
            let db = url.strip_prefix("sqlite:").expect("SQLite");
            let mounted = c["volumeMounts"].as_array().unwrap().iter().any(|m| {
                let at = m["mountPath"].as_str().unwrap();
                Path::new(db).starts_with(at) && m["name"] == "data"
            });
            assert!(mounted, "{file}: {db} lies on the persistent volume");
        }
        _ => {
            assert!(replicas >= 2, "{file}: several replicas");
            assert_eq!(
                env.get("SETTLED_DATABASE_URL"),
                Some(&None),
                "{file}: the URL from the Secret"
            );
        }
    }
}

/// Keys a unit may give more than once (lists). Any other key given twice is a mistake: the
/// last one silently wins.
const UNIT_LISTS: [&str; 8] = [
    "Environment",
    "EnvironmentFile",
    "ExecStartPre",
    "ExecStartPost",
    "After",
    "Wants",
    "Requires",
    "SystemCallFilter",
];

#[test]
fn the_systemd_unit_agrees_with_the_binary() {
    let file = "deploy/systemd/settled.service";
    let unit = files::systemd_unit(file);
    let mut seen = BTreeSet::new();
    for (section, key, _) in &unit {
        assert!(
            UNIT_LISTS.contains(&key.as_str()) || seen.insert((section.clone(), key.clone())),
            "{file}: [{section}] {key}= given twice (the last one wins)"
        );
    }
    let get = |key: &str| {
        unit.iter()
            .find(|(s, k, _)| s == "Service" && k == key)
            .map(|(_, _, v)| v.clone())
            .unwrap_or_else(|| panic!("{file}: {key}="))
    };
    let exec: Vec<String> = get("ExecStart")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        exec[0], "/usr/local/bin/settled",
        "{file}: the binary the docs install"
    );
    assert_eq!(
        exec.get(1).map(String::as_str),
        Some("serve"),
        "{file}: `serve` first"
    );
    assert_serve_args(file, &exec[1..]);
    for (_, key, value) in unit.iter().filter(|(_, k, _)| k == "Environment") {
        let (name, _) = value
            .split_once('=')
            .unwrap_or_else(|| panic!("{file}: {key}={value}"));
        assert_variable(file, name);
    }
    let stop = files::duration(&get("TimeoutStopSec"));
    assert!(
        stop > DRAIN,
        "{file}: TimeoutStopSec {stop:?} must exceed the drain {DRAIN:?}"
    );
    assert_eq!(get("KillSignal"), "SIGTERM");
    let files_open: usize = get("LimitNOFILE").parse().expect("a number");
    assert!(
        files_open >= settled::config::MAX_CONNECTIONS + 64,
        "{file}: LimitNOFILE"
    );
}

#[test]
fn the_nginx_example_fits_the_api() {
    let file = "deploy/proxy/nginx.conf";
    let conf = files::nginx(file);
    let upstream = conf.one("upstream").expect("an upstream");
    let upstream_name = &upstream.args[0];
    for server in upstream.all("server") {
        assert_eq!(
            files::port_of(&server.args[0]),
            listen_port(),
            "{file}: upstream port"
        );
    }
    let tls = conf
        .all("server")
        .find(|s| s.all("listen").any(|l| l.args.iter().any(|a| a == "ssl")))
        .expect("a TLS server");
    assert!(tls.one("ssl_certificate").is_some() && tls.one("ssl_certificate_key").is_some());
    let size = tls
        .one("client_max_body_size")
        .expect("client_max_body_size");
    assert_eq!(
        files::nginx_size(&size.args[0]),
        MAX_BODY_BYTES,
        "{file}: settled's body limit"
    );
    let timeout = |d: &Directive, name: &str| d.one(name).map(|t| files::duration(&t.args[0]));
    let read = timeout(tls, "proxy_read_timeout").expect("proxy_read_timeout");
    assert!(
        read > settled::http::REQUEST_TIMEOUT && read > Duration::from_millis(MAX_WAIT_MS),
        "{file}: proxy_read_timeout {read:?} must outlast a long poll and the request time limit"
    );
    assert!(timeout(tls, "proxy_send_timeout").expect("proxy_send_timeout") >= read);
    let locations: BTreeMap<String, &Directive> =
        tls.all("location").map(|l| (l.args.join(" "), l)).collect();
    for location in locations.values().filter(|l| l.one("return").is_none()) {
        let pass = location.one("proxy_pass").expect("proxy_pass");
        assert_eq!(
            pass.args[0],
            format!("http://{upstream_name}"),
            "{file}: to the upstream"
        );
    }
    let stream = locations["= /v1/history"];
    assert_eq!(
        stream.one("proxy_buffering").expect("proxy_buffering").args,
        ["off"],
        "{file}: an event stream must not wait in a buffer"
    );
    let stream_read = timeout(stream, "proxy_read_timeout").unwrap_or(read);
    assert!(
        stream_read > STREAM_KEEP_ALIVE * 2,
        "{file}: a stream's read timeout must outlast its keep-alive comments"
    );
}

#[test]
fn the_deployment_doc_uses_these_files() {
    let doc = files::read("docs/deployment.md");
    for path in [
        "deploy/compose.yaml",
        "deploy/compose.env.sh",
        "deploy/kubernetes/sqlite",
        "deploy/kubernetes/postgres",
        "deploy/kubernetes/secret.example.yaml",
        "deploy/systemd/settled.service",
        "deploy/proxy/nginx.conf",
        "tests/deploy/validate.sh",
        "settled healthcheck",
    ] {
        assert!(
            doc.contains(path),
            "docs/deployment.md does not mention {path}"
        );
        if path.starts_with("deploy/") || path.starts_with("tests/") {
            assert!(files::repo(path).exists(), "{path} is missing");
        }
    }
    assert!(
        !doc.contains("\n[Service]"),
        "docs/deployment.md: the unit lives in deploy/systemd/settled.service, not inline"
    );
}
