"""Hugging Face transformers on flash_kernels: generate() and a training step, against sdpa in the same run.

The model is a random Llama (no download): 4 layers, hidden 2048, 16 query heads over 4 key/value heads
(GQA, head dim 128), bf16. Both implementations load the same weights.

- generate: batch 8, 128 prompt tokens, 256 new tokens, greedy, transformers' default (dynamic) cache; wall
  time of the whole call after one warm-up, median of --repeats. Eager decode is where a slow host path
  shows: each new token runs every layer's attention once, on one query row.
- train step: forward + backward of the causal-LM loss, batch 8 x 1024 tokens; median of --repeats after two
  warm-ups (CUDA events around the step).
- The generated tokens of both implementations are compared; in bf16 a near-tie logit may flip a greedy
  choice, so the share of equal tokens is reported rather than asserted.

    PYTHONPATH=flash_kernels python3 benchmarks/bench_generate.py [--repeats 5] [--out FILE.json]

Needs transformers 5.x; prints one table, with the ratio sdpa / fk_attention (> 1: flash_kernels is faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

IMPLEMENTATIONS = ("sdpa", "fk_attention")


def make_model(implementation: str, state=None):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation)
    model = model.to("cuda", torch.bfloat16).eval()
    if state is not None:
        model.load_state_dict(state)
    assert model.config._attn_implementation == implementation
    return model


def time_generate(model, prompt, new_tokens: int, repeats: int):
    def run():
        return model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )

    with torch.no_grad():
        tokens = run()
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    return statistics.median(times), tokens


def time_train_step(model, batch: int, seqlen: int, repeats: int) -> float:
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, seqlen), device="cuda", generator=g)
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()

    for _ in range(2):
        step()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    model.eval()
    model.zero_grad(set_to_none=True)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--train-seqlen", type=int, default=1024)
    ap.add_argument("--out", help="write the result as JSON here")
    args = ap.parse_args(argv)
    try:
        import transformers
    except ImportError as exc:
        print(f"needs transformers 5.x: {exc}", file=sys.stderr)
        return 2
    import flash_kernels.integrations.transformers  # noqa: F401  (registers fk_attention)

    g = torch.Generator(device="cuda").manual_seed(0)
    prompt = torch.randint(1, 32000, (args.batch, args.prompt), device="cuda", generator=g)
    state = make_model("sdpa").state_dict()
    results, tokens = {}, {}
    for impl in IMPLEMENTATIONS:
        model = make_model(impl, state)
        gen_s, tokens[impl] = time_generate(model, prompt, args.new_tokens, args.repeats)
        train_s = time_train_step(model, args.batch, args.train_seqlen, args.repeats)
        results[impl] = {"generate_s": gen_s, "train_step_s": train_s}
        print(f"{impl:13s} generate {gen_s:7.3f} s   train step {train_s * 1e3:7.2f} ms", flush=True)
        del model
        torch.cuda.empty_cache()
    same = (tokens["sdpa"] == tokens["fk_attention"]).float().mean().item()
    ratios = {
        "generate_sdpa_over_fk": results["sdpa"]["generate_s"] / results["fk_attention"]["generate_s"],
        "train_sdpa_over_fk": results["sdpa"]["train_step_s"] / results["fk_attention"]["train_step_s"],
    }
    print(
        f"sdpa / fk_attention: generate {ratios['generate_sdpa_over_fk']:.3f}, "
        f"train step {ratios['train_sdpa_over_fk']:.3f}; equal generated tokens {same:.3f}"
    )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(
                {
                    "command": "PYTHONPATH=flash_kernels python3 benchmarks/bench_generate.py "
                    + " ".join(argv if argv is not None else sys.argv[1:]),
                    "device": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "transformers": transformers.__version__,
                    "setup": vars(args),
                    "results": results,
                    "ratios": ratios,
                    "equal_token_share": same,
                },
                fh,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
