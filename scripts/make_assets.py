"""Rebuild the embedded tokenizer and the bundled datasets in zero_kit/assets from scripts/asset_corpus.py.

Run from the repository root:  python -m scripts.make_assets [--out DIR]
Deterministic: running it twice gives byte-identical files (tests/unit/test_model_assets.py rebuilds them
into a temporary directory and compares every file with the shipped ones). Everything is written by this project; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from scripts import make_preference_data
from scripts.asset_corpus import PARAGRAPH_LINKS, TOPICS
from zero_kit.data.dataset import ALPACA_PROMPT, ALPACA_PROMPT_WITH_INPUT

ROOT = Path(__file__).resolve().parent.parent

ASSETS = ROOT / "zero_kit" / "assets"
VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
# Assistant turns end with eos (what generation stops on); other turns end with <|end|>. No newline after a
# turn's end, so an assistant turn's trained tokens are exactly its content plus eos. {% generation %} marks
# the assistant text for transformers' return_assistant_tokens_mask; zero_kit masks by rendering prefixes.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
SYSTEM_PROMPT = "You are a concise assistant for distributed training with DeepSpeed."


def _lower_first(text: str) -> str:
    return text[0].lower() + text[1:] if text[:2] != text[:2].upper() else text


def topic_rows() -> list[dict]:
    rows = []
    for name, what, detail, tip in TOPICS:
        rows.append({"instruction": f"Explain {name} in one sentence.", "input": "", "output": what})
        rows.append({"instruction": f"Give one practical tip about {name}.", "input": "", "output": tip})
        rows.append({"instruction": f"Tell me more about {name}.", "input": "", "output": f"{what} {detail}"})
        rows.append(
            {"instruction": "Which topic does this note describe?", "input": detail, "output": f"It describes {name}."}
        )
    return rows


def batch_rows(rng: random.Random, count: int) -> list[dict]:
    rows = []
    for _ in range(count):
        micro, accum, gpus = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4, 8, 16]), rng.choice([1, 2, 4, 8, 16, 64])
        rows.append(
            {
                "instruction": "Compute the global batch size.",
                "input": f"micro batch per GPU {micro}, gradient accumulation {accum}, {gpus} GPUs",
                "output": f"The global batch size is {micro} x {accum} x {gpus} = {micro * accum * gpus}.",
            }
        )
    return rows


def zero_bytes_rows() -> list[dict]:
    """Bytes per parameter for mixed-precision Adam: 2 (weights) + 2 (gradients) + 12 (optimizer state); the
    table is the preference data's (make_preference_data.zero_bytes_per_stage)."""
    question = "How many bytes per parameter does ZeRO stage {} need on {} GPUs with mixed precision Adam?"
    return [
        {
            "instruction": question.format(stage, gpus),
            "input": "",
            "output": f"About {total:.2f} bytes per parameter on each GPU.",
        }
        for gpus in make_preference_data.ZERO_GPU_COUNTS
        for stage, total in make_preference_data.zero_bytes_per_stage(gpus).items()
    ]


def alpaca_rows() -> list[dict]:
    rows = topic_rows() + batch_rows(random.Random(0), 80) + zero_bytes_rows()
    random.Random(1).shuffle(rows)
    return rows


def chat_rows() -> list[dict]:
    rows = []
    for index, (name, what, detail, tip) in enumerate(TOPICS):
        messages = [{"role": "system", "content": SYSTEM_PROMPT}] if index % 2 == 0 else []
        messages += [
            {"role": "user", "content": f"What is {name}?"},
            {"role": "assistant", "content": what},
            {"role": "user", "content": "Any advice?"},
            {"role": "assistant", "content": tip},
        ]
        rows.append({"messages": messages})
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": f"One detail about {name}, please."},
                    {"role": "assistant", "content": detail},
                ]
            }
        )
    return rows


def text_rows() -> list[dict]:
    rows = []
    for index, (_name, what, detail, tip) in enumerate(TOPICS):
        link = PARAGRAPH_LINKS[index % len(PARAGRAPH_LINKS)]
        rows.append({"text": f"{what} {detail} {link} {_lower_first(tip)}"})
        rows.append({"text": f"{tip} {what}"})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def corpus_lines(datasets: dict[str, list[dict]]) -> list[str]:
    lines = []
    for row in datasets["alpaca"]:
        prompt = ALPACA_PROMPT_WITH_INPUT if row["input"] else ALPACA_PROMPT
        lines.append(prompt.format(**row) + row["output"])
    lines += ["\n".join(m["content"] for m in row["messages"]) for row in datasets["chat"]]
    lines += [row["text"] for row in datasets["text"]]
    return lines


def train_tokenizer(lines: list[str], out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,  # an upper bound: the small corpus runs out of pairs first (~1.8k tokens)
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer=trainer)
    # Like LLaMA tokenizers: a plain call prepends bos; zero_kit's data code adds specials itself.
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ASSETS, help="assets directory to write (default: the package's)")
    out = parser.parse_args(argv).out
    datasets = {"alpaca": alpaca_rows(), "chat": chat_rows(), "text": text_rows()}
    for fmt, rows in datasets.items():
        write_jsonl(out / "data" / f"{fmt}.jsonl", rows)
        print(f"wrote {len(rows)} rows to {out / 'data' / f'{fmt}.jsonl'}")
    print(f"wrote {make_preference_data.write(out / 'data')} rows to {out / 'data' / 'preference.jsonl'}")
    train_tokenizer(corpus_lines(datasets), out / "tokenizer")  # not on the pairs: the tokenizer stays as it was
    print(f"wrote tokenizer to {out / 'tokenizer'}")


if __name__ == "__main__":
    main()
