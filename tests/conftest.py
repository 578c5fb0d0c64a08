import os

# Two virtual XLA:CPU devices, so tpu:1 is testable on any machine (read when torch loads the backend).
os.environ.setdefault("TORCHTPU_NUM_DEVICES", "2")


import sys  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles its own modules: forget earlier ones, as PyTorch's own suite does, so
    Dynamo's per-code-object recompile limit (8) counts one test's recompilations only."""
    yield
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
    # a test that queued a bad index without reading back must not fail the next test's first sync
    asserts = sys.modules.get("torchtpu.eager.asserts")
    if asserts is not None:
        asserts.discard()
