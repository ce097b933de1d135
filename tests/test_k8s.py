"""The Kubernetes manifests (k8s/): each overlay renders offline, with and without the optional
components, validates strictly for Kubernetes 1.29-1.32, and obeys the deployment policy (hardening,
probes, PDBs, HPAs, ports and env names that match the services' configuration, the TLS component's
Secrets and the plaintext health port the probes use under TLS). The live check starts the cpu overlay's
Deployments with `podman kube play` from the locally built images and answers one Score through the pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml
from podman_support import SERVICE_IMAGE, TRITON_IMAGE, podman, require_images

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "k8s"
KUBERNETES_VERSIONS = ("1.29", "1.30", "1.31", "1.32")
COMPONENT = K8S / "components" / "triton-queue-hpa"
COMPONENTS = {
    "queue-hpa": COMPONENT,
    "tls": K8S / "components" / "tls",
    "cert-manager": K8S / "components" / "cert-manager",
}
# Kinds of each component that are CRDs (no schema in kubernetes-validate).
COMPONENT_CRDS = {
    "queue-hpa": {"ServiceMonitor", "PrometheusRule"},
    "tls": set(),
    "cert-manager": {"Certificate", "Issuer"},
}
RENDERS = (
    "cpu",
    "gpu",
    "cpu+queue-hpa",
    "gpu+queue-hpa",
    "cpu+tls",
    "gpu+tls",
    "cpu+tls+cert-manager",
    "gpu+tls+cert-manager+queue-hpa",
)
TLS_RENDERS = tuple(name for name in RENDERS if "+tls" in name)
SERVICE_COMPONENTS = ("scoring", "reasoning")
CLI_COMMANDS = {"scoring": "serve", "reasoning": "serve-reasoning"}


def kustomize(directory: Path) -> list[dict]:
    """``kubectl kustomize DIR`` as a list of objects (offline)."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the manifests cannot be rendered here")
    result = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render(name: str) -> list[dict]:
    """``overlay[+component...]`` rendered: the overlay alone, or an overlay of it with the components."""
    overlay, *components = name.split("+")
    if not components:
        return kustomize(K8S / "overlays" / overlay)
    with tempfile.TemporaryDirectory() as tmp:  # an overlay of the overlay, with the components
        relative = lambda path: os.path.relpath(path, tmp)  # noqa: E731 - kustomize wants relative paths
        (Path(tmp) / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "resources": [relative(K8S / "overlays" / overlay)],
                    "components": [relative(COMPONENTS[c]) for c in components],
                }
            )
        )
        return kustomize(Path(tmp))


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render(name) for name in RENDERS}


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    return found


def pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    return [
        (f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] in ("Deployment", "Job")
    ]


def component_of(deployment: dict) -> str:
    return deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


# -- render and schema ----------------------------------------------------------------------------------
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", RENDERS)
def test_overlay_validates_strictly(rendered, name, version):
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError

    crds = set()
    for obj in rendered[name]:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except SchemaNotFoundError:
            crds.add(obj["kind"])  # CRDs (Prometheus Operator, cert-manager): no schema here
    expected = set().union(*(COMPONENT_CRDS[c] for c in name.split("+")[1:]))
    assert crds == expected, crds


def test_cli_validator_rejects_an_unknown_field(rendered, tmp_path):
    """The same check from the command line (`kubernetes-validate --strict`), and that it can fail."""
    cli = str(Path(sys.executable).parent / "kubernetes-validate")
    good = tmp_path / "cpu.yaml"
    good.write_text(yaml.safe_dump_all(rendered["cpu"]))
    result = subprocess.run([cli, "--strict", "--quiet", "-k", "1.32", str(good)], capture_output=True)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = [dict(o) for o in rendered["cpu"]]
    deployment = named(broken, "Deployment", "slimserve-scoring")
    deployment["spec"] = {**deployment["spec"], "replica": 3}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all(broken))
    result = subprocess.run(
        [cli, "--strict", "--quiet", "-k", "1.32", str(bad)], capture_output=True, text=True
    )
    assert result.returncode != 0 and "replica" in result.stdout + result.stderr


# -- policy over every rendered object --------------------------------------------------------------------
@pytest.mark.parametrize("name", RENDERS)
def test_every_pod_is_hardened_and_sized(rendered, name):
    for where, spec in pod_specs(rendered[name]):
        assert spec["automountServiceAccountToken"] is False, where
        assert spec["enableServiceLinks"] is False, where
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["securityContext"]["runAsUser"] != 0, where
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for container in spec["containers"] + spec.get("initContainers", []):
            what = f"{where}/{container['name']}"
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, what
            assert context["allowPrivilegeEscalation"] is False, what
            assert context["runAsNonRoot"] is True, what
            assert context["capabilities"] == {"drop": ["ALL"]}, what
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, what
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), what
            assert "memory" in resources["limits"], what
            image = container["image"]
            assert re.fullmatch(r"[\w./-]+(:[\w.-]+|@sha256:[0-9a-f]{64})", image), what
            assert not image.endswith(":latest"), what
            assert container["imagePullPolicy"] == "IfNotPresent", what


@pytest.mark.parametrize("name", RENDERS)
def test_every_deployment_has_probes_a_pdb_and_a_graceful_stop(rendered, name):
    objects = rendered[name]
    pdbs = of_kind(objects, "PodDisruptionBudget")
    for deployment in of_kind(objects, "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert matches(deployment["spec"]["selector"], labels)
        covering = [p for p in pdbs if matches(p["spec"]["selector"], labels)]
        assert len(covering) == 1, deployment["metadata"]["name"]
        assert covering[0]["apiVersion"] == "policy/v1"
        for container in spec["containers"]:
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert probe in container, f"{deployment['metadata']['name']}: {probe}"
            pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
            assert pre_stop[0] == "sleep" and int(pre_stop[1]) < spec["terminationGracePeriodSeconds"]


@pytest.mark.parametrize("name", RENDERS)
def test_hpas_are_v2_with_scale_down_stabilization(rendered, name):
    objects = rendered[name]
    hpas = of_kind(objects, "HorizontalPodAutoscaler")
    targets = {h["spec"]["scaleTargetRef"]["name"] for h in hpas}
    expected = {"slimserve-scoring", "slimserve-reasoning"}
    assert targets == (expected | {"slimserve-triton"} if "queue-hpa" in name else expected)
    for hpa in hpas:
        assert hpa["apiVersion"] == "autoscaling/v2"
        target = hpa["spec"]["scaleTargetRef"]
        assert target["kind"] == "Deployment" and named(objects, "Deployment", target["name"])
        assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300
        assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    for service in expected:
        (metric,) = named(objects, "HorizontalPodAutoscaler", service)["spec"]["metrics"]
        assert metric["resource"]["name"] == "cpu"


# -- Triton -------------------------------------------------------------------------------------------
def triton_container(objects: list[dict]) -> tuple[dict, dict]:
    spec = named(objects, "Deployment", "slimserve-triton")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return spec, container


def flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return value


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_triton_ports_probes_shutdown_and_model_volume(rendered, name):
    spec, container = triton_container(rendered[name])
    args = container["args"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert [int(flag(args, f"{k}-port")) for k in ("http", "grpc", "metrics")] == [8000, 8001, 8002]
    # Readiness = every model ready; the startup probe leaves minutes for load and warmup.
    assert flag(args, "strict-readiness") == "true"
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pre_stop + int(flag(args, "exit-timeout-secs")) < spec["terminationGracePeriodSeconds"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"
    models = mounts[flag(args, "model-repository")]
    assert models["readOnly"] is True
    assert volumes[models["name"]]["persistentVolumeClaim"]["claimName"] == "slimserve-model-repository"
    service = named(rendered[name], "Service", "slimserve-triton")
    assert service["spec"]["clusterIP"] == "None"  # headless: clients see every pod


def test_cpu_and_gpu_overlays_pick_their_triton(rendered):
    _, cpu = triton_container(rendered["cpu"])
    assert cpu["image"].startswith("slimserve-triton-cpu:")
    assert "--allow-gpu-metrics=false" in cpu["args"] and "nvidia.com/gpu" not in cpu["resources"]["limits"]
    objects = rendered["gpu"]
    spec, gpu = triton_container(objects)
    assert gpu["image"].startswith("slimserve-triton-gpu:") and "--allow-gpu-metrics=false" not in gpu["args"]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    product = spec["nodeSelector"]["nvidia.com/gpu.product"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    # The build Job makes the engines on the same GPU type, into the volume Triton serves.
    job = named(objects, "Job", "slimserve-build")["spec"]["template"]["spec"]
    (build,) = job["containers"]
    assert job["nodeSelector"]["nvidia.com/gpu.product"] == product
    assert build["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert build["command"] + build["args"][:3] == ["slimserve", "build", "--recipe", "gpu"]
    repository = build["args"][build["args"].index("--model-repository") + 1]
    (mount,) = [m for m in build["volumeMounts"] if m["mountPath"] == repository]
    claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in job["volumes"]}
    assert claims[mount["name"]] == "slimserve-model-repository" and not mount.get("readOnly")
    assert not of_kind(rendered["cpu"], "Job")


# -- the services -------------------------------------------------------------------------------------
def service_config_class(prefix: str):
    """The service configuration model whose environment prefix is ``prefix``."""
    import importlib

    from slimserve.settings import Settings

    for module in ("slimserve.serving.scoring.config", "slimserve.serving.reasoning.config"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    pending, found = [Settings], []
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if getattr(cls, "env_prefix", None) == prefix and cls.__module__.startswith("slimserve.serving"):
            found.append(cls)
    if not found:
        pytest.skip(f"no service configuration with prefix {prefix} in slimserve.serving yet")
    return found[0]


@pytest.mark.parametrize("component", SERVICE_COMPONENTS)
def test_service_deployment_matches_the_service_configuration(rendered, component):
    """Env names are real config fields, ports agree, probes use grpc.health.v1, drain fits the grace."""
    from slimserve.cli import build_parser
    from slimserve.settings import load_config

    objects = rendered["cpu"]
    name = f"slimserve-{component}"
    deployment = named(objects, "Deployment", name)
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    prefix = f"SLIMSERVE_{component.upper()}_"
    config_class = service_config_class(prefix)
    env = env_of(container)
    unknown = [k for k in env if k.removeprefix(prefix).lower() not in config_class.model_fields]
    assert all(k.startswith(prefix) for k in env) and not unknown, unknown
    config = load_config(config_class, None, environ=env)  # the values parse, as the service would
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": config.port, "metrics": config.metrics_port, "health": config.health_port}
    assert config.host == "0.0.0.0" and config.metrics_host == "0.0.0.0"
    # Native grpc.health.v1 on the plaintext health port (the kubelet's gRPC probe speaks no TLS).
    assert container["readinessProbe"]["grpc"] == {"port": config.health_port}
    # The bundle is read from the model repository, mounted read-only.
    (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == config.model_repository]
    assert mount["readOnly"] is True
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pre_stop + config.drain_grace_s < spec["terminationGracePeriodSeconds"]
    # Triton through its headless Service's gRPC port.
    host, port = config.triton_url.rsplit(":", 1)
    triton = named(objects, "Service", host)
    assert triton["spec"]["clusterIP"] == "None"
    assert int(port) in [p["port"] for p in triton["spec"]["ports"] if p["name"] == "grpc"]
    # The command exists; the Service exposes the same ports by name.
    command = container["args"][0]
    assert command == CLI_COMMANDS[component]
    subcommands = build_parser()._subparsers._group_actions[0].choices
    if command not in subcommands:
        pytest.skip(f"`slimserve {command}` is not in the CLI yet")
    service = named(objects, "Service", name)  # the health port stays inside the pod
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        k: v for k, v in ports.items() if k != "health"
    }


def test_scoring_config_file_in_the_image_agrees_with_the_manifest(rendered):
    from slimserve.serving.scoring.config import ScoringServiceConfig
    from slimserve.settings import load_config

    (container,) = named(rendered["cpu"], "Deployment", "slimserve-scoring")["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["args"] == ["serve", "--config", "/etc/slimserve/scoring.yaml"]
    containerfile = (ROOT / "services" / "Containerfile").read_text()
    assert "COPY services/scoring/config.yaml /etc/slimserve/scoring.yaml" in containerfile
    config = load_config(
        ScoringServiceConfig, ROOT / "services" / "scoring" / "config.yaml", environ=env_of(container)
    )
    assert config.port == 50051 and config.model_name == "scorer"


def test_network_policies_let_only_the_services_reach_triton(rendered):
    objects = rendered["cpu"]
    policy = named(objects, "NetworkPolicy", "slimserve-triton")
    grpc_rule, metrics_rule = policy["spec"]["ingress"]
    assert grpc_rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    (source,) = grpc_rule["from"]
    (names, components) = source["podSelector"]["matchExpressions"]
    assert names["values"] == ["slimserve"] and set(components["values"]) == set(SERVICE_COMPONENTS)
    assert metrics_rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    services = named(objects, "NetworkPolicy", "slimserve-services")["spec"]["ingress"]
    assert services[1]["from"] == metrics_rule["from"] and services[1]["ports"][0]["port"] == "metrics"
    deny = named(objects, "NetworkPolicy", "slimserve-default-deny")["spec"]
    assert deny["policyTypes"] == ["Ingress"] and "ingress" not in deny


# -- the TLS and cert-manager components ----------------------------------------------------------------
def mounted_secret(spec: dict, container: dict, path: Path) -> tuple[str, dict]:
    """(Secret name, mount) of the read-only whole-volume Secret mount holding the file ``path``."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if path.parent == Path(m["mountPath"])]
    assert mount["readOnly"] is True and "subPath" not in mount  # the kubelet updates whole mounts only
    secret = volumes[mount["name"]]["secret"]
    return secret["secretName"], secret


@pytest.mark.parametrize("name", TLS_RENDERS)
@pytest.mark.parametrize("component", SERVICE_COMPONENTS)
def test_tls_component_mounts_the_secrets_and_probes_use_the_health_port(rendered, name, component):
    from slimserve.settings import load_config

    spec = named(rendered[name], "Deployment", f"slimserve-{component}")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    config = load_config(
        service_config_class(f"SLIMSERVE_{component.upper()}_"), None, environ=env_of(container)
    )
    assert config.uses_tls and config.uses_tokens and not config.allow_plaintext
    tls_secret, tls = mounted_secret(spec, container, config.tls_cert_file)
    assert tls_secret == "slimserve-tls" and config.tls_key_file.parent == config.tls_cert_file.parent
    token_secret, tokens = mounted_secret(spec, container, config.auth_tokens_file)
    assert token_secret == "slimserve-tokens"
    # Files 0440 for the pod's group: the non-root service user reads them, others in the pod do not.
    assert tls["defaultMode"] == tokens["defaultMode"] == 0o440
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
    # Probes: readiness on the plaintext health port; startup and liveness only open a TCP connection.
    assert container["readinessProbe"]["grpc"] == {"port": config.health_port} != {"port": config.port}
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe] == {**container[probe], "tcpSocket": {"port": "grpc"}}
    # Nothing else changed: same probes and ports as without the component.
    plain = named(rendered[name.split("+")[0]], "Deployment", f"slimserve-{component}")
    (plain_container,) = plain["spec"]["template"]["spec"]["containers"]
    for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
        assert container[key] == plain_container[key], key


@pytest.mark.parametrize("name", TLS_RENDERS)
def test_network_policies_are_the_same_with_tls_and_never_admit_the_health_port(rendered, name):
    policies = of_kind(rendered[name], "NetworkPolicy")
    assert policies == of_kind(rendered[name.split("+")[0]], "NetworkPolicy")
    admitted = {
        p["port"] for policy in policies for rule in policy["spec"].get("ingress", []) for p in rule["ports"]
    }
    assert admitted == {"grpc", "metrics"}  # by name: the health port (kubelet only) is not among them


def test_cert_manager_component_issues_the_secret_the_services_mount(rendered):
    objects = rendered["cpu+tls+cert-manager"]
    certificates = {c["metadata"]["name"]: c["spec"] for c in of_kind(objects, "Certificate")}
    issuers = {i["metadata"]["name"]: i["spec"] for i in of_kind(objects, "Issuer")}
    (serving,) = [c for c in certificates.values() if c["secretName"] == "slimserve-tls"]
    assert "server auth" in serving["usages"] and serving["privateKey"]["rotationPolicy"] == "Always"
    assert serving["renewBefore"] and not serving.get("isCA")
    for service in ("slimserve-scoring", "slimserve-reasoning"):  # the names clients dial
        assert named(objects, "Service", service) and service in serving["dnsNames"]
        assert f"{service}.slimserve.svc" in serving["dnsNames"]
    # The chain resolves inside the render: CA Issuer <- CA certificate <- self-signed Issuer.
    ca_issuer = issuers[serving["issuerRef"]["name"]]
    (ca,) = [c for c in certificates.values() if c["secretName"] == ca_issuer["ca"]["secretName"]]
    assert ca["isCA"] is True and "selfSigned" in issuers[ca["issuerRef"]["name"]]


def test_queue_hpa_component_is_wired_end_to_end(rendered):
    """HPA metric = adapter's name for the recording rule, over Triton's scraped metrics."""
    objects = rendered["cpu+queue-hpa"]
    (rule_group,) = of_kind(objects, "PrometheusRule")[0]["spec"]["groups"]
    records = {r["record"]: r["expr"] for r in rule_group["rules"]}
    adapter = yaml.safe_load((COMPONENT / "prometheus-adapter-values.yaml").read_text())
    served = {}
    for rule in adapter["rules"]["custom"]:
        series = rule["seriesQuery"].split("{")[0].strip("'")
        assert series in records and re.fullmatch(rule["name"]["matches"], series)
        served[rule["name"]["as"]] = series
    (metric,) = named(objects, "HorizontalPodAutoscaler", "slimserve-triton")["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] in served
    expr = records[served[metric["pods"]["metric"]["name"]]]
    assert "nv_inference_queue_duration_us" in expr and 'job="slimserve-triton"' in expr
    (monitor,) = of_kind(objects, "ServiceMonitor")
    scraped = [
        s
        for s in of_kind(objects, "Service")
        if matches(monitor["spec"]["selector"], s["metadata"]["labels"])
    ]
    assert {s["metadata"]["name"] for s in scraped} == {
        "slimserve-triton",
        "slimserve-scoring",
        "slimserve-reasoning",
    }
    assert all("metrics" in [p["name"] for p in s["spec"]["ports"]] for s in scraped)


# -- client-side balancing over a headless Service --------------------------------------------------------
def test_triton_client_spreads_requests_over_every_address(tiny_repository):
    """Several addresses behind one target (what a headless Service's DNS name gives): round-robin."""
    from conftest import start_triton

    from slimserve.serving.triton.client import TritonScorerClient

    servers = [start_triton(tiny_repository) for _ in range(2)]
    try:
        ports = [s.grpc_url.rsplit(":", 1)[1] for s in servers]
        target = "ipv4:" + ",".join(f"127.0.0.1:{p}" for p in ports)

        async def counts() -> list[int]:  # requests each server has run so far (warmup included)
            result = []
            for server in servers:
                async with TritonScorerClient(server.grpc_url, model_name="scorer") as one:
                    result.append((await one.model_statistics()).inference_count)
            return result

        async def run() -> list[int]:
            before = await counts()
            ids = np.ones((1, 64), dtype=np.int64)
            async with TritonScorerClient(target, model_name="scorer") as client:
                for _ in range(8):
                    await client.infer_scores(ids, ids, timeout_s=30)
            return [after - b for after, b in zip(await counts(), before, strict=True)]

        served = asyncio.run(run())
        assert sum(served) == 8 and min(served) >= 2, served
    finally:
        for server in servers:
            server.stop()


# -- live: the cpu overlay's Deployments under podman kube play --------------------------------------------
def podman_copy(deployment: dict, tmp: Path, run: str, env: dict[str, str], args: dict[str, str]) -> Path:
    """The Deployment as podman kube play can run it here, with everything else as rendered.

    Changes: one replica; names (Deployment, claim) suffixed with ``run`` so concurrent runs never meet;
    the host's network with free ports (traffic stays on loopback) so no containerPorts; no probes (the
    test runs them itself, against the manifest's endpoints); emptyDir volumes as world-writable host
    folders (Kubernetes makes them 0777, podman root-owned)."""
    deployment = yaml.safe_load(yaml.safe_dump(deployment))
    deployment["metadata"]["name"] += f"-{run}"
    deployment["spec"]["replicas"] = 1
    spec = deployment["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    (container,) = spec["containers"]
    for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
        container.pop(key, None)
    for item in container.get("env", []):
        item["value"] = env.get(item["name"], item["value"])
    container["args"] = [
        next((f"--{k}={v}" for k, v in args.items() if a.startswith(f"--{k}=")), a) for a in container["args"]
    ]
    for volume in spec["volumes"]:
        if "persistentVolumeClaim" in volume:
            volume["persistentVolumeClaim"]["claimName"] += f"-{run}"
        if "emptyDir" in volume:
            folder = Path(tempfile.mkdtemp(prefix=f"{volume['name']}-", dir=tmp))
            folder.chmod(0o1777)
            volume.pop("emptyDir")
            volume["hostPath"] = {"path": str(folder), "type": "Directory"}
    path = tmp / f"{deployment['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(deployment))
    return path


def wait_until(check, timeout_s: float, what: str, logs) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.5)
    raise AssertionError(f"{what} not ready in {timeout_s:.0f} s; logs:\n{logs()}")


def grpc_health(target: str) -> str:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


@pytest.mark.podman
def test_cpu_overlay_runs_under_podman_kube_play(rendered, tiny_repository, tmp_path):
    """Triton and scoring pods from the rendered cpu overlay and the local images; one Score through them."""
    require_images(SERVICE_IMAGE, TRITON_IMAGE)
    from slimserve.client import score_once
    from slimserve.examples import EXAMPLE_MEMBER, example_candidates
    from slimserve.serving.triton.launcher import free_ports

    objects = rendered["cpu"]
    run = uuid.uuid4().hex[:8]
    claim = (
        f"{named(objects, 'PersistentVolumeClaim', 'slimserve-model-repository')['metadata']['name']}-{run}"
    )
    # podman backs a persistentVolumeClaim with the named volume of the same name: fill it.
    podman("volume", "rm", "--force", claim, check=False)
    podman("volume", "create", claim)
    mountpoint = Path(podman("volume", "inspect", claim, "--format", "{{.Mountpoint}}").stdout.strip())
    shutil.copytree(tiny_repository, mountpoint, dirs_exist_ok=True)
    http, grpc_port, metrics, service_port, service_metrics, service_health = free_ports(6)
    triton = podman_copy(
        named(objects, "Deployment", "slimserve-triton"),
        tmp_path,
        run,
        {},
        {"http-port": str(http), "grpc-port": str(grpc_port), "metrics-port": str(metrics)},
    )
    scoring = podman_copy(
        named(objects, "Deployment", "slimserve-scoring"),
        tmp_path,
        run,
        {
            "SLIMSERVE_SCORING_PORT": str(service_port),
            "SLIMSERVE_SCORING_METRICS_PORT": str(service_metrics),
            "SLIMSERVE_SCORING_HEALTH_PORT": str(service_health),
            "SLIMSERVE_SCORING_TRITON_URL": f"127.0.0.1:{grpc_port}",
        },
        {},
    )
    images = {
        c["image"]
        for d in (triton, scoring)
        for c in yaml.safe_load(d.read_text())["spec"]["template"]["spec"]["containers"]
    }
    assert {f"localhost/{i}" for i in images} == {SERVICE_IMAGE, TRITON_IMAGE}

    def logs() -> str:
        names = podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split()
        return "\n".join(
            f"--- {n}\n" + podman("logs", "--tail", "30", n, check=False).stderr for n in names if run in n
        )

    started: list[Path] = []
    try:
        for manifest in (triton, scoring):
            podman("kube", "play", str(manifest), timeout=180)
            started.append(manifest)
        # The manifest's probes, run by hand: Triton's readiness path, then the service's grpc.health.v1
        # on its health port (and on the service port, which is plaintext here).
        _, container = triton_container(objects)
        path = container["readinessProbe"]["httpGet"]["path"]
        ready_url = f"http://127.0.0.1:{http}{path}"
        wait_until(lambda: urllib.request.urlopen(ready_url, timeout=2).status == 200, 120, "Triton", logs)
        target = f"127.0.0.1:{service_port}"
        health = f"127.0.0.1:{service_health}"
        wait_until(lambda: grpc_health(health) == "SERVING", 60, "scoring service", logs)
        assert grpc_health(target) == "SERVING"
        candidates = example_candidates(5)
        response = score_once(target, EXAMPLE_MEMBER, candidates, timeout_s=30)
        assert sorted(i.item_id for i in response.items) == sorted(c.id for c in candidates)
        assert [i.rank for i in response.items] == [1, 2, 3, 4, 5]
        scores = [i.score for i in response.items]
        assert np.all(np.isfinite(scores)) and scores == sorted(scores, reverse=True)
        assert response.metadata.model_name == "scorer"
        bundle = (tiny_repository / "scorer" / "config.pbtxt").read_text()
        assert response.metadata.bundle_hash in bundle
        # Non-root, read-only root filesystem, as the manifest says.
        (name,) = [
            n
            for n in podman("ps", "--format", "{{.Names}}").stdout.split()
            if n.startswith("slimserve-scoring")
        ]
        assert podman("exec", name, "id", "-u").stdout.strip() == "10001"
        assert podman("exec", name, "touch", "/opt/x", check=False).returncode != 0
    finally:
        for manifest in reversed(started):
            podman("kube", "down", str(manifest), check=False, timeout=120)
        podman("volume", "rm", "--force", claim, check=False)
