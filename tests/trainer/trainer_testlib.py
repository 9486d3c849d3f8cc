"""Helpers shared by the trainer tests: a tiny random Qwen2 and synthetic batches."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import random  # noqa: E402

import torch  # noqa: E402

from posttrain.trainer.batch import TrainBatch, TrainRow  # noqa: E402
from posttrain.trainer.losses import BatchTotals  # noqa: E402

VOCAB = 64

# The shared loss example of test_trainer_losses.py and test_trainer_losses_more.py (worked out
# in test_trainer_losses.py's docstring): 2 groups of 2 sequences, 3 completion tokens each.
EPS = 1e-6
a = 0.25 / (0.25 + EPS)
b = 0.5 / (0.5 + EPS)
REWARD_B = torch.tensor([1.0, 0.0, 1.0, 0.5])
GROUP_B = torch.tensor([0, 0, 1, 1])
RATIO_BT = torch.tensor([[1.0, 1.5, 0.5], [1.5, 0.5, 3.0], [1.1, 1.25, 1.0], [0.7, 2.0, 2.0]])
MASK_BT = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
TOTALS = BatchTotals(n_sequences=4, n_tokens=9)
BEHAVIOUR_BT = torch.full((4, 3), -2.0)


def tiny_model(seed: int = 0, tied: bool = False):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    return AutoModelForCausalLM.from_config(config)


def reference_logprobs(model, prompt, completion, temperature=1.0):
    """Per-token log_softmax(logits / T) of `completion`, one unpadded sequence at a
    time: the way an engine scores the tokens it samples."""
    t = temperature if temperature > 0 else 1.0
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = (logits / t).log_softmax(-1)
    p = len(prompt)
    return tuple(float(logp[p - 1 + c, tok]) for c, tok in enumerate(completion))


def sample(model, prompt, n_tokens, temperature, gen):
    """Sample like an engine: full forward per token, log_softmax(logits / T)."""
    ids, logps = list(prompt), []
    with torch.no_grad():
        for _ in range(n_tokens):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            logp = (logits / temperature).log_softmax(-1)
            tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
            ids.append(tok)
            logps.append(float(logp[tok]))
    return tuple(ids[len(prompt) :]), tuple(logps)


def synthetic_batch(
    seed: int, n_groups: int = 3, group_size: int = 4, model=None, temperature: float = 1.0
) -> TrainBatch:
    """Prompts of 2-5 tokens, completions of 1-6; rewards 0/1 with both values
    in every group but the last, which is all 1 (so it carries no signal). Behaviour log-probs come from `model` when
    given (on-policy), else a fixed off-policy value."""
    rng = random.Random(seed)
    rows = []
    for g in range(n_groups):
        prompt = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(2, 5)))
        for k in range(group_size):
            completion = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, 6)))
            behaviour = (
                reference_logprobs(model, prompt, completion, temperature)
                if model is not None
                else tuple(-4.0 - 0.1 * rng.random() for _ in completion)
            )
            reward = 1.0 if g == n_groups - 1 else float(k == 0 or (k > 1 and rng.random() < 0.5))
            rows.append(TrainRow(prompt, completion, behaviour, reward, f"g{g}", (1,) * len(completion), temperature))
    return TrainBatch(tuple(rows))


def params_of(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same_params(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    out = []
    for state in optimizer.state_dict()["state"].values():
        out.extend(v.detach().clone() for _, v in sorted(state.items()) if torch.is_tensor(v))
    return out


def one_pixel_changed(image):
    """`image` (a posttrain.types.Image) with its middle pixel's red channel inverted: the planted
    fault of the pixel-path tests (test_trainer_pixels.py, test_trainer_pixels_multiturn.py)."""
    import io

    from PIL import Image as PILImage

    from posttrain.domains._vision import encode_png
    from posttrain.types import Image

    pic = PILImage.open(io.BytesIO(image.png)).convert("RGB")
    x, y = image.width // 2, image.height // 2
    r, g, b = pic.getpixel((x, y))
    pic.putpixel((x, y), (255 - r, g, b))
    return Image.from_png(encode_png(pic.tobytes(), image.width, image.height))
