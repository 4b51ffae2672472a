from __future__ import annotations

import pytest

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import PDDeployment


@pytest.fixture
def pdd() -> PDDeployment:
    return make_pdd()
