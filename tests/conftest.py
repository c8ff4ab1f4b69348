import os

# Nothing in the suite may touch the network: hub lookups fail fast instead of retrying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from temper.models import build_preset, build_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def nano(tokenizer):
    return build_preset("nano", tokenizer, seed=0)
