"""`rljob-operator`: run the RLJob operator (kopf) against the current cluster."""

from __future__ import annotations

import logging

import typer

from rljob.infra.cliutil import plain_metavars, version_callback

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None,  # click's plain help: no type tags
                  context_settings={"help_option_names": ["-h", "--help"]})


@app.command()
def main(
    kubeconfig: str = typer.Option(
        None, "--kubeconfig", metavar="FILE",
        help="Talk to the cluster of this kubeconfig (development, outside a cluster). "
             "Default: the pod's service account in a pod, else $KUBECONFIG or "
             "~/.kube/config."),
    context: str = typer.Option(None, "--context", metavar="NAME",
                                help="The kubeconfig context to use."),
    namespace: list[str] = typer.Option(
        [], "--namespace", "-n", envvar="RLJOB_OPERATOR_NAMESPACES",
        help="Watch only these namespaces (repeat; glob patterns allowed). Default: all."),
    peering: str = typer.Option(
        None, envvar="RLJOB_OPERATOR_PEERING",
        help="Peering object name: run as one of several replicas, the highest-priority "
             "one active, the others on standby. Default: standalone."),
    priority: int = typer.Option(0, envvar="RLJOB_OPERATOR_PRIORITY",
                                 help="Peering priority of this replica."),
    interval: float = typer.Option(5.0, envvar="RLJOB_OPERATOR_INTERVAL",
                                   help="Seconds between level-based reconciles of each job "
                                        "(and progress/autoscaler polls)."),
    liveness_port: int = typer.Option(8080, envvar="RLJOB_OPERATOR_LIVENESS_PORT",
                                      help="Serve /healthz on this port (0: off)."),
    metrics_port: int = typer.Option(9090, envvar="RLJOB_OPERATOR_METRICS_PORT",
                                     help="Serve Prometheus /metrics on this port (0: off)."),
    workers: int = typer.Option(16, envvar="RLJOB_OPERATOR_WORKERS",
                                help="Threads running reconciles."),
    capacity_check: bool = typer.Option(
        True, "--capacity-check/--no-capacity-check", envvar="RLJOB_OPERATOR_CAPACITY_CHECK",
        help="Start a job (neither queued by Kueue nor gang-scheduled) only when all its "
             "starting pods fit the nodes' free capacity together (reads nodes and pods "
             "cluster-wide)."),
    network_policy: bool = typer.Option(
        True, "--network-policy/--no-network-policy", envvar="RLJOB_OPERATOR_NETWORK_POLICY",
        help="Give each job a NetworkPolicy: its pods admit only the job's own pods, this "
             "operator (its namespace: $POD_NAMESPACE) and the monitoring namespaces."),
    monitoring_namespace: list[str] = typer.Option(
        [], "--monitoring-namespace", envvar="RLJOB_OPERATOR_MONITORING_NAMESPACES",
        metavar="NAMESPACE", help="A namespace whose pods may scrape the jobs' metrics "
                                  "ports (repeat)."),
    log_level: str = typer.Option("INFO", envvar="RLJOB_OPERATOR_LOG_LEVEL"),
    log_format: str = typer.Option("json", envvar="RLJOB_OPERATOR_LOG_FORMAT",
                                   help="json (structured) or plain."),
    version: bool = typer.Option(False, "--version", is_eager=True,
                                 callback=version_callback("rljob-operator"),
                                 help="Print the version and exit."),
) -> None:
    """Reconcile RLJobs into TransferQueue, rollout and trainer pods."""
    import os

    import kopf

    from rljob.api.builders import NetworkAccess

    from .kube import NoCluster, ensure_peering, load_config

    if log_format not in ("json", "plain"):
        raise typer.BadParameter("use json or plain", param_hint="--log-format")
    try:  # before anything starts: one line when there is no cluster to talk to
        source = load_config(kubeconfig, context)
        created = ensure_peering(peering, namespace) if peering else []
    except NoCluster as exc:
        typer.echo(f"rljob-operator: {exc}", err=True)
        raise typer.Exit(2) from None
    _configure_logging(log_level, log_format, source, created)
    network = NetworkAccess(network_policy, os.environ.get("POD_NAMESPACE") or None,
                            tuple(monitoring_namespace))
    registry = _registry(interval, workers, metrics_port, capacity_check, network)
    kopf.run(
        registry=registry,
        clusterwide=not namespace,
        namespaces=namespace,
        standalone=peering is None,
        peering_name=peering,
        priority=priority,
        liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
    )


def _configure_logging(level: str, fmt: str, source: str, created: list[str]) -> None:
    import kopf

    kopf.configure(verbose=level.upper() == "DEBUG",
                   log_format=kopf.LogFormat.JSON if fmt == "json" else kopf.LogFormat.FULL,
                   log_refkey="rljob" if fmt == "json" else None)
    logging.getLogger().setLevel(level.upper())
    log = logging.getLogger("rljob.operator")
    log.info("cluster: %s", source)
    if created:
        log.info("created peering object(s): %s", ", ".join(created))


def _registry(interval: float, workers: int, metrics_port: int, capacity_check: bool,
              network):
    """The operator's handlers, its settings at start-up and its cluster login."""
    import kopf
    from prometheus_client import start_http_server

    from .handlers import Operator, configure, register
    from .kube import connection_info

    registry = kopf.OperatorRegistry()
    register(registry, Operator(capacity_check=capacity_check, network=network), interval)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_):
        configure(settings, workers)
        if metrics_port:
            start_http_server(metrics_port)

    @kopf.on.login(registry=registry)
    def login(settings: kopf.OperatorSettings, **_):
        return connection_info(settings.networking.trust_env)

    return registry


def run() -> None:
    import typer.main

    cmd = typer.main.get_command(app)
    plain_metavars(cmd)
    cmd(prog_name="rljob-operator")


if __name__ == "__main__":
    run()
