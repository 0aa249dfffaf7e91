//! dvmlab's harness: starts a cluster of real daemons as separate hosts on this machine and
//! breaks them on purpose.
//!
//! Three backends stand behind one [`Cluster`]:
//! - **netns** (root): every host is a network namespace on a Linux bridge with its own IPv4
//!   and/or IPv6 address, its own UTS host name, and a private mount namespace in which the
//!   cluster's `hosts` and `prte.conf` appear at `/etc/hosts` and `/etc/prte.conf`;
//! - **process** (no root): every host is a process bound to its own loopback address, told its
//!   identity through a documented test-only environment;
//! - **docker**: every host is a container on a Docker network of the cluster's own, with the
//!   host name, hosts entries and DNS Docker gives it; processes are entered into it.
//!
//! The harness knows nothing of the runtime's internals: it writes a `prte.conf` (the spec's
//! format), starts the daemon command it is given on each host, and runs commands on hosts.

pub mod addr;
pub mod agent;
pub mod cluster;
pub mod conf;
pub mod docker;
mod faults;
pub mod gc;
pub mod linkem;
pub mod netns;
pub mod observe;
pub mod partition;
pub mod process;
pub mod procs;
pub mod rundir;
pub mod schedule;
pub mod wait;

pub use cluster::{BackendKind, Cluster, ClusterSpec, HostInfo, IpMode};
pub use conf::PrteConf;
pub use linkem::Impairment;
pub use partition::{Direction, PartitionId};
pub use wait::wait_until;

/// Prefix of every namespace, directory and lock the harness creates, so `gc` finds them.
pub const PREFIX: &str = "dvl";

/// Says loudly that `test` skips and why: a banner on stderr, and a line appended to the file
/// named by `DVMLAB_SKIP_LOG` (which `make test` prints at the end, since test runners hide
/// the output of passing tests). In CI (`CI` set) a skip is a failure instead.
pub fn skip(test: &str, reason: &str) {
    eprintln!("\n!!!! SKIPPED {test}: {reason} !!!!\n");
    if std::env::var_os("CI").is_some() {
        panic!("{test} may not skip in CI: {reason}");
    }
    if let Some(path) = std::env::var_os("DVMLAB_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "SKIPPED {test}: {reason}");
        }
    }
}

/// Whether this process may create network namespaces (root with `ip` available).
pub fn netns_available() -> bool {
    nix::unistd::geteuid().is_root()
        && std::process::Command::new("ip")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
}
