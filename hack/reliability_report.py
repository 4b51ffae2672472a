"""`make reliability`: regenerate docs/reliability.md from real runs.

Every bad input of tests/integration/test_admission.py is sent to a freshly started local
control plane (dry-run create, strict field validation) and the API server's own answer is
recorded; the fault, rollout and security tests are run with pytest and their outcomes and
durations recorded. Nothing in the document is written by hand.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.operator_proc import install_crd  # noqa: E402
from pdd_localcluster.controlplane import LocalControlPlane  # noqa: E402

FAULT_TESTS = [
    "tests/integration/test_faults.py",
    "tests/integration/test_failures.py",
    "tests/integration/test_transient_failures.py",
    "tests/integration/test_rollout.py",
    "tests/integration/test_transfer_status.py",
    "tests/integration/test_placement.py",
    "tests/integration/test_name_conflicts.py",
    "tests/integration/test_injected_settings.py",
    "tests/integration/test_ownership.py",
    "tests/integration/test_leader_election.py",
    "tests/integration/test_secrets_unread.py",
    "tests/integration/test_model_prerequisites.py",
    "tests/chart/test_manifests_rbac.py",
    "tests/chart/test_podtemplate_policy.py",
    "tests/chart/test_user_roles.py",
    "tests/chart/test_least_privilege.py",
]


# What makes a PDDeployment Stalled and what leaves it Reconciling (status.compute).
STALLED_RULE = [
    "## Stalled only where waiting cannot help",
    "",
    "`Stalled=True` says the deployment will not progress until a person acts (kstatus' meaning:",
    "Flux fails its health check at once, and docs/gitops.md's Argo CD check says Degraded). The",
    "operator sets it only for:",
    "",
    "- a spec it refuses (`InvalidSpec`), a name held by another owner (`NameConflict`,",
    "  `TokenSecretConflict`);",
    "- a write of a child that the API server refuses and will refuse again: a 4xx other than",
    "  408, 429 and 409 Conflict, such as 422 Invalid, 403 Forbidden (RBAC, a ResourceQuota, an",
    "  admission policy or a webhook that said no), 409 AlreadyExists, 404 (`ApplyFailed`);",
    "- pods refused by a quota or Pod Security (`PodsRefused`), a node prerequisite the",
    "  preflight found missing (`PreflightFailed`), a gang scheduler that is not served",
    "  (`GangSchedulerUnavailable`);",
    "- the model's claim Lost or of the wrong access modes (at once), and the model's Secret or",
    "  claim missing for more than 5 minutes (`ModelSecretMissing`, `ModelPVCMissing`).",
    "",
    "What time may cure is `Reconciling=True` (and `Stalled=False`), with the reason and the API",
    "server's own words in the message, and the operator tries again by itself:",
    "",
    "- a write that failed with 408, 429, a 5xx (the API server, or an admission webhook it could",
    '  not call or that timed out: "failed calling webhook", "context deadline exceeded"), a 409',
    "  Conflict, or no answer at all (connection refused or reset, a timeout): `ApplyRetrying`,",
    "  also Ready's reason; Degraded is left to the pods (they run as they were). Each request is",
    "  retried a few times within a pass, then the pass again after 2 s, doubling to every 60 s,",
    "  until a write goes through (`test_apply_retries.py`, `test_transient_failures.py`);",
    "- the model's Secret or claim missing, which an ExternalSecret, a provisioner or a GitOps",
    '  wave may create seconds later: `ModelSecretMissing` / `ModelPVCMissing`, with "waiting for',
    '  Secret hf-token (missing since ...; Stalled if still missing at ...)" and the fix, for 5',
    "  minutes from `status.waitingSince`. That is when the operator first found this generation",
    "  waiting: it survives an operator restart, and a new generation starts it anew. Then",
    "  `Stalled=True` with the same reason and fix; the engines start as soon as the object",
    "  exists, Stalled or not (docs/model-storage.md).",
    "",
]


def admission_rows(kubeconfig: Path) -> list[tuple[str, str, str]]:
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from test_admission import INVALID, spec_with

    api = config.new_client_from_config(config_file=str(kubeconfig))
    install_crd(api)
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "reliability"}})
    rows = []
    for case, changes, _ in INVALID:
        body = {
            "apiVersion": "pdd.dev/v1alpha1",
            "kind": "PDDeployment",
            "metadata": {"name": "bad"},
            "spec": spec_with(changes),
        }
        try:
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                "pdd.dev",
                "v1alpha1",
                "reliability",
                "pddeployments",
                body,
                dry_run="All",
                field_validation="Strict",
            )
            rows.append((case, json.dumps(changes), "ACCEPTED (a bug: it should be refused)"))
        except ApiException as err:
            message = json.loads(err.body)["message"]
            rows.append((case, json.dumps(changes), f"{err.status}: {message}"))
    return rows


def fault_rows() -> list[tuple[str, str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                *FAULT_TESTS,
                "-q",
                f"--junitxml={report}",
                "-p",
                "no:cacheprovider",
            ],
            cwd=ROOT,
            check=False,
        )
        tree = ET.parse(report)
    rows = []
    for case in tree.iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        outcome = "failed" if failed else "skipped" if skipped else "passed"
        doc = case.get("name", "")
        rows.append(
            (
                f"{case.get('classname', '').split('.')[-1]}::{doc}",
                outcome,
                f"{float(case.get('time', 0)):.1f} s",
            )
        )
    return rows


def recorded_fault_rows(document: Path) -> list[tuple[str, str, str]]:
    """The fault table's rows as the document at ``document`` records them."""
    rows = []
    for line in document.read_text().splitlines():
        if line.startswith("| `"):
            test, outcome, took = line[2:].removesuffix(" |").split(" | ")
            rows.append((test.strip("`").replace("\\|", "|"), outcome, took))
    return rows


def escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(
    admission: list[tuple[str, str, str]], faults: list[tuple[str, str, str]], version: str
) -> str:
    lines = [
        "# Reliability: faults survived, bad input refused",
        "",
        "Generated by `make reliability` (hack/reliability_report.py) against a local control",
        "plane",
        f"(kube-apiserver {version}); every row is a real run, nothing is written by hand.",
        "",
        "## Faults, rollouts and security",
        "",
        "Each test injects the fault into the real control plane and checks the outcome; its",
        "docstring and assertions in the named file say exactly what is checked.",
        "",
        "| test | outcome | time |",
        "|---|---|---|",
        *[f"| `{escape(t)}` | {o} | {d} |" for t, o, d in faults],
        "",
        "What the fault tests inject: the operator SIGKILLed while creating eight deployments'",
        "children (restart converges with exactly the expected children, each owned once);",
        "kube-apiserver stopped for 3 s and restarted while the operator runs (it reconnects and",
        "serves new and changed deployments); a node going NotReady (Degraded=NodeNotReady naming",
        "the node) and then deleted (the pod is rescheduled inside the placement domain and the",
        "status recovers); an engine upgrade walked step by step (lockstep roles, decode first,",
        "at most one instance per role out); a missing RDMA prerequisite (the preflight stops",
        "the pod, Degraded/Stalled and a Warning event carry the fix); a TCP-fallback probe",
        "result (KVTransferVerified=False with the fix); the operator running with its chart",
        "ServiceAccount (RBAC sufficient; no Secret readable: get, list and watch refused to",
        "every component); pods refused by a quota or Pod Security, a node deleted under a",
        "bound pod, the token Secret planted (PodsRefused, NodeLost, TokenSecretConflict) or",
        "deleted (on running pods: created again within seconds of the first pod's FailedMount,",
        "status naming the pod while a quota refuses it, the deployment serving again); the",
        "model's Secret missing (what the engine pods report: ModelSecretMissing); no Secret",
        "asked for by the operator's user in the audit log; child names taken by foreign objects",
        "(NameConflict: never taken over or deleted, only what runs against them held); children",
        "that lost their owner reference (taken back on the operator's proof); podTemplates",
        "overriding injected settings",
        "(InvalidSpec) or asking for node access (the chart's admission policy refuses them);",
        "forged status and look-alike pods (put back, not counted); who may create, read and",
        "write PDDeployments, and what the operator, agent, sidecar and router may do",
        "(SubjectAccessReview, impersonation and the components' own tokens against the chart's",
        "access policies). docs/security.md has the",
        "threat model these tests stand for.",
        "",
        *STALLED_RULE,
        "## Bad input",
        "",
        "Each spec is sent with `kubectl apply`-equivalent strict validation; the answer is the",
        "API server's own message (CEL rules and schema generated from the pydantic models).",
        "",
        "| case | spec fields set | API server answer |",
        "|---|---|---|",
        *[f"| {escape(c)} | `{escape(s)}` | {escape(a)} |" for c, s, a in admission],
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "docs" / "reliability.md"))
    parser.add_argument(
        "--bad-input-only",
        action="store_true",
        help="rerun the bad inputs only, keeping the fault rows of the document at --out "
        "(each row is still the record of a real run)",
    )
    args = parser.parse_args()
    with LocalControlPlane(controller_manager=False, scheduler=False) as cp:
        admission = admission_rows(cp.kubeconfig)
        version = cp.version
    faults = recorded_fault_rows(Path(args.out)) if args.bad_input_only else fault_rows()
    Path(args.out).write_text(render(admission, faults, version))
    print(
        f"wrote {args.out}: {len(admission)} bad inputs, {len(faults)} fault/rollout/security tests"
    )
    refused = all(not a.startswith("ACCEPTED") for _, _, a in admission)
    passed = all(o == "passed" for _, o, _ in faults)
    return 0 if refused and passed else 1


if __name__ == "__main__":
    sys.exit(main())
