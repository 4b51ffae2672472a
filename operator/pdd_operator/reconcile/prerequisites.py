"""What the engines wait for before they are applied: the model's Secret and claims, the
sidecar token Secret (token.py), a parallelism that fits the model, and the gang scheduler's
API where instances span nodes. Each check says when to look again while it is not met
(nothing watches Secrets, claims or the served APIs)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Generic, TypeVar

from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.kube.client import api_error_message
from pdd_operator.reconcile.memory import DeploymentRecord
from pdd_operator.reconcile.ports import Ports, key_of
from pdd_operator.reconcile.token import TokenCheck, check_token
from pdd_operator.status.gang import GangReadiness, gang_api, gang_readiness
from pdd_operator.status.model import (
    ModelFacts,
    ModelReadiness,
    claim_facts,
    engine_roles_held,
    model_readiness,
    model_references,
    secret_reports,
)
from pdd_operator.status.parallelism import (
    ParallelismVerdict,
    engines_held_by,
    parallelism_verdict,
)

log = logging.getLogger(__name__)

# While the model's Secret or claim is missing, the pass asks again after this many seconds,
# doubling up to the maximum: nothing watches Secrets or claims (the operator may only get
# them), and the periodic resync is minutes apart.
MODEL_RETRY_FIRST_S = 2.0
MODEL_RETRY_MAX_S = 60.0
# How long a discovery answer about a gang scheduler's API holds (it changes when a cluster
# admin enables a feature gate or installs Kueue/Volcano: rare, and worth a pass then).
GANG_API_RECHECK_S = 30.0
CONFLICT_RETRY_SECONDS = 5.0


T = TypeVar("T")


@dataclass(frozen=True)
class Checked(Generic[T]):
    """A check's answer, and in how many seconds to look again (None: no need)."""

    answer: T
    again_in: float | None = None


@dataclass(frozen=True)
class Readiness:
    """What the engines wait for, checked once per pass."""

    model: ModelReadiness
    token: TokenCheck
    parallelism: ParallelismVerdict | None
    gang: GangReadiness | None
    # The engine workloads are neither created nor changed (running ones keep running).
    engines_held: bool = False
    # The instances over several nodes wait for the gang scheduler.
    gang_waiting: bool = False
    again_in: tuple[float, ...] = ()  # when a check not met asks to look again


class Prerequisites:
    def __init__(self, ports: Ports, model_retry: tuple[float, float]) -> None:
        self.ports = ports
        self.model_retry = model_retry
        # A name someone else holds is looked at again after this long (doubling, up to
        # CONFLICT_RETRY_MAX_SECONDS for a child's): the object holding it is not watched (it
        # may carry no label of ours), so nothing else would say it is gone before a resync.
        self.conflict_retry_seconds = CONFLICT_RETRY_SECONDS
        # Discovery of the gang schedulers' APIs: (api, plural) -> (when, served).
        self._served: dict[tuple[str, str], tuple[float, bool]] = {}

    async def check(
        self,
        pdd: PDDeployment,
        record: DeploymentRecord,
        had_children: bool,
        may_create_token: bool = True,
    ) -> Readiness:
        """Every prerequisite. The token Secret is looked at, and created when missing,
        before the engines are applied: their pods mount it, and a Secret of its name that
        is not this deployment's (found, or planted before a late create) holds a token
        someone else may know. `had_children`: the deployment had children when the pass
        began (token.py tells an existing Secret's maker by it); `may_create_token`: False
        holds the token's create for a later pass (the engines wait)."""
        model = await self.model(pdd, record)
        token = await check_token(self.ports, pdd, record, had_children, may_create_token)
        parallelism = parallelism_verdict(pdd.spec)
        gang = await self.gang(pdd)
        token_again = self.conflict_retry_seconds if token.conflicting else None
        again = tuple(d for d in (model.again_in, token_again, gang.again_in) if d is not None)
        held = engine_roles_held(model.answer) or not token.ours or engines_held_by(parallelism)
        waiting = gang.answer is not None and not gang.answer.ready
        return Readiness(model.answer, token, parallelism, gang.answer, held, waiting, again)

    async def model(self, pdd: PDDeployment, record: DeploymentRecord) -> Checked[ModelReadiness]:
        """Whether the Secret and claims of spec.model.source are there; while one is not,
        look again (with backoff) to notice when it appears."""
        facts = await asyncio.to_thread(self._model_facts, pdd)
        readiness = model_readiness(pdd, facts)
        if readiness.ready is True:
            record.model_attempts = 0
            return Checked(readiness)
        attempt = record.model_attempts
        record.model_attempts = attempt + 1
        first, most = self.model_retry
        return Checked(readiness, min(first * 2**attempt, most))

    def _model_facts(self, pdd: PDDeployment) -> ModelFacts:
        refs = model_references(pdd.spec)
        if refs.empty:
            return ModelFacts()
        missing, key_missing = False, False
        if refs.secret is not None:  # never read: what the engine pods' kubelets report
            problems = (pod.problem for pod in self.ports.view.pods(key_of(pdd)))
            missing, key_missing = secret_reports(problems, pdd.namespace, refs.secret)
        try:
            claims = {
                use.name: claim_facts(self.ports.kube.read_pvc(pdd.namespace, use.name))
                for use in refs.claims
            }
        except Exception as err:  # an answer other than "not found": say so, hold nothing
            log.warning("checking the model of %s/%s failed: %s", pdd.namespace, pdd.name, err)
            return ModelFacts(error=api_error_message(err))
        return ModelFacts(secret_exists=not missing, secret_key_missing=key_missing, claims=claims)

    async def gang(self, pdd: PDDeployment) -> Checked[GangReadiness | None]:
        """Whether the gang scheduler of spec.scheduling.gang is served, where instances span
        nodes (None: no gang needed). Discovery answers are kept a while; while the API is
        missing, look again, so enabling it later is noticed."""
        api = gang_api(pdd)
        if api is None:
            return Checked(None)
        now = time.monotonic()
        cached = self._served.get(api)
        if cached is None or now - cached[0] > GANG_API_RECHECK_S:
            try:
                served = await asyncio.to_thread(self.ports.kube.serves, *api)
            except Exception as err:  # unknown this pass: hold nothing new, say nothing
                log.warning("discovery of %s failed: %s", api[0], err)
                return Checked(None)
            self._served[api] = cached = (now, served)
        again = None if cached[1] else GANG_API_RECHECK_S
        return Checked(gang_readiness(pdd, cached[1]), again)
