"""flash_kernels inside Hugging Face transformers (optional dependency: skipped without it).

Small models built from a config with random weights (no download): a GQA Llama, a GQA Mistral
with a sliding window, and a Gemma2 for softcap (with its sliding window). Each check runs the
model twice in the test dtype, with flash_kernels and with transformers' sdpa, and once in a
reference dtype with sdpa, and asks
flash_kernels' error against the reference to be at most twice sdpa's (plus half an ulp of the
reference's magnitude): logits of a right- and a left-padded batch, every parameter's gradient
after one backward step, logits of packed sequences (position_ids restarting at 0), and greedy
generation from a left-padded batch, where each chosen token must be the reference's argmax
up to twice sdpa's logit error (random weights make near-ties). GPU tier: bf16 against float32.
CPU tier (interpreter): float32 against float64.

Gemma2's baseline is eager (transformers refuses sdpa for it: softcap), and its batches are not
padded: eager Gemma2 returns NaN at valid positions of any padded batch in transformers 5.x
(fully masked rows), so padding is covered by Llama and Mistral.
"""

from __future__ import annotations

import copy

import pytest
import torch

from .params import maybe_gpu
from .reference import HALF_ULP, check_close

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (optional: pip install transformers)")
fk_tf = pytest.importorskip("flash_kernels.integrations.transformers",
                            reason="transformers present but not a 5.x release with AttentionInterface")

BASELINE = {"llama": "sdpa", "mistral": "sdpa", "gemma2": "eager"}
PADDED = {"llama": True, "mistral": True, "gemma2": False}


def _config(family: str, device):
    small = device.type == "cpu"
    hidden, heads, kv_heads, layers = (64, 4, 2, 2) if small else (256, 8, 2, 2)
    common = dict(vocab_size=128 if small else 512, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                  max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  initializer_range=0.1)
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "mistral":
        return transformers.MistralConfig(**common, sliding_window=7)
    return transformers.Gemma2Config(**common, head_dim=hidden // heads, sliding_window=6,
                                     attn_logit_softcapping=5.0, final_logit_softcapping=30.0,
                                     query_pre_attn_scalar=hidden // heads)


def _models(family, device, dtype, ref_dtype):
    torch.manual_seed(0)
    config = _config(family, device)

    def build(implementation):
        # A config of its own: modules read config._attn_implementation at every call.
        return transformers.AutoModelForCausalLM.from_config(
            copy.deepcopy(config), attn_implementation=implementation).to(device=device, dtype=ref_dtype)

    ours = build(fk_tf.ATTN_IMPLEMENTATION)
    state = ours.state_dict()
    sdpa, ref = build(BASELINE[family]), build(BASELINE[family])
    sdpa.load_state_dict(state)
    ref.load_state_dict(state)
    assert ours.config._attn_implementation == fk_tf.ATTN_IMPLEMENTATION
    return ours.to(dtype), sdpa.to(dtype), ref


def _batch(device, vocab, padding_side):
    torch.manual_seed(1)
    lengths = [19, 11, 4] if padding_side else [19, 19, 19]
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        cols = slice(width - n, width) if padding_side == "left" else slice(0, n)
        ids[b, cols] = torch.randint(3, vocab, (n,), device=device)
        mask[b, cols] = 1
    return ids, mask


def _params():
    for family in BASELINE:
        yield maybe_gpu(family, torch.float32, torch.float64, cpu=True, id=f"{family}-fp32-vs-fp64")
        yield maybe_gpu(family, torch.bfloat16, torch.float32, cpu=False, id=f"{family}-bf16-vs-fp32")


def _report(name, ours, sdpa):
    print(f"TRANSFORMERS_CHECK {name}: flash_kernels err {ours:.3e}  sdpa err {sdpa:.3e}")


def _logits(model, ids, mask=None, **kwargs):
    return model(input_ids=ids, attention_mask=mask, **kwargs).logits.float()


@pytest.mark.parametrize("family,dtype,ref_dtype", list(_params()))
def test_forward_backward_generate(device, family, dtype, ref_dtype):
    if device.type == "cpu" and dtype != torch.float32:
        pytest.skip("the interpreter tier runs float32 models")
    ours, sdpa, ref = _models(family, device, dtype, ref_dtype)
    vocab = ours.config.vocab_size
    name = f"{family} {str(dtype)[6:]} vs {str(ref_dtype)[6:]}"

    sides = ("right", "left") if PADDED[family] else ("",)
    for side in sides:
        ids, mask = _batch(device, vocab, side)
        valid = mask.bool()
        with torch.no_grad():
            out_ours, out_sdpa, out_ref = (_logits(m, ids, mask)[valid] for m in (ours, sdpa, ref))
        _report(f"{name} logits {side or 'un'}padded", (out_ours - out_ref).abs().max().item(),
                (out_sdpa - out_ref).abs().max().item())
        check_close(f"logits ({side or 'no'} padding)", out_ours, out_ref, out_sdpa, dtype)

    # One backward step on the last batch (left-padded where padding is tested).
    labels = ids.masked_fill(mask == 0, -100)
    grads = []
    for model in (ours, sdpa, ref):
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        grads.append({n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None})
    g_ours, g_sdpa, g_ref = grads
    assert g_ours.keys() == g_ref.keys()
    worst_ours = max((g_ours[n] - g_ref[n]).abs().max().item() for n in g_ref)
    worst_sdpa = max((g_sdpa[n] - g_ref[n]).abs().max().item() for n in g_ref)
    _report(f"{name} grads (max over parameters)", worst_ours, worst_sdpa)
    for n in g_ref:
        check_close(f"grad {n}", g_ours[n], g_ref[n], g_sdpa[n], dtype)

    # Packed sequences: one row, positions restarting at 0, against each sequence on its own.
    torch.manual_seed(2)
    pieces = [torch.randint(3, vocab, (n,), device=device) for n in (9, 14, 5)]
    packed = torch.cat(pieces)[None]
    positions = torch.cat([torch.arange(len(p), device=device) for p in pieces])[None]
    with torch.no_grad():
        out_ours = _logits(ours, packed, position_ids=positions)[0]
        out_sdpa = torch.cat([_logits(sdpa, p[None])[0] for p in pieces])
        out_ref = torch.cat([_logits(ref, p[None])[0] for p in pieces])
    _report(f"{name} logits packed", (out_ours - out_ref).abs().max().item(),
            (out_sdpa - out_ref).abs().max().item())
    check_close("logits (packed by position_ids)", out_ours, out_ref, out_sdpa, dtype)

    # Greedy generation from the last batch (left-padded where padding is tested).
    new = 4 if device.type == "cpu" else 8
    settings = dict(max_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        seq_ours = ours.generate(input_ids=ids, attention_mask=mask, **settings)
        seq_sdpa = sdpa.generate(input_ids=ids, attention_mask=mask, **settings)
        full_mask = torch.cat([mask, torch.ones_like(seq_ours[:, ids.shape[1]:])], dim=1)
        teacher = _logits(ref, seq_ours, full_mask)
        teacher_sdpa = _logits(sdpa, seq_ours, full_mask)
    width = ids.shape[1]
    steps = teacher[:, width - 1:-1]  # logits that chose each generated token
    chosen = steps.gather(-1, seq_ours[:, width:, None])[..., 0]
    margin = steps.max(-1).values - chosen
    noise = (teacher_sdpa - teacher)[:, width - 1:-1].abs().max().item()
    tol = 2 * noise + HALF_ULP[dtype] * steps.abs().max().item()
    same = (seq_ours[:, width:] == seq_sdpa[:, width:]).float().mean().item()
    print(f"TRANSFORMERS_CHECK {name} generate: worst margin to the reference argmax {margin.max().item():.3e} "
          f"(tolerance {tol:.3e}); tokens equal to sdpa's: {same:.0%}")
    assert margin.max().item() <= tol, "a generated token is not the reference's argmax within tolerance"


def test_register_refuses_flash_names():
    with pytest.raises(ValueError, match="contains 'flash'"):
        fk_tf.register("flash_kernels")
