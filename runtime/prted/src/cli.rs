//! `prted`: the DVM daemon. Started identically on every node with `--bootstrap`.

use std::process::ExitCode;

use clap::Parser;
use dvmlab_host::bootstrap::Prepared;

/// A DVM daemon formed by the bootstrap method.
///
/// The same `prted --bootstrap` runs on every node. Each daemon reads prte.conf
/// (/etc/prte.conf, or the file named by the prte_bootstrap_conf parameter), derives its
/// namespace and rank from DVMNodes, elects itself controller if it runs on
/// DVMControllerHost, and connects to its parent in the radix routing tree.
///
/// Parameters (`--prtemca NAME VALUE`, or the environment variable PRTE_MCA_<NAME>):
/// prte_bootstrap_conf, prte_dvm_port, prte_if_include, prte_keep_fqdn_hostnames,
/// rml_base_radix, prte_bootstrap_retry_initial_delay, dvmlab_heartbeat_interval. For the
/// keys that seed them
/// (DVMPort, DVMNetworks, KeepFQDNHostnames, DVMRadix) the command line beats prte.conf,
/// which beats the environment.
///
/// Exit status: 0 after a clean stop or SIGTERM/SIGINT; 1 for a configuration diagnostic;
/// 2 for a usage error; 3 when the daemon cannot run (port in use, session directory).
#[derive(Parser, Debug)]
#[command(name = "prted", version, verbatim_doc_comment)]
struct Cli {
    /// Form (or join) the DVM described by prte.conf. Required: the only mode prted has.
    #[arg(long)]
    bootstrap: bool,

    /// Print the identity this host derives (namespace, rank, role, URIs) and exit without
    /// joining.
    #[arg(long)]
    show_identity: bool,

    /// With --show-identity: print JSON.
    #[arg(long, requires = "show_identity")]
    json: bool,

    /// Set an MCA-style parameter; may be repeated.
    #[arg(long, num_args = 2, value_names = ["NAME", "VALUE"], action = clap::ArgAction::Append)]
    prtemca: Vec<String>,
}

/// Raises the soft limit on open descriptors so that the connection limit, not the process's
/// descriptor limit, is what a flood of connections meets (job processes get the raised
/// limit too, as they would from a login shell with a raised limit).
fn enough_descriptors() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let want = (dvmlab_proto::limits::MAX_CONNECTIONS as u64) * 2 + 256;
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < want {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, want.min(hard), hard);
        }
    }
}

/// `prted`'s command line, run by the `prted` binary.
pub fn main() -> ExitCode {
    // Before anything opens a file: the job processes' barrier descriptor.
    let slot = match crate::BarrierSlot::claim() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("prted: cannot reserve descriptor 3 for job processes: {e}");
            return ExitCode::from(3);
        }
    };
    let cli = Cli::parse();
    enough_descriptors();
    if !cli.bootstrap {
        eprintln!("prted: only the bootstrap method is supported; run `prted --bootstrap`");
        return ExitCode::from(2);
    }
    let pairs = cli
        .prtemca
        .chunks(2)
        .map(|c| (c[0].clone(), c.get(1).cloned().unwrap_or_default()))
        .collect();
    let params = dvmlab_host::conf_file::process_params(pairs);
    let prepared = match Prepared::new(&params) {
        Ok(p) => p,
        Err(d) => {
            eprintln!("prted: {d}");
            return ExitCode::from(1);
        }
    };
    // The key is checked before anything listens: a key file anyone could read is a
    // configuration error, not a reason to run in the open.
    let key = match &prepared.settings.key_file {
        None => None,
        Some((path, _)) => match dvmlab_host::keyfile::load(path) {
            Ok(k) => Some(k),
            Err(e) => {
                eprintln!("prted: {e}");
                return ExitCode::from(1);
            }
        },
    };
    if cli.show_identity {
        let r = prepared.report();
        if cli.json {
            match serde_json::to_string_pretty(&r) {
                Ok(s) => dvmlab_host::outln!("{s}"),
                Err(e) => {
                    eprintln!("prted: {e}");
                    return ExitCode::from(3);
                }
            }
        } else {
            dvmlab_host::outln!("namespace   {}", r.namespace);
            dvmlab_host::outln!("rank        {}", r.rank);
            dvmlab_host::outln!("role        {:?}", r.role);
            dvmlab_host::outln!("host        {}", r.host);
            dvmlab_host::outln!("uri         {}", r.uri);
            dvmlab_host::outln!(
                "daemons     {} (controller listed in DVMNodes: {})",
                r.daemons,
                r.controller_listed
            );
            dvmlab_host::outln!("radix       {}", r.radix);
            match (r.parent, &r.parent_uri) {
                (Some(p), Some(u)) => dvmlab_host::outln!("parent      {p} ({u})"),
                _ => dvmlab_host::outln!("parent      none (this is the controller)"),
            }
            dvmlab_host::outln!("conf        {}", r.conf);
        }
        return ExitCode::SUCCESS;
    }
    let log_file = crate::log_path(&prepared);
    if let Err(e) = crate::init_logging(log_file.as_deref()) {
        eprintln!("prted: cannot open log file: {e}");
        return ExitCode::from(3);
    }
    // Forked first, while this process has one thread.
    let reaper = crate::Reaper::start().unwrap_or_else(|e| {
        eprintln!(
            "prted: cannot start the job reaper ({e}); job processes may outlive a killed daemon"
        );
        crate::Reaper::none()
    });
    let rt = match crate::daemon_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("prted: cannot start the runtime: {e}");
            return ExitCode::from(3);
        }
    };
    match rt.block_on(crate::run(prepared, key, reaper, slot)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("prted: {e}");
            ExitCode::from(3)
        }
    }
}
