"""The model the user runs: its tokenizer (from a GGUF file, a Hugging Face tokenizer.json,
Mistral's own tokenizer files, or its server's tokenize endpoint), its chat template and its
window. Each counter here is a `tokens.TokenCounter` that counts a text as the model's
server parses it."""

# What a user without the `model` extra is told to run, wherever a model's file needs it.
INSTALL = "pip install 'otaku-ctx[model]' (sh install.sh installs it, unless CTX_EXTRAS is set without it)"
