"""The model the user runs: its tokenizer (from a GGUF file, a Hugging Face tokenizer.json,
Mistral's own tokenizer files, or its server's tokenize endpoint), its chat template and its
window. Each counter here is a `tokens.TokenCounter` that counts a text as the model's
server parses it."""
