//! End to end: every fatal bootstrap case ends `prted --bootstrap` with exit status 1 and one
//! diagnostic naming the kind, the file, the line and the offending text or host — and never
//! with a guessed identity.

mod common;

use std::fs;
use std::time::Duration;

use common::*;
use dvmlab_harness::{IpMode, PrteConf};

const GOOD: &str = "DVMNodes=n01,n02\nDVMControllerHost=ctl\n";

struct Case {
    name: &'static str,
    conf: String,
    host: &'static str,
    kind: &'static str,
    /// Substrings the diagnostic must contain; `{conf}` stands for the conf file's path.
    must: Vec<String>,
}

fn case(
    name: &'static str,
    conf: &str,
    host: &'static str,
    kind: &'static str,
    must: &[&str],
) -> Case {
    Case {
        name,
        conf: conf.to_string(),
        host,
        kind,
        must: must.iter().map(|s| s.to_string()).collect(),
    }
}

fn run_prted(dvm: &Dvm, host: &str) -> (Option<i32>, String, String) {
    let argv = [PRTED, "--bootstrap"].map(String::from);
    let (st, out, err) = dvm
        .cluster
        .exec_within(host, &argv, Duration::from_secs(10))
        .unwrap();
    (st.and_then(|s| s.code()), out, err)
}

fn check(dvm: &Dvm, c: &Case) {
    dvm.cluster.set_host_conf(c.host, &c.conf).unwrap();
    let (code, _out, err) = run_prted(dvm, c.host);
    let conf_path = dvm.cluster.conf_path(c.host).display().to_string();
    assert_eq!(
        code,
        Some(1),
        "{}: prted must exit 1 (got {code:?}); stderr:\n{err}",
        c.name
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{}: exactly one diagnostic line:\n{err}",
        c.name
    );
    assert!(
        err.contains(&format!("[{}]", c.kind)),
        "{}: kind {}:\n{err}",
        c.name,
        c.kind
    );
    for m in &c.must {
        let m = m.replace("{conf}", &conf_path);
        assert!(
            err.contains(&m),
            "{}: diagnostic must mention {m:?}:\n{err}",
            c.name
        );
    }
}

#[test]
fn every_malformed_conf_class_aborts_with_its_diagnostic() {
    let Some(b) = backend("diagnostics", Needs::AnyBackend) else {
        return;
    };
    let hosts: Vec<String> = ["ctl", "n01", "n02", "stranger"].map(String::from).to_vec();
    let dvm = Dvm::with_spec("diag", b, IpMode::V4, &hosts, &PrteConf::new(), |s| {
        // A second address for ctl makes its name ambiguous.
        s.extra_hosts_lines.push("10.200.77.77 ctl".into());
    });
    let ctl_addr = dvm.cluster.host("ctl").unwrap().v4.unwrap();
    // Holds every host's real address but not the second address given to ctl.
    let ctl_net = {
        let o = match ctl_addr {
            std::net::IpAddr::V4(a) => a.octets(),
            other => panic!("IPv4 expected, got {other}"),
        };
        format!("{}.{}.{}.0/24", o[0], o[1], o[2])
    };
    let cases = vec![
        case(
            "no =",
            "# c\nDVMNodes n01,n02\nDVMControllerHost=ctl\n",
            "n01",
            "no-equals",
            &["{conf}:2", "DVMNodes n01,n02"],
        ),
        case(
            "empty key",
            "DVMNodes=n01,n02\n=ctl\n",
            "n01",
            "empty-key",
            &["{conf}:2", "=ctl"],
        ),
        case(
            "empty value",
            "DVMNodes=n01,n02\nDVMControllerHost=\n",
            "n01",
            "empty-value",
            &["{conf}:2", "DVMControllerHost"],
        ),
        case(
            "missing DVMNodes",
            "DVMControllerHost=ctl\n",
            "n01",
            "missing-key",
            &["{conf}", "DVMNodes"],
        ),
        case(
            "missing DVMControllerHost",
            "DVMNodes=n01,n02\n",
            "n01",
            "missing-key",
            &["{conf}", "DVMControllerHost"],
        ),
        case(
            "bad range",
            "DVMControllerHost=ctl\nDVMNodes=n[2:1-\n",
            "n01",
            "bad-node-list",
            &["{conf}:2", "n[2:1-"],
        ),
        case(
            "backwards range",
            "DVMControllerHost=ctl\nDVMNodes=n[2:9-1]\n",
            "n01",
            "bad-node-list",
            &["{conf}:2", "backwards"],
        ),
        case(
            "duplicate",
            "DVMNodes=n01,n02,n[2:1-1]\nDVMControllerHost=ctl\n",
            "n01",
            "duplicate-node",
            &["{conf}:1", "n01"],
        ),
        case(
            "stranger",
            GOOD,
            "stranger",
            "not-a-member",
            &["{conf}:1", "stranger"],
        ),
        case(
            "unresolvable controller",
            "DVMNodes=n01,n02\nDVMControllerHost=ghost\n",
            "n01",
            "unresolved-host",
            &["{conf}:2", "ghost"],
        ),
        case(
            "ambiguous controller address",
            GOOD,
            "n01",
            "ambiguous-address",
            &["{conf}:2", "ctl", "10.200.77.77", "DVMNetworks"],
        ),
        case(
            "no address in DVMNetworks",
            &format!("{GOOD}DVMNetworks=192.0.2.0/24\n"),
            "n01",
            "no-matching-address",
            &["{conf}:1", "n01", "DVMNetworks"],
        ),
        case(
            "bad radix",
            &format!("{GOOD}DVMRadix=1\n"),
            "n01",
            "bad-value",
            &["{conf}:3", "1"],
        ),
        case(
            "bad port",
            &format!("{GOOD}DVMPort=http\n"),
            "n01",
            "bad-value",
            &["{conf}:3", "http"],
        ),
        case(
            "bad ip version",
            &format!("{GOOD}DVMIPVersion=5\n"),
            "n01",
            "bad-value",
            &["{conf}:3", "5"],
        ),
    ];
    for c in &cases {
        check(&dvm, c);
    }

    // DVMNetworks picks the right one of the ambiguous addresses, and supplies the mask.
    dvm.cluster
        .set_host_conf("n01", &format!("{GOOD}DVMNetworks={ctl_net}\n"))
        .unwrap();
    let argv = [PRTED, "--bootstrap", "--show-identity", "--json"].map(String::from);
    let out = dvm.cluster.exec("n01", &argv).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["parent_uri"],
        format!("cluster-prte-dvm.0;tcp://{ctl_addr}:7817:24")
    );

    // A node file's errors name the node file and its line.
    fs::write(
        dvm.cluster.etc_dir("n01").join("nodes.txt"),
        "n01\nn02\nbad host\n",
    )
    .unwrap();
    let node_file = dvm.cluster.conf_path("n01").with_file_name("nodes.txt");
    check(
        &dvm,
        &Case {
            name: "node file",
            conf: "DVMNodes=file:nodes.txt\nDVMControllerHost=ctl\n".into(),
            host: "n01",
            kind: "bad-node-list",
            must: vec![format!("{}:3", node_file.display()), "bad host".into()],
        },
    );

    // No configuration file at all.
    fs::remove_file(dvm.cluster.etc_dir("n02").join("prte.conf")).unwrap();
    let (code, _, err) = run_prted(&dvm, "n02");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("[unreadable-file]") && err.contains("prte.conf"),
        "{err}"
    );
}

#[test]
fn ipv6_selected_on_a_host_without_ipv6_aborts_with_a_diagnostic() {
    let Some(b) = backend("ipv6 unavailable", Needs::Netns) else {
        return;
    };
    let hosts: Vec<String> = ["ctl", "n01", "n02"].map(String::from).to_vec();
    let conf = PrteConf::new()
        .set("DVMNodes", "n01,n02")
        .set("DVMControllerHost", "ctl")
        .set("DVMIPVersion", 6);
    let dvm = Dvm::with_spec("noipv6", b, IpMode::Dual, &hosts, &conf, |s| {
        s.no_ipv6.push("n02".into())
    });
    let (code, _, err) = run_prted(&dvm, "n02");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("[ipv6-unavailable]") && err.contains("/etc/prte.conf"),
        "{err}"
    );
    // The same file on a host with IPv6 is fine.
    let argv = [PRTED, "--bootstrap", "--show-identity", "--json"].map(String::from);
    assert!(dvm.cluster.exec("n01", &argv).unwrap().status.success());
}

#[test]
fn ipv6_only_dvm_listens_and_connects_on_ipv6_alone() {
    let Some(b) = backend("ipv6 only", Needs::Ipv6) else {
        return;
    };
    let hosts: Vec<String> = ["ctl", "n01", "n02", "n03"].map(String::from).to_vec();
    let conf = conf_for(3).set("DVMIPVersion", 6).set("DVMRadix", 2);
    // Dual-stack hosts: the daemons must still use IPv6 only.
    let mut dvm = Dvm::new("v6only", b, IpMode::Dual, &hosts, &conf);
    dvm.cluster.start_all().unwrap();
    let s = dvm.wait_formed(Duration::from_secs(10));
    assert!(
        s.controller_uri.contains("tcp6://[fd00:200::"),
        "{}",
        s.controller_uri
    );
    for h in &hosts {
        let argv = ["ss", "-Htan"].map(String::from);
        let out = dvm.cluster.exec(h, &argv).unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "ss on {h}");
        assert!(text.contains("fd00:200::"), "{h} has IPv6 sockets:\n{text}");
        assert!(
            !text.contains("10.200."),
            "{h} must have no IPv4 DVM socket:\n{text}"
        );
    }
    dvm.stop_cleanly(&hosts);
}

/// `prted --bootstrap --show-identity --json` on n01 with `conf`, extra flags and environment.
fn show_identity(
    dvm: &Dvm,
    conf: &str,
    cli: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    dvm.cluster.set_host_conf("n01", conf).unwrap();
    let mut argv: Vec<String> = [PRTED, "--bootstrap", "--show-identity", "--json"]
        .map(String::from)
        .to_vec();
    argv.extend(cli.iter().map(|s| s.to_string()));
    let mut cmd = dvm.cluster.command("n01", &argv).unwrap();
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

#[test]
fn command_line_beats_prte_conf_which_beats_the_environment() {
    let Some(b) = backend("precedence", Needs::AnyBackend) else {
        return;
    };
    let hosts: Vec<String> = ["ctl", "n01"].map(String::from).to_vec();
    let dvm = Dvm::new("prec", b, IpMode::V4, &hosts, &PrteConf::new());
    let identity = |conf: &str, cli: &[&str], env: &[(&str, &str)]| -> serde_json::Value {
        let out = show_identity(&dvm, conf, cli, env);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let env = [
        ("PRTE_MCA_rml_base_radix", "5"),
        ("PRTE_MCA_prte_dvm_port", "9100"),
    ];
    let with_keys = format!("{GOOD}DVMRadix=3\nDVMPort=9000\n");
    let v = identity(GOOD, &[], &env);
    assert_eq!(
        (v["radix"].as_u64(), v["port"].as_u64()),
        (Some(5), Some(9100)),
        "env alone applies"
    );
    let v = identity(&with_keys, &[], &env);
    assert_eq!(
        (v["radix"].as_u64(), v["port"].as_u64()),
        (Some(3), Some(9000)),
        "conf beats env"
    );
    let v = identity(
        &with_keys,
        &[
            "--prtemca",
            "rml_base_radix",
            "7",
            "--prtemca",
            "prte_dvm_port",
            "9200",
        ],
        &env,
    );
    assert_eq!(
        (v["radix"].as_u64(), v["port"].as_u64()),
        (Some(7), Some(9200)),
        "command line beats both"
    );
}

#[test]
fn keep_fqdn_hostnames_in_prte_conf_beats_the_environment_and_loses_to_the_command_line() {
    let Some(b) = backend("KeepFQDN precedence", Needs::AnyBackend) else {
        return;
    };
    let hosts: Vec<String> = ["ctl", "n01"].map(String::from).to_vec();
    // The hosts know themselves as n01.lab.example; DVMNodes names another domain, so only
    // short-name matching places n01.
    let dvm = Dvm::with_spec("fqdnprec", b, IpMode::V4, &hosts, &PrteConf::new(), |s| {
        s.domain = Some("lab.example".into())
    });
    let other = "DVMNodes=n01.other.example\nDVMControllerHost=ctl.other.example\n";
    let run = |conf: &str, cli: &[&str], env: &[(&str, &str)]| -> (bool, String) {
        let out = show_identity(&dvm, conf, cli, env);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let env = [("PRTE_MCA_prte_keep_fqdn_hostnames", "true")];
    let (ok, err) = run(other, &[], &env);
    assert!(
        !ok && err.contains("[not-a-member]"),
        "environment alone applies: {err}"
    );
    let with_key = format!("{other}KeepFQDNHostnames=false\n");
    let (ok, err) = run(&with_key, &[], &env);
    assert!(ok, "prte.conf beats the environment: {err}");
    let cli = ["--prtemca", "prte_keep_fqdn_hostnames", "true"];
    let (ok, err) = run(&with_key, &cli, &[]);
    assert!(
        !ok && err.contains("[not-a-member]"),
        "command line beats prte.conf: {err}"
    );
}

#[test]
fn a_dvm_key_file_others_could_read_stops_the_daemon_before_it_listens() {
    let Some(b) = backend("key file", Needs::AnyBackend) else {
        return;
    };
    let hosts: Vec<String> = ["ctl"].map(String::from).to_vec();
    let dir = std::env::temp_dir().join(format!("dvmlab-keytest-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("dvm.key");
    let conf = PrteConf::new()
        .set("DVMNodes", "ctl")
        .set("DVMControllerHost", "ctl")
        .set("DVMKeyFile", key.display());
    let dvm = Dvm::with_spec("keyfile", b, IpMode::V4, &hosts, &conf, |s| {
        s.mounts.push(dir.clone())
    });
    let out = std::process::Command::new(PCTL)
        .args(["keygen"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let (code, _, err) = run_prted(&dvm, "ctl");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("mode 0640") && err.contains("chmod 600") && err.contains("dvm.key"),
        "{err}"
    );
}
