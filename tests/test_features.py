"""capgate.local.hidden_states: hidden-state features and their spec, on a tiny random-weight Llama."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from capgate.core.backend import Prompt
from capgate.local.hidden_states import FeatureSpec, HiddenStateFeaturizer
from capgate.local.models import LoadedModel

QUERIES: list[Prompt] = [
    "What is 2+3?",
    "Hi",
    [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "How many legs do three spiders and two ants have in total?"},
    ],
    "Name the largest planet of the solar system and say why it is so large.",
]


def reference_states(loaded: LoadedModel, query: Prompt, *, chat_template: bool = True) -> torch.Tensor:
    """All hidden states of one unpadded query: shape (layers + 1, tokens, hidden)."""
    ids = torch.tensor([loaded.prompt_ids(query, chat_template=chat_template)])
    with torch.inference_mode():
        out = loaded.model(input_ids=ids, output_hidden_states=True)
    return torch.stack([h[0].float() for h in out.hidden_states])


def test_default_feature_is_last_token_mean_over_all_states(tiny_model: LoadedModel) -> None:
    featurizer = HiddenStateFeaturizer(tiny_model)
    features = featurizer.transform(QUERIES)
    assert features.shape == (len(QUERIES), 32)
    assert features.dtype == np.float32
    assert featurizer.layer_indices == (0, 1, 2)  # embeddings + 2 layers
    for row, query in enumerate(QUERIES):
        states = reference_states(tiny_model, query)
        assert states.shape[0] == 3
        np.testing.assert_allclose(features[row], states[:, -1, :].mean(dim=0).numpy(), atol=1e-5)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_alone_equals_padded_batch(tiny_model: LoadedModel, pooling: str) -> None:
    batched = HiddenStateFeaturizer(tiny_model, pooling=pooling, batch_size=len(QUERIES))  # type: ignore[arg-type]
    together = batched.transform(QUERIES)
    for row, query in enumerate(QUERIES):
        alone = batched.transform([query])
        np.testing.assert_allclose(together[row], alone[0], atol=1e-5)
    # The lengths really differ, so the batch was padded.
    lengths = {len(tiny_model.prompt_ids(q)) for q in QUERIES}
    assert len(lengths) == len(QUERIES)


def test_batch_size_does_not_change_results(tiny_model: LoadedModel) -> None:
    one = HiddenStateFeaturizer(tiny_model, batch_size=1).transform(QUERIES)
    three = HiddenStateFeaturizer(tiny_model, batch_size=3).transform(QUERIES)
    np.testing.assert_allclose(one, three, atol=1e-5)


def test_mean_pooling_is_masked_token_mean(tiny_model: LoadedModel) -> None:
    features = HiddenStateFeaturizer(tiny_model, pooling="mean", layers=[1, 2]).transform(QUERIES)
    for row, query in enumerate(QUERIES):
        states = reference_states(tiny_model, query)
        expected = states[1:3].mean(dim=1).mean(dim=0).numpy()
        np.testing.assert_allclose(features[row], expected, atol=1e-5)


def test_layer_zero_is_the_token_embedding(tiny_model: LoadedModel) -> None:
    features = HiddenStateFeaturizer(tiny_model, layers=[0]).transform(QUERIES[:2])
    embedding = tiny_model.model.get_input_embeddings().weight
    for row, query in enumerate(QUERIES[:2]):
        last = tiny_model.prompt_ids(query)[-1]
        np.testing.assert_allclose(features[row], embedding[last].detach().numpy(), atol=1e-6)


def test_negative_layers_count_from_the_end(tiny_model: LoadedModel) -> None:
    negative = HiddenStateFeaturizer(tiny_model, layers=[-1])
    assert negative.layer_indices == (2,)
    assert negative.spec.layers == (2,)
    np.testing.assert_array_equal(
        negative.transform(QUERIES), HiddenStateFeaturizer(tiny_model, layers=[2]).transform(QUERIES)
    )
    assert HiddenStateFeaturizer(tiny_model, layers=[2, 0, -3]).layer_indices == (0, 2)


def test_chat_template_off_reads_plain_text(tiny_model: LoadedModel) -> None:
    plain = HiddenStateFeaturizer(tiny_model, chat_template=False)
    features = plain.transform(["What is 2+3?"])
    states = reference_states(tiny_model, "What is 2+3?", chat_template=False)
    np.testing.assert_allclose(features[0], states[:, -1, :].mean(dim=0).numpy(), atol=1e-5)
    assert not plain.spec.chat_template
    templated = HiddenStateFeaturizer(tiny_model).transform(["What is 2+3?"])
    assert np.abs(features - templated).max() > 1e-3


def test_spec_describes_the_features(tiny_model: LoadedModel) -> None:
    spec = HiddenStateFeaturizer(tiny_model).spec
    assert spec == FeatureSpec(
        model_id=tiny_model.model_id,
        weights_fingerprint=tiny_model.weights_fingerprint,
        layers="all",
        pooling="last",
        chat_template=True,
        dim=32,
        source="transformers",
    )
    # Listing every state is "all"; a subset is kept as sorted non-negative indices.
    assert HiddenStateFeaturizer(tiny_model, layers=[0, 1, 2]).spec.layers == "all"
    subset = HiddenStateFeaturizer(tiny_model, layers=[2, 1], pooling="mean").spec
    assert (subset.layers, subset.pooling) == ((1, 2), "mean")
    assert FeatureSpec.model_validate_json(subset.model_dump_json()) == subset


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"layers": []}, "non-empty"),
        ({"layers": [-1]}, "non-negative"),
        ({"layers": [2, 1]}, "sorted and distinct"),
        ({"pooling": "max"}, "pooling"),
        ({"dim": 0}, "dim"),
        ({"source": "onnx"}, "source"),
        ({"extra": 1}, "extra"),
    ],
)
def test_feature_spec_validation(fields: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"model_id": "m", "weights_fingerprint": "f", "dim": 4}
    with pytest.raises(ValidationError, match=message):
        FeatureSpec.model_validate({**base, **fields})


def test_bad_arguments_are_named(tiny_model: LoadedModel) -> None:
    with pytest.raises(ValueError, match="pooling must be 'last' or 'mean'; got 'max'"):
        HiddenStateFeaturizer(tiny_model, pooling="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layer index 3 is out of range: the model has 3 hidden states"):
        HiddenStateFeaturizer(tiny_model, layers=[3])
    with pytest.raises(ValueError, match="layer index -4"):
        HiddenStateFeaturizer(tiny_model, layers=[-4])
    with pytest.raises(ValueError, match="non-empty"):
        HiddenStateFeaturizer(tiny_model, layers=[])
    with pytest.raises(ValueError, match="'all' or a list"):
        HiddenStateFeaturizer(tiny_model, layers="last")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size must be a positive integer; got 0"):
        HiddenStateFeaturizer(tiny_model, batch_size=0)
    with pytest.raises(TypeError, match="LoadedModel"):
        HiddenStateFeaturizer("default")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wrap a single query in a list"):
        HiddenStateFeaturizer(tiny_model).transform("What is 2+3?")


def test_empty_input_gives_an_empty_matrix(tiny_model: LoadedModel) -> None:
    features = HiddenStateFeaturizer(tiny_model).transform([])
    assert features.shape == (0, 32)
    assert features.dtype == np.float32


@pytest.mark.slow
def test_docstring_examples_run(default_model_dir: object) -> None:
    import doctest

    import capgate.local.hidden_states

    result = doctest.testmod(capgate.local.hidden_states, raise_on_error=False)
    assert result.attempted >= 4
    assert result.failed == 0


def test_transform_layers_is_every_layer_of_one_pass(tiny_model: LoadedModel) -> None:
    featurizer = HiddenStateFeaturizer(tiny_model, batch_size=2)
    per_layer = featurizer.transform_layers(QUERIES)
    assert per_layer.shape == (len(QUERIES), tiny_model.num_hidden_layers + 1, tiny_model.hidden_size)
    np.testing.assert_array_equal(per_layer.mean(axis=1, dtype=np.float32), featurizer.transform(QUERIES))
    subset = HiddenStateFeaturizer(tiny_model, layers=[1, 2], batch_size=2)
    np.testing.assert_allclose(
        subset.transform(QUERIES), per_layer[:, 1:3].mean(axis=1), rtol=1e-6, atol=1e-6
    )
    both = featurizer.transform_layers(QUERIES, poolings=["last", "mean"])
    np.testing.assert_array_equal(both[:, 0], per_layer)
    mean_pooled = HiddenStateFeaturizer(tiny_model, pooling="mean", batch_size=2).transform_layers(QUERIES)
    np.testing.assert_array_equal(both[:, 1], mean_pooled)
    with pytest.raises(ValueError, match="poolings must hold"):
        featurizer.transform_layers(QUERIES, poolings=["max"])  # type: ignore[list-item]
