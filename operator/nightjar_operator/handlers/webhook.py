"""The validating admission webhook's server and certificates (the decision is reconcile/admission.py).

Every operator replica serves it, leader or standby: the check reads nothing from the cluster (it
is ``validate()`` over the object in the request), so a standby answering is harmless, and applies
keep being checked through a leader handover. That is also why kopf's ``@kopf.on.validate`` is not
used: kopf serves its admission handlers from its operator loop, which only the leader runs. The
HTTPS endpoint is kopf's ``WebhookServer`` all the same (TLS, and a reload when the certificate
files change), driven here with our own handler.

Certificates, chosen by the chart (``webhook.certificates``):

* ``cert-manager``: a Certificate's Secret is mounted (``--webhook-cert-dir``, files ``tls.crt`` and
  ``tls.key``) and cert-manager's CA injector fills the configuration's ``caBundle``.
* ``operator``: the replicas share one self-signed CA and serving certificate in a Secret
  (``--webhook-secret``, created empty by the chart): the first to start fills it (a concurrent
  writer gets 409 and reads the winner's), every replica serves from it and keeps the configuration's ``caBundle`` set
  (``--webhook-configuration``). The CA lives ten years; the serving certificate one year and is
  renewed, under the same CA, when it has less than 60 days left (checked at start and twice a day),
  so the ``caBundle`` does not change under a replica that has not reloaded yet.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from nightjar_operator.handlers.k8s import Api
from nightjar_operator.handlers.settings import pod_policy
from nightjar_operator.metrics import metrics
from nightjar_operator.reconcile.admission import decide, response

log = logging.getLogger("nightjar.operator.webhook")

CA_DAYS = 3650
CERT_DAYS = 365
RENEW_BEFORE = dt.timedelta(days=60)
RECHECK_S = 12 * 3600


@dataclass(frozen=True)
class WebhookSettings:
    port: int
    addr: str = "0.0.0.0"
    cert_dir: str | None = None  # cert-manager: tls.crt / tls.key mounted from its Secret
    secret: str | None = None  # operator-managed: "namespace/name" of the Secret with ca.crt, tls.crt, tls.key
    configuration: str | None = None  # operator-managed: the ValidatingWebhookConfiguration whose caBundle we keep
    hosts: tuple[str, ...] = ()  # the serving certificate's DNS names / IPs (the webhook Service's names)


@dataclass(frozen=True)
class Material:
    ca: bytes
    cert: bytes
    key: bytes


# ------------------------------------------------------------------------------ certificates (pure)
def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _name(cn: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))


def _sans(hosts: tuple[str, ...]) -> Any:
    from cryptography import x509

    names: list[Any] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def new_ca(now: dt.datetime) -> tuple[bytes, bytes]:
    """(key PEM, certificate PEM) of a self-signed CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("nightjar-operator-webhook-ca")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))  # fmt: skip
    return _pem_key(key), cert.public_bytes(serialization.Encoding.PEM)


def new_serving_cert(ca_key_pem: bytes, ca_pem: bytes, hosts: tuple[str, ...], now: dt.datetime) -> tuple[bytes, bytes]:
    """(key PEM, certificate PEM) for ``hosts``, signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    ca = x509.load_pem_x509_certificate(ca_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    # The names are in the SANs (what TLS clients check); a CN is at most 64 characters.
    cert = (x509.CertificateBuilder().subject_name(_name("nightjar-operator-webhook")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=CERT_DAYS))
            .add_extension(_sans(hosts), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]  # fmt: skip
    return _pem_key(key), cert.public_bytes(serialization.Encoding.PEM)


def ca_usable(ca_pem: bytes, now: dt.datetime, margin: dt.timedelta = RENEW_BEFORE) -> bool:
    from cryptography import x509

    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError:
        return False
    return bool(ca.not_valid_after_utc - margin > now)


def usable(cert_pem: bytes, ca_pem: bytes, hosts: tuple[str, ...], now: dt.datetime,
           margin: dt.timedelta = RENEW_BEFORE) -> bool:
    """The serving certificate is the CA's, covers every host and has ``margin`` left."""
    from cryptography import x509

    try:
        cert, ca = x509.load_pem_x509_certificate(cert_pem), x509.load_pem_x509_certificate(ca_pem)
        cert.verify_directly_issued_by(ca)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except Exception:  # noqa: BLE001 - anything unreadable or foreign is simply renewed
        return False
    have = {str(n) for n in sans.get_values_for_type(x509.DNSName)} | {
        str(n) for n in sans.get_values_for_type(x509.IPAddress)}
    return set(hosts) <= have and cert.not_valid_after_utc - margin > now and ca_usable(ca_pem, now, margin)


# ------------------------------------------------------------------------------------------- I/O
def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def ensure_material(api: Api, secret: str, hosts: tuple[str, ...]) -> Material:
    """The shared CA and serving certificate from the Secret, created or renewed when needed."""
    namespace, name = secret.split("/", 1)
    path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
    for _ in range(5):
        try:
            live: dict[str, Any] | None = api.request("GET", path)
        except ApiException as e:
            if e.status != 404:
                raise
            live = None
        data = {k: base64.b64decode(v) for k, v in ((live or {}).get("data") or {}).items()}
        now = _now()
        if {"ca.crt", "ca.key", "tls.crt", "tls.key"} <= set(data) and usable(data["tls.crt"], data["ca.crt"], hosts, now):
            return Material(data["ca.crt"], data["tls.crt"], data["tls.key"])
        ca_ok = {"ca.crt", "ca.key"} <= set(data) and ca_usable(data["ca.crt"], now)
        ca_key, ca = (data["ca.key"], data["ca.crt"]) if ca_ok else new_ca(now)
        key, cert = new_serving_cert(ca_key, ca, hosts, now)
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"app.kubernetes.io/managed-by": "nightjar-operator"}},
                "data": {"ca.crt": _b64(ca), "ca.key": _b64(ca_key), "tls.crt": _b64(cert), "tls.key": _b64(key)}}
        try:
            if live is None:  # the chart creates it (empty); a run outside the chart creates it here
                api.request("POST", f"/api/v1/namespaces/{namespace}/secrets", body)
            else:  # keep the chart's labels and type; fill or renew the data
                lm = live["metadata"]
                body["metadata"] = {"name": name, "namespace": namespace, "resourceVersion": lm["resourceVersion"],
                                    "labels": lm.get("labels") or {}, "annotations": lm.get("annotations") or {}}
                body["type"] = live.get("type", "Opaque")
                api.request("PUT", path, body)
        except ApiException as e:
            if e.status == 409:  # another replica wrote it first: use theirs
                continue
            raise
        log.info("webhook certificate %s for %s written to Secret %s (CA %s)", "renewed" if live else "created",
                 ", ".join(hosts), secret, "kept" if ca_ok else "new")
        metrics().webhook_certificates.labels("renewed" if live else "created").inc()
        return Material(ca, cert, key)
    raise RuntimeError(f"Secret {secret}: kept changing while the webhook certificate was written")


def ensure_ca_bundle(api: Api, configuration: str, ca: bytes) -> bool:
    """Set every webhook's caBundle in the configuration to ``ca``; True when something changed."""
    path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{configuration}"
    vwc = api.request("GET", path)
    want = _b64(ca)
    ops = [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": want}
           for i, w in enumerate(vwc.get("webhooks") or []) if (w.get("clientConfig") or {}).get("caBundle") != want]
    if not ops:
        return False
    ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": vwc["metadata"]["resourceVersion"]})
    api.request("PATCH", path, ops, content_type="application/json-patch+json")
    log.info("caBundle of ValidatingWebhookConfiguration %s set", configuration)
    return True


def _write(directory: str, material: Material) -> tuple[str, str, str]:
    paths = tuple(os.path.join(directory, f) for f in ("ca.crt", "tls.crt", "tls.key"))
    for p, content in zip(paths, (material.ca, material.cert, material.key), strict=True):
        if os.path.exists(p) and open(p, "rb").read() == content:
            continue  # unchanged: no needless reload of the server
        tmp = p + ".new"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(content)
        os.replace(tmp, p)  # atomic: the server never reads half a file
    return paths  # type: ignore[return-value]


async def _handle(request: dict[str, Any], **_: Any) -> dict[str, Any]:
    req = request.get("request") or {}
    decision = decide(req, pod_policy())
    metrics().admission_reviews.labels(str(req.get("operation", "")), decision.reason).inc()
    if not decision.allowed:
        log.info("refused %s of %s/%s: %s", req.get("operation"), req.get("namespace"), req.get("name"),
                 "; ".join(map(str, decision.errors)))
    return response(req, decision)


@dataclass
class Serving:
    """A running webhook server (one per replica); ``stop`` is for tests and clean shutdowns."""

    thread: threading.Thread
    loop: asyncio.AbstractEventLoop
    task: asyncio.Task[None]
    stopped: threading.Event

    def stop(self) -> None:
        self.stopped.set()
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(10)


def start(settings: WebhookSettings, api: Api | None = None) -> Serving:
    """Serve the webhook from a daemon thread (its own event loop: the same in a standby replica,
    which runs no kopf loop, and in the leader). Certificates are ready before this returns."""
    stopped = threading.Event()
    if settings.cert_dir:
        cafile: str | None = os.path.join(settings.cert_dir, "ca.crt")
        certfile, pkeyfile = (os.path.join(settings.cert_dir, f) for f in ("tls.crt", "tls.key"))
        if not os.path.exists(cafile or ""):
            cafile = None
    elif settings.secret:
        assert api is not None, "operator-managed certificates need the API"
        work = tempfile.mkdtemp(prefix="nightjar-webhook-")
        material = ensure_material(api, settings.secret, settings.hosts)
        cafile, certfile, pkeyfile = _write(work, material)
        if settings.configuration:
            ensure_ca_bundle(api, settings.configuration, material.ca)
        threading.Thread(target=_renew, args=(api, settings, work, stopped), name="webhook-certs", daemon=True).start()
    else:
        raise ValueError("the webhook needs --webhook-cert-dir (cert-manager) or --webhook-secret (operator-managed)")
    server = kopf.WebhookServer(addr=settings.addr, port=settings.port, certfile=certfile, pkeyfile=pkeyfile,
                                cafile=cafile, file_check_interval=30.0)

    async def serve() -> None:
        async with server:
            async for config in server(_handle):
                log.info("admission webhook serving on :%d (%s)", settings.port, config.get("url"))

    loop = asyncio.new_event_loop()
    task = loop.create_task(serve())

    def run() -> None:
        try:
            loop.run_until_complete(task)
        except asyncio.CancelledError:
            pass
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="admission-webhook", daemon=True)
    thread.start()
    return Serving(thread, loop, task, stopped)


def _renew(api: Api, settings: WebhookSettings, work: str, stopped: threading.Event) -> None:
    """Twice a day: renew the shared certificate if due (any replica may), reload its files."""
    assert settings.secret is not None
    while not stopped.wait(RECHECK_S):
        try:
            material = ensure_material(api, settings.secret, settings.hosts)
            _write(work, material)
            if settings.configuration:
                ensure_ca_bundle(api, settings.configuration, material.ca)
        except Exception as e:  # noqa: BLE001 - the current certificate keeps serving; retried next time
            log.warning("webhook certificate check failed: %s", e)
