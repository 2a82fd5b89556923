"""The labels other P/D stacks put on their engine pods, read from their own code.

Each preset names, per role, the label selectors that find that role's pods (a role may
have several, for an operator's old and new labelling: a pod is in the role when any of
them matches), and where the engine serves in the pod (:class:`~pdctl.sdk.kube.pods.PortHint`).
``tests/unit/test_kube_presets.py`` checks each preset against the upstream files below,
stored in ``tests/fixtures/kube/``.

* ``llm-d`` (llm-d-incubation/llm-d-modelservice, the llm-d Helm chart for P/D,
  commit 3051935eb5a49f6df21cd6aeb5e4f05b98799262):
  ``charts/llm-d-modelservice/templates/_helpers.tpl`` adds ``llm-d.ai/role: prefill`` or
  ``decode`` to each role's pod template; ``examples/output-pd.yaml`` (the chart rendered)
  shows the engine container ``vllm`` serving on its ``--port`` (8000 prefill, 8200
  decode, behind the decode's ``routing-proxy`` sidecar on 8000).
* ``kserve`` (kserve/kserve, commit aaac4e294dae2c7b1aa1886447793f3aa1c30912), the
  LLMInferenceService controller: ``pkg/controller/v1alpha2/llmisvc/workload_single_node.go``
  and ``workload_multi_node.go`` label the engine pods ``kserve.io/component: workload``
  and ``llm-d.ai/role: prefill``, ``decode`` or ``both`` (no separate prefill),
  constants in ``pkg/constants/constants.go``; the templates
  ``config/llmisvcconfig/config-llm-{prefill,decode}-template.yaml`` run vLLM in the
  container ``main`` (``--port 8000`` prefill, ``--port 8001`` decode behind the
  ``llm-d-routing-sidecar`` on 8000), over HTTPS when the controller's TLS is on.
* ``dynamo`` (ai-dynamo/dynamo): the operator's ``deploy/operator/internal/consts/consts.go``
  (commit d195d280e13e5532510a1004ad8d8d06f2f8266a) names the labels
  ``nvidia.com/dynamo-component-type`` (``prefill``/``decode``; ``worker`` in the legacy
  form, with ``nvidia.com/dynamo-sub-component-type: prefill|decode``, as the operator's
  ``getDCDWorkloadPodLabels`` writes them), the container ``main`` (``MainContainerName``)
  and the worker's port ``system`` (9090); ``deploy/operator/internal/dynamo/component_worker.go``
  (commit 015d780ba9c3d32c293ad67b786fe9af0d8a4d22) puts that port, its probes and
  ``DYN_SYSTEM_PORT`` on every worker, where Dynamo serves vLLM's ``vllm:*`` series next to
  its own (``docs/backends/vllm/prometheus.md``). Too large to copy into the tests: cited.
* ``pdctl``: what pdctl's own Kubernetes backend creates (:mod:`pdctl.sdk.k8slabels`),
  router included.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdctl.sdk import k8slabels
from pdctl.sdk.errors import PdctlError
from pdctl.sdk.kube.pods import PortHint

LLMD_ROLE = "llm-d.ai/role"
KSERVE_COMPONENT = "kserve.io/component"
DYNAMO_TYPE = "nvidia.com/dynamo-component-type"
DYNAMO_SUBTYPE = "nvidia.com/dynamo-sub-component-type"


@dataclass(frozen=True)
class Preset:
    name: str
    rules: tuple[tuple[str, str], ...]
    """(role, label selector), in the order a pod is classified."""
    hint: PortHint
    about: str

    def selectors(self, role: str) -> list[str]:
        return [s for r, s in self.rules if r == role]


PRESETS: dict[str, Preset] = {
    "llm-d": Preset(
        "llm-d",
        (("prefill", f"{LLMD_ROLE}=prefill"), ("decode", f"{LLMD_ROLE}=decode")),
        PortHint(container="vllm"),
        "llm-d's modelservice Helm chart (llm-d.ai/role)",
    ),
    "kserve": Preset(
        "kserve",
        (
            ("prefill", f"{KSERVE_COMPONENT}=workload,{LLMD_ROLE}=prefill"),
            ("decode", f"{KSERVE_COMPONENT}=workload,{LLMD_ROLE}=decode"),
            ("colocated", f"{KSERVE_COMPONENT}=workload,{LLMD_ROLE}=both"),
        ),
        PortHint(container="main"),
        "KServe's LLMInferenceService (kserve.io/component=workload, llm-d.ai/role)",
    ),
    "dynamo": Preset(
        "dynamo",
        (
            ("prefill", f"{DYNAMO_TYPE}=prefill"),
            ("prefill", f"{DYNAMO_TYPE}=worker,{DYNAMO_SUBTYPE}=prefill"),
            ("decode", f"{DYNAMO_TYPE}=decode"),
            ("decode", f"{DYNAMO_TYPE}=worker,{DYNAMO_SUBTYPE}=decode"),
        ),
        PortHint(container="main", port="system"),
        "NVIDIA Dynamo's operator (nvidia.com/dynamo-component-type, -sub-component-type)",
    ),
    "pdctl": Preset(
        "pdctl",
        tuple(
            (role, f"{k8slabels.MANAGED_BY}=pdctl,{k8slabels.ROLE}={role}")
            for role in ("prefill", "decode", "colocated", "router")
        ),
        PortHint(container=None, port="http"),
        "pdctl's own Kubernetes backend (pdctl.io/role)",
    ),
}


def preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise PdctlError(
            f"--k8s-preset {name!r}: no such preset; choose one of {', '.join(PRESETS)} "
            "(or give --k8s-prefill-selector/--k8s-decode-selector yourself)"
        ) from None


def rules_for(
    preset_name: str | None = None,
    *,
    prefill: str | None = None,
    decode: str | None = None,
    router: str | None = None,
) -> tuple[list[tuple[str, str, str]], PortHint]:
    """(role, selector, the option it came from) per rule, and the port hint: the
    preset's rules, each role's replaced by the selector given for it."""
    base = preset(preset_name) if preset_name else None
    given = {"prefill": prefill, "decode": decode, "router": router}
    out: list[tuple[str, str, str]] = []
    for role in ("prefill", "decode", "colocated", "router"):
        mine = given.get(role)
        if mine is not None:
            out.append((role, mine, f"--k8s-{role}-selector"))
        elif base is not None:
            out.extend((role, s, f"the {base.name} preset") for s in base.selectors(role))
    if not any(r in ("prefill", "decode", "colocated") for r, _, _ in out):
        raise PdctlError(
            "Kubernetes discovery needs the engines' labels: give --k8s-preset "
            f"({', '.join(PRESETS)}) or --k8s-prefill-selector/--k8s-decode-selector"
        )
    return out, base.hint if base is not None else PortHint()
