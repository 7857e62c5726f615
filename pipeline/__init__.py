"""What is computed: the contract, the settings, the models and the oracle; no threads, queues or HTTP.

Threads. The serving floors call each object here from one thread (its stage's), with two
exceptions, the only objects here that several threads share:
- `docstore.DocumentStore`: one SQLite connection behind a lock, the only lock in pipeline/
  (a connection serves one statement at a time; lookups are short, so waiting costs little);
- `prompt_tokens.PromptTokenizer`, the LLM's tokenization (request threads count queries and
  detokenize streams while the generation thread encodes prompts): no lock, because its
  tokenizer is set up once and only ever read (the rule is in its module's docstring).
"""
from pipeline.cpu_features import hold_onednn_below_amx

# oneDNN reads its instruction-set hold once, at its first kernel: set before any model is built.
hold_onednn_below_amx()
