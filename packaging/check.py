"""Checks the deployment recipes of packaging/:

- the KServe manifests (packaging/kserve/*.yaml) against KServe's own API types, as the `kserve`
  package from PyPI generates them from its CRDs' OpenAPI schema (and the Kubernetes client's
  for the pod fields): every field known, every value of its type; then what epx needs of them
  (an ONNX format, protocol v2, `epx serve` on the ports the probes and KServe use);
- the container recipe (packaging/container/Dockerfile), structurally: a non-root user, the
  release bundle installed, `epx serve` as the entry point, health checks on /v2/health.

    python packaging/check.py        (a Python with `kserve` and `pyyaml`: packaging/check.sh)
"""

import importlib.metadata
import os
import re
import sys

import kserve
import kubernetes.client
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
PRIMITIVE = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def check(value, type_name, path, errors):
    """Appends to `errors` each place where `value` does not fit the API type `type_name`."""
    if type_name == "object":
        return
    # The Kubernetes client writes List[T] and Dict[K, V]; kserve list[T] and dict(K, V).
    if type_name.startswith("List["):
        type_name = "list[" + type_name[5:]
    if type_name.startswith("Dict["):
        type_name = "dict(" + type_name[5:-1] + ")"
    if type_name.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: a list expected, got {value!r}")
            return
        for i, item in enumerate(value):
            check(item, type_name[5:-1], f"{path}[{i}]", errors)
        return
    if type_name.startswith("dict("):
        inner = type_name[5:-1].split(", ", 1)[1]
        if not isinstance(value, dict):
            errors.append(f"{path}: a map expected, got {value!r}")
            return
        for k, v in value.items():
            check(v, inner, f"{path}.{k}", errors)
        return
    if type_name in PRIMITIVE:
        ok = isinstance(value, PRIMITIVE[type_name]) and not (
            type_name != "bool" and isinstance(value, bool))
        if not ok:
            errors.append(f"{path}: {type_name} expected, got {value!r}")
        return
    cls = getattr(kserve, type_name, None) or getattr(kubernetes.client, type_name, None)
    if cls is None:
        errors.append(f"{path}: no API type {type_name}")
        return
    if not isinstance(value, dict):
        errors.append(f"{path}: an object ({type_name}) expected, got {value!r}")
        return
    fields = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for key, v in value.items():
        if key not in fields:
            errors.append(f"{path}.{key}: {type_name} has no field `{key}`")
            continue
        check(v, cls.openapi_types[fields[key]], f"{path}.{key}", errors)


def load(name):
    with open(os.path.join(HERE, "kserve", name)) as f:
        return yaml.safe_load(f)


def main():
    errors = []
    runtime = load("cluster-serving-runtime.yaml")
    service = load("inference-service.yaml")
    check(runtime, "V1alpha1ClusterServingRuntime", "cluster-serving-runtime", errors)
    check(service, "V1beta1InferenceService", "inference-service", errors)
    # What epx needs of them.
    want = [
        (runtime["apiVersion"] == "serving.kserve.io/v1alpha1", "runtime apiVersion"),
        (runtime["kind"] == "ClusterServingRuntime", "runtime kind"),
        (any(f["name"] == "onnx" for f in runtime["spec"]["supportedModelFormats"]),
         "the runtime supports onnx"),
        ("v2" in runtime["spec"]["protocolVersions"], "the runtime speaks protocol v2"),
    ]
    container = runtime["spec"]["containers"][0]
    args = container["args"]
    port = container["ports"][0]["containerPort"]
    want += [
        (args[0] == "serve", "the container runs `epx serve`"),
        ("--model-repository=/mnt/models" in args, "it serves KServe's /mnt/models"),
        (f"--http-port={port}" in args, "REST on the container port"),
        (container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": port},
         "readiness on /v2/health/ready"),
        (container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": port},
         "liveness on /v2/health/live"),
        (container["securityContext"]["runAsNonRoot"] is True, "runs as non-root"),
    ]
    model = service["spec"]["predictor"]["model"]
    want += [
        (service["kind"] == "InferenceService", "InferenceService kind"),
        (model["runtime"] == runtime["metadata"]["name"], "the service names the runtime"),
        (model["modelFormat"]["name"] == "onnx", "the service's model is onnx"),
        (model["protocolVersion"] == "v2", "the service uses protocol v2"),
    ]
    with open(os.path.join(HERE, "container", "Dockerfile")) as f:
        docker = f.read()
    last = docker[docker.rindex("\nFROM "):]
    want += [
        (re.search(r"^USER 10001", docker, re.M) is not None, "the image runs as a non-root user"),
        ("packaging/bundle.sh" in docker, "the image holds the release bundle"),
        (re.search(r'^ENTRYPOINT \["epx", "serve"', docker, re.M) is not None,
         "the entry point is epx serve"),
        ("/v2/health/ready" in docker and "HEALTHCHECK" in docker, "a health check on /v2/health"),
        (re.search(r"^EXPOSE 8000 8001 8002$", docker, re.M) is not None, "the three ports exposed"),
        ("AS runtime" in last, "the default stage is the runtime"),
    ]
    errors += [f"not so: {what}" for ok, what in want if not ok]
    for e in errors:
        print(e)
    version = importlib.metadata.version("kserve")
    print(f"packaging/check.py: {len(want)} properties, the manifests against kserve "
          f"{version}'s API types: {'ok' if not errors else f'{len(errors)} errors'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
