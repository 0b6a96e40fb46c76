"""Real prompts for measuring speculative decoding on SmolLM2-135M-Instruct (acceptance, speed).

Half are chat-formatted instructions (the model is instruction-tuned), half plain-text continuations
of the kinds the eval tasks hold (QA, maths, code, prose). Fixed text, so measurements repeat.
"""

from __future__ import annotations

CHAT_PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a short poem about the sea.",
    "Explain what a hash table is to a beginner.",
    "List three tips for staying healthy.",
    "Write a Python function that returns the factorial of n.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "How do plants make their food?",
    "Give me a recipe for pancakes.",
)

TEXT_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:",
    "Water boils at a temperature of",
    "Once upon a time, in a small village by the mountains,",
    "The three primary colors are",
    "import numpy as np\n\ndef softmax(x):\n",
    "The mitochondria is the powerhouse of the cell. It",
)


def prompt_token_ids(tokenizer, n: int | None = None) -> list[list[int]]:
    """Token ids of the prompts (chat ones through the tokenizer's chat template), interleaved chat /
    text; the first n (all 16 by default)."""
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True) for p in CHAT_PROMPTS]
    texts = [t for pair in zip(chats, TEXT_PROMPTS) for t in pair]
    return [list(tokenizer(t).input_ids) for t in texts[:n]]
