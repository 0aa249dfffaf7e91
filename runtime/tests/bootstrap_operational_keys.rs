//! End to end: the operational `prte.conf` keys (session directories, log files, state
//! logging) have the effect they promise.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use dvmlab_harness::{IpMode, PrteConf};

fn contact(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("contact"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

#[test]
fn dvm_temp_dir_holds_each_daemons_session_and_stop_removes_it() {
    let Some(b) = backend("DVMTempDir", Needs::AnyBackend) else {
        return;
    };
    let hosts: Vec<String> = ["ctl", "n01", "n02"].map(String::from).to_vec();
    let base = PrteConf::new()
        .set("ClusterName", "ops")
        .set("DVMNodes", "n01,n02")
        .set("DVMControllerHost", "ctl");
    let mut dvm = Dvm::new("tempdir", b, IpMode::V4, &hosts, &base);
    let tmp = dvm.cluster.run_dir().join("tmp");
    dvm.cluster
        .set_conf(&base.clone().set("DVMTempDir", tmp.display()).render())
        .unwrap();
    dvm.cluster.start_all().unwrap();
    let s = dvm.wait_formed(Duration::from_secs(10));
    let top = tmp.join("dvmlab.ops-prte-dvm");
    for m in &s.members {
        let c = contact(&top.join(m.rank.to_string()));
        assert!(
            c.starts_with(&format!("ops-prte-dvm.{};tcp://", m.rank)),
            "{c}"
        );
    }
    assert_eq!(contact(&top.join("0")).trim(), s.controller_uri);
    dvm.stop_cleanly(&hosts);
    assert!(
        !top.exists(),
        "session directories are removed on a clean stop"
    );
}

#[test]
fn session_tmp_dir_template_places_each_daemons_session() {
    let Some(b) = backend("SessionTmpDir", Needs::AnyBackend) else {
        return;
    };
    let hosts: Vec<String> = ["ctl", "n01", "n02"].map(String::from).to_vec();
    let base = PrteConf::new()
        .set("DVMNodes", "n01,n02")
        .set("DVMControllerHost", "ctl");
    let mut dvm = Dvm::new("sessdir", b, IpMode::V4, &hosts, &base);
    let sess = dvm.cluster.run_dir().join("sess");
    dvm.cluster
        .set_conf(
            &base
                .clone()
                .set("SessionTmpDir", format!("{}/%h-%r", sess.display()))
                .render(),
        )
        .unwrap();
    dvm.cluster.start_all().unwrap();
    dvm.wait_formed(Duration::from_secs(10));
    for (h, r) in [("ctl", 0), ("n01", 1), ("n02", 2)] {
        let c = contact(&sess.join(format!("{h}-{r}")));
        assert!(c.starts_with(&format!("cluster-prte-dvm.{r};")), "{c}");
    }
    dvm.stop_cleanly(&hosts);
    assert!(!sess.join("n01-1").exists());
}

#[test]
fn log_paths_and_state_logging_keys_control_what_is_written_where() {
    let Some(b) = backend("log keys", Needs::AnyBackend) else {
        return;
    };
    let hosts: Vec<String> = ["ctl", "n01", "n02"].map(String::from).to_vec();
    let base = PrteConf::new()
        .set("DVMNodes", "n01,n02")
        .set("DVMControllerHost", "ctl");
    let mut dvm = Dvm::new("logkeys", b, IpMode::V4, &hosts, &base);
    let logs = dvm.cluster.run_dir().join("logs");
    let conf = base
        .clone()
        .set(
            "ControllerLogPath",
            format!("{}/controller-%h.log", logs.display()),
        )
        .set(
            "PRTEDLogPath",
            format!("{}/prted-%h-%r.log", logs.display()),
        )
        .set("ControllerLogJobState", "true")
        .set("ControllerLogProcState", "false")
        .set("PRTEDLogJobState", "false")
        .set("PRTEDLogProcState", "true");
    dvm.cluster.set_conf(&conf.render()).unwrap();
    dvm.cluster.start_all().unwrap();
    dvm.wait_formed(Duration::from_secs(10));
    dvm.stop_cleanly(&hosts);
    let read = |name: &str| {
        std::fs::read_to_string(logs.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let ctl = read("controller-ctl.log");
    assert!(
        ctl.contains("DVM ready: namespace cluster-prte-dvm, 3 daemons"),
        "{ctl}"
    );
    assert!(
        ctl.contains("DVM job state VM READY"),
        "ControllerLogJobState=true:\n{ctl}"
    );
    assert!(
        !ctl.contains("daemon rank"),
        "ControllerLogProcState=false:\n{ctl}"
    );
    let n01 = read("prted-n01-1.log");
    assert!(
        n01.contains("daemon rank 1 state RUNNING"),
        "PRTEDLogProcState=true:\n{n01}"
    );
    assert!(
        !n01.contains("DVM job state"),
        "PRTEDLogJobState=false:\n{n01}"
    );
    assert!(logs.join("prted-n02-2.log").exists());
    assert!(
        !logs.join("prted-ctl-0.log").exists(),
        "the controller uses ControllerLogPath"
    );
}
