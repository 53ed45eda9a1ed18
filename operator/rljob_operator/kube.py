"""The operator's only door to the apiserver: create-or-patch, list, delete,
status and scale writes. Thin wrappers over the official kubernetes client."""

from __future__ import annotations

import logging

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from rljob.api import GROUP, PLURAL, VERSION, builders

FIELD_MANAGER = "rljob-operator"
log = logging.getLogger("rljob_operator.kube")

# Kinds of the job's children, for deleting them by label (ttlSecondsAfterFinished).
# Owners before pods, and only the pods no workload controller owns: a pod of a
# Deployment or StatefulSet deleted by hand while its ReplicaSet or StatefulSet still
# stands is recreated at once (the garbage collector removes those pods with their
# owner), and the new pod, still starting, is killed only after its grace period.
CHILD_KINDS = (("apps/v1", "Deployment"), ("apps/v1", "StatefulSet"), ("v1", "Pod"),
               ("v1", "Service"), ("v1", "ConfigMap"), ("v1", "Secret"),
               ("scheduling.volcano.sh/v1beta1", "PodGroup"),
               # last: the job's pods stay behind it while they go
               ("networking.k8s.io/v1", "NetworkPolicy"))
WORKLOAD_OWNERS = {"ReplicaSet", "StatefulSet", "DaemonSet", "Job"}


def owned_by_a_workload(obj: dict) -> bool:
    """Whether an object's controller is a workload controller (its pods go with it)
    (pure)."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("controller") and r.get("kind") in WORKLOAD_OWNERS for r in refs)


class NoCluster(Exception):
    """No cluster to talk to: one line saying what was tried and what to pass."""


# what loading a file that is no usable kubeconfig raises (missing, unreadable, not
# YAML, YAML of another shape)
UNUSABLE_KUBECONFIG = (config.ConfigException, OSError, yaml.YAMLError, TypeError,
                       ValueError, KeyError, AttributeError)


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def load_config(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The client's cluster: `kubeconfig` (and `context`) when given, else the pod's
    service account when in a pod, else $KUBECONFIG or ~/.kube/config. Says which."""
    if kubeconfig or context:
        try:
            config.load_kube_config(config_file=kubeconfig, context=context)
        except UNUSABLE_KUBECONFIG as exc:
            raise NoCluster(f"--kubeconfig {kubeconfig or '(default)'}"
                            f"{f' --context {context}' if context else ''}: {_line(exc)}"
                            ) from None
        return f"kubeconfig {kubeconfig or '(default)'}"
    try:
        config.load_incluster_config()
        return "in-cluster service account"
    except config.ConfigException:
        pass
    try:
        config.load_kube_config()
    except UNUSABLE_KUBECONFIG as exc:
        raise NoCluster("no cluster to talk to: not in a pod (no service account) and no "
                        f"usable kubeconfig ({_line(exc)}); pass --kubeconfig FILE or set "
                        "KUBECONFIG") from None
    return "kubeconfig (default)"


def ensure_peering(name: str, namespaces: list[str]) -> list[str]:
    """kopf's peering object `name` (cluster-wide, or in each of `namespaces`),
    created when absent: a standby replica waits on it and would wait forever for
    one that is not there. Returns what it created. `NoCluster` with the fix when
    kopf's peering CRDs are not installed."""
    api = client.CustomObjectsApi()
    created = []
    targets = [ns for ns in namespaces if not any(ch in ns for ch in "*?[")] or [None]
    if namespaces and targets == [None]:
        return []  # glob patterns only: no namespace to name
    for ns in targets:
        body = {"apiVersion": "kopf.dev/v1", "metadata": {"name": name}}
        try:
            if ns is None:
                api.create_cluster_custom_object(
                    "kopf.dev", "v1", "clusterkopfpeerings",
                    {**body, "kind": "ClusterKopfPeering"})
            else:
                api.create_namespaced_custom_object(
                    "kopf.dev", "v1", ns, "kopfpeerings", {**body, "kind": "KopfPeering"})
            created.append(f"{ns}/{name}" if ns else name)
        except ApiException as exc:
            if exc.status == 409:
                continue
            if exc.status == 404:
                raise NoCluster(f"--peering {name}: kopf's peering CRDs are not installed "
                                "(helm upgrade ... --set peering.enabled=true installs them)"
                                ) from None
            raise
        except urllib3.exceptions.HTTPError as exc:  # no answer at all
            host = client.Configuration.get_default_copy().host
            raise NoCluster(f"cannot reach the cluster at {host}: {type(exc).__name__}; "
                            "check --kubeconfig / --context and that the apiserver is up"
                            ) from None
    return created


def connection_info(trust_env: bool):
    """kopf's credentials from the client configuration `load_config` chose (kopf's
    own `login_via_client` would load the default kubeconfig again, not --kubeconfig)."""
    import kopf

    cfg = client.Configuration.get_default_copy()
    header = (cfg.get_api_key_with_prefix("BearerToken")
              or cfg.get_api_key_with_prefix("authorization"))
    parts = header.split(" ", 1) if header else []
    scheme, token = ((None, None) if not parts else (None, parts[0]) if len(parts) == 1
                     else (parts[0], parts[1]))
    return kopf.ConnectionInfo(
        server=cfg.host, ca_path=cfg.ssl_ca_cert, insecure=not cfg.verify_ssl,
        username=cfg.username or None, password=cfg.password or None, scheme=scheme,
        token=token, certificate_path=cfg.cert_file, private_key_path=cfg.key_file,
        trust_env=trust_env)


class Kube:
    def __init__(self, api: client.ApiClient | None = None):
        self.api = api or client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self._dynamic: DynamicClient | None = None

    @property
    def dynamic(self) -> DynamicClient:
        if self._dynamic is None:  # discovery on first use only
            self._dynamic = DynamicClient(self.api)
        return self._dynamic

    def _resource(self, obj: dict):
        return self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])

    def apply(self, obj: dict) -> None:
        """Server-side apply: creates the object or patches our fields of it."""
        meta = obj["metadata"]
        self.dynamic.server_side_apply(self._resource(obj), body=obj, name=meta["name"],
                                       namespace=meta.get("namespace"),
                                       field_manager=FIELD_MANAGER, force_conflicts=True)

    def create(self, obj: dict) -> bool:
        """Create unless it exists (pods, the Secret); True when created."""
        try:
            self._resource(obj).create(body=obj, namespace=obj["metadata"].get("namespace"))
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    def exists(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        try:
            self.dynamic.resources.get(api_version=api_version, kind=kind).get(
                name=name, namespace=namespace)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's keys and values (decoded); None if it does not exist."""
        import base64

        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}

    def add_secret_keys(self, namespace: str, name: str, values: dict[str, str]) -> None:
        self.core.patch_namespaced_secret(name, namespace, {"stringData": values})

    def list_pods(self, namespace: str, job: str) -> list[dict]:
        pods = self.core.list_namespaced_pod(
            namespace, label_selector=f"{builders.LABEL_NAME}={job}")
        return [self.api.sanitize_for_serialization(p) for p in pods.items]

    def list_nodes(self) -> list[dict]:
        return self.api.sanitize_for_serialization(self.core.list_node().items)

    def list_live_pods(self) -> list[dict]:
        """Every pod of the cluster that has not ended (what holds node capacity)."""
        pods = self.core.list_pod_for_all_namespaces(
            field_selector="status.phase!=Succeeded,status.phase!=Failed")
        return self.api.sanitize_for_serialization(pods.items)

    def delete_pod(self, namespace: str, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def delete_children(self, namespace: str, job: str) -> int:
        n = 0
        for api_version, kind in CHILD_KINDS:
            try:
                res = self.dynamic.resources.get(api_version=api_version, kind=kind)
            except ResourceNotFoundError:
                continue
            items = res.get(namespace=namespace,
                            label_selector=f"{builders.LABEL_NAME}={job}").items
            for item in items:
                if kind == "Pod" and owned_by_a_workload(item.to_dict()):
                    continue  # deleted with its ReplicaSet or StatefulSet
                try:
                    res.delete(name=item.metadata.name, namespace=namespace)
                    n += 1
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        return n

    def config_map_data(self, namespace: str, name: str) -> dict | None:
        """A ConfigMap's data (None when there is no such ConfigMap)."""
        try:
            return self.core.read_namespaced_config_map(name, namespace).data or {}
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_status(self, namespace: str, name: str, status: dict) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status})

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        """Through the scale subresource: the same path `kubectl scale` takes."""
        self.custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, namespace, PLURAL, name, {"spec": {"replicas": replicas}})

    # ---- a queued job's Workload (queue.py) --------------------------------

    def get_custom(self, group: str, version: str, plural: str, name: str,
                   namespace: str | None = None) -> dict | None:
        """A custom object (cluster-scoped without `namespace`); None when there is
        none. `NotInstalled` when the apiserver does not serve its kind."""
        try:
            if namespace is None:
                return self.custom.get_cluster_custom_object(group, version, plural, name)
            return self.custom.get_namespaced_custom_object(group, version, namespace,
                                                            plural, name)
        except ApiException as exc:
            if exc.status == 404:
                if not self._serves(group, version, plural):
                    raise NotInstalled(f"{plural}.{group}/{version}") from None
                return None
            raise

    def _serves(self, group: str, version: str, plural: str) -> bool:
        try:
            found = self.custom.get_api_resources(group, version)
        except ApiException:
            return False
        return any(r.name == plural for r in found.resources or [])

    def create_custom(self, group: str, version: str, plural: str, obj: dict) -> bool:
        """Create a namespaced custom object unless it exists; True when created (no
        discovery: a kind installed after the operator started is found)."""
        try:
            self.custom.create_namespaced_custom_object(
                group, version, obj["metadata"]["namespace"], plural, obj)
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    def patch_custom(self, group: str, version: str, plural: str, namespace: str, name: str,
                     body: dict, status: bool = False) -> None:
        """A merge patch of a namespaced custom object (or its status); a body with
        metadata.resourceVersion fails with 409 if the object changed since."""
        if status:
            self.custom.patch_namespaced_custom_object_status(group, version, namespace,
                                                              plural, name, body)
        else:
            self.custom.patch_namespaced_custom_object(group, version, namespace, plural,
                                                       name, body)

    def delete_custom(self, group: str, version: str, plural: str, namespace: str,
                      name: str) -> None:
        """Delete a namespaced custom object, gone or not."""
        try:
            self.custom.delete_namespaced_custom_object(group, version, namespace, plural, name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def list_custom(self, group: str, version: str, plural: str, namespace: str,
                    label_selector: str) -> list[dict]:
        try:
            return self.custom.list_namespaced_custom_object(
                group, version, namespace, plural, label_selector=label_selector)["items"]
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise

    def patch_job(self, namespace: str, name: str, body: dict) -> int:
        """A merge patch of an RLJob (its spec or metadata); returns its generation."""
        out = self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                         name, body)
        return int(((out or {}).get("metadata") or {}).get("generation") or 0)


class NotInstalled(Exception):
    """The apiserver does not serve a kind the job needs (Kueue's Workload)."""
