"""Shared by the off-policy tests: obp made importable without torch."""

from __future__ import annotations

import importlib.util
import os
import sys
import types


def obp_importable() -> bool:
    """Whether obp (the off-policy oracle, installed with ``--no-deps``) is there; if so, make its
    estimator and dataset modules importable without torch: obp's package ``__init__`` files import
    its torch-based policies, so a stub stands in for torch's type hints and ``obp.ope``,
    ``obp.dataset`` and ``obp.policy`` are registered as bare packages (their submodules then import
    on their own)."""
    if importlib.util.find_spec("obp") is None:
        return False
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        stub = types.ModuleType("torch")
        stub.Tensor = type("Tensor", (), {})
        sys.modules["torch"] = stub
    import obp

    root = os.path.dirname(obp.__file__)
    for sub in ("ope", "dataset", "policy"):
        name = f"obp.{sub}"
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = [os.path.join(root, sub)]
            sys.modules[name] = m
    pol = sys.modules["obp.policy"]
    for attr in ("BaseContextFreePolicy", "BaseContextualPolicy"):
        if not hasattr(pol, attr):
            setattr(pol, attr, object)
    return True

