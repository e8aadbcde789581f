"""``nightjar-operator``: run the operator, or print the CRD.

    nightjar-operator run [-n NAMESPACE ...] [--metrics-port 8080] [--liveness http://0.0.0.0:8081/healthz]
                          [--leader-elect [--lease-name nightjar-operator] [--lease-namespace NS]]
    nightjar-operator crd [-o FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading


def _run(args: argparse.Namespace) -> int:
    import kopf

    import nightjar_operator.main  # noqa: F401 - registers the handlers
    from nightjar_operator import metrics as metrics_mod

    if args.metrics_port is not None:
        os.environ["NIGHTJAR_OPERATOR_METRICS_PORT"] = str(args.metrics_port)
        # Every replica serves /metrics from the start, a standby too (nightjar_operator_leader 0):
        # a Service over all replicas then has no target that refuses the scrape.
        metrics_mod.serve(args.metrics_port)
    kopf.configure(verbose=args.verbose)  # kopf's logging setup (our loggers propagate to it)
    metrics_mod.metrics().leader.set(0 if args.leader_elect else 1)

    def operate(stop_flag: threading.Event | None = None) -> None:
        metrics_mod.metrics().leader.set(1)
        # standalone: no kopf peering; with --leader-elect the Lease decides who runs.
        kopf.run(
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace or (),
            liveness_endpoint=args.liveness,
            stop_flag=stop_flag,
        )

    if args.webhook_port:
        # Before the election: every replica, standby or leader, answers admission reviews.
        from nightjar_operator.handlers import webhook
        from nightjar_operator.handlers.k8s import Api, make_api_client

        webhook.start(webhook.WebhookSettings(
            port=args.webhook_port, cert_dir=args.webhook_cert_dir, secret=args.webhook_secret,
            configuration=args.webhook_configuration, hosts=tuple(args.webhook_host)), Api(make_api_client()))
    if not args.leader_elect:
        operate()
        return 0
    from nightjar_operator.handlers import leader
    from nightjar_operator.handlers.k8s import make_api_client

    lease = leader.LeaseSettings(
        name=args.lease_name,
        namespace=args.lease_namespace or leader.default_namespace(),
        identity=leader.default_identity(),
        lease_duration_s=args.lease_duration,
        renew_deadline_s=args.renew_deadline,
        retry_period_s=args.retry_period,
    )
    return leader.run_elected(lease, make_api_client(), operate, liveness=args.liveness)


def _crd(args: argparse.Namespace) -> int:
    from nightjar_operator.crd.schema import crd_yaml

    text = crd_yaml()
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nightjar-operator", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the kopf operator (all namespaces unless -n is given)")
    run.add_argument("-n", "--namespace", action="append", default=[], help="watch only this namespace (repeatable)")
    run.add_argument("--metrics-port", type=int, default=int(os.environ.get("NIGHTJAR_OPERATOR_METRICS_PORT", "8080")),
                     help="serve Prometheus metrics on this port (0: off)")
    run.add_argument("--liveness", default=None, help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz")
    run.add_argument("-v", "--verbose", action="store_true")
    run.add_argument("--leader-elect", action="store_true",
                     help="run only while holding a coordination.k8s.io Lease (for more than one replica)")
    run.add_argument("--lease-name", default="nightjar-operator", help="name of the Lease")
    run.add_argument("--lease-namespace", default=None,
                     help="namespace of the Lease (default: $POD_NAMESPACE, the pod's own namespace)")
    run.add_argument("--lease-duration", type=int, default=15, help="seconds a follower waits after the last renewal")
    run.add_argument("--renew-deadline", type=int, default=10, help="seconds the leader keeps retrying a renewal")
    run.add_argument("--retry-period", type=int, default=2, help="seconds between tries")
    run.add_argument("--webhook-port", type=int, default=0,
                     help="serve the validating admission webhook (HTTPS) on this port (0: off)")
    run.add_argument("--webhook-cert-dir", default=None,
                     help="directory with tls.crt and tls.key (e.g. cert-manager's Secret, mounted)")
    run.add_argument("--webhook-secret", default=None,
                     help="NAMESPACE/NAME of the Secret where the replicas keep a shared self-signed certificate")
    run.add_argument("--webhook-configuration", default=None,
                     help="ValidatingWebhookConfiguration whose caBundle the operator keeps (with --webhook-secret)")
    run.add_argument("--webhook-host", action="append", default=[],
                     help="DNS name or IP of the webhook Service, put in the self-signed certificate (repeatable)")
    run.set_defaults(func=_run)
    crd = sub.add_parser("crd", help="print the NightjarDeployment CRD (YAML) generated from the models")
    crd.add_argument("-o", "--output", help="write to this file instead of stdout")
    crd.set_defaults(func=_crd)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
