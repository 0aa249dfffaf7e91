//! The configuration file contract: what is ignored, what is fatal, and what wins over what.

use std::time::Duration;

use dvmlab_harness::PrteConf;

use super::{conf, formed_with, with_ctl, FORM};
use crate::outcome::{check, fail, Problem, Verdict};
use crate::sut::{node_names, Ctx, Dvm};

/// How long an aborting daemon may take to give up.
const ABORT_WITHIN: Duration = Duration::from_secs(15);

/// Runs the daemon on `host` with configuration `text`; it must exit non-zero within
/// [`ABORT_WITHIN`]. Aspect `diagnostic`: what it printed mentions every one of `names`.
fn aborts(ctx: &Ctx, label: &str, text: &str, names: &[&str]) -> Verdict {
    let nodes = node_names(2);
    let hosts = with_ctl(&nodes);
    let dvm = Dvm::new(ctx, label, &hosts, &conf(ctx, &nodes))?;
    if text.is_empty() {
        dvm.cluster
            .remove_host_conf("n01")
            .map_err(|e| Problem::Unresolved(format!("removing n01's prte.conf: {e}")))?;
    } else {
        dvm.cluster
            .set_host_conf("n01", text)
            .map_err(|e| Problem::Unresolved(format!("writing n01's prte.conf: {e}")))?;
    }
    let (code, out, err) = dvm.run_daemon_once("n01", ABORT_WITHIN)?;
    let said = format!("{out}{err}");
    let shown = if text.is_empty() {
        "no configuration file".to_string()
    } else {
        format!("configuration:\n{text}")
    };
    match code {
        None => {
            return Err(fail(
                format!("the daemon aborts its bootstrap ({label})"),
                format!("still running after {ABORT_WITHIN:?}; {shown}\noutput: {said}"),
            ))
        }
        Some(0) => {
            return Err(fail(
                format!("the daemon aborts with a non-zero status ({label})"),
                format!("exit status 0; {shown}\noutput: {said}"),
            ))
        }
        Some(_) => {}
    }
    ctx.aspect(
        "diagnostic",
        names.iter().try_for_each(|n| {
            check(
                said.contains(n),
                format!("a diagnostic naming {n:?} ({label})"),
                format!("exit {code:?}, output: {said:?}; {shown}"),
            )
        }),
    );
    ctx.note(format!("{label}: exit {code:?}: {}", said.trim()));
    Ok(())
}

const NODES: &str = "DVMNodes=n01,n02";
const CTL: &str = "DVMControllerHost=ctl";

pub fn a_line_without_equals_aborts_bootstrap(ctx: &Ctx) -> Verdict {
    aborts(
        ctx,
        "no-equals",
        &format!("{NODES}\nDVMRadix 4\n{CTL}\n"),
        &["DVMRadix 4"],
    )
}

pub fn an_empty_key_aborts_bootstrap(ctx: &Ctx) -> Verdict {
    aborts(ctx, "empty-key", &format!("{NODES}\n=7\n{CTL}\n"), &["=7"])
}

pub fn an_empty_value_aborts_bootstrap(ctx: &Ctx) -> Verdict {
    aborts(
        ctx,
        "empty-value",
        &format!("{NODES}\nClusterName=\n{CTL}\n"),
        &["ClusterName"],
    )
}

pub fn a_missing_dvmnodes_aborts_bootstrap(ctx: &Ctx) -> Verdict {
    aborts(ctx, "missing-dvmnodes", &format!("{CTL}\n"), &["DVMNodes"])
}

pub fn a_missing_controller_host_aborts_bootstrap(ctx: &Ctx) -> Verdict {
    aborts(
        ctx,
        "missing-controller",
        &format!("{NODES}\n"),
        &["DVMControllerHost"],
    )
}

pub fn a_malformed_node_range_aborts_bootstrap(ctx: &Ctx) -> Verdict {
    aborts(
        ctx,
        "bad-range",
        &format!("DVMNodes=n[2:1-\n{CTL}\n"),
        &["n[2:1-"],
    )
}

pub fn a_duplicate_node_aborts_bootstrap(ctx: &Ctx) -> Verdict {
    aborts(
        ctx,
        "duplicate-node",
        &format!("DVMNodes=n01,n02,n02\n{CTL}\n"),
        &["n02"],
    )
}

pub fn a_missing_conf_file_aborts_bootstrap(ctx: &Ctx) -> Verdict {
    let name = std::path::Path::new(&ctx.profile.daemon.conf_path)
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    aborts(ctx, "missing-file", "", &[&name])
}

pub fn a_host_outside_dvmnodes_aborts_and_never_joins(ctx: &Ctx) -> Verdict {
    let nodes = node_names(2);
    let mut hosts = with_ctl(&nodes);
    hosts.push("stranger".into());
    let mut dvm = Dvm::new(ctx, "stranger", &hosts, &conf(ctx, &nodes))?;
    let members = with_ctl(&nodes);
    dvm.start_many(&members)?;
    dvm.wait_formed(FORM)?;
    let (code, out, err) = dvm.run_daemon_once("stranger", ABORT_WITHIN)?;
    let said = format!("{out}{err}");
    check(
        matches!(code, Some(c) if c != 0),
        "the daemon on a host outside DVMNodes aborts with a non-zero status",
        format!("exit {code:?}, output: {said:?}"),
    )?;
    check(
        said.contains("stranger"),
        "its diagnostic names the host",
        format!("output: {said:?}"),
    )?;
    let s = dvm.status_now("the DVM still answers")?;
    formed_with(&dvm, &s, &members)?;
    check(
        dvm.observe()?
            .values()
            .all(|up| !up.iter().any(|h| h == "stranger")),
        "no daemon is connected to stranger",
        format!("{:?}", dvm.observe()?),
    )?;
    dvm.stop()
}

/// Forms a DVM of `ctl` and two nodes with `c`: the premise is that it forms with them.
fn forms_with(ctx: &Ctx, label: &str, c: &PrteConf) -> Verdict {
    let nodes = node_names(2);
    let hosts = with_ctl(&nodes);
    let mut dvm = Dvm::new(ctx, label, &hosts, c)?;
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    formed_with(&dvm, &s, &hosts)?;
    dvm.stop()
}

pub fn comments_and_blank_lines_are_ignored(ctx: &Ctx) -> Verdict {
    let nodes = node_names(2);
    let c = conf(ctx, &nodes)
        .raw("")
        .raw("# a comment line, DVMNodes=nobody")
        .raw("#DVMControllerHost=nobody")
        .raw("");
    forms_with(ctx, "comments", &c)
}

pub fn an_unknown_key_is_ignored(ctx: &Ctx) -> Verdict {
    let nodes = node_names(2);
    let c = conf(ctx, &nodes).raw("DVMFutureKnob=something newer daemons understand");
    forms_with(ctx, "unknown-key", &c)
}

/// Forms a DVM with `c`, the MCA environment `env` and command-line words `cli` on every
/// daemon (and tool), and checks every host listens on `port`.
fn forms_on_port(
    ctx: &Ctx,
    label: &str,
    c: &PrteConf,
    env: Option<(String, String)>,
    cli: Vec<String>,
    port: u16,
) -> Verdict {
    let nodes = node_names(2);
    let hosts = with_ctl(&nodes);
    let mut dvm = Dvm::with(ctx, label, &hosts, c, |spec| {
        spec.env.extend(env.clone());
        spec.daemon.extend(cli.iter().cloned());
    })?;
    dvm.tool_args = cli.clone();
    dvm.port = port;
    dvm.start_all()?;
    dvm.wait_formed(FORM)?;
    for h in &hosts {
        check(
            dvm.listens_on(h, port)?,
            format!("{label}: the daemon on {h} listens on port {port}"),
            dvm.tcp_sockets(h)?,
        )?;
    }
    dvm.stop()
}

pub fn conf_file_beats_mca_env_and_command_line_beats_both(ctx: &Ctx) -> Verdict {
    let Some(m) = ctx.profile.mca.clone() else {
        return Err(Problem::Unsupported(
            "the profile has no [mca] section (how to give MCA parameters)".into(),
        ));
    };
    let env_var = ctx.profile.mca_env(&m.port).unwrap_or_default();
    let cli = ctx.profile.mca_cli(&m.port, "7903").unwrap_or_default();
    let nodes = node_names(2);
    let base = conf(ctx, &nodes);
    let env = Some((env_var, "7902".to_string()));
    // Without the file setting it, the MCA variable must move the port, or the precedence
    // runs below would prove nothing.
    forms_on_port(ctx, "env-only", &base, env.clone(), Vec::new(), 7902).map_err(|p| match p {
        Problem::Fail { expected, observed } => Problem::Unresolved(format!(
            "the profile's MCA variable does not set DVMPort's parameter on its own, so precedence cannot be judged: expected {expected}; observed {observed}"
        )),
        other => other,
    })?;
    let with_port = base.set("DVMPort", 7901);
    ctx.aspect(
        "file_over_mca",
        forms_on_port(
            ctx,
            "conf-over-env",
            &with_port,
            env.clone(),
            Vec::new(),
            7901,
        ),
    );
    ctx.aspect(
        "cli_over_all",
        forms_on_port(ctx, "cli-over-all", &with_port, env, cli, 7903),
    );
    Ok(())
}
