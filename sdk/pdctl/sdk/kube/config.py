"""Where the Kubernetes API server is and how to authenticate to it (no client library).

Two sources, as ``kubectl`` and client-go have them:

* **in a pod**: ``KUBERNETES_SERVICE_HOST``/``_PORT`` and the service account's token,
  CA and namespace under ``/var/run/secrets/kubernetes.io/serviceaccount`` (the token is
  re-read before each request: kubelet rotates bound tokens in place);
* **a kubeconfig**: ``--k8s-kubeconfig``, else ``$KUBECONFIG`` (files joined by ``:``,
  the first file that sets a name wins, as kubectl merges them), else ``~/.kube/config``;
  its current context (or the one named): the cluster's ``server``,
  ``certificate-authority(-data)``, ``insecure-skip-tls-verify``; the user's ``token``,
  ``tokenFile``, ``client-certificate(-data)``/``client-key(-data)`` or an ``exec``
  credential plugin (``aws eks get-token``, ``gke-gcloud-auth-plugin``: its
  ``ExecCredential`` answer's ``status.token`` or client certificate).

Everything that is wrong is a :class:`KubeConfigError` naming the file, the entry and the
field, and what to do.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdctl.sdk.errors import PdctlError

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
EXEC_TIMEOUT_S = 30.0


class KubeError(PdctlError):
    """The Kubernetes source cannot reach, authenticate to or read from the API server."""


class KubeConfigError(KubeError):
    """No usable credentials: no service account, no kubeconfig, or one that is wrong."""


@dataclass
class KubeConfig:
    """One API server and one identity. ``source`` says where they were read from."""

    server: str
    source: str
    namespace: str = "default"
    ca_file: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    token: str | None = None
    token_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    exec_spec: dict[str, Any] | None = None
    user: str = "?"
    _exec_token: tuple[str, float] | None = field(default=None, repr=False)

    def ssl_context(self) -> ssl.SSLContext:
        """TLS for the API server: its CA (else the system's), a client certificate."""
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_data is not None:
            try:
                ctx = ssl.create_default_context(cadata=self.ca_data.decode("ascii"))
            except (ssl.SSLError, ValueError, UnicodeDecodeError) as e:
                raise KubeConfigError(
                    f"{self.source}: certificate-authority-data is not a PEM CA ({e}); "
                    "copy it again from the cluster's kubeconfig"
                ) from None
        elif self.ca_file is not None:
            try:
                ctx = ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as e:
                raise KubeConfigError(
                    f"{self.source}: certificate-authority {self.ca_file!r} does not load "
                    f"({e}); point it at the cluster's CA bundle"
                ) from None
        else:
            ctx = ssl.create_default_context()
        cert, key = self.cert_data, self.key_data
        if cert is None and self.exec_spec is not None and self.token is None:
            cert, key = self._exec_cert()
        if cert is not None:
            _load_client_cert(ctx, cert, key, self.source)
        return ctx

    def headers(self, refresh: bool = False) -> dict[str, str]:
        """The ``Authorization`` header for the next request (empty without a token)."""
        token = self.token
        if token is None and self.token_file is not None:
            try:
                token = Path(self.token_file).read_text().strip()
            except OSError as e:
                raise KubeConfigError(
                    f"{self.source}: the token file {self.token_file!r} cannot be read ({e})"
                ) from None
        if token is None and self.exec_spec is not None:
            token = self._exec_bearer(refresh)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def forget_token(self) -> None:
        """The server refused the exec plugin's token: the next request runs it again."""
        self._exec_token = None

    # -- exec credential plugins (client.authentication.k8s.io ExecCredential)

    def _run_exec(self) -> dict[str, Any]:
        spec = self.exec_spec or {}
        cmd = [str(spec.get("command", "")), *map(str, spec.get("args") or [])]
        env = dict(os.environ)
        for e in spec.get("env") or []:
            if isinstance(e, dict) and "name" in e:
                env[str(e["name"])] = str(e.get("value", ""))
        info = {"apiVersion": spec.get("apiVersion"), "kind": "ExecCredential"}
        env["KUBERNETES_EXEC_INFO"] = json.dumps({**info, "spec": {"interactive": False}})
        where = f"{self.source}: users[{self.user}].exec ({cmd[0]!r})"
        try:
            done = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=EXEC_TIMEOUT_S, check=False
            )
        except FileNotFoundError:
            hint = spec.get("installHint") or "install it or fix the kubeconfig's exec.command"
            raise KubeConfigError(f"{where} was not found: {hint}") from None
        except subprocess.TimeoutExpired:
            raise KubeConfigError(f"{where} did not answer within {EXEC_TIMEOUT_S:g} s") from None
        if done.returncode != 0:
            err = (done.stderr or done.stdout).strip()[-400:]
            raise KubeConfigError(f"{where} failed (exit {done.returncode}): {err}")
        try:
            status = json.loads(done.stdout)["status"]
            if not isinstance(status, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise KubeConfigError(
                f"{where} did not print an ExecCredential with a status object"
            ) from None
        return status

    def _exec_bearer(self, refresh: bool) -> str | None:
        if self._exec_token is not None and not refresh and time.time() < self._exec_token[1]:
            return self._exec_token[0]
        status = self._run_exec()
        token = status.get("token")
        if not isinstance(token, str) or not token:
            return None
        self._exec_token = (token, _expiry(status.get("expirationTimestamp")))
        return token

    def _exec_cert(self) -> tuple[bytes | None, bytes | None]:
        status = self._run_exec()
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        if isinstance(status.get("token"), str):
            self._exec_token = (status["token"], _expiry(status.get("expirationTimestamp")))
        if isinstance(cert, str) and isinstance(key, str):
            return cert.encode(), key.encode()
        return None, None


def _expiry(stamp: Any) -> float:
    """Unix time a token expires (a minute early); a year away when not said."""
    if isinstance(stamp, str):
        from datetime import datetime

        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - 60
        except ValueError:
            pass
    return time.time() + 365 * 86400


def _load_client_cert(ctx: ssl.SSLContext, cert: bytes, key: bytes | None, source: str) -> None:
    """``ssl`` loads certificates from files only: write them to a private temporary
    directory, load, and remove them at once."""
    with tempfile.TemporaryDirectory(prefix="pdctl-kube-") as d:
        c, k = Path(d, "cert.pem"), Path(d, "key.pem")
        c.write_bytes(cert)
        c.chmod(0o600)
        if key is not None:
            k.write_bytes(key)
            k.chmod(0o600)
        try:
            ctx.load_cert_chain(str(c), str(k) if key is not None else None)
        except (ssl.SSLError, OSError) as e:
            raise KubeConfigError(
                f"{source}: the client certificate and key do not load ({e}); check "
                "client-certificate(-data) and client-key(-data)"
            ) from None


# ---------------------------------------------------------------- in a pod


def in_cluster(sa_dir: str = SERVICE_ACCOUNT_DIR) -> KubeConfig | None:
    """The pod's own service account, or None outside a pod."""
    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST"),
        os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
    )
    token = Path(sa_dir, "token")
    if not host or not token.is_file():
        return None
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 service address
    ns_file = Path(sa_dir, "namespace")
    ca = Path(sa_dir, "ca.crt")
    return KubeConfig(
        server=f"https://{host}:{port}",
        source=f"the pod's service account ({sa_dir})",
        namespace=ns_file.read_text().strip() if ns_file.is_file() else "default",
        ca_file=str(ca) if ca.is_file() else None,
        token_file=str(token),
        user="the pod's service account",
    )


# ---------------------------------------------------------------- kubeconfig


def _read_doc(path: Path) -> dict[str, Any]:
    text = path.read_text()
    try:
        doc: Any = json.loads(text)
    except ValueError:
        try:
            import yaml  # type: ignore[import-untyped, unused-ignore]
        except ImportError:  # pragma: no cover - PyYAML ships with the k8s extra
            raise KubeConfigError(
                f"{path} is YAML: reading it needs PyYAML (pip install 'pdctl[k8s]')"
            ) from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise KubeConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise KubeConfigError(f"{path} is not a kubeconfig (no mapping at the top)")
    return doc


def _named(docs: list[tuple[Path, dict[str, Any]]], kind: str) -> dict[str, tuple[Path, Any]]:
    """name → (file, entry) for ``clusters``/``users``/``contexts``; first file wins."""
    out: dict[str, tuple[Path, Any]] = {}
    for path, doc in docs:
        for item in doc.get(kind) or []:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                out.setdefault(item["name"], (path, item.get(kind[:-1]) or {}))
    return out


def kubeconfig_paths(explicit: str | None = None) -> list[Path]:
    if explicit:
        return [Path(explicit).expanduser()]
    env = os.environ.get("KUBECONFIG")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [Path("~/.kube/config").expanduser()]


def _data_or_file(
    entry: dict[str, Any], key: str, base: Path, where: str
) -> tuple[bytes | None, str | None]:
    data = entry.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True), None
        except ValueError:
            raise KubeConfigError(f"{where}.{key}-data is not base64") from None
    path = entry.get(key)
    if path:
        p = Path(str(path)).expanduser()
        return None, str(p if p.is_absolute() else base.parent / p)
    return None, None


def from_kubeconfig(path: str | None = None, context: str | None = None) -> KubeConfig:
    paths = [p for p in kubeconfig_paths(path) if p.is_file()]
    if not paths:
        raise KubeConfigError(
            f"no kubeconfig at {', '.join(map(str, kubeconfig_paths(path)))} and not "
            "inside a pod (no service account token): pass --k8s-kubeconfig FILE, set "
            "KUBECONFIG, or run pdctl in a pod with a service account"
        )
    docs = [(p, _read_doc(p)) for p in paths]
    first = paths[0]
    name = context or next(
        (d.get("current-context") for _, d in docs if d.get("current-context")), None
    )
    contexts = _named(docs, "contexts")
    if not name:
        raise KubeConfigError(
            f"{first}: no current-context; choose one with --k8s-context NAME or "
            "`kubectl config use-context NAME`"
        )
    if name not in contexts:
        known = ", ".join(sorted(contexts)) or "none"
        raise KubeConfigError(f"{first}: context {name!r} is not defined (contexts: {known})")
    cpath, ctx = contexts[name]
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    clusters, users = _named(docs, "clusters"), _named(docs, "users")
    if cluster_name not in clusters:
        raise KubeConfigError(
            f"{cpath}: contexts[{name}].cluster {cluster_name!r} is not among the clusters"
        )
    kpath, cluster = clusters[cluster_name]
    where = f"{kpath}: clusters[{cluster_name}]"
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeConfigError(f"{where}.server {server!r} is not an https:// URL")
    for unsupported in ("proxy-url", "tls-server-name"):
        if cluster.get(unsupported):
            raise KubeConfigError(
                f"{where}.{unsupported} is not supported by pdctl's Kubernetes source; "
                "use a kubeconfig without it (or run pdctl in the cluster)"
            )
    ca_data, ca_file = _data_or_file(cluster, "certificate-authority", kpath, where)
    cfg = KubeConfig(
        server=server.rstrip("/"),
        source=f"kubeconfig {kpath} (context {name})",
        namespace=str(ctx.get("namespace") or "default"),
        ca_data=ca_data,
        ca_file=ca_file,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        user=str(user_name),
    )
    if user_name is None:
        return cfg
    if user_name not in users:
        raise KubeConfigError(
            f"{cpath}: contexts[{name}].user {user_name!r} is not among the users"
        )
    _read_user(cfg, *users[user_name], str(user_name))
    return cfg


def _read_user(cfg: KubeConfig, upath: Path, user: dict[str, Any], user_name: str) -> None:
    """The kubeconfig user's credentials into ``cfg``."""
    uwhere = f"{upath}: users[{user_name}]"
    if user.get("auth-provider"):
        raise KubeConfigError(
            f"{uwhere}.auth-provider is the removed in-tree plugin; switch to its exec "
            "plugin (e.g. gke-gcloud-auth-plugin, kubelogin) as kubectl 1.26+ needs too"
        )
    cfg.token = user.get("token") or None
    if user.get("tokenFile"):
        cfg.token_file = str(Path(str(user["tokenFile"])).expanduser())
    cert_data, cert_file = _data_or_file(user, "client-certificate", upath, uwhere)
    key_data, key_file = _data_or_file(user, "client-key", upath, uwhere)
    try:
        cfg.cert_data = cert_data or (Path(cert_file).read_bytes() if cert_file else None)
        cfg.key_data = key_data or (Path(key_file).read_bytes() if key_file else None)
    except OSError as e:
        raise KubeConfigError(
            f"{uwhere}: the client certificate or key cannot be read ({e})"
        ) from None
    if (cfg.cert_data is None) != (cfg.key_data is None):
        raise KubeConfigError(
            f"{uwhere}: a client certificate needs its key (and the key its certificate)"
        )
    if isinstance(user.get("exec"), dict):
        if not user["exec"].get("command"):
            raise KubeConfigError(f"{uwhere}.exec has no command")
        cfg.exec_spec = dict(user["exec"])
    if user.get("username") or user.get("password"):
        raise KubeConfigError(
            f"{uwhere}: basic auth (username/password) was removed from Kubernetes; "
            "use a token, a client certificate or an exec plugin"
        )


def load_config(
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    sa_dir: str = SERVICE_ACCOUNT_DIR,
) -> KubeConfig:
    """A named kubeconfig or context wins; else the pod's service account; else the
    default kubeconfig."""
    if kubeconfig is None and context is None:
        pod = in_cluster(sa_dir)
        if pod is not None:
            return pod
    return from_kubeconfig(kubeconfig, context)
