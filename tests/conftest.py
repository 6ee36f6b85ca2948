import os

import pytest

os.environ.setdefault("TVM_BACKTRACE", "1")


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        # the longest tests first (stable otherwise): pytest-xdist hands tests out in this order, so a minute-long
        # test no longer starts last and sets the end of the run
        items.sort(key=lambda item: "heavy" not in item.keywords)
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
